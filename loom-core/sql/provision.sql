-- A fresh install has the frame column from the start: its table is empty,
-- so adding it waits for no lock, and pg_restore recreates the extension
-- before it copies rows (state_z included) into it. An upgrade never adds
-- it: an existing deployment opts in (ADR 0141 D5, D9).
-- In a DO block, so that psql -f of the SQL-only script prints no rows.
DO $loom$
BEGIN
    PERFORM @extschema@.loom_define_snapshots_decoded();
    PERFORM @extschema@.loom_ensure_snapshot_zstd();
END
$loom$;
