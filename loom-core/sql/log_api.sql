-- The event log and ref API. Every function states COLLATE "C" itself, so
-- it pages right even on a column an upgrade could not convert (ADR 0108
-- D2), and pins search_path, so that no object a caller can create (a
-- table, an operator) is ever picked up in place of loom's or pg_catalog's.

-- Every function that touches loom's tables is PL/pgSQL or C over SPI,
-- none LANGUAGE sql: Citus cannot plan a SQL function's parameters (it
-- refuses them, and crashed the backend on one), and the same functions
-- run on one node and on a Citus coordinator.
--
-- The write path (the two append functions, the trigger keeping
-- loom.executions, the probe for it and the stripe locks) and the read of
-- a log's tail are PL/pgSQL here, the contract every flavour of loom
-- installs: the SQL-only one (managed PostgreSQL, no loom.so) keeps them.
-- The native extension replaces each with C of the same signature,
-- attributes, errors and guarantees (native/write_path.sql, CREATE OR
-- REPLACE, loom_pg/src/append.rs and its neighbours): the write path is
-- loom's measured bottleneck (ADR 0108 D2, issue 18), and a PL/pgSQL
-- frame with a pinned search_path cost a fifth of a one-event append. The
-- C pins no search_path because it resolves nothing through it: its
-- statements are prepared once, schema-qualified, typed by OID.
--
-- metadata came in 0.11.0, as a last parameter with a default: a call
-- without it is the call it always was. The native library serves both
-- declarations (one installed before ALTER EXTENSION UPDATE has four), the
-- new one under a symbol of its own, so that a backend still holding an
-- older library fails to find it rather than drop the metadata. Metadata
-- loom.events has no jsonb column for yet (an update that could not lock
-- it in time leaves that to loom_ensure_event_metadata) is refused, 55000,
-- never written without it; a batch's array of NULLs alone carries none,
-- and is taken as none.
--
-- An append holds its executions' stripes (see loom.executions below),
-- shared, from before its INSERT to the end of its transaction, then
-- inserts; loom.events' trigger keeps loom.executions. Where no trigger
-- fired for the INSERT (Citus, a disabled trigger, one dropped while the
-- INSERT waited for its lock), the append calls loom_track_appended
-- itself: the trigger bumps the setting loom.inserts_tracked each time it
-- tracks an INSERT, so an append that finds it unchanged across its own
-- INSERT knows, with no catalog probe. Nothing but that trigger runs
-- within the INSERT to change it (a caller may set it beforehand: the
-- trigger always moves it to another value).
CREATE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tracked text := current_setting('loom.inserts_tracked', true);
BEGIN
    IF metadata IS NOT NULL THEN
        IF NOT EXISTS (SELECT FROM pg_attribute a
                       WHERE a.attrelid = to_regclass('loom.events') AND a.attname = 'metadata'
                         AND NOT a.attisdropped AND a.atttypid = 'jsonb'::regtype) THEN
            RAISE EXCEPTION 'loom.events has no metadata column yet: the update to loom 0.11.0 could not lock loom.events in time to add it; nothing was written'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(2000); as the extension''s owner (pgloom''s migrate() does at every boot).';
        END IF;
    END IF;
    -- The stripe, shared, before the INSERT (a NULL id is left to the
    -- INSERT's NOT NULL): see loom.executions below.
    IF execution_id IS NOT NULL THEN
        PERFORM 1 FROM loom.stripes s WHERE s.stripe = hashtext(execution_id COLLATE "C") & 63 FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
        END IF;
    END IF;
    -- Without metadata, the column goes unnamed: an update may not have
    -- added it yet (loom_ensure_event_metadata).
    IF metadata IS NULL THEN
        INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4);
    ELSE
        INSERT INTO loom.events (execution_id, sequence, kind, payload, metadata) VALUES ($1, $2, $3, $4, $5);
    END IF;
    IF current_setting('loom.inserts_tracked', true) IS NOT DISTINCT FROM tracked THEN
        PERFORM @extschema@.loom_track_appended(ARRAY[execution_id]);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb, jsonb) IS
