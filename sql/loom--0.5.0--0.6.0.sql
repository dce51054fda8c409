-- loom 0.5.0 -> 0.6.0 (issue 16): no role gains anything through loom.
-- The SECURITY DEFINER functions that keep loom.executions are no longer
-- executable by PUBLIC (the trigger function refuses any relation but
-- loom.events, too), migrations and distribution are the owner's,
-- loom_grant_access/loom_revoke_access give readers and writers what they
-- need, appends decide who keeps loom.executions after they insert, writes
-- outside READ COMMITTED are refused up front, a wait for the migration
-- lock names its holders, and a user's view on a snapshot view makes a
-- conversion fail soft instead of failing the update.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.6.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- Every function below replaces its 0.5.0 body (same signature) or is new;
-- each is as loom_pg/src/sql/ defines it for a fresh install.

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
    -- One probe of pg_trigger's (tgrelid, tgname) index. A trigger that is
    -- there but does not fire in this session (ALTER TABLE ... DISABLE
    -- TRIGGER, or an origin trigger under session_replication_role
    -- replica) keeps nothing: loom's functions must do it.
    RETURN EXISTS (SELECT 1 FROM pg_trigger t
                   WHERE t.tgrelid = 'loom.events'::regclass
                     AND t.tgname = 'events_track_inserted_executions'
                     AND CASE t.tgenabled
                             WHEN 'A' THEN true
                             WHEN 'O' THEN current_setting('session_replication_role') <> 'replica'
                             WHEN 'R' THEN current_setting('session_replication_role') = 'replica'
                             ELSE false
                         END);
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
    PERFORM @extschema@.loom_require_read_committed('appended to');
    INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4);
    -- Decided after the INSERT, which waited for any loom_distribute that
    -- drops the triggers: whoever keeps loom.executions for this row is
    -- known by now, and cannot change before this transaction ends.
    IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        PERFORM @extschema@.loom_track_appended(ARRAY[$1]);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb) IS
'Appends one event to an execution''s log. A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only. Only in READ COMMITTED transactions (0A000 otherwise).';

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
    PERFORM @extschema@.loom_require_read_committed('appended to');
    IF cardinality(execution_ids) = 1 THEN
        -- One event (an agent loop's usual append): on Citus a single-shard
        -- INSERT, one round trip, its errors with their own SQLSTATE.
        INSERT INTO loom.events (execution_id, sequence, kind, payload)
        VALUES (execution_ids[1], sequences[1], kinds[1], payloads[1]);
        appended := 1;
    ELSIF @extschema@.loom_executions_tracked_by_trigger() THEN
        -- One node: no subtransaction on the hot path.
        INSERT INTO loom.events (execution_id, sequence, kind, payload)
        SELECT * FROM unnest(execution_ids, sequences, kinds, payloads);
        GET DIAGNOSTICS appended = ROW_COUNT;
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
    -- an INSERT queued behind loom_distribute's trigger drop (or an
    -- ALTER TABLE ... DISABLE TRIGGER) runs without the triggers, and its
    -- rows must still be tracked. Once the INSERT holds its lock on
    -- loom.events, the triggers cannot come or go before this commits.
    IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        PERFORM @extschema@.loom_track_appended(execution_ids);
    END IF;
    RETURN appended;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. Arrays of different lengths are invalid_parameter_value (22023); only in READ COMMITTED transactions (0A000 otherwise).';

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
    PERFORM @extschema@.loom_require_read_committed('appended to');
    FOR id IN SELECT DISTINCT i.id FROM unnest(execution_ids) AS i(id) WHERE i.id IS NOT NULL ORDER BY 1 LOOP
        -- One statement on one shard group (the row comes from the log).
        INSERT INTO loom.executions AS x (execution_id)
        SELECT e.execution_id FROM loom.events e WHERE e.execution_id = id LIMIT 1
        ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_track_appended(text[]) IS
'Adds each given execution id that has events to loom.executions, locking its row, in id order: what loom''s append functions call where no trigger keeps loom.executions (Citus). SECURITY DEFINER, so writers of loom.events need no grant on loom.executions; executable only by loom_writer and the roles an upgrade found writing loom.events (a caller could hold the rows'' locks); an id without events is never added.';

