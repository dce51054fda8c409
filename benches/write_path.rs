//! Issue 18's tables: loom's write path beside a plain table with the
//! same columns and primary key, side by side in one run. Printed, not
//! asserted.
//!
//! 1. Appends through the SQL API, with pgbench (4 clients, 2 threads),
//!    best of alternated rounds: 1 and 100 events per call, onto
//!    executions that already have events (an agent loop) and onto new
//!    ones (one new execution a call, or a batch of 100 that starts 100).
//!    Both sides draw ids and sequences from the same kind of sequence, so
//!    the difference is loom's work: the function call, the executions
//!    index, its trigger. Onto new executions the plain side writes a
//!    plain executions table too, in the same statement: what paging ids
//!    by hand takes (issue 26's anchor).
//! 2. The same through the client: `PgEventStore::append` beside a plain
//!    INSERT from tokio-postgres (`VALUES` for one event, `SELECT FROM
//!    unnest(...)` for a batch, as the client sends them), both pooled (4
//!    connections, 4 tasks), payloads sent as text on both sides.
//! 3. Saving a 200-turn agent state: as a frame (encoded in the client,
//!    bytes sent) beside JSONB through `PgSnapshotStore`, and
//!    `loom_save_snapshot(..., 'zstd')` beside `'none'` from SQL.
//! 4. Tail reads, 50 events after a sequence: `loom_read_events` beside
//!    the same keyset SELECT on the plain table (pgbench), and
//!    `read_events_after` beside that SELECT from tokio-postgres.
//!
//! 5. The two flavours (issue 28): table 1's appends and table 4's tail
//!    read on the extension beside the same calls on the SQL-only
//!    flavour, installed in a second database of the same server.
//!
//! Targets (issues 18 and 26): appends >= 0.9x the plain table onto
//! existing executions, >= 0.9x the two-table anchor onto new ones; the frame save >= 2x as fast as the
//! JSONB save, the SQL zstd save no slower than the JSONB one; tail reads
//! within 1.1x of the plain keyset SELECT.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_fixtures::agent_state;
use loom_harness::bench_support::{env_or, median, record};
use loom_harness::pg_pool;
use loom_harness::{pg_bin, runtime, Cluster};
use pgloom::event_store::{Event, EventStore, Payload, PgEventStore};
use pgloom::snapshot_store::{
    Codec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};
use postgres::types::{FromSql, Type};

const DB: &str = "loom_bench_write";

/// Which executions a shape appends to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Onto {
    /// One of 1000 per client, each with events already.
    Existing,
    /// A new one each call (a batch's events all of it).
    NewOne,
    /// A new one each event (a batch starts as many executions).
    NewEach,
}

/// The pgbench script of one call of `batch` events. Onto new executions,
/// the plain side writes its events and a plain executions table in one
/// statement: what paging ids in O(page) takes by hand (issue 26's
/// anchor), as loom keeps loom.executions.
fn script(loom: bool, batch: u32, onto: Onto) -> String {
    script_with(loom, batch, onto, false)
}