'Appends one event to an execution''s log, with its metadata (any JSON; NULL, the default, for none). A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only. Only in READ COMMITTED transactions (0A000 otherwise).';

CREATE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tracked text;
    appended bigint;
    stripes integer[];
    locked bigint;
BEGIN
    IF metadata IS NOT NULL THEN
        IF NOT EXISTS (SELECT FROM pg_attribute a
                       WHERE a.attrelid = to_regclass('loom.events') AND a.attname = 'metadata'
                         AND NOT a.attisdropped AND a.atttypid = 'jsonb'::regtype) THEN
            IF EXISTS (SELECT FROM unnest(metadata) AS m WHERE m IS NOT NULL) THEN
                RAISE EXCEPTION 'loom.events has no metadata column yet: the update to loom 0.11.0 could not lock loom.events in time to add it; nothing was written'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(2000); as the extension''s owner (pgloom''s migrate() does at every boot).';
            END IF;
            metadata := NULL;
        END IF;
    END IF;
    -- A NULL array of the first four is left to the INSERT (unnest pads
    -- it with NULLs, which NOT NULL refuses); a NULL metadata array means
    -- none for every event.
    IF execution_ids IS NOT NULL AND sequences IS NOT NULL AND kinds IS NOT NULL AND payloads IS NOT NULL
       AND (cardinality(sequences) <> cardinality(execution_ids) OR cardinality(kinds) <> cardinality(execution_ids)
            OR cardinality(payloads) <> cardinality(execution_ids) OR cardinality(metadata) <> cardinality(execution_ids)) THEN
        RAISE EXCEPTION 'loom_append_events needs arrays of one length, got % ids, % sequences, % kinds, % payloads%',
                cardinality(execution_ids), cardinality(sequences), cardinality(kinds), cardinality(payloads),
                CASE WHEN metadata IS NULL THEN '' ELSE format(', %s metadata', cardinality(metadata)) END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The ids' stripes, shared, in ascending order (unnest keeps the
    -- sorted array's), before the INSERT.
    IF execution_ids IS NOT NULL THEN
        stripes := ARRAY(SELECT DISTINCT hashtext(i.id COLLATE "C") & 63 FROM unnest(execution_ids) AS i(id)
                         WHERE i.id IS NOT NULL);
        PERFORM 1 FROM loom.stripes s WHERE s.stripe = ANY (stripes) ORDER BY s.stripe FOR KEY SHARE;
        GET DIAGNOSTICS locked = ROW_COUNT;
        IF locked <> cardinality(stripes) THEN
            RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
        END IF;
    END IF;
    IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        -- All five arguments, whatever the metadata: a call with four
        -- would also match a four-parameter function someone created
        -- beside loom's in its schema, and be ambiguous.
        RETURN @extschema@.loom_append_events_without_trigger(execution_ids, sequences, kinds, payloads, metadata);
    END IF;
    -- One node: one INSERT, no subtransaction on the hot path.
    tracked := current_setting('loom.inserts_tracked', true);
    IF metadata IS NULL THEN
        INSERT INTO loom.events (execution_id, sequence, kind, payload)
        SELECT * FROM ROWS FROM (unnest(execution_ids), unnest(sequences), unnest(kinds), unnest(payloads));
    ELSE
        INSERT INTO loom.events (execution_id, sequence, kind, payload, metadata)
        SELECT * FROM ROWS FROM (unnest(execution_ids), unnest(sequences), unnest(kinds), unnest(payloads), unnest(metadata));
    END IF;
    GET DIAGNOSTICS appended = ROW_COUNT;
    IF current_setting('loom.inserts_tracked', true) IS NOT DISTINCT FROM tracked THEN
        -- Dropped (loom_distribute) or disabled while the INSERT waited
        -- for its lock: its rows are tracked all the same.
        PERFORM @extschema@.loom_track_appended(execution_ids);
    END IF;
    RETURN appended;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. metadata is NULL (the default: none for every event) or one element per event. Arrays of different lengths are invalid_parameter_value (22023); only in READ COMMITTED transactions (0A000 otherwise).';

