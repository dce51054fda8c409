//! The issue "operations at a hundred million events", at the scale this
//! machine holds: two shapes, 1,000,000 executions x 2 events and 200,000 x
//! 50 (10M events), each loaded through loom's SQL API and, the same rows,
//! into a plain table with loom.events' columns and primary key; one
//! execution in ten is then made idle (its events 40 days old) on both.
//! For each shape, printed, not asserted:
//!
//! 1. the load: events/s through `loom_append_events` (2 connections,
//!    about 10,000 events a call) beside the same arrays INSERTed into the
//!    plain table (`unnest`), and the bytes each event takes (loom.events +
//!    loom.executions vs the plain table);
//! 2. a 1000-id page of `loom_list_executions`: p50 and p99 of 200 pages,
//!    10 pages walked on from each of 20 random cursors;
//! 3. `loom_status()`, median of 5 calls: catalog and statistics only;
//! 4. `loom_verify_executions` batch after batch (10,000 ids) until done:
//!    the whole pass, its longest batch, ids checked/s;
//! 5. retention by age: `loom_delete_idle_executions('30 days', ...)` in
//!    batches of 10,000 rows, each its own transaction, beside the plain
//!    batched DELETE a user would write (10,000 executions a statement):
//!    rows/s of each and their ratio. While each runs, one connection
//!    appends one event at a time (every 5 ms) onto executions that are
//!    not idle, and its longest append is printed; afterwards loom.events
//!    must hold the plain table's rows plus the difference in appends;
//! 6. repair: 1% of the ids deleted from loom.executions and 0.1% orphan
//!    ids put in directly; `loom_verify_executions` must find exactly
//!    those; then `loom_repair_executions` in batches of 1000 ids, with the
//!    same appender running (its longest append is repair's longest
//!    writer stall), and verification again: 0 missing, 0 orphaned;
//! 7. the old path, for the record: `loom_rebuild_executions()`, which
//!    holds writers back for its whole pass, with the same appender.
//!
//! Then one table of both shapes, in markdown for docs/benchmarks.md.
//!
//! Targets: `loom_status()` <= 100 ms; the sweep's rows/s >= 1.0x the
//! plain DELETE's, its longest append wait <= ~200 ms; repair's longest
//! writer stall <= ~100 ms; page p50 <= 1 ms.
//!
//! About ten minutes at the default scale, so `make bench` skips it: `make
//! bench.scale` runs it (`LOOM_BENCH_SCALE=1`). `LOOM_SCALE_EXECUTIONS_A`,
//! `LOOM_SCALE_EVENTS_A`, `LOOM_SCALE_EXECUTIONS_B` and
//! `LOOM_SCALE_EVENTS_B` size the two shapes.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use loom_harness::bench_support::{env_or, median, record};
use loom_harness::{describe, pg_bin, Cluster};
use postgres::types::ToSql;
use postgres::{Client, Row};

const PAGE: i32 = 1000;
/// Connections loading at once, and the events of one call.
const LOADERS: u64 = 2;
const LOAD_BATCH_EVENTS: u64 = 10_000;
/// Random cursors, and the pages walked on from each.
const WALKS: usize = 20;
const PAGES_PER_WALK: usize = 10;
const VERIFY_BATCH: i32 = 10_000;
const SWEEP_BATCH: i32 = 10_000;
const PLAIN_SWEEP_BATCH: i64 = 10_000;
const REPAIR_BATCH: i32 = 1000;
/// The concurrent appender's pause between appends: an agent loop's pace,
/// not a load that would take the 2 cores from the pass it runs beside.
const APPEND_PAUSE: Duration = Duration::from_millis(5);
/// The concurrent appends' sequences: above every loaded event's.
const APPEND_SEQUENCES: i64 = 1 << 40;

