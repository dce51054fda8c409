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

use loom_harness::{describe, sqlstate, Cluster};
use pgloom_core::frame::{encode, Codec};
use postgres::Client;

const MIB: usize = 1024 * 1024;

/// What a fresh backend's peak may differ by whatever the statement: its
/// catalog caches, the extension's library, the plan (10-20 MiB), and
/// what an ERROR passing through loom's Rust frames unwinds (a limit loom
/// raises, or jsonb_in's own ERROR for what loom hands it; see "a number of
/// 1 MiB", where both sides need little else). loom captures no backtrace
/// (tests/server/backtraces.rs), so `RUST_BACKTRACE` no longer adds its 20-35 MiB.
const BACKEND_NOISE: u64 = 32 * MIB as u64;

const DATABASE: &str = "loom_it_hostile_frames";

/// Held by each test of this file that builds 256 MiB states or times a
/// call, and by the feed's and claims' load tests (eight writers, eight
/// workers): the timed ones measure loom's interrupt checks, not a
/// neighbour's page faults (on a 2-core machine, a cancel that came 1 s
/// late beside the memory test was such a fault, not a missing check).
pub(crate) fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _heavy = heavy();
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

// Issue 25: work a frame can make unbounded. A frame of a few dozen bytes
// declared a state whose path lookups took time quadratic in its depth
// (a minute at 160,000 deep), and no loop in loom checked for interrupts,
// so neither statement_timeout nor pg_cancel_backend nor
// pg_terminate_backend ended such a call before it returned.

/// How deep the shallower of each pair of states is; the other is 8 times
/// deeper. Before the fix, path lookups 10,000 deep took 0.2-1 s and
/// 80,000 deep 15-60 s (the ratio of a quadratic: 64).
const DEPTH: usize = 10_000;

/// A time under which a call counts as this long: what a shared 2-core
/// machine may add to a few milliseconds' call, so that the ratio below
/// compares work, not noise.
const FLOOR_MS: f64 = 10.0;

/// A linear call is 8 times slower at 8 times the depth; a quadratic one
/// 64 times.
const MAX_RATIO: f64 = 20.0;

fn nested(open: &str, leaf: &str, close: &str, depth: usize) -> String {
    let mut text = String::with_capacity(depth * (open.len() + close.len()) + leaf.len());
    (0..depth).for_each(|_| text.push_str(open));
    text.push_str(leaf);
    (0..depth).for_each(|_| text.push_str(close));
    text
}

fn wide(item: impl Fn(usize) -> String, open: &str, close: &str, count: usize) -> String {
    let items: Vec<String> = (0..count).map(item).collect();
    format!("{open}{}{close}", items.join(","))
}

