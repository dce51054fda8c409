-- loom 0.3.0, the full script of a released version: pgrx generates only
-- the current version's, and tests install this one to upgrade from it. It
-- is the 0.2.0 script followed by the 0.2.0 -> 0.3.0 step, which is what a
-- 0.3.0 install is.
\echo Use "CREATE EXTENSION loom VERSION '0.3.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- bootstrap

-- loom's order is UTF-8 byte order (ADR 0108 D1), which is Unicode code
-- point order only in a UTF8 database. Refuse any other, rather than page
-- in an order that silently differs from every client's.
DO $loom$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE EXCEPTION 'loom needs a UTF8 database, and this one is %', pg_catalog.getdatabaseencoding()
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'create the database with ENCODING ''UTF8''';
    END IF;
END
$loom$;

-- loom::order_sql::loom_compare_execution_ids
CREATE  FUNCTION @extschema@."loom_compare_execution_ids"(
	"a" TEXT, /* & str */
	"b" TEXT /* & str */
) RETURNS INT /* i32 */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'loom_compare_execution_ids_wrapper';

-- requires:
--   loom_compare_execution_ids


COMMENT ON FUNCTION @extschema@.loom_compare_execution_ids(text, text) IS
'loom''s execution-id and ref-name order: -1, 0 or 1 as a sorts before, with or after b in Unicode code point order (UTF-8 byte order, COLLATE "C"), whatever the database collation. A cursor "after X" means: every id whose comparison with X is 1.';

-- loom::frame_sql::loom_snapshot_frame
CREATE  FUNCTION @extschema@."loom_snapshot_frame"(
	"state" TEXT, /* & str */
	"codec" TEXT DEFAULT 'zstd' /* & str */
) RETURNS bytea /* Vec < u8 > */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'loom_snapshot_frame_wrapper';

-- loom::frame_sql::loom_snapshot_frame_info
CREATE  FUNCTION @extschema@."loom_snapshot_frame_info"(
	"frame" bytea /* & [u8] */
) RETURNS TABLE (
	"format" TEXT,  /* String */
	"stored_bytes" INT,  /* i32 */
	"declared_bytes" bigint,  /* Option < i64 > */
	"has_checksum" bool  /* bool */
)
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'loom_snapshot_frame_info_wrapper';

-- loom::frame_sql::loom_snapshot_state_text
CREATE  FUNCTION @extschema@."loom_snapshot_state_text"(
	"frame" bytea /* & [u8] */
) RETURNS text /* PallocText */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'loom_snapshot_state_text_wrapper';

-- requires:
--   loom_snapshot_state_text
--   loom_snapshot_frame
--   loom_snapshot_frame_info


-- Decoded by loom, then handed as text straight to Postgres's own jsonb
-- input: no intermediate value that could reorder or lose anything before
-- jsonb does what jsonb does. A plain SQL body, so the planner inlines it.
CREATE FUNCTION @extschema@.loom_snapshot_state(frame bytea) RETURNS jsonb
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_state_text(frame)::pg_catalog.jsonb;

-- jsonb's own text form is the state that gets framed.
CREATE FUNCTION @extschema@.loom_snapshot_frame(state jsonb, codec text DEFAULT 'zstd') RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_frame(state::pg_catalog.text, codec);

COMMENT ON FUNCTION @extschema@.loom_snapshot_state(bytea) IS
'Decodes a loom snapshot frame (format byte 0x01 JSON or 0x02 zstd) into jsonb. Use loom_snapshot_state_text for the exact stored text: jsonb reorders keys, merges duplicates and cannot hold \u0000 or lone surrogates.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_state_text(bytea) IS
'The exact JSON text a loom snapshot frame holds, byte for byte. Errors name the cause: unknown format byte (0A000), malformed or foreign frame (22P03), corrupt or truncated (XX001), state over 256 MiB (54000), not UTF-8 (22021), not JSON (22P02).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame(text, text) IS
'Frames a JSON state as loom stores it: codec ''zstd'' (default) gives 0x02 + zstd level 3 with checksum and content size, or 0x01 when zstd would not make it smaller; ''none'' gives 0x01 + the text. The text must be JSON (22P02) of at most 256 MiB (54000).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame(jsonb, text) IS
'Frames a jsonb state (its canonical text form) as loom stores it; see loom_snapshot_frame(text, text).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame_info(bytea) IS
'Reads a loom snapshot frame''s header without inflating it: format (json or zstd), stored_bytes (the whole frame), declared_bytes (the JSON text''s length as declared; NULL when a zstd frame declares none), has_checksum.';

