-- loom's execution-id order (ADR 0108 D1): Unicode code point order, which
-- is UTF-8 byte order, and so COLLATE "C" in the UTF8 database loom
-- requires (bootstrap.sql), whatever the database's or the arguments'
-- collation. The SQL-standard body is parsed here, under the script's
-- search_path, so the operators, the casts and the collation are
-- pg_catalog's for every caller; it is strict and has no SET clause, so the
-- planner inlines it. Both comparisons name the collation: an argument's
-- own (a nondeterministic one could make 'a' = 'A') never reaches them.
-- The native extension replaces the body with C (native/order.sql).
CREATE FUNCTION @extschema@.loom_compare_execution_ids(a text, b text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (a COLLATE "C" > b COLLATE "C")::integer - (a COLLATE "C" < b COLLATE "C")::integer;
COMMENT ON FUNCTION @extschema@.loom_compare_execution_ids(text, text) IS
'loom''s execution-id and ref-name order: -1, 0 or 1 as a sorts before, with or after b in Unicode code point order (UTF-8 byte order, COLLATE "C"), whatever the database collation. A cursor "after X" means: every id whose comparison with X is 1.';
