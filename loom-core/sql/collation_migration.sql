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
-- documented upgrade and pgloom's migrate() run it with
-- statement_timeout 0).

-- loom's migrations serialize on one row lock: the one row of
-- loom.migration_lock, FOR UPDATE, which takes UPDATE on that table, so
-- only loom's owner and superusers can hold it (and not a table lock,
-- which a database's owner could hold with BEGIN; ANALYZE). Until 0.14.0
-- it was the advisory key 0x6C6F6F6D
-- ("loom"), which any role that can connect could take and hold, stalling
-- every migration with no grant at all (issue 34). Queueing behind a
-- peer's one-time rebuild is intended (ADR 0108 D3.3), but bounded: once
-- it has waited loom.migration_lock_report_ms (default 10000), and again
-- after each further one, it names the holders (from pg_locks) in a
-- WARNING; once it has waited loom.migration_lock_wait_ms (default
-- 600000, ten minutes) it gives up, lock_not_available (55P03), naming
-- them again. A statement_timeout bounds it too. The caller's lock_timeout
-- is restored as soon as it is held. Reentrant: a caller that already
-- holds it (the documented upgrade) passes straight through.
CREATE FUNCTION @extschema@.loom_take_migration_lock()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    report_ms integer := greatest(coalesce(nullif(current_setting('loom.migration_lock_report_ms', true), '')::integer, 10000), 1);
    wait_ms bigint := greatest(coalesce(nullif(current_setting('loom.migration_lock_wait_ms', true), '')::bigint, 600000), 1);
    started timestamptz := clock_timestamp();
    waited bigint := 0;
