-- The event log and ref API. Every function states COLLATE "C" itself, so
-- it pages right even on a column an upgrade could not convert (ADR 0108
-- D2), and pins search_path, so that no object a caller can create (a
-- table, an operator) is ever picked up in place of loom's or pg_catalog's.

CREATE FUNCTION loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4)
$$;
COMMENT ON FUNCTION loom_append_event(text, bigint, text, jsonb) IS
'Appends one event to an execution''s log. A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only.';

CREATE FUNCTION loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    appended bigint;
BEGIN
    IF cardinality(execution_ids) <> cardinality(sequences)
       OR cardinality(execution_ids) <> cardinality(kinds)
       OR cardinality(execution_ids) <> cardinality(payloads) THEN
        RAISE EXCEPTION 'loom_append_events needs arrays of one length, got % ids, % sequences, % kinds, % payloads',
            cardinality(execution_ids), cardinality(sequences), cardinality(kinds), cardinality(payloads)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO loom.events (execution_id, sequence, kind, payload)
    SELECT * FROM unnest(execution_ids, sequences, kinds, payloads);
    GET DIAGNOSTICS appended = ROW_COUNT;
    RETURN appended;
END
$$;
COMMENT ON FUNCTION loom_append_events(text[], bigint[], text[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. Arrays of different lengths are invalid_parameter_value (22023).';

CREATE FUNCTION loom_check_page_size(page_size integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF page_size IS NULL OR page_size < 1 THEN
        RAISE EXCEPTION 'page_size must be at least 1, got %', coalesce(page_size::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
COMMENT ON FUNCTION loom_check_page_size(integer) IS
'Refuses a page size below 1 with invalid_parameter_value (22023); used by the loom_list_* pagers.';

CREATE FUNCTION loom_list_executions(after text DEFAULT NULL, page_size integer DEFAULT 1000)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(page_size);
    IF after IS NULL THEN
        RETURN QUERY
            SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e
            ORDER BY 1 LIMIT page_size;
    ELSE
        RETURN QUERY
            SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e
            WHERE e.execution_id COLLATE "C" > after COLLATE "C"
            ORDER BY 1 LIMIT page_size;
    END IF;
END
$$;
COMMENT ON FUNCTION loom_list_executions(text, integer) IS
'One page of distinct execution ids strictly after the cursor "after" (any string, not only a stored id; NULL for the first page), in Unicode code point order (COLLATE "C") whatever the database collation. The next cursor is the page''s last id; a page shorter than page_size is the last.';

CREATE FUNCTION loom_put_ref(name text, execution_id text, sequence bigint)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO loom.refs AS r (name, execution_id, sequence) VALUES ($1, $2, $3)
    ON CONFLICT (name) DO UPDATE
        SET execution_id = excluded.execution_id, sequence = excluded.sequence, updated_at = now()
$$;
COMMENT ON FUNCTION loom_put_ref(text, text, bigint) IS
'Creates or moves the branch ref "name" to (execution_id, sequence).';

CREATE FUNCTION loom_delete_ref(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (DELETE FROM loom.refs r WHERE r.name = $1 RETURNING 1)
    SELECT count(*) > 0 FROM deleted
$$;
COMMENT ON FUNCTION loom_delete_ref(text) IS
'Deletes the branch ref "name"; true when it existed.';

CREATE FUNCTION loom_list_refs(after text DEFAULT NULL, page_size integer DEFAULT 1000)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_page_size(page_size);
    IF after IS NULL THEN
        RETURN QUERY
            SELECT r.name COLLATE "C" FROM loom.refs r ORDER BY 1 LIMIT page_size;
    ELSE
        RETURN QUERY
            SELECT r.name COLLATE "C" FROM loom.refs r
            WHERE r.name COLLATE "C" > after COLLATE "C"
            ORDER BY 1 LIMIT page_size;
    END IF;
END
$$;
COMMENT ON FUNCTION loom_list_refs(text, integer) IS
'One page of ref names strictly after the cursor "after" (any string; NULL for the first page), in Unicode code point order (COLLATE "C") whatever the database collation.';
