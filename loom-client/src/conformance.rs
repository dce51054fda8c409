//! The conformance kit: what every [`EventStore`] and [`BranchRegistry`]
//! must do, first- or third-party, checked against a real instance. Run it
//! in your store's own tests on an EMPTY store:
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

use crate::branch_registry::{prune_branch_refs, BranchRegistry};
use crate::contract::{check_compatibility, BRANCH_REGISTRY_CONTRACT, EVENT_STORE_CONTRACT};
use crate::event_store::{Event, EventStore, Page, Payload};
use crate::Error;

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
const FOREIGN_CURSORS: [&str; 9] = [
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

fn fail(rule: &'static str, detail: impl Into<String>) -> ConformanceFailure {
    ConformanceFailure {
        rule,
        detail: detail.into(),
    }
}

fn store_error(rule: &'static str) -> impl Fn(Error) -> ConformanceFailure {
    move |e| fail(rule, format!("the store failed: {e}"))
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    ids.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    ids.dedup();
    ids
}

/// Pages through everything with `list` at `page_size` and checks each
/// page's rules against `expected`, the model.
async fn check_pass<F, Fut>(
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

/// Checks `ids` (appended to an empty `store` as one event each) page back
/// in code point order at `page_size`: the property the kit's proptests
/// drive with random Unicode ids.
///
/// # Errors
///
/// The first rule the store breaks.
pub async fn check_event_ids<S: EventStore>(
    store: &S,
    ids: &[&str],
    page_size: usize,
) -> Result<(), ConformanceFailure> {
    let ids = sorted(ids);
    for id in &ids {
        store
            .append(&[Event::new(id, 1, "started", serde_json::json!({}))])
            .await
            .map_err(store_error("append"))?;
    }
    check_pass(&ids, page_size, |after, limit| async move {
        store.list_executions_page(after.as_deref(), limit).await
    })
    .await
}

/// Runs every event-store rule against an empty `store`.
///
/// # Errors
///
/// The first rule the store breaks.
pub async fn check_event_store<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    check_compatibility("event", store.contract_version(), EVENT_STORE_CONTRACT)
        .map_err(|e| fail("SPI version", e.to_string()))?;
    let empty = store
        .list_executions_page(None, 10)
        .await
        .map_err(store_error("empty store"))?;
    if empty != Page::default() {
        return Err(fail("empty store", format!("{empty:?}")));
    }
    if !matches!(
        store.list_executions_page(None, 0).await,
        Err(Error::InvalidPageSize(0))
    ) {
        return Err(fail("page size", "a page size of 0 is not InvalidPageSize"));
    }
    // One batch per execution: the batch a runtime writes, and one every
    // store can commit atomically (a sharded one included).
    for id in CONFORMANCE_IDS {
        let events: Vec<Event> = (1..=2)
            .map(|n| Event::new(id, n, "step", serde_json::json!({ "n": n })))
            .collect();
        store.append(&events).await.map_err(store_error("append"))?;
    }
    let expected = sorted(&CONFORMANCE_IDS);
    for page_size in [1, 2, 3, 7, expected.len(), expected.len() + 5] {
        check_pass(&expected, page_size, |after, limit| async move {
            store.list_executions_page(after.as_deref(), limit).await
        })
        .await?;
    }
    // A page size is a bound, not a size to allocate: "everything".
    let everything = store
        .list_executions_page(None, usize::MAX)
        .await
        .map_err(store_error("a page of usize::MAX"))?;
    expect_eq(
        "a page size of usize::MAX",
        everything,
        Page {
            ids: expected.clone(),
            next_cursor: None,
        },
    )?;
    for cursor in FOREIGN_CURSORS {
        let page = store
            .list_executions_page(Some(cursor), 100)
            .await
            .map_err(store_error("foreign cursor"))?;
        let after: Vec<String> = expected
            .iter()
            .filter(|id| pgloom_core::compare_execution_ids(id, cursor).is_gt())
            .cloned()
            .collect();
        if page.ids != after {
            return Err(fail(
                "a cursor the store never returned",
                format!("after {cursor:?}: expected {after:?}, got {:?}", page.ids),
            ));
        }
    }
    let read = store
        .read_events("a_b")
        .await
        .map_err(store_error("read"))?;
    if read.iter().map(|e| e.sequence).collect::<Vec<_>>() != [1, 2]
        || read[1].payload != serde_json::json!({ "n": 2 })
    {
        return Err(fail("read events in sequence order", format!("{read:?}")));
    }
    match store
        .append(&[Event::new("a_b", 2, "again", serde_json::json!({}))])
        .await
    {
        Err(Error::DuplicateEvent { sequence: 2, .. }) => {}
        other => {
            return Err(fail(
                "append-only",
                format!("a second event at a_b@2 gave {other:?}"),
            ))
        }
    }
    check_all_or_none(store).await?;
    check_tail_reads(store).await?;
    check_deletes_while_paging(store).await?;
    check_payloads(store).await?;
    check_metadata(store).await?;
    check_idempotent_appends(store).await
}

/// Events' metadata (SPI 2.2.0): kept exactly, as payloads are, read back
/// by every read with its event, `None` where none was given (JSON `null`
/// is none); part of the
/// event, so a different one at a stored position is a duplicate to an
/// idempotent append; refused alike where jsonb cannot hold it.
async fn check_metadata<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    let rule = "metadata";
    let id = "metadata";
    let exact = Payload::new(r#"{"trace_id":"4bf92f35","n":12345678901234567890123,"x":1.50}"#)
        .map_err(|e| fail(rule, e.to_string()))?;
    let events = [
        Event::new(id, 1, "kit", serde_json::json!({})).with_metadata(exact.clone()),
        Event::new(id, 2, "kit", serde_json::json!({})),
        Event::new(id, 3, "kit", serde_json::json!({})).with_metadata(serde_json::json!(null)),
    ];
    if events[2].metadata.is_some() {
        return Err(fail(rule, "JSON null metadata is none"));
    }
    store
        .append(&events[..1])
        .await
        .map_err(store_error(rule))?;
    store
        .append(&events[1..])
        .await
        .map_err(store_error(rule))?;
    let read = store.read_events(id).await.map_err(store_error(rule))?;
    let tail = store
        .read_events_after(id, Some(0), 10)
        .await
        .map_err(store_error(rule))?;
    for got in [&read, &tail] {
        let metadata: Vec<_> = got.iter().map(|e| e.metadata.clone()).collect();
        let expected: Vec<_> = events.iter().map(|e| e.metadata.clone()).collect();
        expect_eq("metadata read back with its event", metadata, expected)?;
        expect_eq(
            "events with metadata read back equal",
            got.as_slice(),
            &events[..],
        )?;
    }
    let other = Event::new(id, 1, "kit", serde_json::json!({}))
        .with_metadata(serde_json::json!({"trace_id": "another"}));
    match store.append_idempotent(&[other]).await {
        Err(Error::DuplicateEvent { sequence: 1, .. }) => {}
        got => {
            return Err(fail(
                rule,
                format!("other metadata at a stored position gave {got:?}"),
            ))
        }
    }
    store
        .append_idempotent(&events)
        .await
        .map_err(store_error("the same events with their metadata, again"))?;
    let unsupported = Event::new("refused-metadata", 1, "kit", serde_json::json!({}))
        .with_metadata(Payload::new(r#"{"a":"\u0000"}"#).map_err(|e| fail(rule, e.to_string()))?);
    match store.append(&[unsupported]).await {
        Err(Error::UnsupportedPayload {
            field: "metadata", ..
        }) => {}
        got => {
            return Err(fail(
                rule,
                format!("metadata jsonb cannot hold gave {got:?}"),
            ))
        }
    }
    while store
        .delete_events(id, None, events.len())
        .await
        .map_err(store_error(rule))?
        > 0
    {}
    Ok(())
}

/// [`EventStore::append_idempotent`]: an event stored identically is
/// success (the same JSON value in other text too), a different one at its
/// position a duplicate, and a batch's events not yet stored are appended.
/// Runs last: it adds a third event to `a_b`.
async fn check_idempotent_appends<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    let rule = "idempotent append";
    let stored = |n: i64| Event::new("a_b", n, "step", serde_json::json!({ "n": n }));
    store
        .append_idempotent(&[stored(2)])
        .await
        .map_err(store_error(rule))?;
    // The same value in other text (what a JSONB store prints back).
    let same = Event::new(
        "a_b",
        1,
        "step",
        crate::event_store::Payload::new(r#"{ "n" : 1.0 }"#)
            .map_err(|e| fail(rule, e.to_string()))?,
    );
    store
        .append_idempotent(&[same])
        .await
        .map_err(store_error(rule))?;
    for different in [
        Event::new("a_b", 2, "again", serde_json::json!({ "n": 2 })),
        Event::new("a_b", 2, "step", serde_json::json!({ "n": 3 })),
    ] {
        match store
            .append_idempotent(&[stored(1), different.clone()])
            .await
        {
            Err(Error::DuplicateEvent { sequence: 2, .. }) => {}
            other => {
                return Err(fail(
                    rule,
                    format!("{different:?} over a_b@2 gave {other:?}"),
                ))
            }
        }
    }
    // The retry of a batch of which one event is new: it lands.
    store
        .append_idempotent(&[stored(1), stored(2), stored(3)])
        .await
        .map_err(store_error(rule))?;
    let read = store.read_events("a_b").await.map_err(store_error(rule))?;
    expect_eq(rule, sequences(&read), vec![1, 2, 3])?;
    // A batch holding one position twice is a duplicate, as in append,
    // whether that position is stored or not.
    for twice in [3, 4] {
        match store
            .append_idempotent(&[stored(twice), stored(twice)])
            .await
        {
            Err(Error::DuplicateEvent { sequence, .. }) if sequence == twice => {}
            other => {
                return Err(fail(
                    rule,
                    format!("a batch holding a_b@{twice} twice gave {other:?}"),
                ))
            }
        }
    }
    // Far-apart positions: each looked up alone, both found.
    store
        .append(&[stored(1_000_000)])
        .await
        .map_err(store_error(rule))?;
    store
        .append_idempotent(&[stored(3), stored(1_000_000)])
        .await
        .map_err(store_error(rule))
}

/// How deep the kit's deepest payload nests: far past serde_json's 128,
/// well within what PostgreSQL's jsonb takes at its default
/// `max_stack_depth`.
pub const CONFORMANCE_PAYLOAD_DEPTH: usize = 2_000;

/// The payloads every store must give back as the same JSON value, named:
/// nesting [`CONFORMANCE_PAYLOAD_DEPTH`] deep (objects and arrays), numbers
/// outside f64 (`1e400`, `1e-400`), an integer and a decimal with more
/// digits than f64 keeps, and strings whose characters only escapes show.
#[must_use]
pub fn conformance_payloads() -> Vec<(&'static str, String)> {
    let half = CONFORMANCE_PAYLOAD_DEPTH / 2;
    vec![
        (
            "nested 2,000 deep",
            format!(
                "{}0.1000000000000000000000000000001{}",
                r#"{"a":["#.repeat(half),
                "]}".repeat(half)
            ),
        ),
        ("1e400", "1e400".to_owned()),
        ("a 23-digit integer", "12345678901234567890123".to_owned()),
        (
            "a 31-digit decimal",
            "0.1000000000000000000000000000001".to_owned(),
        ),
        (
            "exact numbers in an object",
            r#"{"big":-12345678901234567890123,"long":0.1000000000000000000000000000001,"huge":1e400,"tiny":1E-400,"z":1.50}"#.to_owned(),
        ),
        (
            "escaped characters",
            r#"["\\u0000 is text here","\"\/\b\f\n\r\t\u0001","\u00e9 e\u0301 \ud834\udd1e \ufffd"]"#
                .to_owned(),
        ),
    ]
}

/// Payloads PostgreSQL's jsonb refuses, which every store refuses alike.
const UNSUPPORTED_PAYLOADS: [&str; 4] = [
    r#"{"s":"a\u0000b"}"#,
    r#""\u0000""#,
    r#"["\ud800"]"#,
    r#"{"\udc00":1}"#,
];

/// Every payload of [`conformance_payloads`] comes back as the same JSON
/// value, through a whole read and a tail read; every payload jsonb cannot
/// hold is refused with [`Error::UnsupportedPayload`], its batch whole.
/// Leaves nothing behind.
async fn check_payloads<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    let id = "payloads";
    let payloads = conformance_payloads();
    let events: Vec<Event> = payloads
        .iter()
        .zip(1..)
        .map(|((_, text), n)| {
            let payload = Payload::new(text.as_str()).expect("the kit's payloads are JSON");
            Event::new(id, n, "kit", payload)
        })
        .collect();
    for event in &events {
        store
            .append(std::slice::from_ref(event))
            .await
            .map_err(|e| fail("payloads", format!("{:?}: {e}", event.payload)))?;
    }
    let read = store
        .read_events(id)
        .await
        .map_err(store_error("read payloads"))?;
    let tail = store
        .read_events_after(id, Some(0), events.len())
        .await
        .map_err(store_error("read payloads"))?;
    for got in [&read, &tail] {
        expect_eq("every payload read", sequences(got), sequences(&events))?;
        for ((name, _), (got, expected)) in payloads.iter().zip(got.iter().zip(&events)) {
            if got.payload != expected.payload {
                return Err(fail(
                    "payloads come back as the same JSON value",
                    format!("{name}: got {:?}", got.payload),
                ));
            }
        }
    }
    let refused = "refused-payloads";
    for text in UNSUPPORTED_PAYLOADS {
        let batch = [
            Event::new(refused, 1, "kit", serde_json::json!({})),
            Event::new(refused, 2, "kit", Payload::new(text).expect("JSON")),
        ];
        match store.append(&batch).await {
            Err(Error::UnsupportedPayload { sequence: 2, .. }) => {}
            other => {
                return Err(fail(
                    "a payload jsonb cannot hold is refused alike",
                    format!("{text} gave {other:?}"),
                ))
            }
        }
        let found = store
            .read_events(refused)
            .await
            .map_err(store_error("read"))?;
        expect_eq("a refused batch leaves nothing", found.len(), 0)?;
    }
    while store
        .delete_events(id, None, events.len())
        .await
        .map_err(store_error("delete payloads"))?
        > 0
    {}
    Ok(())
}

fn sequences(events: &[Event]) -> Vec<i64> {
    events.iter().map(|e| e.sequence).collect()
}

/// `read_events_after` (SPI 2.1.0): strictly after the cursor, in order, at
/// most the limit, and a cursor no event has.
async fn check_tail_reads<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    let events: Vec<Event> = (1..=7)
        .map(|n| Event::new("tail", n * 10, "step", serde_json::json!({ "n": n })))
        .collect();
    store.append(&events).await.map_err(store_error("append"))?;
    for (after, limit, expected) in [
        (None, 100, vec![10, 20, 30, 40, 50, 60, 70]),
        (None, 2, vec![10, 20]),
        (Some(30), 100, vec![40, 50, 60, 70]),
        (Some(35), 2, vec![40, 50]),
        (Some(0), 1, vec![10]),
        (Some(70), 5, vec![]),
        (Some(i64::MAX), 5, vec![]),
    ] {
        let tail = store
            .read_events_after("tail", after, limit)
            .await
            .map_err(store_error("tail read"))?;
        expect_eq(
            "events strictly after a sequence, in order, at most the limit",
            sequences(&tail),
            expected,
        )?;
    }
    let tail = store
        .read_events_after("tail", Some(50), 1)
        .await
        .map_err(store_error("tail read"))?;
    expect_eq(
        "a tail event's payload",
        tail[0].payload.clone(),
        Payload::from(serde_json::json!({ "n": 6 })),
    )?;
    if !matches!(
        store.read_events_after("tail", None, 0).await,
        Err(Error::InvalidPageSize(0))
    ) {
        return Err(fail(
            "page size",
            "a tail limit of 0 is not InvalidPageSize",
        ));
    }
    Ok(())
}

/// `delete_events` (SPI 2.1.0) deletes bounded batches, oldest first, up to
/// a sequence; and a pass over execution ids stays exact while executions
/// are deleted: every id not deleted comes back once, in order.
async fn check_deletes_while_paging<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    let batches = [
        store.delete_events("tail", Some(45), 2).await,
        store.delete_events("tail", Some(45), 2).await,
        store.delete_events("tail", Some(45), 2).await,
    ]
    .into_iter()
    .collect::<Result<Vec<u64>, Error>>()
    .map_err(store_error("delete events"))?;
    expect_eq("batches of a bounded delete", batches, vec![2, 2, 0])?;
    let left = store
        .read_events("tail")
        .await
        .map_err(store_error("read"))?;
    expect_eq(
        "what a delete up to 45 leaves",
        sequences(&left),
        vec![50, 60, 70],
    )?;
    if !matches!(
        store.delete_events("tail", None, 0).await,
        Err(Error::InvalidPageSize(0))
    ) {
        return Err(fail(
            "page size",
            "a delete limit of 0 is not InvalidPageSize",
        ));
    }
    // A pass at page size 3 that deletes, at each page, one id it already
    // returned and the next id it has not reached yet.
    let mut expected = sorted(&CONFORMANCE_IDS);
    expected.push("tail".to_owned());
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    let mut remaining = expected.clone();
    let mut seen: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list_executions_page(after.as_deref(), 3)
            .await
            .map_err(store_error("paging while deleting"))?;
        seen.extend(page.ids.iter().cloned());
        // The next id past this page (none after an empty last page).
        let ahead = page.ids.last().and_then(|last| {
            remaining
                .iter()
                .find(|id| pgloom_core::compare_execution_ids(id, last).is_gt())
                .cloned()
        });
        for doomed in page.ids.first().cloned().into_iter().chain(ahead.clone()) {
            deleted.push(doomed.clone());
            while store
                .delete_events(&doomed, None, 1)
                .await
                .map_err(store_error("delete events"))?
                > 0
            {}
        }
        if let Some(ahead) = ahead {
            remaining.retain(|id| *id != ahead);
        }
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
        if seen.len() > expected.len() {
            return Err(fail("termination", "more ids than stored while deleting"));
        }
    }
    let not_deleted_ahead: Vec<String> = expected
        .iter()
        .filter(|id| remaining.contains(id))
        .cloned()
        .collect();
    expect_eq(
        "paging while deleting: every id not deleted ahead of the cursor, once, in order",
        seen,
        not_deleted_ahead,
    )?;
    let left = store
        .list_executions_page(None, 100)
        .await
        .map_err(store_error("paging"))?;
    let kept: Vec<String> = expected
        .into_iter()
        .filter(|id| !deleted.contains(id))
        .collect();
    expect_eq("what deleting leaves listed", left.ids, kept)
}

