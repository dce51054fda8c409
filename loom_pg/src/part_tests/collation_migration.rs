//! The pg_tests of `loom-core/sql/collation_migration.sql`: moving id columns to the C collation under a lock timeout.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{column, one, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn a_lock_wait_of_zero_is_refused_because_it_means_forever() {
        for call in [
            "SELECT loom_ensure_snapshot_zstd(0)",
            "SELECT * FROM loom_migrate_collations(0)",
            "SELECT * FROM loom_migrate_collations(-5)",
            "SELECT loom_convert_column_to_c('events', 'execution_id', 0)",
            "SELECT loom_ensure_snapshot_zstd(NULL)",
        ] {
            assert_eq!(sqlstate_of(call), "22023", "{call}");
        }
        Spi::run("SET LOCAL loom.migration_lock_timeout = '0'").unwrap();
        assert_eq!(sqlstate_of("SELECT loom_migration_lock_timeout()"), "22023");
        Spi::run("SET LOCAL loom.migration_lock_timeout = '750'").unwrap();
        assert_eq!(
            one::<i32>("SELECT loom_migration_lock_timeout()"),
            Some(750)
        );
    }

    #[pg_test]
    fn a_conversion_under_a_statement_timeout_skips_and_converts_without_one() {
        // A column that is not "C" yet, as an upgraded database has. (That
        // the skip takes no lock is checked against a real cluster, in
        // tests/install/migrations.rs: here the ALTER already holds it.)
        Spi::run(r#"ALTER TABLE loom.refs ALTER COLUMN name TYPE text COLLATE "POSIX""#).unwrap();
        Spi::run("SET LOCAL statement_timeout = '30s'").unwrap();
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations()"),
            [
                "skipped: statement_timeout",
                "already COLLATE \"C\"",
                "already COLLATE \"C\"",
                "already COLLATE \"C\""
            ]
        );
        Spi::run("SET LOCAL statement_timeout = 0").unwrap();
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations()"),
            [
                "converted",
                "already COLLATE \"C\"",
                "already COLLATE \"C\"",
                "already COLLATE \"C\""
            ]
        );
    }

    #[pg_test]
    fn converts_the_snapshot_id_column_under_its_views_keeping_their_grants() {
        // An upgraded database's snapshots.execution_id, which two views read.
        Spi::run(
            r#"SELECT loom_alter_under_snapshot_views('ALTER TABLE loom.snapshots ALTER COLUMN execution_id TYPE text COLLATE "POSIX"');
               CREATE ROLE loom_test_reader;
               GRANT SELECT ON loom.snapshots_decoded TO loom_test_reader WITH GRANT OPTION;
               SELECT loom_save_snapshot('a', 'wf', 1, '{"kept":true}', 'zstd');"#,
        )
        .unwrap();
        assert_eq!(
            one::<bool>("SELECT loom_column_is_c('snapshots', 'execution_id')"),
            Some(false)
        );
        Spi::run("SET LOCAL statement_timeout = 0").unwrap();
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations() WHERE column_name = 'loom.snapshots.execution_id'"),
            ["converted"]
        );
        assert_eq!(
            one::<bool>("SELECT loom_column_is_c('snapshots', 'execution_id')"),
            Some(true)
        );
        assert_eq!(
            one::<bool>(
                "SELECT loom_view_is_member('snapshots_decoded') AND loom_view_is_member('snapshots_stored')"
            ),
            Some(true)
        );
        assert_eq!(
            one::<bool>(
                "SELECT has_table_privilege('loom_test_reader', 'loom.snapshots_decoded', 'SELECT WITH GRANT OPTION')"
            ),
            Some(true)
        );
        assert_eq!(
            one::<bool>("SELECT (state->>'kept')::boolean FROM loom.snapshots_decoded"),
            Some(true)
        );
    }

    #[pg_test]
    fn migrate_collations_is_a_lock_free_no_op_on_c_columns() {
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations()"),
            ["already COLLATE \"C\""; 4]
        );
        let locks = one::<i64>(
            "SELECT count(*) FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.mode = 'AccessExclusiveLock' AND l.locktype = 'relation'",
        );
        assert_eq!(locks, Some(0));
    }
}
