-- loom 0.6.0 -> 0.7.0 (issue 18): the write path at the plain table's
-- speed. The append functions, the trigger function that keeps
-- loom.executions, its probe and the tail read are C over kept SPI plans
-- instead of PL/pgSQL (same signatures, errors and privileges); an append
-- onto an execution that has its row holds a lock-manager lock on the
-- id's stripe instead of locking the row, and loom_track_emptied takes
-- that stripe too; loom.events loses idx_events_exec, an index no loom
-- query reads since 0.4.0, dropped with a bounded lock wait that fails
-- soft. loom_status() (issue 19) says what a database needs.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.7.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- Every function below replaces its 0.6.0 body (same signature; the
-- privileges on it stay) or is new; each is as loom_pg/src/sql/ defines it
-- for a fresh install. CREATE OR REPLACE changes the language, and drops
-- the pinned search_path the C functions do not need.

-- Every function that touches loom's tables is PL/pgSQL or C over SPI,
-- none LANGUAGE sql: Citus cannot plan a SQL function's parameters (it
-- refuses them, and crashed the backend on one), and the same functions
-- run on one node and on a Citus coordinator.
--
-- The two append functions are C (loom_pg/src/append.rs): the write path
-- is loom's measured bottleneck (ADR 0108 D2, issue 18), and a PL/pgSQL
-- frame with a pinned search_path cost a fifth of a one-event append.
-- They pin no search_path because they resolve nothing through it: their
-- statements are prepared once, schema-qualified, typed by OID.
CREATE OR REPLACE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'loom_append_event_wrapper';
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb) IS
'Appends one event to an execution''s log. A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only. Only in READ COMMITTED transactions (0A000 otherwise).';

CREATE OR REPLACE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[])
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'loom_append_events_wrapper';
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. Arrays of different lengths are invalid_parameter_value (22023); only in READ COMMITTED transactions (0A000 otherwise).';

