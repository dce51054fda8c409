//! pgloom's stores, printed side by side in one run:
//!
//! - a full id pass over 1M executions (2M events) on one Postgres vs
//!   ShardedEventStore over three Postgres servers (target: sharded within
//!   1.5x of single), and again at 2M executions, to show it is linear;
//! - in-memory prune_branch_refs over 100k refs (ADR 0108: 179 s before the
//!   tombstone fix; target <= 1 s) and 1M;
//! - append throughput through the client, single events and batches, on
//!   Postgres and SQLite.

use std::time::{Duration, Instant};

use loom_harness::bench_support::full_pass;
use loom_harness::{copy_executions, mixed_case_id, runtime, Cluster};
use pgloom::branch_registry::{prune_branch_refs, BranchRegistry, MemoryBranchRegistry};
use pgloom::event_store::{Event, EventStore, PgEventStore, ShardedEventStore, SqliteEventStore};

const PAGE: usize = 1000;

fn load(
    single: &mut postgres::Client,
    shards: &mut [postgres::Client],
    router: &ShardedEventStore<PgEventStore>,
    from: u64,
    n: u64,
) {
    copy_executions(single, (from..from + n).map(mixed_case_id));
    for (i, shard) in shards.iter_mut().enumerate() {
        copy_executions(
            shard,
            (from..from + n)
                .map(mixed_case_id)
                .filter(|id| router.shard_of(id) == i),
        );
    }
}

/// Events/s of four kinds of append: one event of a new execution at a
/// time, batches of 100 events of 100 new executions, and the same two on
/// executions that already have events (an agent loop's usual write).
async fn appends<S: EventStore>(store: &S, tag: &str) -> [f64; 4] {
    let rate = |events: u32, started: Instant| f64::from(events) / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for i in 0..2_000 {
        store
            .append(&[Event::new(
                format!("single-{tag}-{i}"),
                1,
                "step",
                serde_json::json!({"n": i}),
            )])
            .await
            .unwrap();
    }
    let single_new = rate(2_000, started);
    let started = Instant::now();
    for b in 0..200 {
        let events: Vec<Event> = (0..100)
            .map(|i| {
                Event::new(
                    format!("batch-{tag}-{b}-{i}"),
                    1,
                    "step",
                    serde_json::json!({"n": i}),
                )
            })
            .collect();
        store.append(&events).await.unwrap();
    }
    let batch_new = rate(20_000, started);
    // The executions above get more events: 20 of them, 100 each, singly.
    let started = Instant::now();
    for n in 0..2_000i64 {
        let id = format!("single-{tag}-{}", n % 20);
        store
            .append(&[Event::new(
                id,
                2 + n / 20,
                "step",
                serde_json::json!({"n": n}),
            )])
            .await
            .unwrap();
    }
    let single_existing = rate(2_000, started);
    // And batches of 100 events of one existing execution each.
    let started = Instant::now();
    for b in 0..200i64 {
        let id = format!("batch-{tag}-{b}-0");
        let events: Vec<Event> = (0..100)
            .map(|i| Event::new(id.clone(), 2 + i, "step", serde_json::json!({"n": i})))
            .collect();
        store.append(&events).await.unwrap();
    }
    let batch_existing = rate(20_000, started);
    [single_new, batch_new, single_existing, batch_existing]
}

fn prune(refs: usize) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let registry = MemoryBranchRegistry::new();
        for i in 0..refs {
            registry
                .put_ref(&format!("branch/{i:08}"), "exec", 1)
                .await
                .unwrap();
        }
        let started = Instant::now();
        let deleted = prune_branch_refs(&registry, PAGE, |name| {
            name.ends_with(['0', '2', '4', '6', '8'])
        })
        .await
        .unwrap();
        assert_eq!(deleted, refs / 2);
        started.elapsed()
    })
}

