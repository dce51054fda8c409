-- loom 0.7.0 -> 0.8.0 (issue 19): retention by age in the server. An
-- execution's last activity is its last event's created_at, read with one
-- backward descent of events_pkey: nothing is added to the write path.
-- loom_execution_activity pages executions with their last event,
-- loom_delete_idle_executions deletes the idle ones in one bounded batch,
-- and the procedure loom_sweep_idle_executions runs a whole sweep,
-- committing between batches (for pg_cron). loom_status() says "rows not
-- estimated yet" of a table never vacuumed or analyzed, not "~0 rows".
\echo Use "ALTER EXTENSION loom UPDATE TO '0.8.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- As loom_pg/src/sql/retention.sql defines them for a fresh install.
CREATE FUNCTION @extschema@.loom_execution_activity(after text DEFAULT NULL, page_size integer DEFAULT 1000)
RETURNS TABLE(execution_id text, last_sequence bigint, last_event_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The pager's page (loom.executions, code point order), then each id's
    -- last event, newest first in the primary key: one descent an id.
    RETURN QUERY
        SELECT ids.id, last.sequence, last.created_at
        FROM @extschema@.loom_list_executions(after, page_size) AS ids(id)
        CROSS JOIN LATERAL (
            SELECT e.sequence, e.created_at FROM loom.events e
            WHERE e.execution_id = ids.id
            ORDER BY e.sequence DESC LIMIT 1
        ) last
        ORDER BY ids.id COLLATE "C";
END
$$;
COMMENT ON FUNCTION @extschema@.loom_execution_activity(text, integer) IS
'One page of execution ids strictly after the cursor "after" (as loom_list_executions pages them), each with its last event''s sequence and created_at: when it was last written. One index descent an execution, however many events it has.';

CREATE FUNCTION @extschema@.loom_delete_idle_executions(idle_for interval, after text DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS TABLE(examined bigint, executions_deleted bigint, rows_deleted bigint, next_after text, done boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz;
    budget bigint := max_rows;
    activity record;
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
    FOR activity IN SELECT * FROM @extschema@.loom_execution_activity(after, max_rows) LOOP
        examined := examined + 1;
        IF activity.last_event_at < cutoff THEN
            -- Only what was there at the probe goes: snapshots and events
            -- up to the last sequence seen. An append that commits
            -- meanwhile (a later sequence) keeps the execution, with the
            -- rows written after the probe. Snapshots first, so a resume
            -- never finds a snapshot whose events are gone.
            DELETE FROM loom.snapshots s
            WHERE s.execution_id = activity.execution_id
              AND s.sequence IN (SELECT d.sequence FROM loom.snapshots d
                                 WHERE d.execution_id = activity.execution_id
                                   AND d.sequence <= activity.last_sequence
                                 ORDER BY d.sequence LIMIT budget);
            GET DIAGNOSTICS deleted = ROW_COUNT;
            budget := budget - deleted;
            rows_deleted := rows_deleted + deleted;
            IF budget > 0 THEN
                deleted := @extschema@.loom_delete_events(activity.execution_id, activity.last_sequence, budget::integer);
                budget := budget - deleted;
                rows_deleted := rows_deleted + deleted;
            END IF;
            IF NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = activity.execution_id) THEN
                -- Gone: the refs pointing at it and its own lineage row
                -- follow (forks keep theirs: they name it as history).
                DELETE FROM loom.refs r WHERE r.execution_id = activity.execution_id;
                GET DIAGNOSTICS deleted = ROW_COUNT;
                rows_deleted := rows_deleted + deleted;
                DELETE FROM loom.lineage l WHERE l.execution_id = activity.execution_id;
                GET DIAGNOSTICS deleted = ROW_COUNT;
                rows_deleted := rows_deleted + deleted;
                executions_deleted := executions_deleted + 1;
            ELSIF budget <= 0 THEN
                -- Not all of it fitted in this batch: the next one starts
                -- at this execution again (it is still idle, and still
                -- listed, until its last event goes).
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
        next_after := activity.execution_id;
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
'One bounded batch of retention by age: examines at most max_rows executions after the cursor "after" (NULL: from the first) and deletes those whose last event is older than idle_for (their snapshots, events, the refs pointing at them and their lineage row), at most max_rows rows in all. Returns what it examined and deleted, the cursor for the next batch (next_after) and whether the sweep is done; call it again with after => next_after until done. Each call is one short transaction''s work: no lock is held past it, and paging stays exact meanwhile.';

-- For pg_cron (docs/operations.md): a whole sweep in one CALL, committing
-- after each batch. A procedure that commits cannot pin search_path (SET
-- forbids transaction control), so every name in it is qualified.
CREATE PROCEDURE @extschema@.loom_sweep_idle_executions(idle_for interval, max_rows integer DEFAULT 10000)
LANGUAGE plpgsql
AS $$
DECLARE
    batch record;
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

-- As loom_pg/src/sql/status.sql defines it (same signature and comment;
-- the estimate of a table never analyzed reads as such).
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
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM loom_migrate_collations();' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT loom_ensure_snapshot_zstd();' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT loom_drop_events_id_index();' END;
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
    statement := CASE WHEN needs_action THEN 'SELECT loom_rebuild_executions();' END;
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