/// [`script`], with each event's metadata when `metadata` (loom 0.11.0's
/// fifth argument; the plain table's column of the same name).
fn script_with(loom: bool, batch: u32, onto: Onto, metadata: bool) -> String {
    let (set, id) = match onto {
        Onto::Existing => ("\\set e :client_id * 1000 + random(0, 999)\n", "'e' || :e"),
        Onto::NewOne | Onto::NewEach => ("", "'n' || nextval('ids')"),
    };
    let payload = "'{\"tool\":\"search\",\"ok\":true}'::jsonb";
    let meta = "'{\"trace_id\":\"4bf92f3577b34da6\",\"actor\":\"planner\"}'::jsonb";
    // The metadata's column, argument or array, where the script has one.
    let (col, one, arr, unnest) = if metadata {
        (
            ", metadata",
            format!(", {meta}"),
            format!(", array_fill({meta}, ARRAY[{batch}]) AS metas"),
            ", a.metas",
        )
    } else {
        ("", String::new(), String::new(), "")
    };
    let plain_ids = "x AS (INSERT INTO plain_executions SELECT DISTINCT u.id FROM a, unnest(a.ids) u(id) ON CONFLICT DO NOTHING)";
    let call = match (batch, loom, onto) {
        (1, true, _) => format!("SELECT loom_append_event({id}, nextval('seqs'), 'step', {payload}{one});"),
        (1, false, Onto::Existing) => format!(
            "INSERT INTO plain_events (execution_id, sequence, kind, payload{col}) VALUES ({id}, nextval('seqs'), 'step', {payload}{one});"
        ),
        (1, false, _) => format!(
            "WITH a AS (SELECT ARRAY[{id}] AS ids), {plain_ids} \
             INSERT INTO plain_events (execution_id, sequence, kind, payload) \
             SELECT a.ids[1], nextval('seqs'), 'step', {payload} FROM a;"
        ),
        // A batch as a client sends it, four arrays, built alike on both
        // sides: one execution's turn, or one event each of `batch` new
        // executions.
        _ => {
            let arrays = if onto == Onto::NewEach {
                format!(
                    "WITH a AS (SELECT array_agg({id}) AS ids, array_agg(nextval('seqs')) AS seqs, \
                     array_fill('step'::text, ARRAY[{batch}]) AS kinds, array_fill({payload}, ARRAY[{batch}]) AS payloads \
                     FROM generate_series(1, {batch}))"
                )
            } else {
                format!(
                    "WITH a AS (SELECT array_fill(x.id, ARRAY[{batch}]) AS ids, array_agg(nextval('seqs')) AS seqs, \
                     array_fill('step'::text, ARRAY[{batch}]) AS kinds, array_fill({payload}, ARRAY[{batch}]) AS payloads{arr} \
                     FROM (SELECT {id} AS id) x, generate_series(1, {batch}) GROUP BY x.id)"
                )
            };
            if loom {
                format!("{arrays} SELECT loom_append_events(a.ids, a.seqs, a.kinds, a.payloads{unnest}) FROM a;")
            } else {
                let also = if onto == Onto::Existing { String::new() } else { format!(", {plain_ids}") };
                format!(
                    "{arrays}{also} INSERT INTO plain_events (execution_id, sequence, kind, payload{col}) \
                     SELECT u.* FROM a, unnest(a.ids, a.seqs, a.kinds, a.payloads{unnest}) u;"
                )
            }
        }
    };
    format!("{set}{call}\n")
}

/// Calls per second of `script` under pgbench for `seconds`, in pgbench's
/// simple query mode (what the appends table measures: each call parsed
/// and planned, as psql and most drivers' unprepared calls are).
fn pgbench(script: &str, seconds: u64) -> f64 {
    pgbench_in(script, seconds, "simple")
}

/// [`pgbench`] in query mode `mode` (`simple`, `prepared`).
fn pgbench_in(script: &str, seconds: u64, mode: &str) -> f64 {
    pgbench_on(DB, script, seconds, mode)
}

/// [`pgbench_in`] on database `db` of cluster C, 4 clients.
fn pgbench_on(db: &str, script: &str, seconds: u64, mode: &str) -> f64 {
    loom_harness::bench_support::pgbench(db, script, seconds, mode, 4)
}

fn main() {
    let seconds = env_or("LOOM_BENCH_WRITE_SECONDS", 3);
    let rounds = env_or("LOOM_BENCH_WRITE_ROUNDS", 7);
    let mut client = Cluster::C.fresh_database(DB);
    seed(&mut client);
    client.batch_execute("VACUUM ANALYZE").unwrap();
    if wanted("sql") {
        sql_appends(seconds, rounds);
    }
    if wanted("client") {
        client_appends(seconds, rounds);
    }
    if wanted("statements") {
        statement_cache(seconds, rounds);
    }
    if wanted("notify") {
        notifying_appends(seconds, rounds);
    }
    if wanted("metadata") {
        metadata_appends(seconds, rounds);
    }
    if wanted("saves") {
        snapshot_saves(&mut client);
    }
    if wanted("tails") {
        tail_reads(seconds, rounds);
    }
    if wanted("flavours") {
        flavours(seconds, rounds);
    }
}