-- loom_append_events where no trigger keeps loom.executions: Citus (after
-- loom_distribute), or a disabled trigger. The caller checked the arrays'
-- lengths.
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

-- After a failed append: a unique_violation (23505) naming the first event
-- of the batch already in the log, or repeated within the batch; nothing
-- when there is none.
CREATE FUNCTION @extschema@.loom_refuse_appended_twice(execution_ids text[], sequences bigint[])
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

-- Whether loom.<table>.<column> is COLLATE "C" (ADR 0108 D2), from the
-- catalog; the collation is looked up by name (no ::regcollation).
CREATE FUNCTION @extschema@.loom_column_is_c(table_name text, column_name text)
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
-- are closed with locks: an append either holds its execution's stripe
-- (the trigger on one node, for statements over few stripes) or locks its
-- execution's row (an upsert whose update never applies still locks:
-- Citus, a disabled trigger, statements over many stripes or rows), and a
-- delete takes both before it looks, with a fresh snapshot, for events
-- left. So a delete that removes an execution's last events and an append
-- to it never leave events without their row. "A fresh snapshot"
-- holds only in READ COMMITTED: a delete in a transaction with one
-- snapshot (REPEATABLE READ, SERIALIZABLE) could not see a concurrent
-- append, so it is refused. Stripes are taken in ascending order and rows
-- in id order, so two statements sharing executions cannot deadlock on
-- them (on Citus, within a shard;
-- across shards its deadlock detector cancels one of two such batches).
--
-- The stripes: an id's stripe is one of 64, hashtext of its bytes (COLLATE
-- "C") mod 64, and its lock the row of loom.stripes with that number,
-- locked FOR KEY SHARE by appends, snapshot saves and ref puts and FOR
-- UPDATE by deletes, to the end of the transaction. Striped, not one lock
-- per id, so that a transaction holds at most 64 whatever it writes; the
-- price is that a delete emptying an execution holds back, until it
-- commits, appends to the executions sharing its stripe.
--
-- Until 0.14.0 the stripes were advisory locks (pg_advisory_xact_lock(
-- 1819242349, stripe)), which any role that can connect can take: holding
-- one, a role granted nothing held back every append to its executions
-- until its session ended (issue 34). A row lock takes UPDATE on a column
-- of its table, which only loom's owner and the writers loom_grant_access
-- makes have here (on loom.stripes.lockable alone, which nothing reads,
-- so a writer can change no stripe's number): a role loom never granted
-- cannot lock a stripe, so cannot stall one. A role granted INSERT on
-- loom.events by hand, not by loom_grant_access, cannot append through
-- these functions any more (42501 on loom.stripes): grant it writer. The
-- lock costs what a row lock costs: each append writes its stripe row's
-- lock (a dirtied page of a 64-row table and its WAL record, a multixact
-- when appends share the stripe); docs/benchmarks.md ("The two flavours")
-- measures it.
--
-- The native extension takes the same stripes (FNV-1a of the id, so other
-- numbers) on a lock tag no SQL function reaches (objsubid 3,
-- loom_pg/src/execution_stripes.rs), which costs no write, and leaves
-- loom.stripes alone.
--
-- On one node, triggers on loom.events call the two functions below for
-- whoever writes it (the API, COPY, a restore). Citus distributes no table
-- with triggers, so loom_distribute drops them, and loom's own functions
-- call these after each write instead.
-- A trigger that is there but does not fire in this session (ALTER TABLE
-- ... DISABLE TRIGGER, or an origin trigger under session_replication_role
-- replica) keeps nothing: loom's functions must. The native extension
-- replaces this probe of pg_trigger with C that reads loom.events' cached
-- trigger descriptor (loom_pg/src/executions_index.rs): no catalog query.
CREATE FUNCTION @extschema@.loom_executions_tracked_by_trigger()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    loom_schema oid;
    events oid;
    fires boolean;
BEGIN
    -- By name in the catalog, not 'loom.events'::regclass, which a role
    -- without USAGE on schema loom may not look up.
    SELECT n.oid, c.oid,
           EXISTS (SELECT FROM pg_trigger t
                   WHERE t.tgrelid = c.oid AND t.tgname = 'events_track_inserted_executions'
                     -- PostgreSQL's own rule for whether a trigger fires.
                     AND CASE t.tgenabled
                             WHEN 'A' THEN true
                             WHEN 'O' THEN current_setting('session_replication_role') <> 'replica'
                             WHEN 'R' THEN current_setting('session_replication_role') = 'replica'
                             ELSE false
                         END)
      INTO loom_schema, events, fires
    FROM pg_namespace n
    LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'events'
    WHERE n.nspname = 'loom';
    IF loom_schema IS NULL THEN
        RAISE EXCEPTION 'schema "loom" does not exist' USING ERRCODE = 'invalid_schema_name';
    ELSIF events IS NULL THEN
        RAISE EXCEPTION 'relation "loom.events" does not exist' USING ERRCODE = 'undefined_table';
    END IF;
    RETURN fires;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_executions_tracked_by_trigger() IS
'True while loom.events has the trigger that keeps loom.executions and it fires in this session (one node); false once loom_distribute dropped it for Citus, or while it is disabled, where loom''s functions keep loom.executions.';

-- loom.executions follows a write to loom.events with a fresh snapshot
-- (see above): one snapshot for the whole transaction (REPEATABLE READ,
-- SERIALIZABLE) cannot see an append or delete of the same execution that
-- commits meanwhile. A delete would then leave the index wrong, and an
-- append would fail late with a serialization failure (40001) whenever
-- another session created the execution's row after the snapshot. Both
-- are refused up front, with one clear error.
CREATE FUNCTION @extschema@.loom_require_read_committed(operation text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'loom.events can only be % in READ COMMITTED transactions, not %',
                operation, current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'loom.executions must see a write to the same execution that commits meanwhile, which one snapshot for the whole transaction cannot: run loom''s writes in READ COMMITTED (the default).';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_require_read_committed(text) IS
'Refuses (feature_not_supported, 0A000) a write to loom.events outside READ COMMITTED: loom.executions is kept with a fresh snapshot per statement.';

CREATE FUNCTION @extschema@.loom_track_appended(execution_ids text[])
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
    PERFORM @extschema@.loom_require_read_committed('appended to');
    FOR id IN SELECT DISTINCT i.id FROM unnest(execution_ids) AS i(id) WHERE i.id IS NOT NULL ORDER BY 1 LOOP
        -- The stripe an append holds, taken first: a delete of the id's
        -- events holds it exclusively until it commits, so the statement
        -- below starts after, with a snapshot that sees the delete. Without
        -- it a writer calling this directly during a delete read the events
        -- the delete was removing and added an id left with none (0.12.0;
        -- an append calling it holds the stripe already).
        PERFORM @extschema@.loom_lock_execution_for_write(id);
        -- One statement on one shard group (the row comes from the log).
        INSERT INTO loom.executions AS x (execution_id)
        SELECT e.execution_id FROM loom.events e WHERE e.execution_id = id LIMIT 1
        ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_track_appended(text[]) IS
'Adds each given execution id that has events to loom.executions, locking its row, in id order: what loom''s append functions call where no trigger keeps loom.executions (Citus). SECURITY DEFINER, so writers of loom.events need no grant on loom.executions; executable only by loom_writer and the roles an upgrade found writing loom.events (a caller could hold the rows'' locks); an id without events is never added.';

-- The stripe lock an append holds while it finds an execution's row (see
-- above), taken exclusively. EXECUTE goes to writers alone (a caller could
-- hold back appends), as UPDATE on loom.stripes.lockable does.
CREATE FUNCTION @extschema@.loom_lock_execution_for_delete(execution_id text)
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM loom.stripes s WHERE s.stripe = hashtext(execution_id COLLATE "C") & 63 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) IS
'Takes, to the end of the transaction, the exclusive lock on the stripe of an execution id that appends hold shared: what loom_delete_events and loom_delete_execution take before they delete, and loom_track_emptied before it looks for events left. In the SQL-only flavour, the row of loom.stripes numbered hashtext(execution_id COLLATE "C") & 63, locked FOR UPDATE; in the extension, a lock tag no SQL function reaches. Executable by writers.';

