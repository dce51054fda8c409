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

use std::collections::HashMap;
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

/// Keyframes by execution, at most `budget` bytes of text, the least
/// recently used dropped first.
#[derive(Debug)]
pub(crate) struct KeyframeCache {
    budget: usize,
    used: usize,
    clock: u64,
    entries: HashMap<String, (u64, CachedKeyframe)>,
}

impl KeyframeCache {
    pub(crate) fn new(budget: usize) -> Self {
        KeyframeCache {
            budget,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
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
        *used = clock;
        Some(keyframe.clone())
    }

    /// Keeps `keyframe` for `execution_id`, replacing what was kept.
    pub(crate) fn put(&mut self, execution_id: &str, keyframe: CachedKeyframe) {
        self.remove(execution_id);
        let bytes = keyframe.text.len();
        if bytes > self.budget {
            return;
        }
        while self.used + bytes > self.budget {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => self.remove(&id),
                None => break,
            }
        }
        self.clock += 1;
        self.used += bytes;
        self.entries
            .insert(execution_id.to_owned(), (self.clock, keyframe));
    }

    /// Forgets the keyframe of `execution_id`.
    pub(crate) fn remove(&mut self, execution_id: &str) {
        if let Some((_, keyframe)) = self.entries.remove(execution_id) {
            self.used -= keyframe.text.len();
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
        let mut cache = KeyframeCache::new(100);
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
    }

    #[test]
    fn the_least_recently_used_goes_first_and_the_budget_holds() {
        let mut cache = KeyframeCache::new(10);
        cache.put("a", keyframe(1, "[1,2]"));
        cache.put("b", keyframe(1, "[3,4]"));
        assert!(cache.get("a", 2).is_some());
        cache.put("c", keyframe(1, "[5]"));
        assert!(cache.get("b", 2).is_none(), "b was used least recently");
        assert!(cache.get("a", 2).is_some() && cache.get("c", 2).is_some());
        assert!(cache.used <= 10);
        // Larger than the whole budget: not kept, nothing else dropped.
        cache.put("d", keyframe(1, "[1,2,3,4,5,6,7,8]"));
        assert!(cache.get("d", 2).is_none() && cache.get("a", 2).is_some());
        cache.remove("a");
        cache.remove("c");
        assert_eq!(cache.used, 0);
    }
}
