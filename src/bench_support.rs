//! What more than one bench does the same way: a size from the
//! environment, the median of samples, a full id pass through an
//! [`EventStore`], and the summary lines `make bench.majors` tabulates.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use pgloom::event_store::EventStore;

use crate::{pg_bin, Cluster};

/// The number in environment variable `name` (a bench's size), or
/// `default` when it is unset or not a number.
#[must_use]
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Appends `measure<TAB>value` to the file `LOOM_BENCH_SUMMARY` names, when
/// it is set: `make bench.majors` runs a bench on each PostgreSQL major
/// into its own file and prints them side by side as one table.
///
/// # Panics
///
/// When the file cannot be written.
pub fn record(measure: &str, value: &str) {
    let Some(path) = std::env::var_os("LOOM_BENCH_SUMMARY") else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.to_string_lossy()));
    writeln!(file, "{measure}\t{value}")
        .unwrap_or_else(|e| panic!("{}: {e}", path.to_string_lossy()));
}

/// The median of `samples` (the upper one of an even count).
///
/// # Panics
///
/// When `samples` is empty.
#[must_use]
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// A full pass over `store`'s execution ids in pages of `page`: how many
/// ids, how long in all, and the median page in ms.
///
/// # Panics
///
/// When a page fails: a bench measures a store that works.
pub async fn full_pass<S: EventStore>(store: &S, page: usize) -> (u64, Duration, f64) {
    let started = Instant::now();
    let (mut count, mut pages, mut after) = (0u64, Vec::new(), None::<String>);
    loop {
        let t = Instant::now();
        let next = store
            .list_executions_page(after.as_deref(), page)
            .await
            .unwrap();
        pages.push(t.elapsed().as_secs_f64() * 1e3);
        count += next.ids.len() as u64;
        match next.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    (count, started.elapsed(), median(pages))
}

/// pgbench's tps for `script` on database `db` of cluster C: `clients`
/// clients on 2 threads, for `seconds`, in query mode `mode` (`simple`,
/// `prepared`).
///
/// # Panics
///
/// When pgbench fails or prints no tps: a bench measures what works.
#[must_use]
pub fn pgbench(db: &str, script: &str, seconds: u64, mode: &str, clients: u32) -> f64 {
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
        .args([
            "-n",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-M",
            mode,
            "-T",
            &seconds.to_string(),
            "-f",
        ])
        .arg(&path)
        .args([
            "-h",
            &field("host"),
            "-p",
            &field("port"),
            "-U",
            &field("user"),
            db,
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