CREATE FUNCTION @extschema@.loom_lock_executions_for_delete(execution_ids text[])
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    stripes integer[] := ARRAY(SELECT DISTINCT hashtext(i.id COLLATE "C") & 63 FROM unnest(execution_ids) AS i(id)
                               WHERE i.id IS NOT NULL);
    locked bigint;
BEGIN
    -- Each stripe once, in ascending order (the rows are locked as the
    -- sort returns them); a NULL element is passed over.
    PERFORM 1 FROM loom.stripes s WHERE s.stripe = ANY (stripes) ORDER BY s.stripe FOR UPDATE;
    GET DIAGNOSTICS locked = ROW_COUNT;
    IF locked <> cardinality(stripes) THEN
        RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_lock_executions_for_delete(text[]) IS
'Takes, to the end of the transaction, the exclusive locks on the stripes of many execution ids at once, in ascending stripe order as a delete statement does: what a retention batch and a repair batch take, so they cannot deadlock with appends over several stripes. Executable by the owner alone.';

CREATE FUNCTION @extschema@.loom_lock_execution_for_write(execution_id text)
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM loom.stripes s WHERE s.stripe = hashtext(execution_id COLLATE "C") & 63 FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_write(text) IS
'Takes, to the end of the transaction, the shared lock on the stripe of an execution id that appends hold: what saving a snapshot and putting a ref take, so that a retention sweep deleting the execution waits for them and deletes what they wrote with the rest. Executable only by writers.';

