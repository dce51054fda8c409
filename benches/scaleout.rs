//! The three ways loom grows, side by side in one run, at 1M executions
//! (2M events; `LOOM_BENCH_EXECUTIONS` to change it):
//!
//! - one node (the ICU en-US cluster);
//! - Citus, a coordinator and two workers on this machine, loom's tables
//!   distributed by `loom_distribute` (`LOOM_BENCH_CITUS_SHARDS`, 8);
//! - `ShardedEventStore` over three independent nodes.
//!
//! For each: the p50 of a 1000-id page and a full id pass, through the
//! client; append throughput with 16 concurrent writers (one event of its
//! own execution a call, and batches of 100 events of one execution); and,
//! for Citus, EXPLAIN ANALYZE of the page the coordinator pushes down.
//!
//! Then retention by age (issue 39): `loom_sweep_idle_executions` beside a
//! plain batched `DELETE` of the same rows from a plain table of the same
//! columns and primary key, on one node and distributed on Citus
//! (`LOOM_BENCH_SWEEP_EXECUTIONS`, 20,000 executions of 2 events, half of
//! them idle). `LOOM_BENCH_SCALEOUT=sweep` runs that part alone, `page`
//! the rest alone.
//!
//! Every server shares the same 2 cores: Citus's and the shards' numbers
//! are what spreading the work costs, not what more machines would buy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_harness::bench_support::{env_or, full_pass};
use loom_harness::citus::{citus_available, fresh_distributed_database};
use loom_harness::{copy_executions, mixed_case_id, runtime, Cluster};
use pgloom::event_store::{Event, EventStore, PgEventStore, ShardedEventStore};
use pgloom::PgPoolOptions;
use postgres::Client;

const PAGE: usize = 1000;
const WRITERS: usize = 16;