/// The loaded events' payload, as text (made jsonb in the server, as the
/// client sends it).
fn payload(sequence: u64) -> String {
    format!(r#"{{"tool":"search","n":{sequence},"ok":true}}"#)
}

/// Execution `i`'s id. One in ten is idle: those whose number ends in 0
/// ([`IDLE`] in SQL).
fn execution_id(i: u64) -> String {
    format!("exec-{i:09}")
}

fn is_idle(i: u64) -> bool {
    i.is_multiple_of(10)
}

const IDLE: &str = "right(execution_id, 1) = '0'";

struct Shape {
    name: &'static str,
    db: &'static str,
    executions: u64,
    events_each: u64,
}

impl Shape {
    fn events(&self) -> u64 {
        self.executions * self.events_each
    }

    fn idle(&self) -> u64 {
        self.executions.div_ceil(10)
    }

    fn label(&self) -> String {
        format!(
            "{} x {}",
            thousands(self.executions as f64),
            self.events_each
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Loom,
    Plain,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `n` rounded, with thousands separators (`8,450`).
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.abs());
    let mut out = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// The `q` quantile of `samples` (nearest rank).
fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ok(good: bool) -> &'static str {
    if good {
        "ok"
    } else {
        "MISMATCH"
    }
}

fn query(client: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
    client
        .query(sql, params)
        .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)))
}

fn execute(client: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> u64 {
    client
        .execute(sql, params)
        .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)))
}

/// A small deterministic generator (splitmix64): the same cursors and
/// appends every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

const LOOM_APPEND: &str = "SELECT loom_append_events($1, $2, $3, $4::text[]::jsonb[])";
const PLAIN_APPEND: &str = "INSERT INTO plain_events (execution_id, sequence, kind, payload)
     SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]::jsonb[])";

/// Loads every event of `shape` into `side`, [`LOADERS`] connections each
/// sending every other batch of whole executions, one autocommit call a
/// batch: how long it took. Only a batch is ever held in memory.
fn load(shape: &Shape, side: Side) -> Duration {
    let per_batch = (LOAD_BATCH_EVENTS / shape.events_each).max(1);
    let batches = shape.executions.div_ceil(per_batch);
    // Neither side pays alone for the full page images after a checkpoint.
    Cluster::C
        .connect(shape.db)
        .batch_execute("CHECKPOINT")
        .unwrap();
    let started = Instant::now();
    thread::scope(|scope| {
        for loader in 0..LOADERS {
            scope.spawn(move || {
                let mut client = Cluster::C.connect(shape.db);
                let sql = match side {
                    Side::Loom => LOOM_APPEND,
                    Side::Plain => PLAIN_APPEND,
                };
                let statement = client
                    .prepare(sql)
                    .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
                for batch in (loader..batches).step_by(LOADERS as usize) {
                    let first = batch * per_batch;
                    let last = (first + per_batch).min(shape.executions);
                    let size = ((last - first) * shape.events_each) as usize;
                    let (mut ids, mut sequences, mut kinds, mut payloads) = (
                        Vec::with_capacity(size),
                        Vec::with_capacity(size),
                        Vec::with_capacity(size),
                        Vec::with_capacity(size),
                    );
                    for i in first..last {
                        let id = execution_id(i);
                        for sequence in 1..=shape.events_each {
                            ids.push(id.clone());
                            sequences.push(sequence as i64);
                            kinds.push("step");
                            payloads.push(payload(sequence));
                        }
                    }
                    client
                        .execute(&statement, &[&ids, &sequences, &kinds, &payloads])
                        .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
                }
            });
        }
    });
    started.elapsed()
}

/// Makes one execution in ten idle on both sides, its events 40 days old:
/// UPDATEs of created_at (loom refuses only execution_id updates), about
/// a million rows read a statement.
fn age_idle(client: &mut Client, shape: &Shape) -> Duration {
    let started = Instant::now();
    let chunk = (1_000_000 / shape.events_each).max(1);
    for table in ["loom.events", "plain_events"] {
        let sql = format!(
            "UPDATE {table} SET created_at = now() - interval '40 days'
             WHERE execution_id >= $1 AND execution_id < $2 AND {IDLE}"
        );
        for from in (0..shape.executions).step_by(chunk as usize) {
            execute(
                client,
                &sql,
                &[&execution_id(from), &execution_id(from + chunk)],
            );
        }
    }
    started.elapsed()
}

/// p50 and p99 of [`WALKS`] x [`PAGES_PER_WALK`] pages, each walk from a
/// random cursor on, page after page.
fn page_percentiles(client: &mut Client, shape: &Shape, rng: &mut Rng) -> (f64, f64, usize) {
    let sql = "SELECT * FROM loom_list_executions($1, $2)";
    let statement = client.prepare(sql).unwrap();
    // Plans the function's statements, reads the root pages.
    client.query(&statement, &[&None::<&str>, &PAGE]).unwrap();
    let mut times = Vec::with_capacity(WALKS * PAGES_PER_WALK);
    for _ in 0..WALKS {
        let mut after = execution_id(rng.below(shape.executions));
        for _ in 0..PAGES_PER_WALK {
            let started = Instant::now();
            let rows = client
                .query(&statement, &[&after, &PAGE])
                .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
            times.push(ms(started.elapsed()));
            match rows.last() {
                Some(row) if rows.len() == PAGE as usize => after = row.get(0),
                _ => break,
            }
        }
    }
    (
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.len(),
    )
}

