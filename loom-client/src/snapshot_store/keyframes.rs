//! What a store writing deltas ([`Codec::Delta`](super::Codec::Delta))
//! decides from an execution's stored frames: which keyframe the next save
//! is written against, and in what order a delete may take rows so that no
//! delta is left without its keyframe. The memory and SQLite stores decide
//! here from their rows; loom's SQL decides the same in
//! `loom_save_snapshot` and `loom_delete_snapshots`, and the PostgreSQL
//! store asks the server ([`super::pg`]).

use std::collections::{HashMap, HashSet};

use pgloom_core::frame::delta::{self, KeyframePolicy, StoredKeyframe};
use pgloom_core::frame::{self, Codec, Format};

use crate::{Error, Result};

/// Where an execution's frames stand for a save at one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    /// The latest keyframe before the save.
    pub keyframe: Option<i64>,
    /// The deltas before the save that name it.
    pub deltas_since: u32,
    /// Whether a delta names the row the save replaces: it stays a keyframe.
    pub target_is_keyframe: bool,
}

/// Whether `frame` is a keyframe (`0x01` or `0x02`) a delta may name.
pub(crate) fn is_keyframe(frame: &[u8]) -> bool {
    matches!(
        frame.first().copied().and_then(Format::from_byte),
        Some(Format::Json | Format::Zstd)
    )
}

/// The plan for a save at `target`, from `rows`, each `(sequence, frame)`
/// of one execution in any order (a frame's first
/// [`delta::HEADER_BYTES`] are enough; a JSON row has none).
pub(crate) fn plan<'a>(rows: impl Iterator<Item = (i64, &'a [u8])> + Clone, target: i64) -> Plan {
    let keyframe = rows
        .clone()
        .filter(|(sequence, frame)| *sequence < target && is_keyframe(frame))
        .map(|(sequence, _)| sequence)
        .max();
    let mut plan = Plan {
        keyframe,
        ..Plan::default()
    };
    for (sequence, frame) in rows {
        match delta::base_sequence(frame) {
            Some(base) if base == target && sequence > target => plan.target_is_keyframe = true,
            Some(base) if Some(base) == keyframe && sequence < target => plan.deltas_since += 1,
            _ => {}
        }
    }
    plan
}

/// The frames of an ordered log a plan for a save at `target` reads: every
/// one after it (which may name it), and, for a delta (`back`), those
/// before it down to the first keyframe. Not the whole log: a save costs
/// what is near it.
pub(crate) fn near<'a, T>(
    log: &'a std::collections::BTreeMap<i64, T>,
    target: i64,
    back: bool,
    frame: impl Fn(&'a T) -> Option<&'a [u8]>,
) -> Vec<(i64, &'a [u8])> {
    let mut rows: Vec<(i64, &[u8])> = Vec::new();
    if let Some(after) = target.checked_add(1) {
        rows.extend(
            log.range(after..)
                .filter_map(|(s, row)| Some((*s, frame(row)?))),
        );
    }
    if !back {
        return rows;
    }
    for (sequence, row) in log.range(..target).rev() {
        let Some(stored) = frame(row) else { continue };
        rows.push((*sequence, stored));
        if is_keyframe(stored) {
            break;
        }
    }
    rows
}

/// The frame a delta store writes for `state` at `plan`'s save, given the
/// frame of `plan.keyframe`: a delta when the policy keeps one, else a
/// keyframe. One that stays a keyframe is one.
///
/// # Errors
///
/// [`Error::Encode`] ([`pgloom_core::frame::EncodeFrameError::Keyframe`])
/// when the keyframe does not decode; what encoding fails with.
pub(crate) fn encode(
    policy: &KeyframePolicy,
    state: &str,
    plan: Plan,
    keyframe: Option<&[u8]>,
) -> Result<Vec<u8>> {
    if plan.target_is_keyframe {
        return Ok(frame::encode(state, Codec::Zstd)?);
    }
    let keyframe = plan
        .keyframe
        .zip(keyframe)
        .map(|(sequence, frame)| StoredKeyframe {
            sequence,
            frame,
            deltas_since: plan.deltas_since,
        });
    Ok(policy.encode_against(state, keyframe)?)
}

/// Refuses to replace a keyframe that deltas name with another frame: the
/// deltas would no longer decode. The same frame (the same state saved
/// again) is allowed, as `loom_store_snapshot` allows it.
///
/// # Errors
///
/// [`Error::KeyframeInUse`].
pub(crate) fn check_replace(
    execution_id: &str,
    sequence: i64,
    plan: Plan,
    stored: Option<&[u8]>,
    frame: Option<&[u8]>,
) -> Result<()> {
    if plan.target_is_keyframe && stored != frame {
        return Err(Error::KeyframeInUse {
            execution_id: execution_id.to_owned(),
            sequence,
        });
    }
    Ok(())
}