/// Table 4's read through loom, as pgbench runs it.
const TAIL_READ: &str =
    "\\set after random(0, 950)\nSELECT * FROM loom_read_events('tail', :after, 50);\n";

/// Where the SQL-only flavour is installed for [`flavours`]: a second
/// database of cluster C, beside [`DB`] and its extension.
const DB_SQL_ONLY: &str = "loom_bench_write_sql_only";

/// The write path of each flavour side by side (docs/flavours.md): the
/// same pgbench scripts through the same SQL API, on the extension (C)
/// and on the SQL-only flavour (PL/pgSQL), two databases of one server,
/// seeded alike, in paired rounds; then the tail read.
fn flavours(seconds: u64, rounds: u64) {
    let mut sql_only = Cluster::C.fresh_database_without_loom(DB_SQL_ONLY, "");
    sql_only
        .batch_execute(&pgloom_core::sql::sql_only_install_script("public"))
        .unwrap();
    seed(&mut sql_only);
    sql_only.batch_execute("VACUUM ANALYZE").unwrap();
    println!(
        "\nthe two flavours, one server: loom's SQL API on the extension (C) beside the SQL-only flavour\n\
         (PL/pgSQL), pgbench -c 4 -j 2, medians of {rounds} paired rounds of {seconds} s:"
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7}",
        "shape", "extension/s", "SQL-only/s", "ratio"
    );
    let on = |native: bool| if native { DB } else { DB_SQL_ONLY };
    for (name, batch, onto) in SHAPES {
        let (native, portable, ratio) = paired(rounds, |native| {
            pgbench_on(on(native), &script(true, batch, onto), seconds, "simple") * f64::from(batch)
        });
        println!(
            "{:<44} {native:>12.0} {portable:>12.0} {:>6.2}x",
            format!("{name} (ev/s)"),
            1.0 / ratio
        );
        record(
            &format!("append: {name}, SQL-only vs extension"),
            &format!("{:.2}x", 1.0 / ratio),
        );
    }
    let (native, portable, ratio) = paired(rounds, |native| {
        pgbench_on(on(native), TAIL_READ, seconds, "prepared")
    });
    println!(
        "{:<44} {native:>12.0} {portable:>12.0} {:>6.2}x",
        "loom_read_events, 50 of 1000 (reads/s)",
        1.0 / ratio
    );
    record(
        "tail read: SQL-only vs extension",
        &format!("{:.2}x", 1.0 / ratio),
    );
    println!("* ratio: SQL-only / extension; the plain table's figures are in the tables above");
}

/// The plain tables, the sequences, and the events every table starts
/// from, in `client`'s database (loom installed, in either flavour).
fn seed(client: &mut postgres::Client) {
    // The plain table: loom.events' columns and primary key, nothing else.
    client
        .batch_execute(
            "CREATE TABLE plain_events (execution_id text COLLATE \"C\" NOT NULL, sequence bigint NOT NULL,
                 kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
                 metadata jsonb, PRIMARY KEY (execution_id, sequence));
             CREATE TABLE plain_executions (execution_id text COLLATE \"C\" PRIMARY KEY);
             CREATE SEQUENCE seqs; CREATE SEQUENCE ids;
             -- The executions the 'existing' shapes append to, with events:
             -- e* for pgbench, c* for the client.
             SELECT loom_append_events(array_agg(p || i), array_agg(0::bigint), array_agg('started'::text),
                                       array_agg('{}'::jsonb)) FROM generate_series(0, 4999) i, unnest(ARRAY['e', 'c']) p;
             INSERT INTO plain_events (execution_id, sequence, kind, payload)
             SELECT p || i, 0, 'started', '{}' FROM generate_series(0, 4999) i, unnest(ARRAY['e', 'c']) p;
             -- The tail the reads page: 1000 events of one execution.
             SELECT loom_append_events(array_fill('tail'::text, ARRAY[1000]), array_agg(s), array_fill('step'::text, ARRAY[1000]),
                                       array_agg(jsonb_build_object('tool', 'search', 'n', s, 'ok', true)))
             FROM generate_series(1, 1000) s;
             INSERT INTO plain_events (execution_id, sequence, kind, payload)
             SELECT 'tail', s, 'step', jsonb_build_object('tool', 'search', 'n', s, 'ok', true) FROM generate_series(1, 1000) s;",
        )
        .unwrap();
}

