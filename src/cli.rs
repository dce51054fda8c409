//! The `loom` binary (pgloom's `cli` feature) as the tests run it. The
//! Makefile builds it and exports its path as `LOOM_BIN`.

use std::process::Command;
use std::time::{Duration, Instant};

/// The path of the loom binary, from `LOOM_BIN`.
///
/// # Panics
///
/// When `LOOM_BIN` is not set: run through `make test`, which builds the
/// binary first.
#[must_use]
pub fn loom_bin() -> String {
    std::env::var("LOOM_BIN")
        .expect("LOOM_BIN: run through `make test`, which builds the loom binary")
}

/// Runs `loom snapshot show --db {db} {args…}` to its end: its exit code,
/// its stdout followed by its stderr (one text to search, whichever stream
/// a message went to), and how long it took.
///
/// # Panics
///
/// When the binary cannot be started, is ended by a signal (no exit code),
/// or writes what is not UTF-8.
#[must_use]
pub fn snapshot_show(db: &str, args: &[&str]) -> (i32, String, Duration) {
    loom(&["snapshot", "show", "--db", db], args)
}

/// Runs `loom {args…}` as [`loom`] does, in an environment that has
/// none of the variables it may read a database from (`LOOM_DB`,
/// `DATABASE_URL`, libpq's `PG*`) but `env`'s.
///
/// # Panics
///
/// As [`snapshot_show`].
#[must_use]
pub fn loom_in_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut command = Command::new(loom_bin());
    command.args(args);
    for (name, _) in std::env::vars() {
        if name.starts_with("PG") || name == "LOOM_DB" || name == "DATABASE_URL" {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    let out = command.output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap(),
    )
}

/// Runs `loom {command…} {args…}` as [`snapshot_show`] does.
///
/// # Panics
///
/// As [`snapshot_show`].
#[must_use]
pub fn loom(command: &[&str], args: &[&str]) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = Command::new(loom_bin())
        .args(command)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap(),
        started.elapsed(),
    )
}
