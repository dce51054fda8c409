-- Retention by age (issue 19): deleting the executions nobody has written
-- to for longer than an interval, in bounded batches of short
-- transactions, from psql, the CLI or a pg_cron schedule.
--
-- An execution's last activity is its last event's created_at, read with
-- one backward descent of events_pkey (execution_id, sequence): no scan of
-- its events, and nothing stored or kept on the write path, so appends
-- cost what they cost before. A sweep costs one descent per execution it
-- examines.

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

CREATE FUNCTION @extschema@.loom_delete_idle_executions(idle_for interval, after text DEFAULT NULL, max_rows integer DEFAULT 10000)
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

-- For pg_cron (docs/operations.md): a whole sweep in one CALL, committing
-- after each batch. A procedure that commits cannot pin search_path (SET
-- forbids transaction control), so every name in it is qualified.
CREATE PROCEDURE @extschema@.loom_sweep_idle_executions(idle_for interval, max_rows integer DEFAULT 10000)
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
