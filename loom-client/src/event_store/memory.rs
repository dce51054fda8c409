//! An event store in memory.
//!
//! Executions are kept in a `BTreeMap` keyed by id: `String`'s `Ord` is
//! byte order, which is loom's code point order, so the map is the sorted
//! id index itself, kept across pages. A page is a seek (O(log n)) plus
//! the page's own ids, never a re-sort.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::RwLock;

use super::{check_limit, check_payloads, Event, EventStore, Page};
use crate::{Error, Result};

/// An in-memory [`EventStore`], for tests and single-process tools.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore};
/// let store = MemoryEventStore::new();
/// store.append(&[Event::new("exec-1", 1, "started", serde_json::json!({}))]).await?;
/// assert_eq!(store.list_executions_page(None, 10).await?.ids, ["exec-1"]);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryEventStore {
    logs: RwLock<BTreeMap<String, BTreeMap<i64, Event>>>,
}

impl MemoryEventStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl EventStore for MemoryEventStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        check_payloads(events)?;
        let mut logs = self.logs.write().expect("the store lock is never poisoned");
        // All or none: check every event before writing any.
        let mut batch = std::collections::HashSet::with_capacity(events.len());
        for event in events {
            let taken = logs
                .get(&event.execution_id)
                .is_some_and(|log| log.contains_key(&event.sequence))
                || !batch.insert((event.execution_id.as_str(), event.sequence));
            if taken {
                return Err(Error::DuplicateEvent {
                    execution_id: event.execution_id.clone(),
                    sequence: event.sequence,
                });
            }
        }
        let now = std::time::SystemTime::now();
        for event in events {
            logs.entry(event.execution_id.clone()).or_default().insert(
                event.sequence,
                Event {
                    metadata: event.stored_metadata().cloned(),
                    ..event.clone()
                }
                .with_created_at(now),
            );
        }
        Ok(())
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        let logs = self.logs.read().expect("the store lock is never poisoned");
        Ok(logs
            .get(execution_id)
            .map(|log| log.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        check_limit(limit)?;
        let logs = self.logs.read().expect("the store lock is never poisoned");
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(logs
            .get(execution_id)
            .map(|log| {
                log.range((start, Bound::Unbounded))
                    .take(limit)
                    .map(|(_, e)| e.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        check_limit(limit)?;
        let mut logs = self.logs.write().expect("the store lock is never poisoned");
        let Some(log) = logs.get_mut(execution_id) else {
            return Ok(0);
        };
        let end = through.map_or(Bound::Unbounded, Bound::Included);
        let doomed: Vec<i64> = log
            .range((Bound::Unbounded, end))
            .take(limit)
            .map(|(sequence, _)| *sequence)
            .collect();
        for sequence in &doomed {
            log.remove(sequence);
        }
        // An execution with no events left is no longer listed.
        if log.is_empty() {
            logs.remove(execution_id);
        }
        Ok(doomed.len() as u64)
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let logs = self.logs.read().expect("the store lock is never poisoned");
        let start = match after {
            Some(cursor) => Bound::Excluded(cursor),
            None => Bound::Unbounded,
        };
        let ids = logs
            .range::<str, _>((start, Bound::Unbounded))
            .take(limit)
            .map(|(id, _)| id.clone())
            .collect();
        Ok(Page::from_ids(ids, limit))
    }
}
