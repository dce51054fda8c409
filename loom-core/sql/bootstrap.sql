-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser creating the extension. Every loom object is
-- named by @extschema@ or loom (the #[pg_extern]s' functions too: their
-- portable definitions and native replacements are written by hand), so
-- only pg_catalog is searched; the setting ends with the script.
SET LOCAL search_path = pg_catalog, pg_temp;
-- Comments below hold backslashes in plain literals: read them as written
-- whatever the session's setting (psql -f of the SQL-only script).
SET LOCAL standard_conforming_strings = on;

-- loom's order is UTF-8 byte order (ADR 0108 D1), which is Unicode code
-- point order only in a UTF8 database. Refuse any other, rather than page
-- in an order that silently differs from every client's.
DO $loom$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE EXCEPTION 'loom needs a UTF8 database, and this one is %', pg_catalog.getdatabaseencoding()
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'create the database with ENCODING ''UTF8''';
    END IF;
END
$loom$;
