//! The event-store kit: code point order, id cursors, exact payloads,
//! metadata, idempotent appends, tail reads, deletes while paging, all or
//! none.

use super::{
    check_pass, expect_eq, fail, sequences, sorted, store_error, ConformanceFailure,
    CONFORMANCE_IDS, FOREIGN_CURSORS,
};
use crate::contract::{check_compatibility, EVENT_STORE_CONTRACT};
use crate::event_store::{Event, EventStore, Page, Payload};
use crate::Error;

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
        .map_err(|e| fail("contract version", e.to_string()))?;
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

/// Events' metadata (contract 2.2.0): kept exactly, as payloads are, read back
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

/// `read_events_after` (contract 2.1.0): strictly after the cursor, in order, at
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

/// `delete_events` (contract 2.1.0) deletes bounded batches, oldest first, up to
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
