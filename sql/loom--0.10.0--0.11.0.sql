-- loom 0.10.0 -> 0.11.0 (issue 27): metadata on events. loom.events gets
-- a nullable jsonb column, metadata: a catalog change (no rewrite, no
-- scan) that needs loom.events' ACCESS EXCLUSIVE lock for an instant, so
-- it is added as the 0.7.0 index drop was: waiting at most the migration
-- lock wait and failing soft (a WARNING) behind a long transaction, then
-- added by loom_ensure_event_metadata, which loom-client's migrate() runs
-- at every boot. Until then events are appended and read as before (reads
-- return NULL metadata) and an append with metadata is refused (55000).
--
-- loom_append_event and loom_append_events take metadata as a last
-- parameter with a default, so every call of before is the same call;
-- loom_read_events and loom_resume return it as a last column. A function
-- cannot change its parameters or its result's columns in place, so each
-- is dropped and created again, with PUBLIC's EXECUTE as every loom
-- function has it (what a role may do through them is its grants on the
-- tables). A view or function of yours over loom_read_events or
-- loom_resume stops the update (2BP01, nothing changed): drop it, update,
-- create it again.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.11.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25): every loom object is named by @extschema@ or loom.
SET LOCAL search_path = pg_catalog, pg_temp;

-- As loom_pg/src/sql/collation_migration.sql defines them for a fresh install.
CREATE FUNCTION @extschema@.loom_events_have_metadata()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Of type jsonb: a column of that name and another type is someone
    -- else's, and loom neither reads nor writes it.
    RETURN EXISTS (SELECT 1 FROM pg_attribute a
                   WHERE a.attrelid = 'loom.events'::regclass
                     AND a.attname = 'metadata' AND NOT a.attisdropped
                     AND a.atttypid = 'jsonb'::regtype);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_events_have_metadata() IS
'Whether loom.events has the column metadata (0.11.0; an update adds it only if it can lock loom.events within the migration lock wait, and loom_ensure_event_metadata adds it later), read from the catalog.';

CREATE FUNCTION @extschema@.loom_ensure_event_metadata(lock_timeout_ms integer DEFAULT 2000)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    other_type text;
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- A catalog check, so a present column costs no table lock.
    IF @extschema@.loom_events_have_metadata() THEN
        RETURN 'present';
    END IF;
    PERFORM @extschema@.loom_take_migration_lock();
    -- A column of that name and another type: not loom's to change.
    other_type := (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                   WHERE a.attrelid = 'loom.events'::regclass
                     AND a.attname = 'metadata' AND NOT a.attisdropped);
    IF other_type = 'jsonb' THEN
        RETURN 'present';
    ELSIF other_type IS NOT NULL THEN
        RAISE WARNING 'loom: loom.events has a column metadata of type %, not loom''s jsonb: events are written and read without metadata', other_type
            USING HINT = 'Rename or drop that column, then run SELECT @extschema@.loom_ensure_event_metadata();';
        RETURN 'skipped: 42804';
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        ALTER TABLE loom.events ADD COLUMN metadata jsonb;
        COMMENT ON COLUMN loom.events.metadata IS 'What the event carries beside its payload (a trace id, the actor, a causation id): any JSON value, NULL for none. Written by loom_append_event(s), read by loom_read_events and loom_resume.';
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        RETURN 'added';
    -- Any failure fails soft (a lock held too long, a cancel, a node of a
    -- Citus cluster that takes DDL from its coordinator only): the rest of
    -- an update goes on, and migrate() tries again.
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        RAISE WARNING 'loom: could not add loom.events.metadata: % (SQLSTATE %)', SQLERRM, SQLSTATE
            USING DETAIL = 'Events are appended and read as before; an append with metadata is refused until the column is there.',
                  HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(); later (loom-client''s migrate() does at every boot).';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_event_metadata(integer) IS
'Adds loom.events.metadata (0.11.0) if it is missing, waiting at most lock_timeout_ms for loom.events'' lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''present'' takes no lock. Under loom''s migration lock; the owner''s to call.';

REVOKE EXECUTE ON FUNCTION @extschema@.loom_ensure_event_metadata(integer) FROM PUBLIC;

-- As loom_pg/src/sql/log_api.sql defines them.
DROP FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb);
CREATE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'loom_append_event_with_metadata_wrapper';
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb, jsonb) IS
'Appends one event to an execution''s log, with its metadata (any JSON; NULL, the default, for none). A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only. Only in READ COMMITTED transactions (0A000 otherwise).';

DROP FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[]);
CREATE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'loom_append_events_with_metadata_wrapper';
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. metadata is NULL (the default: none for every event) or one element per event. Arrays of different lengths are invalid_parameter_value (22023); only in READ COMMITTED transactions (0A000 otherwise).';