-- loom's tables live in schema loom, created with (and dropped with) the
-- extension; its functions live in the extension's own schema.
CREATE SCHEMA loom;
COMMENT ON SCHEMA loom IS 'loom''s tables: the event log, snapshots, branch refs and lineage of durable workflow executions';

-- execution_id is COLLATE "C" (ADR 0108 D2): ids page in code point order,
-- and memcmp makes appends faster than a locale's strcoll.
CREATE TABLE loom.events (
    execution_id text COLLATE "C" NOT NULL,
    sequence bigint NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_pkey PRIMARY KEY (execution_id, sequence)
);
-- The id pager's index: an index-only scan, no sort, per page.
CREATE INDEX idx_events_exec ON loom.events (execution_id);
COMMENT ON TABLE loom.events IS 'The append-only event log: one row per (execution_id, sequence). Write with loom_append_event(s), page ids with loom_list_executions.';

CREATE TABLE loom.snapshots (
    id bigint GENERATED BY DEFAULT AS IDENTITY,
    execution_id text NOT NULL,
    workflow_id text NOT NULL,
    sequence bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    state jsonb NOT NULL,
    CONSTRAINT snapshots_pkey PRIMARY KEY (id),
    CONSTRAINT snapshots_execution_id_sequence_key UNIQUE (execution_id, sequence)
);
COMMENT ON TABLE loom.snapshots IS 'Folded execution states, one per (execution_id, sequence): a cache of the log that must decode to the identical state. A row holds either JSONB in state, or a frame in state_z with the sentinel in state (ADR 0141). Read through loom.snapshots_decoded or loom_load_snapshot.';

-- name is COLLATE "C" (ADR 0108, L21): refs page in code point order.
CREATE TABLE loom.refs (
    name text COLLATE "C" NOT NULL,
    execution_id text NOT NULL,
    sequence bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT refs_pkey PRIMARY KEY (name)
);
COMMENT ON TABLE loom.refs IS 'Branch refs: a name pointing at an execution and sequence. Page names with loom_list_refs.';

CREATE TABLE loom.lineage (
    execution_id text NOT NULL,
    parent_execution_id text NOT NULL,
    fork_sequence bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT lineage_pkey PRIMARY KEY (execution_id)
);
COMMENT ON TABLE loom.lineage IS 'Which execution each fork was forked from, and at which sequence.';

-- pg_dump keeps the rows of extension tables only when they are marked.
SELECT pg_catalog.pg_extension_config_dump('loom.events', '');
SELECT pg_catalog.pg_extension_config_dump('loom.snapshots', '');
SELECT pg_catalog.pg_extension_config_dump('loom.snapshots_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('loom.refs', '');
SELECT pg_catalog.pg_extension_config_dump('loom.lineage', '');

-- The event log and ref API. Every function states COLLATE "C" itself, so
-- it pages right even on a column an upgrade could not convert (ADR 0108
-- D2), and pins search_path, so that no object a caller can create (a
-- table, an operator) is ever picked up in place of loom's or pg_catalog's.

CREATE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4)
$$;
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb) IS
'Appends one event to an execution''s log. A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only.';

CREATE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    appended bigint;
BEGIN
    IF cardinality(execution_ids) <> cardinality(sequences)
       OR cardinality(execution_ids) <> cardinality(kinds)
       OR cardinality(execution_ids) <> cardinality(payloads) THEN
        RAISE EXCEPTION 'loom_append_events needs arrays of one length, got % ids, % sequences, % kinds, % payloads',
            cardinality(execution_ids), cardinality(sequences), cardinality(kinds), cardinality(payloads)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO loom.events (execution_id, sequence, kind, payload)
    SELECT * FROM unnest(execution_ids, sequences, kinds, payloads);
    GET DIAGNOSTICS appended = ROW_COUNT;
    RETURN appended;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. Arrays of different lengths are invalid_parameter_value (22023).';

