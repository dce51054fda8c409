//! loom's privilege model (docs/sql-api.md, "Privileges"), one pg_test per kind of
//! role: what it can do through loom, and that it gains nothing else. The
//! model itself is SQL (`sql/privileges.sql`): loom's functions run as
//! their caller, but for the few that keep `loom.executions` (owner, and
//! writers on Citus) and the owner's migrations.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// The SQLSTATE `query` fails with ("no error" when it succeeds), run
    /// as `role` in a subtransaction that is rolled back either way.
    fn as_role(role: &str, query: &str) -> String {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.as_role(r text, q text) RETURNS text LANGUAGE plpgsql AS $$
             DECLARE outcome text;
             BEGIN
                 BEGIN
                     EXECUTE format('SET LOCAL ROLE %I', r);
                     EXECUTE q;
                     outcome := 'no error';
                     RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
                 EXCEPTION WHEN OTHERS THEN
                     IF outcome IS NULL THEN outcome := SQLSTATE; END IF;
                 END;
                 RETURN outcome;
             END $$",
        )
        .unwrap();
        Spi::get_one::<String>(&format!(
            "SELECT pg_temp.as_role({}, {})",
            pgrx::spi::quote_literal(role),
            pgrx::spi::quote_literal(query)
        ))
        .unwrap()
        .unwrap()
    }

    fn count(query: &str) -> i64 {
        Spi::get_one::<i64>(query).unwrap().unwrap()
    }

    /// Some history for each role to try to read, lock or spoil.
    fn seed() {
        Spi::run(
            r#"SELECT loom_append_events(ARRAY['e1', 'e2'], ARRAY[1, 1]::bigint[],
                                        ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[]);
               SELECT loom_save_snapshot('e1', 'wf', 1, '{"a":1}', 'zstd');
               SELECT loom_put_ref('main', 'e1', 1);"#,
        )
        .unwrap();
    }

    /// What every role but the owner is refused: DDL, migrations,
    /// distribution, the index keepers' definer functions and trigger.
    fn assert_owner_only(role: &str) {
        for query in [
            "SELECT loom_migrate_collations(100)",
            "SELECT loom_convert_column_to_c('events', 'execution_id', 100)",
            "SELECT loom_alter_under_snapshot_views('SELECT 1')",
            "SELECT loom_define_snapshots_decoded()",
            "SELECT loom_rebuild_executions()",
            "SELECT loom_prepare_node_for_citus(100)",
            "SELECT loom_distribute(4, 100)",
            "SELECT loom_take_migration_lock()",
            "SELECT loom_grant_access(current_user::regrole, 'writer')",
            "SELECT loom_revoke_access(current_user::regrole)",
            "TRUNCATE loom.executions",
            "INSERT INTO loom.executions VALUES ('phantom')",
            "DELETE FROM loom.executions",
            "ALTER TABLE loom.events DISABLE TRIGGER USER",
            // The definer trigger function, attached to a table of the
            // role's own: EXECUTE is checked here.
            "CREATE TEMP TABLE mine (execution_id text);
             CREATE TRIGGER t AFTER TRUNCATE ON mine FOR EACH STATEMENT EXECUTE FUNCTION loom_events_track_executions()",
        ] {
            assert_eq!(as_role(role, query), "42501", "{role}: {query}");
        }
    }

    #[pg_test]
    fn a_role_without_grants_gets_nothing_of_loom() {
        seed();
        Spi::run("CREATE ROLE loom_t_nobody").unwrap();
        let role = "loom_t_nobody";
        // No read, no write, no lock on any execution's row.
        for query in [
            "SELECT loom_list_executions()",
            "SELECT loom_read_events('e1')",
            "SELECT loom_load_snapshot('e1')",
            "SELECT loom_resume('e1')",
            "SELECT loom_list_refs()",
            "SELECT loom_append_event('e1', 2, 's', '{}')",
            "SELECT loom_append_events(ARRAY['x'], ARRAY[1]::bigint[], ARRAY['s'], ARRAY['{}']::jsonb[])",
            "SELECT loom_save_snapshot('e1', 'wf', 2, '{}')",
            "SELECT loom_put_ref('main', 'e2', 1)",
            "SELECT loom_delete_execution('e1')",
            "SELECT loom_prune_events('e1')",
            "SELECT loom_track_appended(ARRAY['e1', 'e2'])",
            "SELECT loom_track_emptied('e1')",
            "SELECT * FROM loom.snapshots_decoded",
        ] {
            assert_eq!(as_role(role, query), "42501", "{query}");
        }
        assert_owner_only(role);
        // What PUBLIC keeps touches no table: decoding and the id order.
        assert_eq!(
            as_role(
                role,
                r#"SELECT loom_snapshot_state(loom_snapshot_frame('{"a":1}'::text)),
                          loom_compare_execution_ids('a', 'B')"#
            ),
            "no error"
        );
        assert_eq!(count("SELECT count(*) FROM loom.executions"), 2);
    }

    #[pg_test]
    fn a_reader_pages_and_reads_and_blocks_no_writer() {
        seed();
        Spi::run("CREATE ROLE loom_t_reader; SELECT loom_grant_access('loom_t_reader', 'reader')")
            .unwrap();
        let role = "loom_t_reader";
        for query in [
            "SELECT loom_list_executions()",
            "SELECT loom_read_events('e1', 0)",
            "SELECT loom_load_snapshot('e1')",
            "SELECT loom_resume('e1')",
            "SELECT loom_list_refs()",
            "SELECT state->'a' FROM loom.snapshots_decoded",
        ] {
            assert_eq!(as_role(role, query), "no error", "{query}");
        }
        // Nothing that writes, and no lock a writer would wait on.
        for query in [
            "SELECT loom_append_event('e1', 2, 's', '{}')",
            "SELECT loom_save_snapshot('e1', 'wf', 2, '{}')",
            "SELECT loom_put_ref('main', 'e2', 1)",
            "SELECT loom_delete_execution('e1')",
            "SELECT loom_track_appended(ARRAY['e1', 'e2'])",
            "SELECT 1 FROM loom.executions FOR UPDATE",
            "SELECT 1 FROM loom.events FOR KEY SHARE",
            "LOCK TABLE loom.executions IN SHARE MODE",
            "LOCK TABLE loom.events IN SHARE MODE",
        ] {
            assert_eq!(as_role(role, query), "42501", "{query}");
        }
        assert_owner_only(role);
    }

    #[pg_test]
    fn a_writer_appends_saves_and_keeps_retention_but_no_ddl() {
        seed();
        Spi::run("CREATE ROLE loom_t_writer; SELECT loom_grant_access('loom_t_writer', 'writer')")
            .unwrap();
        let role = "loom_t_writer";
        for query in [
            "SELECT loom_append_event('w', 1, 's', '{}')",
            "SELECT loom_append_events(ARRAY['w', 'v'], ARRAY[2, 1]::bigint[], ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[])",
            r#"SELECT loom_save_snapshot('w', 'wf', 2, '{"b":2}', 'zstd')"#,
            "SELECT loom_put_ref('w-main', 'w', 2)",
            "SELECT loom_prune_events('e1')",
            "SELECT loom_delete_execution('e2')",
            "SELECT loom_list_executions()",
            // Where no trigger keeps the index (Citus), loom's functions
            // call these as the writer.
            "SELECT loom_track_appended(ARRAY['e1'])",
            "SELECT loom_track_emptied('e1')",
        ] {
            assert_eq!(as_role(role, query), "no error", "{query}");
        }
        // A duplicate is the append-only log's 23505, not a privilege error.
        assert_eq!(
            as_role(role, "SELECT loom_append_event('e1', 1, 's', '{}')"),
            "23505"
        );
        assert_owner_only(role);
        // And revoking takes it all back.
        Spi::run("SELECT loom_revoke_access('loom_t_writer')").unwrap();
        assert_eq!(
            as_role(role, "SELECT loom_append_event('w', 9, 's', '{}')"),
            "42501"
        );
        assert_eq!(
            as_role(role, "SELECT loom_track_appended(ARRAY['e1'])"),
            "42501"
        );
    }

    #[pg_test]
    fn the_owner_migrates_distributes_and_grants() {
        seed();
        assert_eq!(
            Spi::get_one::<i64>(
                "SELECT count(*) FROM loom_migrate_collations(100) WHERE outcome = 'already COLLATE \"C\"'"
            )
            .unwrap(),
            Some(4)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT loom_ensure_snapshot_zstd()").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT loom_rebuild_executions()").unwrap(),
            Some(0)
        );
        Spi::run(
            "CREATE ROLE loom_t_granted; SELECT loom_grant_access('loom_t_granted', 'reader')",
        )
        .unwrap();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT has_table_privilege('loom_t_granted', 'loom.snapshots_decoded', 'SELECT')
                    AND NOT has_any_column_privilege('loom_t_granted', 'loom.events', 'INSERT')"
            )
            .unwrap(),
            Some(true)
        );
        assert_eq!(
            as_role(
                "loom_t_granted",
                "SELECT loom_grant_access('loom_t_granted', 'writer')"
            ),
            "42501"
        );
        // An unknown access is refused, naming what there is.
        assert_eq!(
            as_role(
                "postgres",
                "SELECT loom_grant_access('loom_t_granted', 'admin')"
            ),
            "22023"
        );
    }

    /// Writers insert loom.events column by column (0.16.0, so that none
    /// names the change feed's positions): the roles a writer passed
    /// INSERT on to keep their columns when it is granted again, and a
    /// metadata column an update could only add later is granted to them
    /// (reviews of issue 38).
    #[pg_test]
    fn column_writers_keep_what_they_passed_on_and_get_a_late_metadata_column() {
        Spi::run(
            "CREATE ROLE loom_t_svc; CREATE ROLE loom_t_svc_worker;
             GRANT USAGE ON SCHEMA loom TO loom_t_svc;
             GRANT INSERT ON loom.events TO loom_t_svc WITH GRANT OPTION;
             SET ROLE loom_t_svc; GRANT INSERT ON loom.events TO loom_t_svc_worker; RESET ROLE;
             ALTER TABLE loom.events DROP COLUMN metadata;
             SELECT loom_grant_access('loom_t_svc', 'writer');",
        )
        .unwrap();
        let may = |role: &str, column: &str| {
            Spi::get_one::<bool>(&format!(
                "SELECT has_column_privilege('{role}', 'loom.events', '{column}', 'INSERT')"
            ))
            .unwrap()
            .unwrap()
        };
        for role in ["loom_t_svc", "loom_t_svc_worker"] {
            assert!(may(role, "payload"), "{role}");
            assert!(!may(role, "feed_tx"), "{role}");
        }
        assert_eq!(
            Spi::get_one::<String>("SELECT loom_ensure_event_metadata(2000)")
                .unwrap()
                .as_deref(),
            Some("added")
        );
        for role in ["loom_t_svc", "loom_t_svc_worker"] {
            assert!(may(role, "metadata"), "{role}");
            assert!(!may(role, "feed_ord"), "{role}");
        }
    }

    /// Issue 25: `regrole`'s text is quoted already; quoting it again named
    /// another role, one whose name holds the quotes, which anyone with
    /// CREATEROLE could make. Grants and revokes reach the role named.
    #[pg_test]
    fn grants_and_revokes_reach_a_role_whose_name_needs_quotes() {
        Spi::run(
            r#"CREATE ROLE "Orders-Svc";
               CREATE ROLE """Orders-Svc""";
               SELECT loom_grant_access('"Orders-Svc"', 'writer');"#,
        )
        .unwrap();
        let can_append = |role: &str| {
            Spi::get_one::<bool>(&format!(
                "SELECT has_any_column_privilege({}, 'loom.events', 'INSERT')
                    AND has_function_privilege({}, 'loom_lock_idle_executions(text[], bigint[], timestamptz[], integer)', 'EXECUTE')",
                pgrx::spi::quote_literal(role),
                pgrx::spi::quote_literal(role)
            ))
            .unwrap()
            .unwrap()
        };
        assert!(can_append("Orders-Svc"), "the role named is a writer");
        assert!(!can_append("\"Orders-Svc\""), "its decoy is not");
        Spi::run(
            r#"SELECT loom_grant_access('"""Orders-Svc"""', 'reader');
                    SELECT loom_revoke_access('"Orders-Svc"');"#,
        )
        .unwrap();
        assert!(!can_append("Orders-Svc"), "the revoke reached it");
        assert_eq!(
            as_role("Orders-Svc", "SELECT loom_list_executions()"),
            "42501"
        );
        assert_eq!(
            as_role("\"Orders-Svc\"", "SELECT loom_list_executions()"),
            "no error",
            "the decoy keeps its own reader grant"
        );
        // No role has OID 0: not the role named 'unknown (OID=0)'.
        Spi::run(r#"CREATE ROLE "unknown (OID=0)""#).unwrap();
        for call in [
            "SELECT loom_grant_access(0::regrole, 'writer')",
            "SELECT loom_revoke_access(0::regrole)",
        ] {
            assert_eq!(crate::test_support::sqlstate_of(call), "42704", "{call}");
        }
        assert!(!can_append("unknown (OID=0)"));
    }

    #[pg_test]
    fn the_index_keeping_trigger_runs_for_loom_events_alone() {
        // Even attached by a role allowed to (the owner), on any other
        // table it refuses before it reads a transition table.
        seed();
        Spi::run(
            "CREATE TEMP TABLE decoy (execution_id text);
             CREATE TRIGGER decoy_truncate AFTER TRUNCATE ON decoy
                 FOR EACH STATEMENT EXECUTE FUNCTION loom_events_track_executions();
             CREATE TRIGGER decoy_insert AFTER INSERT ON decoy REFERENCING NEW TABLE AS loom_inserted
                 FOR EACH STATEMENT EXECUTE FUNCTION loom_events_track_executions();",
        )
        .unwrap();
        assert_eq!(as_role("postgres", "TRUNCATE decoy"), "42501");
        assert_eq!(
            as_role("postgres", "INSERT INTO decoy VALUES ('phantom')"),
            "42501"
        );
        assert_eq!(count("SELECT count(*) FROM loom.executions"), 2);
    }

    #[pg_test]
    fn disabled_triggers_leave_the_index_to_loom_functions() {
        // After DISABLE TRIGGER USER (or as a logical replica applies), the
        // trigger is there but does not fire: loom's functions keep the
        // index themselves.
        Spi::run("ALTER TABLE loom.events DISABLE TRIGGER USER").unwrap();
        assert_eq!(
            Spi::get_one::<bool>("SELECT loom_executions_tracked_by_trigger()").unwrap(),
            Some(false)
        );
        Spi::run(
            "SELECT loom_append_events(ARRAY['d1', 'd2'], ARRAY[1, 1]::bigint[], ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[]);
             SELECT loom_append_event('d3', 1, 's', '{}');",
        )
        .unwrap();
        assert_eq!(count("SELECT count(*) FROM loom.executions"), 3);
        Spi::run("ALTER TABLE loom.events ENABLE TRIGGER USER; SET LOCAL session_replication_role = replica")
            .unwrap();
        assert_eq!(
            Spi::get_one::<bool>("SELECT loom_executions_tracked_by_trigger()").unwrap(),
            Some(false)
        );
        Spi::run("SELECT loom_append_event('d4', 1, 's', '{}'); SET LOCAL session_replication_role = origin")
            .unwrap();
        assert_eq!(count("SELECT count(*) FROM loom.executions"), 4);
        assert_eq!(count("SELECT loom_rebuild_executions()"), 0);
    }
}
