-- loom 0.9.0 -> 0.10.0 (issue 26): operations at a hundred million events.
-- loom_status() answers from catalogs and statistics alone: it no longer
-- checks the executions index whole (one descent per id, 16 s at a million
-- executions) nor counts snapshots exactly (a pass over loom.snapshots).
-- The check is loom_verify_executions, in batches that hold no writer
-- back; the repair is loom_repair_executions, online, in batches that lock
-- only the ids they change (loom_rebuild_executions stays, for a database
-- with no writers). loom_delete_idle_executions deletes a batch in one
-- statement a table, locking its executions at once
-- (loom_lock_idle_executions and loom_lock_executions_for_delete, which
-- take every stripe in ascending order, replace loom_lock_idle_execution,
-- which took them id by id).
\echo Use "ALTER EXTENSION loom UPDATE TO '0.10.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- As loom_pg/src/sql/log_api.sql defines it for a fresh install.
CREATE FUNCTION @extschema@.loom_lock_executions_for_delete(execution_ids text[])
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'loom_lock_executions_for_delete_wrapper';
COMMENT ON FUNCTION @extschema@.loom_lock_executions_for_delete(text[]) IS
'Takes, to the end of the transaction, the exclusive locks on the stripes of many execution ids at once, in ascending stripe order as a delete statement does: what a retention batch and a repair batch take, so they cannot deadlock with appends over several stripes. The owner''s alone.';

-- The retention batch's lock, for a whole page at once: created and granted
-- to every role that held the one it replaces, which then goes (only
-- loom_delete_idle_executions called it).
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
    -- the column's.
    id text COLLATE "default";
    ids text[] COLLATE "default";
    sequences bigint[];
    ats timestamptz[];
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
        FOR id IN SELECT DISTINCT i.id COLLATE "C" FROM unnest(ids) AS i(id) ORDER BY 1 LOOP
            PERFORM 1 FROM loom.executions x WHERE x.execution_id = id FOR UPDATE;
        END LOOP;
    ELSE
        PERFORM 1 FROM loom.executions x WHERE x.execution_id = ANY (ids)
        ORDER BY x.execution_id FOR UPDATE;
    END IF;
    -- A fresh snapshot, walked one execution a step: its last event still
    -- the one given, and the rows it holds, counted no further than what
    -- is left of the batch needs; the walk ends after the first that does
    -- not fit, or once the batch is spent.
    RETURN QUERY
        WITH RECURSIVE walk(n, id, size, moved, fits, used) AS (
            -- One collation for the id column whatever the caller's
            -- (PL/pgSQL takes its arguments' collation).
            SELECT 0, NULL::text COLLATE "C", 0::bigint, false, true, 0::bigint
            UNION ALL
            SELECT w.n + 1, ids[w.n + 1] COLLATE "C", s.size, s.size IS NULL,
                   s.size IS NULL OR w.used + s.size <= max_rows OR w.used = 0,
                   w.used + coalesce(s.size, 0)
            FROM walk w
            LEFT JOIN LATERAL (
                SELECT (SELECT count(*) FROM (SELECT 1 FROM loom.events e
                                              WHERE e.execution_id = ids[w.n + 1] LIMIT max_rows - w.used + 1) AS k)
                     + (SELECT count(*) FROM (SELECT 1 FROM loom.snapshots s
                                              WHERE s.execution_id = ids[w.n + 1] LIMIT max_rows - w.used + 1) AS k) AS size
                FROM (SELECT e.sequence, e.created_at FROM loom.events e
                      WHERE e.execution_id = ids[w.n + 1] ORDER BY e.sequence DESC LIMIT 1) AS now_last
                WHERE now_last.sequence = sequences[w.n + 1] AND now_last.created_at = ats[w.n + 1]
            ) s ON true
            WHERE w.fits AND w.used < max_rows AND w.n < coalesce(cardinality(ids), 0)
        )
        SELECT w.id, w.size, w.fits FROM walk w
        WHERE w.n > 0 AND NOT w.moved
        ORDER BY w.n;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer) IS
'Takes the locks appends to the given executions hold (their stripes, exclusively, all at once in ascending order; then, in id order, their loom.executions rows) to the end of the transaction, waiting for appends that have started, then returns, in id order, those whose last event is still the one given (sequence and created_at), each with the rows a delete of it takes (counted no further than max_rows needs) and whether it fits what is left of max_rows: it stops after the first that does not (taken false), and after max_rows is spent; one larger than max_rows is taken alone. What loom_delete_idle_executions asks before it deletes. 22023 unless the three arrays have one length. Executable only by writers.';

REVOKE EXECUTE ON FUNCTION
    @extschema@.loom_lock_executions_for_delete(text[]),
    @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer)
FROM PUBLIC;
DO $loom$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT format('%I', r.rolname)
        FROM pg_proc p, aclexplode(p.proacl) a, pg_roles r
        WHERE p.oid = '@extschema@.loom_lock_idle_execution(text, bigint, timestamptz)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee = r.oid AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer) TO %s', grantee);
    END LOOP;