CREATE OR REPLACE FUNCTION @extschema@.loom_track_emptied(execution_id text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_require_read_committed('deleted from');
    -- Locked first, then looked at with a fresh snapshot (the DELETE's own
    -- statement; one shard group on Citus).
    PERFORM 1 FROM loom.executions x WHERE x.execution_id = loom_track_emptied.execution_id FOR UPDATE;
    DELETE FROM loom.executions x
    WHERE x.execution_id = loom_track_emptied.execution_id
      AND NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = loom_track_emptied.execution_id);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_track_emptied(text) IS
'Removes an execution id from loom.executions after a delete of its events, if none are left; refused (0A000) outside READ COMMITTED. SECURITY DEFINER, so deleters of loom.events need no grant on loom.executions; executable only by loom_writer and the roles an upgrade found writing loom.events.';

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
    -- SECURITY DEFINER, so it trusts nothing about how it was called: only
    -- loom's own statement triggers on loom.events, whose transition tables
    -- are loom.events' own rows (text ids, no caller-typed column whose
    -- cast could run a caller's function as the owner). Checked before any
    -- transition table is read. EXECUTE is also revoked from PUBLIC, which
    -- CREATE TRIGGER checks.
    IF TG_RELID IS DISTINCT FROM 'loom.events'::regclass
       OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'STATEMENT'
       OR TG_NAME NOT IN ('events_track_inserted_executions', 'events_track_deleted_executions',
                          'events_track_truncated_executions') THEN
        RAISE EXCEPTION 'loom_events_track_executions() only keeps loom.executions for loom.events, not for %.% (trigger %)',
                TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM @extschema@.loom_require_read_committed('appended to');
    END IF;
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
'Trigger function keeping loom.executions to the ids loom.events holds: after an INSERT (a COPY too) or a DELETE (in READ COMMITTED only: 0A000 otherwise), after a TRUNCATE. SECURITY DEFINER, so writers of loom.events need no grant on loom.executions; it refuses (42501) to run for any relation or trigger but loom.events'' own, and no role may execute it directly.';

-- Who holds loom's migration lock, for the WARNING above: pid, role,
-- application, state and since when, one per holder.
CREATE FUNCTION @extschema@.loom_migration_lock_holders()
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(string_agg(format('pid %s (role %s, application %s, %s since %s)',
                                      l.pid, coalesce(a.usename::text, '?'),
                                      coalesce(quote_literal(a.application_name), '?'),
                                      coalesce(a.state, '?'),
                                      coalesce(a.xact_start::text, '?')),
                               '; ' ORDER BY l.pid),
                    'no session it can see (ended meanwhile)')
    FROM pg_locks l
    LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = 0 AND l.objid = 1819242349 AND l.objsubid = 1
$$;
COMMENT ON FUNCTION @extschema@.loom_migration_lock_holders() IS
'The sessions holding loom''s migration advisory lock, as one line (pid, role, application, state, transaction start).';

