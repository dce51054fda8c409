//! Faults and load on the Makefile's real clusters (issue 8): sixteen
//! writers through a shard's hard stop and a collation conversion, a shard
//! stopped in the middle of a sharded pass, a SIGKILLed backend in the
//! middle of `ALTER EXTENSION loom UPDATE`, and eight replicas booting at
//! once. Each scenario prints what it injected, what it observed and what
//! was lost (`--nocapture`). A scenario runs once ([`scenario`]) and its
//! named cases each check one thing it must have kept, so a failure says
//! which.
//!
//! These tests stop and crash servers that every other test uses, so they
//! run one at a time ([`serial`]), each starts from running clusters, and
//! each holds a [`RestartOnDrop`] over a server it harms: a failed
//! assertion never leaves a cluster down for the next test binary.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use loom_harness::cluster_control::{kill_9, RestartOnDrop, SERVER_TIMEOUT};
use loom_harness::pg_pool;
use loom_harness::{
    collation_of, copy_executions, describe, mixed_case_id, runtime, upgrade_extension, version_of,
    Cluster,
};
use pgloom::event_store::{
    iterate_execution_ids, Event, EventStore, PgEventStore, ShardedEventStore,
};
use pgloom::migrate::{migrate, MigrateOptions};
use pgloom::snapshot_store::{Codec, PgSnapshotStore, PgSnapshotStoreOptions};
use pgloom::Error;
use postgres::Client;

/// One fault test at a time: they stop and kill the servers the others
/// would be using. A test that failed poisons it; the next one still runs.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes [`SERIAL`], then makes sure every cluster runs and takes
/// connections, whatever an earlier (killed) run left behind.
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    for cluster in [Cluster::C, Cluster::Icu]
        .into_iter()
        .chain(Cluster::SHARDS)
    {
        cluster
            .ensure_running()
            .unwrap_or_else(|e| panic!("the {cluster} cluster is not up: {e}"));
    }
    guard
}

/// One row of the table every test prints.
struct Outcome {
    injected: String,
    observed: String,
    lost: u64,
}

/// Prints the rows as `injected | observed | lost`, then fails the test if
/// anything was lost: printed first, so a failure shows the whole table.
fn report(test: &str, rows: &[Outcome]) {
    print_report(test, rows);
    for row in rows {
        assert_eq!(row.lost, 0, "lost after {}: {}", row.injected, row.observed);
    }
}

/// The table alone, for a scenario whose named cases each assert a part.
fn print_report(test: &str, rows: &[Outcome]) {
    println!("\n[{test}]");
    println!("{:<58} | {:<72} | lost", "injected", "observed");
    println!("{}-+-{}-+-----", "-".repeat(58), "-".repeat(72));
    for row in rows {
        println!("{:<58} | {:<72} | {}", row.injected, row.observed, row.lost);
    }
}

/// Runs a scenario once for all the named cases that check what it saw:
/// the first case to ask runs it (holding [`serial`]), the others read its
/// outcome. A scenario that panicked fails every case, with its message,
/// without running again.
fn scenario<T: Send + Sync>(
    cell: &'static OnceLock<Result<T, String>>,
    run: impl FnOnce() -> T,
) -> &'static T {
    let outcome = cell.get_or_init(|| {
        let _serial = serial();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned())
        })
    });
    match outcome {
        Ok(outcome) => outcome,
        Err(panic) => panic!("the scenario failed: {panic}"),
    }
}

/// An error with its whole chain of causes: pgloom's `Display` of a
/// server error stops at "db error", which says nothing.
fn detail(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Cuts a text to `n` characters for a table cell.
fn cell(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(n - 1).collect::<String>())
    }
}

/// Sleeps without tying up a runtime worker (and without tokio's `time`
/// feature, which the harness does not ask for).
async fn pause(duration: Duration) {
    tokio::task::spawn_blocking(move || thread::sleep(duration))
        .await
        .expect("a sleep does not panic");
}

/// The version `ALTER EXTENSION loom UPDATE` goes to: the installed
/// control file's, whichever release is installed.
fn newest_version(client: &mut Client) -> String {
    client
        .query_one(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'loom'",
            &[],
        )
        .unwrap()
        .get(0)
}

// ------------------------------------------------------------- writers

const WRITERS: usize = 16;
const TOTAL_EVENTS: usize = 100_000;
/// Events per append. All of one execution: a sharded store refuses a batch
/// spanning shards, which it could not commit all or none.
const BATCH: usize = 25;
const BATCHES_PER_EXECUTION: usize = 5;
/// Rows already in the converting database, so that its conversion (a
/// table rewrite and index rebuilds under ACCESS EXCLUSIVE) lasts long
/// enough for the writers to queue behind it.
const BULK_ROWS: i64 = 400_000;
/// How long one batch is retried: well past a shard's 1 s outage and its
/// restart, short enough to bound the test.
const RETRY_FOR: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Target {
    /// The ShardedEventStore over s1..s3; s2 is stopped and restarted.
    Sharded,
    /// A PgEventStore on an ICU database created at 0.1.0, converted to
    /// COLLATE "C" by migrate() while it is written.
    Converting,
}