/// Milliseconds `sql` takes with `frame` and `path`, whether it returns or
/// raises (as `text::jsonb` raises on a state too deep for its stack).
fn run_ms(client: &mut Client, sql: &str, frame: &[u8], path: &[String]) -> f64 {
    let started = std::time::Instant::now();
    let result = if sql.contains("$2") {
        client.query_one(sql, &[&frame, &path])
    } else {
        client.query_one(sql, &[&frame])
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = result {
        assert_eq!(sqlstate(&e), "54001", "{sql}: {}", describe(&e));
    }
    ms
}

/// Whether `sql` at 8 times the input takes under [`MAX_RATIO`] times as
/// long as at the input (against [`FLOOR_MS`]), by medians of three runs;
/// stops at the second run over the bound, so that a quadratic call fails
/// in two runs, not three. The figures, for the message.
fn linear(
    client: &mut Client,
    sql: &str,
    small: (&[u8], &[String]),
    big: (&[u8], &[String]),
) -> (bool, String) {
    let median = |mut runs: Vec<f64>| {
        runs.sort_by(f64::total_cmp);
        runs[runs.len() / 2]
    };
    let shallow = median(
        (0..3)
            .map(|_| run_ms(client, sql, small.0, small.1))
            .collect(),
    );
    let bound = MAX_RATIO * shallow.max(FLOOR_MS);
    let mut runs = Vec::new();
    while runs.len() < 3 && runs.iter().filter(|&&ms| ms > bound).count() < 2 {
        runs.push(run_ms(client, sql, big.0, big.1));
    }
    let over = runs.iter().filter(|&&ms| ms > bound).count() >= 2;
    let deep = median(runs);
    (
        !over,
        format!("{shallow:.1} ms, then {deep:.1} ms (bound {bound:.0} ms)"),
    )
}

#[test]
fn path_lookups_and_decoding_take_time_linear_in_the_state() {
    let _heavy = heavy();
    let mut client = Cluster::C.fresh_database("loom_it_hostile_linear");
    let object = |depth| nested(r#"{"a":"#, "0", "}", depth);
    let duplicates = |depth| nested(r#"{"a":[],"a":"#, "0", "}", depth);
    let array = |depth| nested("[", "0", "]", depth);
    let elements = |count| wide(|_| "[0]".to_owned(), "[", "]", count);
    let members = |count| wide(|i| format!(r#""k{i}":[0]"#), "{", "}", count);
    let get_text = "SELECT loom_snapshot_get_text($1, VARIADIC $2::text[])";
    let get = "SELECT loom_snapshot_get($1, VARIADIC $2::text[])::text";
    let state_text = "SELECT length(loom_snapshot_state_text($1))";
    let state = "SELECT pg_column_size(loom_snapshot_state($1))";
    type Shape = Box<dyn Fn(usize) -> String>;
    let cases: Vec<(&str, &str, Shape, Option<&str>)> = vec![
        (
            "get_text [[…]] by -1",
            get_text,
            Box::new(array),
            Some("-1"),
        ),
        ("get_text [[…]] by 0", get_text, Box::new(array), Some("0")),
        (
            r#"get_text {"a":{…}} by a"#,
            get_text,
            Box::new(object),
            Some("a"),
        ),
        (
            r#"get_text {"a":[],"a":{…}} by a"#,
            get_text,
            Box::new(duplicates),
            Some("a"),
        ),
        (r#"get {"a":{…}} by a"#, get, Box::new(object), Some("a")),
        ("get [[…]] by -1", get, Box::new(array), Some("-1")),
        ("state_text [[…]]", state_text, Box::new(array), None),
        (
            r#"state_text {"a":{…}}"#,
            state_text,
            Box::new(object),
            None,
        ),
        // jsonb_in's stack refuses a deep state (54001), in about the
        // time it takes to get there.
        ("state [[…]]", state, Box::new(array), None),
        // Wide, where jsonb is built: 10 times the depth in elements.
        (
            "state [[0],[0],…]",
            state,
            Box::new(move |n| elements(10 * n)),
            None,
        ),
        (
            r#"state {"k0":[0],…}"#,
            state,
            Box::new(move |n| members(10 * n)),
            None,
        ),
    ];
    let mut failures = Vec::new();
    println!();
    for (name, sql, shape, step) in cases {
        let [small, big] = [DEPTH, 8 * DEPTH].map(|depth| {
            let frame = encode(&shape(depth), Codec::Zstd).unwrap();
            let path = step.map_or_else(Vec::new, |step| vec![step.to_owned(); depth]);
            (frame, path)
        });
        let (ok, figures) = linear(&mut client, sql, (&small.0, &small.1), (&big.0, &big.1));
        println!("{name:<34} {DEPTH} then {}: {figures}", 8 * DEPTH);
        if !ok {
            failures.push(format!("{name}: {figures}"));
        }
    }
    assert!(failures.is_empty(), "not linear: {failures:#?}");
}

/// A state of 256 MiB of `0,` in a 25 KB frame, framed by the server (the
/// tests' debug build validates 256 MiB slowly): every call below reads
/// all of it, for 1.5-3.5 s.
fn long_frame(client: &mut Client) -> Vec<u8> {
    let count = (256 * MIB - 3) / 2;
    client
        .query_one(
            &format!("SELECT loom_snapshot_frame('[' || repeat('0,', {count}) || '0]', 'zstd')"),
            &[],
        )
        .unwrap()
        .get(0)
}

/// How long after its limit a statement may end: the checks come every
/// 64 KiB of text, microseconds apart; the rest is the ERROR's way out.
const CANCEL_SLACK_MS: u128 = 1000;

#[test]
fn statement_timeout_ends_each_long_call_within_a_second() {
    let _heavy = heavy();
    let mut client = Cluster::C.fresh_database("loom_it_hostile_timeout");
    let frame = long_frame(&mut client);
    // The state as text too, for encoding: stored as it is (no pglz to
    // undo), so that the statement times loom's work more than reading it.
    client
        .batch_execute("CREATE TABLE big (t text); ALTER TABLE big ALTER t SET STORAGE EXTERNAL")
        .unwrap();
    client
        .execute(
            "INSERT INTO big SELECT loom_snapshot_state_text($1)",
            &[&frame],
        )
        .unwrap();
    client
        .batch_execute("SET statement_timeout = '500ms'")
        .unwrap();
    let mut failures = Vec::new();
    println!();
    for (name, sql) in [
        ("get_text by -1", "SELECT loom_snapshot_get_text($1, '-1')"),
        ("get by -1", "SELECT loom_snapshot_get($1, '-1')::text"),
        (
            "state_text",
            "SELECT length(loom_snapshot_state_text($1))::text",
        ),
        (
            "state",
            "SELECT pg_column_size(loom_snapshot_state($1))::text",
        ),
        (
            "frame_info",
            "SELECT format FROM loom_snapshot_frame_info($1)",
        ),
        (
            "frame (encode)",
            "SELECT length(loom_snapshot_frame(t, 'zstd'))::text FROM big",
        ),
    ] {
        // The best of three: a late end in each would be a missing check,
        // one late end among punctual ones the machine's.
        let mut attempts = (0..3).map(|_| {
            let started = std::time::Instant::now();
            let result = if sql.contains("$1") {
                client.query_one(sql, &[&frame])
            } else {
                client.query_one(sql, &[])
            };
            (result, started.elapsed().as_millis())
        });
        let (result, ms) = loop {
            let (result, ms) = attempts.next().expect("three attempts");
            let punctual = result.is_err() && ms <= 500 + CANCEL_SLACK_MS;
            if punctual || result.is_ok() || attempts.len() == 0 {
                break (result, ms);
            }
        };
        let outcome = match &result {
            Ok(_) => "returned".to_owned(),
            Err(e) => describe(e),
        };
        println!("{name:<16} {ms:>5} ms: {outcome}");
        if name == "frame_info" {
            // Reads the header only: no reason to be long.
            assert!(result.is_ok(), "{outcome}");
            continue;
        }
        // Ended by the timeout (57014), or by a typed ERROR of its own
        // (jsonb's element limit, 54000, which a fast machine reaches
        // within milliseconds of the timeout: 504-516 ms on this one):
        // either way, not a call that runs on past its limit. The slack
        // below bounds both.
        let ended = result
            .as_ref()
            .map_err(sqlstate)
            .err()
            .is_some_and(|code| code == "57014" || code == "54000");
        if !ended || ms > 500 + CANCEL_SLACK_MS {
            failures.push(format!("{name}: {ms} ms, {outcome}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn cancel_and_terminate_end_a_long_call_within_a_second() {
    let _heavy = heavy();
    let cluster = Cluster::C;
    let mut admin = cluster.fresh_database("loom_it_hostile_cancel");
    let frame = long_frame(&mut admin);
    println!();
    for (how, expected) in [
        ("pg_cancel_backend", "57014"),
        ("pg_terminate_backend", "57P01"),
    ] {
        let mut victim = cluster.connect("loom_it_hostile_cancel");
        let pid: i32 = victim
            .query_one("SELECT pg_backend_pid()", &[])
            .unwrap()
            .get(0);
        let frame = frame.clone();
        let call = std::thread::spawn(move || {
            let result = victim.query_one("SELECT loom_snapshot_get_text($1, '-1')", &[&frame]);
            (result.map(|_| ()), std::time::Instant::now())
        });
        // Let the call get going, then signal it.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let signalled = std::time::Instant::now();
        let sent: bool = admin
            .query_one(&format!("SELECT {how}($1)"), &[&pid])
            .unwrap()
            .get(0);
        assert!(sent, "{how}({pid})");
        let (result, ended) = call.join().unwrap();
        let ms = ended.duration_since(signalled).as_millis();
        let outcome = result
            .as_ref()
            .map_or_else(describe, |()| "returned".to_owned());
        println!("{how:<22} ended the call {ms:>5} ms later: {outcome}");
        let code = result.as_ref().map_err(sqlstate).err();
        assert_eq!(code.as_deref(), Some(expected), "{how}: {outcome}");
        assert!(ms < CANCEL_SLACK_MS, "{how}: the call ended {ms} ms later");
    }
}
