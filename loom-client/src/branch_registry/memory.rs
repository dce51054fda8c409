//! A branch registry in memory (ADR 0108's addendum, review round 1, P3).
//!
//! It keeps its names sorted across calls, so a page is a binary search
//! plus the page. A new name is binary-inserted; a deleted one becomes a
//! tombstone, skipped while paging and swept out once tombstones are half
//! the array. Invalidating the cache on every delete instead made
//! `prune_branch_refs`, which deletes one ref at a time while it pages,
//! re-sort on every page: 179 s for 100k refs.

use std::collections::HashMap;
use std::sync::RwLock;

use super::{BranchRef, BranchRegistry};
use crate::event_store::{check_limit, Page};
use crate::Result;

#[derive(Debug, Default)]
struct Names {
    /// Every name ever put and not yet swept, in code point order.
    sorted: Vec<String>,
    /// Parallel to `sorted`: false for a tombstone.
    live: Vec<bool>,
    tombstones: usize,
}

impl Names {
    fn position(&self, name: &str) -> Result<usize, usize> {
        self.sorted
            .binary_search_by(|n| pgloom_core::compare_execution_ids(n, name))
    }

    fn insert(&mut self, name: &str) {
        match self.position(name) {
            Ok(i) if self.live[i] => {}
            Ok(i) => {
                self.live[i] = true;
                self.tombstones -= 1;
            }
            Err(i) => {
                self.sorted.insert(i, name.to_owned());
                self.live.insert(i, true);
            }
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(i) = self.position(name) {
            if self.live[i] {
                self.live[i] = false;
                self.tombstones += 1;
                if self.tombstones * 2 >= self.sorted.len() {
                    self.compact();
                }
            }
        }
    }

    fn compact(&mut self) {
        let mut live = self.live.iter();
        self.sorted
            .retain(|_| *live.next().expect("parallel vectors"));
        self.live = vec![true; self.sorted.len()];
        self.tombstones = 0;
    }

    fn page(&self, after: Option<&str>, limit: usize) -> Vec<String> {
        let start = match after {
            Some(cursor) => self
                .sorted
                .partition_point(|n| pgloom_core::compare_execution_ids(n, cursor).is_le()),
            None => 0,
        };
        self.sorted[start..]
            .iter()
            .zip(&self.live[start..])
            .filter(|(_, live)| **live)
            .take(limit)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[derive(Debug, Default)]
struct Inner {
    refs: HashMap<String, (String, i64)>,
    names: Names,
}

/// An in-memory [`BranchRegistry`].
#[derive(Debug, Default)]
pub struct MemoryBranchRegistry {
    inner: RwLock<Inner>,
}

impl MemoryBranchRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many tombstones the sorted name cache holds now (for tests and
    /// benchmarks of its upkeep).
    #[must_use]
    pub fn tombstones(&self) -> usize {
        self.inner.read().expect("never poisoned").names.tombstones
    }
}

impl BranchRegistry for MemoryBranchRegistry {
    async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        let mut inner = self.inner.write().expect("never poisoned");
        if inner
            .refs
            .insert(name.to_owned(), (execution_id.to_owned(), sequence))
            .is_none()
        {
            inner.names.insert(name);
        }
        Ok(())
    }

    async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        let inner = self.inner.read().expect("never poisoned");
        Ok(inner
            .refs
            .get(name)
            .map(|(execution_id, sequence)| BranchRef {
                name: name.to_owned(),
                execution_id: execution_id.clone(),
                sequence: *sequence,
            }))
    }

    async fn delete_ref(&self, name: &str) -> Result<bool> {
        let mut inner = self.inner.write().expect("never poisoned");
        let existed = inner.refs.remove(name).is_some();
        if existed {
            inner.names.remove(name);
        }
        Ok(existed)
    }

    async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        let mut inner = self.inner.write().expect("never poisoned");
        let Some(target) = inner.refs.remove(name) else {
            return Ok(false);
        };
        inner.names.remove(name);
        if inner.refs.insert(onto.to_owned(), target).is_none() {
            inner.names.insert(onto);
        }
        Ok(true)
    }

    async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let inner = self.inner.read().expect("never poisoned");
        Ok(Page::from_ids(inner.names.page(after, limit), limit))
    }
}