CREATE FUNCTION @extschema@.loom_track_emptied(execution_id text)
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

-- The triggers' function: it runs on every append. It reads only the
-- statement's own transition table, and only after checking that it
-- fired as one of loom's own statement triggers on loom.events (TG_*):
-- SECURITY DEFINER, so it trusts nothing about how it was called (EXECUTE
-- is also revoked from PUBLIC, which CREATE TRIGGER checks), and it reads
-- execution_id only once the catalog says it is text, calling no function
-- of a caller's type. The native extension replaces it with C
-- (loom_pg/src/executions_index.rs), for the append's cost: a PL/pgSQL
-- frame with its pinned search_path and its statements over the
-- transition table cost a quarter of a one-event append (issue 18); the C
-- reads the ids from the transition table directly and probes
-- loom.executions' index itself, resolving nothing through the
-- search_path, which it does not pin.
--
-- After an INSERT: the statement's distinct ids, in "C" order. Over few
-- stripes (at most 8), their stripes are held shared and each id missing
-- from loom.executions is added (ON CONFLICT DO NOTHING writes nothing for
-- a row that is there, and waits for a concurrent append adding it); over
-- more stripes, or more than 10000 ids (a COPY, a restore: handled
-- set-based, sorted in SQL), each row is added or locked by an upsert, as
-- loom_track_appended does, bounding the locks a statement takes. After a
-- DELETE: the ids' stripes exclusively (ascending), then their rows (id
-- order), then, in a fresh statement, the rows of those left without
-- events removed: what loom_track_emptied does for one id, for the whole
-- statement at once. After a TRUNCATE, loom.executions is truncated.
CREATE FUNCTION @extschema@.loom_events_track_executions()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids text[];
    stripes integer[];
    tracked text;
    locked bigint;