/// One append a writer made, and what became of it.
#[derive(Debug)]
struct Batch {
    target: Target,
    execution_id: String,
    /// Sequences `first..first + BATCH`.
    first: i64,
    attempted: bool,
    /// An attempt returned Ok: the store acknowledged every event.
    acked: bool,
    /// Attempts that failed (a shard down, a dropped connection).
    failures: u32,
    /// A retry found an event of the batch already there: an earlier
    /// attempt committed but its acknowledgement was lost with the server.
    committed_unacked: bool,
    /// The first attempt found an event of the batch there: written by
    /// nobody, a phantom.
    preexisting: bool,
}

impl Batch {
    fn events(&self, writer: usize) -> Vec<Event> {
        (self.first..self.first + BATCH as i64)
            .map(|sequence| {
                Event::new(
                    self.execution_id.clone(),
                    sequence,
                    "step",
                    serde_json::json!({ "writer": writer, "sequence": sequence }),
                )
            })
            .collect()
    }
}

/// The batches of writer `w`: its own executions, on its own target.
fn plan(w: usize) -> Vec<Batch> {
    let target = if w.is_multiple_of(2) {
        Target::Sharded
    } else {
        Target::Converting
    };
    let batches = TOTAL_EVENTS / WRITERS / BATCH;
    (0..batches)
        .map(|b| {
            let execution = w * 1000 + b / BATCHES_PER_EXECUTION;
            Batch {
                target,
                // Mixed case with '-' and '_': the ids whose order the
                // conversion changes.
                execution_id: format!("{}-w{w}", mixed_case_id(execution as u64)),
                first: (b % BATCHES_PER_EXECUTION * BATCH) as i64 + 1,
                attempted: false,
                acked: false,
                failures: 0,
                committed_unacked: false,
                preexisting: false,
            }
        })
        .collect()
}

/// Appends writer `w`'s batches in order, each retried until acknowledged,
/// until it turns out to have committed unacknowledged, or for
/// [`RETRY_FOR`]; nothing is started after `deadline`.
async fn write<S: EventStore>(
    store: Arc<S>,
    w: usize,
    mut batches: Vec<Batch>,
    acked: Arc<AtomicUsize>,
    deadline: Instant,
) -> Vec<Batch> {
    for batch in &mut batches {
        if Instant::now() > deadline {
            break;
        }
        batch.attempted = true;
        let events = batch.events(w);
        let started = Instant::now();
        loop {
            match store.append(&events).await {
                Ok(()) => {
                    batch.acked = true;
                    acked.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                // After a failed attempt: that attempt committed, and only
                // its acknowledgement was lost with the server.
                Err(Error::DuplicateEvent { .. }) if batch.failures > 0 => {
                    batch.committed_unacked = true;
                    break;
                }
                // Before any attempt: the events were there already, which
                // no writer did.
                Err(Error::DuplicateEvent { .. }) => {
                    batch.preexisting = true;
                    break;
                }
                Err(e) => {
                    batch.failures += 1;
                    if batch.failures == 1 && !matches!(e, Error::Shard { .. } | Error::Pool(_)) {
                        eprintln!("writer {w}: {}", detail(&e));
                    }
                    if started.elapsed() > RETRY_FOR {
                        break;
                    }
                    pause(Duration::from_millis(25)).await;
                }
            }
        }
    }
    batches
}

/// What the fault controller did, and when.
struct Faults {
    acked_at_migrate: usize,
    migrate: Result<pgloom::migrate::Migration, String>,
    migrate_took: Duration,
    acked_at_stop: usize,
    acked_at_restart: usize,
    down_for: Duration,
}

fn wait_for(mut condition: impl FnMut() -> bool, deadline: Instant) {
    while !condition() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
}

/// What sixteen writers, a shard's hard stop and a collation conversion
/// under them left: each count is of something lost, and must be 0.
struct WritersRun {
    total_batches: usize,
    /// Events of acknowledged batches not read back.
    acked_missing: u64,
    /// Events read back more than once.
    duplicated: u64,
    /// Batches partly stored (or stored though never tried).
    torn: u64,
    /// Rows no batch accounts for.
    phantom: u64,
    /// Batches present before they were written.
    preexisting: u64,
    /// Batches the deadline cut off before a try.
    not_attempted: usize,
    /// The bulk rows the conversion lost (or gained).
    bulk_lost: u64,
    /// migrate()'s warnings, or its error.
    migration: Result<Vec<String>, String>,
    /// events.execution_id's collation after the run.
    collation: String,
    faults: Faults,
}

static WRITERS_RUN: OnceLock<Result<WritersRun, String>> = OnceLock::new();

fn writers_run() -> &'static WritersRun {
    scenario(&WRITERS_RUN, run_writers_through_faults)
}

#[test]
fn sixteen_writers_lose_no_acknowledged_event_through_a_shard_restart_and_a_conversion() {
    let run = writers_run();
    assert_eq!(
        (run.acked_missing, run.preexisting),
        (0, 0),
        "(acknowledged events missing, batches there before they were written)"
    );
}

