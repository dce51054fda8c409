//! loom's extension versions against a real ICU en-US cluster: fresh
//! installs and upgrades end in one schema, and the fail-soft migrations of
//! ADR 0108 D3 and ADR 0141 D5 behave as specified under held locks,
//! deadlocks, dependent views and short statement timeouts.

use std::thread;
use std::time::{Duration, Instant};

use loom_harness::{
    collation_of, describe, pager_plan, upgrade_extension, version_key, version_of, Cluster,
    LOOM_VERSION, RELEASED_VERSIONS,
};
use pgloom::conformance::CONFORMANCE_IDS as MIXED;
use postgres::Client;

const CURRENT: &str = LOOM_VERSION;
const ICU: Cluster = Cluster::Icu;

fn all_executions(client: &mut Client) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page: Vec<String> = client
            .query("SELECT * FROM loom_list_executions($1, 4)", &[&after])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        ids.extend(page.iter().cloned());
        if page.len() < 4 {
            return ids;
        }
        after = page.last().cloned();
    }
}

fn load_mixed(client: &mut Client) -> Vec<String> {
    for id in MIXED {
        for sequence in [1i64, 2] {
            client
                .execute(
                    "SELECT loom_append_event($1, $2, 'step', '{}')",
                    &[&id, &sequence],
                )
                .unwrap();
        }
        client
            .execute("SELECT loom_put_ref($1, $1, 2)", &[&id])
            .unwrap();
    }
    let mut sorted: Vec<String> = MIXED.iter().map(|s| s.to_string()).collect();
    sorted.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    sorted
}

#[test]
fn fresh_installs_and_upgrades_dump_the_same_schema() {
    let _fresh = ICU.fresh_database("loom_up_fresh");
    let fresh = ICU.schema_dump("loom_up_fresh");
    assert!(
        fresh.contains("state_z bytea"),
        "the dump shows extension members; a fresh install has the frame column"
    );
    for from in RELEASED_VERSIONS {
        let name = format!("loom_up_from_{}", from.replace('.', "_"));
        let mut client = ICU.fresh_database_at(&name, from);
        upgrade_extension(&mut client, CURRENT).unwrap_or_else(|e| panic!("{}", describe(&e)));
        assert_eq!(version_of(&mut client), CURRENT);
        if version_key(from) >= version_key("0.3.0") {
            // A fresh install of 0.3.0 or later had the frame column from its
            // script.
            assert_same_schema(
                &ICU.schema_dump(&name),
                &fresh,
                &format!("upgrade from {from}"),
            );
            continue;
        }
        assert_frame_lines_only(
            &ICU.schema_dump(&name),
            &fresh,
            &format!("upgrade from {from}"),
        );
        ensure_frames(&mut client);
        assert_same_schema(
            &ICU.schema_dump(&name),
            &fresh,
            &format!("upgrade from {from}, opted in to frames,"),
        );
    }
}

/// An upgrade adds no frame DDL (ADR 0141 D5, D9): until it opts in, an
/// upgraded schema differs from a fresh one by the frame column (and the
/// comma before it), its storage, the check, and the two views over it
/// (the decoded one joins a delta's keyframe only where frames exist).
fn assert_frame_lines_only(upgraded: &str, fresh: &str, what: &str) {
    // PostgreSQL 16+ deparses a one-table view's columns without the
    // table's alias (`state`, where 15 writes `s.state`), and a two-table
    // one's with it: compared without the alias `s.`.
    let unaliased = |dump: &str| -> Vec<String> {
        dump.lines()
            .map(|l| l.replace(" s.", " ").replace("(s.", "("))
            .collect()
    };
    let (fresh, upgraded) = (unaliased(fresh), unaliased(upgraded));
    let only_fresh: Vec<&String> = fresh.iter().filter(|l| !upgraded.contains(l)).collect();
    let only_upgraded: Vec<&String> = upgraded.iter().filter(|l| !fresh.contains(l)).collect();
    assert_eq!(
        only_fresh,
        [
            "    state jsonb NOT NULL,",
            "    state_z bytea",
            "ALTER TABLE ONLY loom.snapshots ALTER COLUMN state_z SET STORAGE EXTERNAL;",
            "    public.loom_snapshot_row_state(state, state_z, b.state_z) AS state",
            "   FROM (loom.snapshots s",
            "     LEFT JOIN loom.snapshots b ON (((b.execution_id = execution_id) AND (b.sequence = public.loom_snapshot_base_sequence(state_z)))));",
            "    state_z",
            "ALTER TABLE loom.snapshots",
            r#"    ADD CONSTRAINT snapshots_frame_sentinel CHECK (((state_z IS NULL) OR (state = '{"__loomEnc": "loom.snapshot-frame/state_z"}'::jsonb))) NOT VALID;"#,
        ],
        "{what}"
    );
    assert_eq!(
        only_upgraded,
        [
            "    state jsonb NOT NULL",
            "    public.loom_snapshot_row_state(state, NULL::bytea, NULL::bytea) AS state",
            "    NULL::bytea AS state_z"
        ],
        "{what}"
    );
}