/// Events/s with [`WRITERS`] tasks appending at once, each to executions
/// of its own: `batch` events of one execution a call, `calls` calls each.
async fn concurrent_appends<S: EventStore + Send + Sync + 'static>(
    store: Arc<S>,
    tag: &str,
    batch: i64,
    calls: i64,
) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = Arc::clone(&store);
            let tag = tag.to_owned();
            tokio::spawn(async move {
                for call in 0..calls {
                    let id = format!("append-{tag}-{w}-{call}");
                    let events: Vec<Event> = (1..=batch)
                        .map(|n| Event::new(id.clone(), n, "step", serde_json::json!({ "n": n })))
                        .collect();
                    store.append(&events).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (WRITERS as f64 * (batch * calls) as f64) / started.elapsed().as_secs_f64()
}

struct Row {
    name: String,
    pass: Duration,
    page_p50: f64,
    single: f64,
    batched: f64,
}

async fn measure<S: EventStore + Send + Sync + 'static>(
    name: &str,
    store: Arc<S>,
    executions: u64,
) -> Row {
    // A warm-up pass (caches, prepared statements), then the measured one.
    let _ = full_pass(store.as_ref(), PAGE).await;
    let (count, pass, page_p50) = full_pass(store.as_ref(), PAGE).await;
    assert_eq!(count, executions, "{name}: every id once");
    let single = concurrent_appends(Arc::clone(&store), &format!("{name}-1"), 1, 250).await;
    let batched = concurrent_appends(store, &format!("{name}-100"), 100, 10).await;
    Row {
        name: name.to_owned(),
        pass,
        page_p50,
        single,
        batched,
    }
}

fn pool_options() -> PgPoolOptions {
    let mut options = PgPoolOptions::new();
    options.max_size(WRITERS);
    options
}

fn main() {
    if !citus_available("the scale-out bench") {
        return;
    }
    let parts = std::env::var("LOOM_BENCH_SCALEOUT").unwrap_or_else(|_| "page,sweep".to_owned());
    if parts.split(',').any(|p| p == "page") {
        pages_and_appends();
    }
    if parts.split(',').any(|p| p == "sweep") {
        sweeps();
    }
}

/// The batch both sweeps delete at most, in rows.
const SWEEP_BATCH: i64 = 10_000;

/// Loads `executions` executions of 2 events into `loom.events` and into
/// `public.plain_events` (the same columns and primary key; distributed
/// like loom's on Citus), the even ones 40 days old.
fn load_for_sweep(client: &mut Client, executions: u64, citus: bool) {
    copy_executions(client, (0..executions).map(|i| format!("sweep-{i}")));
    client
        .batch_execute(
            "CREATE TABLE public.plain_events (LIKE loom.events INCLUDING DEFAULTS, PRIMARY KEY (execution_id, sequence));",
        )
        .unwrap();
    if citus {
        client
            .batch_execute(
                "SELECT create_distributed_table('public.plain_events', 'execution_id', colocate_with => 'loom.events')",
            )
            .unwrap();
    }
    client
        .batch_execute(
            "UPDATE loom.events SET created_at = now() - interval '40 days'
             WHERE (substr(execution_id, 7)::bigint % 2) = 0;
             INSERT INTO public.plain_events SELECT * FROM loom.events;",
        )
        .unwrap();
    // One statement a call: VACUUM cannot share a transaction block.
    for table in ["loom.events", "public.plain_events"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .unwrap();
    }
}

/// Seconds for loom's sweep, then for the plain batched DELETE, on the
/// same rows; each checked to have deleted exactly the idle half.
fn sweep_pair(client: &mut Client, executions: u64) -> (f64, f64) {
    // The even executions: half, rounded up, of 2 events each.
    let idle_events = (i64::try_from(executions).unwrap() + 1) / 2 * 2;
    let count = |client: &mut Client, table: &str| -> i64 {
        client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .unwrap()
            .get(0)
    };
    let before = count(client, "loom.events");
    let started = Instant::now();
    client
        .batch_execute(&format!(
            "CALL loom_sweep_idle_executions(interval '30 days', {SWEEP_BATCH})"
        ))
        .unwrap();
    let loom = started.elapsed().as_secs_f64();
    assert_eq!(count(client, "loom.events"), before - idle_events);
    // What a user writes by hand: a batch of old executions' ids, their
    // rows deleted, until none is left.
    let started = Instant::now();
    loop {
        let deleted = client
            .execute(
                &format!(
                    "DELETE FROM public.plain_events WHERE execution_id IN
                       (SELECT execution_id FROM public.plain_events
                        WHERE created_at < now() - interval '30 days' LIMIT {})",
                    SWEEP_BATCH / 2
                ),
                &[],
            )
            .unwrap();
        if deleted == 0 {
            break;
        }
    }
    let plain = started.elapsed().as_secs_f64();
    assert_eq!(count(client, "public.plain_events"), before - idle_events);
    (loom, plain)
}

fn sweeps() {
    let executions = env_or("LOOM_BENCH_SWEEP_EXECUTIONS", 20_000);
    let shard_count = i32::try_from(env_or("LOOM_BENCH_CITUS_SHARDS", 8)).unwrap();
    let db = "loom_bench_sweep";
    let mut one = Cluster::Icu.fresh_database(db);
    load_for_sweep(&mut one, executions, false);
    let (one_loom, one_plain) = sweep_pair(&mut one, executions);
    let mut citus = fresh_distributed_database(db, shard_count);
    load_for_sweep(&mut citus, executions, true);
    citus
        .batch_execute("SELECT loom_rebuild_executions()")
        .unwrap();
    let (citus_loom, citus_plain) = sweep_pair(&mut citus, executions);
    println!(
        "
retention by age: {} of {executions} executions (2 events each) idle, batches of {SWEEP_BATCH} rows:",
        executions / 2
    );
    println!(
        "{:<28} {:>14} {:>16} {:>11}",
        "", "loom sweep s", "plain DELETE s", "loom speed"
    );
    for (name, loom, plain) in [
        ("one node", one_loom, one_plain),
        ("Citus, 2 workers", citus_loom, citus_plain),
    ] {
        println!(
            "{name:<28} {loom:>14.2} {plain:>16.2} {:>10.2}x",
            plain / loom
        );
    }
}

fn pages_and_appends() {
    let executions = env_or("LOOM_BENCH_EXECUTIONS", 1_000_000);
    let shard_count = i32::try_from(env_or("LOOM_BENCH_CITUS_SHARDS", 8)).unwrap();
    let rt = runtime();
    let db = "loom_bench_scaleout";
    let ids = || (0..executions).map(mixed_case_id);

    let started = Instant::now();
    let mut one = Cluster::Icu.fresh_database(db);
    copy_executions(&mut one, ids());
    let one_load = started.elapsed();

    let sharded = ShardedEventStore::new(
        Cluster::SHARDS
            .iter()
            .map(|s| PgEventStore::connect_with(&s.database(db), &pool_options()).unwrap())
            .collect(),
    );
    let started = Instant::now();
    for (i, shard) in Cluster::SHARDS.iter().enumerate() {
        let mut client = shard.fresh_database(db);
        copy_executions(&mut client, ids().filter(|id| sharded.shard_of(id) == i));
    }
    let sharded_load = started.elapsed();

    // COPY goes through the coordinator into the shards; without triggers
    // on Citus, loom.executions is filled from the log once, as after a
    // restore.
    let started = Instant::now();
    let mut citus = fresh_distributed_database(db, shard_count);
    copy_executions(&mut citus, ids());
    // Two calls: VACUUM cannot share a transaction block.
    citus
        .batch_execute("SELECT loom_rebuild_executions()")
        .unwrap();
    citus
        .batch_execute("VACUUM ANALYZE loom.executions")
        .unwrap();
    let citus_load = started.elapsed();
    println!(
        "\nloaded {executions} executions (2 events each): one node {:.1} s, 3 shards {:.1} s, Citus ({shard_count} shards on 2 workers) {:.1} s",
        one_load.as_secs_f64(),
        sharded_load.as_secs_f64(),
        citus_load.as_secs_f64()
    );

    let rows = rt.block_on(async {
        vec![
            measure(
                "one node",
                Arc::new(
                    PgEventStore::connect_with(&Cluster::Icu.database(db), &pool_options())
                        .unwrap(),
                ),
                executions,
            )
            .await,
            measure(
                "Citus, 2 workers",
                Arc::new(
                    PgEventStore::connect_citus(&Cluster::Citus.database(db), &pool_options())
                        .unwrap(),
                ),
                executions,
            )
            .await,
            measure("ShardedEventStore, 3 nodes", Arc::new(sharded), executions).await,
        ]
    });

    println!("\n{executions} executions, pages of {PAGE}, {WRITERS} concurrent writers, all servers on this machine's 2 cores:");
    println!(
        "{:<28} {:>12} {:>10} {:>18} {:>20}",
        "", "page p50", "full pass", "appends, 1 event", "appends, 100/batch"
    );
    for row in &rows {
        println!(
            "{:<28} {:>9.2} ms {:>8.2} s {:>14.0} /s {:>16.0} /s",
            row.name,
            row.page_p50,
            row.pass.as_secs_f64(),
            row.single,
            row.batched
        );
    }

    // Where a Citus page's time goes: one task per shard, each an ordered
    // LIMIT on its executions index, merged on the coordinator.
    // The last of three runs: the first opens this session's connections
    // to the workers, which a service's pooled sessions have open already.
    let cursor = mixed_case_id(executions / 2);
    let mut explain = || -> Vec<String> {
        citus
            .query(
                "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF)
                 SELECT x.execution_id FROM loom.executions x
                 WHERE x.execution_id > $1 COLLATE \"C\" ORDER BY x.execution_id LIMIT 1000",
                &[&cursor],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let plan = (0..3).map(|_| explain()).last().unwrap();
    println!(
        "\nthe page on Citus, as the coordinator runs it:\n{}",
        plan.join("\n")
    );
}
