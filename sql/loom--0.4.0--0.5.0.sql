-- loom 0.4.0 -> 0.5.0 (issue 10): loom on Citus. Every execution_id is
-- COLLATE "C" (what co-location needs), no function that touches loom's
-- tables is LANGUAGE sql (Citus cannot plan their parameters), no upsert
-- calls now() in its SET (Citus wants IMMUTABLE there), loom.executions is
-- kept by loom's functions where loom.events has no triggers, and
-- loom_distribute lays the tables out on a Citus cluster.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.5.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- Every function below replaces its 0.4.0 body (same signature) or is new.
-- The event log and ref API. Every function states COLLATE "C" itself, so
-- it pages right even on a column an upgrade could not convert (ADR 0108
-- D2), and pins search_path, so that no object a caller can create (a
-- table, an operator) is ever picked up in place of loom's or pg_catalog's.

-- Every function that touches loom's tables is PL/pgSQL, none LANGUAGE sql:
-- Citus cannot plan a SQL function's parameters (it refuses them, and
-- crashed the backend on one), and the same functions run on one node and
-- on a Citus coordinator.
CREATE OR REPLACE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4);
    IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        PERFORM @extschema@.loom_track_appended(ARRAY[$1]);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb) IS
'Appends one event to an execution''s log. A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only.';

CREATE OR REPLACE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[])
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
    IF @extschema@.loom_executions_tracked_by_trigger() THEN
        INSERT INTO loom.events (execution_id, sequence, kind, payload)
        SELECT * FROM unnest(execution_ids, sequences, kinds, payloads);
        GET DIAGNOSTICS appended = ROW_COUNT;
        RETURN appended;
    END IF;
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
    PERFORM @extschema@.loom_track_appended(execution_ids);
    RETURN appended;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. Arrays of different lengths are invalid_parameter_value (22023).';

