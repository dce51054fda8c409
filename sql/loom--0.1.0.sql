-- loom 0.1.0: the full install script of a released version, kept so that
-- it can still be installed (and upgraded from) in tests. Frozen.
\echo Use "CREATE EXTENSION loom VERSION '0.1.0'" to load this file. \quit

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

CREATE TABLE loom.events (
    execution_id text NOT NULL,
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

CREATE TABLE loom.refs (
    name text NOT NULL,
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
