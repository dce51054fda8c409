-- loom 0.3.0 -> 0.4.0 (issues 8 and 9): migrations that hold under replicas
-- booting together and a pool's statement_timeout; paging that costs one
-- index probe per id; tail reads, resume in one statement, retention.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.4.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- Every function below replaces its 0.3.0 body (same signature) or is new.
-- loom_ensure_snapshot_zstd serializes on the migration advisory lock and
-- looks again once it holds it (two replicas no longer both ALTER); the
-- collation conversions no longer start under a statement_timeout they
-- cannot escape; a lock wait of 0 (PostgreSQL's "forever") is refused.

-- One row per execution that has events: what the id pager reads, one
-- index-only scan a page whatever the events per execution. Derived from
-- loom.events by its triggers (loom_events_track_executions); loom.events
-- stays the source of truth, and loom_rebuild_executions() rebuilds this
-- from it. Not dumped: restoring loom.events refills it.
CREATE TABLE loom.executions (
    execution_id text COLLATE "C" NOT NULL,
    CONSTRAINT executions_pkey PRIMARY KEY (execution_id)
);
COMMENT ON TABLE loom.executions IS 'One row per execution id that has events, kept by triggers on loom.events (the source of truth): the index loom_list_executions pages. Rebuild with loom_rebuild_executions(); never write it directly.';

-- Whether loom.<table>.<column> is COLLATE "C" (ADR 0108 D2), from the
-- catalog; the collation is looked up by name (no ::regcollation).
CREATE OR REPLACE FUNCTION @extschema@.loom_column_is_c(table_name text, column_name text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT 1
        FROM pg_attribute a
        JOIN pg_class t ON t.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        JOIN pg_collation c ON c.oid = a.attcollation
        JOIN pg_namespace cn ON cn.oid = c.collnamespace
        WHERE n.nspname = 'loom' AND t.relname = $1 AND a.attname = $2
          AND c.collname = 'C' AND cn.nspname = 'pg_catalog')
$$;
COMMENT ON FUNCTION @extschema@.loom_column_is_c(text, text) IS
'True when loom.<table_name>.<column_name> is COLLATE "C", read from the catalog.';

-- loom.executions follows loom.events, whoever writes it (the API, COPY,
-- a restore), one statement at a time. Two races are closed with the
-- executions row's lock: an append locks its execution's row (an upsert
-- whose update never applies still locks), and a delete locks the row
-- before it looks, with a fresh snapshot, for events left. So a delete
-- that removes an execution's last events and an append to it never leave
-- events without their row. "A fresh snapshot" holds only in READ
-- COMMITTED: a delete in a transaction with one snapshot (REPEATABLE READ,
-- SERIALIZABLE) could not see a concurrent append, so it is refused.
-- Rows are locked in id order, so two statements sharing executions
-- cannot deadlock on them. SECURITY DEFINER (owner: the extension's), so a
-- role allowed to write loom.events need not be granted loom.executions;
-- it reads only the statement's own transition table.
CREATE OR REPLACE FUNCTION @extschema@.loom_events_track_executions()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE loom.executions;
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO loom.executions AS x (execution_id)
        SELECT DISTINCT i.execution_id FROM loom_inserted i ORDER BY 1
        ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'loom.events rows can only be deleted in READ COMMITTED transactions, not %',
                current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Its trigger must see an append to the same execution that commits meanwhile, which one snapshot for the whole transaction cannot.';
    END IF;
    -- DELETE: each id whose events went, one at a time, locked first.
    FOR id IN SELECT DISTINCT d.execution_id FROM loom_deleted d ORDER BY 1 LOOP
        PERFORM 1 FROM loom.executions x WHERE x.execution_id = id FOR UPDATE;
        IF NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = id) THEN
            DELETE FROM loom.executions x WHERE x.execution_id = id;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_events_track_executions() IS
'Trigger function keeping loom.executions to the ids loom.events holds: after an INSERT (a COPY too), after a DELETE (in READ COMMITTED only: 0A000 otherwise), after a TRUNCATE. SECURITY DEFINER, so writers of loom.events need no grant on loom.executions.';

-- An execution id is never updated (the API has no such call); refuse it
-- rather than let loom.executions drift. The check is in the body, not in
-- the trigger's column list or WHEN: those would make the column's type
-- unalterable, and the collation conversion alters it.
CREATE OR REPLACE FUNCTION @extschema@.loom_events_refuse_id_update()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.execution_id IS DISTINCT FROM OLD.execution_id THEN
        RAISE EXCEPTION 'loom.events.execution_id cannot be changed: append to the new execution instead'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_events_refuse_id_update() IS
'Trigger function refusing an UPDATE of loom.events.execution_id (0A000): loom.executions, and every cursor, would drift.';

CREATE OR REPLACE FUNCTION @extschema@.loom_rebuild_executions()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    added bigint;
    removed bigint;
BEGIN
    -- Writers wait (SHARE ROW EXCLUSIVE on both tables) while loom.events is
    -- read once; then the two agree. For a restore made without triggers.
    LOCK TABLE loom.events, loom.executions IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM loom.executions x
    WHERE NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = x.execution_id);
    GET DIAGNOSTICS removed = ROW_COUNT;
    INSERT INTO loom.executions (execution_id)
    SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e
    ON CONFLICT (execution_id) DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added + removed;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_rebuild_executions() IS