END
$loom$;
CREATE OR REPLACE FUNCTION @extschema@.loom_delete_idle_executions(idle_for interval, after text DEFAULT NULL, max_rows integer DEFAULT 10000)
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
    END IF;
    executions_deleted := cardinality(doomed);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_idle_executions(interval, text, integer) IS
'One bounded batch of retention by age: pages at most max_rows execution ids after the cursor "after" (NULL: from the first) and deletes, each whole, those whose last event is older than idle_for (their snapshots, events, the refs pointing at them and their lineage row), at most max_rows rows in all but for one execution larger than that, which goes alone. Before deleting them it takes the locks appends hold and checks that each one''s last event has not moved: an append in flight keeps its execution whole. A statement a table per batch, whatever its size. Returns what it paged and deleted, the cursor for the next batch (next_after) and whether the sweep is done; call it again with after => next_after until done.';

DROP FUNCTION @extschema@.loom_lock_idle_execution(text, bigint, timestamptz);

-- As loom_pg/src/sql/log_api.sql defines them for a fresh install: the
-- delete functions take the execution's stripe before its rows, as appends
-- now take theirs (shared) before they insert; writers may take it.
CREATE OR REPLACE FUNCTION @extschema@.loom_delete_events(execution_id text, through_sequence bigint DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    -- The execution's stripe first, exclusively, as a retention batch
    -- takes it: appends take it (shared) before they insert, so an append
    -- of a key this deletes waits here, not on the key with the stripe
    -- held, which deadlocks with this delete's trigger taking the stripe
    -- after its rows. Writers may take it (loom_grant_access); a role
    -- granted DELETE by hand deletes as before 0.10.0, its trigger taking
    -- the stripe after the rows.
    IF has_function_privilege('@extschema@.loom_lock_execution_for_delete(text)', 'EXECUTE') THEN
        PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
    END IF;
    -- One bounded batch, oldest first: row locks on at most max_rows rows,
    -- held for one short statement. Call again until it returns 0.
    DELETE FROM loom.events e
    WHERE e.execution_id = loom_delete_events.execution_id
      AND e.sequence IN (
          SELECT d.sequence FROM loom.events d
          WHERE d.execution_id = loom_delete_events.execution_id
            AND (through_sequence IS NULL OR d.sequence <= through_sequence)
          ORDER BY d.sequence LIMIT max_rows);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted > 0 AND NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        PERFORM @extschema@.loom_track_emptied(execution_id);
    END IF;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_events(text, bigint, integer) IS
'Deletes one batch of at most max_rows events of an execution with a sequence up to through_sequence (NULL: all of them), oldest first, and returns how many: call it until it returns 0. Each call holds row locks on its batch only.';

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
    -- The execution's stripe first, exclusively, before any of its rows:
    -- snapshot saves and appends take it before theirs (see
    -- loom_delete_events, and its exception).
    IF has_function_privilege('@extschema@.loom_lock_execution_for_delete(text)', 'EXECUTE') THEN
        PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
    END IF;
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

COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) IS
'Takes, to the end of the transaction, the exclusive lock on the stripe of an execution id that appends hold shared: what loom_delete_events and loom_delete_execution take before they delete, and loom_track_emptied before it looks for events left. Advisory lock (classid 1819242349, objid the stripe 0-63, objsubid 3) in pg_locks. Executable by writers.';
DO $loom$
DECLARE
    grantee text;
BEGIN
    -- Every role that could delete events through loom's functions: the
    -- writers (EXECUTE on loom_track_emptied) and any role granted DELETE
    -- on loom.events directly.
    FOR grantee IN
        SELECT DISTINCT format('%I', r.rolname)
        FROM (SELECT p.proacl AS acl, p.proowner AS owner, 'EXECUTE' AS privilege FROM pg_proc p
              WHERE p.oid = '@extschema@.loom_track_emptied(text)'::regprocedure
              UNION ALL
              SELECT c.relacl, c.relowner, 'DELETE' FROM pg_class c
              WHERE c.oid = 'loom.events'::regclass) o,
             aclexplode(o.acl) a, pg_roles r
        WHERE a.privilege_type = o.privilege AND a.grantee = r.oid AND a.grantee <> o.owner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) TO %s', grantee);
    END LOOP;
END
$loom$;

-- As loom_pg/src/sql/executions_check.sql defines them for a fresh install.
-- The executions index (loom.executions) checked against the log, and
-- repaired, online, a range of ids at a time (issue 26). loom_status()
-- used to check it whole, one index descent per id, inside a command meant
-- for monitoring (16 s at a million executions); loom_rebuild_executions()
-- holds every writer back for a pass over the log. Here each batch covers
-- the ids after a cursor up to the max_ids-th of either side, and confirms
-- each disagreement in one snapshot, so a write in flight is never taken
-- for one.