/// Opts in to zstd frames (ADR 0141 D5), as a zstd store does at start.
fn ensure_frames(client: &mut Client) {
    let ensured: bool = client
        .query_one("SELECT loom_ensure_snapshot_zstd()", &[])
        .unwrap()
        .get(0);
    assert!(ensured);
}

/// Fails with just the lines that differ, not two whole dumps.
fn assert_same_schema(upgraded: &str, fresh: &str, what: &str) {
    let only_upgraded: Vec<String> = upgraded
        .lines()
        .filter(|l| !fresh.lines().any(|f| f == *l))
        .map(|l| l.replace("s.state", "state"))
        .collect();
    // PostgreSQL 16+ deparses a one-table view's columns without the
    // table's alias (`state`, where 15 writes `s.state`).
    let only_fresh: Vec<String> = fresh
        .lines()
        .filter(|l| !upgraded.lines().any(|u| u == *l))
        .map(|l| l.replace("s.state", "state"))
        .collect();
    assert!(
        upgraded == fresh,
        "{what} differs from a fresh install:\nonly after the upgrade: {only_upgraded:#?}\nonly in a fresh install: {only_fresh:#?}"
    );
}

#[test]
fn upgrading_0_1_0_converts_analyzes_and_pages_by_index() {
    let mut client = ICU.fresh_database_at("loom_up_convert", "0.1.0");
    let mut expected = load_mixed(&mut client);
    // Enough rows that the planner prefers the index to a sort.
    client
        .batch_execute(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload)
             SELECT 'bulk-' || i, 1, 'step', '{}' FROM generate_series(1, 20000) i",
        )
        .unwrap();
    expected.extend((1..=20000).map(|i| format!("bulk-{i}")));
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    assert_ne!(collation_of(&mut client, "events", "execution_id"), "C");
    // Correct before the conversion too: every query states COLLATE "C".
    assert_eq!(all_executions(&mut client), expected);
    upgrade_extension(&mut client, "0.2.0").unwrap();
    assert_eq!(collation_of(&mut client, "events", "execution_id"), "C");
    assert_eq!(collation_of(&mut client, "refs", "name"), "C");
    let analyzed: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stats WHERE schemaname = 'loom' AND tablename IN ('events', 'refs')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(analyzed > 0, "the conversion ANALYZEs what it altered");
    let plan = pager_plan(&mut client);
    assert!(
        plan.contains("Index Only Scan using idx_events_exec"),
        "{plan}"
    );
    assert!(!plan.contains("Sort"), "{plan}");
    assert_eq!(all_executions(&mut client), expected);
}

