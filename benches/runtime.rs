//! Issue 38's runtime primitives, measured side by side in one run on the
//! C cluster. Printed, not asserted.
//!
//! 1. **The feed's cost on appends.** One-event appends onto 4000
//!    existing executions with pgbench (4 clients, 2 threads), rounds in
//!    rotating order (`LOOM_BENCH_RUNTIME_ROUNDS`, 5; each
//!    `LOOM_BENCH_RUNTIME_SECONDS`, 4): loom with the feed off, loom with
//!    it on, and the plain-table anchor (the same columns and key, a plain
//!    INSERT). Medians and ratios. Target: the feed on within 10% of it
//!    off (its positions are column defaults that exist only while on).
//! 2. **The feed's read throughput.** The events the rounds appended with
//!    the feed on, read whole in pages of 1000 through `PgFeed::read`,
//!    beside a keyset read of the same number of rows of `loom.events` in
//!    its primary key order.
//! 3. **Claims per second with 8 workers.** Each worker a task with its
//!    own connection, claiming one execution and completing it, over
//!    100000 due executions: `PgClaims::claim` and `complete` beside a
//!    hand-written `FOR UPDATE SKIP LOCKED` queue table doing the same
//!    (a due time, a fencing counter, a holder, the same partial index),
//!    each side first in every other round. Target: at least 0.9x the
//!    anchor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_harness::bench_support::{env_or, median, pgbench};
use loom_harness::{pg_pool, runtime, Cluster};
use pgloom::claims::{ClaimOptions, PgClaims};
use pgloom::event_store::PgFeed;
use pgloom::interop::tokio_postgres::types::Type;

const DB: &str = "loom_bench_runtime";

fn appends(seconds: u64, rounds: u64, client: &mut postgres::Client) {
    client
        .batch_execute(
            "CREATE SEQUENCE seqs;
             CREATE TABLE plain_events (execution_id text COLLATE \"C\" NOT NULL, sequence bigint NOT NULL,
                 kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
                 metadata jsonb, PRIMARY KEY (execution_id, sequence));
             SELECT loom_append_event('e' || i, 0, 'seed', '{}') FROM generate_series(0, 3999) i;
             INSERT INTO plain_events (execution_id, sequence, kind, payload) SELECT 'e' || i, 0, 'seed', '{}' FROM generate_series(0, 3999) i;",
        )
        .unwrap();
    client.batch_execute("VACUUM ANALYZE").unwrap();
    let payload = "'{\"tool\": \"search\", \"ok\": true}'::jsonb"; // no ':name' for pgbench
    let set = "\\set e :client_id * 1000 + random(0, 999)\n";
    let loom =
        format!("{set}SELECT loom_append_event('e' || :e, nextval('seqs'), 'step', {payload});\n");
    let plain = format!("{set}INSERT INTO plain_events (execution_id, sequence, kind, payload) VALUES ('e' || :e, nextval('seqs'), 'step', {payload});\n");
    let (mut off, mut on, mut anchor) = (Vec::new(), Vec::new(), Vec::new());
    // Each round in another order, so that a drift of the machine over the
    // run (a checkpoint, the log's growth) falls on each side alike.
    for round in 0..rounds {
        for side in (0..3).map(|i| (i + round) % 3) {
            match side {
                0 => {
                    client.batch_execute("SELECT loom_feed_disable()").unwrap();
                    off.push(pgbench(DB, &loom, seconds, "prepared", 4));
                }
                1 => {
                    client.batch_execute("SELECT loom_feed_enable()").unwrap();
                    on.push(pgbench(DB, &loom, seconds, "prepared", 4));
                }
                _ => anchor.push(pgbench(DB, &plain, seconds, "prepared", 4)),
            }
        }
    }
    client.batch_execute("SELECT loom_feed_disable()").unwrap();
    let (off, on, anchor) = (median(off), median(on), median(anchor));
    println!("\nthe feed's cost on one-event appends (pgbench, 4 clients, prepared, median of {rounds} alternated {seconds} s rounds):");
    println!("{:<34} {:>12} {:>10}", "", "appends/s", "ratio");
    println!(
        "{:<34} {:>12.0} {:>10}",
        "plain table (anchor)", anchor, "1.00x"
    );
    println!(
        "{:<34} {:>12.0} {:>9.2}x",
        "loom, feed off",
        off,
        off / anchor
    );
    println!("{:<34} {:>12.0} {:>9.2}x", "loom, feed on", on, on / anchor);
    println!("{:<34} {:>12} {:>9.2}x", "feed on / feed off", "", on / off);
}