-- loom's migrations serialize on one transaction-level advisory lock, the
-- key 0x6C6F6F6D ("loom"), waited for without a bound (ADR 0108 D3.3):
-- queueing behind a peer's one-time rebuild is intended. Any role can take
-- an advisory lock, so a session that holds it and never ends would stall
-- every boot unseen: once it has waited loom.migration_lock_report_ms
-- (default 10000), and again after each further one, this names the
-- holders (from pg_locks) in a WARNING, so an operator sees whom to end. The caller's lock_timeout is
-- restored as soon as it is held. Reentrant: a caller that already holds
-- it (the documented upgrade) passes straight through.
CREATE OR REPLACE FUNCTION @extschema@.loom_take_migration_lock()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    report_ms integer := greatest(coalesce(nullif(current_setting('loom.migration_lock_report_ms', true), '')::integer, 10000), 1);
BEGIN
    -- Queueing behind a peer's migration is the usual case, and silent:
    -- only a wait longer than report_ms names the holders, then again
    -- after each further report_ms.
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', report_ms || 'ms', true);
            PERFORM pg_advisory_xact_lock(1819242349);
            PERFORM set_config('lock_timeout', caller_lock_timeout, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            RAISE WARNING 'loom: waiting for the migration lock (pg_advisory_xact_lock(1819242349)), held by %',
                    @extschema@.loom_migration_lock_holders()
                USING DETAIL = 'loom''s migrations run one at a time; the wait is not bounded, so that a peer''s one-time rebuild completes.',
                      HINT = 'If the holder is not a loom migration (a session left open), end it: SELECT pg_terminate_backend(pid) with the pid named here.';
        END;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_take_migration_lock() IS
'Waits, without a bound, for loom''s migration advisory lock (pg_advisory_xact_lock(1819242349)) and holds it to the end of the transaction, naming the sessions that hold it in a WARNING after each loom.migration_lock_report_ms (default 10000) it waits. A statement_timeout still bounds the wait: run it with statement_timeout 0 to queue behind a peer''s migration.';

-- The objects that depend on loom's snapshot views (a user's view, rule or
-- function reading them), as one line; NULL when there are none.
CREATE FUNCTION @extschema@.loom_snapshot_view_dependents()
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT string_agg(DISTINCT coalesce(
               -- A view's dependency is its rewrite rule: name the view.
               (SELECT format('%s %s', CASE c.relkind WHEN 'm' THEN 'materialized view' ELSE 'view' END, c.oid::regclass)
                FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
                WHERE d.classid = 'pg_rewrite'::regclass AND r.oid = d.objid),
               pg_describe_object(d.classid, d.objid, d.objsubid)), ', ')
    FROM pg_depend d
    WHERE d.refclassid = 'pg_class'::regclass
      AND d.refobjid IN (SELECT v.oid FROM pg_class v JOIN pg_namespace n ON n.oid = v.relnamespace
                         WHERE n.nspname = 'loom' AND v.relname IN ('snapshots_decoded', 'snapshots_stored'))
      AND d.deptype IN ('n', 'a')
      -- Not the views' own rules (their own definitions).
      AND NOT EXISTS (SELECT 1 FROM pg_rewrite r WHERE d.classid = 'pg_rewrite'::regclass
                      AND r.oid = d.objid AND r.ev_class = d.refobjid)
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_view_dependents() IS
'The objects that depend on loom.snapshots_decoded or loom.snapshots_stored, as one line (NULL: none): what keeps a migration from redefining them.';