DROP FUNCTION @extschema@.loom_append_events_without_trigger(text[], bigint[], text[], jsonb[]);
CREATE FUNCTION @extschema@.loom_append_events_without_trigger(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    appended bigint;
    -- One event's metadata, whatever the array's bounds or dimensions (as
    -- unnest reads a batch's).
    first_metadata jsonb := (SELECT m FROM unnest(metadata) AS m LIMIT 1);
BEGIN
    PERFORM @extschema@.loom_require_read_committed('appended to');
    IF metadata IS NOT NULL AND cardinality(metadata) <> cardinality(execution_ids) THEN
        RAISE EXCEPTION 'loom_append_events needs arrays of one length, got % ids, % metadata',
            cardinality(execution_ids), cardinality(metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(execution_ids) = 1 THEN
        -- One event (an agent loop's usual append): on Citus a single-shard
        -- INSERT, one round trip, its errors with their own SQLSTATE.
        -- Without metadata, the column goes unnamed: an update may not have
        -- added it yet (loom_ensure_event_metadata).
        IF metadata IS NULL THEN
            INSERT INTO loom.events (execution_id, sequence, kind, payload)
            VALUES (execution_ids[1], sequences[1], kinds[1], payloads[1]);
        ELSE
            INSERT INTO loom.events (execution_id, sequence, kind, payload, metadata)
            VALUES (execution_ids[1], sequences[1], kinds[1], payloads[1], first_metadata);
        END IF;
        appended := 1;
    ELSE
        BEGIN
            IF metadata IS NULL THEN
                INSERT INTO loom.events (execution_id, sequence, kind, payload)
                SELECT * FROM unnest(execution_ids, sequences, kinds, payloads);
            ELSE
                INSERT INTO loom.events (execution_id, sequence, kind, payload, metadata)
                SELECT * FROM unnest(execution_ids, sequences, kinds, payloads, metadata);
            END IF;
            GET DIAGNOSTICS appended = ROW_COUNT;
        EXCEPTION WHEN internal_error THEN
            -- Citus copies an INSERT ... SELECT into the shards, and reports
            -- a duplicate key there as XX000: give callers the
            -- unique_violation an append-only log promises.
            PERFORM @extschema@.loom_refuse_appended_twice(execution_ids, sequences);
            RAISE;
        END;
    END IF;
    -- Who keeps loom.executions is decided after the INSERT, never before:
    -- an INSERT queued behind an ALTER TABLE ... ENABLE TRIGGER runs with
    -- the trigger. Once the INSERT holds its lock on loom.events, the
    -- triggers cannot come or go before this commits.
    IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        PERFORM @extschema@.loom_track_appended(execution_ids);
    END IF;
    RETURN appended;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_events_without_trigger(text[], bigint[], text[], jsonb[], jsonb[]) IS
'loom_append_events where no trigger keeps loom.executions (Citus, or a disabled trigger): one subtransaction that turns Citus''s XX000 on a duplicate into unique_violation (23505), then loom_track_appended. Called by loom_append_events; callers check the arrays'' lengths.';

DROP FUNCTION @extschema@.loom_read_events(text, bigint, integer);
CREATE FUNCTION @extschema@.loom_read_events(execution_id text, after_sequence bigint DEFAULT NULL, max_events integer DEFAULT 1000)
RETURNS TABLE(sequence bigint, kind text, payload jsonb, created_at timestamptz, metadata jsonb)
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'loom_read_events_with_metadata_wrapper';
COMMENT ON FUNCTION @extschema@.loom_read_events(text, bigint, integer) IS
'Up to max_events (at least 1) events of an execution with a sequence strictly after after_sequence (NULL: from the first), in sequence order: the tail a resume reads after its snapshot, and a keyset pager over one log (the next cursor is the last sequence returned).';

-- As loom_pg/src/sql/snapshot_api.sql defines it.
DROP FUNCTION @extschema@.loom_resume(text);
CREATE FUNCTION @extschema@.loom_resume(execution_id text)
RETURNS TABLE(snapshot_id bigint, workflow_id text, sequence bigint, created_at timestamptz,
              state jsonb, state_z bytea, kind text, payload jsonb, metadata jsonb)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- One statement, so one MVCC snapshot: the tail starts exactly after
    -- the snapshot's sequence, none missing or repeated, whatever appends
    -- commit meanwhile. The frame ships as stored (the client decodes it).
    -- On Citus the snapshot and the log are co-located, so this is one
    -- statement on one worker, still one snapshot.
    -- Until loom_ensure_event_metadata adds the column (an update adds it
    -- only if it can lock loom.events in time), the same query with NULL
    -- metadata: a statement naming a missing column cannot be planned.
    IF @extschema@.loom_events_have_metadata() THEN
        RETURN QUERY
        WITH latest AS (
            SELECT f.id, f.workflow_id, f.sequence, f.created_at, f.state, f.state_z
            FROM loom.snapshots_stored f WHERE f.execution_id = $1
            ORDER BY f.sequence DESC LIMIT 1
        ), tail AS (
            -- A keyset read after the snapshot (no snapshot: the comparison is
            -- NULL and this branch is empty)...
            SELECT e.sequence, e.created_at, e.kind, e.payload, e.metadata FROM loom.events e
            WHERE e.execution_id = $1 AND e.sequence > (SELECT l.sequence FROM latest l)
            UNION ALL
            -- ...or the whole log when there is none.
            SELECT e.sequence, e.created_at, e.kind, e.payload, e.metadata FROM loom.events e
            WHERE e.execution_id = $1 AND NOT EXISTS (SELECT 1 FROM latest)
        )
        SELECT r.snapshot_id, r.workflow_id, r.sequence, r.created_at, r.state, r.state_z, r.kind, r.payload, r.metadata
        FROM (
            SELECT l.id AS snapshot_id, l.workflow_id, l.sequence, l.created_at, l.state, l.state_z,
                   NULL::text AS kind, NULL::jsonb AS payload, NULL::jsonb AS metadata, 0 AS part
            FROM latest l
            UNION ALL
            SELECT NULL, NULL, t.sequence, t.created_at, NULL, NULL, t.kind, t.payload, t.metadata, 1
            FROM tail t
        ) r
        ORDER BY r.part, r.sequence;
    ELSE
        RETURN QUERY
        WITH latest AS (
            SELECT f.id, f.workflow_id, f.sequence, f.created_at, f.state, f.state_z
            FROM loom.snapshots_stored f WHERE f.execution_id = $1
            ORDER BY f.sequence DESC LIMIT 1
        ), tail AS (
            -- A keyset read after the snapshot (no snapshot: the comparison is
            -- NULL and this branch is empty)...
            SELECT e.sequence, e.created_at, e.kind, e.payload, NULL::jsonb AS metadata FROM loom.events e
            WHERE e.execution_id = $1 AND e.sequence > (SELECT l.sequence FROM latest l)
            UNION ALL
            -- ...or the whole log when there is none.
            SELECT e.sequence, e.created_at, e.kind, e.payload, NULL::jsonb AS metadata FROM loom.events e
            WHERE e.execution_id = $1 AND NOT EXISTS (SELECT 1 FROM latest)
        )
        SELECT r.snapshot_id, r.workflow_id, r.sequence, r.created_at, r.state, r.state_z, r.kind, r.payload, r.metadata
        FROM (
            SELECT l.id AS snapshot_id, l.workflow_id, l.sequence, l.created_at, l.state, l.state_z,
                   NULL::text AS kind, NULL::jsonb AS payload, NULL::jsonb AS metadata, 0 AS part
            FROM latest l
            UNION ALL
            SELECT NULL, NULL, t.sequence, t.created_at, NULL, NULL, t.kind, t.payload, t.metadata, 1
            FROM tail t
        ) r
        ORDER BY r.part, r.sequence;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_resume(text) IS
'What a workflow resumes from, in one statement (one MVCC snapshot): first the latest snapshot as stored (snapshot_id set; state, or the sentinel and the frame in state_z), then the events after its sequence in order (kind set, with their metadata); all the events when there is no snapshot.';

-- As loom_pg/src/sql/status.sql defines it: a row for the column.
CREATE OR REPLACE FUNCTION @extschema@.loom_status()
RETURNS TABLE(item text, value text, needs_action boolean, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    installed text;
    available text;
    frames record;
    col record;
BEGIN
    item := 'server version'; value := current_setting('server_version');
    needs_action := false; statement := NULL;
    RETURN NEXT;

    SELECT e.extversion INTO installed FROM pg_extension e WHERE e.extname = 'loom';
    SELECT a.default_version INTO available FROM pg_available_extensions a WHERE a.name = 'loom';
    item := 'loom version'; value := installed;
    RETURN NEXT;
    item := 'loom available version'; value := available;
    needs_action := available IS DISTINCT FROM installed;
    statement := CASE WHEN needs_action THEN 'loom migrate --db <db> (or the documented ALTER EXTENSION loom UPDATE: docs/upgrading.md)' END;
    RETURN NEXT;

    FOR col IN
        SELECT c.tbl, c.col, coalesce(co.collname::text, 'none') AS collation
        FROM (VALUES (1, 'refs', 'name'), (2, 'events', 'execution_id'),
                     (3, 'snapshots', 'execution_id'), (4, 'lineage', 'execution_id')) AS c(n, tbl, col)
        JOIN pg_class r ON r.relname = c.tbl AND r.relnamespace = 'loom'::regnamespace
        JOIN pg_attribute a ON a.attrelid = r.oid AND a.attname = c.col
        LEFT JOIN pg_collation co ON co.oid = a.attcollation
        ORDER BY c.n
    LOOP
        item := format('collation of loom.%s.%s', col.tbl, col.col);
        value := col.collation;
        needs_action := NOT @extschema@.loom_column_is_c(col.tbl, col.col);
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations();' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_snapshot_zstd();' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_drop_events_id_index();' END;
    RETURN NEXT;

    item := 'loom.events.metadata (0.11.0)';
    value := CASE WHEN @extschema@.loom_events_have_metadata() THEN 'present' ELSE 'missing' END;
    needs_action := value = 'missing';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_event_metadata();' END;
    RETURN NEXT;

    item := 'executions index';
    value := 'not checked here: loom status --verify (loom_verify_executions) checks it in batches';
    needs_action := false; statement := NULL;
    RETURN NEXT;

    item := 'distributed (Citus)';
    value := CASE WHEN @extschema@.loom_is_distributed() THEN 'yes' ELSE 'no' END;
    needs_action := false; statement := NULL;
    RETURN NEXT;

    FOR item, value IN
        SELECT format('table loom.%s', r.relname),
               format('%s, %s',
                      CASE WHEN r.reltuples < 0 THEN 'rows not estimated yet (never vacuumed or analyzed)'
                           ELSE format('~%s rows', r.reltuples::bigint) END,
                      pg_size_pretty(pg_total_relation_size(r.oid)))
        FROM pg_class r
        WHERE r.relnamespace = 'loom'::regnamespace AND r.relkind IN ('r', 'p')
        ORDER BY r.relname
    LOOP
        RETURN NEXT;
    END LOOP;

    -- Both formats, estimated: rows from the table's estimate and
    -- state_z's null fraction (a row without a frame holds JSONB), bytes
    -- from the average stored width of the column each format is in.
    -- Unestimated until the table is analyzed, and said so.
    FOR item, value IN
        SELECT 'snapshots as ' || f.format,
               CASE WHEN r.reltuples < 0 THEN 'rows not estimated yet (never vacuumed or analyzed)'
                    WHEN r.reltuples = 0 THEN '~0 rows, 0 bytes'
                    WHEN j.null_frac IS NULL OR (frames.has_column AND z.null_frac IS NULL)
                    THEN 'rows by format not estimated yet (not analyzed)'
                    ELSE format('~%s rows, ~%s',
                                round(r.reltuples * f.share)::bigint,
                                pg_size_pretty(round(r.reltuples * f.share * coalesce(f.width, 0))::bigint))
               END
        FROM pg_class r
        LEFT JOIN pg_stats z ON z.schemaname = 'loom' AND z.tablename = 'snapshots' AND z.attname = 'state_z'
        LEFT JOIN pg_stats j ON j.schemaname = 'loom' AND j.tablename = 'snapshots' AND j.attname = 'state'
        CROSS JOIN LATERAL (VALUES
            -- state's average is over every row, a frame row's sentinel
            -- too: the JSONB rows' own width is what is left of it.
            (1, 'JSONB', CASE WHEN frames.has_column THEN z.null_frac ELSE 1 END,
             CASE WHEN frames.has_column AND z.null_frac > 0
                  THEN greatest(0, (j.avg_width - (1 - z.null_frac)
                        * pg_column_size('{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb)) / z.null_frac)
                  ELSE j.avg_width END),
            (2, 'frames', CASE WHEN frames.has_column THEN 1 - z.null_frac ELSE 0 END, z.avg_width)
        ) AS f(n, format, share, width)
        WHERE r.oid = 'loom.snapshots'::regclass AND (f.n = 1 OR frames.has_column)
        ORDER BY f.n
    LOOP
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_status() IS
'What loom status prints, one fact a row, from catalogs and statistics alone (constant time at any size): server and loom versions, an update available, each execution_id/name column''s collation, snapshot frames, the unused index 0.7.0 drops, where the executions index is checked (loom_verify_executions), whether loom is distributed, estimated rows and bytes per table, estimated snapshot rows and bytes by format. needs_action marks what to act on, statement what to run. Reads only; a reader may call it.';

-- Added now if loom.events can be locked within the migration lock wait
-- (loom.migration_lock_timeout, 2 s unless set); otherwise a WARNING, and
-- loom-client's migrate() tries again at each boot. Not here where loom is
-- distributed (Citus runs this script on every node): there migrate(), or
-- SELECT loom_ensure_event_metadata(); on the coordinator, adds it as a
-- statement of its own, which Citus applies to every shard.
SELECT CASE WHEN @extschema@.loom_is_distributed() THEN 'left to the coordinator'
            ELSE @extschema@.loom_ensure_event_metadata(@extschema@.loom_migration_lock_timeout()) END;
