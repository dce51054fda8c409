//! The snapshot-store kit: states kept exactly (or as JSONB keeps them),
//! the latest and by sequence, and the markers a wrapper may not hide.

use super::{expect_eq, fail, store_error, ConformanceFailure};
use crate::Error;

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

pub(super) fn new_snapshot(
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
    for (i, (name, text)) in adversarial_states().into_iter().enumerate() {
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
    if codec == crate::snapshot_store::Codec::Delta {
        check_deltas(store).await?;
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

/// The state of a run after `turns` turns: each turn adds a line, so that
/// a delta store writes deltas against its keyframes.
fn run_state(turns: i64) -> String {
    let lines: Vec<String> = (1..=turns)
        .map(|t| {
            format!(
                r#"{{"turn":{t},"tool":"search","said":"read page {t} of the report, {} matches, next {}"}}"#,
                t * 7 % 13,
                t * 31 % 97
            )
        })
        .collect();
    format!(r#"{{"run":"kit","turns":[{}]}}"#, lines.join(","))
}

/// What a delta store must keep: every save of a run back exactly, a
/// keyframe that deltas name never replaced by another state (refused with
/// [`Error::KeyframeInUse`], or replaced with every delta still exact), and
/// no delete batch that leaves a delta without its keyframe.
async fn check_deltas<S: crate::snapshot_store::SnapshotStore>(
    store: &S,
) -> Result<(), ConformanceFailure> {
    const TURNS: i64 = 40;
    for turn in 1..=TURNS {
        store
            .save(&new_snapshot("kit-run", turn, &run_state(turn)))
            .await
            .map_err(store_error("save a run"))?;
    }
    let every_save_exact = |from: i64| async move {
        for turn in from..=TURNS {
            let loaded = store
                .load_at("kit-run", turn)
                .await
                .map_err(store_error("load a run"))?;
            match loaded {
                Some(s) if s.state.as_str() == run_state(turn) => {}
                Some(_) => return Err(fail("a run's saves", format!("turn {turn} changed"))),
                None => return Err(fail("a run's saves", format!("turn {turn} missing"))),
            }
        }
        Ok(())
    };
    every_save_exact(1).await?;
    // Turn 1 is a keyframe, and the turns after it deltas against it.
    match store
        .save(&new_snapshot("kit-run", 1, r#"{"run":"replaced"}"#))
        .await
    {
        Err(Error::KeyframeInUse { sequence: 1, .. }) => every_save_exact(1).await?,
        Err(e) => return Err(fail("a save over a keyframe", e.to_string())),
        Ok(_) => every_save_exact(2).await?,
    }
    // The same state again is always taken.
    store
        .save(&new_snapshot("kit-run", 2, &run_state(2)))
        .await
        .map_err(store_error("the same state again"))?;
    every_save_exact(2).await?;
    let mut left = TURNS;
    while left > 0 {
        let deleted = store
            .delete_snapshots("kit-run", 3)
            .await
            .map_err(store_error("delete a run"))?;
        if deleted == 0 {
            return Err(fail("deleting a run", format!("{left} saves left")));
        }
        left -= i64::try_from(deleted).unwrap_or(i64::MAX);
        // What is left still decodes, each to its own state.
        for turn in 1..=TURNS {
            if let Some(s) = store
                .load_at("kit-run", turn)
                .await
                .map_err(store_error("load after a delete"))?
            {
                if turn > 1 && s.state.as_str() != run_state(turn) {
                    return Err(fail("a run's saves", format!("turn {turn} changed")));
                }
            }
        }
    }
    Ok(())
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

/// States whose exact text a parse-and-reserialize round trip would lose
/// (ADR 0141's test list): key order, duplicate keys, `__proto__`, escaped
/// lone surrogates, `\u0000`, 2,000-deep nesting, 2,000 steps. Each with a
/// name, for messages. [`check_snapshot_store`] saves and loads each;
/// a store's own tests may use them too.
///
/// ```
/// let states = pgloom::conformance::adversarial_states();
/// assert!(states.iter().any(|(name, _)| *name == "duplicate keys"));
/// ```
#[must_use]
pub fn adversarial_states() -> Vec<(&'static str, String)> {
    let deep = 2000;
    let steps: Vec<String> = (0..2000)
        .map(|i| format!(r#"{{"step":{i},"ok":true}}"#))
        .collect();
    vec![
        (
            "key order",
            r#"{"z":1,"a":2,"m":{"y":[],"b":{}}}"#.to_owned(),
        ),
        ("duplicate keys", r#"{"a":1,"a":2}"#.to_owned()),
        (
            "__proto__",
            r#"{"__proto__":{"polluted":true},"constructor":1}"#.to_owned(),
        ),
        (
            "lone surrogates",
            r#"["\ud800","\udfff","x\ud834y"]"#.to_owned(),
        ),
        (
            "NUL escape",
            r#"{"nul":"\u0000","ctl":"\u001f"}"#.to_owned(),
        ),
        (
            "escaped and raw unicode",
            "[\"\\u00e9\",\"\u{e9}\",\"e\u{301}\",\"\u{1D11E}\"]".to_owned(),
        ),
        ("whitespace", " {\n\t\"a\" : [ 1 ,2 ] }\r\n".to_owned()),
        ("number spellings", "[1.0,1e2,1E+2,-0,0.000001]".to_owned()),
        (
            "2,000-deep nesting",
            format!("{}1{}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (
            "2,000 steps",
            format!("{{\"steps\":[{}]}}", steps.join(",")),
        ),
        ("scalar", "\"just a string\"".to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use pgloom_core::frame::{decode, decode_into, encode, Codec};

    /// What the kit asks of a store, asked of the frame codec every store
    /// writes through: each state back byte for byte, in each codec.
    #[test]
    fn every_adversarial_state_frames_and_unframes_byte_for_byte() {
        let codecs: &[Codec] = if cfg!(feature = "zstd") {
            &[Codec::None, Codec::Zstd]
        } else {
            &[Codec::None]
        };
        for (name, state) in super::adversarial_states() {
            for &codec in codecs {
                let frame = encode(&state, codec).unwrap();
                assert!(frame.len() <= state.len() + 1, "{name} {codec}");
                assert_eq!(decode(&frame).unwrap(), state, "{name} {codec}");
                let text = decode_into(&frame, |len| vec![0u8; len]).unwrap();
                assert_eq!(text, state.as_bytes(), "{name} {codec}");
            }
        }
    }
}