'Makes loom.executions hold exactly the execution ids of loom.events (the source of truth), holding writers back for one pass over the events index, and returns how many rows it added or removed (0: they agreed). Needed only after writing loom.events with its triggers disabled (pg_restore --disable-triggers).';

CREATE OR REPLACE FUNCTION @extschema@.loom_list_executions(after text DEFAULT NULL, page_size integer DEFAULT 1000)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(page_size);
    -- One index-only scan of loom.executions (COLLATE "C" by construction):
    -- a page costs its ids, whatever the events per execution, and needs
    -- no conversion of loom.events.
    IF after IS NULL THEN
        RETURN QUERY
            SELECT x.execution_id FROM loom.executions x
            ORDER BY x.execution_id LIMIT page_size;
    ELSE
        RETURN QUERY
            SELECT x.execution_id FROM loom.executions x
            WHERE x.execution_id > after COLLATE "C"
            ORDER BY x.execution_id LIMIT page_size;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_list_executions(text, integer) IS
'One page of execution ids strictly after the cursor "after" (any string, not only a stored id; NULL for the first page), in Unicode code point order (COLLATE "C") whatever the database collation. The next cursor is the page''s last id; a page shorter than page_size is the last. Reads loom.executions: one index-only scan a page, however many events each execution has.';

CREATE OR REPLACE FUNCTION @extschema@.loom_read_events(execution_id text, after_sequence bigint DEFAULT NULL, max_events integer DEFAULT 1000)
RETURNS TABLE(sequence bigint, kind text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_events);
    -- Keyset over the primary key (execution_id, sequence): the tail after
    -- a snapshot costs what it returns, not the log's length.
    IF after_sequence IS NULL THEN
        RETURN QUERY
            SELECT e.sequence, e.kind, e.payload, e.created_at FROM loom.events e
            WHERE e.execution_id = loom_read_events.execution_id
            ORDER BY e.sequence LIMIT max_events;
    ELSE
        RETURN QUERY
            SELECT e.sequence, e.kind, e.payload, e.created_at FROM loom.events e
            WHERE e.execution_id = loom_read_events.execution_id AND e.sequence > after_sequence
            ORDER BY e.sequence LIMIT max_events;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_read_events(text, bigint, integer) IS
'Up to max_events (at least 1) events of an execution with a sequence strictly after after_sequence (NULL: from the first), in sequence order: the tail a resume reads after its snapshot, and a keyset pager over one log (the next cursor is the last sequence returned).';

