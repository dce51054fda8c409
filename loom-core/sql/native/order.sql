-- The native extension's body for loom_compare_execution_ids: the portable
-- definition in ../order.sql is the contract (signature, attributes,
-- comment); this replaces only its body with the C function in loom.so.
-- CREATE OR REPLACE keeps the function's OID, owner, ACL and comment (and
-- so every dependent object), and PostgreSQL refuses it if the result type
-- or a parameter name changed: the two flavours cannot drift apart there.
CREATE OR REPLACE FUNCTION @extschema@.loom_compare_execution_ids(a text, b text) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_compare_execution_ids_wrapper';