-- loom_append_events where no trigger keeps loom.executions: Citus (after
-- loom_distribute), or a disabled trigger. The caller checked the arrays'
-- lengths.
CREATE FUNCTION @extschema@.loom_append_events_without_trigger(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    appended bigint;
BEGIN
    PERFORM @extschema@.loom_require_read_committed('appended to');
    IF cardinality(execution_ids) = 1 THEN
        -- One event (an agent loop's usual append): on Citus a single-shard
        -- INSERT, one round trip, its errors with their own SQLSTATE.
        INSERT INTO loom.events (execution_id, sequence, kind, payload)
        VALUES (execution_ids[1], sequences[1], kinds[1], payloads[1]);
        appended := 1;
    ELSE
        BEGIN
            INSERT INTO loom.events (execution_id, sequence, kind, payload)
            SELECT * FROM unnest(execution_ids, sequences, kinds, payloads);
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
COMMENT ON FUNCTION @extschema@.loom_append_events_without_trigger(text[], bigint[], text[], jsonb[]) IS
'loom_append_events where no trigger keeps loom.executions (Citus, or a disabled trigger): one subtransaction that turns Citus''s XX000 on a duplicate into unique_violation (23505), then loom_track_appended. Called by loom_append_events; callers check the arrays'' lengths.';

-- In C (loom_pg/src/executions_index.rs): it reads loom.events' cached
-- trigger descriptor, where a query of pg_trigger cost every append a
-- catalog probe. A trigger that is there but does not fire in this session
-- (ALTER TABLE ... DISABLE TRIGGER, or an origin trigger under
-- session_replication_role replica) keeps nothing: loom's functions must.
CREATE OR REPLACE FUNCTION @extschema@.loom_executions_tracked_by_trigger()
RETURNS boolean
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'loom_executions_tracked_by_trigger_wrapper';
COMMENT ON FUNCTION @extschema@.loom_executions_tracked_by_trigger() IS
'True while loom.events has the trigger that keeps loom.executions and it fires in this session (one node); false once loom_distribute dropped it for Citus, or while it is disabled, where loom''s functions keep loom.executions.';

-- The stripe lock an append holds while it finds an execution's row
-- (loom_pg/src/execution_stripes.rs), taken exclusively: in C, the
-- owner's alone (a caller could hold back appends).
CREATE FUNCTION @extschema@.loom_lock_execution_for_delete(execution_id text)
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'loom_lock_execution_for_delete_wrapper';
COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) IS
'Takes, to the end of the transaction, the exclusive lock on the stripe of an execution id that appends hold shared while they find its loom.executions row: what loom_track_emptied takes before it looks for events left. Advisory lock (classid 1819242349, objid the stripe 0-63, objsubid 3) in pg_locks.';

CREATE OR REPLACE FUNCTION @extschema@.loom_track_emptied(execution_id text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_require_read_committed('deleted from');
    -- Appends since 0.7.0 hold the id's stripe while they find its row,
    -- and lock no row; loom_track_appended (Citus, a disabled trigger) and
    -- appends over many stripes lock the row. Both are taken, then the log
    -- is looked at with a fresh snapshot (the DELETE's own statement; one
    -- shard group on Citus).
    PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
    PERFORM 1 FROM loom.executions x WHERE x.execution_id = loom_track_emptied.execution_id FOR UPDATE;
    DELETE FROM loom.executions x
    WHERE x.execution_id = loom_track_emptied.execution_id
      AND NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = loom_track_emptied.execution_id);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_track_emptied(text) IS
'Removes an execution id from loom.executions after a delete of its events, if none are left; refused (0A000) outside READ COMMITTED. SECURITY DEFINER, so deleters of loom.events need no grant on loom.executions; executable only by loom_writer and the roles an upgrade found writing loom.events.';

-- The triggers' function, in C (loom_pg/src/executions_index.rs): it
-- runs on every append. It reads only the statement's own transition
-- table, and only after checking that it fired as one of loom's own
-- statement triggers on loom.events: SECURITY DEFINER, so it trusts
-- nothing about how it was called (EXECUTE is also revoked from PUBLIC,
-- which CREATE TRIGGER checks). It reads execution_id as text, calling no
-- function of a caller's type. Its statements resolve nothing through the
-- search_path, which it does not pin.
CREATE OR REPLACE FUNCTION @extschema@.loom_events_track_executions()
RETURNS trigger
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'loom_events_track_executions_wrapper';
COMMENT ON FUNCTION @extschema@.loom_events_track_executions() IS
'Trigger function keeping loom.executions to the ids loom.events holds: after an INSERT (a COPY too) or a DELETE (in READ COMMITTED only: 0A000 otherwise), after a TRUNCATE. SECURITY DEFINER, so writers of loom.events need no grant on loom.executions; it refuses (42501) to run for any relation or trigger but loom.events'' own, and no role may execute it directly.';

-- In C (loom_pg/src/read_events.rs): the tail a resume reads is the read
-- path's hot call, and PL/pgSQL's frame cost it a fifth. Keyset over the
-- primary key (execution_id, sequence): the tail after a snapshot costs
-- what it returns, not the log's length.
CREATE OR REPLACE FUNCTION @extschema@.loom_read_events(execution_id text, after_sequence bigint DEFAULT NULL, max_events integer DEFAULT 1000)
RETURNS TABLE(sequence bigint, kind text, payload jsonb, created_at timestamptz)
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'loom_read_events_wrapper';
COMMENT ON FUNCTION @extschema@.loom_read_events(text, bigint, integer) IS
'Up to max_events (at least 1) events of an execution with a sequence strictly after after_sequence (NULL: from the first), in sequence order: the tail a resume reads after its snapshot, and a keyset pager over one log (the next cursor is the last sequence returned).';

REVOKE EXECUTE ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) FROM PUBLIC;

-- 0.7.0 drops loom.events' index on execution_id alone (idx_events_exec):
-- since 0.4.0 the pager reads loom.executions and the primary key's
-- leading column serves every other query, while each appended row paid
-- for one more index entry (a tenth of a 100-event batch, issue 18). DROP
-- INDEX waits for an ACCESS EXCLUSIVE lock on loom.events, behind every
-- reader, with appends queued behind it: the wait is bounded and fails
-- soft, as the conversions' (ADR 0108 D3). Nothing depends on it.
CREATE FUNCTION @extschema@.loom_drop_events_id_index(lock_timeout_ms integer DEFAULT 2000)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- A catalog check, so a dropped index costs no table lock.
    IF to_regclass('loom.idx_events_exec') IS NULL THEN
        RETURN 'already dropped';
    END IF;
    PERFORM @extschema@.loom_take_migration_lock();
    BEGIN
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        DROP INDEX IF EXISTS loom.idx_events_exec;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        RETURN 'dropped';
    EXCEPTION WHEN lock_not_available OR query_canceled OR deadlock_detected THEN
        RAISE WARNING 'loom: could not drop loom.idx_events_exec, an index no loom query reads since 0.4.0: % (SQLSTATE %)',
                SQLERRM, SQLSTATE
            USING DETAIL = 'Appends stay correct; each keeps paying for the index until it is dropped.',
                  HINT = 'Run SELECT loom_drop_events_id_index(); later (loom-client''s migrate() does at every boot), or by hand in a quiet moment: DROP INDEX loom.idx_events_exec;';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_drop_events_id_index(integer) IS
