//! `loom executions list` and `loom events show`: the log, read through
//! the same event stores a service uses (PostgreSQL read-only, or a
//! SQLite file that must exist), payloads printed exactly as stored.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{describe, fail, not_found, Target, NOT_FOUND};

use crate::event_store::{Event, EventStore, Page, PgEventStore, SqliteEventStore};
use crate::retention::ExecutionActivity;

/// The server's clock, by `pg_catalog`'s name for it (`crate::pg_schema`:
/// the CLI runs as a superuser, where a database's owner may have put a
/// `now()` first on the `search_path`).
const NOW: &str = "SELECT pg_catalog.now()";

/// The store `db` names: PostgreSQL in a read-only session, or an existing
/// SQLite file (never created here).
pub(super) enum Store {
    Postgres(PgEventStore),
    Sqlite(SqliteEventStore),
}

impl Store {
    /// A page of executions with when each was last written.
    pub(super) async fn activity(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ExecutionActivity>, String> {
        match self {
            Store::Postgres(store) => store.execution_activity(after, limit).await,
            Store::Sqlite(store) => store.execution_activity(after, limit).await,
        }
        .map_err(|e| describe(&e))
    }

    /// The clock the store's times are written by, now: the server's
    /// (`now()`, what `loom_delete_idle_executions` compares with) on
    /// PostgreSQL, this machine's for a SQLite file.
    pub(super) async fn now(&self) -> Result<SystemTime, String> {
        match self {
            Store::Postgres(store) => {
                let client = store.pool().object().await.map_err(|e| describe(&e))?;
                let row = client
                    .query_typed_one(NOW, &[])
                    .await
                    .map_err(|e| describe(&e))?;
                row.try_get(0).map_err(|e| describe(&e))
            }
            Store::Sqlite(_) => Ok(SystemTime::now()),
        }
    }
}

pub(super) fn open(db: &str, connect_timeout: Duration) -> Result<Store, String> {
    if super::is_postgres(db) {
        Ok(Store::Postgres(PgEventStore::new(super::read_only_pool(
            db,
            connect_timeout,
        )?)))
    } else if std::path::Path::new(db).is_file() {
        SqliteEventStore::open(db)
            .map(Store::Sqlite)
            .map_err(|e| describe(&e))
    } else {
        Err(super::NO_SQLITE_DATABASE.to_owned())
    }
}

/// `loom executions list`: a page of ids, a line each or `--json`; exit 4
/// when there is none after the cursor.
pub(super) fn list_executions(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    after: Option<&str>,
    limit: usize,
    json: bool,
) -> ExitCode {
    match runtime.block_on(executions(
        target.db(),
        after,
        limit,
        target.connect_timeout(),
    )) {
        Ok(page) if page.ids.is_empty() && !json => not_found("no execution ids after the cursor"),
        Ok(page) => {
            if json {
                println!(
                    "{{\"ids\":{},\"next_cursor\":{}}}",
                    Value::from(page.ids.clone()),
                    Value::from(page.next_cursor.clone())
                );
            } else {
                for id in &page.ids {
                    println!("{id}");
                }
            }
            if page.ids.is_empty() {
                ExitCode::from(NOT_FOUND)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(message) => fail(&message),
    }
}

/// `loom events show`: an execution's events, one JSON object a line or
/// one document (`--json`); exit 4 when there is none after the cursor.
pub(super) fn show_events(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    execution_id: &str,
    after: Option<i64>,
    limit: usize,
    json: bool,
) -> ExitCode {
    match runtime.block_on(events(
        target.db(),
        execution_id,
        after,
        limit,
        target.connect_timeout(),
    )) {
        Ok(events) if events.is_empty() && !json => {
            not_found(&format!("no events of {execution_id:?} after the cursor"))
        }
        Ok(events) => {
            if json {
                let lines: Vec<String> = events.iter().map(render_event).collect();
                println!(
                    "{{\"execution_id\":{},\"events\":[{}]}}",
                    Value::from(execution_id),
                    lines.join(",")
                );
            } else {
                for event in &events {
                    println!("{}", render_event(event));
                }
            }
            if events.is_empty() {
                ExitCode::from(NOT_FOUND)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(message) => fail(&message),
    }
}

/// One page of execution ids after `after`.
pub(super) async fn executions(
    db: &str,
    after: Option<&str>,
    limit: usize,
    connect_timeout: Duration,
) -> Result<Page, String> {
    match open(db, connect_timeout)? {
        Store::Postgres(store) => store.list_executions_page(after, limit).await,
        Store::Sqlite(store) => store.list_executions_page(after, limit).await,
    }
    .map_err(|e| describe(&e))
}

/// Up to `limit` events of `execution_id` after sequence `after`.
pub(super) async fn events(
    db: &str,
    execution_id: &str,
    after: Option<i64>,
    limit: usize,
    connect_timeout: Duration,
) -> Result<Vec<Event>, String> {
    match open(db, connect_timeout)? {
        Store::Postgres(store) => store.read_events_after(execution_id, after, limit).await,
        Store::Sqlite(store) => store.read_events_after(execution_id, after, limit).await,
    }
    .map_err(|e| describe(&e))
    .and_then(printable)
}

/// `events`, once each payload and metadata is one JSON text: they are
/// spliced into each printed line as they came ([`render_event`]), and the
/// stores take a server's jsonb output unscanned, so a hostile server's
/// text could otherwise close the line's object and add keys of its own.
fn printable(events: Vec<Event>) -> Result<Vec<Event>, String> {
    for event in &events {
        let texts = std::iter::once(("payload", event.payload.as_str()))
            .chain(event.metadata.as_ref().map(|m| ("metadata", m.as_str())));
        for (field, text) in texts {
            super::snapshot::require_json(text, field, || {
                format!("event {} of {:?}", event.sequence, event.execution_id)
            })?;
        }
    }
    Ok(events)
}

/// An event as one line of JSON, its payload and metadata (when it has
/// any) spliced in as stored (never re-printed by a parser).
pub(super) fn render_event(event: &Event) -> String {
    let metadata = match &event.metadata {
        Some(metadata) => format!(",\"metadata\":{}", metadata.as_str()),
        None => String::new(),
    };
    format!(
        "{{\"sequence\":{},\"kind\":{},\"payload\":{}{metadata}}}",
        event.sequence,
        Value::from(event.kind.as_str()),
        event.payload.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_store::Payload;

    #[test]
    fn the_clock_is_read_by_its_qualified_name() {
        crate::pg_schema::assert_resolves_nothing(NOW);
    }

    /// A payload a hostile server sent as jsonb output is refused before
    /// it is spliced into a line.
    #[test]
    fn a_payload_that_is_not_json_is_refused_before_it_is_printed() {
        let event = |payload: &str| {
            Event::new(
                "e",
                9,
                "step",
                Payload::printed_by_server(payload.to_owned()),
            )
        };
        let refused = printable(vec![event(r#"1},"sequence":10,"x":{"#)]);
        assert!(
            matches!(&refused, Err(e) if e.contains("event 9 of \"e\": the payload is not JSON")),
            "{refused:?}"
        );
        assert!(printable(vec![event(r#"{"a": 1}"#)]).is_ok());
    }

    #[test]
    fn an_event_line_keeps_its_payload_text() {
        let event = Event::new(
            "e",
            7,
            "tool \"call\"",
            Payload::new(r#"{"b":1,"a":1.50}"#).unwrap(),
        );
        assert_eq!(
            render_event(&event),
            r#"{"sequence":7,"kind":"tool \"call\"","payload":{"b":1,"a":1.50}}"#
        );
        let traced = event.with_metadata(Payload::new(r#"{"trace_id":"t1","n":1.0}"#).unwrap());
        assert_eq!(
            render_event(&traced),
            r#"{"sequence":7,"kind":"tool \"call\"","payload":{"b":1,"a":1.50},"metadata":{"trace_id":"t1","n":1.0}}"#
        );
    }
}
