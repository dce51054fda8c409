//! Decoding bombs (issue 16, defect 4): hostile frames that
//! `loom_snapshot_state` must refuse or build within the memory `text::jsonb`
//! itself needs for the same text, without ever aborting the backend (an
//! abort makes the postmaster reset every session).
//!
//! Each frame is decoded in a fresh backend, whose peak resident memory
//! (`VmHWM` in `/proc/<pid>/status`: the tests run as root on the cluster's
//! machine) is read after the statement, with the same measurement for
//! `loom_snapshot_state_text(frame)::jsonb` (PostgreSQL's own `jsonb_in`
//! over the same decoded text) beside it. loom's peak must stay within
//! twice jsonb_in's, plus [`BACKEND_NOISE`] for what a fresh backend's
//! first statement costs whatever it does, and the session and the
//! postmaster must outlive every frame.

use loom_harness::{describe, Cluster};
use postgres::Client;

const MIB: usize = 1024 * 1024;

/// What a fresh backend's peak may differ by whatever the statement: its
/// catalog caches, the extension's library, the plan (10-20 MiB), and
/// what an ERROR passing through loom's Rust frames unwinds (a limit loom
/// raises, or jsonb_in's own ERROR for what loom hands it; see "a number of
/// 1 MiB", where both sides need little else). loom captures no backtrace
/// (tests/backtraces.rs), so `RUST_BACKTRACE` no longer adds its 20-35 MiB.
const BACKEND_NOISE: u64 = 32 * MIB as u64;

const DATABASE: &str = "loom_it_hostile_frames";

/// The hostile states: a name, and a SQL expression for the JSON text
/// (built in the server, framed there by `loom_snapshot_frame`).
fn hostile_states() -> Vec<(&'static str, String)> {
    let mib = MIB;
    vec![
        // 134M elements in 25 KB of zstd: refused at jsonb's element limit.
        (
            "[0,0,...] 256 MiB",
            format!("'[' || repeat('0,', {}) || '0]'", (256 * mib - 3) / 2),
        ),
        // Empty containers, each of which jsonb_in gives a parse state.
        (
            "[[],[],...] 8 MiB",
            format!("'[' || repeat('[],', {}) || '[]]'", 8 * mib / 3),
        ),
        // Containers with content: one span each for loom.
        (
            "[[0],[0],...] 8 MiB",
            format!("'[' || repeat('[0],', {}) || '[0]]'", 8 * mib / 4),
        ),
        // 44M pairs of one key: refused at jsonb's pair limit.
        (
            "{\"a\":0,...} 256 MiB",
            format!(
                "'{{' || repeat('\"a\":0,', {}) || '\"a\":0}}'",
                (256 * mib - 8) / 6
            ),
        ),
        (
            "{\"k0\":0,...} 1M keys",
            "(SELECT '{' || string_agg(format('\"k%s\":%s', i, i), ',') || '}'
               FROM generate_series(1, 1000000) AS i)"
                .to_owned(),
        ),
        // 128M levels: the validator's stack, then jsonb_in's depth check.
        (
            "[[[[... 256 MiB",
            format!("repeat('[', {0}) || repeat(']', {0})", 128 * mib),
        ),
        (
            "one string of 256 MiB",
            format!("'[\"' || repeat('a', {}) || '\"]'", 256 * mib - 4),
        ),
        (
            "\\n x 128M in a string",
            format!("'[\"' || repeat('\\n', {}) || '\"]'", (256 * mib - 4) / 2),
        ),
        // numeric_in refuses it: over 131,072 digits before the point.
        (
            "a number of 1 MiB",
            format!("'[' || repeat('7', {mib}) || ']'"),
        ),
        // jsonb_in refuses \u0000 wherever it is: loom hands it the text.
        (
            "[0,...,\"\\u0000\"] 8 MiB",
            format!("'[' || repeat('0,', {}) || '\"\\u0000\"]'", 4 * mib),
        ),
    ]
}