'Drops loom.idx_events_exec, the index on loom.events.execution_id alone that loom no longer reads (0.7.0), waiting at most lock_timeout_ms for its lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''already dropped'' takes no lock. Under loom''s migration lock; the owner''s to call.';

REVOKE EXECUTE ON FUNCTION @extschema@.loom_drop_events_id_index(integer) FROM PUBLIC;

-- loom_status(): the facts `loom status` prints, as rows, for psql and
-- monitoring queries (issue 19). Each row is one fact; needs_action marks
-- what an operator should do something about, and statement says what to
-- run. Read-only and lock-free beyond reads: a reader may call it.
--
-- Row counts are the planner's estimates (pg_class.reltuples: a count(*)
-- of a large log would take minutes); snapshot rows and bytes by format
-- are exact (one pass over loom.snapshots, sizes read without detoasting).
-- The executions index is checked both ways: ids of the log missing from
-- it (one index descent per distinct id of loom.events, a loose scan of
-- its primary key) and ids left without events (one probe each).
CREATE FUNCTION @extschema@.loom_status()
RETURNS TABLE(item text, value text, needs_action boolean, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    installed text;
    available text;
    frames record;
    missing bigint;
    orphaned bigint;
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
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM loom_migrate_collations();' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT loom_ensure_snapshot_zstd();' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT loom_drop_events_id_index();' END;
    RETURN NEXT;

    WITH RECURSIVE ids(id) AS (
        (SELECT e.execution_id FROM loom.events e ORDER BY e.execution_id LIMIT 1)
        UNION ALL
        SELECT (SELECT e.execution_id FROM loom.events e
                WHERE e.execution_id > ids.id ORDER BY e.execution_id LIMIT 1)
        FROM ids WHERE ids.id IS NOT NULL
    )
    SELECT count(*) INTO missing FROM ids
    WHERE ids.id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM loom.executions x WHERE x.execution_id = ids.id);
    SELECT count(*) INTO orphaned FROM loom.executions x
    WHERE NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = x.execution_id);
    item := 'executions index';
    value := CASE WHEN missing + orphaned = 0 THEN 'in step with the log'
                  ELSE format('%s ids of the log missing, %s ids without events', missing, orphaned) END;
    needs_action := missing + orphaned > 0;
    statement := CASE WHEN needs_action THEN 'SELECT loom_rebuild_executions();' END;
    RETURN NEXT;

    item := 'distributed (Citus)';
    value := CASE WHEN @extschema@.loom_is_distributed() THEN 'yes' ELSE 'no' END;
    needs_action := false; statement := NULL;
    RETURN NEXT;

    FOR item, value IN
        SELECT format('table loom.%s', r.relname),
               format('~%s rows, %s', CASE WHEN r.reltuples < 0 THEN 0 ELSE r.reltuples::bigint END,
                      pg_size_pretty(pg_total_relation_size(r.oid)))
        FROM pg_class r
        WHERE r.relnamespace = 'loom'::regnamespace AND r.relkind IN ('r', 'p')
        ORDER BY r.relname
    LOOP
        RETURN NEXT;
    END LOOP;

    -- Both formats, counted when there are none. Dynamic where state_z
    -- may not exist (frames are opt-in).
    FOR item, value IN EXECUTE format(
        'SELECT ''snapshots as '' || f.format,
                format(''%%s rows, %%s'', count(s.id), pg_size_pretty(coalesce(sum(%s), 0)::bigint))
         FROM (VALUES (1, ''JSONB''), (2, ''frames'')) AS f(n, format)
         LEFT JOIN loom.snapshots s ON %s
         WHERE f.n = 1 OR %L
         GROUP BY f.n, f.format ORDER BY f.n',
        CASE WHEN frames.has_column
             THEN 'CASE WHEN s.state_z IS NULL THEN pg_column_size(s.state) ELSE octet_length(s.state_z) END'
             ELSE 'pg_column_size(s.state)' END,
        CASE WHEN frames.has_column THEN '(s.state_z IS NULL) = (f.n = 1)' ELSE 'f.n = 1' END,
        frames.has_column)
    LOOP
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_status() IS
'What loom status prints, one fact a row: server and loom versions, an update available, each execution_id/name column''s collation, snapshot frames, the unused index 0.7.0 drops, whether loom.executions agrees with loom.events (both ways), whether loom is distributed, estimated rows and bytes per table, snapshot rows and bytes by format. needs_action marks what to act on, statement what to run. Reads only; a reader may call it.';

-- Dropped now if loom.events can be locked within the migration lock wait
-- (loom.migration_lock_timeout, 2 s unless set); otherwise a WARNING, and
-- loom-client's migrate() tries again at each boot.
SELECT @extschema@.loom_drop_events_id_index(@extschema@.loom_migration_lock_timeout());
