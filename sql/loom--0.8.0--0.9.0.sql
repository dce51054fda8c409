-- loom 0.8.0 -> 0.9.0 (issue 25): retention never deletes what a resuming
-- workflow needs, and grants reach the role they name.
-- loom_delete_idle_executions takes the locks appends hold and checks an
-- execution's last event again before deleting it (an append in flight
-- kept only its own event before), deletes each execution whole within one
-- batch, and decides done from the ids it paged (ids without events ended
-- a sweep early). loom_save_snapshot and loom_put_ref take the lock appends
-- hold (loom_lock_execution_for_write), so that a sweep waits for them and
-- deletes what they wrote with the rest, instead of leaving a snapshot or a
-- ref of an execution that is gone. loom_delete_execution types its NULL, and the statements
-- loom_status() suggests name loom's schema. loom_grant_access
-- and loom_revoke_access quote a role's name once (regrole's text was
-- quoted twice). loom's schemas can no longer be renamed (an event
-- trigger): a database owner could rename public and put its own schema
-- under the name loom's functions call. Every script, this one and the
-- released ones, now searches pg_catalog alone. loom_sweep_idle_executions
-- declares its batch pg_catalog.record, loom_prune_events locks the
-- snapshot it prunes to, and every hint names loom's schema.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.9.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- As loom_pg/src/sql/schema_names.sql defines it for a fresh install.
-- loom's functions name each other by the extension's schema
-- (@extschema@, written into their bodies as text when they are created),
-- and the C write path names it too: names, which another role could take
-- over. On PostgreSQL 15 and later a database's owner owns public, loom's
-- usual schema; renaming it and creating a public of its own would hand
-- every call loom makes, those of its SECURITY DEFINER functions included,
-- to that role's functions (issue 25). So while loom is installed neither
-- its schema nor schema loom may be renamed, by anyone: the extension is
-- not relocatable either, and nothing of loom's would work under another
-- name. An event trigger, because only it sees every role's DDL; it reads
-- the catalog after the command, and its ERROR undoes the rename.
CREATE FUNCTION loom.loom_keep_schema_names()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                   WHERE e.extname = 'loom' AND quote_ident(n.nspname) = '@extschema@')
       OR to_regnamespace('loom') IS NULL THEN
        RAISE EXCEPTION 'loom''s schemas cannot be renamed while loom is installed (@extschema@ and loom)'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'loom''s functions name their schema: under another name, another role''s schema could take its place.';
    END IF;
END
$$;
COMMENT ON FUNCTION loom.loom_keep_schema_names() IS
'Event trigger function: refuses (0A000) a rename of the extension''s schema or of schema loom, by any role, while loom is installed; loom''s functions name both.';
CREATE EVENT TRIGGER loom_keep_schema_names ON ddl_command_end
    WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION loom.loom_keep_schema_names();
COMMENT ON EVENT TRIGGER loom_keep_schema_names IS
'Refuses a rename of loom''s schemas (the extension''s and loom) while loom is installed: loom''s functions name them, and a database''s owner could otherwise put its own schema under the name.';

-- As loom_pg/src/sql/log_api.sql defines them for a fresh install: the
-- lock snapshots and refs now take, and the functions that take it.
CREATE FUNCTION @extschema@.loom_lock_execution_for_write(execution_id text)
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'loom_lock_execution_for_write_wrapper';
COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_write(text) IS
'Takes, to the end of the transaction, the shared lock on the stripe of an execution id that appends hold: what saving a snapshot and putting a ref take, so that a retention sweep deleting the execution waits for them and deletes what they wrote with the rest. Executable only by writers.';

CREATE OR REPLACE FUNCTION @extschema@.loom_put_ref(name text, execution_id text, sequence bigint)
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

-- As loom_pg/src/sql/snapshot_api.sql defines it for a fresh install.
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
    -- As an append does: a sweep deleting the execution waits for this
    -- snapshot, and deletes it with the rest, rather than miss it.
    PERFORM @extschema@.loom_lock_execution_for_write(execution_id);
    IF codec = 'zstd' THEN
        IF NOT has_frame_column THEN
            RAISE EXCEPTION 'loom.snapshots has no state_z column for zstd frames'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'SELECT @extschema@.loom_ensure_snapshot_zstd(); adds it (or save with codec ''none'')';
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