/// Table 1: appends through the SQL API, pgbench.
fn sql_appends(seconds: u64, rounds: u64) {
    println!(
        "\nappends, loom's SQL API beside a plain table (same columns and primary key), pgbench -c 4 -j 2,\n\
         medians of {rounds} paired rounds of {seconds} s, Cluster C (PostgreSQL at {}):",
        pg_bin()
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7}",
        "shape", "loom ev/s", "plain ev/s", "ratio"
    );
    for (name, batch, onto) in SHAPES {
        let (loom, plain, ratio) = paired(rounds, |on_loom| {
            pgbench(&script(on_loom, batch, onto), seconds) * f64::from(batch)
        });
        println!("{name:<44} {loom:>12.0} {plain:>12.0} {ratio:>6.2}x");
        record(
            &format!("append: {name}, loom vs plain"),
            &format!("{ratio:.2}x"),
        );
    }
    println!("* plain: plain_events and a plain executions table, written in one statement");
}

/// Appends that carry metadata (loom 0.11.0), through the SQL API, beside
/// the plain table's INSERT of the same column; and the same loom calls
/// without it, to show what the metadata costs.
fn metadata_appends(seconds: u64, rounds: u64) {
    println!(
        "\nappends with metadata, loom's SQL API beside a plain table with the same column, pgbench -c 4 -j 2,\n\
         medians of {rounds} paired rounds of {seconds} s:"
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7} {:>12}",
        "shape", "loom ev/s", "plain ev/s", "ratio", "vs without"
    );
    for (name, batch, onto) in &SHAPES[..2] {
        let (loom, plain, ratio) = paired(rounds, |on_loom| {
            pgbench(&script_with(on_loom, *batch, *onto, true), seconds) * f64::from(*batch)
        });
        // loom with metadata (first) beside loom without.
        let (_, _, cost) = paired(rounds, |with| {
            pgbench(&script_with(true, *batch, *onto, with), seconds) * f64::from(*batch)
        });
        println!("{name:<44} {loom:>12.0} {plain:>12.0} {ratio:>6.2}x {cost:>11.2}x");
        record(
            &format!("append with metadata: {name}, loom vs plain"),
            &format!("{ratio:.2}x"),
        );
        record(
            &format!("append with metadata: {name}, vs without"),
            &format!("{cost:.2}x"),
        );
    }
}

/// Runs `measure` for loom and for the plain table `rounds` times each,
/// alternating which goes first, and returns the median of each side and
/// the median of the rounds' ratios (loom / plain): a drift of the shared
/// machine moves both sides of a round alike. Each measurement starts
/// right after a CHECKPOINT, so that neither side pays alone for the full
/// page images a checkpoint's first writes log.
fn paired(rounds: u64, mut measure: impl FnMut(bool) -> f64) -> (f64, f64, f64) {
    let mut admin = Cluster::C.connect(DB);
    let mut measure = move |on_loom: bool| {
        admin.batch_execute("CHECKPOINT").unwrap();
        measure(on_loom)
    };
    let (mut looms, mut plains, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (loom, plain) = if round % 2 == 0 {
            let loom = measure(true);
            (loom, measure(false))
        } else {
            let plain = measure(false);
            (measure(true), plain)
        };
        looms.push(loom);
        plains.push(plain);
        ratios.push(loom / plain);
    }
    (median(looms), median(plains), median(ratios))
}

