-- loom 0.13.0 -> 0.14.0 (issue 34): no lock of loom's is one a role it
-- never granted can hold. The migration lock is the row of
-- loom.migration_lock, FOR UPDATE (its owner's and superusers' alone), not
-- the advisory key 0x6C6F6F6D, and gives up, naming its holders, after
-- loom.migration_lock_wait_ms; the SQL-only flavour's stripes are row
-- locks on loom.stripes (writers' alone), not advisory keys (the
-- extension's are on a lock tag no SQL reaches, and stay). Hints name
-- loom's schema. The SQL-only flavour's update is this file too
-- (pgloom_core::sql, without the psql line below and the native block at
-- the end, the extension's drop guard).
\echo Use "ALTER EXTENSION loom UPDATE TO '0.14.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25): every loom object is named by @extschema@ or loom.
SET LOCAL search_path = pg_catalog, pg_temp;

-- As loom-core/sql/tables.sql creates them for a fresh install.
-- The SQL-only flavour's write locks (issue 34): one row per stripe of
-- execution ids (0-63, see loom_append_event), locked FOR KEY SHARE by
-- appends, snapshot saves and ref puts, FOR UPDATE by deletes. Row locks
-- take UPDATE on a column, so only loom's writers (UPDATE on lockable
-- alone, from loom_grant_access) and its owner can hold them: an advisory
-- key, which it replaced in 0.14.0, any role that can connect could hold.
-- Nothing reads lockable; it is there to be the one column writers may
-- update. The extension takes its stripes on a lock tag no SQL reaches
-- (loom_pg/src/execution_stripes.rs) and leaves this table alone.
CREATE TABLE loom.stripes (
    stripe integer NOT NULL,
    lockable boolean NOT NULL DEFAULT true,
    CONSTRAINT stripes_pkey PRIMARY KEY (stripe),
    CONSTRAINT stripes_range CHECK (stripe >= 0 AND stripe <= 63)
);
INSERT INTO loom.stripes (stripe) SELECT s FROM pg_catalog.generate_series(0, 63) AS s;
COMMENT ON TABLE loom.stripes IS 'The SQL-only flavour''s write locks: one row per stripe of execution ids (hashtext(id COLLATE "C") & 63), locked FOR KEY SHARE by writes and FOR UPDATE by deletes. Never write it.';

-- loom's migration lock (issue 34): migrations and provisioning lock its
-- one row FOR UPDATE (loom_take_migration_lock), which takes UPDATE on
-- the table: only loom's owner and superusers have it. A row lock, not a
-- table lock: a database's owner may ANALYZE every table of its database
-- inside a transaction, holding SHARE UPDATE EXCLUSIVE on each until it
-- ends, and a row lock conflicts with no lock ANALYZE or VACUUM takes.
CREATE TABLE loom.migration_lock (
    held boolean NOT NULL DEFAULT true,
    CONSTRAINT migration_lock_pkey PRIMARY KEY (held),
    CONSTRAINT migration_lock_one_row CHECK (held)
);
INSERT INTO loom.migration_lock DEFAULT VALUES;
COMMENT ON TABLE loom.migration_lock IS 'loom''s migration lock: its one row, locked FOR UPDATE by loom_take_migration_lock(). Never write it.';

-- Each role granted writer before (EXECUTE on loom_lock_execution_for_write,
-- which loom_grant_access gives writers alone) may lock the stripes, as
-- loom_grant_access now grants.
DO $loom_step$
DECLARE
    writer text;
BEGIN
    FOR writer IN
        SELECT DISTINCT pg_catalog.quote_ident(r.rolname)
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.loom_lock_execution_for_write(text)'::pg_catalog.regprocedure
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT (stripe), UPDATE (lockable) ON loom.stripes TO %s', writer);
    END LOOP;
END
$loom_step$;

-- As loom-core/sql/ defines them for a fresh install.
CREATE OR REPLACE FUNCTION @extschema@.loom_take_migration_lock()
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

CREATE OR REPLACE FUNCTION @extschema@.loom_migration_lock_holders()
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
    -- migration lock.
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
                  HINT = 'Have the extension''s owner run SELECT @extschema@.loom_ensure_snapshot_zstd(); (or loom-client''s migrate() with the zstd codec).';
        RETURN false;
    END IF;
    BEGIN
        -- Replicas booting together all get here. One at a time, under the
        -- migration lock (ADR 0141 D5), and each looks again once
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
                      HINT = 'Call SELECT @extschema@.loom_ensure_snapshot_zstd(); again: it retries, and takes no lock once done.';
            RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_snapshot_zstd(integer) IS
'Provisions zstd snapshot frames (ADR 0141 D5), opt-in: adds loom.snapshots.state_z (bytea, STORAGE EXTERNAL) and the NOT VALID check snapshots_frame_sentinel. True at once, taking no lock, when both exist. Otherwise it queues on loom''s migration lock (so replicas booting together do it once), looks again, and takes one ACCESS EXCLUSIVE lock waited for at most least(lock_timeout_ms, 200) ms (at least 1). False, with one WARNING, on a lock timeout, missing privilege, deadlock or cancel: snapshots stay JSONB; retry later.';

CREATE OR REPLACE FUNCTION @extschema@.loom_executions_compared(after text, max_ids integer)
RETURNS TABLE(checked bigint, missing text[], orphaned text[], next_after text, done boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The database's collation, not the caller's (PL/pgSQL gives its
    -- variables its arguments'): an id compared with a column yields to
    -- the column's.
    log_ids text[] COLLATE "default";
    index_ids text[] COLLATE "default";
    upto text COLLATE "default";
    candidates text[] COLLATE "default";
    id text COLLATE "default";
    has_events boolean;
    has_row boolean;
BEGIN
    -- The loose scan walks events_pkey in its column's order, and the cut
    -- compares in code point order: they must be one order.
    IF NOT @extschema@.loom_column_is_c('events', 'execution_id') THEN
        RAISE EXCEPTION 'loom.events.execution_id is not COLLATE "C" yet: the executions index is checked in code point order'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'convert it first: SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations(2000); (loom status says what is pending)';
    END IF;
    -- '' is the least string in code point order; "after" itself is
    -- excluded by the second condition, so the index condition stays a
    -- range.
    IF @extschema@.loom_is_distributed() THEN
        log_ids := ARRAY(
            SELECT DISTINCT e.execution_id FROM loom.events e
            WHERE e.execution_id >= coalesce(after, '') COLLATE "C"
              AND (after IS NULL OR e.execution_id > after COLLATE "C")
            ORDER BY 1 LIMIT max_ids);
    ELSE
        log_ids := ARRAY(
            WITH RECURSIVE logged(id, n) AS (
                (SELECT e.execution_id, 1 FROM loom.events e
                 WHERE e.execution_id >= coalesce(after, '') COLLATE "C"
                   AND (after IS NULL OR e.execution_id > after COLLATE "C")
                 ORDER BY e.execution_id LIMIT 1)
                UNION ALL
                SELECT (SELECT e.execution_id FROM loom.events e
                        WHERE e.execution_id > l.id ORDER BY e.execution_id LIMIT 1),
                       l.n + 1
                FROM logged l WHERE l.id IS NOT NULL AND l.n < max_ids
            )
            SELECT l.id FROM logged l WHERE l.id IS NOT NULL);
    END IF;
    index_ids := ARRAY(
        SELECT x.execution_id FROM loom.executions x
        WHERE x.execution_id >= coalesce(after, '') COLLATE "C"
          AND (after IS NULL OR x.execution_id > after COLLATE "C")
        ORDER BY x.execution_id LIMIT max_ids);
    -- A side that ran out before max_ids was read to its end: no cut.
    upto := least(CASE WHEN cardinality(log_ids) >= max_ids THEN log_ids[cardinality(log_ids)] END,
                  CASE WHEN cardinality(index_ids) >= max_ids THEN index_ids[cardinality(index_ids)] END COLLATE "C");
    SELECT count(*),
           coalesce(array_agg(b.id ORDER BY b.id COLLATE "C") FILTER (WHERE NOT b.in_index), '{}'),
           coalesce(array_agg(b.id ORDER BY b.id COLLATE "C") FILTER (WHERE NOT b.in_log), '{}'),
           coalesce(upto, max(b.id COLLATE "C"), after)
      INTO checked, missing, orphaned, next_after
    FROM (SELECT coalesce(l.id, i.id) AS id, l.id IS NOT NULL AS in_log, i.id IS NOT NULL AS in_index
          FROM unnest(log_ids) AS l(id) FULL JOIN unnest(index_ids) AS i(id) ON i.id = l.id) b
    WHERE upto IS NULL OR b.id <= upto COLLATE "C";
    IF cardinality(missing) + cardinality(orphaned) > 0 THEN
        -- Each looked at again, both sides in one statement (one shard
        -- group on Citus).
        candidates := missing || orphaned;
        missing := '{}';
        orphaned := '{}';
        FOREACH id IN ARRAY candidates LOOP
            SELECT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = id),
                   EXISTS (SELECT 1 FROM loom.executions x WHERE x.execution_id = id)
              INTO has_events, has_row;
            IF has_events AND NOT has_row THEN
                missing := missing || id;
            ELSIF has_row AND NOT has_events THEN
                orphaned := orphaned || id;
            END IF;
        END LOOP;
    END IF;
    done := upto IS NULL;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_executions_compared(text, integer) IS
'One batch of the executions index''s check: the ids after the cursor "after" up to the max_ids-th id of the log or of the index, whichever comes first, with the ids of the log missing from loom.executions and the ids of loom.executions without events, each disagreement confirmed with both sides read in one snapshot. What loom_verify_executions and loom_repair_executions read.';

CREATE OR REPLACE FUNCTION @extschema@.loom_grant_access(grantee regrole, access text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The role's name quoted once, from the catalog: regrole's text is
    -- quoted already, and quoting it again names another role, one anyone
    -- with CREATEROLE could make ('"Orders-Svc"' for Orders-Svc). An OID
    -- no role has (0, a dropped role's) names none: pg_get_userbyid would
    -- say 'unknown (OID=0)', which is a name a role could have.
    role_name text := (SELECT format('%I', r.rolname) FROM pg_roles r WHERE r.oid = grantee);
BEGIN
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'no role has OID %', grantee::oid USING ERRCODE = 'undefined_object';
    END IF;
    IF access IS NULL OR access NOT IN ('reader', 'writer') THEN
        RAISE EXCEPTION 'unknown loom access %: expected ''reader'' or ''writer''', coalesce(quote_literal(access), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A reader pages and reads: SELECT takes no lock a writer waits on.
    -- USAGE on loom's functions' schema too, for one other than public.
    EXECUTE format('GRANT USAGE ON SCHEMA loom, @extschema@ TO %s', role_name);
    EXECUTE format('GRANT SELECT ON loom.events, loom.executions, loom.snapshots, loom.refs, loom.lineage,
                    loom.snapshots_decoded, loom.snapshots_stored TO %s', role_name);
    IF access = 'writer' THEN
        -- Appends and retention; snapshots and refs are upserts. Never
        -- loom.executions: loom keeps it (its triggers, or the two
        -- functions below on Citus).
        EXECUTE format('GRANT INSERT, DELETE ON loom.events TO %s', role_name);
        EXECUTE format('GRANT INSERT, UPDATE, DELETE ON loom.snapshots, loom.refs, loom.lineage TO %s', role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]),
                        @extschema@.loom_track_emptied(text),
                        @extschema@.loom_lock_execution_for_delete(text),
                        @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer),
                        @extschema@.loom_lock_execution_for_write(text) TO %s', role_name);
        -- The SQL-only flavour's stripe locks are row locks on
        -- loom.stripes, which take UPDATE on a column: lockable alone, so
        -- no stripe's number can change (log_api.sql, "The stripes").
        EXECUTE format('GRANT SELECT (stripe), UPDATE (lockable) ON loom.stripes TO %s', role_name);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_grant_access(regrole, text) IS
'Grants a role what loom''s readers (''reader'': USAGE on schema loom and on loom''s functions'' schema; page, read and decode; SELECT on loom''s tables and views) or writers (''writer'': also append, save snapshots, put refs, delete and prune; never loom.executions, which loom keeps) need. The owner''s to call.';

CREATE OR REPLACE FUNCTION @extschema@.loom_revoke_access(grantee regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The role's name quoted once, from the catalog: regrole's text is
    -- quoted already, and quoting it again names another role, one anyone
    -- with CREATEROLE could make ('"Orders-Svc"' for Orders-Svc). An OID
    -- no role has (0, a dropped role's) names none: pg_get_userbyid would
    -- say 'unknown (OID=0)', which is a name a role could have.
    role_name text := (SELECT format('%I', r.rolname) FROM pg_roles r WHERE r.oid = grantee);
BEGIN
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'no role has OID %', grantee::oid USING ERRCODE = 'undefined_object';
    END IF;
    EXECUTE format('REVOKE ALL ON loom.events, loom.executions, loom.snapshots, loom.refs, loom.lineage,
                    loom.snapshots_decoded, loom.snapshots_stored, loom.stripes FROM %s', role_name);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]),
                    @extschema@.loom_track_emptied(text),
                    @extschema@.loom_lock_execution_for_delete(text),
                    @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer),
                    @extschema@.loom_lock_execution_for_write(text) FROM %s', role_name);
    -- Not USAGE on the functions' schema, which other things may share.
    EXECUTE format('REVOKE USAGE ON SCHEMA loom FROM %s', role_name);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_revoke_access(regrole) IS
'Revokes from a role every privilege on loom''s tables, views and index-keeping functions, and USAGE on schema loom. The owner''s to call.';

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
    IF installed IS NULL AND to_regclass('loom.sql_only') IS NOT NULL THEN
        -- The SQL-only flavour (docs/flavours.md): its version is in its
        -- table, and the server has no loom to update to: the client
        -- that installed it brings the next one (loom migrate --sql-only).
        EXECUTE 'SELECT version FROM loom.sql_only' INTO installed;
        item := 'loom flavour'; value := 'SQL-only';
        RETURN NEXT;
        item := 'loom version'; value := installed;
        RETURN NEXT;
    ELSE
        SELECT a.default_version INTO available FROM pg_available_extensions a WHERE a.name = 'loom';
        item := 'loom flavour'; value := 'extension';
        RETURN NEXT;
        item := 'loom version'; value := installed;
        RETURN NEXT;
        item := 'loom available version'; value := available;
        needs_action := available IS DISTINCT FROM installed;
        statement := CASE WHEN needs_action THEN 'loom migrate --db <db> (or the documented ALTER EXTENSION loom UPDATE: docs/upgrading.md)' END;
        RETURN NEXT;
    END IF;
    needs_action := false; statement := NULL;

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
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations(2000);' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_snapshot_zstd(200);' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_drop_events_id_index(2000);' END;
    RETURN NEXT;

    item := 'loom.events.metadata (0.11.0)';
    value := CASE WHEN @extschema@.loom_events_have_metadata() THEN 'present' ELSE 'missing' END;
    needs_action := value = 'missing';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_event_metadata(2000);' END;
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

COMMENT ON FUNCTION @extschema@.loom_migrate_collations(integer) IS
'Converts loom.refs.name, then loom.events.execution_id, loom.snapshots.execution_id and loom.lineage.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does, under loom''s migration lock; re-runs a conversion an upgrade skipped. Run it with statement_timeout 0 (it skips, locking nothing, otherwise; loom-client''s migrate() does this at every boot). Returns what happened to each column.';

-- The write path's stripe locks, where they are PL/pgSQL (the SQL-only
-- flavour, as loom-core/sql/log_api.sql defines them). The extension runs
-- these in C (loom-core/sql/native/write_path.sql), which this leaves as
-- it is.
DO $loom_step$
BEGIN
    IF (SELECT l.lanname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
        WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.loom_append_event(text,bigint,text,jsonb,jsonb)'::pg_catalog.regprocedure)
       OPERATOR(pg_catalog.=) 'c' THEN
        RETURN;
    END IF;
    EXECUTE $loom_fn$
CREATE OR REPLACE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb DEFAULT NULL)
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
                      HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(2000); as the extension''s owner (loom-client''s migrate() does at every boot).';
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
$$
$loom_fn$;
    EXECUTE $loom_fn$
CREATE OR REPLACE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL)
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
                          HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(2000); as the extension''s owner (loom-client''s migrate() does at every boot).';
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
$$
$loom_fn$;
    EXECUTE $loom_fn$
CREATE OR REPLACE FUNCTION @extschema@.loom_lock_execution_for_delete(execution_id text)
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
$$
$loom_fn$;
    EXECUTE $loom_fn$
CREATE OR REPLACE FUNCTION @extschema@.loom_lock_executions_for_delete(execution_ids text[])
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
$$
$loom_fn$;
    EXECUTE $loom_fn$
CREATE OR REPLACE FUNCTION @extschema@.loom_lock_execution_for_write(execution_id text)
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
$$
$loom_fn$;
    EXECUTE $loom_fn$
CREATE OR REPLACE FUNCTION @extschema@.loom_events_track_executions()
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
$$
$loom_fn$;
    EXECUTE $loom_fn$
COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) IS
'Takes, to the end of the transaction, the exclusive lock on the stripe of an execution id that appends hold shared: what loom_delete_events and loom_delete_execution take before they delete, and loom_track_emptied before it looks for events left. In the SQL-only flavour, the row of loom.stripes numbered hashtext(execution_id COLLATE "C") & 63, locked FOR UPDATE; in the extension, a lock tag no SQL function reaches. Executable by writers.'
$loom_fn$;
    EXECUTE $loom_fn$
COMMENT ON FUNCTION @extschema@.loom_lock_executions_for_delete(text[]) IS
'Takes, to the end of the transaction, the exclusive locks on the stripes of many execution ids at once, in ascending stripe order as a delete statement does: what a retention batch and a repair batch take, so they cannot deadlock with appends over several stripes. Executable by the owner alone.'
$loom_fn$;
END
$loom_step$;

-- @native: what only the extension adds (issue 34), its guard against a
-- database's owner dropping loom's schemas, as
-- loom-core/sql/native/schema_names.sql creates it for a fresh install.
-- The SQL-only flavour's update leaves this block out
-- (pgloom_core::sql::sql_only_update_statements).
-- Nor may anyone but a superuser drop them (issue 34): on 15 and later a
-- database's owner owns public, and DROP SCHEMA public CASCADE would drop
-- loom with it; a public of the owner's, with procedures named as loom's,
-- would then take the calls a superuser's documented statements and
-- scheduled jobs make, however exactly typed. At ddl_command_start and
-- in C (loom_pg/src/drop_guard.rs): a trigger dropped with the extension
-- would not fire at sql_drop, and only the parse tree says, before
-- anything is dropped, which schemas a DROP SCHEMA names or a DROP OWNED
-- reaches.
CREATE FUNCTION loom.loom_refuse_drops()
RETURNS event_trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'loom_refuse_drops';
COMMENT ON FUNCTION loom.loom_refuse_drops() IS
'Event trigger function: refuses (42501) a DROP SCHEMA of the extension''s schema or of schema loom, or a DROP OWNED BY their owner, by any role but a superuser, while loom is installed.';
CREATE EVENT TRIGGER loom_refuse_drops ON ddl_command_start
    WHEN TAG IN ('DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION loom.loom_refuse_drops();
COMMENT ON EVENT TRIGGER loom_refuse_drops IS
'Refuses, to every role but a superuser, dropping loom''s schemas (the extension''s and loom) while loom is installed: a database''s owner owns public, and could otherwise drop loom with it and put its own functions under loom''s names.';
-- @end native
