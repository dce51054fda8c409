//! loom's migrations where production breaks them (issue 8), against the
//! ICU en-US cluster: replicas provisioning at once, a pool's
//! statement_timeout around a rebuild, a hostile version string, a soft
//! failure that must reach the caller, and hostile frames that must not
//! pin a backend's memory.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use loom_harness::pg_pool;
use loom_harness::{collation_of, describe, runtime, upgrade_extension, Cluster, LOOM_VERSION};
use pgloom::migrate::{migrate, MigrateOptions, StepOutcome};
use pgloom::snapshot_store::{Codec, FrameProvisioning, PgSnapshotStore, PgSnapshotStoreOptions};
use pgloom::Error;
use postgres::Client;

const ICU: Cluster = Cluster::Icu;

#[test]
fn eight_connections_ensuring_frames_at_once_all_succeed_and_one_adds_them() {
    // An existing deployment opting in: upgraded, so no frame column yet.
    let db = "loom_mig_ensure_race";
    let mut setup = ICU.fresh_database_at(db, "0.2.0");
    upgrade_extension(&mut setup, LOOM_VERSION).unwrap();
    let start = Arc::new(Barrier::new(8));
    let notices = Arc::new(Mutex::new(Vec::new()));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let start = Arc::clone(&start);
            let notices = Arc::clone(&notices);
            thread::spawn(move || {
                let (mut client, seen) = ICU.connect_collecting_warnings(db);
                start.wait();
                let result = client
                    .query_one("SELECT loom_ensure_snapshot_zstd()", &[])
                    .map(|row| row.get::<_, bool>(0))
                    .map_err(|e| describe(&e));
                notices.lock().unwrap().extend(seen.lock().unwrap().clone());
                result
            })
        })
        .collect();
    let results: Vec<Result<bool, String>> =
        callers.into_iter().map(|c| c.join().unwrap()).collect();
    println!("8 concurrent loom_ensure_snapshot_zstd(): {results:?}");
    assert!(
        results.iter().all(|r| r == &Ok(true)),
        "every caller returns true, none errors (before the fix: 42701/42710): {results:?}"
    );
    let notices = notices.lock().unwrap().clone();
    let added = notices
        .iter()
        .filter(|n| n.contains("added the snapshot frame column"))
        .count();
    assert_eq!(added, 1, "exactly one adds the column: {notices:?}");
    assert!(
        !notices.iter().any(|n| n.starts_with("01000")),
        "no WARNING: {notices:?}"
    );
}