#[test]
fn sixteen_writers_through_faults_leave_no_batch_torn_duplicated_or_phantom() {
    let run = writers_run();
    assert_eq!(
        (run.duplicated, run.torn, run.phantom),
        (0, 0, 0),
        "(events duplicated, batches half there, phantom rows)"
    );
}

#[test]
fn sixteen_writers_try_every_batch_while_the_faults_come() {
    let run = writers_run();
    assert_eq!(
        run.not_attempted, 0,
        "every batch was tried before the deadline"
    );
    assert!(
        run.faults.acked_at_stop < run.total_batches
            && run.faults.acked_at_migrate < run.total_batches,
        "the faults came while the writers wrote"
    );
}

#[test]
fn a_collation_conversion_under_sixteen_writers_ends_in_c_and_keeps_every_row() {
    let run = writers_run();
    let warnings = run
        .migration
        .as_ref()
        .unwrap_or_else(|e| panic!("migrate() during the writes: {e}"));
    assert_eq!(run.collation, "C", "the conversion ran: {warnings:?}");
    assert_eq!(run.bulk_lost, 0, "bulk rows lost by the conversion");
}

/// Each batch against what was read back: acknowledged and whole,
/// unacknowledged and whole or absent, or torn; and every event counted
/// once.
struct Tally {
    acked_batches: usize,
    acked_missing: u64,
    unacked_present: usize,
    unacked_absent: usize,
    torn: u64,
    committed_unacked: usize,
    failed_attempts: u32,
    not_attempted: usize,
    preexisting: u64,
    accounted: usize,
    duplicated: u64,
}

fn tally(batches: &[Batch], executions: &HashMap<(Target, String), Vec<i64>>) -> Tally {
    let mut counts: HashMap<(&str, i64), usize> = HashMap::new();
    for ((_, id), sequences) in executions {
        for sequence in sequences {
            *counts.entry((id.as_str(), *sequence)).or_default() += 1;
        }
    }
    let mut acked_batches = 0;
    let mut acked_missing = 0u64;
    let mut unacked_present = 0;
    let mut unacked_absent = 0;
    let mut torn = 0u64;
    let mut committed_unacked = 0;
    let mut failed_attempts = 0;
    let mut not_attempted = 0;
    let mut preexisting = 0u64;
    let mut accounted = 0usize;
    for batch in batches {
        failed_attempts += batch.failures;
        committed_unacked += usize::from(batch.committed_unacked);
        preexisting += u64::from(batch.preexisting);
        let present = (batch.first..batch.first + BATCH as i64)
            .filter(|s| counts.contains_key(&(batch.execution_id.as_str(), *s)))
            .count();
        accounted += present;
        if !batch.attempted {
            not_attempted += 1;
            torn += u64::from(present != 0);
        } else if batch.acked {
            acked_batches += 1;
            acked_missing += (BATCH - present) as u64;
        } else if present == BATCH {
            unacked_present += 1;
        } else if present == 0 {
            unacked_absent += 1;
        } else {
            torn += 1;
        }
    }
    let duplicated: u64 = counts.values().map(|&n| (n - 1) as u64).sum();
    Tally {
        acked_batches,
        acked_missing,
        unacked_present,
        unacked_absent,
        torn,
        committed_unacked,
        failed_attempts,
        not_attempted,
        preexisting,
        accounted,
        duplicated,
    }
}

/// The faults, from a plain thread (pg_ctl blocks): migrate()'s collation
/// conversion once 15% of the batches are acknowledged, s2 stopped hard at
/// 30% and started again a second later.
fn inject_faults(
    acked: Arc<AtomicUsize>,
    total_batches: usize,
    deadline: Instant,
    handle: tokio::runtime::Handle,
    config: String,
) -> thread::JoinHandle<Faults> {
    thread::spawn(move || {
        wait_for(
            || acked.load(Ordering::Relaxed) >= total_batches * 15 / 100,
            deadline,
        );
        let acked_at_migrate = acked.load(Ordering::Relaxed);
        let migration = handle.spawn(async move {
            let started = Instant::now();
            let mut options = MigrateOptions::new();
            // Writers hold row locks briefly; the conversion must win
            // its ACCESS EXCLUSIVE lock, not skip, for this test.
            options.lock_timeout(std::time::Duration::from_secs(20));
            let result = migrate(&config, &options).await.map_err(|e| detail(&e));
            (result, started.elapsed())
        });
        wait_for(
            || acked.load(Ordering::Relaxed) >= total_batches * 30 / 100,
            deadline,
        );
        let acked_at_stop = acked.load(Ordering::Relaxed);
        let stopped_at = Instant::now();
        let s2 = Cluster::Shard(1)
            .stop_immediately()
            .unwrap_or_else(|e| panic!("{e}"));
        thread::sleep(Duration::from_secs(1));
        s2.restart().unwrap_or_else(|e| panic!("{e}"));
        let down_for = stopped_at.elapsed();
        let acked_at_restart = acked.load(Ordering::Relaxed);
        let (migrate, migrate_took) = handle.block_on(migration).expect("migrate's task");
        Faults {
            acked_at_migrate,
            migrate,
            migrate_took,
            acked_at_stop,
            acked_at_restart,
            down_for,
        }
    })
}