-- ALTER ... TYPE refuses a column a view reads, and a view's column
-- cannot change collation in place: loom.snapshots' two views are dropped
-- around the statement and defined again, with their grants (table and
-- column) and comments, as members of the extension (inside ALTER
-- EXTENSION's own script they are members by being created there). A
-- user's object that reads a view (the README invites reading through
-- them) makes DROP VIEW fail with dependent_objects_still_exist (2BP01):
-- the caller fails soft on it, naming them (loom_snapshot_view_dependents).
CREATE OR REPLACE FUNCTION @extschema@.loom_alter_under_snapshot_views(statement text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    view_name text;
    restore text[] := '{}';
    dependents text := @extschema@.loom_snapshot_view_dependents();
BEGIN
    IF dependents IS NOT NULL THEN
        RAISE EXCEPTION 'cannot redefine loom.snapshots_decoded and loom.snapshots_stored: % depend on them', dependents
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = 'Drop them (and create them again after), then retry.';
    END IF;
    FOREACH view_name IN ARRAY ARRAY['snapshots_decoded', 'snapshots_stored'] LOOP
        CONTINUE WHEN to_regclass('loom.' || view_name) IS NULL;
        -- Grants on the view, then on each of its columns, then comments.
        restore := restore || ARRAY(
            SELECT format('GRANT %s ON loom.%I TO %s%s', a.privilege_type, view_name,
                          CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                          CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid = ('loom.' || view_name)::regclass AND a.grantee <> c.relowner);
        restore := restore || ARRAY(
            SELECT format('GRANT %s (%I) ON loom.%I TO %s%s', a.privilege_type, att.attname, view_name,
                          CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                          CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
            FROM pg_attribute att, aclexplode(att.attacl) a
            WHERE att.attrelid = ('loom.' || view_name)::regclass AND att.attnum > 0 AND NOT att.attisdropped
              AND att.attacl IS NOT NULL);
        restore := restore || ARRAY(
            SELECT format('COMMENT ON COLUMN loom.%I.%I IS %L', view_name, att.attname, d.description)
            FROM pg_attribute att
            JOIN pg_description d ON d.objoid = att.attrelid AND d.classoid = 'pg_class'::regclass AND d.objsubid = att.attnum
            WHERE att.attrelid = ('loom.' || view_name)::regclass AND att.attnum > 0);
        restore := restore || ARRAY(
            SELECT format('COMMENT ON VIEW loom.%I IS %L', view_name, d.description)
            FROM pg_description d
            WHERE d.objoid = ('loom.' || view_name)::regclass AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0);
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
    FOREACH statement IN ARRAY restore LOOP
        EXECUTE statement;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_alter_under_snapshot_views(text) IS
'Runs one ALTER TABLE loom.snapshots statement that the views loom.snapshots_decoded and loom.snapshots_stored would block: drops them, runs it, defines them again with their grants (on the views and their columns) and comments, as members of the extension. Refuses (2BP01, naming them) while other objects depend on the views.';

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
        -- A user's object on loom's snapshot views (dependent_objects_still_exist)
        -- is named, with what to do about it.
        WHEN lock_not_available OR query_canceled OR deadlock_detected OR feature_not_supported
             OR dependent_objects_still_exist THEN
            RAISE WARNING 'loom: could not convert loom.%.% to COLLATE "C": % (SQLSTATE %)',
                    table_name, column_name, SQLERRM, SQLSTATE
                USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                      HINT = CASE WHEN SQLSTATE = '2BP01' THEN
                                 'Drop the objects named (saving their definitions), then run SELECT loom_migrate_collations(); with statement_timeout 0, then create them again; or by hand: '
                             ELSE 'Run SELECT loom_migrate_collations(); later (with statement_timeout 0), or by hand in a quiet moment: ' END || by_hand;
            RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_convert_column_to_c(text, text, integer) IS
'Converts one loom.<table>.<column> to COLLATE "C" (ADR 0108 D3): a no-op without any lock when already converted. Otherwise, only when statement_timeout is 0 (a function cannot exempt its own statement from it, and a cancelled rebuild would hold the exclusive lock for nothing; else it skips with a WARNING, taking no lock), waits at most lock_timeout_ms (at least 1) for the lock, restores the caller''s lock_timeout, ANALYZEs, and on a lock timeout, cancel, deadlock or dependent view or object rolls back alone with a WARNING naming them and the statements to run by hand.';

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
    -- Only the table's owner can add the column: anyone else would take
    -- the migration lock and the table's exclusive lock (a writer may),
    -- stalling every snapshot read, before failing.
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'loom.snapshots'::regclass), 'USAGE') THEN
        RAISE WARNING 'loom: could not add the snapshot frame column: % does not own loom.snapshots', current_user
            USING DETAIL = 'Snapshots keep being written as JSONB, which is correct, only larger.',
                  HINT = 'Have the extension''s owner run SELECT loom_ensure_snapshot_zstd(); (or loom-client''s migrate() with the zstd codec).';
        RETURN false;
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

-- Until 0.5.0 every role could execute loom_track_appended and
-- loom_track_emptied; from here only writers may. A role that could write
-- loom.events before this update keeps what loom's functions call for it
-- where no trigger keeps loom.executions (Citus): the grants are carried
-- over from loom.events' own ACL, PUBLIC included.
DO $carry$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'loom.events'::regclass AND a.grantee <> c.relowner
          AND a.privilege_type IN ('INSERT', 'DELETE')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]), @extschema@.loom_track_emptied(text) TO %s', grantee);
    END LOOP;
END
$carry$;


