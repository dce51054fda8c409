-- Who may call what (docs/sql-api.md, "Privileges"). loom's functions run as their
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
    -- The role's name quoted once, from the catalog: regrole's text is
    -- quoted already, and quoting it again names another role, one anyone
    -- with CREATEROLE could make ('"Orders-Svc"' for Orders-Svc). An OID
    -- no role has (0, a dropped role's) names none: pg_get_userbyid would
    -- say 'unknown (OID=0)', which is a name a role could have.
    role_name text := (SELECT format('%I', r.rolname) FROM pg_roles r WHERE r.oid = grantee);
    passed_on text[];
    other text;
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
                    loom.snapshots_decoded, loom.snapshots_stored, loom.claims,
                    loom.feed_state, loom.feed_high_water, loom.feed_consumers TO %s', role_name);
    IF access = 'writer' THEN
        -- Appends and retention; snapshots and refs are upserts. Never
        -- loom.executions: loom keeps it (its triggers, or the two
        -- functions below on Citus).
        -- INSERT on every column but the change feed's positions, which
        -- only the feed's defaults write (a writer naming them could put
        -- an event where readers have gone past it).
        -- The roles it passed INSERT on to (a grant option) lose it with
        -- the revoke (CASCADE), and get the same columns back.
        passed_on := ARRAY(
            SELECT DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
            FROM pg_class c, aclexplode(c.relacl) x LEFT JOIN pg_roles r ON r.oid = x.grantee
            WHERE c.oid = 'loom.events'::regclass AND x.grantor = loom_grant_access.grantee::oid AND x.privilege_type = 'INSERT'
              AND (x.grantee = 0 OR r.oid IS NOT NULL));
        EXECUTE format('REVOKE INSERT ON loom.events FROM %s CASCADE', role_name);
        FOREACH other IN ARRAY array_append(passed_on, role_name) LOOP
            EXECUTE format('GRANT INSERT (%s) ON loom.events TO %s',
                           (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) FROM pg_attribute a
                            WHERE a.attrelid = 'loom.events'::regclass AND a.attnum > 0 AND NOT a.attisdropped
                              AND a.attname NOT IN ('feed_tx', 'feed_ord')),
                           other);
        END LOOP;
        EXECUTE format('GRANT DELETE ON loom.events TO %s', role_name);
        -- Claims (issue 38): schedule, claim, renew, complete, and the
        -- fence check's FOR SHARE, which takes UPDATE; a reader sees them
        -- and can take none.
        EXECUTE format('GRANT INSERT, UPDATE, DELETE ON loom.snapshots, loom.refs, loom.lineage, loom.claims TO %s', role_name);
        -- The change feed's consumers: create, acknowledge, drop, each row
        -- its own role's (row security); and the order of its positions,
        -- which feed_ord's default takes as the appending role.
        EXECUTE format('GRANT INSERT, UPDATE, DELETE ON loom.feed_consumers TO %s', role_name);
        EXECUTE format('GRANT USAGE ON SEQUENCE loom.claims_fence_seq, loom.feed_ord_seq TO %s', role_name);
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
'Grants a role what loom''s readers (''reader'': USAGE on schema loom and on loom''s functions'' schema; page, read and decode; SELECT on loom''s tables and views) or writers (''writer'': also append, save snapshots, put refs, delete and prune, schedule and claim executions, create and acknowledge feed consumers; never loom.executions, which loom keeps) need. The owner''s to call.';

CREATE FUNCTION @extschema@.loom_revoke_access(grantee regrole)
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
                    loom.snapshots_decoded, loom.snapshots_stored, loom.stripes, loom.claims,
                    loom.feed_state, loom.feed_high_water, loom.feed_consumers FROM %s', role_name);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]),
                    @extschema@.loom_track_emptied(text),
                    @extschema@.loom_lock_execution_for_delete(text),
                    @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer),
                    @extschema@.loom_lock_execution_for_write(text) FROM %s', role_name);
    EXECUTE format('REVOKE ALL ON SEQUENCE loom.claims_fence_seq, loom.feed_ord_seq FROM %s', role_name);
    -- Not USAGE on the functions' schema, which other things may share.
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
    @extschema@.loom_lock_execution_for_delete(text),
    @extschema@.loom_lock_executions_for_delete(text[]),
    @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer),
    @extschema@.loom_lock_execution_for_write(text),
    @extschema@.loom_take_migration_lock(),
    @extschema@.loom_migration_lock_holders(),
    @extschema@.loom_migrate_collations(integer),
    @extschema@.loom_drop_events_id_index(integer),
    @extschema@.loom_ensure_event_metadata(integer),
    @extschema@.loom_convert_column_to_c(text, text, integer),
    @extschema@.loom_alter_under_snapshot_views(text),
    @extschema@.loom_snapshot_view_dependents(),
    @extschema@.loom_define_snapshots_decoded(),
    @extschema@.loom_rebuild_executions(),
    @extschema@.loom_repair_executions(text, integer),
    @extschema@.loom_prepare_node_for_citus(integer),
    @extschema@.loom_distribute(integer, integer),
    @extschema@.loom_grant_access(regrole, text),
    @extschema@.loom_revoke_access(regrole),
    @extschema@.loom_events_feed(),
    @extschema@.loom_feed_enable(boolean),
    @extschema@.loom_feed_disable(),
    @extschema@.loom_feed_new_era(),
    @extschema@.loom_feed_add_columns()
FROM PUBLIC;
