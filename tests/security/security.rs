//! Attackers against a real cluster (issue 16): a role with no grants, a
//! reader and a writer each try every function loom installs — called in
//! an open transaction under a hostile `search_path`, and, where it
//! returns `trigger`, attached to a table of their own whose `execution_id`
//! is a type they own with an assignment cast that would make them
//! superuser. Meanwhile an honest writer's append must finish within its
//! lock timeout. The suite prints what was tried, by whom, what happened
//! and what was gained, which must be nothing.
//!
//! Beside it: the races and isolation levels around who keeps
//! `loom.executions`, and the migration lock naming its holder.

use std::thread;
use std::time::{Duration, Instant};

use loom_harness::{describe, hostile_roles, runtime, sqlstate, Cluster};
use pgloom::migrate::{migrate, MigrateOptions};

#[test]
fn no_role_gains_anything_through_any_function_loom_installs() {
    hostile_roles::no_role_gains_anything_through_any_function_loom_installs(
        &hostile_roles::Place::extension(Cluster::C, "loom_sec_hostile"),
    );
}

#[test]
fn a_batch_queued_behind_the_trigger_drop_is_still_tracked() {
    // loom_prepare_node_for_citus (what loom_distribute runs on each node)
    // drops the triggers while a batch waits on its lock: the batch lands
    // without them, and loom's function must track it.
    let db = "loom_sec_queued";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute("BEGIN; LOCK TABLE loom.events IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let appender = thread::spawn(move || {
        let mut client = Cluster::C.connect(db);
        client
            .query_one(
                "SELECT loom_append_events(ARRAY['q1', 'q2'], ARRAY[1, 1]::bigint[],
                                           ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[])",
                &[],
            )
            .map(|r| r.get::<_, i64>(0))
    });
    // The batch is queued on the lock before the triggers go.
    let mut watcher = Cluster::C.connect(db);
    let deadline = Instant::now() + Duration::from_secs(10);
    while watcher
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'loom.events'::regclass",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(Instant::now() < deadline, "the append never queued");
        thread::sleep(Duration::from_millis(20));
    }
    admin
        .batch_execute(
            "DROP TRIGGER events_track_inserted_executions ON loom.events;
             DROP TRIGGER events_track_deleted_executions ON loom.events;
             DROP TRIGGER events_track_truncated_executions ON loom.events;
             COMMIT",
        )
        .unwrap();
    assert_eq!(appender.join().unwrap().unwrap(), 2);
    let listed: Vec<String> = admin
        .query("SELECT * FROM loom_list_executions()", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(listed, ["q1", "q2"]);
}

#[test]
fn appends_outside_read_committed_are_refused_up_front() {
    // One snapshot for the transaction failed late (40001) once another
    // session created the execution's index row after it: now refused at
    // once, by the API and by a direct INSERT alike, with one error.
    let db = "loom_sec_isolation";
    let mut client = Cluster::C.fresh_database(db);
    let mut other = Cluster::C.connect(db);
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        client
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}; SELECT 1"))
            .unwrap();
        other
            .execute("SELECT loom_append_event('shared', 1, 's', '{}')", &[])
            .ok();
        for statement in [
            "SELECT loom_append_event('shared', 2, 's', '{}')",
            "SELECT loom_append_events(ARRAY['shared'], ARRAY[3]::bigint[], ARRAY['s'], ARRAY['{}']::jsonb[])",
            "INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ('shared', 4, 's', '{}')",
            "SELECT loom_delete_events('shared')",
        ] {
            let err = client.batch_execute(statement).unwrap_err();
            let db_error = err.as_db_error().expect("a server error");
            assert_eq!(db_error.code().code(), "0A000", "{isolation}: {statement}");
            assert!(
                db_error.message().contains("READ COMMITTED"),
                "{}",
                db_error.message()
            );
            client.batch_execute("ROLLBACK; BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
        }
        client.batch_execute("ROLLBACK").unwrap();
    }
    client
        .execute("SELECT loom_append_event('shared', 2, 's', '{}')", &[])
        .unwrap();
}