/// A batch that cannot be appended whole leaves none of its events: new
/// events of new and existing executions, beside one that collides.
async fn check_all_or_none<S: EventStore>(store: &S) -> Result<(), ConformanceFailure> {
    let batch = [
        Event::new("all-or-none-1", 1, "step", serde_json::json!({})),
        Event::new("B", 3, "step", serde_json::json!({})),
        Event::new("all-or-none-2", 1, "step", serde_json::json!({})),
        Event::new("a_b", 1, "again", serde_json::json!({})),
    ];
    match store.append(&batch).await {
        // Refused for the duplicate, or (a sharded store) for spanning
        // shards: either way as a whole.
        Err(Error::DuplicateEvent { .. } | Error::BatchSpansShards { .. }) => {}
        other => {
            return Err(fail(
                "all or none",
                format!("a batch holding a duplicate of a_b@1 gave {other:?}"),
            ))
        }
    }
    for (id, expected) in [("all-or-none-1", 0), ("B", 2), ("all-or-none-2", 0)] {
        let found = store
            .read_events(id)
            .await
            .map_err(store_error("all or none"))?
            .len();
        if found != expected {
            return Err(fail(
                "all or none",
                format!("after a failed batch, {id} has {found} events, not {expected}"),
            ));
        }
    }
    Ok(())
}