/// Whether table `name` is among `LOOM_BENCH_WRITE_TABLES` (comma
/// separated: sql, client, statements, notify, metadata, saves, tails,
/// flavours; all
/// when unset).
fn wanted(name: &str) -> bool {
    std::env::var("LOOM_BENCH_WRITE_TABLES")
        .map(|tables| tables.split(',').any(|t| t.trim() == name))
        .unwrap_or(true)
}

const SHAPES: [(&str, u32, Onto); 5] = [
    ("1 per call, existing executions", 1, Onto::Existing),
    ("100 per call, existing executions", 100, Onto::Existing),
    ("1 per call, new executions *", 1, Onto::NewOne),
    ("100 per call, one new execution *", 100, Onto::NewOne),
    ("100 per call, 100 new executions *", 100, Onto::NewEach),
];

/// The plain side of table 2: what `PgEventStore::append` sends, minus
/// loom (payloads as text, made jsonb in the server): one row as VALUES,
/// a batch as arrays.
const PLAIN_APPEND_ONE: &str = "INSERT INTO plain_events (execution_id, sequence, kind, payload)
     VALUES ($1, $2, $3, $4::text::jsonb)";
const PLAIN_APPEND: &str = "INSERT INTO plain_events (execution_id, sequence, kind, payload)
     SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]::jsonb[])";

/// Table 2: appends through the client, 4 tasks over a pool of 4.
fn client_appends(seconds: u64, rounds: u64) {
    let rt = runtime();
    let config = Cluster::C.database(DB);
    let store = PgEventStore::new(pg_pool(&config, 4).unwrap());
    let plain_pool = pg_pool(&config, 4).unwrap();
    // Sequences above anything pgbench's `seqs` reached, ids of their own.
    let sequence = Arc::new(AtomicI64::new(1 << 40));
    let fresh = Arc::new(AtomicI64::new(0));
    println!(
        "\nappends through the client: PgEventStore::append beside a plain INSERT from tokio-postgres,\n\
         both pooled (4 connections, 4 tasks), medians of {rounds} paired rounds of {seconds} s:"
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7}",
        "shape", "loom ev/s", "plain ev/s", "ratio"
    );
    // The client's own cost beside tokio-postgres's: both sides write one
    // table's INSERT, whatever the executions (the two-table anchor is the
    // SQL table's).
    for (name, batch, onto) in &SHAPES[..4] {
        let (name, batch, existing) =
            (name.trim_end_matches(" *"), *batch, *onto == Onto::Existing);
        let (loom, plain, ratio) = paired(rounds, |on_loom| {
            let (store, plain_pool) = (store.clone(), plain_pool.clone());
            let feed = Feed::new(&sequence, &fresh, batch, existing);
            rt.block_on(append_for(seconds, feed, move |events| {
                let (store, plain_pool) = (store.clone(), plain_pool.clone());
                async move {
                    if on_loom {
                        store.append(&events).await.unwrap();
                    } else {
                        plain_append(&plain_pool, &events).await;
                    }
                }
            }))
        });
        println!("{name:<44} {loom:>12.0} {plain:>12.0} {ratio:>6.2}x");
        record(
            &format!("client append: {name}, loom vs plain"),
            &format!("{ratio:.2}x"),
        );
    }
}

/// Where the events of a client table's appends come from: sequences and
/// fresh ids shared by every task and round, so nothing collides.
#[derive(Clone)]
struct Feed {
    sequence: Arc<AtomicI64>,
    fresh: Arc<AtomicI64>,
    batch: u32,
    existing: bool,
}

impl Feed {
    fn new(sequence: &Arc<AtomicI64>, fresh: &Arc<AtomicI64>, batch: u32, existing: bool) -> Self {
        Feed {
            sequence: Arc::clone(sequence),
            fresh: Arc::clone(fresh),
            batch,
            existing,
        }
    }