-- As loom_pg/src/sql/retention.sql defines them for a fresh install.
-- Whether an idle execution is still exactly as a sweep saw it, asked
-- under the locks every append holds until it commits (the id's stripe,
-- exclusively; the loom.executions row, which appends over many stripes
-- and Citus lock instead), so an append still in flight is waited for and
-- then seen: the question is asked again with a fresh snapshot once they
-- are held. True leaves both held to the end of the transaction, so no
-- append can land before the delete that follows commits. SECURITY
-- DEFINER, as loom_track_emptied: a writer needs no grant on
-- loom.executions; executable only by writers (loom_grant_access).
CREATE FUNCTION @extschema@.loom_lock_idle_execution(execution_id text, last_sequence bigint, last_event_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_last record;
BEGIN
    PERFORM @extschema@.loom_require_read_committed('deleted from');
    PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
    PERFORM 1 FROM loom.executions x WHERE x.execution_id = loom_lock_idle_execution.execution_id FOR UPDATE;
    SELECT e.sequence, e.created_at INTO now_last FROM loom.events e
    WHERE e.execution_id = loom_lock_idle_execution.execution_id
    ORDER BY e.sequence DESC LIMIT 1;
    RETURN FOUND AND now_last.sequence = last_sequence AND now_last.created_at = last_event_at;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_lock_idle_execution(text, bigint, timestamptz) IS
'Takes the locks appends to an execution hold (its stripe, exclusively, and its loom.executions row) to the end of the transaction, waiting for appends in flight, then says whether its last event is still the one given (sequence and created_at): what loom_delete_idle_executions asks before it deletes. Executable only by writers.';

CREATE OR REPLACE FUNCTION @extschema@.loom_delete_idle_executions(idle_for interval, after text DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS TABLE(examined bigint, executions_deleted bigint, rows_deleted bigint, next_after text, done boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz;
    budget bigint := max_rows;
    candidate text;
    last record;
    size bigint;
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    IF idle_for IS NULL OR idle_for < interval '0' THEN
        RAISE EXCEPTION 'loom_delete_idle_executions needs a non-negative interval, not %', coalesce(idle_for::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.loom_require_read_committed('deleted from');
    cutoff := statement_timestamp() - idle_for;
    examined := 0;
    executions_deleted := 0;
    rows_deleted := 0;
    next_after := after;
    done := false;
    -- The page is of loom.executions' ids, and done is decided by how many
    -- were paged: an id without events (the index out of step) is passed
    -- over, and still counts toward the page.
    FOR candidate IN SELECT * FROM @extschema@.loom_list_executions(after, max_rows) LOOP
        examined := examined + 1;
        SELECT e.sequence, e.created_at INTO last FROM loom.events e
        WHERE e.execution_id = candidate ORDER BY e.sequence DESC LIMIT 1;
        IF FOUND AND last.created_at < cutoff
           AND @extschema@.loom_lock_idle_execution(candidate, last.sequence, last.created_at) THEN
            -- Still idle, and no append can land until this commits. An
            -- execution goes whole within one batch, never split over two,
            -- so that an append after a commit can never find part of its
            -- history gone: one that does not fit what is left of the
            -- budget waits for the next batch (which starts at it), and
            -- one larger than a whole batch goes alone, over max_rows.
            SELECT (SELECT count(*) FROM loom.events e WHERE e.execution_id = candidate)
                 + (SELECT count(*) FROM loom.snapshots s WHERE s.execution_id = candidate)
              INTO size;
            IF size > budget AND budget < max_rows THEN
                RETURN NEXT;
                RETURN;
            END IF;
            -- Snapshots first: a resume never finds a snapshot whose
            -- events are gone.
            DELETE FROM loom.snapshots s WHERE s.execution_id = candidate;
            GET DIAGNOSTICS deleted = ROW_COUNT;
            rows_deleted := rows_deleted + deleted;
            budget := budget - deleted;
            deleted := @extschema@.loom_delete_events(candidate, last.sequence, 2147483647);
            rows_deleted := rows_deleted + deleted;
            budget := budget - deleted;
            -- Gone: the refs pointing at it and its own lineage row follow
            -- (forks keep theirs: they name it as history).
            DELETE FROM loom.refs r WHERE r.execution_id = candidate;
            GET DIAGNOSTICS deleted = ROW_COUNT;
            rows_deleted := rows_deleted + deleted;
            DELETE FROM loom.lineage l WHERE l.execution_id = candidate;
            GET DIAGNOSTICS deleted = ROW_COUNT;
            rows_deleted := rows_deleted + deleted;
            executions_deleted := executions_deleted + 1;
        END IF;
        next_after := candidate;
        IF budget <= 0 THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    done := examined < max_rows;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_idle_executions(interval, text, integer) IS
'One bounded batch of retention by age: pages at most max_rows execution ids after the cursor "after" (NULL: from the first) and deletes, each whole, those whose last event is older than idle_for (their snapshots, events, the refs pointing at them and their lineage row), at most max_rows rows in all but for one execution larger than that, which goes alone. Before deleting one it takes the locks appends hold and checks that its last event has not moved: an append in flight keeps its execution whole. Returns what it paged and deleted, the cursor for the next batch (next_after) and whether the sweep is done; call it again with after => next_after until done.';

-- Writers get the two new lock functions, as loom_grant_access now gives
-- them: every role that held the writers' grant on loom_track_emptied
-- (loom_grant_access's writers, and the roles 0.6.0 found writing
-- loom.events), and every role that may write loom.snapshots or loom.refs
-- (which loom_save_snapshot and loom_put_ref now lock for).
REVOKE EXECUTE ON FUNCTION
    @extschema@.loom_lock_idle_execution(text, bigint, timestamptz),
    @extschema@.loom_lock_execution_for_write(text)
FROM PUBLIC;
DO $loom$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT format('%I', pg_get_userbyid(a.grantee))
        FROM (SELECT p.proacl AS acl, p.proowner AS owner FROM pg_proc p
              WHERE p.oid = '@extschema@.loom_track_emptied(text)'::regprocedure
              UNION ALL
              SELECT c.relacl, c.relowner FROM pg_class c
              WHERE c.oid IN ('loom.snapshots'::regclass, 'loom.refs'::regclass)) o,
             aclexplode(o.acl) a
        WHERE a.privilege_type IN ('EXECUTE', 'INSERT', 'UPDATE')
          AND a.grantee <> 0 AND a.grantee <> o.owner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION @extschema@.loom_lock_idle_execution(text, bigint, timestamptz),
                        @extschema@.loom_lock_execution_for_write(text) TO %s', grantee);
    END LOOP;
END
$loom$;

-- As loom_pg/src/sql/log_api.sql defines it for a fresh install: it
-- called loom_delete_events with an untyped NULL.
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
        -- NULL typed: an untyped NULL could resolve to an overload the
        -- schema's owner adds with text in its place.
        events_deleted := @extschema@.loom_delete_events(execution_id, NULL::bigint, (max_rows - snapshots_deleted)::integer);
    END IF;
    RETURN refs_deleted + lineage_deleted + snapshots_deleted + events_deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_execution(text, integer) IS
'Deletes one batch of an execution: the refs pointing at it and its lineage row, then at most max_rows of its snapshots and events (snapshots first, oldest first), and returns how many rows went; call it until it returns 0. Paging over the other executions is unaffected; this one leaves the pager with its last event.';

-- As loom_pg/src/sql/status.sql defines it for a fresh install: the
-- statements it suggests name loom's schema.
CREATE OR REPLACE FUNCTION @extschema@.loom_status()
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
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations();' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_snapshot_zstd();' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_drop_events_id_index();' END;
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
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_rebuild_executions();' END;
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

-- As loom_pg/src/sql/retention.sql defines it for a fresh install: it
-- declared its batch as record, a type name the procedure (which cannot
-- pin search_path) looked up through the caller's path.
CREATE OR REPLACE PROCEDURE @extschema@.loom_sweep_idle_executions(idle_for interval, max_rows integer DEFAULT 10000)
LANGUAGE plpgsql
AS $$
DECLARE
    -- pg_catalog.record, not record: the procedure cannot pin search_path,
    -- and a database's owner can put a type named record (with a domain
    -- whose check runs its code) before pg_catalog in it.
    batch pg_catalog.record;
    after pg_catalog.text;
    executions pg_catalog.int8 := 0;
    deleted pg_catalog.int8 := 0;
    batches pg_catalog.int8 := 0;
BEGIN
    LOOP
        SELECT * INTO batch FROM @extschema@.loom_delete_idle_executions(idle_for, after, max_rows);
        COMMIT;
        batches := batches OPERATOR(pg_catalog.+) 1;
        executions := executions OPERATOR(pg_catalog.+) batch.executions_deleted;
        deleted := deleted OPERATOR(pg_catalog.+) batch.rows_deleted;
        EXIT WHEN batch.done;
        after := batch.next_after;
    END LOOP;
    RAISE NOTICE 'loom: deleted % executions idle for more than % (% rows) in % batches',
        executions, idle_for, deleted, batches;
END
$$;
COMMENT ON PROCEDURE @extschema@.loom_sweep_idle_executions(interval, integer) IS
'A whole retention sweep by age: calls loom_delete_idle_executions batch after batch, committing after each, until done, and reports the totals in a NOTICE. CALL it outside a transaction block (psql, or a pg_cron job: docs/operations.md).';

-- As loom_pg/src/sql/log_api.sql defines it for a fresh install: it read
-- the latest snapshot unlocked, and raced a delete of it.
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

-- As collation_migration.sql, snapshot_api.sql and distribute.sql define
-- them for a fresh install: the statements their hints suggest name
-- loom's schema.
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
                  HINT = 'Run it as its own statement with statement_timeout 0: loom-client''s migrate() does, or SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations();, or by hand: ' || by_hand;
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

CREATE OR REPLACE FUNCTION @extschema@.loom_drop_events_id_index(lock_timeout_ms integer DEFAULT 2000)
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
                  HINT = 'Run SELECT @extschema@.loom_drop_events_id_index(); later (loom-client''s migrate() does at every boot), or by hand in a quiet moment: DROP INDEX loom.idx_events_exec;';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_drop_events_id_index(integer) IS
'Drops loom.idx_events_exec, the index on loom.events.execution_id alone that loom no longer reads (0.7.0), waiting at most lock_timeout_ms for its lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''already dropped'' takes no lock. Under loom''s migration lock; the owner''s to call.';

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
                  HINT = 'Have the extension''s owner run SELECT @extschema@.loom_ensure_snapshot_zstd(); (or loom-client''s migrate() with the zstd codec).';
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
                      HINT = 'Call SELECT @extschema@.loom_ensure_snapshot_zstd(); again: it retries, and takes no lock once done.';
            RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_snapshot_zstd(integer) IS
'Provisions zstd snapshot frames (ADR 0141 D5), opt-in: adds loom.snapshots.state_z (bytea, STORAGE EXTERNAL) and the NOT VALID check snapshots_frame_sentinel. True at once, taking no lock, when both exist. Otherwise it queues on loom''s migration advisory lock (so replicas booting together do it once), looks again, and takes one ACCESS EXCLUSIVE lock waited for at most least(lock_timeout_ms, 200) ms (at least 1). False, with one WARNING, on a lock timeout, missing privilege, deadlock or cancel: snapshots stay JSONB; retry later.';

CREATE OR REPLACE FUNCTION @extschema@.loom_distribute(shard_count integer DEFAULT NULL, lock_timeout_ms integer DEFAULT NULL)
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
            USING HINT = 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_distribute();';
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
                      HINT = 'Retry SELECT * FROM @extschema@.loom_distribute(); in a quieter moment, with statement_timeout 0.';
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
                      HINT = 'Retry SELECT * FROM @extschema@.loom_distribute(); in a quieter moment, with statement_timeout 0.';
            RETURN QUERY SELECT d.table_name, 'skipped: ' || SQLSTATE FROM @extschema@.loom_distribution() d;
            RETURN;
    END;
    RETURN QUERY SELECT d.table_name, d.distribution FROM @extschema@.loom_distribution() d;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_distribute(integer, integer) IS
'On a Citus coordinator: distributes loom.events by execution_id into shard_count shards (NULL: citus.shard_count), co-locates loom.executions, loom.snapshots and loom.lineage with it, and makes loom.refs a reference table, moving the rows there already. Every execution id column is made COLLATE "C" on every node first, the snapshot frame column is provisioned (Citus could not set its storage later), and loom.events'' triggers are dropped (loom''s functions keep loom.executions on Citus). Idempotent (no lock once done); waits at most lock_timeout_ms (default loom.migration_lock_timeout) for each lock, and on a lock timeout, cancel or deadlock rolls back whole with a WARNING. Needs statement_timeout 0 (skips with a WARNING otherwise). Returns each table''s outcome.';

-- As loom_pg/src/sql/privileges.sql defines them for a fresh install.
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
                        @extschema@.loom_track_emptied(text),
                        @extschema@.loom_lock_idle_execution(text, bigint, timestamptz),
                        @extschema@.loom_lock_execution_for_write(text) TO %s', role_name);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_grant_access(regrole, text) IS
'Grants a role what loom''s readers (''reader'': page, read and decode; SELECT on loom''s tables and views) or writers (''writer'': also append, save snapshots, put refs, delete and prune; never loom.executions, which loom keeps) need. The owner''s to call.';

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
                    loom.snapshots_decoded, loom.snapshots_stored FROM %s', role_name);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION @extschema@.loom_track_appended(text[]),
                    @extschema@.loom_track_emptied(text),
                    @extschema@.loom_lock_idle_execution(text, bigint, timestamptz),
                    @extschema@.loom_lock_execution_for_write(text) FROM %s', role_name);
    EXECUTE format('REVOKE USAGE ON SCHEMA loom FROM %s', role_name);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_revoke_access(regrole) IS
'Revokes from a role every privilege on loom''s tables, views and index-keeping functions, and USAGE on schema loom. The owner''s to call.';