-- One batch's comparison: the next max_ids distinct ids of the log (a
-- loose scan of events_pkey, a descent each; on Citus, which runs no
-- recursive query over shards, a DISTINCT pushed down to them) and of the
-- index (an index-only scan), cut at the smaller of the two last ids so
-- that each side was read whole up to the cut. The sides are read by two
-- statements, so an id that disagrees between them is looked at again,
-- both sides in one snapshot, in which the trigger keeps them in step (an
-- append's index row commits with its events): a write that committed
-- between the two reads is never taken for a disagreement.
CREATE FUNCTION @extschema@.loom_executions_compared(after text, max_ids integer)
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
                  HINT = 'convert it first: SET statement_timeout = 0; SELECT * FROM loom_migrate_collations(); (loom status says what is pending)';
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

CREATE FUNCTION @extschema@.loom_verify_executions(after text DEFAULT NULL, max_ids integer DEFAULT 10000)
RETURNS TABLE(checked bigint, missing bigint, orphaned bigint, next_after text, done boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_ids);
    RETURN QUERY
        SELECT c.checked, cardinality(c.missing)::bigint, cardinality(c.orphaned)::bigint, c.next_after, c.done
        FROM @extschema@.loom_executions_compared(after, max_ids) c;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_verify_executions(text, integer) IS
'One batch of the check that loom.executions holds exactly the execution ids of loom.events: the ids after the cursor "after" (NULL: from the first) up to the max_ids-th of either, read in one snapshot with no lock a writer waits on. Returns how many ids it checked, how many of the log''s are missing from the index and how many of the index''s have no events, the cursor for the next batch and whether the check is done; call it again with after => next_after until done. What loom status --verify runs. A reader may call it.';

CREATE FUNCTION @extschema@.loom_repair_executions(after text DEFAULT NULL, max_ids integer DEFAULT 1000)
RETURNS TABLE(checked bigint, added bigint, removed bigint, next_after text, done boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    batch record;
    id text COLLATE "default";
    changed bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_ids);
    PERFORM @extschema@.loom_require_read_committed('repaired');
    SELECT * INTO batch FROM @extschema@.loom_executions_compared(after, max_ids);
    added := 0;
    removed := 0;
    IF cardinality(batch.missing) + cardinality(batch.orphaned) > 0 THEN
        -- Only the ids that disagree are locked, as a delete of their last
        -- events locks them (their stripes at once, in ascending order;
        -- then each row), and looked at again in a fresh statement: an
        -- append or a delete in flight is waited for, and what it did is
        -- seen. Writers to other executions never wait.
        PERFORM @extschema@.loom_lock_executions_for_delete(batch.missing || batch.orphaned);
        FOR id IN SELECT u.id FROM unnest(batch.missing || batch.orphaned) AS u(id) ORDER BY u.id COLLATE "C" LOOP
            PERFORM 1 FROM loom.executions x WHERE x.execution_id = id FOR UPDATE;
            INSERT INTO loom.executions (execution_id)
            SELECT e.execution_id FROM loom.events e WHERE e.execution_id = id LIMIT 1
            ON CONFLICT (execution_id) DO NOTHING;
            GET DIAGNOSTICS changed = ROW_COUNT;
            added := added + changed;
            DELETE FROM loom.executions x
            WHERE x.execution_id = id
              AND NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = id);
            GET DIAGNOSTICS changed = ROW_COUNT;
            removed := removed + changed;
        END LOOP;
    END IF;
    checked := batch.checked;
    next_after := batch.next_after;
    done := batch.done;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_repair_executions(text, integer) IS
'One batch of the online repair of loom.executions: checks the ids after the cursor "after" (NULL: from the first) up to the max_ids-th of the log or the index, as loom_verify_executions does, then adds each id of the log missing from the index and removes each id without events, holding back only appends to the executions it changes (their stripes and rows) until the batch commits. Returns how many ids it checked, added and removed, the cursor for the next batch and whether the repair is done; call it again with after => next_after, committing between calls, until done (what loom repair does). Refused (0A000) outside READ COMMITTED. The owner''s to call.';
REVOKE EXECUTE ON FUNCTION @extschema@.loom_repair_executions(text, integer) FROM PUBLIC;

-- As loom_pg/src/sql/status.sql defines it for a fresh install.
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
                        @extschema@.loom_lock_execution_for_delete(text),
                        @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer),
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
                    @extschema@.loom_lock_execution_for_delete(text),
                    @extschema@.loom_lock_idle_executions(text[], bigint[], timestamptz[], integer),
                    @extschema@.loom_lock_execution_for_write(text) FROM %s', role_name);
    EXECUTE format('REVOKE USAGE ON SCHEMA loom FROM %s', role_name);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_revoke_access(regrole) IS
'Revokes from a role every privilege on loom''s tables, views and index-keeping functions, and USAGE on schema loom. The owner''s to call.';