/// What a batched pass returned in all: its batches, the ids it went
/// through (first column), the sums of its two counts (second and third
/// columns), how long it took and its longest batch.
struct Pass {
    batches: u64,
    ids: i64,
    counts: (i64, i64),
    total: Duration,
    longest: f64,
}

impl Pass {
    fn ids_per_s(&self) -> f64 {
        self.ids as f64 / self.total.as_secs_f64()
    }
}

/// Calls `sql` (`$1` the cursor, `$2` the batch size; columns: ids, two
/// counts, next_after, done), each call its own transaction, until done.
fn batched(client: &mut Client, sql: &str, batch: i32) -> Pass {
    let started = Instant::now();
    let mut pass = Pass {
        batches: 0,
        ids: 0,
        counts: (0, 0),
        total: Duration::ZERO,
        longest: 0.0,
    };
    let mut after: Option<String> = None;
    loop {
        let t = Instant::now();
        let rows = query(client, sql, &[&after, &batch]);
        pass.longest = pass.longest.max(ms(t.elapsed()));
        pass.batches += 1;
        let row = rows.first().unwrap_or_else(|| panic!("{sql}: no row"));
        pass.ids += row.get::<_, i64>(0);
        pass.counts.0 += row.get::<_, i64>(1);
        pass.counts.1 += row.get::<_, i64>(2);
        let next_after: Option<String> = row.get(3);
        if row.get::<_, bool>(4) {
            break;
        }
        assert!(next_after.is_some(), "{sql}: not done, and no next_after");
        after = next_after;
    }
    pass.total = started.elapsed();
    pass
}

const VERIFY: &str =
    "SELECT checked, missing, orphaned, next_after, done FROM loom_verify_executions($1, $2)";
const REPAIR: &str =
    "SELECT checked, added, removed, next_after, done FROM loom_repair_executions($1, $2)";
const SWEEP: &str = "SELECT examined, executions_deleted, rows_deleted, next_after, done
     FROM loom_delete_idle_executions(interval '30 days', $1, $2)";

/// The plain table's retention as a user would write it: a page of
/// executions with their last event's time, those idle deleted, in one
/// statement; the page's last id, its size and the rows deleted.
fn plain_sweep_sql() -> String {
    format!(
        "WITH page AS (SELECT execution_id, max(created_at) AS last FROM plain_events
                       WHERE execution_id > $1 GROUP BY execution_id ORDER BY execution_id
                       LIMIT {PLAIN_SWEEP_BATCH}),
              gone AS (DELETE FROM plain_events p USING page
                       WHERE p.execution_id = page.execution_id
                         AND page.last < now() - interval '30 days' RETURNING 1)
         SELECT (SELECT max(execution_id) FROM page), (SELECT count(*) FROM page),
                (SELECT count(*) FROM gone)"
    )
}

/// The plain DELETE, batch after batch until a page comes back short
/// ([`Pass`]'s first count unused, the second the rows deleted).
fn plain_sweep(client: &mut Client) -> Pass {
    let sql = plain_sweep_sql();
    let started = Instant::now();
    let mut pass = Pass {
        batches: 0,
        ids: 0,
        counts: (0, 0),
        total: Duration::ZERO,
        longest: 0.0,
    };
    let mut after = String::new();
    loop {
        let t = Instant::now();
        let rows = query(client, &sql, &[&after]);
        pass.longest = pass.longest.max(ms(t.elapsed()));
        pass.batches += 1;
        let (last, paged, gone): (Option<String>, i64, i64) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
        pass.ids += paged;
        pass.counts.1 += gone;
        match last {
            Some(last) if paged == PLAIN_SWEEP_BATCH => after = last,
            _ => break,
        }
    }
    pass.total = started.elapsed();
    pass
}

/// One connection appending one event at a time onto random executions
/// that are not idle, each at a sequence of its own, until finished: how
/// many it appended and its longest append.
struct Appender {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<(i64, f64)>,
}