#[test]
fn a_pool_statement_timeout_skips_the_rebuild_without_a_lock_and_migrate_converts() {
    let db = "loom_mig_statement_timeout";
    let mut client = ICU.fresh_database(db);
    // An events table as an upgraded 0.1.0 database has it: ids in the
    // database's en-US order (ICU, or libc where the server has no ICU),
    // and enough rows that the rebuild outlasts the 500 ms timeout.
    client
        .batch_execute(
            r#"ALTER TABLE loom.events ALTER COLUMN execution_id TYPE text COLLATE "default";
               INSERT INTO loom.events (execution_id, sequence, kind, payload)
               SELECT 'exec-' || (i / 2), i % 2, 'step', '{}' FROM generate_series(0, 1999999) i;
               ANALYZE loom.events;"#,
        )
        .unwrap();
    assert_eq!(
        collation_of(&mut client, "events", "execution_id"),
        "default"
    );

    // The call a pool makes: under the timeout, the conversion does not
    // start (a function cannot lift its own statement's timer), so it
    // takes no lock and appends go on.
    let (mut pooled, warnings) = ICU.connect_collecting_warnings(db);
    pooled
        .batch_execute("SET statement_timeout = '500ms'")
        .unwrap();
    let mut observer = ICU.connect(db);
    let started = Instant::now();
    let outcomes: Vec<(String, String)> = pooled
        .query(
            "SELECT column_name, outcome FROM loom_migrate_collations()",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let skipped_in = started.elapsed();
    observer
        .execute("SELECT loom_append_event('during', 1, 'step', '{}')", &[])
        .unwrap();
    println!(
        "loom_migrate_collations() under statement_timeout 500ms: {outcomes:?} in {skipped_in:?}"
    );
    assert_eq!(
        outcomes[1],
        (
            "loom.events.execution_id".to_owned(),
            "skipped: statement_timeout".to_owned()
        )
    );
    assert!(skipped_in < Duration::from_millis(500), "{skipped_in:?}");
    let warnings = warnings.lock().unwrap().clone();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("statement_timeout") && w.contains("ALTER TABLE loom.events")),
        "the WARNING names the statements to run: {warnings:?}"
    );
    assert_eq!(
        collation_of(&mut client, "events", "execution_id"),
        "default"
    );

    // pgloom's migrate() under the same pool-wide timeout (set in the
    // connection string) runs the conversion as its own statement, with
    // statement_timeout 0, and it lands.
    let conninfo = format!("{} options='-c statement_timeout=500'", ICU.database(db));
    let rt = runtime();
    let started = Instant::now();
    let migration = rt
        .block_on(migrate(
            &conninfo,
            MigrateOptions::new().lock_timeout(std::time::Duration::from_secs(2)),
        ))
        .unwrap();
    let converted_in = started.elapsed();
    println!(
        "migrate() under statement_timeout 500ms: {:?} in {converted_in:?}",
        migration.collations
    );
    assert!(migration.collations.contains(&(
        "loom.events.execution_id".to_owned(),
        StepOutcome::Done("converted".to_owned())
    )));
    assert!(
        converted_in > Duration::from_millis(500),
        "the rebuild outlasted the timeout it was exempted from: {converted_in:?}"
    );
    assert_eq!(collation_of(&mut client, "events", "execution_id"), "C");
    // The next boot is a catalog check.
    let again = rt
        .block_on(migrate(&conninfo, &MigrateOptions::new()))
        .unwrap();
    assert!(again.collations.iter().all(
        |(_, outcome)| *outcome == StepOutcome::AlreadyDone("already COLLATE \"C\"".to_owned())
    ));
}

#[test]
fn migrate_passes_the_version_as_a_literal_and_refuses_an_unbounded_wait() {
    let db = "loom_mig_literal";
    let mut client = ICU.fresh_database(db);
    client
        .execute("SELECT loom_append_event('kept', 1, 'step', '{}')", &[])
        .unwrap();
    let rt = runtime();
    let hostile = "0.4.0' ; DROP TABLE loom.events; --";
    let err = rt
        .block_on(migrate(
            &ICU.database(db),
            MigrateOptions::new().to_version(hostile),
        ))
        .unwrap_err();
    // Not a version: refused by the client before any SQL is sent (and
    // were it sent, the server takes the whole string as one literal).
    assert!(
        matches!(&err, Error::IncompatibleExtension { installed, .. } if installed == hostile),
        "{err}"
    );
    // A version that parses but does not exist: the server's own answer.
    let err = rt
        .block_on(migrate(
            &ICU.database(db),
            MigrateOptions::new().to_version("0.99.0"),
        ))
        .unwrap_err();
    assert_eq!(err.sqlstate(), Some("22023"), "{err}");
    let kept: i64 = client
        .query_one("SELECT count(*) FROM loom.events", &[])
        .unwrap()
        .get(0);
    assert_eq!(kept, 1);
    assert!(matches!(
        rt.block_on(migrate(
            &ICU.database(db),
            MigrateOptions::new().lock_timeout(std::time::Duration::ZERO)
        )),
        Err(Error::InvalidLockTimeout(d)) if d.is_zero()
    ));
}