async fn names<R: BranchRegistry>(registry: &R) -> Result<Vec<String>, ConformanceFailure> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = registry
            .list_refs(after.as_deref(), 4)
            .await
            .map_err(store_error("list refs"))?;
        all.extend(page.ids);
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => return Ok(all),
        }
    }
}

fn expect_eq<T: PartialEq + Debug>(
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

/// How many refs the prune check creates: enough that paging, deleting
/// behind the cursor and any cache upkeep all happen many times over.
pub const PRUNE_REFS: usize = 2_000;

/// Runs every branch-registry rule against an empty `registry`.
///
/// # Errors
///
/// The first rule the registry breaks.
pub async fn check_branch_registry<R: BranchRegistry>(
    registry: &R,
) -> Result<(), ConformanceFailure> {
    check_compatibility(
        "branch registry",
        registry.contract_version(),
        BRANCH_REGISTRY_CONTRACT,
    )
    .map_err(|e| fail("SPI version", e.to_string()))?;
    expect_eq(
        "empty registry",
        names(registry).await?,
        Vec::<String>::new(),
    )?;
    for (i, name) in CONFORMANCE_IDS.iter().enumerate() {
        registry
            .put_ref(name, "exec", i as i64)
            .await
            .map_err(store_error("put"))?;
    }
    let expected = sorted(&CONFORMANCE_IDS);
    for page_size in [1, 3, expected.len() + 1] {
        check_pass(&expected, page_size, |after, limit| async move {
            registry.list_refs(after.as_deref(), limit).await
        })
        .await?;
    }
    for cursor in FOREIGN_CURSORS {
        let page = registry
            .list_refs(Some(cursor), 100)
            .await
            .map_err(store_error("foreign cursor"))?;
        let after: Vec<String> = expected
            .iter()
            .filter(|n| n.as_str() > cursor)
            .cloned()
            .collect();
        expect_eq("a cursor the registry never returned", page.ids, after)?;
    }
    // Moves, deletes, re-puts and promotes show in the next page at once.
    registry
        .put_ref("B", "moved", 42)
        .await
        .map_err(store_error("move"))?;
    let moved = registry.get_ref("B").await.map_err(store_error("get"))?;
    expect_eq(
        "move a ref",
        moved.map(|r| (r.execution_id, r.sequence)),
        Some(("moved".to_owned(), 42)),
    )?;
    expect_eq(
        "delete",
        registry
            .delete_ref("a_b")
            .await
            .map_err(store_error("delete"))?,
        true,
    )?;
    expect_eq(
        "delete twice",
        registry
            .delete_ref("a_b")
            .await
            .map_err(store_error("delete"))?,
        false,
    )?;
    let mut without: Vec<String> = expected.iter().filter(|n| *n != "a_b").cloned().collect();
    expect_eq(
        "a deleted name is not listed",
        names(registry).await?,
        without.clone(),
    )?;
    registry
        .put_ref("a_b", "back", 1)
        .await
        .map_err(store_error("put"))?;
    expect_eq(
        "a re-put name is listed",
        names(registry).await?,
        expected.clone(),
    )?;
    expect_eq(
        "promote",
        registry
            .promote_ref("b2", "main")
            .await
            .map_err(store_error("promote"))?,
        true,
    )?;
    expect_eq(
        "promote a missing ref",
        registry
            .promote_ref("b2", "main")
            .await
            .map_err(store_error("promote"))?,
        false,
    )?;
    without = expected.iter().filter(|n| *n != "b2").cloned().collect();
    without.push("main".to_owned());
    without.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    expect_eq("promote moves the name", names(registry).await?, without)?;
    let main = registry.get_ref("main").await.map_err(store_error("get"))?;
    expect_eq(
        "promote keeps the target",
        main.map(|r| (r.execution_id, r.sequence)),
        Some(("exec".to_owned(), 9)),
    )?;

    // Prune half of a large registry while paging it.
    for i in 0..PRUNE_REFS {
        registry
            .put_ref(&format!("prune/{i:05}"), "exec", 1)
            .await
            .map_err(store_error("put"))?;
    }
    let pruned = prune_branch_refs(registry, 64, |name| {
        name.strip_prefix("prune/")
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n % 2 == 0)
    })
    .await
    .map_err(store_error("prune"))?;
    expect_eq("prune deletes each match once", pruned, PRUNE_REFS / 2)?;
    let left = names(registry).await?;
    let kept: Vec<&String> = left.iter().filter(|n| n.starts_with("prune/")).collect();
    expect_eq("prune leaves every other ref", kept.len(), PRUNE_REFS / 2)?;
    if kept
        .iter()
        .any(|n| n[6..].parse::<usize>().unwrap_or(0) % 2 == 0)
    {
        return Err(fail("prune", "an even ref survived"));
    }
    Ok(())
}