fn run_writers_through_faults() -> WritersRun {
    let test_started = Instant::now();
    let rt = runtime();
    let db = "loom_fault_writers";
    let icu_db = "loom_fault_writers_icu";

    let shards: Vec<PgEventStore> = Cluster::SHARDS
        .iter()
        .map(|shard| {
            let _ = shard.fresh_database(db);
            PgEventStore::connect(&shard.database(db)).unwrap()
        })
        .collect();
    let sharded = Arc::new(ShardedEventStore::new(shards));
    let mut icu = Cluster::Icu.fresh_database_at(icu_db, "0.1.0");
    icu.batch_execute(&format!(
        "INSERT INTO loom.events (execution_id, sequence, kind, payload)
         SELECT 'bulk-' || (i / 2), i % 2, 'step', '{{}}' FROM generate_series(0, {}) i",
        BULK_ROWS - 1
    ))
    .unwrap();
    icu.batch_execute("VACUUM ANALYZE loom.events").unwrap();
    assert_ne!(collation_of(&mut icu, "events", "execution_id"), "C");
    let icu_config = Cluster::Icu.database(icu_db);
    // Eight writers share it: a pool as large as they are.
    let converting = Arc::new(PgEventStore::new(pg_pool(&icu_config, 8).unwrap()));

    let plans: Vec<Vec<Batch>> = (0..WRITERS).map(plan).collect();
    let total_batches: usize = plans.iter().map(Vec::len).sum();
    let acked = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(45);
    let setup_took = test_started.elapsed();

    let controller = inject_faults(
        Arc::clone(&acked),
        total_batches,
        deadline,
        rt.handle().clone(),
        icu_config.clone(),
    );

    let writing = Instant::now();
    let batches: Vec<Batch> = rt.block_on(async {
        let tasks: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(w, plan)| {
                let acked = Arc::clone(&acked);
                if plan[0].target == Target::Sharded {
                    tokio::spawn(write(Arc::clone(&sharded), w, plan, acked, deadline))
                } else {
                    tokio::spawn(write(Arc::clone(&converting), w, plan, acked, deadline))
                }
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("a writer task"));
        }
        all
    });
    let write_took = writing.elapsed();
    let faults = controller.join().expect("the fault controller");

    // Every execution read back through its store, after the faults.
    let verifying = Instant::now();
    let mut executions: HashMap<(Target, String), Vec<i64>> = HashMap::new();
    for batch in &batches {
        executions
            .entry((batch.target, batch.execution_id.clone()))
            .or_default();
    }
    let read: Vec<((Target, String), Vec<i64>)> = rt.block_on(
        futures::stream::iter(executions.keys().cloned())
            .map(|(target, id)| {
                let (sharded, converting) = (Arc::clone(&sharded), Arc::clone(&converting));
                async move {
                    let events = match target {
                        Target::Sharded => sharded.read_events(&id).await,
                        Target::Converting => converting.read_events(&id).await,
                    }
                    .unwrap_or_else(|e| panic!("reading {id} back: {}", detail(&e)));
                    ((target, id), events.iter().map(|e| e.sequence).collect())
                }
            })
            .buffer_unordered(8)
            .collect(),
    );
    executions.extend(read);

    let Tally {
        acked_batches,
        acked_missing,
        unacked_present,
        unacked_absent,
        torn,
        committed_unacked,
        failed_attempts,
        not_attempted,
        preexisting,
        accounted,
        duplicated,
    } = tally(&batches, &executions);

    // Rows no writer wrote (or wrote twice under another key) would be
    // phantoms: count what each database holds.
    let mut stored = 0i64;
    for shard in Cluster::SHARDS {
        stored += shard
            .connect(db)
            .query_one("SELECT count(*) FROM loom.events", &[])
            .unwrap()
            .get::<_, i64>(0);
    }
    let mut icu = Cluster::Icu.connect(icu_db);
    let row = icu
        .query_one(
            "SELECT count(*) FILTER (WHERE execution_id NOT LIKE 'bulk-%'),
                    count(*) FILTER (WHERE execution_id LIKE 'bulk-%')
             FROM loom.events",
            &[],
        )
        .unwrap();
    stored += row.get::<_, i64>(0);
    let bulk_after: i64 = row.get(1);
    let phantom = (stored - accounted as i64).unsigned_abs();
    let verify_took = verifying.elapsed();

    let migration = match &faults.migrate {
        Ok(report) => Ok(report.warnings.clone()),
        Err(e) => Err(e.to_string()),
    };
    let collation = collation_of(&mut icu, "events", "execution_id");
    let version = version_of(&mut icu);
    println!(
        "writers: setup {setup_took:.1?}, writes {write_took:.1?}, verify {verify_took:.1?}; \
         migrate at {}/{total_batches} batches acked, s2 stopped at {}, back at {}",
        faults.acked_at_migrate, faults.acked_at_stop, faults.acked_at_restart
    );
    print_report(
        "16 writers, 100k events",
        &[
            Outcome {
                injected: format!(
                    "s2 `pg_ctl stop -m immediate`, restarted after {:.1?}",
                    faults.down_for
                ),
                observed: format!(
                    "{failed_attempts} failed appends retried; {committed_unacked} committed unacked"
                ),
                lost: 0,
            },
            Outcome {
                injected: format!(
                    "migrate() 0.1.0→{version} converting {}k rows",
                    BULK_ROWS / 1000
                ),
                observed: format!(
                    "took {:.1?}, events.execution_id now {collation:?}, {} warnings, bulk rows {bulk_after}",
                    faults.migrate_took,
                    migration.as_ref().map_or(0, Vec::len)
                ),
                lost: (BULK_ROWS - bulk_after).unsigned_abs(),
            },
            Outcome {
                injected: format!(
                    "{WRITERS} writers, {} events in {total_batches} batches of {BATCH}",
                    total_batches * BATCH
                ),
                observed: format!(
                    "{acked_batches} acked, unacked {unacked_present} present/{unacked_absent} absent, {not_attempted} not tried"
                ),
                lost: acked_missing + duplicated + torn + phantom + preexisting,
            },
        ],
    );
    WritersRun {
        total_batches,
        acked_missing,
        duplicated,
        torn,
        phantom,
        preexisting,
        not_attempted,
        bulk_lost: (BULK_ROWS - bulk_after).unsigned_abs(),
        migration,
        collation,
        faults,
    }
}