/// The sequences of one execution in the order a bounded delete takes
/// them: oldest first, but each keyframe after the last delta that names
/// it, so that no batch leaves a delta without its keyframe. `rows` are
/// `(sequence, the keyframe it names if it is a delta)`.
pub(crate) fn deletion_order(rows: &[(i64, Option<i64>)]) -> Vec<i64> {
    // Deltas of keyframes only: one naming a delta (made by hand) is
    // undecodable already, and holds nothing back.
    let deltas: HashSet<i64> = rows
        .iter()
        .filter(|(_, base)| base.is_some())
        .map(|(sequence, _)| *sequence)
        .collect();
    let mut last_delta: HashMap<i64, i64> = HashMap::new();
    for (delta, base) in rows {
        if let Some(base) = base.filter(|base| !deltas.contains(base)) {
            let last = last_delta.entry(base).or_insert(*delta);
            *last = (*last).max(*delta);
        }
    }
    let mut order: Vec<(i64, i64)> = rows
        .iter()
        .map(|(sequence, _)| {
            let at = last_delta
                .get(sequence)
                .map_or(*sequence, |last| (*last).max(*sequence));
            (at, *sequence)
        })
        .collect();
    // At the same place, the delta (the later sequence) goes first.
    order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    order.into_iter().map(|(_, sequence)| sequence).collect()
}

#[cfg(all(test, feature = "zstd"))]
mod tests {
    use super::*;

    fn frames(states: &[(i64, &str)]) -> Vec<(i64, Vec<u8>)> {
        let policy = KeyframePolicy::default();
        let mut rows: Vec<(i64, Vec<u8>)> = Vec::new();
        for (sequence, state) in states {
            let plan = plan(rows.iter().map(|(s, f)| (*s, f.as_slice())), *sequence);
            let keyframe = plan
                .keyframe
                .and_then(|k| rows.iter().find(|(s, _)| *s == k))
                .map(|(_, f)| f.as_slice());
            rows.push((*sequence, encode(&policy, state, plan, keyframe).unwrap()));
        }
        rows
    }

    #[test]
    fn a_run_is_a_keyframe_then_deltas_against_it() {
        let turn = |n: usize| loom_fixtures::agent_state(n, false);
        let states: Vec<String> = (20..=24).map(turn).collect();
        let rows = frames(&[
            (1, &states[0]),
            (2, &states[1]),
            (3, &states[2]),
            (4, &states[3]),
        ]);
        assert!(is_keyframe(&rows[0].1));
        for (_, frame) in &rows[1..] {
            assert_eq!(delta::base_sequence(frame), Some(1));
        }
        let at_5 = plan(rows.iter().map(|(s, f)| (*s, f.as_slice())), 5);
        assert_eq!(
            at_5,
            Plan {
                keyframe: Some(1),
                deltas_since: 3,
                target_is_keyframe: false
            }
        );
        // Saving over the keyframe: it stays one, and only the same frame may.
        let at_1 = plan(rows.iter().map(|(s, f)| (*s, f.as_slice())), 1);
        assert!(at_1.target_is_keyframe);
        let again = encode(&KeyframePolicy::default(), &states[0], at_1, None).unwrap();
        assert_eq!(again, rows[0].1);
        assert!(check_replace("e", 1, at_1, Some(&rows[0].1), Some(&again)).is_ok());
        let other = encode(&KeyframePolicy::default(), &states[4], at_1, None).unwrap();
        assert!(matches!(
            check_replace("e", 1, at_1, Some(&rows[0].1), Some(&other)),
            Err(Error::KeyframeInUse { sequence: 1, .. })
        ));
    }

    #[test]
    fn a_delete_takes_each_keyframe_after_its_last_delta() {
        // 1 keyframe of 2 and 4; 3 a keyframe alone; 5 a keyframe of 6.
        let rows = [
            (1, None),
            (2, Some(1)),
            (3, None),
            (4, Some(1)),
            (5, None),
            (6, Some(5)),
        ];
        assert_eq!(deletion_order(&rows), vec![2, 3, 4, 1, 6, 5]);
        // A delta of a delta (8 names 6) holds nothing back.
        let chained = [(5, None), (6, Some(5)), (8, Some(6))];
        assert_eq!(deletion_order(&chained), vec![6, 5, 8]);
    }
}