/// How exactly a snapshot store keeps a state's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fidelity {
    /// Byte for byte (memory, SQLite, every frame).
    Exact,
    /// As Postgres JSONB keeps it: the same value, keys reordered and
    /// duplicates merged; a state JSONB cannot hold (`\u0000`, a lone
    /// surrogate) must be refused with an error, never stored changed.
    Jsonb,
}

fn state(text: &str) -> crate::snapshot_store::JsonText {
    crate::snapshot_store::JsonText::new(text.to_owned()).expect("the kit's states are JSON")
}

fn new_snapshot(
    execution_id: &str,
    sequence: i64,
    text: &str,
) -> crate::snapshot_store::NewSnapshot {
    crate::snapshot_store::NewSnapshot::new(execution_id, "kit", sequence, state(text))
}

/// Whether `got` keeps `expected` at `fidelity` (`None`: a JSONB store
/// may have reordered what the parser cannot compare, a state too deep for
/// serde_json's 128 levels; it is compared by length then).
fn same_state(expected: &str, got: &str, fidelity: Fidelity) -> bool {
    match fidelity {
        Fidelity::Exact => expected == got,
        Fidelity::Jsonb => match (
            serde_json::from_str::<serde_json::Value>(expected),
            serde_json::from_str::<serde_json::Value>(got),
        ) {
            (Ok(a), Ok(b)) => same_value(&a, &b),
            _ => {
                expected.chars().filter(|c| !c.is_whitespace()).count()
                    == got.chars().filter(|c| !c.is_whitespace()).count()
            }
        },
    }
}