// ---------------------------------------------------------- sharded pass

/// What a sharded pass saw as shard 2 stopped under it, then again once
/// it was back.
struct PassRun {
    /// The stream's error (None: it ended as if complete), as matched.
    stream_error: Option<Result<(), String>>,
    /// How many ids the stream gave first, and whether they were the
    /// first ones of the whole order.
    seen: usize,
    seen_in_order: bool,
    /// One page asked while the shard was down, as matched.
    direct_page: Result<(), String>,
    /// The pass after the restart: its error, or the ids missing and
    /// duplicated and whether it gave every id in order.
    rerun: Result<(u64, u64, bool), String>,
}

const PASS_IDS: u64 = 30_000;

static PASS_RUN: OnceLock<Result<PassRun, String>> = OnceLock::new();

/// Whether `result` failed as shard 2 of 3: the error a pass must end with.
fn shard_2_of_3<T: std::fmt::Debug>(result: &Result<T, Error>) -> Result<(), String> {
    match result {
        Err(Error::Shard {
            shard: 2,
            shards: 3,
            ..
        }) => Ok(()),
        Err(e) => Err(format!(
            "expected Error::Shard {{ shard: 2, shards: 3 }}, got {}",
            detail(e)
        )),
        Ok(v) => Err(format!(
            "expected Error::Shard {{ shard: 2, shards: 3 }}, got Ok({v:?})"
        )),
    }
}

#[test]
fn a_shard_stopped_mid_pass_fails_the_stream_loudly_naming_the_shard() {
    let run = scenario(&PASS_RUN, run_pass_through_a_stopped_shard);
    let error = run.stream_error.as_ref().unwrap_or_else(|| {
        panic!(
            "the pass ended as if complete after {} of {PASS_IDS} ids with shard 2 down",
            run.seen
        )
    });
    error.as_ref().unwrap_or_else(|e| panic!("{e}"));
    assert!(run.seen_in_order, "what came before the failure was right");
}