#[test]
fn the_unused_events_index_is_dropped_failing_soft_behind_a_held_lock() {
    let db = "loom_up_index";
    let mut setup = ICU.fresh_database_at(db, "0.6.0");
    setup
        .batch_execute("SELECT loom_append_event('a', 1, 'step', '{}')")
        .unwrap();
    let index_exists = |client: &mut Client| -> bool {
        client
            .query_one(
                "SELECT to_regclass('loom.idx_events_exec') IS NOT NULL",
                &[],
            )
            .unwrap()
            .get(0)
    };
    assert!(index_exists(&mut setup));
    let mut holder = ICU.hold_lock(db, "events", "ACCESS SHARE");
    let (mut client, warnings) = ICU.connect_collecting_warnings(db);
    client
        .batch_execute("SET loom.migration_lock_timeout = 300")
        .unwrap();
    let started = Instant::now();
    upgrade_extension(&mut client, CURRENT).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded: {:?}",
        started.elapsed()
    );
    assert_eq!(version_of(&mut client), CURRENT);
    // The index drop, on the way through 0.11.0 the metadata column, and
    // 0.16.0's change feed columns: each a WARNING that names what to run.
    let seen = warnings.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen[0].contains("could not drop loom.idx_events_exec")
            && seen[0].contains("55P03")
            && seen[0].contains("DROP INDEX loom.idx_events_exec"),
        "{seen:?}"
    );
    assert!(
        seen[1].contains("could not add loom.events.metadata")
            && seen[1].contains("55P03")
            && seen[1].contains("loom_ensure_event_metadata()"),
        "{seen:?}"
    );
    assert!(
        seen[2].contains("could not add the change feed's columns")
            && seen[2].contains("55P03")
            && seen[2].contains("loom_feed_enable()"),
        "{seen:?}"
    );
    // The update landed without it: appends run (the new C path) beside
    // the held lock, and are tracked.
    assert!(index_exists(&mut client));
    client
        .batch_execute("SELECT loom_append_events(ARRAY['b', 'c'], ARRAY[1, 1]::bigint[], ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[])")
        .unwrap();
    assert_eq!(all_executions(&mut client), ["a", "b", "c"]);
    let drop = |client: &mut Client| -> String {
        client
            .query_one("SELECT loom_drop_events_id_index(300)", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(drop(&mut client), "skipped: 55P03");
    holder.batch_execute("COMMIT").unwrap();
    assert_eq!(drop(&mut client), "dropped");
    assert_eq!(drop(&mut client), "already dropped");
    assert!(!index_exists(&mut client));
    let metadata: String = client
        .query_one("SELECT loom_ensure_event_metadata(300)", &[])
        .unwrap()
        .get(0);
    assert_eq!(metadata, "added");
    // What loom_feed_enable does first when the update could not.
    client
        .batch_execute("SELECT loom_feed_add_columns()")
        .unwrap();
    let _fresh = ICU.fresh_database("loom_up_index_fresh");
    assert_same_schema(
        &ICU.schema_dump(db),
        &ICU.schema_dump("loom_up_index_fresh"),
        "0.6.0 updated, its index dropped and its metadata and feed columns added later,",
    );
}

#[test]
fn a_held_lock_makes_the_conversion_fail_soft_and_appends_stall_only_that_long() {
    let db = "loom_up_held";
    let mut setup = ICU.fresh_database_at(db, "0.1.0");
    let expected = load_mixed(&mut setup);
    let mut holder = ICU.hold_lock(db, "events", "ACCESS SHARE");

    // Appends from another connection while the upgrade waits for its lock.
    let appender = thread::spawn(move || {
        let mut client = ICU.connect(db);
        let mut worst = Duration::ZERO;
        let started = Instant::now();
        let mut n = 0i64;
        while started.elapsed() < Duration::from_millis(1500) {
            let t = Instant::now();
            client
                .execute(
                    "SELECT loom_append_event('appender', $1, 'tick', '{}')",
                    &[&n],
                )
                .unwrap();
            worst = worst.max(t.elapsed());
            n += 1;
            thread::sleep(Duration::from_millis(5));
        }
        worst
    });
    thread::sleep(Duration::from_millis(200));
    let (mut client, warnings) = ICU.connect_collecting_warnings(db);
    client
        .batch_execute("SET loom.migration_lock_timeout = 400")
        .unwrap();
    let started = Instant::now();
    upgrade_extension(&mut client, "0.2.0").unwrap();
    let took = started.elapsed();
    let worst_append = appender.join().unwrap();
    println!("upgrade under a held lock took {took:?}; the worst append stalled {worst_append:?} (lock_timeout 400 ms)");

    assert!(
        took < Duration::from_millis(400 + 2000),
        "bounded by lock_timeout: {took:?}"
    );
    assert!(
        worst_append < Duration::from_millis(400 + 1000),
        "appends stall at most lock_timeout: {worst_append:?}"
    );
    let warnings = warnings.lock().unwrap().clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("01000: loom: could not convert loom.events.execution_id"),
        "{warnings:?}"
    );
    assert!(
        warnings[0].contains("55P03"),
        "lock_not_available: {warnings:?}"
    );
    assert!(
        warnings[0]
            .contains(r#"ALTER TABLE loom.events ALTER COLUMN execution_id TYPE text COLLATE "C""#)
            && warnings[0].contains("ANALYZE loom.events"),
        "the WARNING names the statements to run by hand: {warnings:?}"
    );
    assert_eq!(version_of(&mut client), "0.2.0");
    assert_eq!(
        collation_of(&mut client, "refs", "name"),
        "C",
        "the other conversion is kept"
    );
    assert_ne!(collation_of(&mut client, "events", "execution_id"), "C");
    let mut with_appender = expected.clone();
    with_appender.push("appender".to_owned());
    with_appender.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    assert_eq!(
        all_executions(&mut client),
        with_appender,
        "paging stays right"
    );

    // The caller's own timeouts come back whether the conversion fails soft
    // or succeeds: captured first, never a constant.
    let migrate_keeping_timeouts = |client: &mut Client| -> (Vec<String>, String, String) {
        let mut tx = client.transaction().unwrap();
        tx.batch_execute("SET LOCAL lock_timeout = '7s'; SET LOCAL statement_timeout = '9s'")
            .unwrap();
        let outcomes = tx
            .query("SELECT outcome FROM loom_migrate_collations(300)", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let lock: String = tx.query_one("SHOW lock_timeout", &[]).unwrap().get(0);
        let statement: String = tx.query_one("SHOW statement_timeout", &[]).unwrap().get(0);
        tx.commit().unwrap();
        (outcomes, lock, statement)
    };
    let (outcomes, lock, statement) = migrate_keeping_timeouts(&mut client);
    assert_eq!(outcomes, [r#"already COLLATE "C""#, "skipped: 55P03"]);
    assert_eq!((lock.as_str(), statement.as_str()), ("7s", "9s"));

    holder.batch_execute("COMMIT").unwrap();
    let (outcomes, lock, statement) = migrate_keeping_timeouts(&mut client);
    assert_eq!(outcomes, [r#"already COLLATE "C""#, "converted"]);
    assert_eq!((lock.as_str(), statement.as_str()), ("7s", "9s"));
    assert_eq!(collation_of(&mut client, "events", "execution_id"), "C");
}

#[test]
fn a_role_that_does_not_own_the_tables_fails_loudly() {
    let db = "loom_up_owner";
    let mut client = ICU.fresh_database_at(db, "0.2.0");
    // Put the columns back to the default collation, as a skipped
    // conversion leaves them, then try to convert as a stranger.
    client
        .batch_execute(
            r#"ALTER TABLE loom.refs ALTER COLUMN name TYPE text COLLATE "default";
               DROP ROLE IF EXISTS loom_stranger;
               CREATE ROLE loom_stranger;
               GRANT USAGE ON SCHEMA loom TO loom_stranger;
               SET ROLE loom_stranger;"#,
        )
        .unwrap();
    let err = client
        .query("SELECT * FROM loom_migrate_collations()", &[])
        .expect_err("not owning the table is not a soft failure");
    assert_eq!(err.code().unwrap().code(), "42501", "{}", describe(&err));
    client.batch_execute("RESET ROLE").unwrap();
    assert_ne!(collation_of(&mut client, "refs", "name"), "C");
}

#[test]
fn a_deadlock_fails_soft_and_keeps_the_other_conversion() {
    let db = "loom_up_deadlock";
    let mut setup = ICU.fresh_database_at(db, "0.1.0");
    load_mixed(&mut setup);
    // A transaction that reads events, then refs: against the upgrade, which
    // holds refs (converted first) and waits for events, that is a cycle.
    let mut reader = ICU.connect(db);
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM loom.events")
        .unwrap();
    let (mut client, warnings) = ICU.connect_collecting_warnings(db);
    client
        .batch_execute("SET loom.migration_lock_timeout = 10000")
        .unwrap();
    let upgrade = thread::spawn(move || {
        upgrade_extension(&mut client, "0.2.0")
            .map(|()| client)
            .map_err(|e| describe(&e))
    });
    // Let the upgrade start waiting first, so its deadlock check fires first.
    thread::sleep(Duration::from_millis(300));
    let read_refs = reader.query_one("SELECT count(*) FROM loom.refs", &[]);
    let mut client = upgrade.join().unwrap().expect("the upgrade completes");
    assert!(
        read_refs.is_ok(),
        "the reader was not the victim: {read_refs:?}"
    );
    reader.batch_execute("COMMIT").unwrap();
    let warnings = warnings.lock().unwrap().clone();
    assert!(
        warnings.len() == 1
            && warnings[0].contains("loom.events.execution_id")
            && warnings[0].contains("40P01"),
        "deadlock_detected fails soft: {warnings:?}"
    );
    assert_eq!(version_of(&mut client), "0.2.0");
    assert_eq!(collation_of(&mut client, "refs", "name"), "C");
    assert_ne!(collation_of(&mut client, "events", "execution_id"), "C");
}

#[test]
fn a_dependent_view_fails_soft_with_a_warning() {
    let db = "loom_up_view";
    let mut client = ICU.fresh_database_at(db, "0.1.0");
    client
        .batch_execute(
            "CREATE VIEW public.execution_ids AS SELECT DISTINCT execution_id FROM loom.events",
        )
        .unwrap();
    let (mut client, warnings) = ICU.connect_collecting_warnings(db);
    upgrade_extension(&mut client, "0.2.0").unwrap();
    let warnings = warnings.lock().unwrap().clone();
    assert!(
        warnings.len() == 1
            && warnings[0].contains("0A000")
            && warnings[0].contains("loom.events.execution_id"),
        "{warnings:?}"
    );
    assert_eq!(version_of(&mut client), "0.2.0");
    assert_eq!(collation_of(&mut client, "refs", "name"), "C");
}

#[test]
fn a_short_statement_timeout_cannot_stop_the_documented_upgrade() {
    for (db, documented) in [
        ("loom_up_timeout_doc", true),
        ("loom_up_timeout_naive", false),
    ] {
        let mut client = ICU.fresh_database_at(db, "0.1.0");
        client
            .batch_execute(
                "INSERT INTO loom.events (execution_id, sequence, kind, payload)
                 SELECT 'exec-' || (i / 2), i % 2, 'step', '{}' FROM generate_series(0, 399999) i",
            )
            .unwrap();
        let (mut client, warnings) = ICU.connect_collecting_warnings(db);
        client
            .batch_execute("SET statement_timeout = '100ms'")
            .unwrap();
        if documented {
            upgrade_extension(&mut client, "0.2.0").unwrap();
            assert_eq!(
                collation_of(&mut client, "events", "execution_id"),
                "C",
                "converted"
            );
            assert!(warnings.lock().unwrap().is_empty());
        } else {
            // Without the procedure the statement's own timer cancels the
            // rebuild: the conversion fails soft, and would on every boot.
            client
                .batch_execute("ALTER EXTENSION loom UPDATE TO '0.2.0'")
                .unwrap();
            assert_ne!(collation_of(&mut client, "events", "execution_id"), "C");
            let warnings = warnings.lock().unwrap().clone();
            assert!(warnings.iter().any(|w| w.contains("57014")), "{warnings:?}");
        }
        assert_eq!(version_of(&mut client), "0.2.0");
        client.batch_execute("RESET statement_timeout").unwrap();
    }
}

#[test]
fn the_frame_column_is_opt_in_fails_soft_under_a_held_lock_then_lands_lock_free() {
    let db = "loom_up_zstd";
    let _setup = ICU.fresh_database_at(db, "0.2.0");
    let mut holder = ICU.hold_lock(db, "snapshots", "ACCESS SHARE");
    let (mut client, warnings) = ICU.connect_collecting_warnings(db);
    // The upgrade does no frame DDL (ADR 0141 D5, D9). Its one use of the
    // snapshots lock is 0.5.0's collation conversion of execution_id,
    // which fails soft behind the held lock, bounded, like every other.
    let started = Instant::now();
    upgrade_extension(&mut client, CURRENT).unwrap();
    println!(
        "upgrade 0.2.0 -> {CURRENT} beside a held snapshots lock: {:?}",
        started.elapsed()
    );
    assert_eq!(version_of(&mut client), CURRENT);
    {
        let mut seen = warnings.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].contains("loom.snapshots.execution_id") && seen[0].contains("55P03"),
            "{seen:?}"
        );
        seen.clear();
    }
    // The conversion lands once the lock is gone; then the lock is held
    // again for the opt-in below.
    holder.batch_execute("COMMIT").unwrap();
    client
        .batch_execute("SET statement_timeout = 0; SELECT * FROM loom_migrate_collations(); RESET statement_timeout")
        .unwrap();
    assert_eq!(collation_of(&mut client, "snapshots", "execution_id"), "C");
    let mut holder = ICU.hold_lock(db, "snapshots", "ACCESS SHARE");
    let _fresh = ICU.fresh_database("loom_up_zstd_fresh");
    assert_frame_lines_only(
        &ICU.schema_dump(db),
        &ICU.schema_dump("loom_up_zstd_fresh"),
        "the upgrade",
    );
    // Without the column, JSONB still saves; a zstd save says what to do.
    client
        .execute("SELECT loom_save_snapshot('e', 'w', 1, '{\"a\":1}')", &[])
        .unwrap();
    let err = client
        .execute(
            "SELECT loom_save_snapshot('e', 'w', 2, '{\"a\":2}', 'zstd')",
            &[],
        )
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "55000", "{}", describe(&err));

    // Opting in while the lock is held: one short wait, false, one warning.
    let started = Instant::now();
    let ensured: bool = client
        .query_one("SELECT loom_ensure_snapshot_zstd()", &[])
        .unwrap()
        .get(0);
    let stalled = started.elapsed();
    println!("loom_ensure_snapshot_zstd under a held lock: false after {stalled:?}");
    assert!(!ensured);
    assert!(stalled < Duration::from_millis(200 + 800), "{stalled:?}");
    assert_eq!(
        warnings.lock().unwrap().len(),
        1,
        "{:?}",
        warnings.lock().unwrap()
    );

    holder.batch_execute("COMMIT").unwrap();
    ensure_frames(&mut client);
    assert_same_schema(
        &ICU.schema_dump(db),
        &ICU.schema_dump("loom_up_zstd_fresh"),
        "the upgrade, once opted in,",
    );
    // Done once, it takes no lock at all, not even the migration lock.
    let mut tx = client.transaction().unwrap();
    let again: bool = tx
        .query_one("SELECT loom_ensure_snapshot_zstd()", &[])
        .unwrap()
        .get(0);
    let locks: i64 = tx
        .query_one(
            "SELECT count(*) FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation
             WHERE l.pid = pg_backend_pid()
               AND (c.relname IN ('snapshots', 'migration_lock') OR l.locktype = 'advisory')",
            &[],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    assert!(again);
    assert_eq!(locks, 0);
    client
        .execute(
            "SELECT loom_save_snapshot('e', 'w', 2, '{\"a\":2}', 'zstd')",
            &[],
        )
        .unwrap();
}

#[test]
fn dump_and_restore_keep_every_row_and_the_version() {
    let source = "loom_dump_source";
    let target = "loom_dump_target";
    let mut client = ICU.fresh_database(source);
    ensure_frames(&mut client);
    load_mixed(&mut client);
    client
        .batch_execute(
            r#"SELECT loom_save_snapshot('a_b', 'wf', 1, '{"plain":true}');
               SELECT loom_save_snapshot('a_b', 'wf', 2, '{"framed":"' || repeat('agent tool ', 40) || '"}', 'zstd');
               INSERT INTO loom.lineage (execution_id, parent_execution_id, fork_sequence) VALUES ('B', 'a_b', 2);"#,
        )
        .unwrap();
    // The change feed (issue 38), on, with a consumer part way along it.
    client
        .batch_execute(
            "SELECT loom_feed_enable();
             SELECT loom_append_event('fed-' || i, 1, 'k', '{}') FROM generate_series(1, 3) i;
             SELECT loom_feed_create_consumer('projector');",
        )
        .unwrap();
    // Readable once every older transaction of the cluster has ended
    // (another test's may be open).
    let started = std::time::Instant::now();
    while client
        .query_one("SELECT count(*) FROM loom_feed_read(NULL, 100)", &[])
        .unwrap()
        .get::<_, i64>(0)
        < 3
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "never readable"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    client
        .batch_execute("SELECT loom_feed_ack('projector', (SELECT feed_position FROM loom_feed_read(NULL, 1)))")
        .unwrap();
    let fingerprint = |client: &mut Client| -> Vec<String> {
        [
            "SELECT count(*) || ' ' || max(loom_feed_position(feed_tx, feed_ord)) FROM loom.events WHERE feed_tx IS NOT NULL",
            "SELECT string_agg(name || ' ' || owner_role::text || ' ' || position, ',') FROM loom.feed_consumers",
            "SELECT md5(string_agg(execution_id || sequence || kind || payload::text, ',' ORDER BY execution_id COLLATE \"C\", sequence)) FROM loom.events",
            "SELECT md5(string_agg(id || execution_id || sequence || state::text, ',' ORDER BY id)) FROM loom.snapshots_decoded",
            "SELECT md5(string_agg(name || execution_id || sequence, ',' ORDER BY name COLLATE \"C\")) FROM loom.refs",
            "SELECT md5(string_agg(execution_id || parent_execution_id, ',')) FROM loom.lineage",
            "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
        ]
        .iter()
        .map(|q| client.query_one(*q, &[]).unwrap().get::<_, String>(0))
        .collect()
    };
    let before = fingerprint(&mut client);
    const READ: &str =
        "SELECT string_agg(feed_position || execution_id, ',') FROM loom_feed_read(NULL, 100)";
    let read_before: String = client.query_one(READ, &[]).unwrap().get(0);
    let archive = std::env::temp_dir().join(format!("loom-dump-{}.pgdump", std::process::id()));
    let status = std::process::Command::new(format!("{}/pg_dump", loom_harness::pg_bin()))
        .args(["-Fc", "-f"])
        .arg(&archive)
        .arg(format!("{} dbname={source}", ICU.conninfo()))
        .status()
        .unwrap();
    assert!(status.success());
    let _empty = ICU.fresh_database_without_loom(target, "");
    let out = std::process::Command::new(format!("{}/pg_restore", loom_harness::pg_bin()))
        .args(["--exit-on-error", "-d"])
        .arg(format!("{} dbname={target}", ICU.conninfo()))
        .arg(&archive)
        .output()
        .unwrap();
    std::fs::remove_file(&archive).ok();
    assert!(
        out.status.success(),
        "pg_restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut restored = ICU.connect(target);
    assert_eq!(fingerprint(&mut restored), before);
    // The feed's defaults and index are not in a dump: readers refuse
    // (rather than take the feed for empty), status says to turn it on,
    // and then the restored positions read as before, new events come
    // after every one of them, and the consumer goes on from where it was.
    let refused = restored.query_one(READ, &[]).unwrap_err();
    assert_eq!(loom_harness::sqlstate(&refused), "55000");
    let said: String = restored
        .query_one(
            "SELECT statement FROM loom_status() WHERE item = 'change feed' AND needs_action",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(said.contains("loom_feed_enable()"), "{said}");
    restored
        .batch_execute(
            "SELECT loom_feed_enable(); SELECT loom_append_event('fed-after', 1, 'k', '{}');",
        )
        .unwrap();
    let started = std::time::Instant::now();
    let next = loop {
        let next: Vec<String> = restored
            .query(
                "SELECT execution_id FROM loom_feed_next('projector', 100)",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if next.len() >= 3 || started.elapsed() > std::time::Duration::from_secs(60) {
            break next;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(next, ["fed-2", "fed-3", "fed-after"]);
    let read_after: String = restored.query_one(READ, &[]).unwrap().get(0);
    assert!(
        read_after.starts_with(&format!("{read_before},")),
        "{read_after}"
    );
    let above: bool = restored
        .query_one(
            "SELECT (SELECT max(feed_position) FROM loom_feed_read(NULL, 100) WHERE execution_id = 'fed-after')
                  > (SELECT max(feed_position) FROM loom_feed_read(NULL, 100) WHERE execution_id <> 'fed-after')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(above);
    // The identity goes on where it was.
    let next: i64 = restored
        .query_one("SELECT loom_save_snapshot('new', 'wf', 1, '{}')", &[])
        .unwrap()
        .get(0);
    assert_eq!(next, 3);
}

#[test]
fn a_role_that_reads_the_log_still_pages_after_the_upgrade() {
    let db = "loom_up_reader";
    let mut client = ICU.fresh_database_at(db, "0.3.0");
    client
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE loom_test_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT USAGE ON SCHEMA loom TO loom_test_reader;
             GRANT SELECT ON loom.events TO loom_test_reader;
             SELECT loom_append_event('read-me', 1, 'step', '{}');",
        )
        .unwrap();
    upgrade_extension(&mut client, CURRENT).unwrap();
    // 0.4.0 pages loom.executions, as the caller: the upgrade gave it the
    // same readers as loom.events.
    client.batch_execute("SET ROLE loom_test_reader").unwrap();
    let ids: Vec<String> = client
        .query("SELECT * FROM loom_list_executions()", &[])
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect();
    client.batch_execute("RESET ROLE").unwrap();
    assert_eq!(ids, ["read-me"]);
}

#[test]
fn a_view_on_the_snapshot_views_fails_soft_naming_it_and_grants_and_comments_stay() {
    // The docs invite reading through loom.snapshots_decoded: a user's
    // view on it kept 0.4.0 -> 0.5.0 (which redefines it) from completing.
    let db = "loom_up_snapshot_view";
    let mut client = ICU.fresh_database_at(db, "0.4.0");
    client
        .batch_execute(
            "DROP ROLE IF EXISTS loom_up_column_reader;
             CREATE ROLE loom_up_column_reader;
             GRANT USAGE ON SCHEMA loom TO loom_up_column_reader;
             GRANT SELECT (id, state) ON loom.snapshots_decoded TO loom_up_column_reader;
             COMMENT ON COLUMN loom.snapshots_decoded.state IS 'the decoded state, for dashboards';
             SELECT loom_save_snapshot('a', 'wf', 1, '{\"kept\":true}');
             CREATE VIEW public.latest_states AS SELECT execution_id, state FROM loom.snapshots_decoded;",
        )
        .unwrap();
    let (mut client2, warnings) = ICU.connect_collecting_warnings(db);
    upgrade_extension(&mut client2, CURRENT).unwrap_or_else(|e| panic!("{}", describe(&e)));
    assert_eq!(version_of(&mut client2), CURRENT);
    let warnings = warnings.lock().unwrap().clone();
    assert!(
        warnings.iter().any(|w| w.contains("2BP01")
            && w.contains("loom.snapshots.execution_id")
            && w.contains("latest_states")),
        "{warnings:?}"
    );
    assert_ne!(collation_of(&mut client2, "snapshots", "execution_id"), "C");
    // Once the view is out of the way, the re-run converts the column and
    // the views keep their column grants and comments.
    client
        .batch_execute(
            "DROP VIEW public.latest_states; SET statement_timeout = 0;
             SELECT loom_migrate_collations(2000);",
        )
        .unwrap();
    assert_eq!(collation_of(&mut client, "snapshots", "execution_id"), "C");
    let kept: (bool, bool, Option<String>) = {
        let row = client
            .query_one(
                "SELECT has_column_privilege('loom_up_column_reader', 'loom.snapshots_decoded', 'state', 'SELECT'),
                        has_column_privilege('loom_up_column_reader', 'loom.snapshots_decoded', 'workflow_id', 'SELECT'),
                        col_description('loom.snapshots_decoded'::regclass, 6)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        kept,
        (
            true,
            false,
            Some("the decoded state, for dashboards".to_owned())
        )
    );
    let state: String = client
        .query_one(
            "SELECT state::text FROM loom.snapshots_decoded WHERE execution_id = 'a'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(state, r#"{"kept": true}"#);
}

#[test]
fn roles_granted_at_0_15_0_claim_and_consume_after_the_update_as_a_fresh_grant_would() {
    // 0.16.0's tables (claims, the feed's) and its token sequence, granted
    // by the update to the readers and writers of before.
    let db = "loom_up_runtime_roles";
    let mut client = ICU.fresh_database_at(db, "0.15.0");
    client
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE loom_up_writer; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE loom_up_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             SELECT loom_grant_access('loom_up_writer', 'writer');
             SELECT loom_grant_access('loom_up_reader', 'reader');
             -- INSERT on the whole log granted by hand: with a grant
             -- option (and passed on by its holder), and to PUBLIC.
             DO $$ BEGIN CREATE ROLE loom_up_g1; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE loom_up_g2; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT USAGE ON SCHEMA loom TO loom_up_g1, loom_up_g2;
             GRANT INSERT ON loom.events TO loom_up_g1 WITH GRANT OPTION;
             SET ROLE loom_up_g1; GRANT INSERT ON loom.events TO loom_up_g2; RESET ROLE;
             GRANT INSERT ON loom.events TO PUBLIC;",
        )
        .unwrap();
    upgrade_extension(&mut client, CURRENT).unwrap_or_else(|e| panic!("{}", describe(&e)));
    client.batch_execute("SELECT loom_feed_enable()").unwrap();
    // Each of them may insert an event, and none may name its feed position.
    for role in [
        "loom_up_writer",
        "loom_up_g1",
        "loom_up_g2",
        "loom_up_reader",
    ] {
        let (payload, position): (bool, bool) = {
            let row = client
                .query_one(
                    "SELECT has_column_privilege($1::text, 'loom.events', 'payload', 'INSERT'),
                            has_column_privilege($1::text, 'loom.events', 'feed_tx', 'INSERT')
                              OR has_column_privilege($1::text, 'loom.events', 'feed_ord', 'INSERT')",
                    &[&role],
                )
                .unwrap();
            (row.get(0), row.get(1))
        };
        assert_eq!((payload, position), (true, false), "{role}");
    }
    // And append with the feed on: its order's sequence is theirs to use.
    for (i, role) in ["loom_up_g1", "loom_up_g2"].iter().enumerate() {
        client
            .batch_execute(&format!(
                "SET ROLE {role};
                 INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ('by-hand-{i}', 1, 'k', '{{}}');
                 RESET ROLE;"
            ))
            .unwrap_or_else(|e| panic!("{role}: {}", describe(&e)));
    }
    let acl = |client: &mut Client| -> Vec<String> {
        client
            .query(
                "SELECT c.relname || ' ' || r.rolname || ' ' || a.privilege_type
                 FROM pg_class c, aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
                 WHERE c.relnamespace = 'loom'::regnamespace AND r.rolname IN ('loom_up_writer', 'loom_up_reader')
                   AND c.relname IN ('claims', 'claims_fence_seq', 'feed_ord_seq', 'feed_state', 'feed_high_water', 'feed_consumers')
                 ORDER BY 1",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let updated = acl(&mut client);
    // The same as a fresh install's grants to the same roles.
    let fresh_db = "loom_up_runtime_roles_fresh";
    let mut fresh = ICU.fresh_database(fresh_db);
    fresh
        .batch_execute(
            "SELECT loom_grant_access('loom_up_writer', 'writer');
             SELECT loom_grant_access('loom_up_reader', 'reader');",
        )
        .unwrap();
    assert_eq!(updated, acl(&mut fresh));
    // And they work: the writer schedules, claims (the token sequence),
    // creates and drops a consumer; the reader can do none of it.
    client
        .batch_execute(
            "SET ROLE loom_up_writer;
             SELECT loom_schedule('r1');
             SELECT * FROM loom_claim('default', 'w', interval '30 seconds', 1);
             SELECT loom_feed_create_consumer('c');
             SELECT loom_feed_drop_consumer('c');
             RESET ROLE;",
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    client.batch_execute("SET ROLE loom_up_reader").unwrap();
    let refused = client
        .batch_execute("SELECT * FROM loom_claim('default', 'w', interval '30 seconds', 1)")
        .unwrap_err();
    assert_eq!(
        loom_harness::sqlstate(&refused),
        "42501",
        "{}",
        describe(&refused)
    );
    client.batch_execute("RESET ROLE").unwrap();
}