/// JSON equality as JSONB sees it: numbers by value (`1e2` is `100`).
fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// Runs every snapshot-store rule against an empty `store` that writes
/// with `codec` (its [`crate::snapshot_store::SnapshotStore::snapshot_codec`] marker must say so).
///
/// # Errors
///
/// The first rule the store breaks.
pub async fn check_snapshot_store<S: crate::snapshot_store::SnapshotStore>(
    store: &S,
    codec: crate::snapshot_store::Codec,
    fidelity: Fidelity,
) -> Result<(), ConformanceFailure> {
    expect_eq("the codec marker", store.snapshot_codec(), codec)?;
    let none = store
        .load_latest("kit")
        .await
        .map_err(store_error("load"))?;
    expect_eq("empty store", none.map(|s| s.sequence), None)?;
    let mut ids = Vec::new();
    for sequence in [1, 3, 5] {
        let text = format!(r#"{{"turn":{sequence},"b":1,"a":[]}}"#);
        ids.push(
            store
                .save(&new_snapshot("kit", sequence, &text))
                .await
                .map_err(store_error("save"))?,
        );
    }
    let latest = store
        .load_latest("kit")
        .await
        .map_err(store_error("load"))?;
    expect_eq("latest", latest.as_ref().map(|s| s.sequence), Some(5))?;
    let at = store
        .load_at("kit", 3)
        .await
        .map_err(store_error("load_at"))?;
    expect_eq(
        "at exactly",
        at.as_ref().map(|s| (s.id, s.sequence)),
        Some((ids[1], 3)),
    )?;
    if !same_state(
        r#"{"turn":3,"b":1,"a":[]}"#,
        at.expect("checked").state.as_str(),
        fidelity,
    ) {
        return Err(fail("the saved state", "load_at(3) gave another state"));
    }
    let neighbour = store
        .load_at("kit", 4)
        .await
        .map_err(store_error("load_at"))?;
    expect_eq("never a neighbour", neighbour.map(|s| s.sequence), None)?;
    let before = store
        .load_latest_before("kit", 5)
        .await
        .map_err(store_error("before"))?;
    expect_eq("latest before", before.map(|s| s.sequence), Some(3))?;
    let before = store
        .load_latest_before("kit", 1)
        .await
        .map_err(store_error("before"))?;
    expect_eq("nothing before the first", before.map(|s| s.sequence), None)?;
    // A re-save replaces the row (same id), in this store's format.
    let id = store
        .save(&new_snapshot("kit", 3, r#"{"turn":"again"}"#))
        .await
        .map_err(store_error("re-save"))?;
    expect_eq("a re-save keeps the row", id, ids[1])?;
    let again = store
        .load_at("kit", 3)
        .await
        .map_err(store_error("load_at"))?
        .expect("saved");
    if !same_state(r#"{"turn":"again"}"#, again.state.as_str(), fidelity) {
        return Err(fail(
            "a re-save replaces the state",
            again.state.to_string(),
        ));
    }
    for (i, (name, text)) in pgloom_core::synthetic::adversarial_states()
        .into_iter()
        .enumerate()
    {
        let sequence = 100 + i as i64;
        // What JSONB cannot hold may be refused, on save or on load (a
        // server decode goes through jsonb), but never returned changed.
        let may_refuse = fidelity == Fidelity::Jsonb
            && (text.contains("\\u0000") || text.contains("\\ud8") || text.contains("\\udf"));
        let saved = store
            .save(&new_snapshot("adversarial", sequence, &text))
            .await;
        let loaded = match saved {
            Ok(_) => store.load_at("adversarial", sequence).await,
            Err(_) if may_refuse => continue,
            Err(e) => return Err(fail("adversarial states", format!("{name}: {e}"))),
        };
        match loaded {
            Ok(Some(loaded)) if same_state(&text, loaded.state.as_str(), fidelity) => {}
            Ok(Some(_)) => {
                return Err(fail(
                    "adversarial states",
                    format!("{name}: came back changed"),
                ))
            }
            Ok(None) => {
                return Err(fail(
                    "adversarial states",
                    format!("{name}: saved, not found"),
                ))
            }
            Err(_) if may_refuse => {}
            Err(e) => return Err(fail("adversarial states", format!("{name}: {e}"))),
        }
    }
    // delete_snapshots: bounded batches, oldest first.
    let batches = [
        store.delete_snapshots("kit", 2).await,
        store.delete_snapshots("kit", 2).await,
    ]
    .into_iter()
    .collect::<Result<Vec<u64>, Error>>()
    .map_err(store_error("delete snapshots"))?;
    expect_eq("batches of a snapshot delete", batches, vec![2, 1])?;
    let gone = store
        .load_latest("kit")
        .await
        .map_err(store_error("load"))?;
    expect_eq("snapshots deleted", gone.map(|s| s.sequence), None)?;
    expect_eq(
        "nothing left to delete",
        store
            .delete_snapshots("kit", 2)
            .await
            .map_err(store_error("delete snapshots"))?,
        0,
    )
}

/// Resume and retention over an event store and a snapshot store that are
/// empty for the execution `"resume-kit"`: the resume tail starts exactly
/// after the latest snapshot; pruning leaves what resume needs; deleting
/// leaves nothing.
///
/// # Errors
///
/// The first rule the stores break.
pub async fn check_resume_and_retention<E, S>(
    events: &E,
    snapshots: &S,
) -> Result<(), ConformanceFailure>
where
    E: EventStore,
    S: crate::snapshot_store::SnapshotStore,
{
    use crate::resume::resume;
    use crate::retention::{delete_execution, prune_events};
    let id = "resume-kit";
    for n in 1..=10 {
        events
            .append(&[Event::new(id, n, "step", serde_json::json!({ "n": n }))])
            .await
            .map_err(store_error("append"))?;
    }
    let resumed = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "resume without a snapshot",
        (resumed.snapshot.is_none(), sequences(&resumed.events)),
        (true, (1..=10).collect()),
    )?;
    for (bound, expected, complete) in [
        (3, (1..=3).collect::<Vec<_>>(), false),
        (10, (1..=10).collect(), true),
    ] {
        let bounded = crate::resume::resume_bounded(events, snapshots, id, bound)
            .await
            .map_err(store_error("bounded resume"))?;
        expect_eq(
            "bounded resume",
            (sequences(&bounded.events), bounded.tail_complete),
            (expected, complete),
        )?;
    }
    let many = crate::resume::resume_many(events, snapshots, &[id, "resume-kit-none", id], 2)
        .await
        .into_iter()
        .collect::<crate::Result<Vec<_>>>()
        .map_err(store_error("batch resume"))?;
    expect_eq(
        "batch resume, in order, an unknown id told apart",
        many.iter()
            .map(|r| r.as_ref().map(|r| r.events.len()))
            .collect::<Vec<_>>(),
        vec![Some(10), None, Some(10)],
    )?;
    expect_eq(
        "no snapshot, nothing pruned",
        prune_events(events, snapshots, id, 3)
            .await
            .map_err(store_error("prune"))?,
        0,
    )?;
    for sequence in [4, 6] {
        snapshots
            .save(&new_snapshot(
                id,
                sequence,
                &format!(r#"{{"at":{sequence}}}"#),
            ))
            .await
            .map_err(store_error("save"))?;
    }
    let resumed = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "resume's snapshot",
        resumed.snapshot.map(|s| s.sequence),
        Some(6),
    )?;
    expect_eq(
        "resume's tail",
        sequences(&resumed.events),
        (7..=10).collect::<Vec<_>>(),
    )?;
    expect_eq(
        "events older than the latest snapshot pruned",
        prune_events(events, snapshots, id, 4)
            .await
            .map_err(store_error("prune"))?,
        5,
    )?;
    let after_prune = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "resume after pruning",
        sequences(&after_prune.events),
        (7..=10).collect::<Vec<_>>(),
    )?;
    expect_eq(
        "rows deleted with the execution",
        delete_execution(events, snapshots, id, 3)
            .await
            .map_err(store_error("delete execution"))?,
        2 + 5,
    )?;
    // Sequences with gaps: the last event at or before the snapshot stays,
    // so the execution stays listed.
    for n in [10, 20, 30] {
        events
            .append(&[Event::new("resume-gaps", n, "step", serde_json::json!({}))])
            .await
            .map_err(store_error("append"))?;
    }
    snapshots
        .save(&new_snapshot("resume-gaps", 25, "{}"))
        .await
        .map_err(store_error("save"))?;
    expect_eq(
        "pruning keeps the last event at or before the snapshot",
        prune_events(events, snapshots, "resume-gaps", 1)
            .await
            .map_err(store_error("prune"))?,
        1,
    )?;
    let left = events
        .read_events("resume-gaps")
        .await
        .map_err(store_error("read"))?;
    expect_eq(
        "what pruning with gaps leaves",
        sequences(&left),
        vec![20, 30],
    )?;
    let gone = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "a deleted execution",
        (gone.snapshot.is_none(), gone.events.len()),
        (true, 0),
    )
}

/// Checks a (decorated) store reports the markers of what it wraps: the
/// codec that shapes what is stored, and whether it seals whole states
/// (ADR 0141 D8: no wrapper may hide them).
///
/// # Errors
///
/// The marker that differs.
pub fn check_snapshot_markers<S: crate::snapshot_store::SnapshotStore>(
    store: &S,
    codec: crate::snapshot_store::Codec,
    seals_whole_state: bool,
) -> Result<(), ConformanceFailure> {
    expect_eq("the codec marker", store.snapshot_codec(), codec)?;
    expect_eq(
        "the sealing marker",
        store.seals_whole_state(),
        seals_whole_state,
    )
}