#[test]
fn a_page_asked_while_a_shard_is_down_is_an_error_never_a_short_page() {
    let run = scenario(&PASS_RUN, run_pass_through_a_stopped_shard);
    run.direct_page.as_ref().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_pass_rerun_once_the_shard_is_back_gives_every_id_once_in_order() {
    let run = scenario(&PASS_RUN, run_pass_through_a_stopped_shard);
    let (missing, duplicated, in_order) = run
        .rerun
        .as_ref()
        .unwrap_or_else(|e| panic!("the pass after the restart: {e}"));
    assert_eq!(
        (*missing, *duplicated, *in_order),
        (0, 0, true),
        "(missing, duplicated, in order)"
    );
}

fn run_pass_through_a_stopped_shard() -> PassRun {
    let started = Instant::now();
    let rt = runtime();
    let db = "loom_fault_pass";
    const IDS: u64 = PASS_IDS;
    const PAGE: usize = 1000;
    /// Ids taken from the stream before the shard goes down: mid-page.
    const STOP_AFTER: usize = 4_500;

    let mut clients: Vec<Client> = Cluster::SHARDS
        .iter()
        .map(|shard| shard.fresh_database(db))
        .collect();
    let store = ShardedEventStore::new(
        Cluster::SHARDS
            .iter()
            .map(|shard| PgEventStore::connect(&shard.database(db)).unwrap())
            .collect(),
    );
    let ids: Vec<String> = (0..IDS).map(mixed_case_id).collect();
    for (shard, client) in clients.iter_mut().enumerate() {
        copy_executions(
            client,
            ids.iter().filter(|id| store.shard_of(id) == shard).cloned(),
        );
    }
    let mut expected = ids.clone();
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));

    let victim = Cluster::Shard(2);
    let (seen, error, guard) = rt.block_on(async {
        let mut stream = std::pin::pin!(iterate_execution_ids(&store, PAGE));
        let mut seen: Vec<String> = Vec::new();
        let mut guard = None;
        loop {
            match stream.next().await {
                Some(Ok(id)) => {
                    seen.push(id);
                    if seen.len() == STOP_AFTER {
                        guard = Some(victim.stop_immediately().unwrap_or_else(|e| panic!("{e}")));
                    }
                }
                Some(Err(e)) => break (seen, Some(e), guard),
                None => break (seen, None, guard),
            }
        }
    });
    let guard = guard.expect("the shard was stopped mid-pass");
    // One page asked directly while the shard is down: an error, never a
    // short page that would read as "the end".
    let direct = rt.block_on(store.list_executions_page(seen.last().map(String::as_str), PAGE));

    let stream_error = error.map(|e| shard_2_of_3::<()>(&Err(e)));
    let direct_page = shard_2_of_3(&direct.map(|p| p.ids.len()));
    let seen_in_order = seen[..] == expected[..seen.len()];

    let restart_took = guard.restart().unwrap_or_else(|e| panic!("{e}"));
    drop(guard);
    let rerun: Result<Vec<String>, String> = rt
        .block_on(iterate_execution_ids(&store, PAGE).try_collect())
        .map_err(|e: Error| detail(&e));
    let rerun = rerun.map(|rerun| {
        let unique: HashSet<&String> = rerun.iter().collect();
        let missing = expected.iter().filter(|id| !unique.contains(id)).count() as u64;
        let duplicated = (rerun.len() - unique.len()) as u64;
        (missing, duplicated, rerun == expected)
    });
    println!(
        "sharded pass: {:.1?} in all; the stream's error: {stream_error:?}",
        started.elapsed()
    );
    print_report(
        "sharded pass over 3 shards",
        &[
            Outcome {
                injected: format!("s3 `pg_ctl stop -m immediate` after {STOP_AFTER}/{IDS} ids"),
                observed: format!(
                    "stream: {stream_error:?} after {} ids; page: {direct_page:?}",
                    seen.len()
                ),
                lost: 0,
            },
            Outcome {
                injected: format!("s3 restarted ({restart_took:.1?}), full pass again"),
                observed: format!("(missing, duplicated, in order): {rerun:?}"),
                lost: rerun.as_ref().map_or(0, |(m, d, _)| m + d),
            },
        ],
    );
    PassRun {
        stream_error,
        seen: seen.len(),
        seen_in_order,
        direct_page,
        rerun,
    }
}

// -------------------------------------------------------- kill -9 upgrade

/// Rows in the database whose upgrade is killed: its conversion (rewrite
/// and index rebuilds, ~1-2 s a million rows) must still be running when
/// the backend is found holding the lock.
const KILL_ROWS: i64 = 1_000_000;

/// What must survive: a checksum of every event and ref.
fn fingerprint(client: &mut Client) -> (i64, i64, i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM loom.events),
                    (SELECT coalesce(sum(hashtext(execution_id || '/' || sequence || '/' || kind || '/' || payload::text)), 0) FROM loom.events),
                    (SELECT count(*) FROM loom.refs),
                    (SELECT coalesce(sum(hashtext(name || '/' || execution_id || '/' || sequence)), 0) FROM loom.refs)",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// What a SIGKILL of the backend running `ALTER EXTENSION loom UPDATE`
/// left, and what a rerun of the update then did.
struct Kill9Run {
    /// What the killed update's client saw (it must be an error).
    upgrade: Result<(), String>,
    /// The version and id collation after the crash recovery, and whether
    /// every event and ref is as before.
    after_crash: (String, String, bool),
    /// The rerun, the version it was to reach, and the same three after it.
    rerun: Result<(), String>,
    target: String,
    after_rerun: (String, String, bool),
}

static KILL9_RUN: OnceLock<Result<Kill9Run, String>> = OnceLock::new();

#[test]
fn kill_9_of_the_upgrading_backend_keeps_the_old_version_and_every_row() {
    let run = scenario(&KILL9_RUN, run_kill_9_mid_upgrade);
    assert!(run.upgrade.is_err(), "the killed upgrade reported success");
    let (version, collation, intact) = &run.after_crash;
    assert_eq!(version, "0.1.0", "the killed update rolled back");
    assert_ne!(collation, "C");
    assert!(intact, "events or refs changed by the crash");
}

#[test]
fn after_kill_9_a_rerun_of_the_upgrade_succeeds_and_converts() {
    let run = scenario(&KILL9_RUN, run_kill_9_mid_upgrade);
    run.rerun
        .as_ref()
        .unwrap_or_else(|e| panic!("the rerun: {e}"));
    let (version, collation, intact) = &run.after_rerun;
    assert_eq!(version, &run.target);
    assert_eq!(collation, "C");
    assert!(intact, "events or refs changed by the rerun");
}