    /// Task `task`'s `turn`-th call: one execution's `batch` events.
    fn events(&self, task: u64, turn: u64) -> Vec<Event> {
        let id = if self.existing {
            format!("c{}", task * 1000 + turn % 1000)
        } else {
            format!("cn{}", self.fresh.fetch_add(1, Ordering::Relaxed))
        };
        (0..self.batch)
            .map(|_| {
                Event::new(
                    id.clone(),
                    self.sequence.fetch_add(1, Ordering::Relaxed),
                    "step",
                    Payload::new(r#"{"tool":"search","ok":true}"#).unwrap(),
                )
            })
            .collect()
    }
}

/// Events a second that 4 tasks append through `append` for `seconds`.
async fn append_for<F, Fut>(seconds: u64, feed: Feed, append: F) -> f64
where
    F: Fn(Vec<Event>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let (feed, append) = (feed.clone(), append.clone());
            tokio::spawn(async move {
                let (mut appended, mut turn) = (0u64, 0u64);
                while started.elapsed() < Duration::from_secs(seconds) {
                    let events = feed.events(task, turn);
                    appended += events.len() as u64;
                    append(events).await;
                    turn += 1;
                }
                appended
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Table 2b: appends that NOTIFY (`PgEventStore::with_append_notifications`, what
/// wakes `watch_events`) beside the same appends without, through the
/// client: NOTIFY serializes commits on one lock, so it is opt-in.
fn notifying_appends(seconds: u64, rounds: u64) {
    let rt = runtime();
    let config = Cluster::C.database(DB);
    let quiet = PgEventStore::new(pg_pool(&config, 4).unwrap());
    let notifying = PgEventStore::new(pg_pool(&config, 4).unwrap()).with_append_notifications(true);
    let sequence = Arc::new(AtomicI64::new(1 << 41));
    let fresh = Arc::new(AtomicI64::new(1 << 30));
    println!(
        "\nappends that NOTIFY beside the same appends without (PgEventStore::with_append_notifications),\n\
         both pooled (4 connections, 4 tasks), medians of {rounds} paired rounds of {seconds} s:"
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7}",
        "shape", "notify ev/s", "quiet ev/s", "ratio"
    );
    for (name, batch, onto) in &SHAPES[..2] {
        let feed = Feed::new(&sequence, &fresh, *batch, *onto == Onto::Existing);
        let (notify, quiet_rate, ratio) = paired(rounds, |notify| {
            let store = if notify {
                notifying.clone()
            } else {
                quiet.clone()
            };
            rt.block_on(append_for(seconds, feed.clone(), move |events| {
                let store = store.clone();
                async move { store.append(&events).await.unwrap() }
            }))
        });
        println!("{name:<44} {notify:>12.0} {quiet_rate:>12.0} {ratio:>6.2}x");
        record(
            &format!("client append with NOTIFY: {name}, notify vs quiet"),
            &format!("{ratio:.2}x"),
        );
    }
}

/// The price of working behind a transaction-mode pooler: the client's
/// default (each statement unnamed, with its types, in one round trip:
/// the server parses and plans it each time) beside the same appends with
/// statements prepared once per connection and cached
/// (`cache_statements(true)`, which only a direct connection or a
/// session-mode pooler can carry), both on a direct connection.
fn statement_cache(seconds: u64, rounds: u64) {
    let rt = runtime();
    let config = Cluster::C.database(DB);
    let unnamed = PgEventStore::new(pg_pool(&config, 4).unwrap());
    let cached = PgEventStore::new(
        pgloom::PgPool::connect_with(
            &config,
            pgloom::PgPoolOptions::new()
                .max_size(4)
                .cache_statements(true),
        )
        .unwrap(),
    );
    let sequence = Arc::new(AtomicI64::new(1 << 42));
    let fresh = Arc::new(AtomicI64::new(1 << 31));
    println!(
        "\nappends with unnamed statements (the default, any pooler) beside statements cached per\n\
         connection (cache_statements(true)), both pooled (4 connections, 4 tasks), medians of\n\
         {rounds} paired rounds of {seconds} s:"
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7}",
        "shape", "unnamed ev/s", "cached ev/s", "ratio"
    );
    for (name, batch, onto) in &SHAPES[..2] {
        let feed = Feed::new(&sequence, &fresh, *batch, *onto == Onto::Existing);
        let (unnamed_rate, cached_rate, ratio) = paired(rounds, |default| {
            let store = if default {
                unnamed.clone()
            } else {
                cached.clone()
            };
            rt.block_on(append_for(seconds, feed.clone(), move |events| {
                let store = store.clone();
                async move { store.append(&events).await.unwrap() }
            }))
        });
        println!("{name:<44} {unnamed_rate:>12.0} {cached_rate:>12.0} {ratio:>6.2}x");
        record(
            &format!("client append: {name}, unnamed vs cached statements"),
            &format!("{ratio:.2}x"),
        );
    }
}

async fn plain_append(pool: &pgloom::PgPool, events: &[Event]) {
    let ids: Vec<&str> = events.iter().map(|e| e.execution_id.as_str()).collect();
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let payloads: Vec<&str> = events.iter().map(|e| e.payload.as_str()).collect();
    let client = pool.as_ref().get().await.unwrap();
    if let [event] = events {
        let insert = client.prepare_cached(PLAIN_APPEND_ONE).await.unwrap();
        client
            .execute(
                &insert,
                &[
                    &event.execution_id,
                    &event.sequence,
                    &event.kind,
                    &event.payload.as_str(),
                ],
            )
            .await
            .unwrap();
        return;
    }
    let insert = client.prepare_cached(PLAIN_APPEND).await.unwrap();
    client
        .execute(&insert, &[&ids, &sequences, &kinds, &payloads])
        .await
        .unwrap();
}

const SAVES: usize = 25;

/// Table 3: saving a 200-turn state, median of alternated saves (each a
/// new row).
fn snapshot_saves(sql: &mut postgres::Client) {
    let rt = runtime();
    let state = JsonText::new(agent_state(200, false)).unwrap();
    let store = |codec| {
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(codec);
        rt.block_on(PgSnapshotStore::start(
            pg_pool(&Cluster::C.database(DB), 1).unwrap(),
            &options,
        ))
        .unwrap()
    };
    let (jsonb_store, frame_store) = (store(Codec::None), store(Codec::Zstd));
    let (mut client_jsonb, mut client_frame, mut sql_jsonb, mut sql_frame) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let sql_save = sql
        .prepare("SELECT loom_save_snapshot($1, 'agentLoop$', $2, $3, $4)")
        .unwrap();
    for i in 0..(SAVES + 3) as i64 {
        let time = |f: &mut dyn FnMut()| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64() * 1e3
        };
        let timed = [
            time(&mut || {
                let snapshot = NewSnapshot::new("save jsonb", "agentLoop$", i, state.clone());
                rt.block_on(jsonb_store.save(&snapshot)).unwrap();
            }),
            time(&mut || {
                let snapshot = NewSnapshot::new("save frame", "agentLoop$", i, state.clone());
                rt.block_on(frame_store.save(&snapshot)).unwrap();
            }),
            time(&mut || {
                sql.execute(&sql_save, &[&"sql jsonb", &i, &state.as_str(), &"none"])
                    .unwrap();
            }),
            time(&mut || {
                sql.execute(&sql_save, &[&"sql zstd", &i, &state.as_str(), &"zstd"])
                    .unwrap();
            }),
        ];
        // The first saves warm the caches and the prepared statements.
        if i >= 3 {
            client_jsonb.push(timed[0]);
            client_frame.push(timed[1]);
            sql_jsonb.push(timed[2]);
            sql_frame.push(timed[3]);
        }
    }
    let (client_jsonb, client_frame, sql_jsonb, sql_frame) = (
        median(client_jsonb),
        median(client_frame),
        median(sql_jsonb),
        median(sql_frame),
    );
    println!(
        "\nsaving a 200-turn agent state ({} bytes of JSON), median of {SAVES} alternated saves:",
        state.as_str().len()
    );
    println!(
        "{:<48} {:>10} {:>10} {:>9}",
        "save", "frame ms", "JSONB ms", "speed-up"
    );
    println!(
        "{:<48} {client_frame:>10.2} {client_jsonb:>10.2} {:>8.2}x",
        "PgSnapshotStore (frame encoded in the client)",
        client_jsonb / client_frame
    );
    println!(
        "{:<48} {sql_frame:>10.2} {sql_jsonb:>10.2} {:>8.2}x",
        "loom_save_snapshot from SQL ('zstd' vs 'none')",
        sql_jsonb / sql_frame
    );
    record(
        "save 200 turns: client frame vs JSONB",
        &format!("{:.2}x", client_jsonb / client_frame),
    );
    record(
        "save 200 turns: SQL zstd vs JSONB",
        &format!("{:.2}x", sql_jsonb / sql_frame),
    );
}

/// A jsonb column as the text the client keeps (the binary format's
/// version byte, then the JSON text): what `read_events_after` does with a
/// payload, without loom.
struct JsonbText(String);

impl<'a> FromSql<'a> for JsonbText {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(JsonbText(std::str::from_utf8(&raw[1..])?.to_owned()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }
}

const PLAIN_TAIL: &str = "SELECT sequence, kind, payload, created_at FROM plain_events
     WHERE execution_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3";
const READS: usize = 400;

/// Table 4: 50 events after a sequence.
fn tail_reads(seconds: u64, rounds: u64) {
    // Prepared on both sides: a read is planned once per session, as a
    // service's pool does (the plain SELECT's plan also stops depending on
    // each literal's estimate).
    let (loom, plain, ratio) = paired(rounds, |on_loom| {
        pgbench_in(
            if on_loom {
                TAIL_READ
            } else {
                "\\set after random(0, 950)\nSELECT sequence, kind, payload, created_at FROM plain_events \
                 WHERE execution_id = 'tail' AND sequence > :after ORDER BY sequence LIMIT 50;\n"
            },
            seconds,
            "prepared",
        )
    });
    let rt = runtime();
    let config = Cluster::C.database(DB);
    let store = PgEventStore::new(pg_pool(&config, 1).unwrap());
    let plain_pool = pg_pool(&config, 1).unwrap();
    let (client_loom, client_plain) = rt.block_on(async {
        let (mut on_loom, mut on_plain) = (Vec::new(), Vec::new());
        for i in 0..READS + 20 {
            let after = (i * 37 % 950) as i64;
            let started = Instant::now();
            let events = store
                .read_events_after("tail", Some(after), 50)
                .await
                .unwrap();
            let loom_ms = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(events.len(), 50);
            let started = Instant::now();
            let client = plain_pool.as_ref().get().await.unwrap();
            let tail = client.prepare_cached(PLAIN_TAIL).await.unwrap();
            let rows = client
                .query(&tail, &[&"tail", &after, &50_i64])
                .await
                .unwrap();
            let events: Vec<Event> = rows
                .iter()
                .map(|row| {
                    Event::new(
                        "tail",
                        row.get(0),
                        row.get::<_, String>(1),
                        Payload::new(row.get::<_, JsonbText>(2).0).unwrap(),
                    )
                    .with_created_at(row.get(3))
                })
                .collect();
            let plain_ms = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(events.len(), 50);
            if i >= 20 {
                on_loom.push(loom_ms);
                on_plain.push(plain_ms);
            }
        }
        (median(on_loom), median(on_plain))
    });
    println!("\ntail reads, 50 events after a sequence of a 1000-event log:");
    println!(
        "{:<60} {:>10} {:>10} {:>7}",
        "read", "loom", "plain", "ratio"
    );
    println!(
        "{:<60} {loom:>10.0} {plain:>10.0} {:>6.2}x",
        format!("loom_read_events vs keyset SELECT, pgbench -c 4 -M prepared (reads/s)"),
        1.0 / ratio
    );
    println!(
        "{:<60} {client_loom:>10.3} {client_plain:>10.3} {:>6.2}x",
        format!("read_events_after vs tokio-postgres, median of {READS} (ms)"),
        client_loom / client_plain
    );
    record(
        "tail read: loom_read_events time vs plain",
        &format!("{:.2}x", 1.0 / ratio),
    );
    record(
        "tail read: read_events_after time vs plain",
        &format!("{:.2}x", client_loom / client_plain),
    );
}