CREATE OR REPLACE FUNCTION @extschema@.loom_delete_events(execution_id text, through_sequence bigint DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    -- One bounded batch, oldest first: row locks on at most max_rows rows,
    -- held for one short statement. Call again until it returns 0.
    DELETE FROM loom.events e
    WHERE e.execution_id = loom_delete_events.execution_id
      AND e.sequence IN (
          SELECT d.sequence FROM loom.events d
          WHERE d.execution_id = loom_delete_events.execution_id
            AND (through_sequence IS NULL OR d.sequence <= through_sequence)
          ORDER BY d.sequence LIMIT max_rows);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_events(text, bigint, integer) IS
'Deletes one batch of at most max_rows events of an execution with a sequence up to through_sequence (NULL: all of them), oldest first, and returns how many: call it until it returns 0. Each call holds row locks on its batch only.';

CREATE OR REPLACE FUNCTION @extschema@.loom_prune_events(execution_id text, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    latest bigint;
    keep bigint;
BEGIN
    -- What resume needs is the latest snapshot and the events after it.
    -- The events before the snapshot go, but for the last one at or before
    -- its sequence, so an execution whose snapshot is at its last event
    -- keeps an event, and is still listed. No snapshot, no pruning.
    PERFORM @extschema@.loom_check_page_size(max_rows);
    SELECT max(s.sequence) INTO latest FROM loom.snapshots s
    WHERE s.execution_id = loom_prune_events.execution_id;
    -- The last event at or before the snapshot stays (sequences may have
    -- gaps), and everything before it goes.
    SELECT max(e.sequence) INTO keep FROM loom.events e
    WHERE e.execution_id = loom_prune_events.execution_id AND e.sequence <= latest;
    IF keep IS NULL OR keep = -9223372036854775808 THEN
        RETURN 0;
    END IF;
    RETURN @extschema@.loom_delete_events(execution_id, keep - 1, max_rows);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_prune_events(text, integer) IS
'Deletes one batch of at most max_rows events of an execution older than its latest snapshot (what resume no longer needs: it reads that snapshot and the events after it; the last event at or before the snapshot''s sequence stays, so the execution stays listed), and returns how many; 0 when there is nothing left to prune or no snapshot. Call it until it returns 0.';

CREATE OR REPLACE FUNCTION @extschema@.loom_delete_execution(execution_id text, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    refs_deleted bigint;
    lineage_deleted bigint;
    snapshots_deleted bigint;
    events_deleted bigint := 0;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    -- Refs and the execution's own fork record first, so no ref points into
    -- a log being deleted (forks of it keep their lineage rows: they name
    -- it as their history); then snapshots, then events, within one
    -- batch's budget.
    -- (loom.refs has no index on execution_id: each call scans it, which
    -- costs little next to a batch while refs are branch names.)
    DELETE FROM loom.refs r WHERE r.execution_id = loom_delete_execution.execution_id;
    GET DIAGNOSTICS refs_deleted = ROW_COUNT;
    DELETE FROM loom.lineage l WHERE l.execution_id = loom_delete_execution.execution_id;
    GET DIAGNOSTICS lineage_deleted = ROW_COUNT;
    snapshots_deleted := @extschema@.loom_delete_snapshots(execution_id, max_rows);
    IF snapshots_deleted < max_rows THEN
        events_deleted := @extschema@.loom_delete_events(execution_id, NULL, (max_rows - snapshots_deleted)::integer);
    END IF;
    RETURN refs_deleted + lineage_deleted + snapshots_deleted + events_deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_execution(text, integer) IS
'Deletes one batch of an execution: the refs pointing at it and its lineage row, then at most max_rows of its snapshots and events (snapshots first, oldest first), and returns how many rows went; call it until it returns 0. Paging over the other executions is unaffected; this one leaves the pager with its last event.';

-- ADR 0108 D3 and its L21 addendum: converting a hot table's column to
-- COLLATE "C" takes an ACCESS EXCLUSIVE lock and rebuilds its indexes, so it
-- is bounded where it waits, unbounded where it works, and fails soft:
-- correctness never depends on it, because every query states COLLATE "C".
--
-- "Unbounded where it works" cannot be arranged from inside a function:
-- PostgreSQL arms statement_timeout once per top-level statement, so a
-- set_config('statement_timeout', '0') here changes nothing for the
-- statement already running. A conversion under a non-zero
-- statement_timeout would take the exclusive lock, rebuild, be cancelled
-- and roll back, on every boot. So it does not start: it skips with a
-- WARNING, taking no lock. Callers exempt the statement themselves (the
-- documented upgrade and loom-client's migrate() run it with
-- statement_timeout 0).

-- loom's migrations serialize on one transaction-level advisory lock, the
-- key 0x6C6F6F6D ("loom"), waited for without a bound (ADR 0108 D3.3):
-- queueing behind a peer's one-time rebuild is intended. The caller's
-- lock_timeout is restored as soon as it is held. Reentrant: a caller that
-- already holds it (the documented upgrade) passes straight through.
CREATE OR REPLACE FUNCTION @extschema@.loom_take_migration_lock()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '0', true);
    PERFORM pg_advisory_xact_lock(1819242349);
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_take_migration_lock() IS
'Waits, without a lock_timeout, for loom''s migration advisory lock (pg_advisory_xact_lock(1819242349)) and holds it to the end of the transaction. A statement_timeout still bounds the wait: run it with statement_timeout 0 to queue behind a peer''s migration.';

-- A lock wait given in ms must be a bound: PostgreSQL reads 0 as "wait
-- forever", the opposite of what a caller bounding it means.
CREATE OR REPLACE FUNCTION @extschema@.loom_check_lock_timeout(lock_timeout_ms integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lock_timeout_ms IS NULL OR lock_timeout_ms < 1 THEN
        RAISE EXCEPTION 'a lock wait must be at least 1 ms, got %', coalesce(lock_timeout_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'lock_timeout 0 means "wait forever" in PostgreSQL; loom''s migrations always bound their wait';
    END IF;
    RETURN lock_timeout_ms;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_check_lock_timeout(integer) IS
'Returns lock_timeout_ms, or refuses NULL, 0 or a negative wait with invalid_parameter_value (22023): 0 would mean "wait forever".';

-- The lock wait of each conversion, in ms: loom.migration_lock_timeout, or
-- 2000 when it is not set.
CREATE OR REPLACE FUNCTION @extschema@.loom_migration_lock_timeout()
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.loom_check_lock_timeout(
        coalesce(nullif(current_setting('loom.migration_lock_timeout', true), '')::integer, 2000))
$$;
COMMENT ON FUNCTION @extschema@.loom_migration_lock_timeout() IS
'The lock wait, in ms, each loom migration allows itself: the custom setting loom.migration_lock_timeout, 2000 when unset; 0 or less is invalid_parameter_value (22023).';

CREATE OR REPLACE FUNCTION @extschema@.loom_convert_column_to_c(table_name text, column_name text, lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    alter_statement text := format('ALTER TABLE loom.%I ALTER COLUMN %I TYPE text COLLATE "C"', table_name, column_name);
    analyze_statement text := format('ANALYZE loom.%I', table_name);
    by_hand text := format('SET lock_timeout = 0; SET statement_timeout = 0; %s; %s;', alter_statement, analyze_statement);
    converted boolean;
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- A catalog check, so a converted column costs no table lock.
    converted := @extschema@.loom_column_is_c(table_name, column_name);
    IF converted THEN
        RETURN 'already COLLATE "C"';
    END IF;
    -- The running statement's timer cannot be switched off from here:
    -- starting would mean lock, rebuild, cancel, on every call.
    IF current_setting('statement_timeout') <> '0' THEN
        RAISE WARNING 'loom: not converting loom.%.% to COLLATE "C": statement_timeout is %, and a rebuild it cancels would hold an exclusive lock for nothing',
                table_name, column_name, current_setting('statement_timeout')
            USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                  HINT = 'Run it as its own statement with statement_timeout 0: loom-client''s migrate() does, or SET statement_timeout = 0; SELECT * FROM loom_migrate_collations();, or by hand: ' || by_hand;
        RETURN 'skipped: statement_timeout';
    END IF;
    -- The block is a subtransaction: a soft failure rolls back this one
    -- conversion, and the caller's transaction (ALTER EXTENSION) goes on.
    BEGIN
        -- Bound the wait for the lock (appends queue behind it), never the
        -- rebuild (statement_timeout is 0, checked above).
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        EXECUTE alter_statement;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
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
                      HINT = 'Run SELECT loom_migrate_collations(); later (with statement_timeout 0), or by hand in a quiet moment: ' || by_hand;
            RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_convert_column_to_c(text, text, integer) IS
'Converts one loom.<table>.<column> to COLLATE "C" (ADR 0108 D3): a no-op without any lock when already converted. Otherwise, only when statement_timeout is 0 (a function cannot exempt its own statement from it, and a cancelled rebuild would hold the exclusive lock for nothing; else it skips with a WARNING, taking no lock), waits at most lock_timeout_ms (at least 1) for the lock, restores the caller''s lock_timeout, ANALYZEs, and on a lock timeout, cancel, deadlock or dependent view rolls back alone with a WARNING naming the statements to run by hand.';

CREATE OR REPLACE FUNCTION @extschema@.loom_migrate_collations(lock_timeout_ms integer DEFAULT 2000)
RETURNS TABLE(column_name text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- One migrator at a time: a second caller waits here, then finds the
    -- columns converted by the catalog check, and locks nothing.
    PERFORM @extschema@.loom_take_migration_lock();
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
'Converts loom.refs.name, then loom.events.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does, under loom''s migration advisory lock; re-runs a conversion an upgrade skipped. Run it with statement_timeout 0 (it skips, locking nothing, otherwise; loom-client''s migrate() does this at every boot). Returns what happened to each column.';

-- The view decodes state_z only where the column exists: it is (re)defined
-- whenever loom_ensure_snapshot_zstd adds the column.
CREATE OR REPLACE FUNCTION @extschema@.loom_define_snapshots_decoded()
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
    -- The rows as stored, with a state_z column whether or not the table
    -- has one yet: what loom_resume reads, so that a client can decode a
    -- frame itself, and a function over it stays valid when the column
    -- comes.
    EXECUTE format(
        'CREATE OR REPLACE VIEW loom.snapshots_stored AS
             SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at, s.state,
                    %s AS state_z
             FROM loom.snapshots s',
        frame_column);
    COMMENT ON VIEW loom.snapshots_stored IS
        'loom.snapshots as stored (a frame row holds the sentinel in state and the frame in state_z), with state_z NULL on every row while the frame column does not exist.';
END
$$;
COMMENT ON FUNCTION @extschema@.loom_define_snapshots_decoded() IS
'(Re)defines the views loom.snapshots_decoded and loom.snapshots_stored for the columns loom.snapshots has now.';

-- The new view loom.snapshots_stored, before loom_resume reads it.
SELECT @extschema@.loom_define_snapshots_decoded();

-- Whether loom.snapshots has the frame column and its check, from the
-- catalog alone: a peer may have added them.
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_frame_catalog(OUT has_column boolean, OUT has_check boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame_catalog() IS
'Whether loom.snapshots has the frame column state_z and the check snapshots_frame_sentinel (ADR 0141 D2), read from the catalog.';

CREATE OR REPLACE FUNCTION @extschema@.loom_ensure_snapshot_zstd(lock_timeout_ms integer DEFAULT 200)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    has_column boolean;
    has_check boolean;
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- Every call after the first takes no lock at all, not even the
    -- advisory one.
    SELECT * INTO has_column, has_check FROM @extschema@.loom_snapshot_frame_catalog();
    IF has_column AND has_check THEN
        RETURN true;
    END IF;
    BEGIN
        -- Replicas booting together all get here. One at a time, under the
        -- migration advisory lock (ADR 0141 D5), and each looks again once
        -- it holds it: a peer that went first has done the work.
        PERFORM @extschema@.loom_take_migration_lock();
        SELECT * INTO has_column, has_check FROM @extschema@.loom_snapshot_frame_catalog();
        IF has_column AND has_check THEN
            RETURN true;
        END IF;
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
        RAISE NOTICE 'loom: added the snapshot frame column loom.snapshots.state_z and its check';
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
'Provisions zstd snapshot frames (ADR 0141 D5), opt-in: adds loom.snapshots.state_z (bytea, STORAGE EXTERNAL) and the NOT VALID check snapshots_frame_sentinel. True at once, taking no lock, when both exist. Otherwise it queues on loom''s migration advisory lock (so replicas booting together do it once), looks again, and takes one ACCESS EXCLUSIVE lock waited for at most least(lock_timeout_ms, 200) ms (at least 1). False, with one WARNING, on a lock timeout, missing privilege, deadlock or cancel: snapshots stay JSONB; retry later.';

CREATE OR REPLACE FUNCTION @extschema@.loom_delete_snapshots(execution_id text, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    -- One bounded batch, oldest first; call again until it returns 0.
    DELETE FROM loom.snapshots s
    WHERE s.execution_id = loom_delete_snapshots.execution_id
      AND s.sequence IN (SELECT d.sequence FROM loom.snapshots d
                         WHERE d.execution_id = loom_delete_snapshots.execution_id
                         ORDER BY d.sequence LIMIT max_rows);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_snapshots(text, integer) IS
'Deletes one batch of at most max_rows snapshots of an execution, oldest first, and returns how many: call it until it returns 0.';

CREATE OR REPLACE FUNCTION @extschema@.loom_resume(execution_id text)
RETURNS TABLE(snapshot_id bigint, workflow_id text, sequence bigint, created_at timestamptz,
              state jsonb, state_z bytea, kind text, payload jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- One statement, so one MVCC snapshot: the tail starts exactly after
    -- the snapshot's sequence, none missing or repeated, whatever appends
    -- commit meanwhile. The frame ships as stored (the client decodes it).
    WITH latest AS (
        SELECT f.id, f.workflow_id, f.sequence, f.created_at, f.state, f.state_z
        FROM loom.snapshots_stored f WHERE f.execution_id = $1
        ORDER BY f.sequence DESC LIMIT 1
    ), tail AS (
        -- A keyset read after the snapshot (no snapshot: the comparison is
        -- NULL and this branch is empty)...
        SELECT e.sequence, e.created_at, e.kind, e.payload FROM loom.events e
        WHERE e.execution_id = $1 AND e.sequence > (SELECT l.sequence FROM latest l)
        UNION ALL
        -- ...or the whole log when there is none.
        SELECT e.sequence, e.created_at, e.kind, e.payload FROM loom.events e
        WHERE e.execution_id = $1 AND NOT EXISTS (SELECT 1 FROM latest)
    )
    SELECT r.snapshot_id, r.workflow_id, r.sequence, r.created_at, r.state, r.state_z, r.kind, r.payload
    FROM (
        SELECT l.id AS snapshot_id, l.workflow_id, l.sequence, l.created_at, l.state, l.state_z,
               NULL::text AS kind, NULL::jsonb AS payload, 0 AS part
        FROM latest l
        UNION ALL
        SELECT NULL, NULL, t.sequence, t.created_at, NULL, NULL, t.kind, t.payload, 1
        FROM tail t
    ) r
    ORDER BY r.part, r.sequence
$$;
COMMENT ON FUNCTION @extschema@.loom_resume(text) IS
'What a workflow resumes from, in one statement (one MVCC snapshot): first the latest snapshot as stored (snapshot_id set; state, or the sentinel and the frame in state_z), then the events after its sequence in order (kind set); all the events when there is no snapshot.';

-- Last, loom.executions' triggers and its fill. CREATE TRIGGER takes SHARE
-- ROW EXCLUSIVE on loom.events, which appends queue behind until the update
-- commits; the wait for it is bounded by loom.migration_lock_timeout, as
-- ADR 0108 D3.1 bounds every migration's, and the caller's lock_timeout
-- comes back once it is held. Paging's correctness depends on the table,
-- so a wait that times out fails the update loudly (to be retried), where
-- the collation conversions fail soft.
SELECT set_config('loom.caller_lock_timeout', current_setting('lock_timeout'), true);
SELECT set_config('lock_timeout', @extschema@.loom_migration_lock_timeout() || 'ms', true);
LOCK TABLE loom.events IN SHARE ROW EXCLUSIVE MODE;
SELECT set_config('lock_timeout', current_setting('loom.caller_lock_timeout'), true);

CREATE TRIGGER events_track_inserted_executions AFTER INSERT ON loom.events
    REFERENCING NEW TABLE AS loom_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_track_executions();

CREATE TRIGGER events_track_deleted_executions AFTER DELETE ON loom.events
    REFERENCING OLD TABLE AS loom_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_track_executions();

CREATE TRIGGER events_track_truncated_executions AFTER TRUNCATE ON loom.events
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_track_executions();

CREATE TRIGGER events_refuse_id_update BEFORE UPDATE ON loom.events
    FOR EACH ROW EXECUTE FUNCTION @extschema@.loom_events_refuse_id_update();

-- One pass over the events index, while appends wait on the lock above.
INSERT INTO loom.executions (execution_id)
SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e;
ANALYZE loom.executions;

-- Paging reads loom.executions as the caller: whoever could read ids from
-- loom.events keeps reading them (the triggers write it for the writers).
DO $loom$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT g.grantee FROM information_schema.role_table_grants g
        WHERE g.table_schema = 'loom' AND g.table_name = 'events'
          AND g.privilege_type = 'SELECT' AND g.grantee <> current_user
    LOOP
        EXECUTE format('GRANT SELECT ON loom.executions TO %s',
                       CASE WHEN grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(grantee) END);
    END LOOP;
END
$loom$;