#[test]
fn a_frame_provisioning_that_fails_soft_reaches_the_caller() {
    let db = "loom_mig_soft_frames";
    let mut setup = ICU.fresh_database_at(db, "0.2.0");
    upgrade_extension(&mut setup, LOOM_VERSION).unwrap();
    let rt = runtime();
    let holder = ICU.hold_lock(db, "snapshots", "ACCESS SHARE");

    let migration = rt
        .block_on(migrate(
            &ICU.database(db),
            MigrateOptions::new().snapshot_codec(Codec::Zstd),
        ))
        .unwrap();
    assert_eq!(migration.snapshot_frames, Some(false));
    assert!(
        migration.warnings.iter().any(|w| w.contains("55P03")),
        "{:?}",
        migration.warnings
    );

    let warned = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&warned);
    let mut options = PgSnapshotStoreOptions::new();
    options
        .codec(Codec::Zstd)
        .on_warning(move |w| sink.lock().unwrap().push(w.to_owned()));
    let store = rt
        .block_on(PgSnapshotStore::start(
            pg_pool(&ICU.database(db), 1).unwrap(),
            &options,
        ))
        .unwrap();
    assert_eq!(store.frame_provisioning(), FrameProvisioning::Deferred);
    assert!(!store.writes_frames());
    assert_eq!(warned.lock().unwrap().len(), 1);

    drop(holder);
    let store = rt
        .block_on(PgSnapshotStore::start(
            pg_pool(&ICU.database(db), 1).unwrap(),
            &options,
        ))
        .unwrap();
    assert_eq!(store.frame_provisioning(), FrameProvisioning::Ready);
    assert!(store.writes_frames());
    assert_eq!(warned.lock().unwrap().len(), 1, "no warning when it works");
}

/// The backend's resident memory, from /proc (the tests run on the
/// cluster's machine).
fn backend_rss_kib(client: &mut Client) -> u64 {
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A frame the zstd CLI writes from a pipe (so it declares no size) of
/// a 64 MiB JSON string, with a window of 2^`window_log`.
fn undeclared_frame(window_log: u32) -> Vec<u8> {
    let script = format!(
        "{{ printf '\"'; head -c 67108864 /dev/zero | tr '\\0' a; printf '\"'; }} | zstd -3 --zstd=wlog={window_log} -c"
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut frame = vec![0x02];
    frame.extend_from_slice(&out.stdout);
    frame
}

#[test]
fn hostile_frames_leave_a_backend_within_a_few_mib_of_its_baseline() {
    let mut client = ICU.fresh_database("loom_mig_rss");
    // Load the extension's code and warm the backend first.
    let small = pgloom_core::frame::encode(r#"{"warm":true}"#, Codec::Zstd).unwrap();
    client
        .query_one("SELECT length(loom_snapshot_state_text($1))", &[&small])
        .unwrap();
    let baseline = backend_rss_kib(&mut client);
    // 2^27: the window zstd's streaming decoder took by default, refused
    // now before a byte is allocated. 2^22: the largest allowed, inflated
    // on a context that is freed afterwards.
    let refused = undeclared_frame(27);
    let allowed = undeclared_frame(22);
    let mut sqlstates = Vec::new();
    for _ in 0..5 {
        for frame in [&refused, &allowed] {
            match client.query_one("SELECT length(loom_snapshot_state_text($1))", &[frame]) {
                Ok(row) => assert_eq!(row.get::<_, i32>(0), 64 * 1024 * 1024 + 2),
                Err(e) => sqlstates.push(e.code().unwrap().code().to_owned()),
            }
        }
    }
    let after = backend_rss_kib(&mut client);
    let grown_mib = (after.saturating_sub(baseline)) as f64 / 1024.0;
    println!(
        "backend RSS: baseline {} KiB, after 5 x (2^27-window frame refused, 2^22-window 64 MiB frame decoded): {} KiB (+{grown_mib:.1} MiB); refusals {sqlstates:?}",
        baseline, after
    );
    assert_eq!(sqlstates, ["54000"; 5], "the 2^27 window is refused");
    assert!(
        grown_mib < 8.0,
        "the backend keeps {grown_mib:.1} MiB after decoding: pinned memory"
    );
}
