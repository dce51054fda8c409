//! One tenant's view of a shared event store.
//!
//! Ids are stored as `"{tenant}/{id}"`. A tenant's ids are then one
//! contiguous range in code point order (a tenant id holds no '/'), so the
//! view seeks to the range's start, stops at its end, and never reads
//! another tenant's ids. It hands out and takes cursors WITHOUT the prefix:
//! a view that leaked its inner, prefixed cursor made
//! Sharded(TenantScoped(...)) loop forever (ADR 0108, Context).

use std::fmt;

use super::{check_limit, Event, EventStore, Page};
use crate::id_scope::IdScope;
use crate::{Error, Result};

/// Separates the tenant from the id in the inner store.
const SEPARATOR: char = '/';

/// A tenant id: non-empty, without '/'.
///
/// ```
/// use pgloom::event_store::TenantId;
/// assert!(TenantId::new("acme").is_ok());
/// assert!(TenantId::new("acme/eu").is_err());
/// assert!(TenantId::new("").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantId(String);

/// A tenant id, or an execution id under one, that cannot be scoped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct InvalidTenantIdError {
    what: &'static str,
    value: String,
    reason: &'static str,
}

impl TenantId {
    /// Validates a tenant id.
    ///
    /// # Errors
    ///
    /// [`InvalidTenantIdError`] when it is empty or holds a '/'.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidTenantIdError> {
        let id = id.into();
        let reason = if id.is_empty() {
            "it is empty"
        } else if id.contains(SEPARATOR) {
            "it holds '/', which separates the tenant from the id"
        } else {
            return Ok(TenantId(id));
        };
        Err(InvalidTenantIdError {
            what: "tenant id",
            value: id,
            reason,
        })
    }

    /// The id.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant's [`EventStore`] over a shared one.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore, TenantId, TenantScopedEventStore};
/// let shared = std::sync::Arc::new(MemoryEventStore::new());
/// let acme = TenantScopedEventStore::new(shared.clone(), TenantId::new("acme")?);
/// let initech = TenantScopedEventStore::new(shared.clone(), TenantId::new("initech")?);
/// acme.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]).await?;
/// initech.append(&[Event::new("run-9", 1, "started", serde_json::json!({}))]).await?;
/// assert_eq!(acme.list_executions_page(None, 10).await?.ids, ["run-1"]);
/// assert_eq!(shared.list_executions_page(None, 10).await?.ids, ["acme/run-1", "initech/run-9"]);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TenantScopedEventStore<S> {
    inner: S,
    scope: TenantPrefix,
}

/// A tenant and the prefix its ids are stored under: what the tenant views
/// of events and of snapshots share, so that they scope ids alike.
#[derive(Debug, Clone)]
pub(crate) struct TenantPrefix {
    tenant: TenantId,
    prefix: String,
}

impl TenantPrefix {
    pub(crate) fn new(tenant: TenantId) -> Self {
        let prefix = format!("{tenant}{SEPARATOR}");
        TenantPrefix { tenant, prefix }
    }

    pub(crate) fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// The prefix, "{tenant}/".
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `execution_id` as the inner store holds it.
    pub(crate) fn scoped(&self, execution_id: &str) -> Result<String> {
        if execution_id.is_empty() {
            // The range starts strictly after the bare prefix.
            return Err(InvalidTenantIdError {
                what: "execution id",
                value: String::new(),
                reason: "a tenant's execution ids are not empty",
            }
            .into());
        }
        Ok(format!("{}{execution_id}", self.prefix))
    }

    /// An id the inner store returned for a scoped one, as the tenant
    /// named it (a store reads back the id it was asked for, so it starts
    /// with the prefix).
    pub(crate) fn unscope(&self, execution_id: &mut String) {
        if execution_id.starts_with(&self.prefix) {
            execution_id.drain(..self.prefix.len());
        }
    }

    /// The scope of a view over a store of scope `inner`.
    pub(crate) fn within(&self, inner: IdScope) -> IdScope {
        match inner {
            IdScope::Prefix(outer) => IdScope::Prefix(outer + &self.prefix),
            IdScope::Mixed => IdScope::Mixed,
        }
    }
}

impl<S: EventStore> TenantScopedEventStore<S> {
    /// `tenant`'s view of `inner`.
    pub fn new(inner: S, tenant: TenantId) -> Self {
        TenantScopedEventStore {
            inner,
            scope: TenantPrefix::new(tenant),
        }
    }

    /// The tenant.
    #[must_use]
    pub fn tenant(&self) -> &TenantId {
        self.scope.tenant()
    }

    fn scoped(&self, execution_id: &str) -> Result<String> {
        self.scope.scoped(execution_id)
    }
}

impl<S: EventStore> EventStore for TenantScopedEventStore<S> {
    fn id_scope(&self) -> IdScope {
        self.scope.within(self.inner.id_scope())
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        // Before scoping, so the error names the tenant's own id.
        super::check_payloads(events)?;
        let scoped = events
            .iter()
            .map(|e| {
                Ok(Event {
                    execution_id: self.scoped(&e.execution_id)?,
                    ..e.clone()
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // A duplicate names the tenant's own id, as every other error of
        // the view does.
        self.inner.append(&scoped).await.map_err(|e| match e {
            Error::DuplicateEvent {
                mut execution_id,
                sequence,
            } => {
                self.scope.unscope(&mut execution_id);
                Error::DuplicateEvent {
                    execution_id,
                    sequence,
                }
            }
            e => e,
        })
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        let scoped = self.scoped(execution_id)?;
        let mut events = self.inner.read_events(&scoped).await?;
        for event in &mut events {
            self.scope.unscope(&mut event.execution_id);
        }
        Ok(events)
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let scoped = self.scoped(execution_id)?;
        let mut events = self.inner.read_events_after(&scoped, after, limit).await?;
        for event in &mut events {
            self.scope.unscope(&mut event.execution_id);
        }
        Ok(events)
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        let scoped = self.scoped(execution_id)?;
        self.inner.delete_events(&scoped, through, limit).await
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        // Seek: strictly after the prefix, or after prefix + cursor.
        let inner_after = format!("{}{}", self.scope.prefix(), after.unwrap_or(""));
        let page = self
            .inner
            .list_executions_page(Some(&inner_after), limit)
            .await?;
        let inner_full = page.next_cursor.is_some();
        let mut ids = Vec::with_capacity(page.ids.len());
        let mut left_range = false;
        for id in page.ids {
            match id.strip_prefix(self.scope.prefix()) {
                Some(own) => ids.push(own.to_owned()),
                None => {
                    // Past the range's end: nothing after it is ours.
                    left_range = true;
                    break;
                }
            }
        }
        let next_cursor = if inner_full && !left_range {
            ids.last().cloned()
        } else {
            None
        };
        Ok(Page { ids, next_cursor })
    }
}