fn main() {
    let executions: u64 = std::env::var("LOOM_BENCH_EXECUTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let rt = runtime();
    let db = "loom_bench_stores";
    let mut single_client = Cluster::Icu.fresh_database(db);
    let mut shard_clients: Vec<postgres::Client> = Cluster::SHARDS
        .iter()
        .map(|s| s.fresh_database(db))
        .collect();
    let single = PgEventStore::connect(&Cluster::Icu.database(db)).unwrap();
    let sharded = ShardedEventStore::new(
        Cluster::SHARDS
            .iter()
            .map(|s| PgEventStore::connect(&s.database(db)).unwrap())
            .collect(),
    );

    println!("\nfull id pass, pages of {PAGE}, one Postgres vs ShardedEventStore over three:");
    println!(
        "{:>12} {:>14} {:>16} {:>15} {:>16} {:>8}",
        "executions",
        "single total",
        "single p50 page",
        "sharded total",
        "sharded p50 page",
        "ratio"
    );
    let mut loaded = 0;
    for target in [executions, 2 * executions] {
        load(
            &mut single_client,
            &mut shard_clients,
            &sharded,
            loaded,
            target - loaded,
        );
        loaded = target;
        let (n1, t1, p1) = rt.block_on(full_pass(&single, PAGE));
        let (n3, t3, p3) = rt.block_on(full_pass(&sharded, PAGE));
        assert_eq!((n1, n3), (target, target), "every id once");
        println!(
            "{target:>12} {:>12.2} s {:>13.2} ms {:>13.2} s {:>13.2} ms {:>7.2}x",
            t1.as_secs_f64(),
            p1,
            t3.as_secs_f64(),
            p3,
            t3.as_secs_f64() / t1.as_secs_f64()
        );
    }

    println!("\nin-memory prune_branch_refs (half the refs deleted while paging):");
    for refs in [100_000, 1_000_000] {
        println!("{refs:>9} refs: {:.3} s", prune(refs).as_secs_f64());
    }

    println!("\nappends through the client (events/s):");
    let sqlite_path = std::env::temp_dir().join(format!("loom-bench-{}.db", std::process::id()));
    let sqlite = SqliteEventStore::open(&sqlite_path).unwrap();
    // The same appends with and without the triggers that keep
    // loom.executions (as through 0.3.0): what the id index costs a write.
    // Alternated three times, the best of each, so that the machine's
    // drift does not pass for the difference.
    let best = |a: [f64; 4], b: [f64; 4]| std::array::from_fn(|i| a[i].max(b[i]));
    let (mut with_triggers, mut without_triggers) = ([0.0; 4], [0.0; 4]);
    for round in 0..3 {
        with_triggers = best(
            with_triggers,
            rt.block_on(appends(&single, &format!("pg-{round}"))),
        );
        single_client
            .batch_execute("ALTER TABLE loom.events DISABLE TRIGGER USER")
            .unwrap();
        without_triggers = best(
            without_triggers,
            rt.block_on(appends(&single, &format!("pg-bare-{round}"))),
        );
        single_client
            .batch_execute(
                "ALTER TABLE loom.events ENABLE TRIGGER USER; SELECT loom_rebuild_executions();",
            )
            .unwrap();
    }
    println!(
        "{:<34} {:>14} {:>14} {:>18} {:>18}",
        "", "single, new", "100 new", "single, existing", "100 of one, existing"
    );
    for (name, rates) in [
        ("Postgres (ICU en-US, loom 0.4.0)", with_triggers),
        ("... its triggers off (as 0.3.0)", without_triggers),
        (
            "SQLite (file, default journal)",
            rt.block_on(appends(&sqlite, "sqlite")),
        ),
    ] {
        println!(
            "{name:<34} {:>14.0} {:>14.0} {:>18.0} {:>18.0}",
            rates[0], rates[1], rates[2], rates[3]
        );
    }
    std::fs::remove_file(&sqlite_path).ok();
}