impl Appender {
    fn start(shape: &Shape, side: Side, sequences: &Arc<AtomicI64>, seed: u64) -> Appender {
        let (db, executions) = (shape.db, shape.executions);
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, sequences) = (Arc::clone(&stop), Arc::clone(sequences));
        let handle = thread::spawn(move || {
            let mut client = Cluster::C.connect(db);
            let sql = match side {
                Side::Loom => "SELECT loom_append_event($1, $2, 'step', '{}'::jsonb)",
                Side::Plain => {
                    "INSERT INTO plain_events (execution_id, sequence, kind, payload)
                     VALUES ($1, $2, 'step', '{}')"
                }
            };
            let statement = client
                .prepare(sql)
                .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
            let mut rng = Rng(seed);
            let (mut appended, mut longest) = (0i64, 0f64);
            while !stopped.load(Ordering::Relaxed) {
                let i = loop {
                    let i = rng.below(executions);
                    if !is_idle(i) {
                        break i;
                    }
                };
                let sequence = sequences.fetch_add(1, Ordering::Relaxed);
                let started = Instant::now();
                client
                    .execute(&statement, &[&execution_id(i), &sequence])
                    .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
                longest = longest.max(ms(started.elapsed()));
                appended += 1;
                thread::sleep(APPEND_PAUSE);
            }
            (appended, longest)
        });
        Appender { stop, handle }
    }

    fn finish(self) -> (i64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the appender")
    }
}

/// Runs `pass` with an appender on `side`: the pass, how many events the
/// appender added and its longest append.
fn beside_appender<T>(
    shape: &Shape,
    side: Side,
    sequences: &Arc<AtomicI64>,
    seed: u64,
    pass: impl FnOnce() -> T,
) -> (T, i64, f64) {
    let appender = Appender::start(shape, side, sequences, seed);
    let result = pass();
    let (appended, longest) = appender.finish();
    (result, appended, longest)
}

/// Every figure of one shape, for the summary.
struct Figures {
    label: String,
    load_loom: f64,
    load_plain: f64,
    bytes_loom: f64,
    bytes_plain: f64,
    page_p50: f64,
    page_p99: f64,
    status: f64,
    verify: Pass,
    sweep: Pass,
    sweep_wait: f64,
    plain: Pass,
    plain_wait: f64,
    counts_ok: bool,
    repair: Pass,
    repair_stall: f64,
    repaired_ok: bool,
    rebuild: Duration,
    rebuild_stall: f64,
}

