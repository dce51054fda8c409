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
CREATE FUNCTION loom_take_migration_lock()
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
COMMENT ON FUNCTION loom_take_migration_lock() IS
'Waits, without a lock_timeout, for loom''s migration advisory lock (pg_advisory_xact_lock(1819242349)) and holds it to the end of the transaction. A statement_timeout still bounds the wait: run it with statement_timeout 0 to queue behind a peer''s migration.';

-- A lock wait given in ms must be a bound: PostgreSQL reads 0 as "wait
-- forever", the opposite of what a caller bounding it means.
CREATE FUNCTION loom_check_lock_timeout(lock_timeout_ms integer)
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
COMMENT ON FUNCTION loom_check_lock_timeout(integer) IS
'Returns lock_timeout_ms, or refuses NULL, 0 or a negative wait with invalid_parameter_value (22023): 0 would mean "wait forever".';

-- The lock wait of each conversion, in ms: loom.migration_lock_timeout, or
-- 2000 when it is not set.
CREATE FUNCTION loom_migration_lock_timeout()
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.loom_check_lock_timeout(
        coalesce(nullif(current_setting('loom.migration_lock_timeout', true), '')::integer, 2000))
$$;
COMMENT ON FUNCTION loom_migration_lock_timeout() IS
'The lock wait, in ms, each loom migration allows itself: the custom setting loom.migration_lock_timeout, 2000 when unset; 0 or less is invalid_parameter_value (22023).';

-- ALTER ... TYPE refuses a column a view reads, and a view's column
-- cannot change collation in place: loom.snapshots' two views are dropped
-- around the statement and defined again, with their grants, as members
-- of the extension (inside ALTER EXTENSION's own script they are members
-- by being created there).
CREATE FUNCTION loom_alter_under_snapshot_views(statement text)
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
COMMENT ON FUNCTION loom_alter_under_snapshot_views(text) IS
'Runs one ALTER TABLE loom.snapshots statement that the views loom.snapshots_decoded and loom.snapshots_stored would block: drops them, runs it, defines them again with their grants, as members of the extension.';

CREATE FUNCTION loom_view_is_member(view_name text)
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
COMMENT ON FUNCTION loom_view_is_member(text) IS
'Whether the view loom.<view_name> exists and is a member of the extension loom.';

CREATE FUNCTION loom_convert_column_to_c(table_name text, column_name text, lock_timeout_ms integer)
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
        WHEN lock_not_available OR query_canceled OR deadlock_detected OR feature_not_supported THEN
            RAISE WARNING 'loom: could not convert loom.%.% to COLLATE "C": % (SQLSTATE %)',
                    table_name, column_name, SQLERRM, SQLSTATE
                USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                      HINT = 'Run SELECT loom_migrate_collations(); later (with statement_timeout 0), or by hand in a quiet moment: ' || by_hand;
            RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION loom_convert_column_to_c(text, text, integer) IS
'Converts one loom.<table>.<column> to COLLATE "C" (ADR 0108 D3): a no-op without any lock when already converted. Otherwise, only when statement_timeout is 0 (a function cannot exempt its own statement from it, and a cancelled rebuild would hold the exclusive lock for nothing; else it skips with a WARNING, taking no lock), waits at most lock_timeout_ms (at least 1) for the lock, restores the caller''s lock_timeout, ANALYZEs, and on a lock timeout, cancel, deadlock or dependent view rolls back alone with a WARNING naming the statements to run by hand.';

CREATE FUNCTION loom_migrate_collations(lock_timeout_ms integer DEFAULT 2000)
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
COMMENT ON FUNCTION loom_migrate_collations(integer) IS
'Converts loom.refs.name, then loom.events.execution_id, loom.snapshots.execution_id and loom.lineage.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does, under loom''s migration advisory lock; re-runs a conversion an upgrade skipped. Run it with statement_timeout 0 (it skips, locking nothing, otherwise; loom-client''s migrate() does this at every boot). Returns what happened to each column.';
