//! The real workload on this machine (issue 9), printed, not asserted:
//!
//! - paging at the shape agent loops write (50,000 executions x 200
//!   events, 10M events) beside the toy shape (1M x 2), p50/p99 per
//!   1000-id page, in one run (target: p50 <= 1 ms at both, the deep shape
//!   within 1.5x of the wide one), and 0.3.0's pager at the deep shape
//!   before the timed upgrade to 0.4.0 that fills loom.executions;
//! - resume of one execution of 200 events with a snapshot at 150: one
//!   `loom_resume` (snapshot + tail) vs reading the whole log, plain and
//!   claim-checked (target: >= 5x faster than the full read);
//! - retention: events deleted per second by `loom_delete_execution` and
//!   `loom_prune_events` in batches, and the longest batch (the longest
//!   any of its row locks is held); then a sweep by age over every
//!   execution (`loom_delete_idle_executions`, 500 of them idle), its
//!   rows/s, executions examined/s and longest batch.
//!
//! `LOOM_BENCH_DEEP_EXECUTIONS` / `LOOM_BENCH_WIDE_EXECUTIONS` scale the two
//! shapes down for a quick look.

use std::time::{Duration, Instant};

use loom_fixtures::agent_state;
use loom_harness::bench_support::env_or;
use loom_harness::pg_pool;
use loom_harness::{copy_events, mixed_case_id, runtime, upgrade_extension, Cluster};
use pgloom::event_store::{EventStore, PgEventStore};
use pgloom::snapshot_store::{
    Codec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};
use postgres::Client;