BEGIN
    -- Queueing behind a peer's migration is the usual case, and silent:
    -- only a wait longer than report_ms names the holders, then again
    -- after each further report_ms, until wait_ms.
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', least(report_ms, wait_ms - waited) || 'ms', true);
            PERFORM 1 FROM loom.migration_lock m FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'loom.migration_lock lacks its row: loom''s migration lock would lock nothing'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Restore it as the owner: INSERT INTO loom.migration_lock DEFAULT VALUES;';
            END IF;
            PERFORM set_config('lock_timeout', caller_lock_timeout, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            waited := (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
            IF waited >= wait_ms THEN
                RAISE EXCEPTION 'loom: gave up waiting for the migration lock (the row of loom.migration_lock) after % ms, held by %',
                        waited, @extschema@.loom_migration_lock_holders()
                    USING ERRCODE = 'lock_not_available',
                          DETAIL = 'loom.migration_lock_wait_ms bounds the wait (default 600000).',
                          HINT = 'If the holder is not a loom migration (a session left open), end it: SELECT pg_terminate_backend(pid) with the pid named here; or wait longer with SET loom.migration_lock_wait_ms.';
            END IF;
            RAISE WARNING 'loom: waiting for the migration lock (the row of loom.migration_lock), held by %',
                    @extschema@.loom_migration_lock_holders()
                USING DETAIL = 'loom''s migrations run one at a time; the wait is bounded by loom.migration_lock_wait_ms (default 600000), so that a peer''s one-time rebuild completes.',
                      HINT = 'If the holder is not a loom migration (a session left open), end it: SELECT pg_terminate_backend(pid) with the pid named here.';
        END;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_take_migration_lock() IS
'Waits for loom''s migration lock (the one row of loom.migration_lock, FOR UPDATE: only loom''s owner and superusers can hold it) and holds it to the end of the transaction, naming the sessions that hold it in a WARNING after each loom.migration_lock_report_ms (default 10000) it waits, and giving up with lock_not_available (55P03), naming them, after loom.migration_lock_wait_ms (default 600000). A statement_timeout bounds the wait too: run it with statement_timeout 0 to queue behind a peer''s migration.';

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
    WHERE l.granted AND l.pid <> pg_backend_pid() AND l.locktype = 'relation'
      AND l.relation = to_regclass('loom.migration_lock')
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      -- A table lock that holds a row locker back; or the ROW SHARE lock
      -- a row's locker holds on the table (its row lock itself is in no
      -- view), of a session waiting for nothing (a queued locker holds
      -- one too, while it waits).
      AND (l.mode IN ('ExclusiveLock', 'AccessExclusiveLock')
           OR (l.mode = 'RowShareLock'
               AND NOT EXISTS (SELECT FROM pg_locks w WHERE w.pid = l.pid AND NOT w.granted)))
$$;
COMMENT ON FUNCTION @extschema@.loom_migration_lock_holders() IS
'The sessions holding loom''s migration lock, as one line (pid, role, application, state, transaction start).';

-- A lock wait given in ms must be a bound: PostgreSQL reads 0 as "wait
-- forever", the opposite of what a caller bounding it means.
CREATE FUNCTION @extschema@.loom_check_lock_timeout(lock_timeout_ms integer)
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
CREATE FUNCTION @extschema@.loom_migration_lock_timeout()
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
-- around the statement and defined again, with their grants (table and
-- column) and comments, as members of the extension (inside ALTER
-- EXTENSION's own script they are members by being created there). A
-- user's object that reads a view (the README invites reading through
-- them) makes DROP VIEW fail with dependent_objects_still_exist (2BP01):
-- the caller fails soft on it, naming them (loom_snapshot_view_dependents).
CREATE FUNCTION @extschema@.loom_alter_under_snapshot_views(statement text)
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

CREATE FUNCTION @extschema@.loom_view_is_member(view_name text)
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

CREATE FUNCTION @extschema@.loom_convert_column_to_c(table_name text, column_name text, lock_timeout_ms integer)
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
            THEN format('SELECT @extschema@.loom_alter_under_snapshot_views(%L)', alter_statement)
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
                  HINT = 'Run it as its own statement with statement_timeout 0: pgloom''s migrate() does, or SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations();, or by hand: ' || by_hand;
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
                                 'Drop the objects named (saving their definitions), then run SELECT @extschema@.loom_migrate_collations(); with statement_timeout 0, then create them again; or by hand: '
                             ELSE 'Run SELECT @extschema@.loom_migrate_collations(); later (with statement_timeout 0), or by hand in a quiet moment: ' END || by_hand;
            RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_convert_column_to_c(text, text, integer) IS
'Converts one loom.<table>.<column> to COLLATE "C" (ADR 0108 D3): a no-op without any lock when already converted. Otherwise, only when statement_timeout is 0 (a function cannot exempt its own statement from it, and a cancelled rebuild would hold the exclusive lock for nothing; else it skips with a WARNING, taking no lock), waits at most lock_timeout_ms (at least 1) for the lock, restores the caller''s lock_timeout, ANALYZEs, and on a lock timeout, cancel, deadlock or dependent view or object rolls back alone with a WARNING naming them and the statements to run by hand.';

CREATE FUNCTION @extschema@.loom_migrate_collations(lock_timeout_ms integer DEFAULT 2000)
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
'Converts loom.refs.name, then loom.events.execution_id, loom.snapshots.execution_id and loom.lineage.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does, under loom''s migration lock; re-runs a conversion an upgrade skipped. Run it with statement_timeout 0 (it skips, locking nothing, otherwise; pgloom''s migrate() does this at every boot). Returns what happened to each column.';

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
                  HINT = 'Run SELECT @extschema@.loom_drop_events_id_index(); later (pgloom''s migrate() does at every boot), or by hand in a quiet moment: DROP INDEX loom.idx_events_exec;';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_drop_events_id_index(integer) IS
'Drops loom.idx_events_exec, the index on loom.events.execution_id alone that loom no longer reads (0.7.0), waiting at most lock_timeout_ms for its lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''already dropped'' takes no lock. Under loom''s migration lock; the owner''s to call.';

-- Whether loom.events has the metadata column (0.11.0), from the catalog
-- alone: an update adds it only if it can lock loom.events in time.
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

-- 0.11.0 adds loom.events.metadata: a nullable column without a default,
-- so a catalog change, no rewrite and no scan, but one that needs loom.events'
-- ACCESS EXCLUSIVE lock, behind every reader, with appends queued behind
-- it. The wait is bounded and fails soft (ADR 0108 D3): until the column
-- is there, events are written and read without metadata (reads return
-- NULL) and an append with metadata is refused (55000), never stored
-- without it.
CREATE FUNCTION @extschema@.loom_ensure_event_metadata(lock_timeout_ms integer DEFAULT 2000)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    other_type text;
    grantee text;
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
        -- Writers insert the log column by column (0.16.0 on, so that none
        -- names the change feed's positions): each that may insert an id
        -- may insert its metadata.
        FOR grantee IN
            SELECT DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
            FROM pg_attribute a, aclexplode(a.attacl) x
            LEFT JOIN pg_roles r ON r.oid = x.grantee
            WHERE a.attrelid = 'loom.events'::regclass AND a.attname = 'execution_id' AND x.privilege_type = 'INSERT'
              AND (x.grantee = 0 OR r.oid IS NOT NULL)
        LOOP
            EXECUTE format('GRANT INSERT (metadata) ON loom.events TO %s', grantee);
        END LOOP;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        RETURN 'added';
    -- Any failure fails soft (a lock held too long, a cancel, a node of a
    -- Citus cluster that takes DDL from its coordinator only): the rest of
    -- an update goes on, and migrate() tries again.
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        RAISE WARNING 'loom: could not add loom.events.metadata: % (SQLSTATE %)', SQLERRM, SQLSTATE
            USING DETAIL = 'Events are appended and read as before; an append with metadata is refused until the column is there.',
                  HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(); later (pgloom''s migrate() does at every boot).';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_event_metadata(integer) IS
'Adds loom.events.metadata (0.11.0) if it is missing, waiting at most lock_timeout_ms for loom.events'' lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''present'' takes no lock. Under loom''s migration lock; the owner''s to call.';
