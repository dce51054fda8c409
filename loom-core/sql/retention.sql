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
    IF @extschema@.loom_is_distributed() THEN
        -- Citus joins no table function to a shard: the page and each
        -- id's last event in one join of co-located tables on the
        -- distribution column, which runs on every shard (issue 39).
        PERFORM @extschema@.loom_check_page_size(page_size);
        RETURN QUERY
            SELECT x.execution_id, last.sequence, last.created_at
            FROM loom.executions x
            CROSS JOIN LATERAL (
                SELECT e.sequence, e.created_at FROM loom.events e
                WHERE e.execution_id = x.execution_id
                ORDER BY e.sequence DESC LIMIT 1
            ) last
            WHERE x.execution_id >= coalesce(after, '') COLLATE "C"
              AND (after IS NULL OR x.execution_id > after COLLATE "C")
            ORDER BY x.execution_id COLLATE "C" LIMIT page_size;
        RETURN;
    END IF;
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

-- Which of a page's idle executions are still exactly as a sweep saw
-- them, and fit its batch, asked under the locks every append holds until
-- it commits (each id's stripe, exclusively, all taken at once in
-- ascending order as a delete statement takes them; then each
-- loom.executions row, in id order, which appends over many stripes and
-- Citus lock instead), so an append that has started is waited for and
-- then seen: the question is asked again with a fresh snapshot once they
-- are held. The locks are held to the end of the transaction, so no append
-- can land before the delete that follows commits. Bounded by the batch:
-- it stops at the first execution that does not fit what is left of
-- max_rows (one larger than a whole batch goes alone), counting no further
-- than that (the rows it locks are the page's idle ones, at most
-- max_rows). SECURITY DEFINER, as
-- loom_track_emptied: a writer needs no grant on loom.executions;
-- executable only by writers (loom_grant_access).
CREATE FUNCTION @extschema@.loom_lock_idle_executions(execution_ids text[], last_sequences bigint[], last_event_ats timestamptz[], max_rows integer)
RETURNS TABLE(execution_id text, rows_held bigint, taken boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The database's collation, not the caller's (PL/pgSQL gives its
    -- variables its arguments'): an id compared with a column yields to
    -- the column's. Not named "id": loom.snapshots has a column of that
    -- name.
    walked_id text COLLATE "default";
    ids text[] COLLATE "default";
    sequences bigint[];
    ats timestamptz[];
    i integer;
    used bigint := 0;
    now_sequence bigint;
    now_at timestamptz;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    PERFORM @extschema@.loom_require_read_committed('deleted from');
    IF execution_ids IS NULL OR last_sequences IS NULL OR last_event_ats IS NULL
       OR cardinality(execution_ids) <> cardinality(last_sequences)
       OR cardinality(execution_ids) <> cardinality(last_event_ats) THEN
        RAISE EXCEPTION 'loom_lock_idle_executions needs three arrays of one length, not NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.loom_lock_executions_for_delete(execution_ids);
    -- In id order, as arrays a step reads in constant time.
    SELECT array_agg(c.id ORDER BY c.id COLLATE "C", c.n), array_agg(c.seq ORDER BY c.id COLLATE "C", c.n),
           array_agg(c.at ORDER BY c.id COLLATE "C", c.n)
      INTO ids, sequences, ats
    FROM unnest(execution_ids, last_sequences, last_event_ats) WITH ORDINALITY AS c(id, seq, at, n)
    WHERE c.id IS NOT NULL;
    IF @extschema@.loom_is_distributed() THEN
        -- Citus locks rows in single-shard statements only.
        FOR walked_id IN SELECT DISTINCT i.id COLLATE "C" FROM unnest(ids) AS i(id) ORDER BY 1 LOOP
            PERFORM 1 FROM loom.executions x WHERE x.execution_id = walked_id FOR UPDATE;
        END LOOP;
    ELSE
        PERFORM 1 FROM loom.executions x WHERE x.execution_id = ANY (ids)
        ORDER BY x.execution_id FOR UPDATE;
    END IF;
    -- With the locks held, walked one execution a step, each statement a
    -- fresh snapshot (single-shard on Citus, which plans no recursive query
    -- over shards): its last event still the one given, and the rows it
    -- holds, counted no further than what is left of the batch needs; the
    -- walk ends after the first that does not fit, or once the batch is
    -- spent.
    FOR i IN 1 .. coalesce(cardinality(ids), 0) LOOP
        EXIT WHEN used >= max_rows;
        -- A scalar, so that Citus routes each statement to one shard.
        walked_id := ids[i];
        SELECT e.sequence, e.created_at INTO now_sequence, now_at FROM loom.events e
        WHERE e.execution_id = walked_id ORDER BY e.sequence DESC LIMIT 1;
        -- A NULL given is never "as it was".
        CONTINUE WHEN NOT FOUND OR sequences[i] IS NULL OR ats[i] IS NULL
                      OR now_sequence <> sequences[i] OR now_at <> ats[i];
        -- Never one that is claimed or scheduled (issue 38): its worker
        -- runs it, or a timer will. loom_schedule takes the write lock
        -- held exclusively here, so one in flight has committed.
        CONTINUE WHEN EXISTS (SELECT FROM loom.claims c WHERE c.execution_id = walked_id AND c.due_at IS NOT NULL);
        execution_id := walked_id;
        rows_held := (SELECT count(*) FROM (SELECT 1 FROM loom.events e
                                            WHERE e.execution_id = walked_id LIMIT max_rows - used + 1) AS k)
                   + (SELECT count(*) FROM (SELECT 1 FROM loom.snapshots s
                                            WHERE s.execution_id = walked_id LIMIT max_rows - used + 1) AS k);
        taken := used + rows_held <= max_rows OR used = 0;
        RETURN NEXT;
        EXIT WHEN NOT taken;
        used := used + rows_held;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer) IS
'Takes the locks appends to the given executions hold (their stripes, exclusively, all at once in ascending order; then, in id order, their loom.executions rows) to the end of the transaction, waiting for appends that have started, then returns, in id order, those whose last event is still the one given (sequence and created_at), except those claimed or scheduled (loom.claims), each with the rows a delete of it takes (counted no further than max_rows needs) and whether it fits what is left of max_rows: it stops after the first that does not (taken false), and after max_rows is spent; one larger than max_rows is taken alone. What loom_delete_idle_executions asks before it deletes. 22023 unless the three arrays have one length. Executable only by writers.';

CREATE FUNCTION @extschema@.loom_delete_idle_executions(idle_for interval, after text DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS TABLE(examined bigint, executions_deleted bigint, rows_deleted bigint, next_after text, done boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz;
    -- The database's collation, not the caller's (see
    -- loom_lock_idle_executions): the page's ids meet loom.events'
    -- column in its own collation, so its index serves them before a
    -- conversion to "C" as after.
    page text[] COLLATE "default";
    paged bigint;
    last_paged text;
    idle_ids text[] COLLATE "default";
    idle_sequences bigint[];
    idle_ats timestamptz[];
    doomed text[] COLLATE "default" := '{}';
    budget bigint := max_rows;
    held record;
    stop_before text;
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    IF idle_for IS NULL OR idle_for < interval '0' THEN
        RAISE EXCEPTION 'loom_delete_idle_executions needs a non-negative interval, not %', coalesce(idle_for::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.loom_require_read_committed('deleted from');
    cutoff := statement_timestamp() - idle_for;
    rows_deleted := 0;
    -- The page: loom.executions' next ids (as loom_list_executions pages
    -- them), then each one's last event (one backward descent of
    -- events_pkey an id), and the idle ones kept.
    -- done is decided by how many were paged: an id without events (the
    -- index out of step) is passed over, and still counts toward the page.
    IF @extschema@.loom_is_distributed() THEN
        -- Citus joins no table function to a shard: the page and each
        -- id's last event in one join of co-located tables on the
        -- distribution column (issue 39).
        SELECT count(*), max(p.id COLLATE "C"),
               coalesce(array_agg(p.id ORDER BY p.id COLLATE "C") FILTER (WHERE p.created_at < cutoff), '{}'),
               coalesce(array_agg(p.sequence ORDER BY p.id COLLATE "C") FILTER (WHERE p.created_at < cutoff), '{}'),
               coalesce(array_agg(p.created_at ORDER BY p.id COLLATE "C") FILTER (WHERE p.created_at < cutoff), '{}')
          INTO paged, last_paged, idle_ids, idle_sequences, idle_ats
        FROM (SELECT x.execution_id AS id, last.sequence, last.created_at
              FROM loom.executions x
              LEFT JOIN LATERAL (
                  SELECT e.sequence, e.created_at FROM loom.events e
                  WHERE e.execution_id = x.execution_id
                  ORDER BY e.sequence DESC LIMIT 1
              ) last ON true
              WHERE x.execution_id >= coalesce(after, '') COLLATE "C"
                AND (after IS NULL OR x.execution_id > after COLLATE "C")
              ORDER BY x.execution_id COLLATE "C" LIMIT max_rows) AS p;
    ELSE
        page := ARRAY(SELECT x.execution_id FROM loom.executions x
                      WHERE x.execution_id >= coalesce(after, '') COLLATE "C"
                        AND (after IS NULL OR x.execution_id > after COLLATE "C")
                      ORDER BY x.execution_id LIMIT max_rows);
        SELECT count(*), max(p.id COLLATE "C"),
               coalesce(array_agg(p.id ORDER BY p.id COLLATE "C") FILTER (WHERE last.created_at < cutoff), '{}'),
               coalesce(array_agg(last.sequence ORDER BY p.id COLLATE "C") FILTER (WHERE last.created_at < cutoff), '{}'),
               coalesce(array_agg(last.created_at ORDER BY p.id COLLATE "C") FILTER (WHERE last.created_at < cutoff), '{}')
          INTO paged, last_paged, idle_ids, idle_sequences, idle_ats
        FROM unnest(page) AS p(id)
        LEFT JOIN LATERAL (
            SELECT e.sequence, e.created_at FROM loom.events e
            WHERE e.execution_id = p.id
            ORDER BY e.sequence DESC LIMIT 1
        ) last ON true;
    END IF;
    -- Still idle, locked, and no append can land until this commits. An
    -- execution goes whole within one batch, never split over two, so
    -- that an append after a commit can never find part of its history
    -- gone: one that does not fit what is left of the budget waits for the
    -- next batch (which starts at it), and one larger than a whole batch
    -- goes alone, over max_rows.
    IF cardinality(idle_ids) > 0 THEN
        FOR held IN SELECT * FROM @extschema@.loom_lock_idle_executions(idle_ids, idle_sequences, idle_ats, max_rows) LOOP
            IF NOT held.taken THEN
                stop_before := held.execution_id;
                EXIT;
            END IF;
            doomed := doomed || held.execution_id;
            budget := budget - held.rows_held;
        END LOOP;
    END IF;
    -- The cursor, read before anything is deleted: the last id this batch
    -- is finished with. Stopped before an execution, it is the id paged
    -- just before it (never none: one that does not fit goes alone when
    -- nothing is deleted yet), so the next batch starts at it; stopped
    -- with the budget spent, the last one deleted. An id added to the
    -- index since the page is one being appended to, which this sweep has
    -- no reason to examine.
    IF stop_before IS NOT NULL THEN
        SELECT max(x.execution_id), count(*) INTO next_after, examined FROM loom.executions x
        WHERE x.execution_id >= coalesce(after, '') COLLATE "C"
          AND (after IS NULL OR x.execution_id > after COLLATE "C")
          AND x.execution_id < stop_before COLLATE "C";
        done := false;
    ELSIF budget <= 0 THEN
        next_after := doomed[cardinality(doomed)];
        SELECT count(*) INTO examined FROM loom.executions x
        WHERE x.execution_id >= coalesce(after, '') COLLATE "C"
          AND (after IS NULL OR x.execution_id > after COLLATE "C")
          AND x.execution_id <= next_after COLLATE "C";
        done := false;
    ELSE
        next_after := coalesce(last_paged, after);
        examined := paged;
        done := paged < max_rows;
    END IF;
    IF cardinality(doomed) > 0 THEN
        -- Snapshots first: a resume never finds a snapshot whose events
        -- are gone. Then the events, all of each execution's (no append
        -- can add one while the locks are held), then the refs pointing at
        -- them and their own lineage rows (forks keep theirs: they name
        -- them as history). One statement a table, whatever the batch.
        DELETE FROM loom.snapshots s WHERE s.execution_id = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        rows_deleted := rows_deleted + deleted;
        DELETE FROM loom.events e WHERE e.execution_id = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        rows_deleted := rows_deleted + deleted;
        IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
            PERFORM @extschema@.loom_track_emptied(d.id) FROM unnest(doomed) AS d(id) ORDER BY d.id COLLATE "C";
        END IF;
        DELETE FROM loom.refs r WHERE r.execution_id = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        rows_deleted := rows_deleted + deleted;
        DELETE FROM loom.lineage l WHERE l.execution_id = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        rows_deleted := rows_deleted + deleted;
        -- A finished claim's row (never a scheduled or held one: those
        -- were not taken).
        DELETE FROM loom.claims c WHERE c.execution_id = ANY (doomed) AND c.due_at IS NULL;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        rows_deleted := rows_deleted + deleted;
    END IF;
    executions_deleted := cardinality(doomed);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_idle_executions(interval, text, integer) IS
'One bounded batch of retention by age: pages at most max_rows execution ids after the cursor "after" (NULL: from the first) and deletes, each whole, those whose last event is older than idle_for and that are neither claimed nor scheduled (loom.claims), with their snapshots, events, the refs pointing at them, their lineage row and their finished claim, at most max_rows rows in all but for one execution larger than that, which goes alone. Before deleting them it takes the locks appends hold and checks that each one''s last event has not moved: an append in flight keeps its execution whole. A statement a table per batch, whatever its size. Returns what it paged and deleted, the cursor for the next batch (next_after) and whether the sweep is done; call it again with after => next_after until done.';

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