fn feed_reads(client: &mut postgres::Client) {
    let rt = runtime();
    let conninfo = Cluster::C.database(DB);
    let total: i64 = client
        .query_one(
            "SELECT count(*) FROM loom.events WHERE feed_tx IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    let feed = PgFeed::new(pg_pool(&conninfo, 1).unwrap());
    let (read, took) = rt.block_on(async {
        let started = Instant::now();
        let (mut read, mut after) = (0usize, None);
        loop {
            let page = feed.read(after.as_ref(), 1000).await.unwrap();
            if page.events.is_empty() {
                break;
            }
            read += page.events.len();
            after = page.next_after;
        }
        (read, started.elapsed())
    });
    // The anchor: the same number of rows of loom.events, keyset pages of
    // 1000 in primary key order, through the same driver.
    let pool = pg_pool(&conninfo, 1).unwrap();
    let (anchor_read, anchor_took) = rt.block_on(async {
        let conn = pool.as_ref().get().await.unwrap();
        let started = Instant::now();
        let (mut read, mut after) = (0usize, (String::new(), -1i64));
        while read < usize::try_from(total).unwrap() {
            let rows = conn
                .query_typed(
                    "SELECT execution_id, sequence, kind, payload::text, metadata::text, created_at FROM loom.events
                     WHERE (execution_id, sequence) > ($1, $2) ORDER BY execution_id, sequence LIMIT 1000",
                    &[(&after.0, Type::TEXT), (&after.1, Type::INT8)],
                )
                .await
                .unwrap();
            if rows.is_empty() {
                break;
            }
            read += rows.len();
            let last = rows.last().unwrap();
            after = (last.get(0), last.get(1));
        }
        (read, started.elapsed())
    });
    println!("\nthe feed read whole in pages of 1000 ({total} feed rows):");
    println!("{:<34} {:>10} {:>12}", "", "events", "events/s");
    println!(
        "{:<34} {:>10} {:>12.0}",
        "PgFeed::read",
        read,
        read as f64 / took.as_secs_f64()
    );
    println!(
        "{:<34} {:>10} {:>12.0}",
        "keyset SELECT of loom.events",
        anchor_read,
        anchor_read as f64 / anchor_took.as_secs_f64()
    );
}

/// Claim-and-complete cycles per second of 8 workers for `seconds`.
fn claims_per_second(loom: bool, seconds: u64) -> f64 {
    let rt = runtime();
    let conninfo = Cluster::C.database(DB);
    let done = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let workers = (0..8).map(|w| {
            let done = done.clone();
            let pool = pg_pool(&conninfo, 1).unwrap();
            async move {
                if loom {
                    let claims = PgClaims::new(pool, ClaimOptions::new("bench", format!("w{w}")).lease(Duration::from_secs(60)));
                    while Instant::now() < deadline {
                        for claim in claims.claim(1).await.unwrap() {
                            claims.complete(&claim, None).await.unwrap();
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                } else {
                    let conn = pool.as_ref().get().await.unwrap();
                    let worker = format!("w{w}");
                    while Instant::now() < deadline {
                        let rows = conn
                            .query_typed(
                                "WITH due AS (SELECT id, due_at FROM jobs WHERE queue = 'bench' AND due_at <= statement_timestamp()
                                              ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                                 UPDATE jobs j SET fence = j.fence + 1, holder = $1, due_at = statement_timestamp() + interval '60 seconds'
                                 FROM due WHERE j.id = due.id RETURNING j.id, j.fence",
                                &[(&worker, Type::TEXT)],
                            )
                            .await
                            .unwrap();
                        for row in rows {
                            let (id, fence): (String, i64) = (row.get(0), row.get(1));
                            conn.query_typed(
                                "UPDATE jobs SET holder = NULL, due_at = NULL WHERE id = $1 AND fence = $2",
                                &[(&id, Type::TEXT), (&fence, Type::INT8)],
                            )
                            .await
                            .unwrap();
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        futures::future::join_all(workers).await;
    });
    done.load(Ordering::Relaxed) as f64 / seconds as f64
}

fn claims(seconds: u64, rounds: u64, client: &mut postgres::Client) {
    let count = env_or("LOOM_BENCH_CLAIMS", 100_000);
    client
        .batch_execute(
            "CREATE TABLE jobs (id text COLLATE \"C\" PRIMARY KEY, queue text COLLATE \"C\" NOT NULL, due_at timestamptz,
                 fence bigint NOT NULL DEFAULT 0, holder text);
             CREATE INDEX jobs_due ON jobs (queue, due_at) WHERE due_at IS NOT NULL;",
        )
        .unwrap();
    let (mut loom, mut anchor) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        client
            .batch_execute(&format!(
                "TRUNCATE loom.claims, jobs;
                 INSERT INTO loom.claims (execution_id, queue, due_at) SELECT 'x' || i, 'bench', now() - i * interval '1 ms' FROM generate_series(1, {count}) i;
                 INSERT INTO jobs (id, queue, due_at) SELECT 'x' || i, 'bench', now() - i * interval '1 ms' FROM generate_series(1, {count}) i;"
            ))
            .unwrap();
        client
            .batch_execute("VACUUM ANALYZE loom.claims, jobs")
            .unwrap();
        // Each side first in every other round: the first runs right
        // after the reload and its VACUUM.
        if round % 2 == 0 {
            loom.push(claims_per_second(true, seconds));
            anchor.push(claims_per_second(false, seconds));
        } else {
            anchor.push(claims_per_second(false, seconds));
            loom.push(claims_per_second(true, seconds));
        }
    }
    let (loom, anchor) = (median(loom), median(anchor));
    println!("\nclaims with 8 workers, claim one and complete it ({count} due; median of {rounds} alternated {seconds} s rounds):");
    println!("{:<34} {:>12} {:>10}", "", "claims/s", "ratio");
    println!(
        "{:<34} {:>12.0} {:>10}",
        "hand-written SKIP LOCKED queue", anchor, "1.00x"
    );
    println!(
        "{:<34} {:>12.0} {:>9.2}x",
        "PgClaims (loom_claim, loom_complete)",
        loom,
        loom / anchor
    );
}

fn main() {
    let seconds = env_or("LOOM_BENCH_RUNTIME_SECONDS", 4);
    let rounds = env_or("LOOM_BENCH_RUNTIME_ROUNDS", 5);
    let mut client = Cluster::C.fresh_database(DB);
    appends(seconds, rounds, &mut client);
    feed_reads(&mut client);
    claims(seconds, rounds, &mut client);
}