/// Issue 34: a role loom never granted anything holds the advisory keys
/// loom's migration lock and stripes were until 0.14.0, and stalls
/// nothing: `migrate()` runs through, appends and deletes run through. It
/// cannot take the locks they are now, either. The real lock, held by a
/// superuser's session that never ends, is named in each WARNING while a
/// migration waits, and in the error when the bounded wait gives up.
#[test]
fn a_role_with_no_grants_stalls_no_migration_and_a_wait_names_the_holder() {
    let rt = runtime();
    let db = "loom_sec_migration_lock";
    let _ = Cluster::C.fresh_database(db);
    let mut admin = Cluster::C.connect(db);
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE loom_sec_stranger LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        )
        .unwrap();
    let mut stranger = Cluster::C.connect_as(db, "loom_sec_stranger");
    stranger
        .batch_execute(
            "SELECT pg_advisory_lock(1819242349);
             SELECT pg_advisory_lock(1819242349, s) FROM generate_series(0, 63) s;",
        )
        .unwrap();
    for (statement, what) in [
        (
            "BEGIN; LOCK TABLE loom.migration_lock IN SHARE UPDATE EXCLUSIVE MODE",
            "the migration lock",
        ),
        (
            "BEGIN; SELECT FROM loom.stripes WHERE stripe = 0 FOR KEY SHARE",
            "a stripe",
        ),
        (
            "BEGIN; SELECT public.loom_take_migration_lock()",
            "the migration lock's function",
        ),
    ] {
        let refused = stranger.batch_execute(statement).unwrap_err();
        assert_eq!(
            sqlstate(&refused),
            "42501",
            "{what}: {}",
            describe(&refused)
        );
        stranger.batch_execute("ROLLBACK").unwrap();
    }
    let started = Instant::now();
    let mut options = MigrateOptions::new();
    options.migration_lock_wait(Duration::from_secs(5));
    rt.block_on(migrate(&Cluster::C.database(db), &options))
        .unwrap_or_else(|e| panic!("migrate beside the stranger: {e}"));
    admin
        .batch_execute(
            "SET lock_timeout = '5s';
             SELECT public.loom_append_event('held', 1::bigint, 's'::text, '{}'::jsonb, NULL::jsonb);
             SELECT public.loom_delete_execution('held'::text, 10000);",
        )
        .unwrap_or_else(|e| panic!("writes beside the stranger: {}", describe(&e)));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    stranger
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();

    // The real lock, held by a session that never ends.
    let mut holder = Cluster::C.connect(db);
    holder
        .batch_execute(
            "SET application_name = 'squatter'; BEGIN; SELECT public.loom_take_migration_lock()",
        )
        .unwrap();
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let (mut migrator, warnings) = Cluster::C.connect_collecting_warnings(db);
    let gave_up = migrator
        .batch_execute(
            "SET loom.migration_lock_report_ms = 200; SET loom.migration_lock_wait_ms = 900;
             BEGIN; SELECT public.loom_take_migration_lock(); COMMIT",
        )
        .unwrap_err();
    assert_eq!(sqlstate(&gave_up), "55P03", "{}", describe(&gave_up));
    migrator.batch_execute("ROLLBACK").unwrap();
    let named = format!("pid {holder_pid} (role postgres, application 'squatter'");
    assert!(
        describe(&gave_up).contains(&named),
        "{}",
        describe(&gave_up)
    );
    let warnings = warnings.lock().unwrap().clone();
    assert!(
        warnings.len() >= 2 && warnings.iter().all(|w| w.contains(&named)),
        "{warnings:?}"
    );
    // migrate() gives up the same way, with the holder in its typed error.
    let mut options = MigrateOptions::new();
    options.migration_lock_wait(Duration::from_millis(500));
    match rt.block_on(migrate(&Cluster::C.database(db), &options)) {
        Err(pgloom::Error::MigrationLockTimeout { holders, .. }) => {
            assert!(holders.contains(&format!("pid {holder_pid}")), "{holders}");
        }
        other => panic!("expected MigrationLockTimeout, got {other:?}"),
    }
    // A wait shorter than the holder's transaction goes through once it ends.
    let waiter = thread::spawn(move || {
        migrator
            .batch_execute("SET loom.migration_lock_wait_ms = 20000; BEGIN; SELECT public.loom_take_migration_lock(); COMMIT")
            .map_err(|e| describe(&e))
    });
    thread::sleep(Duration::from_millis(500));
    holder.batch_execute("COMMIT").unwrap();
    waiter.join().unwrap().unwrap();
}