CREATE FUNCTION @extschema@.loom_check_page_size(page_size integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF page_size IS NULL OR page_size < 1 THEN
        RAISE EXCEPTION 'page_size must be at least 1, got %', coalesce(page_size::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_check_page_size(integer) IS
'Refuses a page size below 1 with invalid_parameter_value (22023); used by the loom_list_* pagers.';

CREATE FUNCTION @extschema@.loom_list_executions(after text DEFAULT NULL, page_size integer DEFAULT 1000)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(page_size);
    IF after IS NULL THEN
        RETURN QUERY
            SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e
            ORDER BY 1 LIMIT page_size;
    ELSE
        RETURN QUERY
            SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e
            WHERE e.execution_id COLLATE "C" > after COLLATE "C"
            ORDER BY 1 LIMIT page_size;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_list_executions(text, integer) IS
'One page of distinct execution ids strictly after the cursor "after" (any string, not only a stored id; NULL for the first page), in Unicode code point order (COLLATE "C") whatever the database collation. The next cursor is the page''s last id; a page shorter than page_size is the last.';

CREATE FUNCTION @extschema@.loom_put_ref(name text, execution_id text, sequence bigint)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO loom.refs AS r (name, execution_id, sequence) VALUES ($1, $2, $3)
    ON CONFLICT (name) DO UPDATE
        SET execution_id = excluded.execution_id, sequence = excluded.sequence, updated_at = now()
$$;
COMMENT ON FUNCTION @extschema@.loom_put_ref(text, text, bigint) IS
'Creates or moves the branch ref "name" to (execution_id, sequence).';

CREATE FUNCTION @extschema@.loom_delete_ref(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (DELETE FROM loom.refs r WHERE r.name = $1 RETURNING 1)
    SELECT count(*) > 0 FROM deleted
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_ref(text) IS
'Deletes the branch ref "name"; true when it existed.';

CREATE FUNCTION @extschema@.loom_list_refs(after text DEFAULT NULL, page_size integer DEFAULT 1000)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(page_size);
    IF after IS NULL THEN
        RETURN QUERY
            SELECT r.name COLLATE "C" FROM loom.refs r ORDER BY 1 LIMIT page_size;
    ELSE
        RETURN QUERY
            SELECT r.name COLLATE "C" FROM loom.refs r
            WHERE r.name COLLATE "C" > after COLLATE "C"
            ORDER BY 1 LIMIT page_size;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_list_refs(text, integer) IS
'One page of ref names strictly after the cursor "after" (any string; NULL for the first page), in Unicode code point order (COLLATE "C") whatever the database collation.';

-- ADR 0108 D3 and its L21 addendum: converting a hot table's column to
-- COLLATE "C" takes an ACCESS EXCLUSIVE lock and rebuilds its indexes, so it
-- is bounded where it waits, unbounded where it works, and fails soft:
-- correctness never depends on it, because every query states COLLATE "C".

-- The lock wait of each conversion, in ms: loom.migration_lock_timeout, or
-- 2000 when it is not set.
CREATE FUNCTION @extschema@.loom_migration_lock_timeout()
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(nullif(current_setting('loom.migration_lock_timeout', true), '')::integer, 2000)
$$;
COMMENT ON FUNCTION @extschema@.loom_migration_lock_timeout() IS
'The lock wait, in ms, each loom migration allows itself: the custom setting loom.migration_lock_timeout, 2000 when unset.';

CREATE FUNCTION @extschema@.loom_convert_column_to_c(table_name text, column_name text, lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    caller_statement_timeout text := current_setting('statement_timeout');
    alter_statement text := format('ALTER TABLE loom.%I ALTER COLUMN %I TYPE text COLLATE "C"', table_name, column_name);
    analyze_statement text := format('ANALYZE loom.%I', table_name);
BEGIN
    -- A catalog check, so a converted column costs no table lock. The
    -- collation is looked up by name (no ::regcollation).
    IF EXISTS (
        SELECT 1
        FROM pg_attribute a
        JOIN pg_class t ON t.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        JOIN pg_collation c ON c.oid = a.attcollation
        JOIN pg_namespace cn ON cn.oid = c.collnamespace
        WHERE n.nspname = 'loom' AND t.relname = table_name AND a.attname = column_name
          AND c.collname = 'C' AND cn.nspname = 'pg_catalog'
    ) THEN
        RETURN 'already COLLATE "C"';
    END IF;
    -- The block is a subtransaction: a soft failure rolls back this one
    -- conversion, and the caller's transaction (ALTER EXTENSION) goes on.
    BEGIN
        -- Bound the wait for the lock (appends queue behind it), never the
        -- rebuild: a statement_timeout shorter than the rebuild would abort
        -- it on every boot, a crash loop that never converts.
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        PERFORM set_config('statement_timeout', '0', true);
        EXECUTE alter_statement;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        PERFORM set_config('statement_timeout', caller_statement_timeout, true);
        -- ALTER ... TYPE drops the column's statistics; without them the
        -- planner sorts instead of scanning the index.
        EXECUTE analyze_statement;
        RETURN 'converted';
    EXCEPTION
        -- What boot survives: a lock wait that timed out, a cancel, a
        -- deadlock, a view or rule on the column (feature_not_supported).
        -- Not owning the table is not caught: the next DDL would fail anyway.
        WHEN lock_not_available OR query_canceled OR deadlock_detected OR feature_not_supported THEN
            RAISE WARNING 'loom: could not convert loom.%.% to COLLATE "C": % (SQLSTATE %)',
                    table_name, column_name, SQLERRM, SQLSTATE
                USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                      HINT = format('Run SELECT loom_migrate_collations(); later, or by hand in a quiet moment: SET lock_timeout = 0; SET statement_timeout = 0; %s; %s;',
                                    alter_statement, analyze_statement);
            RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_convert_column_to_c(text, text, integer) IS
'Converts one loom.<table>.<column> to COLLATE "C" (ADR 0108 D3): a no-op without any lock when already converted; otherwise waits at most lock_timeout_ms for the lock, exempts the rebuild from statement_timeout, restores the caller''s timeouts, ANALYZEs, and on a lock timeout, cancel, deadlock or dependent view rolls back alone with a WARNING naming the statements to run by hand.';

CREATE FUNCTION @extschema@.loom_migrate_collations(lock_timeout_ms integer DEFAULT 2000)
RETURNS TABLE(column_name text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- refs first, then events (the addendum's deadlock order): the small,
    -- less hot table is locked first and its lock held for less time
    -- behind the hot one.
    column_name := 'loom.refs.name';
    outcome := @extschema@.loom_convert_column_to_c('refs', 'name', lock_timeout_ms);
    RETURN NEXT;
    column_name := 'loom.events.execution_id';
    outcome := @extschema@.loom_convert_column_to_c('events', 'execution_id', lock_timeout_ms);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_migrate_collations(integer) IS
'Converts loom.refs.name, then loom.events.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does; re-runs a conversion an upgrade skipped. Returns what happened to each column.';

-- Snapshots: JSONB only in this version.

CREATE FUNCTION @extschema@.loom_save_snapshot(execution_id text, workflow_id text, sequence bigint, state text)
RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state)
    VALUES ($1, $2, $3, $4::jsonb)
    ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
        SET workflow_id = excluded.workflow_id, state = excluded.state, created_at = now()
    RETURNING s.id
$$;
COMMENT ON FUNCTION @extschema@.loom_save_snapshot(text, text, bigint, text) IS
'Saves the state (JSON text) of an execution at a sequence as JSONB and returns the row id; a re-save of the same (execution_id, sequence) replaces the row.';

CREATE FUNCTION @extschema@.loom_load_snapshot(execution_id text, at_sequence bigint DEFAULT NULL)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Two branches, one of which a one-time filter switches off: the
    -- latest by an index scan backward, or exactly $2.
    (SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at, s.state
     FROM loom.snapshots s WHERE $2 IS NULL AND s.execution_id = $1
     ORDER BY s.sequence DESC LIMIT 1)
    UNION ALL
    SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at, s.state
    FROM loom.snapshots s WHERE $2 IS NOT NULL AND s.execution_id = $1 AND s.sequence = $2
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot(text, bigint) IS
'The latest snapshot of an execution, or the one at exactly at_sequence (never a neighbour). No row when there is none.';

-- loom 0.2.0 -> 0.3.0
-- The codec argument is new: the old signature goes, the new one comes.
DROP FUNCTION @extschema@.loom_save_snapshot(text, text, bigint, text);

-- Snapshots (ADR 0141 D2, D5, D6): a row holds JSONB in state, or a frame
-- in state_z and the sentinel in state. Every reader decodes.

CREATE FUNCTION @extschema@.loom_snapshot_row_state(state jsonb, state_z bytea)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF state_z IS NOT NULL THEN
        RETURN @extschema@.loom_snapshot_state(state_z);
    END IF;
    -- The sentinel without its frame (the column dropped or nulled) is
    -- corruption: never hand it out as a state.
    IF state = '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb THEN
        RAISE EXCEPTION 'loom snapshot row holds the frame sentinel but no frame in state_z'
            USING ERRCODE = 'data_corrupted',
                  HINT = 'restore the row from a backup or re-save the snapshot; the event log is the audit record';
    END IF;
    RETURN state;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_row_state(jsonb, bytea) IS
'The decoded state of a loom.snapshots row: its frame when state_z is set, else its JSONB; a sentinel without a frame is data_corrupted (XX001).';

-- The view decodes state_z only where the column exists: it is (re)defined
-- whenever loom_ensure_snapshot_zstd adds the column.
CREATE FUNCTION @extschema@.loom_define_snapshots_decoded()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    frame_column text := CASE WHEN EXISTS (
            SELECT 1 FROM pg_attribute a
            JOIN pg_class t ON t.oid = a.attrelid
            JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = 'loom' AND t.relname = 'snapshots' AND a.attname = 'state_z'
              AND NOT a.attisdropped)
        THEN 's.state_z' ELSE 'NULL::bytea' END;
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE VIEW loom.snapshots_decoded AS
             SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at,
                    %s.loom_snapshot_row_state(s.state, %s) AS state
             FROM loom.snapshots s',
        -- @extschema@ arrives already quoted where it needs to be.
        '@extschema@', frame_column);
    COMMENT ON VIEW loom.snapshots_decoded IS
        'loom.snapshots with state decoded for every row whatever its format, so state->''x'' works from psql.';
END
$$;
COMMENT ON FUNCTION @extschema@.loom_define_snapshots_decoded() IS
'(Re)defines the view loom.snapshots_decoded for the columns loom.snapshots has now.';

CREATE FUNCTION @extschema@.loom_ensure_snapshot_zstd(lock_timeout_ms integer DEFAULT 200)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    has_column boolean;
    has_check boolean;
BEGIN
    SELECT EXISTS (SELECT 1 FROM pg_attribute a
                   JOIN pg_class t ON t.oid = a.attrelid
                   JOIN pg_namespace n ON n.oid = t.relnamespace
                   WHERE n.nspname = 'loom' AND t.relname = 'snapshots'
                     AND a.attname = 'state_z' AND NOT a.attisdropped),
           EXISTS (SELECT 1 FROM pg_constraint c
                   JOIN pg_class t ON t.oid = c.conrelid
                   JOIN pg_namespace n ON n.oid = t.relnamespace
                   WHERE n.nspname = 'loom' AND t.relname = 'snapshots'
                     AND c.conname = 'snapshots_frame_sentinel')
      INTO has_column, has_check;
    -- Every call after the first takes no table lock.
    IF has_column AND has_check THEN
        RETURN true;
    END IF;
    BEGIN
        -- One short wait for one ACCESS EXCLUSIVE lock: snapshot reads, and
        -- so resume, queue behind it for at most this long.
        PERFORM set_config('lock_timeout', least(lock_timeout_ms, 200) || 'ms', true);
        LOCK TABLE loom.snapshots IN ACCESS EXCLUSIVE MODE;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        -- Catalog-only statements: a nullable column without a default is
        -- no rewrite, a NOT VALID check scans nothing.
        IF NOT has_column THEN
            ALTER TABLE loom.snapshots ADD COLUMN state_z bytea;
            -- A frame is already compressed: the server must not try again.
            ALTER TABLE loom.snapshots ALTER COLUMN state_z SET STORAGE EXTERNAL;
        END IF;
        IF NOT has_check THEN
            ALTER TABLE loom.snapshots ADD CONSTRAINT snapshots_frame_sentinel
                CHECK (state_z IS NULL OR state = '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb) NOT VALID;
        END IF;
        PERFORM @extschema@.loom_define_snapshots_decoded();
        RETURN true;
    EXCEPTION
        WHEN lock_not_available OR insufficient_privilege OR deadlock_detected OR query_canceled THEN
            RAISE WARNING 'loom: could not add the snapshot frame column: % (SQLSTATE %)', SQLERRM, SQLSTATE
                USING DETAIL = 'Snapshots keep being written as JSONB, which is correct, only larger.',
                      HINT = 'Call SELECT loom_ensure_snapshot_zstd(); again: it retries, and takes no lock once done.';
            RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_snapshot_zstd(integer) IS
'Provisions zstd snapshot frames (ADR 0141 D5): adds loom.snapshots.state_z (bytea, STORAGE EXTERNAL) and the NOT VALID check snapshots_frame_sentinel under one ACCESS EXCLUSIVE lock waited for at most least(lock_timeout_ms, 200) ms. True when both exist (then it takes no lock at all); false, with one WARNING, on a lock timeout, missing privilege, deadlock or cancel. Retry later.';

CREATE FUNCTION @extschema@.loom_save_snapshot(execution_id text, workflow_id text, sequence bigint, state text, codec text DEFAULT 'none')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    saved bigint;
    has_frame_column boolean := EXISTS (
        SELECT 1 FROM pg_attribute a
        JOIN pg_class t ON t.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = 'loom' AND t.relname = 'snapshots' AND a.attname = 'state_z' AND NOT a.attisdropped);
BEGIN
    IF codec = 'zstd' THEN
        IF NOT has_frame_column THEN
            RAISE EXCEPTION 'loom.snapshots has no state_z column for zstd frames'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'SELECT loom_ensure_snapshot_zstd(); adds it (or save with codec ''none'')';
        END IF;
        INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
        VALUES ($1, $2, $3, '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb,
                @extschema@.loom_snapshot_frame($4, 'zstd'))
        ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
            SET workflow_id = excluded.workflow_id, state = excluded.state,
                state_z = excluded.state_z, created_at = now()
        RETURNING s.id INTO saved;
    ELSIF codec = 'none' THEN
        IF has_frame_column THEN
            -- A re-save over a frame row clears the frame: no stale frame.
            INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
            VALUES ($1, $2, $3, $4::jsonb, NULL)
            ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
                SET workflow_id = excluded.workflow_id, state = excluded.state,
                    state_z = NULL, created_at = now()
            RETURNING s.id INTO saved;
        ELSE
            INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state)
            VALUES ($1, $2, $3, $4::jsonb)
            ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
                SET workflow_id = excluded.workflow_id, state = excluded.state, created_at = now()
            RETURNING s.id INTO saved;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown snapshot codec %: expected "none" or "zstd"', quote_literal(codec)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN saved;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_save_snapshot(text, text, bigint, text, text) IS
'Saves the state (JSON text) of an execution at a sequence and returns the row id: as JSONB with codec ''none'' (the default), as a zstd frame in state_z beside the sentinel with ''zstd''. A re-save of the same (execution_id, sequence) replaces the row in the format asked and clears the other column.';

CREATE OR REPLACE FUNCTION @extschema@.loom_load_snapshot(execution_id text, at_sequence bigint DEFAULT NULL)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Two branches, one of which a one-time filter switches off: the
    -- latest by an index scan backward, or exactly $2.
    (SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
     FROM loom.snapshots_decoded d WHERE $2 IS NULL AND d.execution_id = $1
     ORDER BY d.sequence DESC LIMIT 1)
    UNION ALL
    SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
    FROM loom.snapshots_decoded d WHERE $2 IS NOT NULL AND d.execution_id = $1 AND d.sequence = $2
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot(text, bigint) IS
'The latest snapshot of an execution, or the one at exactly at_sequence (never a neighbour), decoded whatever its row format. No row when there is none.';

-- The decoded view. The frame column is opt-in (ADR 0141 D5, D9): no DDL
-- here, where it would also extend the locks of the 0.1.0 -> 0.2.0
-- conversions when both steps run in one ALTER EXTENSION. An operator or a
-- zstd store calls loom_ensure_snapshot_zstd() after the update committed.
SELECT @extschema@.loom_define_snapshots_decoded();

-- A fresh 0.3.0 install provisions the frame column at once (an empty
-- table: no lock wait), so that pg_restore's CREATE EXTENSION makes the
-- column its COPY needs. The upgrade step does not.
SELECT @extschema@.loom_ensure_snapshot_zstd();