const ICU: Cluster = Cluster::Icu;
const PAGE: i32 = 1000;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// p50 and p99 of `samples` pages after cursors spread over the ids.
fn page_percentiles(client: &mut Client, executions: u64, samples: u64) -> (f64, f64) {
    let statement = client
        .prepare("SELECT * FROM loom_list_executions($1, $2)")
        .unwrap();
    let mut times: Vec<f64> = (0..samples)
        .map(|k| {
            let cursor = mixed_case_id(k * 7919 % executions);
            let started = Instant::now();
            let ids = client.query(&statement, &[&cursor, &PAGE]).unwrap();
            let took = ms(started.elapsed());
            assert!(ids.len() <= PAGE as usize);
            took
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn load(db: &str, version: &str, executions: u64, events_each: u32) -> (Client, Duration) {
    let mut client = ICU.fresh_database_at(db, version);
    let started = Instant::now();
    copy_events(&mut client, (0..executions).map(mixed_case_id), events_each);
    (client, started.elapsed())
}

/// The median of `runs` timings of `f`.
fn median(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..runs).map(|_| f()).collect();
    times.sort();
    times[runs / 2]
}

/// Resume of one execution whose 200 events are an agent loop's turns
/// (tool outputs in full, or claim-checked), snapshotted (zstd) at 150
/// (its folded state, outputs in full or claim-checked): `loom_resume` vs
/// reading the whole log. Its speedup is bounded by how many bytes the log
/// holds beside the snapshot and its tail.
fn resume_vs_full_read(
    events_claim_checked: bool,
    state_claim_checked: bool,
) -> (Duration, Duration, usize, usize) {
    let rt = runtime();
    let db = format!(
        "loom_bench_resume_{}_{}",
        u8::from(events_claim_checked),
        u8::from(state_claim_checked)
    );
    let db = db.as_str();
    let _ = ICU.fresh_database(db);
    let pool = pg_pool(&ICU.database(db), 2).unwrap();
    let events = PgEventStore::new(pool.clone());
    let snapshots = rt
        .block_on(PgSnapshotStore::start(
            pool,
            PgSnapshotStoreOptions::new().codec(Codec::Zstd),
        ))
        .unwrap();
    let state: serde_json::Value =
        serde_json::from_str(&agent_state(200, events_claim_checked)).unwrap();
    let turns = state["turns"].as_array().unwrap();
    for (n, turn) in turns.iter().enumerate() {
        let event = pgloom::event_store::Event::new("agent", n as i64 + 1, "turn", turn.clone());
        rt.block_on(events.append(&[event])).unwrap();
    }
    let folded = JsonText::new(agent_state(150, state_claim_checked)).unwrap();
    rt.block_on(snapshots.save(&NewSnapshot::new("agent", "agentLoop$", 150, folded)))
        .unwrap();
    let resumed = rt.block_on(snapshots.resume("agent")).unwrap();
    assert_eq!(resumed.events.len(), 50);
    let full = rt.block_on(events.read_events("agent")).unwrap();
    assert_eq!(full.len(), 200);
    let resume = median(41, || {
        let started = Instant::now();
        rt.block_on(snapshots.resume("agent")).unwrap();
        started.elapsed()
    });
    let full_read = median(41, || {
        let started = Instant::now();
        rt.block_on(events.read_events("agent")).unwrap();
        started.elapsed()
    });
    let resumed_bytes = resumed.snapshot.unwrap().state.as_str().len()
        + resumed
            .events
            .iter()
            .map(|e| e.payload.to_string().len())
            .sum::<usize>();
    let full_bytes = full.iter().map(|e| e.payload.to_string().len()).sum();
    (resume, full_read, resumed_bytes, full_bytes)
}

/// Runs `batch` until it deletes nothing: rows deleted, time, longest batch.
fn batches(
    client: &mut Client,
    sql: &str,
    ids: &[String],
    max_rows: i32,
) -> (i64, Duration, Duration) {
    let statement = client.prepare(sql).unwrap();
    let (mut rows, mut longest) = (0i64, Duration::ZERO);
    let started = Instant::now();
    for id in ids {
        loop {
            let t = Instant::now();
            let deleted: i64 = client
                .query_one(&statement, &[id, &max_rows])
                .unwrap()
                .get(0);
            longest = longest.max(t.elapsed());
            if deleted == 0 {
                break;
            }
            rows += deleted;
        }
    }
    (rows, started.elapsed(), longest)
}

/// Makes 500 executions (none of `taken`) idle for 40 days, then sweeps
/// every execution by age in batches of 10,000: rows deleted, executions
/// examined, time, longest batch.
fn sweep_idle(
    client: &mut Client,
    executions: u64,
    pruned: &[String],
    deleted: &[String],
) -> (i64, i64, Duration, Duration) {
    let idle: Vec<String> = (0..)
        .map(|k| mixed_case_id((k * 89 + 29) % executions))
        .filter(|id| !pruned.contains(id) && !deleted.contains(id))
        .take(500)
        .collect();
    client
        .execute(
            "UPDATE loom.events SET created_at = now() - interval '40 days' WHERE execution_id = ANY($1)",
            &[&idle],
        )
        .unwrap();
    client.batch_execute("VACUUM ANALYZE loom.events").unwrap();
    let statement = client
        .prepare(
            "SELECT examined, rows_deleted, next_after, done
             FROM loom_delete_idle_executions('30 days', $1, 10000)",
        )
        .unwrap();
    let (mut rows, mut examined, mut longest) = (0i64, 0i64, Duration::ZERO);
    let mut after: Option<String> = None;
    let started = Instant::now();
    loop {
        let t = Instant::now();
        let batch = client.query_one(&statement, &[&after]).unwrap();
        longest = longest.max(t.elapsed());
        examined += batch.get::<_, i64>(0);
        rows += batch.get::<_, i64>(1);
        if batch.get::<_, bool>(3) {
            break;
        }
        after = batch.get(2);
    }
    (rows, examined, started.elapsed(), longest)
}

fn main() {
    let deep_executions = env_or("LOOM_BENCH_DEEP_EXECUTIONS", 50_000);
    let wide_executions = env_or("LOOM_BENCH_WIDE_EXECUTIONS", 1_000_000);
    println!(
        "\nThe real workload on this machine: ICU en-US cluster, {deep_executions} x 200 events and {wide_executions} x 2"
    );

    // The deep shape starts at 0.3.0, whose pager is SELECT DISTINCT over
    // the events index, then takes the documented upgrade to 0.4.0, which
    // fills loom.executions while appends wait.
    let (mut deep, loaded_deep) = load("loom_bench_deep", "0.3.0", deep_executions, 200);
    println!(
        "loaded {} events with COPY in {:.1} s",
        deep_executions * 200,
        loaded_deep.as_secs_f64()
    );
    let (old_p50, old_p99) = page_percentiles(&mut deep, deep_executions, 21);
    let started = Instant::now();
    upgrade_extension(&mut deep, "0.4.0").unwrap();
    let upgrade = started.elapsed();
    // The fill ran inside ALTER EXTENSION, where no VACUUM can: until
    // autovacuum sets its visibility map, an index-only scan visits the
    // heap. Both, then.
    let (fresh_p50, fresh_p99) = page_percentiles(&mut deep, deep_executions, 51);
    deep.batch_execute("VACUUM ANALYZE loom.executions")
        .unwrap();
    let (deep_p50, deep_p99) = page_percentiles(&mut deep, deep_executions, 201);
    let (mut wide, loaded_wide) = load("loom_bench_wide", "0.4.0", wide_executions, 2);
    println!(
        "loaded {} events with COPY in {:.1} s",
        wide_executions * 2,
        loaded_wide.as_secs_f64()
    );
    let (wide_p50, wide_p99) = page_percentiles(&mut wide, wide_executions, 201);

    println!(
        "\n{:<44} {:>10} {:>10}",
        "per 1000-id page (201 pages)", "p50", "p99"
    );
    println!(
        "{:<44} {:>7.2} ms {:>7.2} ms",
        format!("{wide_executions} x 2 events"),
        wide_p50,
        wide_p99
    );
    println!(
        "{:<44} {:>7.2} ms {:>7.2} ms   ({:.2}x the 2-event p50)",
        format!("{deep_executions} x 200 events"),
        deep_p50,
        deep_p99,
        deep_p50 / wide_p50
    );
    println!(
        "{:<44} {:>7.2} ms {:>7.2} ms   (51 pages, before the vacuum)",
        format!("{deep_executions} x 200, just upgraded"),
        fresh_p50,
        fresh_p99
    );
    println!(
        "{:<44} {:>7.2} ms {:>7.2} ms   (21 pages)",
        format!("{deep_executions} x 200 events, 0.3.0's DISTINCT"),
        old_p50,
        old_p99
    );
    println!(
        "upgrade 0.3.0 -> 0.4.0 on {} events (fills loom.executions; appends wait): {:.2} s",
        deep_executions * 200,
        upgrade.as_secs_f64()
    );

    println!(
        "\n{:<44} {:>10} {:>10} {:>8}",
        "resume of 200 events, snapshot at 150", "resume", "full read", "speedup"
    );
    for (events_cc, state_cc, shape) in [
        (false, false, "log and state with outputs"),
        (false, true, "log with outputs, state claim-checked"),
        (true, true, "log and state claim-checked"),
    ] {
        let (resume, full, resumed_bytes, full_bytes) = resume_vs_full_read(events_cc, state_cc);
        println!(
            "{:<44} {:>7.2} ms {:>7.2} ms {:>7.2}x   ({} vs {} bytes of JSON)",
            shape,
            ms(resume),
            ms(full),
            full.as_secs_f64() / resume.as_secs_f64(),
            resumed_bytes,
            full_bytes
        );
    }

    // Retention on the deep shape: snapshots at 150 for 500 executions,
    // pruned; then 500 others deleted whole.
    let prune_ids: Vec<String> = (0..500)
        .map(|k| mixed_case_id(k * 97 % deep_executions))
        .collect();
    let statement = deep
        .prepare("SELECT loom_save_snapshot($1, 'agentLoop$', 150, '{\"turn\":150}')")
        .unwrap();
    for id in &prune_ids {
        deep.execute(&statement, &[id]).unwrap();
    }
    let (pruned, prune_time, prune_longest) = batches(
        &mut deep,
        "SELECT loom_prune_events($1, $2)",
        &prune_ids,
        10_000,
    );
    let delete_ids: Vec<String> = (0..500)
        .map(|k| mixed_case_id((k * 97 + 13) % deep_executions))
        .filter(|id| !prune_ids.contains(id))
        .collect();
    let (deleted, delete_time, delete_longest) = batches(
        &mut deep,
        "SELECT loom_delete_execution($1, $2)",
        &delete_ids,
        10_000,
    );
    println!(
        "\n{:<44} {:>12} {:>14} {:>14}",
        "retention, batches of 10,000 rows", "rows", "rows/s", "longest batch"
    );
    println!(
        "{:<44} {:>12} {:>14.0} {:>11.2} ms",
        format!("prune up to the snapshot, {} executions", prune_ids.len()),
        pruned,
        pruned as f64 / prune_time.as_secs_f64(),
        ms(prune_longest)
    );
    println!(
        "{:<44} {:>12} {:>14.0} {:>11.2} ms",
        format!("delete whole executions, {}", delete_ids.len()),
        deleted,
        deleted as f64 / delete_time.as_secs_f64(),
        ms(delete_longest)
    );
    // The log was loaded at 0.3.0 and measured at 0.4.0 so far: retention
    // by age is 0.8.0's.
    let upgraded = Instant::now();
    upgrade_extension(&mut deep, loom_harness::LOOM_VERSION).unwrap();
    println!(
        "upgrade 0.4.0 -> {} on the deep shape: {:.1} s",
        loom_harness::LOOM_VERSION,
        upgraded.elapsed().as_secs_f64()
    );
    let (sweep, examined, sweep_time, sweep_longest) =
        sweep_idle(&mut deep, deep_executions, &prune_ids, &delete_ids);
    println!(
        "{:<44} {:>12} {:>14.0} {:>11.2} ms",
        format!("sweep by age, 500 idle of {examined} examined"),
        sweep,
        sweep as f64 / sweep_time.as_secs_f64(),
        ms(sweep_longest)
    );
    println!(
        "sweep by age: {:.0} executions examined/s, {:.1} s in all",
        examined as f64 / sweep_time.as_secs_f64(),
        sweep_time.as_secs_f64()
    );
    let (after_p50, after_p99) = page_percentiles(&mut deep, deep_executions, 201);
    println!("paging after retention (deep shape): p50 {after_p50:.2} ms, p99 {after_p99:.2} ms");
}
