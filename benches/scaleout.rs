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
//! Every server shares the same 2 cores: Citus's and the shards' numbers
//! are what spreading the work costs, not what more machines would buy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_client::event_store::{Event, EventStore, PgEventStore, PgPoolOptions, ShardedEventStore};
use loom_harness::bench_support::{env_or, full_pass};
use loom_harness::citus::{citus_available, fresh_distributed_database};
use loom_harness::{copy_executions, mixed_case_id, runtime, Cluster};

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
    let cursor = mixed_case_id(executions / 2);
    let plan: Vec<String> = citus
        .query(
            "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF)
             SELECT x.execution_id FROM loom.executions x
             WHERE x.execution_id > $1 COLLATE \"C\" ORDER BY x.execution_id LIMIT 1000",
            &[&cursor],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    println!(
        "\nthe page on Citus, as the coordinator runs it:\n{}",
        plan.join("\n")
    );
}