fn run(shape: &Shape) -> Figures {
    println!(
        "\n== shape {}: {} executions x {} events = {} events, database {} ==",
        shape.name,
        thousands(shape.executions as f64),
        shape.events_each,
        thousands(shape.events() as f64),
        shape.db
    );
    let mut client = Cluster::C.fresh_database(shape.db);
    // The plain table: loom.events' columns and primary key, nothing else.
    client
        .batch_execute(
            "CREATE TABLE plain_events (execution_id text COLLATE \"C\" NOT NULL, sequence bigint NOT NULL,
                 kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (execution_id, sequence))",
        )
        .unwrap();
    let events = shape.events() as f64;

    // 1. The load, and the bytes it takes.
    let loom_load = load(shape, Side::Loom);
    let plain_load = load(shape, Side::Plain);
    let sizes = &query(
        &mut client,
        "SELECT pg_total_relation_size('loom.events') + pg_total_relation_size('loom.executions'),
                pg_total_relation_size('plain_events')",
        &[],
    )[0];
    let (bytes_loom, bytes_plain) = (
        sizes.get::<_, i64>(0) as f64 / events,
        sizes.get::<_, i64>(1) as f64 / events,
    );
    let (load_loom, load_plain) = (
        events / loom_load.as_secs_f64(),
        events / plain_load.as_secs_f64(),
    );
    println!("\nload, {LOADERS} connections, about {LOAD_BATCH_EVENTS} events a call:");
    println!(
        "{:<52} {:>10} {:>12} {:>14}",
        "", "seconds", "events/s", "bytes/event"
    );
    println!(
        "{:<52} {:>10.1} {:>12} {:>14.1}",
        "loom_append_events (loom.events + loom.executions)",
        loom_load.as_secs_f64(),
        thousands(load_loom),
        bytes_loom
    );
    println!(
        "{:<52} {:>10.1} {:>12} {:>14.1}",
        "plain INSERT ... unnest (plain_events)",
        plain_load.as_secs_f64(),
        thousands(load_plain),
        bytes_plain
    );
    println!(
        "loom vs plain: {:.2}x the load rate, {:.2}x the bytes",
        load_loom / load_plain,
        bytes_loom / bytes_plain
    );

    let aging = age_idle(&mut client, shape);
    let started = Instant::now();
    client
        .batch_execute("VACUUM ANALYZE loom.events, loom.executions, plain_events")
        .unwrap();
    println!(
        "made {} executions idle (events 40 days old) on both sides in {:.1} s; VACUUM ANALYZE {:.1} s",
        thousands(shape.idle() as f64),
        aging.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // 2, 3. Pages and loom_status().
    let mut rng = Rng(0x6C6F_6F6D ^ shape.events());
    let (page_p50, page_p99, pages) = page_percentiles(&mut client, shape, &mut rng);
    let status = median(
        (0..5)
            .map(|_| {
                let started = Instant::now();
                query(&mut client, "SELECT * FROM loom_status()", &[]);
                ms(started.elapsed())
            })
            .collect(),
    );
    println!(
        "\npage of {PAGE} ids (loom_list_executions, {pages} pages from {WALKS} random cursors): p50 {page_p50:.2} ms, p99 {page_p99:.2} ms"
    );
    println!("loom_status(), median of 5: {status:.1} ms (target <= 100 ms)");

    // 4. Verification.
    let verify = batched(&mut client, VERIFY, VERIFY_BATCH);
    println!(
        "\nloom_verify_executions, batches of {VERIFY_BATCH} ids: {} ids in {:.2} s ({} batches), {} ids/s, longest batch {:.1} ms; {} missing, {} orphaned: {}",
        thousands(verify.ids as f64),
        verify.total.as_secs_f64(),
        verify.batches,
        thousands(verify.ids_per_s()),
        verify.longest,
        verify.counts.0,
        verify.counts.1,
        ok(verify.counts == (0, 0))
    );

    // 5. Retention, each side beside an appender of its own.
    let sequences = Arc::new(AtomicI64::new(APPEND_SEQUENCES));
    client.batch_execute("CHECKPOINT").unwrap();
    let (sweep, loom_appends, sweep_wait) =
        beside_appender(shape, Side::Loom, &sequences, 1, || {
            batched(&mut client, SWEEP, SWEEP_BATCH)
        });
    client.batch_execute("CHECKPOINT").unwrap();
    let (plain, plain_appends, plain_wait) =
        beside_appender(shape, Side::Plain, &sequences, 2, || {
            plain_sweep(&mut client)
        });
    let (loom_rate, plain_rate) = (
        sweep.counts.1 as f64 / sweep.total.as_secs_f64(),
        plain.counts.1 as f64 / plain.total.as_secs_f64(),
    );
    println!(
        "\nretention of the idle tenth ({} executions, {} rows), an appender beside each (one event every {} ms):",
        thousands(shape.idle() as f64),
        thousands((shape.idle() * shape.events_each) as f64),
        APPEND_PAUSE.as_millis()
    );
    println!(
        "{:<56} {:>10} {:>12} {:>9} {:>14} {:>14}",
        "", "rows", "rows/s", "seconds", "longest batch", "longest append"
    );
    println!(
        "{:<56} {:>10} {:>12} {:>9.1} {:>11.1} ms {:>11.1} ms",
        format!("loom_delete_idle_executions, {SWEEP_BATCH} rows a batch"),
        thousands(sweep.counts.1 as f64),
        thousands(loom_rate),
        sweep.total.as_secs_f64(),
        sweep.longest,
        sweep_wait
    );
    println!(
        "{:<56} {:>10} {:>12} {:>9.1} {:>11.1} ms {:>11.1} ms",
        format!("plain DELETE, {PLAIN_SWEEP_BATCH} executions a statement"),
        thousands(plain.counts.1 as f64),
        thousands(plain_rate),
        plain.total.as_secs_f64(),
        plain.longest,
        plain_wait
    );
    println!(
        "loom vs plain: {:.2}x the rows/s (target >= 1.0x); longest append wait during the sweep {sweep_wait:.1} ms (target <= ~200 ms)",
        loom_rate / plain_rate
    );
    let expected_rows = (shape.idle() * shape.events_each) as i64;
    println!(
        "deleted: loom {} executions / {} rows, plain {} rows, expected {} / {}: {}",
        sweep.counts.0,
        sweep.counts.1,
        plain.counts.1,
        shape.idle(),
        expected_rows,
        ok(sweep.counts == (shape.idle() as i64, expected_rows) && plain.counts.1 == expected_rows)
    );
    let left = &query(
        &mut client,
        "SELECT (SELECT count(*) FROM loom.events), (SELECT count(*) FROM plain_events)",
        &[],
    )[0];
    let (loom_left, plain_left): (i64, i64) = (left.get(0), left.get(1));
    let counts_ok = loom_left - loom_appends == plain_left - plain_appends;
    println!(
        "rows left: loom.events {loom_left} ({loom_appends} appended during the sweep), plain_events {plain_left} ({plain_appends} appended): {}",
        ok(counts_ok)
    );
    client
        .batch_execute("VACUUM ANALYZE loom.events, loom.executions")
        .unwrap();

    // 6. Repair: 1% of the ids missing, 0.1% orphans.
    let missing = execute(
        &mut client,
        "DELETE FROM loom.executions WHERE right(execution_id, 2) = '01'",
        &[],
    );
    let orphans = execute(
        &mut client,
        "INSERT INTO loom.executions (execution_id)
         SELECT execution_id || '-orphan' FROM loom.executions WHERE right(execution_id, 3) = '005'",
        &[],
    );
    let damaged = batched(&mut client, VERIFY, VERIFY_BATCH);
    println!(
        "\nrepair: {missing} ids deleted from loom.executions, {orphans} orphan ids put in; loom_verify_executions finds {} missing, {} orphaned in {:.2} s: {}",
        damaged.counts.0,
        damaged.counts.1,
        damaged.total.as_secs_f64(),
        ok(damaged.counts == (missing as i64, orphans as i64))
    );
    let (repair, _, repair_stall) = beside_appender(shape, Side::Loom, &sequences, 3, || {
        batched(&mut client, REPAIR, REPAIR_BATCH)
    });
    let repaired = batched(&mut client, VERIFY, VERIFY_BATCH);
    let repaired_ok = repaired.counts == (0, 0);
    println!(
        "loom_repair_executions, batches of {REPAIR_BATCH} ids, an appender beside it: {} ids in {:.2} s ({} batches), {} ids/s, longest batch {:.1} ms; {} added, {} removed",
        thousands(repair.ids as f64),
        repair.total.as_secs_f64(),
        repair.batches,
        thousands(repair.ids_per_s()),
        repair.longest,
        repair.counts.0,
        repair.counts.1
    );
    println!("repair's longest writer stall: {repair_stall:.1} ms (target <= ~100 ms)");
    println!(
        "loom_verify_executions afterwards: {} missing, {} orphaned: {}",
        repaired.counts.0,
        repaired.counts.1,
        ok(repaired_ok)
    );

    // 7. The old path.
    let ((rebuild, changed), _, rebuild_stall) =
        beside_appender(shape, Side::Loom, &sequences, 4, || {
            let started = Instant::now();
            let changed: i64 =
                query(&mut client, "SELECT loom_rebuild_executions()", &[])[0].get(0);
            (started.elapsed(), changed)
        });
    println!(
        "the old path, loom_rebuild_executions() (writers wait for the whole pass): {:.2} s, {changed} rows changed, longest writer stall {rebuild_stall:.1} ms",
        rebuild.as_secs_f64()
    );

    Figures {
        label: shape.label(),
        load_loom,
        load_plain,
        bytes_loom,
        bytes_plain,
        page_p50,
        page_p99,
        status,
        verify,
        sweep,
        sweep_wait,
        plain,
        plain_wait,
        counts_ok,
        repair,
        repair_stall,
        repaired_ok,
        rebuild,
        rebuild_stall,
    }
}

