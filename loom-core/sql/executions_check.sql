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