fn run_kill_9_mid_upgrade() -> Kill9Run {
    let started = Instant::now();
    let db = "loom_fault_kill9";
    let icu = Cluster::Icu;
    let mut client = icu.fresh_database_at(db, "0.1.0");
    client
        .batch_execute(&format!(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload)
             SELECT 'exec-' || (i / 2), i % 2, 'step', jsonb_build_object('i', i)
             FROM generate_series(0, {}) i;
             SELECT loom_put_ref('ref-' || i, 'exec-' || i, 1) FROM generate_series(1, 1000) i",
            KILL_ROWS - 1
        ))
        .unwrap();
    // Each its own statement (VACUUM refuses a transaction block). The
    // checkpoint keeps the crash recovery to the killed upgrade's own WAL.
    client.batch_execute("VACUUM ANALYZE loom.events").unwrap();
    client.batch_execute("CHECKPOINT").unwrap();
    let before = fingerprint(&mut client);
    let target = newest_version(&mut client);
    let loaded_in = started.elapsed();

    let upgrader = {
        let target = target.clone();
        thread::spawn(move || {
            let mut client = icu.connect(db);
            upgrade_extension(&mut client, &target).map_err(|e| describe(&e))
        })
    };
    // The backend running ALTER EXTENSION, once it holds loom.events in
    // ACCESS EXCLUSIVE mode: the conversion has begun and has not committed
    // (the lock goes only at the end of the transaction).
    let mut monitor = icu.connect(db);
    let watching = Instant::now();
    let pid: i32 = loop {
        let found = monitor
            .query_opt(
                "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
                 WHERE a.datname = current_database() AND a.query LIKE 'ALTER EXTENSION%'
                   AND l.locktype = 'relation' AND l.relation = 'loom.events'::regclass
                   AND l.mode = 'AccessExclusiveLock' AND l.granted",
                &[],
            )
            .unwrap();
        if let Some(row) = found {
            break row.get(0);
        }
        assert!(
            !upgrader.is_finished(),
            "the upgrade ended before it was seen converting: {:?}",
            upgrader.join()
        );
        assert!(
            watching.elapsed() < Duration::from_secs(60),
            "no ALTER EXTENSION holding loom.events"
        );
        thread::sleep(Duration::from_millis(2));
    };
    let lock_seen_after = watching.elapsed();
    // The whole cluster crash-restarts: whatever happens next, the guard
    // waits until it takes connections again.
    let _recovered = RestartOnDrop::new(icu);
    kill_9(pid).unwrap_or_else(|e| panic!("{e}"));
    let recovery = icu
        .wait_for_crash_recovery(pid, SERVER_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    let upgrade = upgrader.join().expect("the upgrade thread");
    drop(monitor);

    let mut client = icu.connect(db);
    let version_after_crash = version_of(&mut client);
    let collation_after_crash = collation_of(&mut client, "events", "execution_id");
    let after_crash = fingerprint(&mut client);

    let rerun_started = Instant::now();
    let rerun = upgrade_extension(&mut client, &target).map_err(|e| describe(&e));
    let rerun_took = rerun_started.elapsed();
    let version_after_rerun = version_of(&mut client);
    let collation_after_rerun = collation_of(&mut client, "events", "execution_id");
    let after_rerun = fingerprint(&mut client);

    let lost_rows = |f: (i64, i64, i64, i64)| -> u64 {
        let missing = (before.0 - f.0).unsigned_abs() + (before.2 - f.2).unsigned_abs();
        // Same counts but other contents is lost data too.
        missing.max(u64::from(f != before))
    };
    println!(
        "kill -9: loaded {KILL_ROWS} rows in {loaded_in:.1?}; {:.1?} in all",
        started.elapsed()
    );
    print_report(
        "kill -9 mid-upgrade",
        &[
            Outcome {
                injected: format!(
                    "kill -9 of ALTER EXTENSION (pid {pid}) {lock_seen_after:.1?} in, {}M rows",
                    KILL_ROWS / 1_000_000
                ),
                observed: format!(
                    "client: {}; recovery {recovery:.1?}; now {version_after_crash}, {collation_after_crash:?}",
                    cell(upgrade.as_ref().err().map_or("Ok", String::as_str), 22)
                ),
                lost: lost_rows(after_crash),
            },
            Outcome {
                injected: format!("rerun of the upgrade to {target}"),
                observed: format!(
                    "{} in {rerun_took:.1?}; now {version_after_rerun}, {collation_after_rerun:?}",
                    rerun.as_ref().map_or_else(|e| cell(e, 30), |()| "Ok".to_owned())
                ),
                lost: lost_rows(after_rerun),
            },
        ],
    );
    Kill9Run {
        upgrade,
        after_crash: (
            version_after_crash,
            collation_after_crash,
            after_crash == before,
        ),
        rerun,
        target,
        after_rerun: (
            version_after_rerun,
            collation_after_rerun,
            after_rerun == before,
        ),
    }
}

