//! Issue 18's table: appending through loom's SQL API beside a plain table
//! with the same columns and primary key, side by side in one run, with
//! pgbench (4 clients, 2 threads), best of alternated rounds. Printed, not
//! asserted.
//!
//! Shapes: 1 and 100 events per call, onto executions that already have
//! events (an agent loop) and onto new executions. Both sides draw ids and
//! sequences from the same kind of sequence, so the difference is loom's
//! work: the function call, the executions index, its trigger.
//!
//! Targets (issue 18): >= 0.9x the plain table onto existing executions,
//! >= 0.8x onto new ones.

use std::process::Command;

use loom_harness::bench_support::{env_or, record};
use loom_harness::{pg_bin, Cluster};

const DB: &str = "loom_bench_write";

/// The pgbench script of one call, onto an existing execution (one of
/// 1000 per client, each with events already) or a new one.
fn script(loom: bool, batch: u32, existing: bool) -> String {
    let (set, id) = if existing {
        ("\\set e :client_id * 1000 + random(0, 999)\n", "'e' || :e")
    } else {
        ("", "'n' || nextval('ids')")
    };
    let payload = "'{\"tool\":\"search\",\"ok\":true}'::jsonb";
    let call = match (batch, loom) {
        (1, true) => format!("SELECT loom_append_event({id}, nextval('seqs'), 'step', {payload});"),
        (1, false) => format!(
            "INSERT INTO plain_events (execution_id, sequence, kind, payload) VALUES ({id}, nextval('seqs'), 'step', {payload});"
        ),
        // A batch as a client sends it, four arrays (one execution per
        // batch, as a workflow appends its turn), built alike on both sides.
        _ => {
            let arrays = format!(
                "WITH a AS (SELECT array_fill(x.id, ARRAY[{batch}]) AS ids, array_agg(nextval('seqs')) AS seqs, \
                 array_fill('step'::text, ARRAY[{batch}]) AS kinds, array_fill({payload}, ARRAY[{batch}]) AS payloads \
                 FROM (SELECT {id} AS id) x, generate_series(1, {batch}) GROUP BY x.id)"
            );
            if loom {
                format!("{arrays} SELECT loom_append_events(a.ids, a.seqs, a.kinds, a.payloads) FROM a;")
            } else {
                format!(
                    "{arrays} INSERT INTO plain_events (execution_id, sequence, kind, payload) \
                     SELECT u.* FROM a, unnest(a.ids, a.seqs, a.kinds, a.payloads) u;"
                )
            }
        }
    };
    format!("{set}{call}\n")
}

/// Calls per second of `script` under pgbench for `seconds`.
fn pgbench(script: &str, seconds: u64) -> f64 {
    let path = std::env::temp_dir().join(format!("loom-write-{}.sql", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let conninfo = Cluster::C.conninfo();
    let field = |key: &str| {
        conninfo
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_owned))
            .unwrap_or_default()
    };
    let out = Command::new(format!("{}/pgbench", pg_bin()))
        .args(["-n", "-c", "4", "-j", "2", "-T", &seconds.to_string(), "-f"])
        .arg(&path)
        .args([
            "-h",
            &field("host"),
            "-p",
            &field("port"),
            "-U",
            &field("user"),
            DB,
        ])
        .output()
        .expect("pgbench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {stdout}"))
}

fn main() {
    let seconds = env_or("LOOM_BENCH_WRITE_SECONDS", 5);
    let rounds = env_or("LOOM_BENCH_WRITE_ROUNDS", 3);
    let mut client = Cluster::C.fresh_database(DB);
    // The plain table: loom.events' columns and primary key, nothing else.
    client
        .batch_execute(
            "CREATE TABLE plain_events (execution_id text COLLATE \"C\" NOT NULL, sequence bigint NOT NULL,
                 kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (execution_id, sequence));
             CREATE SEQUENCE seqs; CREATE SEQUENCE ids;
             -- The executions the 'existing' shapes append to, with events.
             SELECT loom_append_events(array_agg('e' || i), array_agg(0::bigint), array_agg('started'::text),
                                       array_agg('{}'::jsonb)) FROM generate_series(0, 4999) i;
             INSERT INTO plain_events (execution_id, sequence, kind, payload)
             SELECT 'e' || i, 0, 'started', '{}' FROM generate_series(0, 4999) i;",
        )
        .unwrap();
    client.batch_execute("VACUUM ANALYZE").unwrap();
    println!(
        "\nappends, loom's SQL API beside a plain table (same columns and primary key), pgbench -c 4 -j 2,\n\
         best of {rounds} alternated rounds of {seconds} s, Cluster C (PostgreSQL at {}):",
        pg_bin()
    );
    println!(
        "{:<44} {:>12} {:>12} {:>7}",
        "shape", "loom ev/s", "plain ev/s", "ratio"
    );
    for (name, batch, existing) in [
        ("1 per call, existing executions", 1, true),
        ("100 per call, existing executions", 100, true),
        ("1 per call, new executions", 1, false),
        ("100 per call, new executions", 100, false),
    ] {
        let (mut loom, mut plain) = (0.0_f64, 0.0_f64);
        for _ in 0..rounds {
            loom = loom.max(pgbench(&script(true, batch, existing), seconds) * f64::from(batch));
            plain = plain.max(pgbench(&script(false, batch, existing), seconds) * f64::from(batch));
        }
        println!(
            "{name:<44} {loom:>12.0} {plain:>12.0} {:>6.2}x",
            loom / plain
        );
        record(
            &format!("append: {name}, loom vs plain"),
            &format!("{:.2}x", loom / plain),
        );
    }
}
