//! Which stored executions a store's ids name, so that two stores paired
//! for one job (events and snapshots, for [`crate::resume::resume`]) are
//! known to name the same ones.
//!
//! A tenant view stores `run-1` as `acme/run-1`; the store under it stores
//! ids as given. Paired with a snapshot store that is not acme's view,
//! `resume(&acme_events, &snapshots, "run-1")` would read the events of
//! `acme/run-1` and the snapshot of `run-1`, which may be another tenant's
//! state. Each store says its scope, and a pairing whose scopes differ is
//! refused ([`crate::Error::ScopeMismatch`]).

use std::fmt;

/// The prefix a store puts before every execution id on its way to the
/// stored log: `""` for a store that stores ids as given, `"acme/"` for
/// tenant acme's view, `"acme/eu/"` for a view of a view.
///
/// A store that wraps another and changes ids must report its own scope
/// within the inner one ([`crate::event_store::TenantScopedEventStore`]
/// and [`crate::snapshot_store::TenantScopedSnapshotStore`] do); one that
/// passes ids through reports the inner store's.
///
/// ```
/// use pgloom::event_store::{EventStore, MemoryEventStore, TenantId, TenantScopedEventStore};
/// use pgloom::id_scope::IdScope;
/// let acme = TenantScopedEventStore::new(MemoryEventStore::new(), TenantId::new("acme")?);
/// assert_eq!(acme.id_scope(), IdScope::Prefix("acme/".to_owned()));
/// assert_eq!(MemoryEventStore::new().id_scope(), IdScope::unscoped());
/// # Ok::<(), pgloom::event_store::InvalidTenantIdError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdScope {
    /// Every id is stored under this prefix.
    Prefix(String),
    /// A sharded store whose shards' scopes differ: it pairs with nothing.
    Mixed,
}

impl IdScope {
    /// The scope of a store that stores ids as given.
    #[must_use]
    pub fn unscoped() -> Self {
        IdScope::Prefix(String::new())
    }

    /// Whether stores of these two scopes name the same execution by the
    /// same id: both the same prefix (a mixed scope pairs with nothing).
    #[must_use]
    pub fn pairs_with(&self, other: &IdScope) -> bool {
        matches!((self, other), (IdScope::Prefix(a), IdScope::Prefix(b)) if a == b)
    }

    /// The one scope of several stores (a sharded store's shards), or
    /// [`IdScope::Mixed`] when they differ.
    pub(crate) fn common(scopes: impl IntoIterator<Item = IdScope>) -> IdScope {
        let mut scopes = scopes.into_iter();
        let Some(first) = scopes.next() else {
            return IdScope::unscoped();
        };
        if scopes.all(|s| s.pairs_with(&first)) {
            first
        } else {
            IdScope::Mixed
        }
    }
}

impl fmt::Display for IdScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdScope::Prefix(p) if p.is_empty() => f.write_str("ids as given"),
            IdScope::Prefix(p) => write!(f, "ids under {p:?}"),
            IdScope::Mixed => f.write_str("shards of different scopes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_equal_prefixes_pair() {
        let acme = IdScope::Prefix("acme/".into());
        assert!(acme.pairs_with(&acme.clone()));
        assert!(!acme.pairs_with(&IdScope::unscoped()));
        assert!(!acme.pairs_with(&IdScope::Prefix("acme/eu/".into())));
        assert!(!IdScope::Mixed.pairs_with(&IdScope::Mixed));
    }

    #[test]
    fn shards_of_one_scope_have_it_and_of_several_none() {
        let acme = IdScope::Prefix("acme/".into());
        assert_eq!(IdScope::common([acme.clone(), acme.clone()]), acme);
        assert_eq!(IdScope::common([acme, IdScope::unscoped()]), IdScope::Mixed);
    }
}