// ------------------------------------------------------------ 8 replicas

/// What one replica's boot gave: its migration and whether its zstd
/// snapshot store writes frames, or what stopped it.
type Boot = Result<(pgloom::migrate::Migration, bool), String>;

/// Boots `replicas` replicas of a service on database `config` at once: each,
/// in its own thread with its own runtime and pool, runs migrate() then
/// opens a zstd PgSnapshotStore, as a service does at boot. Two barriers
/// line them up: at the start, and again before the stores open, because
/// migrate() queues the replicas one behind another and would otherwise
/// spread their provisioning too thin for two of them to ever collide.
fn boot_replicas(config: &str, replicas: usize) -> Vec<Boot> {
    let start = Arc::new(Barrier::new(replicas));
    let provision = Arc::new(Barrier::new(replicas));
    let threads: Vec<_> = (0..replicas)
        .map(|_| {
            let (start, provision) = (Arc::clone(&start), Arc::clone(&provision));
            let config = config.to_owned();
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                start.wait();
                let migration = rt
                    .block_on(migrate(&config, &MigrateOptions::new()))
                    .map_err(|e| format!("migrate: {}", detail(&e)));
                // The pool's connection opened before the barrier, so that
                // connection set-up does not spread the replicas out again.
                let pool = pg_pool(&config, 2).map_err(|e| detail(&e));
                let warm = pool.as_ref().map_err(Clone::clone).and_then(|pool| {
                    rt.block_on(pool.as_ref().get())
                        .map(drop)
                        .map_err(|e| detail(&e))
                });
                // Waited for even after a failure: the others wait here too.
                provision.wait();
                let migration = migration?;
                warm?;
                let pool = pool?;
                let store = rt
                    .block_on(PgSnapshotStore::start(
                        pool,
                        PgSnapshotStoreOptions::new().codec(Codec::Zstd),
                    ))
                    .map_err(|e| format!("PgSnapshotStore::connect (zstd): {}", detail(&e)))?;
                Ok((migration, store.writes_frames()))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a replica thread"))
        .collect()
}

/// Rounds of the boot race, alternating two starts: a database without
/// loom (the replicas race to create it; a fresh install has the frame
/// column) and a 0.2.0 deployment (they race to upgrade it, then to opt in
/// to frames, which is where two `loom_ensure_snapshot_zstd` collide).
/// Against the unserialized function of before the fix, 18 rounds of 20
/// here had replicas fail with 42701: three rounds all missing it is
/// unlikely.
const BOOT_ROUNDS: usize = 6;

#[test]
fn eight_replicas_booting_at_once_all_start() {
    let _serial = serial();
    let started = Instant::now();
    const REPLICAS: usize = 8;
    let db = "loom_fault_boot";
    let (mut booted, mut failed, mut created, mut framing, mut with_column) = (0, 0, 0, 0, 0);
    let mut version = String::new();
    for round in 0..BOOT_ROUNDS {
        if round % 2 == 0 {
            let _ = Cluster::Icu.fresh_database_without_loom(db, "");
        } else {
            let _ = Cluster::Icu.fresh_database_at(db, "0.2.0");
        }
        let outcomes = boot_replicas(&Cluster::Icu.database(db), REPLICAS);
        for outcome in &outcomes {
            match outcome {
                Ok((migration, frames)) => {
                    booted += 1;
                    created += usize::from(migration.from_version.is_none());
                    framing += usize::from(*frames);
                }
                Err(e) => {
                    failed += 1;
                    println!("  round {round}: a replica failed: {e}");
                }
            }
        }
        let mut client = Cluster::Icu.connect(db);
        let frame_column: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute a
                   JOIN pg_class t ON t.oid = a.attrelid JOIN pg_namespace n ON n.oid = t.relnamespace
                   WHERE n.nspname = 'loom' AND t.relname = 'snapshots' AND a.attname = 'state_z'
                     AND NOT a.attisdropped)",
                &[],
            )
            .unwrap()
            .get(0);
        with_column += usize::from(frame_column);
        version = version_of(&mut client);
    }
    let all = BOOT_ROUNDS * REPLICAS;
    println!(
        "8 replicas: {BOOT_ROUNDS} rounds in {:.1?}",
        started.elapsed()
    );
    report(
        "8 replicas booting",
        &[Outcome {
            injected: format!(
                "{REPLICAS} replicas at once: migrate() + zstd store, {BOOT_ROUNDS} rounds (new db / 0.2.0)"
            ),
            observed: format!(
                "{booted}/{all} started, {created} created {version}, {framing} frame, state_z in {with_column}/{BOOT_ROUNDS}"
            ),
            lost: 0,
        }],
    );
    assert_eq!(failed, 0, "replicas that did not start (above)");
    assert_eq!(
        created,
        BOOT_ROUNDS / 2,
        "exactly one replica created the extension in each round that had none"
    );
    assert_eq!(with_column, BOOT_ROUNDS, "loom.snapshots.state_z exists");
    assert_eq!(framing, all, "every zstd replica writes frames");
}