/// The backend's peak resident memory so far, in bytes.
fn vm_hwm(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| {
        panic!("/proc/{pid}/status (the tests run as root, on the cluster's machine): {e}")
    });
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}

struct Measured {
    peak: u64,
    outcome: String,
}

/// Runs `sql` with `frame` in a fresh backend; its peak memory and what
/// came of it. Asserts the backend outlived it.
fn measure(cluster: Cluster, sql: &str, frame: &[u8]) -> Measured {
    let mut client = cluster.connect(DATABASE);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let outcome = match client.query_one(sql, &[&frame]) {
        Ok(row) => format!("ok, {} bytes", row.get::<_, i32>(0)),
        Err(e) => {
            let code = e.code().map_or("no SQLSTATE", |c| c.code()).to_owned();
            let message = e
                .as_db_error()
                .map_or_else(|| describe(&e), |db| db.message().to_owned());
            format!("{code} {message:.90}")
        }
    };
    let peak = vm_hwm(pid);
    let alive: i32 = client
        .query_one("SELECT 1", &[])
        .unwrap_or_else(|e| panic!("the session did not survive {sql}: {e}"))
        .get(0);
    assert_eq!(alive, 1);
    Measured { peak, outcome }
}

fn postmaster_start(client: &mut Client) -> String {
    client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .unwrap()
        .get(0)
}

#[test]
fn hostile_frames_decode_within_twice_jsonb_ins_memory_and_never_crash() {
    let cluster = Cluster::C;
    let mut admin = cluster.fresh_database(DATABASE);
    let started = postmaster_start(&mut admin);
    // A fresh backend's own peak, for the table.
    let idle = measure(cluster, "SELECT length($1)", b"x");

    let mib = |bytes: u64| bytes as f64 / MIB as f64;
    println!(
        "\nfresh backend: {:.1} MiB; allowance for backend noise: {:.0} MiB\n",
        mib(idle.peak),
        mib(BACKEND_NOISE)
    );
    println!(
        "{:<26} {:>9} {:>10} {:>13} {:>6}  outcome (loom | jsonb_in)",
        "frame", "frame", "loom peak", "jsonb_in peak", "ratio"
    );
    let mut failures = Vec::new();
    for (name, state) in hostile_states() {
        let frame: Vec<u8> = admin
            .query_one(&format!("SELECT loom_snapshot_frame({state}, 'zstd')"), &[])
            .unwrap_or_else(|e| panic!("framing {name}: {}", describe(&e)))
            .get(0);
        let loom = measure(
            cluster,
            "SELECT pg_column_size(loom_snapshot_state($1))",
            &frame,
        );
        let jsonb_in = measure(
            cluster,
            "SELECT pg_column_size(loom_snapshot_state_text($1)::jsonb)",
            &frame,
        );
        let ratio = loom.peak as f64 / jsonb_in.peak as f64;
        println!(
            "{:<26} {:>6} KB {:>6.0} MiB {:>9.0} MiB {:>6.2}  {} | {}",
            name,
            frame.len() / 1000,
            mib(loom.peak),
            mib(jsonb_in.peak),
            ratio,
            loom.outcome,
            jsonb_in.outcome
        );
        if loom.peak > 2 * jsonb_in.peak + BACKEND_NOISE {
            failures.push(format!(
                "{name}: loom {:.0} MiB > 2 x jsonb_in {:.0} MiB + {:.0} MiB",
                mib(loom.peak),
                mib(jsonb_in.peak),
                mib(BACKEND_NOISE)
            ));
        }
        // Both accept or both refuse.
        if loom.outcome.starts_with("ok") != jsonb_in.outcome.starts_with("ok") {
            failures.push(format!(
                "{name}: loom {} but jsonb_in {}",
                loom.outcome, jsonb_in.outcome
            ));
        }
        assert_eq!(
            postmaster_start(&mut admin),
            started,
            "the postmaster restarted after {name}: a backend aborted"
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