BEGIN
    IF NOT (TG_TABLE_SCHEMA = 'loom' AND TG_TABLE_NAME = 'events' AND TG_WHEN = 'AFTER' AND TG_LEVEL = 'STATEMENT'
            AND TG_NAME IN ('events_track_inserted_executions', 'events_track_deleted_executions',
                            'events_track_truncated_executions')) THEN
        RAISE EXCEPTION 'loom_events_track_executions() only keeps loom.executions for loom.events, not for %.% (trigger %)',
                TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE loom.executions;
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @extschema@.loom_require_read_committed(CASE TG_OP WHEN 'INSERT' THEN 'appended to' ELSE 'deleted from' END);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a
                   WHERE a.attrelid = TG_RELID AND a.attname = 'execution_id' AND NOT a.attisdropped
                     AND a.atttypid = 'text'::regtype) THEN
        RAISE EXCEPTION 'loom_events_track_executions() needs loom.events.execution_id of type text'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(d.id ORDER BY d.id), array_agg(DISTINCT hashtext(d.id) & 63 ORDER BY hashtext(d.id) & 63)
          INTO ids, stripes
        FROM (SELECT DISTINCT i.execution_id COLLATE "C" AS id FROM loom_inserted i LIMIT 10001) d;
        IF cardinality(ids) > 10000 THEN
            INSERT INTO loom.executions AS x (execution_id)
            SELECT DISTINCT i.execution_id COLLATE "C" FROM loom_inserted i ORDER BY 1
            ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
        ELSIF cardinality(stripes) > 8 THEN
            -- One statement for all of them, rows in id order.
            INSERT INTO loom.executions AS x (execution_id)
            SELECT u.id FROM unnest(ids) AS u(id)
            ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
        ELSIF ids IS NOT NULL THEN
            PERFORM 1 FROM loom.stripes s WHERE s.stripe = ANY (stripes) ORDER BY s.stripe FOR KEY SHARE;
            GET DIAGNOSTICS locked = ROW_COUNT;
            IF locked <> cardinality(stripes) THEN
                RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                        USING ERRCODE = 'object_not_in_prerequisite_state',
                              HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
            END IF;
            -- A fresh snapshot, taken under the stripes' locks: a delete
            -- that removed a row has committed, and none can remove one now.
            INSERT INTO loom.executions (execution_id)
            SELECT u.id FROM unnest(ids) AS u(id)
            ON CONFLICT (execution_id) DO NOTHING;
        END IF;
        -- Tracked: whatever it held, the setting moves (see
        -- loom_append_event).
        tracked := current_setting('loom.inserts_tracked', true);
        PERFORM set_config('loom.inserts_tracked',
                           CASE WHEN tracked ~ '^[0-9]{1,18}$' THEN (tracked::bigint + 1)::text ELSE '1' END, true);
    ELSIF TG_OP = 'DELETE' THEN
        stripes := ARRAY(SELECT DISTINCT hashtext(o.execution_id COLLATE "C") & 63 FROM loom_deleted o);
        PERFORM 1 FROM loom.stripes s WHERE s.stripe = ANY (stripes) ORDER BY s.stripe FOR UPDATE;
        GET DIAGNOSTICS locked = ROW_COUNT;
        IF locked <> cardinality(stripes) THEN
            RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
        END IF;
        -- loom_deleted's ids are in loom.events' collation, which differs
        -- from loom.executions' until a conversion: named "C" against the
        -- one, compared as they are with the other.
        PERFORM 1 FROM loom.executions x
        JOIN (SELECT DISTINCT o.execution_id AS id FROM loom_deleted o) d ON x.execution_id = d.id COLLATE "C"
        ORDER BY x.execution_id FOR UPDATE OF x;
        DELETE FROM loom.executions x
        USING (SELECT DISTINCT o.execution_id AS id FROM loom_deleted o
               WHERE NOT EXISTS (SELECT FROM loom.events e WHERE e.execution_id = o.execution_id)) d
        WHERE x.execution_id = d.id COLLATE "C";
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_events_track_executions() IS
'Trigger function keeping loom.executions to the ids loom.events holds: after an INSERT (a COPY too) or a DELETE (in READ COMMITTED only: 0A000 otherwise), after a TRUNCATE. SECURITY DEFINER, so writers of loom.events need no grant on loom.executions; it refuses (42501) to run for any relation or trigger but loom.events'' own, and no role may execute it directly.';