-- After a failed append: a unique_violation (23505) naming the first event
-- of the batch already in the log, or repeated within the batch; nothing
-- when there is none.
CREATE OR REPLACE FUNCTION @extschema@.loom_refuse_appended_twice(execution_ids text[], sequences bigint[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    i integer;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(execution_ids), 0) LOOP
        IF EXISTS (SELECT 1 FROM loom.events e
                   WHERE e.execution_id = execution_ids[i] AND e.sequence = sequences[i])
           OR EXISTS (SELECT 1 FROM generate_subscripts(execution_ids, 1) j
                      WHERE j < i AND execution_ids[j] = execution_ids[i] AND sequences[j] = sequences[i]) THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "events_pkey"'
                USING ERRCODE = 'unique_violation', CONSTRAINT = 'events_pkey',
                      DETAIL = format('Key (execution_id, sequence)=(%s, %s) already exists.', execution_ids[i], sequences[i]);
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_refuse_appended_twice(text[], bigint[]) IS
'Raises unique_violation (23505) for the first event of a batch whose (execution_id, sequence) is in loom.events or earlier in the batch; used after an append failed on Citus, which reports duplicates as XX000.';

CREATE OR REPLACE FUNCTION @extschema@.loom_check_page_size(page_size integer)
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

-- loom.executions follows loom.events, one statement at a time. Two races
-- are closed with the executions row's lock: an append locks its
-- execution's row (an upsert whose update never applies still locks), and
-- a delete locks the row before it looks, with a fresh snapshot, for
-- events left. So a delete that removes an execution's last events and an
-- append to it never leave events without their row. "A fresh snapshot"
-- holds only in READ COMMITTED: a delete in a transaction with one
-- snapshot (REPEATABLE READ, SERIALIZABLE) could not see a concurrent
-- append, so it is refused. Rows are locked in id order, so two statements
-- sharing executions cannot deadlock on them (on Citus, within a shard;
-- across shards its deadlock detector cancels one of two such batches).
--
-- On one node, triggers on loom.events call the two functions below for
-- whoever writes it (the API, COPY, a restore). Citus distributes no table
-- with triggers, so loom_distribute drops them, and loom's own functions
-- call these after each write instead.
CREATE OR REPLACE FUNCTION @extschema@.loom_executions_tracked_by_trigger()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- One probe of pg_trigger's (tgrelid, tgname) index.
    RETURN EXISTS (SELECT 1 FROM pg_trigger t
                   WHERE t.tgrelid = 'loom.events'::regclass
                     AND t.tgname = 'events_track_inserted_executions');
END
$$;
COMMENT ON FUNCTION @extschema@.loom_executions_tracked_by_trigger() IS
'True while loom.events has the triggers that keep loom.executions (one node); false once loom_distribute dropped them for Citus, where loom''s functions keep it.';

CREATE OR REPLACE FUNCTION @extschema@.loom_track_appended(execution_ids text[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text;
BEGIN
    -- One id at a time, in id order (one global lock order, across shards
    -- too), each a single-shard statement on Citus. Only ids that have
    -- events are added: whoever may call this cannot make the pager list
    -- an id the log does not hold.
    FOR id IN SELECT DISTINCT i.id FROM unnest(execution_ids) AS i(id) WHERE i.id IS NOT NULL ORDER BY 1 LOOP
        -- One statement on one shard group (the row comes from the log).
        INSERT INTO loom.executions AS x (execution_id)
        SELECT e.execution_id FROM loom.events e WHERE e.execution_id = id LIMIT 1
        ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_track_appended(text[]) IS
'Adds each given execution id that has events to loom.executions, locking its row, in id order: what loom''s append functions call where no trigger keeps loom.executions (Citus). SECURITY DEFINER, so writers of loom.events need no grant on loom.executions; an id without events is never added.';

CREATE OR REPLACE FUNCTION @extschema@.loom_track_emptied(execution_id text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'loom.events rows can only be deleted in READ COMMITTED transactions, not %',
                current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'loom.executions must see an append to the same execution that commits meanwhile, which one snapshot for the whole transaction cannot.';
    END IF;
    -- Locked first, then looked at with a fresh snapshot (the DELETE's own
    -- statement; one shard group on Citus).
    PERFORM 1 FROM loom.executions x WHERE x.execution_id = loom_track_emptied.execution_id FOR UPDATE;
    DELETE FROM loom.executions x
    WHERE x.execution_id = loom_track_emptied.execution_id
      AND NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = loom_track_emptied.execution_id);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_track_emptied(text) IS
'Removes an execution id from loom.executions after a delete of its events, if none are left; refused (0A000) outside READ COMMITTED. SECURITY DEFINER, so deleters of loom.events need no grant on loom.executions.';

-- The triggers' function; it reads only the statement's own transition
-- table.
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
    ELSIF TG_OP = 'INSERT' THEN
        -- Set-based: the transition table proves each id has events.
        INSERT INTO loom.executions AS x (execution_id)
        SELECT DISTINCT i.execution_id FROM loom_inserted i ORDER BY 1
        ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
    ELSE
        -- DELETE: each id whose events went, one at a time, in id order.
        FOR id IN SELECT DISTINCT d.execution_id FROM loom_deleted d ORDER BY 1 LOOP
            PERFORM @extschema@.loom_track_emptied(id);
        END LOOP;
    END IF;
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
    before bigint;
    removed bigint;
    kept bigint;
BEGIN
    -- Writers wait (SHARE ROW EXCLUSIVE on both tables) while loom.events is
    -- read once; then the two agree. For a restore made without triggers,
    -- or rows written to loom.events directly on Citus.
    LOCK TABLE loom.events, loom.executions IN SHARE ROW EXCLUSIVE MODE;
    SELECT count(*) INTO before FROM loom.executions;
    DELETE FROM loom.executions x
    WHERE NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = x.execution_id);
    GET DIAGNOSTICS removed = ROW_COUNT;
    -- Ids are equal under any deterministic collation: no COLLATE here,
    -- so Citus runs this in each shard group.
    INSERT INTO loom.executions (execution_id)
    SELECT DISTINCT e.execution_id FROM loom.events e
    ON CONFLICT (execution_id) DO NOTHING;
    -- Counted, not taken from ROW_COUNT: an INSERT ... SELECT that Citus
    -- runs through the coordinator reports the rows it sent.
    SELECT count(*) INTO kept FROM loom.executions;
    RETURN removed + (kept - (before - removed));
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
    IF deleted > 0 AND NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        PERFORM @extschema@.loom_track_emptied(execution_id);
    END IF;
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

CREATE OR REPLACE FUNCTION @extschema@.loom_put_ref(name text, execution_id text, sequence bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- excluded.updated_at is now(), evaluated once: Citus takes no
    -- non-IMMUTABLE function in an upsert's SET.
    INSERT INTO loom.refs AS r (name, execution_id, sequence) VALUES ($1, $2, $3)
    ON CONFLICT ON CONSTRAINT refs_pkey DO UPDATE
        SET execution_id = excluded.execution_id, sequence = excluded.sequence, updated_at = excluded.updated_at;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_put_ref(text, text, bigint) IS
'Creates or moves the branch ref "name" to (execution_id, sequence).';

CREATE OR REPLACE FUNCTION @extschema@.loom_delete_ref(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    DELETE FROM loom.refs r WHERE r.name = $1;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted > 0;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_ref(text) IS
'Deletes the branch ref "name"; true when it existed.';

CREATE OR REPLACE FUNCTION @extschema@.loom_list_refs(after text DEFAULT NULL, page_size integer DEFAULT 1000)
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

-- ALTER ... TYPE refuses a column a view reads, and a view's column
-- cannot change collation in place: loom.snapshots' two views are dropped
-- around the statement and defined again, with their grants, as members
-- of the extension (inside ALTER EXTENSION's own script they are members
-- by being created there).
CREATE OR REPLACE FUNCTION @extschema@.loom_alter_under_snapshot_views(statement text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    view_name text;
    grants text[] := '{}';
    is_member boolean;
BEGIN
    FOREACH view_name IN ARRAY ARRAY['snapshots_decoded', 'snapshots_stored'] LOOP
        CONTINUE WHEN to_regclass('loom.' || view_name) IS NULL;
        grants := grants || ARRAY(
            SELECT format('GRANT %s ON loom.%I TO %s%s', a.privilege_type, view_name,
                          CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                          CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid = ('loom.' || view_name)::regclass AND a.grantee <> c.relowner);
        IF @extschema@.loom_view_is_member(view_name) THEN
            EXECUTE format('ALTER EXTENSION loom DROP VIEW loom.%I', view_name);
        END IF;
        EXECUTE format('DROP VIEW loom.%I', view_name);
    END LOOP;
    EXECUTE statement;
    PERFORM @extschema@.loom_define_snapshots_decoded();
    FOREACH view_name IN ARRAY ARRAY['snapshots_decoded', 'snapshots_stored'] LOOP
        IF NOT @extschema@.loom_view_is_member(view_name) THEN
            EXECUTE format('ALTER EXTENSION loom ADD VIEW loom.%I', view_name);
        END IF;
    END LOOP;
    FOREACH statement IN ARRAY grants LOOP
        EXECUTE statement;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_alter_under_snapshot_views(text) IS
'Runs one ALTER TABLE loom.snapshots statement that the views loom.snapshots_decoded and loom.snapshots_stored would block: drops them, runs it, defines them again with their grants, as members of the extension.';

CREATE OR REPLACE FUNCTION @extschema@.loom_view_is_member(view_name text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_depend d
        JOIN pg_extension x ON x.oid = d.refobjid
        WHERE d.classid = 'pg_class'::regclass AND d.objid = to_regclass('loom.' || $1)
          AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND x.extname = 'loom')
$$;
COMMENT ON FUNCTION @extschema@.loom_view_is_member(text) IS
'Whether the view loom.<view_name> exists and is a member of the extension loom.';

CREATE OR REPLACE FUNCTION @extschema@.loom_convert_column_to_c(table_name text, column_name text, lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    alter_statement text := format('ALTER TABLE loom.%I ALTER COLUMN %I TYPE text COLLATE "C"', table_name, column_name);
    analyze_statement text := format('ANALYZE loom.%I', table_name);
    by_hand text := format('SET lock_timeout = 0; SET statement_timeout = 0; %s; %s;',
        CASE table_name WHEN 'snapshots'
            THEN format('SELECT loom_alter_under_snapshot_views(%L)', alter_statement)
            ELSE alter_statement END,
        analyze_statement);
    converted boolean;
    dependents text;
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
        IF table_name = 'snapshots' THEN
            -- The views read the column: the lock first, then the swap.
            LOCK TABLE loom.snapshots IN ACCESS EXCLUSIVE MODE;
            PERFORM @extschema@.loom_alter_under_snapshot_views(alter_statement);
        ELSE
            EXECUTE alter_statement;
        END IF;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        -- ALTER ... TYPE drops the column's statistics; without them the
        -- planner sorts instead of scanning the index.
        EXECUTE analyze_statement;
        RETURN 'converted';
    EXCEPTION
        -- What boot survives: a lock wait that timed out, a cancel, a
        -- deadlock, a view or rule on the column (feature_not_supported).
        -- Not owning the table is not caught: the next DDL would fail anyway.
        -- dependent_objects_still_exist: a user's view on a snapshot view
        -- (added after 0.5.0's release: without it this script failed hard
        -- on such a database, and no update from 0.4.0 could complete).
        -- Its warning names them (PostgreSQL's DETAIL lists them).
        WHEN lock_not_available OR query_canceled OR deadlock_detected OR feature_not_supported
             OR dependent_objects_still_exist THEN
            GET STACKED DIAGNOSTICS dependents = PG_EXCEPTION_DETAIL;
            RAISE WARNING 'loom: could not convert loom.%.% to COLLATE "C": % (SQLSTATE %)',
                    table_name, column_name,
                    SQLERRM || CASE WHEN SQLSTATE = '2BP01' THEN ' (' || replace(dependents, E'\n', '; ') || ')' ELSE '' END,
                    SQLSTATE
                USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                      HINT = CASE WHEN SQLSTATE = '2BP01' THEN
                                 'Drop the objects named (saving their definitions), then run SELECT loom_migrate_collations(); with statement_timeout 0, then create them again; or by hand: '
                             ELSE 'Run SELECT loom_migrate_collations(); later (with statement_timeout 0), or by hand in a quiet moment: ' END || by_hand;
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
    -- Since 0.5.0 every execution_id is COLLATE "C": one order for ids,
    -- and what Citus co-location needs (loom_distribute).
    column_name := 'loom.snapshots.execution_id';
    outcome := @extschema@.loom_convert_column_to_c('snapshots', 'execution_id', lock_timeout_ms);
    RETURN NEXT;
    column_name := 'loom.lineage.execution_id';
    outcome := @extschema@.loom_convert_column_to_c('lineage', 'execution_id', lock_timeout_ms);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_migrate_collations(integer) IS
'Converts loom.refs.name, then loom.events.execution_id, loom.snapshots.execution_id and loom.lineage.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does, under loom''s migration advisory lock; re-runs a conversion an upgrade skipped. Run it with statement_timeout 0 (it skips, locking nothing, otherwise; loom-client''s migrate() does this at every boot). Returns what happened to each column.';

-- Snapshots (ADR 0141 D2, D5, D6): a row holds JSONB in state, or a frame
-- in state_z and the sentinel in state. Every reader decodes.

CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_row_state(state jsonb, state_z bytea)
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

CREATE OR REPLACE FUNCTION @extschema@.loom_save_snapshot(execution_id text, workflow_id text, sequence bigint, state text, codec text DEFAULT 'none')
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
                state_z = excluded.state_z, created_at = excluded.created_at
        RETURNING s.id INTO saved;
    ELSIF codec = 'none' THEN
        IF has_frame_column THEN
            -- A re-save over a frame row clears the frame: no stale frame.
            INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
            VALUES ($1, $2, $3, $4::jsonb, NULL)
            ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
                SET workflow_id = excluded.workflow_id, state = excluded.state,
                    state_z = NULL, created_at = excluded.created_at
            RETURNING s.id INTO saved;
        ELSE
            INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state)
            VALUES ($1, $2, $3, $4::jsonb)
            ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
                SET workflow_id = excluded.workflow_id, state = excluded.state, created_at = excluded.created_at
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

-- The rows of loom_load_snapshot, in PL/pgSQL (Citus plans its statements;
-- it cannot plan a SQL function's parameters). loom_load_snapshot stays a
-- SQL function over it: its parameter execution_id is also a column it
-- returns, which PL/pgSQL does not allow.
CREATE OR REPLACE FUNCTION @extschema@.loom_load_snapshot_rows(of_execution text, at_sequence bigint)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The latest by an index scan backward, or exactly at_sequence.
    IF at_sequence IS NULL THEN
        RETURN QUERY
            SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
            FROM loom.snapshots_decoded d WHERE d.execution_id = of_execution
            ORDER BY d.sequence DESC LIMIT 1;
    ELSE
        RETURN QUERY
            SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
            FROM loom.snapshots_decoded d WHERE d.execution_id = of_execution AND d.sequence = at_sequence;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot_rows(text, bigint) IS
'What loom_load_snapshot returns (call that one).';

CREATE OR REPLACE FUNCTION @extschema@.loom_load_snapshot(execution_id text, at_sequence bigint DEFAULT NULL)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM @extschema@.loom_load_snapshot_rows($1, $2)
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot(text, bigint) IS
'The latest snapshot of an execution, or the one at exactly at_sequence (never a neighbour), decoded whatever its row format. No row when there is none.';

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
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- One statement, so one MVCC snapshot: the tail starts exactly after
    -- the snapshot's sequence, none missing or repeated, whatever appends
    -- commit meanwhile. The frame ships as stored (the client decodes it).
    -- On Citus the snapshot and the log are co-located, so this is one
    -- statement on one worker, still one snapshot.
    RETURN QUERY
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
    ORDER BY r.part, r.sequence;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_resume(text) IS
'What a workflow resumes from, in one statement (one MVCC snapshot): first the latest snapshot as stored (snapshot_id set; state, or the sentinel and the frame in state_z), then the events after its sequence in order (kind set); all the events when there is no snapshot.';

-- Scale-out on Citus: one logical database over several machines. loom's
-- tables are distributed by execution_id, so everything about one
-- execution (its events, its row in loom.executions, its snapshots, its
-- fork record) lives in one shard group on one worker: an append, a
-- resume, a retention batch is a single-shard statement there, and a page
-- of ids is a LIMIT pushed to every shard and merged on the coordinator.
-- Refs are keyed by name, not by execution: a reference table, on every
-- node. (Client-side sharding, ShardedEventStore, is the other way to
-- grow: independent databases, not one.)

-- What loom's tables are in this database: 'local' (no Citus, or not yet
-- distributed), 'distributed' or 'reference', read from Citus' catalog.
CREATE FUNCTION @extschema@.loom_distribution()
RETURNS TABLE(table_name text, distribution text, distribution_column text, shard_count integer, colocated_with_events boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    loom_table text;
BEGIN
    FOREACH loom_table IN ARRAY ARRAY['events', 'executions', 'snapshots', 'lineage', 'refs'] LOOP
        table_name := 'loom.' || loom_table;
        distribution := 'local';
        distribution_column := NULL;
        shard_count := NULL;
        colocated_with_events := NULL;
        -- Citus' catalog (pg_dist_*) is read only where citus exists: a
        -- PL/pgSQL statement is planned when it first runs.
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
            SELECT CASE WHEN p.partmethod = 'h' THEN 'distributed'
                        WHEN p.repmodel = 't' THEN 'reference'
                        ELSE 'citus local' END,
                   column_to_column_name(p.logicalrelid, p.partkey),
                   (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                   p.colocationid = (SELECT e.colocationid FROM pg_dist_partition e
                                     WHERE e.logicalrelid = 'loom.events'::regclass)
            INTO distribution, distribution_column, shard_count, colocated_with_events
            FROM pg_dist_partition p WHERE p.logicalrelid = table_name::regclass;
            distribution := coalesce(distribution, 'local');
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_distribution() IS
'How each of loom''s tables is stored here: local (one node, or Citus before loom_distribute), distributed (by execution_id, co-located with loom.events) or reference (on every node), with its shard count.';

-- The layout loom_distribute makes, checked as a whole.
CREATE FUNCTION @extschema@.loom_is_distributed()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT count(*) = 5 FROM @extschema@.loom_distribution() d
            WHERE (d.table_name = 'loom.refs' AND d.distribution = 'reference')
               OR (d.table_name <> 'loom.refs' AND d.distribution = 'distributed'
                   AND d.distribution_column = 'execution_id' AND d.colocated_with_events));
END
$$;
COMMENT ON FUNCTION @extschema@.loom_is_distributed() IS
'True when loom''s tables are laid out as loom_distribute makes them: events, executions, snapshots and lineage distributed by execution_id and co-located, refs a reference table.';

-- What every node (coordinator and workers) runs before the tables are
-- distributed: its own copy of loom's tables is what Citus reads there
-- (it creates no shell table of an extension's table), so each must have
-- COLLATE "C" ids and no triggers. Without the triggers, loom's functions
-- keep loom.executions themselves (loom_executions_tracked_by_trigger).
CREATE FUNCTION @extschema@.loom_prepare_node_for_citus(lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    skipped text;
    outcome text := 'ready';
    caller_propagation text := current_setting('citus.enable_ddl_propagation', true);
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    -- This node's own copy, changed here alone: Citus would otherwise
    -- refuse DDL on a worker ("not allowed on this node") or send it on.
    PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
    SELECT string_agg(m.column_name || ' ' || m.outcome, '; ') INTO skipped
    FROM @extschema@.loom_migrate_collations(lock_timeout_ms) m
    WHERE m.outcome NOT IN ('converted', 'already COLLATE "C"');
    IF skipped IS NOT NULL THEN
        outcome := 'not COLLATE "C": ' || skipped;
    -- The frame column too (ADR 0141 D5's opt-in, taken here): Citus
    -- cannot set a distributed column's storage, so it is added while the
    -- table is local, and its shards inherit STORAGE EXTERNAL.
    ELSIF NOT @extschema@.loom_ensure_snapshot_zstd(least(lock_timeout_ms, 200)) THEN
        outcome := 'the snapshot frame column could not be added';
    ELSE
        -- DROP TRIGGER queues behind open writes to loom.events: a bounded
        -- wait, whose timeout (55P03) the caller reports.
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        DROP TRIGGER IF EXISTS events_track_inserted_executions ON loom.events;
        DROP TRIGGER IF EXISTS events_track_deleted_executions ON loom.events;
        DROP TRIGGER IF EXISTS events_track_truncated_executions ON loom.events;
        -- Citus itself refuses to change a distribution column.
        DROP TRIGGER IF EXISTS events_refuse_id_update ON loom.events;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
    END IF;
    PERFORM set_config('citus.enable_ddl_propagation', coalesce(caller_propagation, 'on'), true);
    RETURN outcome;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_prepare_node_for_citus(integer) IS
'Readies this node''s loom tables for Citus (called by loom_distribute on every node): converts the id columns to COLLATE "C" (loom_migrate_collations), provisions the snapshot frame column (loom_ensure_snapshot_zstd: Citus cannot set its storage later), and drops loom.events'' triggers, whose work loom''s functions then do. Returns ready, or what is not.';

CREATE FUNCTION @extschema@.loom_distribute(shard_count integer DEFAULT NULL, lock_timeout_ms integer DEFAULT NULL)
RETURNS TABLE(table_name text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    wait integer := @extschema@.loom_check_lock_timeout(
        coalesce(lock_timeout_ms, @extschema@.loom_migration_lock_timeout()));
    caller_lock_timeout text := current_setting('lock_timeout');
    caller_min_messages text := current_setting('client_min_messages');
    not_ready text;
    loom_table text;
BEGIN
    IF shard_count IS NOT NULL AND (shard_count < 1 OR shard_count > 64000) THEN
        RAISE EXCEPTION 'shard_count must be between 1 and 64000, got %', shard_count
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'loom_distribute needs Citus, and the citus extension is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'On a Citus cluster: CREATE EXTENSION citus; and citus_add_node() each worker, in this database, first. On one server loom needs no distribution.';
    END IF;
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION 'loom_distribute runs on the Citus coordinator, and this node is not it'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Done already: no lock at all, like every other loom migration.
    IF @extschema@.loom_is_distributed() THEN
        RETURN QUERY SELECT d.table_name, 'already ' || d.distribution FROM @extschema@.loom_distribution() d;
        RETURN;
    END IF;
    -- Copying the rows into shards cannot be cut short by a timer without
    -- rolling it all back: like the conversions, it starts only without one.
    IF current_setting('statement_timeout') <> '0' THEN
        RAISE WARNING 'loom: not distributing: statement_timeout is %, and a copy it cancels would hold its locks for nothing',
                current_setting('statement_timeout')
            USING HINT = 'SET statement_timeout = 0; SELECT * FROM loom_distribute();';
        RETURN QUERY SELECT d.table_name, 'skipped: statement_timeout' FROM @extschema@.loom_distribution() d;
        RETURN;
    END IF;
    PERFORM @extschema@.loom_take_migration_lock();
    IF @extschema@.loom_is_distributed() THEN
        RETURN QUERY SELECT d.table_name, 'already ' || d.distribution FROM @extschema@.loom_distribution() d;
        RETURN;
    END IF;
    -- Every worker first (each in its own transaction: a conversion there
    -- is on empty tables, and stays done whatever happens here), then this
    -- node, in this transaction, inside the block that fails soft.
    SELECT string_agg(r.nodename || ':' || r.nodeport || ' ' || r.result, '; ') INTO not_ready
    FROM run_command_on_workers(
        format('SELECT %s.loom_prepare_node_for_citus(%s)', '@extschema@', wait)) r
    WHERE NOT r.success OR r.result <> 'ready';
    BEGIN
        IF not_ready IS NULL THEN
            not_ready := nullif(@extschema@.loom_prepare_node_for_citus(wait), 'ready');
        END IF;
        IF not_ready IS NOT NULL THEN
            RAISE WARNING 'loom: not distributing: a node is not ready: %', not_ready
                USING DETAIL = 'Nothing was distributed; loom keeps working on the coordinator alone.',
                      HINT = 'Retry SELECT * FROM loom_distribute(); in a quieter moment, with statement_timeout 0.';
            RETURN QUERY SELECT d.table_name, 'skipped: ' || not_ready FROM @extschema@.loom_distribution() d;
            RETURN;
        END IF;
        PERFORM set_config('lock_timeout', wait || 'ms', true);
        -- Citus says, per table, that it copied the rows and how to drop
        -- the local copy: this function does that, so the NOTICEs go.
        PERFORM set_config('client_min_messages',
            CASE WHEN current_setting('client_min_messages') IN ('debug5', 'debug4', 'debug3', 'debug2', 'debug1', 'log', 'notice')
                 THEN 'warning' ELSE current_setting('client_min_messages') END, true);
        -- Citus asks every unique key to hold the distribution column: the
        -- identity id stays unique per execution.
        IF NOT EXISTS (SELECT 1 FROM pg_constraint c
                       WHERE c.conrelid = 'loom.snapshots'::regclass AND c.conname = 'snapshots_pkey'
                         AND c.conkey = ARRAY[(SELECT a.attnum FROM pg_attribute a
                                               WHERE a.attrelid = 'loom.snapshots'::regclass AND a.attname = 'execution_id'),
                                              (SELECT a.attnum FROM pg_attribute a
                                               WHERE a.attrelid = 'loom.snapshots'::regclass AND a.attname = 'id')]::int2[]) THEN
            ALTER TABLE loom.snapshots DROP CONSTRAINT snapshots_pkey,
                ADD CONSTRAINT snapshots_pkey PRIMARY KEY (execution_id, id);
        END IF;
        FOREACH loom_table IN ARRAY ARRAY['events', 'executions', 'snapshots', 'lineage', 'refs'] LOOP
            CONTINUE WHEN EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = ('loom.' || loom_table)::regclass);
            IF loom_table = 'refs' THEN
                PERFORM create_reference_table('loom.refs');
            ELSIF loom_table = 'events' THEN
                PERFORM create_distributed_table('loom.events', 'execution_id', shard_count => shard_count);
            ELSE
                PERFORM create_distributed_table('loom.' || loom_table, 'execution_id', colocate_with => 'loom.events');
            END IF;
            -- The rows were copied into the shards; the local copy goes.
            PERFORM truncate_local_data_after_distributing_table(('loom.' || loom_table)::regclass);
        END LOOP;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        PERFORM set_config('client_min_messages', caller_min_messages, true);
    EXCEPTION
        WHEN lock_not_available OR query_canceled OR deadlock_detected THEN
            RAISE WARNING 'loom: could not distribute loom''s tables: % (SQLSTATE %)', SQLERRM, SQLSTATE
                USING DETAIL = 'Nothing was distributed; loom keeps working on the coordinator alone.',
                      HINT = 'Retry SELECT * FROM loom_distribute(); in a quieter moment, with statement_timeout 0.';
            RETURN QUERY SELECT d.table_name, 'skipped: ' || SQLSTATE FROM @extschema@.loom_distribution() d;
            RETURN;
    END;
    RETURN QUERY SELECT d.table_name, d.distribution FROM @extschema@.loom_distribution() d;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_distribute(integer, integer) IS
'On a Citus coordinator: distributes loom.events by execution_id into shard_count shards (NULL: citus.shard_count), co-locates loom.executions, loom.snapshots and loom.lineage with it, and makes loom.refs a reference table, moving the rows there already. Every execution id column is made COLLATE "C" on every node first, the snapshot frame column is provisioned (Citus could not set its storage later), and loom.events'' triggers are dropped (loom''s functions keep loom.executions on Citus). Idempotent (no lock once done); waits at most lock_timeout_ms (default loom.migration_lock_timeout) for each lock, and on a lock timeout, cancel or deadlock rolls back whole with a WARNING. Needs statement_timeout 0 (skips with a WARNING otherwise). Returns each table''s outcome.';

-- loom_snapshot_state builds jsonb from loom's own parse of the validated
-- text (issue 11): the same bytes text::jsonb makes, without jsonb_in.
CREATE OR REPLACE FUNCTION @extschema@."loom_snapshot_state"(
	"frame" bytea
) RETURNS jsonb
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'loom_snapshot_state_wrapper';

-- Reading one value out of a frame's state by path (issue 11), without
-- making the whole state jsonb.
CREATE FUNCTION @extschema@."loom_snapshot_get_text"(
	"frame" bytea,
	"path" VARIADIC TEXT[]
) RETURNS TEXT
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'loom_snapshot_get_text_wrapper';

CREATE FUNCTION @extschema@.loom_snapshot_get(frame bytea, VARIADIC path text[]) RETURNS jsonb
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_get_text(frame, VARIADIC path)::pg_catalog.jsonb;

COMMENT ON FUNCTION @extschema@.loom_snapshot_get(bytea, text[]) IS
'The value at path in a loom snapshot frame''s state, as jsonb: loom_snapshot_get(frame, ''turns'', ''0'') is loom_snapshot_state(frame) #> ''{turns,0}'' (keys, array indexes, negative from the end; of duplicate keys the last), without making the whole state jsonb. NULL where there is none.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_get_text(bytea, text[]) IS
'The exact JSON text of the value at path in a loom snapshot frame''s state (see loom_snapshot_get); NULL where there is none.';

-- loom.snapshots.execution_id and loom.lineage.execution_id to COLLATE
-- "C", failing soft like every conversion (bounded lock wait, skipped
-- under a statement_timeout, a WARNING naming what to run later:
-- loom_migrate_collations() converts what is left). On a Citus cluster
-- Citus runs this update on every node.
SELECT @extschema@.loom_take_migration_lock();
SELECT @extschema@.loom_convert_column_to_c('snapshots', 'execution_id', @extschema@.loom_migration_lock_timeout());
SELECT @extschema@.loom_convert_column_to_c('lineage', 'execution_id', @extschema@.loom_migration_lock_timeout());