/// The summary's rows: measure, target, and each shape's value.
fn summary(figures: &[Figures]) {
    type Measure = (&'static str, &'static str, fn(&Figures) -> String);
    let rows: [Measure; 15] = [
        ("load through `loom_append_events`, events/s", "", |f| {
            thousands(f.load_loom)
        }),
        ("load into the plain table, events/s", "", |f| {
            thousands(f.load_plain)
        }),
        (
            "bytes per event, loom (events + executions) / plain",
            "",
            |f| {
                format!(
                    "{:.0} / {:.0} ({:.2}x)",
                    f.bytes_loom,
                    f.bytes_plain,
                    f.bytes_loom / f.bytes_plain
                )
            },
        ),
        ("1000-id page, p50 / p99", "p50 <= 1 ms", |f| {
            format!("{:.2} / {:.2} ms", f.page_p50, f.page_p99)
        }),
        ("`loom_status()`, median of 5", "<= 100 ms", |f| {
            format!("{:.1} ms", f.status)
        }),
        ("`loom_verify_executions`, whole pass", "", |f| {
            format!(
                "{:.1} s, {} ids/s, longest batch {:.0} ms",
                f.verify.total.as_secs_f64(),
                thousands(f.verify.ids_per_s()),
                f.verify.longest
            )
        }),
        ("retention sweep, rows/s, longest batch", "", |f| {
            format!(
                "{} /s, {:.0} ms",
                thousands(f.sweep.counts.1 as f64 / f.sweep.total.as_secs_f64()),
                f.sweep.longest
            )
        }),
        ("plain batched DELETE, rows/s, longest batch", "", |f| {
            format!(
                "{} /s, {:.0} ms",
                thousands(f.plain.counts.1 as f64 / f.plain.total.as_secs_f64()),
                f.plain.longest
            )
        }),
        ("retention, loom vs plain", ">= 1.0x", |f| {
            format!(
                "{:.2}x",
                (f.sweep.counts.1 as f64 / f.sweep.total.as_secs_f64())
                    / (f.plain.counts.1 as f64 / f.plain.total.as_secs_f64())
            )
        }),
        (
            "longest append wait during the sweep (plain DELETE)",
            "<= ~200 ms",
            |f| format!("{:.1} ms ({:.1} ms)", f.sweep_wait, f.plain_wait),
        ),
        ("rows after retention: loom = plain + appends", "ok", |f| {
            ok(f.counts_ok).to_owned()
        }),
        ("`loom_repair_executions`, whole pass", "", |f| {
            format!(
                "{:.1} s, {} ids/s, longest batch {:.0} ms",
                f.repair.total.as_secs_f64(),
                thousands(f.repair.ids_per_s()),
                f.repair.longest
            )
        }),
        ("repair's longest writer stall", "<= ~100 ms", |f| {
            format!("{:.1} ms", f.repair_stall)
        }),
        ("verified after repair: 0 missing, 0 orphaned", "ok", |f| {
            ok(f.repaired_ok).to_owned()
        }),
        (
            "old path: `loom_rebuild_executions()`, longest writer stall",
            "",
            |f| {
                format!(
                    "{:.1} s, {:.0} ms",
                    f.rebuild.as_secs_f64(),
                    f.rebuild_stall
                )
            },
        ),
    ];
    println!("\nsummary, for docs/benchmarks.md (executions x events each):\n");
    print!("| measure |");
    for f in figures {
        print!(" {} |", f.label);
    }
    println!(" target |");
    println!("|---|{}---|", "---|".repeat(figures.len()));
    for (measure, target, value) in rows {
        print!("| {measure} |");
        for f in figures {
            let value = value(f);
            print!(" {value} |");
            record(&format!("scale {}: {measure}", f.label), &value);
        }
        println!(" {target} |");
    }
}

