//! The conformance kit: what every
//! [`EventStore`](crate::event_store::EventStore),
//! [`BranchRegistry`](crate::branch_registry::BranchRegistry) and
//! [`SnapshotStore`](crate::snapshot_store::SnapshotStore) must do, first-
//! or third-party, checked against a real instance: one module a contract.
//! Run it in your store's own tests on an EMPTY store:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use pgloom::conformance::{check_branch_registry, check_event_store};
//! use pgloom::branch_registry::MemoryBranchRegistry;
//! use pgloom::event_store::MemoryEventStore;
//! check_event_store(&MemoryEventStore::new()).await?;
//! check_branch_registry(&MemoryBranchRegistry::new()).await?;
//! # Ok::<(), pgloom::conformance::ConformanceFailure>(()) })?;
//! # Ok::<(), pgloom::conformance::ConformanceFailure>(())
//! ```
//!
//! The ids mix case, `-`/`_`, digits, an NFC "é" and its NFD
//! decomposition, an astral character (U+1D11E) and U+FFFD, where code
//! point order and UTF-16 order disagree: the ways ADR 0108's stores
//! skipped and repeated ids. The payloads ([`conformance_payloads`]) are
//! what PostgreSQL's jsonb holds and an f64 or a 128-level parser does
//! not; every store must give each back as the same JSON value, and refuse
//! what jsonb cannot hold (`\u0000`, a lone surrogate) with
//! [`Error::UnsupportedPayload`].

use std::fmt::Debug;

use crate::event_store::{Event, Page};
use crate::Error;

mod branch_registry;
mod event_store;
mod resume;
mod snapshot_store;

pub use branch_registry::{check_branch_registry, PRUNE_REFS};
pub use event_store::{
    check_event_ids, check_event_store, conformance_payloads, CONFORMANCE_PAYLOAD_DEPTH,
};
pub use resume::check_resume_and_retention;
pub use snapshot_store::{
    adversarial_states, check_snapshot_markers, check_snapshot_store, Fidelity,
};

/// Ids whose code point order no locale and no UTF-16 sort reproduces.
pub const CONFORMANCE_IDS: [&str; 17] = [
    "a_b",
    "A1",
    "a-b",
    "B",
    "a",
    "A",
    "b-1",
    "b_1",
    "B10",
    "b2",
    "0",
    "9z",
    "_x",
    "\u{e9}",
    "e\u{301}",
    "\u{1d11e}",
    "\u{fffd}",
];

/// Cursors no store returned, between, before and after the ids.
pub(super) const FOREIGN_CURSORS: [&str; 9] = [
    "",
    "-",
    "A0",
    "a_",
    "b",
    "e",
    "\u{ff}",
    "\u{ffff}",
    "\u{10ffff}",
];

/// A rule a store broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{rule}: {detail}")]
pub struct ConformanceFailure {
    /// The rule, e.g. "code point order".
    pub rule: &'static str,
    /// What the store did instead.
    pub detail: String,
}

pub(super) fn fail(rule: &'static str, detail: impl Into<String>) -> ConformanceFailure {
    ConformanceFailure {
        rule,
        detail: detail.into(),
    }
}

pub(super) fn store_error(rule: &'static str) -> impl Fn(Error) -> ConformanceFailure {
    move |e| fail(rule, format!("the store failed: {e}"))
}

pub(super) fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    ids.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    ids.dedup();
    ids
}

pub(super) fn expect_eq<T: PartialEq + Debug>(
    rule: &'static str,
    got: T,
    expected: T,
) -> Result<(), ConformanceFailure> {
    if got == expected {
        Ok(())
    } else {
        Err(fail(rule, format!("expected {expected:?}, got {got:?}")))
    }
}

/// Pages through everything with `list` at `page_size` and checks each
/// page's rules against `expected`, the model.
pub(super) async fn check_pass<F, Fut>(
    expected: &[String],
    page_size: usize,
    mut list: F,
) -> Result<(), ConformanceFailure>
where
    F: FnMut(Option<String>, usize) -> Fut,
    Fut: std::future::Future<Output = Result<Page, Error>>,
{
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = list(after.clone(), page_size)
            .await
            .map_err(store_error("paging"))?;
        if page.ids.len() > page_size {
            return Err(fail(
                "page size",
                format!("{} ids on a page of {page_size}", page.ids.len()),
            ));
        }
        if let Some(cursor) = &page.next_cursor {
            if page.ids.last() != Some(cursor) {
                return Err(fail(
                    "next cursor",
                    format!("{cursor:?} is not the page's last id {:?}", page.ids.last()),
                ));
            }
        }
        seen.extend(page.ids.iter().cloned());
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
        if seen.len() > expected.len() {
            return Err(fail(
                "termination",
                format!("more than {} ids at page size {page_size}", expected.len()),
            ));
        }
    }
    if seen != expected {
        return Err(fail(
            "code point order, every id once",
            format!("page size {page_size}: expected {expected:?}, got {seen:?}"),
        ));
    }
    Ok(())
}

pub(super) fn sequences(events: &[Event]) -> Vec<i64> {
    events.iter().map(|e| e.sequence).collect()
}
