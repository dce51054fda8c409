-- loom 0.7.0 -> 0.8.0 (issue 19): retention by age in the server. An
-- execution's last activity is its last event's created_at, read with one
-- backward descent of events_pkey: nothing is added to the write path.
-- loom_execution_activity pages executions with their last event,
-- loom_delete_idle_executions deletes the idle ones in one bounded batch,
-- and the procedure loom_sweep_idle_executions runs a whole sweep,
-- committing between batches (for pg_cron). Nothing else changes.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.8.0'" to load this file. \quit

-- As loom_pg/src/sql/retention.sql defines them for a fresh install.
CREATE FUNCTION loom_execution_activity(after text DEFAULT NULL, page_size integer DEFAULT 1000)
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
COMMENT ON FUNCTION loom_execution_activity(text, integer) IS
'One page of execution ids strictly after the cursor "after" (as loom_list_executions pages them), each with its last event''s sequence and created_at: when it was last written. One index descent an execution, however many events it has.';

CREATE FUNCTION loom_delete_idle_executions(idle_for interval, after text DEFAULT NULL, max_rows integer DEFAULT 10000)
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
COMMENT ON FUNCTION loom_delete_idle_executions(interval, text, integer) IS
'One bounded batch of retention by age: examines at most max_rows executions after the cursor "after" (NULL: from the first) and deletes those whose last event is older than idle_for (their snapshots, events, the refs pointing at them and their lineage row), at most max_rows rows in all. Returns what it examined and deleted, the cursor for the next batch (next_after) and whether the sweep is done; call it again with after => next_after until done. Each call is one short transaction''s work: no lock is held past it, and paging stays exact meanwhile.';

-- For pg_cron (docs/operations.md): a whole sweep in one CALL, committing
-- after each batch. A procedure that commits cannot pin search_path (SET
-- forbids transaction control), so every name in it is qualified.
CREATE PROCEDURE loom_sweep_idle_executions(idle_for interval, max_rows integer DEFAULT 10000)
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
COMMENT ON PROCEDURE loom_sweep_idle_executions(interval, integer) IS
'A whole retention sweep by age: calls loom_delete_idle_executions batch after batch, committing after each, until done, and reports the totals in a NOTICE. CALL it outside a transaction block (psql, or a pg_cron job: docs/operations.md).';