CREATE TRIGGER events_track_inserted_executions AFTER INSERT ON loom.events
    REFERENCING NEW TABLE AS loom_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_track_executions();
CREATE TRIGGER events_track_deleted_executions AFTER DELETE ON loom.events
    REFERENCING OLD TABLE AS loom_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_track_executions();
CREATE TRIGGER events_track_truncated_executions AFTER TRUNCATE ON loom.events
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_track_executions();
-- An execution id is never updated (the API has no such call); refuse it
-- rather than let loom.executions drift. The check is in the body, not in
-- the trigger's column list or WHEN: those would make the column's type
-- unalterable, and the collation conversion alters it.
CREATE FUNCTION @extschema@.loom_events_refuse_id_update()
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
CREATE TRIGGER events_refuse_id_update BEFORE UPDATE ON loom.events
    FOR EACH ROW EXECUTE FUNCTION @extschema@.loom_events_refuse_id_update();

CREATE FUNCTION @extschema@.loom_rebuild_executions()
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

CREATE FUNCTION @extschema@.loom_list_executions(after text DEFAULT NULL, page_size integer DEFAULT 1000)
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

-- The tail a resume reads: the read path's hot call. Keyset over the
-- primary key (execution_id, sequence): the tail after a snapshot costs
-- what it returns, not the log's length. Read with the caller's snapshot
-- (STABLE) and privileges. metadata is NULL while loom.events has no
-- jsonb column of that name (loom_ensure_event_metadata adds it). The
-- native extension replaces it with C (loom_pg/src/read_events.rs), one
-- kept plan whose rows go straight into the result set: PL/pgSQL's frame
-- cost it a fifth (issue 18).
CREATE FUNCTION @extschema@.loom_read_events(execution_id text, after_sequence bigint DEFAULT NULL, max_events integer DEFAULT 1000)
RETURNS TABLE(sequence bigint, kind text, payload jsonb, created_at timestamptz, metadata jsonb)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The database's collation, not the caller's (PL/pgSQL gives its
    -- variables its arguments'): compared with loom.events' column, it
    -- yields to the column's, whose index serves it.
    id text COLLATE "default" := execution_id;
BEGIN
    IF max_events IS NULL OR max_events < 1 THEN
        -- loom_check_page_size raises the error (one message for every
        -- pager).
        PERFORM @extschema@.loom_check_page_size(max_events);
    END IF;
    IF EXISTS (SELECT FROM pg_attribute a
               WHERE a.attrelid = to_regclass('loom.events') AND a.attname = 'metadata'
                 AND NOT a.attisdropped AND a.atttypid = 'jsonb'::regtype) THEN
        IF after_sequence IS NULL THEN
            RETURN QUERY
                SELECT e.sequence, e.kind, e.payload, e.created_at, e.metadata FROM loom.events e
                WHERE e.execution_id = id
                ORDER BY e.sequence LIMIT max_events;
        ELSE
            RETURN QUERY
                SELECT e.sequence, e.kind, e.payload, e.created_at, e.metadata FROM loom.events e
                WHERE e.execution_id = id AND e.sequence > after_sequence
                ORDER BY e.sequence LIMIT max_events;
        END IF;
    ELSIF after_sequence IS NULL THEN
        RETURN QUERY
            SELECT e.sequence, e.kind, e.payload, e.created_at, NULL::jsonb FROM loom.events e
            WHERE e.execution_id = id
            ORDER BY e.sequence LIMIT max_events;
    ELSE
        RETURN QUERY
            SELECT e.sequence, e.kind, e.payload, e.created_at, NULL::jsonb FROM loom.events e
            WHERE e.execution_id = id AND e.sequence > after_sequence
            ORDER BY e.sequence LIMIT max_events;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_read_events(text, bigint, integer) IS
'Up to max_events (at least 1) events of an execution with a sequence strictly after after_sequence (NULL: from the first), in sequence order: the tail a resume reads after its snapshot, and a keyset pager over one log (the next cursor is the last sequence returned).';

CREATE FUNCTION @extschema@.loom_delete_events(execution_id text, through_sequence bigint DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    -- The execution's stripe first, exclusively, as a retention batch
    -- takes it: appends take it (shared) before they insert, so an append
    -- of a key this deletes waits here, not on the key with the stripe
    -- held, which deadlocks with this delete's trigger taking the stripe
    -- after its rows. Writers may take it (loom_grant_access); a role
    -- granted DELETE by hand deletes as before 0.10.0, its trigger taking
    -- the stripe after the rows.
    IF has_function_privilege('@extschema@.loom_lock_execution_for_delete(text)', 'EXECUTE') THEN
        PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
    END IF;
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

CREATE FUNCTION @extschema@.loom_prune_events(execution_id text, max_rows integer DEFAULT 10000)
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
    -- The snapshot is locked (KEY SHARE) until this commits: a delete of it
    -- in flight is waited for and then seen (no snapshot, no pruning), and
    -- one that comes later waits for the prune. Reading max() unlocked, a
    -- prune raced a snapshot delete and took the events it relied on.
    SELECT s.sequence INTO latest FROM loom.snapshots s
    WHERE s.execution_id = loom_prune_events.execution_id
    ORDER BY s.sequence DESC LIMIT 1 FOR KEY SHARE;
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

CREATE FUNCTION @extschema@.loom_delete_execution(execution_id text, max_rows integer DEFAULT 10000)
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
    -- The execution's stripe first, exclusively, before any of its rows:
    -- snapshot saves and appends take it before theirs (see
    -- loom_delete_events, and its exception).
    IF has_function_privilege('@extschema@.loom_lock_execution_for_delete(text)', 'EXECUTE') THEN
        PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
    END IF;
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
        -- NULL typed: an untyped NULL could resolve to an overload the
        -- schema's owner adds with text in its place.
        events_deleted := @extschema@.loom_delete_events(execution_id, NULL::bigint, (max_rows - snapshots_deleted)::integer);
    END IF;
    RETURN refs_deleted + lineage_deleted + snapshots_deleted + events_deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_execution(text, integer) IS
'Deletes one batch of an execution: the refs pointing at it and its lineage row, then at most max_rows of its snapshots and events (snapshots first, oldest first), and returns how many rows went; call it until it returns 0. Paging over the other executions is unaffected; this one leaves the pager with its last event.';

CREATE FUNCTION @extschema@.loom_put_ref(name text, execution_id text, sequence bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- As an append does: a sweep deleting the execution waits for this
    -- ref, and deletes it with the rest, rather than miss it.
    PERFORM @extschema@.loom_lock_execution_for_write(execution_id);
    -- excluded.updated_at is now(), evaluated once: Citus takes no
    -- non-IMMUTABLE function in an upsert's SET.
    INSERT INTO loom.refs AS r (name, execution_id, sequence) VALUES ($1, $2, $3)
    ON CONFLICT ON CONSTRAINT refs_pkey DO UPDATE
        SET execution_id = excluded.execution_id, sequence = excluded.sequence, updated_at = excluded.updated_at;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_put_ref(text, text, bigint) IS
'Creates or moves the branch ref "name" to (execution_id, sequence).';

CREATE FUNCTION @extschema@.loom_delete_ref(name text)
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
