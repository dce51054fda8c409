//! Helpers the snapshot, conformance and CLI tests share (also included by
//! the repository root's Postgres tests).
#![allow(dead_code)] // each test file uses its own subset

use pgloom::snapshot_store::{JsonText, NewSnapshot};

pub mod tenants;

/// Runs `f` to completion on a current-thread runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A snapshot of `execution_id` (workflow "agentLoop$") at `sequence`.
pub fn snapshot(execution_id: &str, sequence: i64, state: &str) -> NewSnapshot {
    NewSnapshot::new(
        execution_id,
        "agentLoop$",
        sequence,
        JsonText::new(state.to_owned()).unwrap(),
    )
}