-- Who may call what (README, "Privileges"). loom's functions run as their
-- caller (SECURITY INVOKER), so what a role can do through them is what
-- its grants on loom's tables allow, and PUBLIC may execute them: without
-- grants they fail with permission denied, gaining nothing. The exceptions
-- are below:
--
-- * The SECURITY DEFINER functions that keep loom.executions run as the
--   extension's owner. Whoever could call them could lock any execution's
--   row (stalling its appends) or probe which ids exist, and whoever could
--   attach the trigger function to a table of their own would run it as
--   the owner: no role but the owner may execute them, except writers,
--   who get EXECUTE on the two that loom's own functions call on Citus
--   (loom_track_appended, loom_track_emptied) from loom_grant_access.
-- * The migration and distribution functions are the owner's: they run
--   DDL, lock loom's tables and take the migration lock.
--
-- EXECUTE on a trigger function is checked at CREATE TRIGGER, not when the
-- trigger fires: loom's own triggers on loom.events keep working for every
-- role that may write loom.events.
-- What a reader and a writer need, granted in one call by the owner:
-- operators pick their own roles (NOLOGIN group roles, as PostgreSQL's
-- pg_read_all_data is, or the service's login). loom ships no roles of its
-- own: role names are cluster-wide, and a role created ahead of
-- CREATE EXTENSION by someone with CREATEROLE (who keeps ADMIN on it)
-- would be handed loom's privileges.
CREATE FUNCTION @extschema@.loom_grant_access(grantee regrole, access text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    role_name text := quote_ident(grantee::text);
BEGIN
    IF access IS NULL OR access NOT IN ('reader', 'writer') THEN
        RAISE EXCEPTION 'unknown loom access %: expected ''reader'' or ''writer''', coalesce(quote_literal(access), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A reader pages and reads: SELECT takes no lock a writer waits on.
    EXECUTE format('GRANT USAGE ON SCHEMA loom TO %s', role_name);
    EXECUTE format('GRANT SELECT ON loom.events, loom.executions, loom.snapshots, loom.refs, loom.lineage,
                    loom.snapshots_decoded, loom.snapshots_stored TO %s', role_name);
    IF access = 'writer' THEN
        -- Appends and retention; snapshots and refs are upserts. Never
        -- loom.executions: loom keeps it (its triggers, or the two
        -- functions below on Citus).
        EXECUTE format('GRANT INSERT, DELETE ON loom.events TO %s', role_name);
        EXECUTE format('GRANT INSERT, UPDATE, DELETE ON loom.snapshots, loom.refs, loom.lineage TO %s', role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]),
                        @extschema@.loom_track_emptied(text) TO %s', role_name);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_grant_access(regrole, text) IS
'Grants a role what loom''s readers (''reader'': page, read and decode; SELECT on loom''s tables and views) or writers (''writer'': also append, save snapshots, put refs, delete and prune; never loom.executions, which loom keeps) need. The owner''s to call.';

CREATE FUNCTION @extschema@.loom_revoke_access(grantee regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    role_name text := quote_ident(grantee::text);
BEGIN
    EXECUTE format('REVOKE ALL ON loom.events, loom.executions, loom.snapshots, loom.refs, loom.lineage,
                    loom.snapshots_decoded, loom.snapshots_stored FROM %s', role_name);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]),
                    @extschema@.loom_track_emptied(text) FROM %s', role_name);
    EXECUTE format('REVOKE USAGE ON SCHEMA loom FROM %s', role_name);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_revoke_access(regrole) IS
'Revokes from a role every privilege on loom''s tables, views and index-keeping functions, and USAGE on schema loom. The owner''s to call.';

REVOKE EXECUTE ON FUNCTION
    @extschema@.loom_events_track_executions(),
    @extschema@.loom_events_refuse_id_update(),
    @extschema@.loom_track_appended(text[]),
    @extschema@.loom_track_emptied(text),
    @extschema@.loom_take_migration_lock(),
    @extschema@.loom_migration_lock_holders(),
    @extschema@.loom_migrate_collations(integer),
    @extschema@.loom_convert_column_to_c(text, text, integer),
    @extschema@.loom_alter_under_snapshot_views(text),
    @extschema@.loom_snapshot_view_dependents(),
    @extschema@.loom_define_snapshots_decoded(),
    @extschema@.loom_rebuild_executions(),
    @extschema@.loom_prepare_node_for_citus(integer),
    @extschema@.loom_distribute(integer, integer),
    @extschema@.loom_grant_access(regrole, text),
    @extschema@.loom_revoke_access(regrole)
FROM PUBLIC;