fn main() {
    if !std::env::var("LOOM_BENCH_SCALE").is_ok_and(|v| v == "1") {
        println!(
            "\nscale bench skipped (about ten minutes at its default 12M events): `make bench.scale` runs it, \
             LOOM_SCALE_EXECUTIONS_A=20000 LOOM_SCALE_EXECUTIONS_B=4000 make bench.scale a small one"
        );
        return;
    }
    let shapes = [
        Shape {
            name: "A",
            db: "loom_bench_scale_a",
            executions: env_or("LOOM_SCALE_EXECUTIONS_A", 1_000_000).max(10),
            events_each: env_or("LOOM_SCALE_EVENTS_A", 2).max(1),
        },
        Shape {
            name: "B",
            db: "loom_bench_scale_b",
            executions: env_or("LOOM_SCALE_EXECUTIONS_B", 200_000).max(10),
            events_each: env_or("LOOM_SCALE_EVENTS_B", 50).max(1),
        },
    ];
    println!(
        "\nOperations at scale, Cluster C (PostgreSQL at {}): {} and {} (executions x events each), one execution in ten idle",
        pg_bin(),
        shapes[0].label(),
        shapes[1].label()
    );
    let figures: Vec<Figures> = shapes.iter().map(run).collect();
    summary(&figures);
}
