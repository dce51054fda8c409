//! loom's PostgreSQL extension: the snapshot frame and the execution-id
//! order, in the server.
//!
//! This file reads as the SQL catalog: each module holds thin
//! `#[pg_extern]`s over `pgloom-core`, the one implementation the client
//! shares, so a frame and an id order mean the same in SQL and in Rust.
//!
//! | SQL | what it does |
//! |---|---|
//! | `loom_snapshot_state(frame bytea) → jsonb` | decodes a frame into Postgres's own jsonb |
//! | `loom_snapshot_state_text(frame bytea) → text` | the exact JSON text a frame holds |
//! | `loom_snapshot_frame(state text \| jsonb, codec text DEFAULT 'zstd') → bytea` | frames a state |
//! | `loom_snapshot_frame_info(frame bytea) → TABLE(...)` | reads a frame's header, inflating nothing |
//! | `loom_compare_execution_ids(a text, b text) → integer` | loom's id order, whatever the collation |

use pgrx::prelude::*;

/// Whether `a` and `b` are the same string, at compile time.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The SQL this build installs (pgloom-core's parts) is the version the
// control file says it is: pgrx writes this package's version as the
// control file's default_version.
const _: () = assert!(
    same(pgloom_core::sql::VERSION, env!("CARGO_PKG_VERSION")),
    "pgloom_core::sql::VERSION must be the extension's package version (loom_pg/Cargo.toml)"
);

mod append;
mod drop_guard;
mod errors;
mod execution_stripes;
mod executions_index;
mod frame_sql;
mod interrupts;
mod jsonb_build;
mod order_sql;
mod palloc_text;
#[cfg(any(test, feature = "pg_test"))]
mod part_tests;
// The extension's script: loom-core/sql/'s parts, in PARTS' order (the
// #[pg_extern]s are `sql = false`: their definitions are in those parts).
mod parts;
mod privileges;
mod read_events;
mod retention;
mod saved_plans;
#[cfg(any(test, feature = "pg_test"))]
mod test_support;

::pgrx::pg_module_magic!(name, version);

/// Runs once, as PostgreSQL loads the library (in a backend, or in the
/// postmaster from `shared_preload_libraries`), after `Pg_magic_func` has
/// installed pgrx's panic hook: what loom sets up for the whole process
/// (no backtrace in any ERROR; pgloom-core's loops check for interrupts).
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    errors::keep_backtraces_out_of_errors();
    interrupts::install();
}

#[cfg(test)]
pub mod pg_test {
    /// One-off set-up when the pg_test framework starts: none needed.
    pub fn setup(_options: Vec<&str>) {}

    /// postgresql.conf settings the tests need: none.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
