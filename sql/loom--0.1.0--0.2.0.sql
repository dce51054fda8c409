-- loom 0.1.0 -> 0.2.0: one code-point order for execution ids and ref
-- names (ADR 0108 D2, D3 and the L21 addendum).
\echo Use "ALTER EXTENSION loom UPDATE TO '0.2.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

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

-- Convert refs.name, then events.execution_id, each failing soft. Run this
-- update as the README says (in a transaction holding the migration
-- advisory lock, with SET LOCAL statement_timeout = 0): ALTER EXTENSION is
-- one statement whose timer started before this script did.
SELECT * FROM @extschema@.loom_migrate_collations(@extschema@.loom_migration_lock_timeout());
