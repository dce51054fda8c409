//! The keyframes a PostgreSQL delta store holds, one per execution, so
//! that a save after every turn sends one statement, as a zstd save does,
//! instead of fetching and inflating the keyframe first.
//!
//! A cached keyframe is a hint, never trusted for correctness: each delta
//! names its keyframe by the SHA-256 of the keyframe's frame, and
//! `loom_store_snapshot` refuses it (`40001`) unless the stored keyframe is
//! still that frame, holding it `FOR SHARE` until the save commits. A
//! store that lost a race (a peer saved over or deleted the keyframe)
//! fetches the keyframe again and encodes once more.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the store knows of an execution's current keyframe.
#[derive(Debug, Clone)]
pub(crate) struct CachedKeyframe {
    /// The keyframe's sequence.
    pub sequence: i64,
    /// Its JSON text, as it decodes.
    pub text: Arc<str>,
    /// Its frame's stored length.
    pub frame_bytes: usize,
    /// SHA-256 of its frame: what a delta against it is stored under.
    pub digest: [u8; 32],
    /// The deltas saved against it that the store knows of.
    pub deltas_since: u32,
    /// The last sequence saved through it: a save at or before it (a
    /// replay, a save over) asks the server again.
    pub last_saved: i64,
}

/// What an entry costs besides its text and its execution id: the
/// struct, the map's slots and the order's node, rounded up.
const ENTRY_OVERHEAD: usize = 160;

/// Keyframes by execution, at most `budget` bytes (text, id and
/// [`ENTRY_OVERHEAD`] each), the least recently used dropped first.
#[derive(Debug)]
pub(crate) struct KeyframeCache {
    budget: usize,
    used: usize,
    clock: u64,
    entries: HashMap<String, (u64, CachedKeyframe)>,
    /// Each entry by when it was last used: the oldest first.
    by_use: BTreeMap<u64, String>,
}

fn cost(execution_id: &str, keyframe: &CachedKeyframe) -> usize {
    keyframe.text.len() + execution_id.len() + ENTRY_OVERHEAD
}

impl KeyframeCache {
    pub(crate) fn new(budget: usize) -> Self {
        KeyframeCache {
            budget,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    /// The keyframe of `execution_id` a save at `sequence` may use.
    pub(crate) fn get(&mut self, execution_id: &str, sequence: i64) -> Option<CachedKeyframe> {
        self.clock += 1;
        let clock = self.clock;
        let (used, keyframe) = self.entries.get_mut(execution_id)?;
        if keyframe.last_saved >= sequence {
            return None;
        }
        let id = self
            .by_use
            .remove(used)
            .expect("every entry is in the order");
        self.by_use.insert(clock, id);
        *used = clock;
        Some(keyframe.clone())
    }

    /// Keeps `keyframe` for `execution_id`, replacing what was kept.
    pub(crate) fn put(&mut self, execution_id: &str, keyframe: CachedKeyframe) {
        self.remove(execution_id);
        let bytes = cost(execution_id, &keyframe);
        if bytes > self.budget {
            return;
        }
        while self.used + bytes > self.budget {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((_, dropped)) = self.entries.remove(&oldest) {
                self.used -= cost(&oldest, &dropped);
            }
        }
        self.clock += 1;
        self.used += bytes;
        self.by_use.insert(self.clock, execution_id.to_owned());
        self.entries
            .insert(execution_id.to_owned(), (self.clock, keyframe));
    }

    /// [`Self::put`], unless what is kept was saved through later (a save
    /// further back, a replay, leaves the later keyframe in place).
    pub(crate) fn put_unless_later(&mut self, execution_id: &str, keyframe: CachedKeyframe) {
        let later = self
            .entries
            .get(execution_id)
            .is_some_and(|(_, kept)| kept.last_saved > keyframe.last_saved);
        if !later {
            self.put(execution_id, keyframe);
        }
    }

    /// Forgets the keyframe of `execution_id`.
    pub(crate) fn remove(&mut self, execution_id: &str) {
        if let Some((used, keyframe)) = self.entries.remove(execution_id) {
            self.by_use.remove(&used);
            self.used -= cost(execution_id, &keyframe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyframe(sequence: i64, text: &str) -> CachedKeyframe {
        CachedKeyframe {
            sequence,
            text: Arc::from(text),
            frame_bytes: text.len() + 1,
            digest: [0; 32],
            deltas_since: 0,
            last_saved: sequence,
        }
    }

    #[test]
    fn a_save_after_the_last_uses_it_and_one_at_or_before_asks_again() {
        let mut cache = KeyframeCache::new(1000);
        cache.put("e", keyframe(5, "[1]"));
        assert!(cache.get("e", 6).is_some());
        assert!(cache.get("e", 5).is_none());
        cache.put(
            "e",
            CachedKeyframe {
                deltas_since: 1,
                last_saved: 9,
                ..keyframe(5, "[1]")
            },
        );
        assert!(cache.get("e", 9).is_none());
        let kept = cache.get("e", 10).unwrap();
        assert_eq!((kept.sequence, kept.deltas_since), (5, 1));
        assert!(cache.get("other", 10).is_none());
        // A save further back leaves the later keyframe kept.
        cache.put_unless_later("e", keyframe(2, "[2]"));
        assert_eq!(cache.get("e", 10).unwrap().sequence, 5);
        cache.put_unless_later("e", keyframe(12, "[3]"));
        assert_eq!(cache.get("e", 13).unwrap().sequence, 12);
    }

    #[test]
    fn the_least_recently_used_goes_first_and_the_budget_holds() {
        let two = 2 * (ENTRY_OVERHEAD + 6);
        let mut cache = KeyframeCache::new(two);
        cache.put("a", keyframe(1, "[1,2]"));
        cache.put("b", keyframe(1, "[3,4]"));
        assert!(cache.get("a", 2).is_some());
        cache.put("c", keyframe(1, "[5]"));
        assert!(cache.get("b", 2).is_none(), "b was used least recently");
        assert!(cache.get("a", 2).is_some() && cache.get("c", 2).is_some());
        assert!(cache.used <= two);
        // Larger than the whole budget: not kept, nothing else dropped.
        cache.put("d", keyframe(1, &"1".repeat(two)));
        assert!(cache.get("d", 2).is_none() && cache.get("a", 2).is_some());
        cache.remove("a");
        cache.remove("c");
        assert_eq!((cache.used, cache.by_use.len()), (0, 0));
    }

    /// A million executions of tiny states under a 1 MiB budget: ids and
    /// overhead count, so it keeps thousands, not millions (and each put
    /// drops the oldest by the order, not by a scan of every entry).
    #[test]
    fn tiny_states_of_many_executions_stay_within_the_budget() {
        let mut cache = KeyframeCache::new(1 << 20);
        for n in 0..1_000_000 {
            cache.put(&format!("{n:0>100}"), keyframe(1, "1"));
        }
        assert!(cache.used <= 1 << 20);
        assert!(cache.entries.len() < 5_000, "{} kept", cache.entries.len());
        assert_eq!(cache.entries.len(), cache.by_use.len());
    }
}
