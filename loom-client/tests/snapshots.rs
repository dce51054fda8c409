//! The snapshot conformance kit on memory and SQLite, in both codecs, and
//! what each must refuse. (Postgres: `tests/store/snapshot_stores.rs`.)

mod common;

use common::{block_on, snapshot};
use pgloom::conformance::{check_snapshot_store, Fidelity};
use pgloom::snapshot_store::{
    codec_from_name, Codec, MemorySnapshotStore, SnapshotStore, SqliteSnapshotStore,
};
use pgloom::Error;
use pgloom_core::frame::DecodeFrameError;

#[test]
fn memory_and_sqlite_conform_in_every_codec() {
    block_on(async {
        for codec in [Codec::None, Codec::Zstd, Codec::Delta] {
            check_snapshot_store(
                &MemorySnapshotStore::new(codec).unwrap(),
                codec,
                Fidelity::Exact,
            )
            .await
            .unwrap_or_else(|f| panic!("memory {codec}: {f}"));
            check_snapshot_store(
                &SqliteSnapshotStore::open_in_memory(codec).unwrap(),
                codec,
                Fidelity::Exact,
            )
            .await
            .unwrap_or_else(|f| panic!("sqlite {codec}: {f}"));
        }
    });
}

#[test]
fn sqlite_reads_both_formats_whatever_it_writes() {
    block_on(async {
        let plain = SqliteSnapshotStore::open_in_memory(Codec::None).unwrap();
        let zstd = plain.with_codec(Codec::Zstd);
        let big = format!(r#"{{"log":"{}"}}"#, "agent tool result ".repeat(100));
        plain.save(&snapshot("e", 1, &big)).await.unwrap();
        zstd.save(&snapshot("e", 2, &big)).await.unwrap();
        for store in [&plain, &zstd] {
            assert_eq!(
                store.load_at("e", 1).await.unwrap().unwrap().state.as_str(),
                big
            );
            assert_eq!(
                store.load_at("e", 2).await.unwrap().unwrap().state.as_str(),
                big
            );
        }
        // A re-save flips a row's format.
        plain
            .save(&snapshot("e", 2, r#"{"plain":true}"#))
            .await
            .unwrap();
        assert_eq!(
            zstd.load_at("e", 2).await.unwrap().unwrap().state.as_str(),
            r#"{"plain":true}"#
        );
    });
}

/// A delta store in a file: a run saved after every turn is mostly deltas,
/// smaller than the same run in zstd frames, every save back exactly; a
/// keyframe swapped under its deltas is a typed error, never a state.
#[test]
fn sqlite_writes_deltas_and_reads_them_with_their_keyframe() {
    let dir = std::env::temp_dir().join(format!("loom-deltas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (deltas_db, zstd_db) = (dir.join("deltas.db"), dir.join("zstd.db"));
    let states: Vec<String> = (1..=60)
        .map(|t| loom_fixtures::agent_state(t, false))
        .collect();
    block_on(async {
        let deltas = SqliteSnapshotStore::open(&deltas_db, Codec::Delta).unwrap();
        let zstd = SqliteSnapshotStore::open(&zstd_db, Codec::Zstd).unwrap();
        for (i, state) in states.iter().enumerate() {
            deltas
                .save(&snapshot("e", i as i64 + 1, state))
                .await
                .unwrap();
            zstd.save(&snapshot("e", i as i64 + 1, state))
                .await
                .unwrap();
        }
        for (i, state) in states.iter().enumerate() {
            let loaded = deltas.load_at("e", i as i64 + 1).await.unwrap().unwrap();
            assert_eq!(loaded.state.as_str(), state, "turn {}", i + 1);
        }
    });
    let stored = |db: &std::path::Path, format: &str| -> i64 {
        rusqlite::Connection::open(db)
            .unwrap()
            .query_row(
                &format!(
                    "SELECT coalesce(sum(length(state)), 0) FROM loom_snapshots
                     WHERE substr(state, 1, 1) IN ({format})"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    let (delta_bytes, keyframe_bytes) = (
        stored(&deltas_db, "x'03'"),
        stored(&deltas_db, "x'01', x'02'"),
    );
    let zstd_bytes = stored(&zstd_db, "x'01', x'02'");
    assert!(delta_bytes > 0, "no delta written");
    assert!(
        (delta_bytes + keyframe_bytes) * 3 < zstd_bytes,
        "deltas {delta_bytes} + keyframes {keyframe_bytes} against zstd {zstd_bytes}"
    );
    // The first delta and its keyframe.
    let c = rusqlite::Connection::open(&deltas_db).unwrap();
    let (delta_at, frame): (i64, Vec<u8>) = c
        .query_row(
            "SELECT sequence, state FROM loom_snapshots WHERE substr(state, 1, 1) = x'03'
             ORDER BY sequence LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let base = pgloom_core::frame::delta::base_sequence(&frame).unwrap();
    // A zstd store (or another process) sharing the file may not save
    // another state over a keyframe the deltas name.
    block_on(async {
        let zstd = SqliteSnapshotStore::open(&deltas_db, Codec::Zstd).unwrap();
        for store in [zstd.clone(), zstd.with_codec(Codec::None)] {
            let err = store
                .save(&snapshot("e", base, r#"{"other":1}"#))
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::KeyframeInUse { sequence, .. } if sequence == base),
                "{} {err:?}",
                store.snapshot_codec()
            );
        }
        // The same state, framed as before, is taken.
        zstd.save(&snapshot("e", base, &states[base as usize - 1]))
            .await
            .unwrap();
    });
    block_on(async {
        let deltas = SqliteSnapshotStore::open(&deltas_db, Codec::Delta).unwrap();
        // A delete takes the deltas before the keyframe they name: rows
        // from the keyframe to the delta are left after deleting the rest.
        c.execute("DELETE FROM loom_snapshots WHERE sequence > ?1", [delta_at])
            .unwrap();
        let before = i64::try_from(deltas.delete_snapshots("e", 1000).await.unwrap()).unwrap();
        assert_eq!(before, delta_at, "the whole run deleted");
        for (i, state) in states.iter().enumerate().take(delta_at as usize) {
            deltas
                .save(&snapshot("e", i as i64 + 1, state))
                .await
                .unwrap();
        }
        assert_eq!(
            deltas
                .delete_snapshots("e", (delta_at - base) as usize)
                .await
                .unwrap(),
            (delta_at - base) as u64
        );
        let left: Vec<i64> = c
            .prepare("SELECT sequence FROM loom_snapshots ORDER BY sequence")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(left.contains(&base) && left.contains(&delta_at), "{left:?}");
        // Swap the keyframe for another state's frame: its delta is an
        // error now, never another text.
        let other = pgloom_core::frame::encode(&states[0], Codec::Zstd).unwrap();
        c.execute(
            "UPDATE loom_snapshots SET state = ?1 WHERE sequence = ?2",
            rusqlite::params![other, base],
        )
        .unwrap();
        let err = deltas.load_at("e", delta_at).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Decode(DecodeFrameError::DeltaBaseMismatch { base_sequence }) if base_sequence == base
            ),
            "{err:?}"
        );
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tampered_or_newer_frame_is_a_typed_error_never_a_state() {
    let path = std::env::temp_dir().join(format!("loom-snapshots-{}.db", std::process::id()));
    block_on(async {
        let store = SqliteSnapshotStore::open(&path, Codec::Zstd).unwrap();
        store
            .save(&snapshot(
                "e",
                1,
                &format!(r#"{{"log":"{}"}}"#, "words ".repeat(200)),
            ))
            .await
            .unwrap();
        store.save(&snapshot("e", 2, r#"{"ok":1}"#)).await.unwrap();
        let plain = store.with_codec(Codec::None);
        for sequence in 3..=5 {
            plain
                .save(&snapshot("e", sequence, r#"{"ok":1}"#))
                .await
                .unwrap();
        }
    });
    let raw = rusqlite::Connection::open(&path).unwrap();
    // Rows of bare JSON TEXT (the pre-frame format) that are not JSON, or
    // not even UTF-8 (SQLite stores what it is given).
    raw.execute(
        "UPDATE loom_snapshots SET state = '{\"ok\":' WHERE sequence = 3",
        [],
    )
    .unwrap();
    raw.execute(
        "UPDATE loom_snapshots SET state = CAST(X'7B2261223A2280FF227D' AS TEXT) WHERE sequence = 4",
        [],
    )
    .unwrap();
    let kind: String = raw
        .query_row(
            "SELECT typeof(state) FROM loom_snapshots WHERE sequence = 5",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(kind, "text");
    raw.execute(
        "UPDATE loom_snapshots SET state = substr(state, 1, length(state) - 3) WHERE sequence = 1",
        [],
    )
    .unwrap();
    raw.execute(
        "UPDATE loom_snapshots SET state = X'077B7D' WHERE sequence = 2",
        [],
    )
    .unwrap();
    block_on(async {
        let store = SqliteSnapshotStore::open(&path, Codec::None).unwrap();
        assert!(matches!(
            store.load_at("e", 1).await,
            Err(Error::Decode(DecodeFrameError::Truncated { .. }))
        ));
        assert!(matches!(
            store.load_at("e", 2).await,
            Err(Error::Decode(DecodeFrameError::UnknownFormat { byte: 7 }))
        ));
        assert!(matches!(
            store.load_at("e", 3).await,
            Err(Error::Decode(DecodeFrameError::NotJson(_)))
        ));
        assert!(matches!(
            store.load_at("e", 4).await,
            Err(Error::Decode(DecodeFrameError::NotUtf8 { valid_up_to: 6 }))
        ));
        assert_eq!(
            store.load_at("e", 5).await.unwrap().unwrap().state.as_str(),
            r#"{"ok":1}"#
        );
    });
    std::fs::remove_file(&path).ok();
}

#[test]
fn configuration_refuses_unknown_codecs_loudly() {
    assert_eq!(codec_from_name("zstd").unwrap(), Codec::Zstd);
    assert_eq!(codec_from_name("none").unwrap(), Codec::None);
    assert!(matches!(codec_from_name("brotli"), Err(Error::Codec(_))));
}

mod sealing {
    use super::*;
    use pgloom::conformance::check_snapshot_markers;
    use pgloom::snapshot_store::{
        EncryptingSnapshotStore, KeyRing, LengthLeak, Measure, ProfilingSnapshotStore, SealError,
    };

    fn keys() -> KeyRing {
        KeyRing::new("k2", [7; 32]).with_key("k1", [3; 32])
    }

    /// A state that repeats, as agent loops do.
    fn repetitive() -> String {
        let turns: Vec<String> = (0..200)
            .map(|i| format!(r#"{{"turn":{i},"tool":"search","output":"the same tool output again and again"}}"#))
            .collect();
        format!(r#"{{"turns":[{}]}}"#, turns.join(","))
    }

    #[test]
    fn sealed_stores_conform_and_keep_their_markers() {
        block_on(async {
            let plain = EncryptingSnapshotStore::new(
                MemorySnapshotStore::new(Codec::None).unwrap(),
                keys(),
            );
            check_snapshot_store(&plain, Codec::None, Fidelity::Exact)
                .await
                .unwrap();
            let compressing = EncryptingSnapshotStore::compressing(
                MemorySnapshotStore::new(Codec::None).unwrap(),
                keys(),
                LengthLeak::Accept,
            )
            .unwrap();
            check_snapshot_store(&compressing, Codec::Zstd, Fidelity::Exact)
                .await
                .unwrap();
            check_snapshot_markers(&compressing, Codec::Zstd, true).unwrap();
            let profiled = ProfilingSnapshotStore::new(compressing, Measure::Auto).unwrap();
            check_snapshot_markers(&profiled, Codec::Zstd, true).unwrap();
            let profiled_zstd = ProfilingSnapshotStore::new(
                SqliteSnapshotStore::open_in_memory(Codec::Zstd).unwrap(),
                Measure::Auto,
            )
            .unwrap();
            check_snapshot_store(&profiled_zstd, Codec::Zstd, Fidelity::Exact)
                .await
                .unwrap();
            check_snapshot_markers(&profiled_zstd, Codec::Zstd, false).unwrap();
            let sealed_over_profiled = EncryptingSnapshotStore::new(profiled_zstd, keys());
            check_snapshot_markers(&sealed_over_profiled, Codec::Zstd, true).unwrap();
        });
    }

    #[test]
    fn compressing_before_sealing_is_over_4x_smaller() {
        block_on(async {
            let state = repetitive();
            let sealed_json = EncryptingSnapshotStore::new(
                MemorySnapshotStore::new(Codec::None).unwrap(),
                keys(),
            );
            let sealed_frame = EncryptingSnapshotStore::compressing(
                MemorySnapshotStore::new(Codec::None).unwrap(),
                keys(),
                LengthLeak::Accept,
            )
            .unwrap();
            sealed_json.save(&snapshot("e", 1, &state)).await.unwrap();
            sealed_frame.save(&snapshot("e", 1, &state)).await.unwrap();
            let stored =
                |s: Option<pgloom::snapshot_store::Snapshot>| s.unwrap().state.as_str().len();
            let json_bytes = stored(sealed_json.load_latest_sealed("e").await.unwrap());
            let frame_bytes = stored(sealed_frame.load_latest_sealed("e").await.unwrap());
            assert!(
                frame_bytes * 4 < json_bytes,
                "{frame_bytes} vs {json_bytes}"
            );
            assert_eq!(
                sealed_frame
                    .load_latest("e")
                    .await
                    .unwrap()
                    .unwrap()
                    .state
                    .as_str(),
                state
            );
            // A codec only below the seal saves little: ciphertext does not compress.
            let below = EncryptingSnapshotStore::new(
                MemorySnapshotStore::new(Codec::Zstd).unwrap(),
                keys(),
            );
            below.save(&snapshot("e", 1, &state)).await.unwrap();
            let envelope = below.load_latest_sealed("e").await.unwrap().unwrap();
            let frame_of_envelope =
                pgloom_core::frame::encode(envelope.state.as_str(), Codec::Zstd).unwrap();
            assert!(
                frame_of_envelope.len() * 10 > json_bytes * 7,
                "within 30% of sealed JSON"
            );
        });
    }

    #[test]
    fn a_moved_or_flipped_envelope_fails_authentication() {
        block_on(async {
            let inner = MemorySnapshotStore::new(Codec::None).unwrap();
            let store =
                EncryptingSnapshotStore::compressing(inner, keys(), LengthLeak::Accept).unwrap();
            store.save(&snapshot("e", 1, &repetitive())).await.unwrap();
            let sealed = store.load_latest_sealed("e").await.unwrap().unwrap();
            // Moved to sequence 2 of the same execution.
            store
                .inner()
                .save(&snapshot("e", 2, sealed.state.as_str()))
                .await
                .unwrap();
            assert!(matches!(
                store.load_at("e", 2).await,
                Err(Error::Seal(SealError::Authentication { sequence: 2, .. }))
            ));
            // The format byte flipped inside the ciphertext (first byte of ct).
            let mut envelope: serde_json::Value =
                serde_json::from_str(sealed.state.as_str()).unwrap();
            use base64::Engine as _;
            let engine = base64::engine::general_purpose::STANDARD;
            let mut ct = engine.decode(envelope["ct"].as_str().unwrap()).unwrap();
            ct[0] ^= 0x03; // 0x02 -> 0x01 under the keystream
            envelope["ct"] = engine.encode(ct).into();
            store
                .inner()
                .save(&snapshot("e", 1, &envelope.to_string()))
                .await
                .unwrap();
            assert!(matches!(
                store.load_at("e", 1).await,
                Err(Error::Seal(SealError::Authentication { .. }))
            ));
        });
    }

    #[test]
    fn old_envelopes_of_bare_json_and_old_keys_still_open() {
        block_on(async {
            let inner = MemorySnapshotStore::new(Codec::None).unwrap();
            let old = EncryptingSnapshotStore::new(inner, KeyRing::new("k1", [3; 32]));
            old.save(&snapshot("e", 1, r#"{"written":"before the codec"}"#))
                .await
                .unwrap();
            let sealed = old.load_latest_sealed("e").await.unwrap().unwrap();
            let inner = MemorySnapshotStore::new(Codec::None).unwrap();
            inner
                .save(&snapshot("e", 1, sealed.state.as_str()))
                .await
                .unwrap();
            let new =
                EncryptingSnapshotStore::compressing(inner, keys(), LengthLeak::Accept).unwrap();
            assert_eq!(
                new.load_latest("e").await.unwrap().unwrap().state.as_str(),
                r#"{"written":"before the codec"}"#
            );
            let stranger = EncryptingSnapshotStore::new(new, KeyRing::new("k9", [9; 32]));
            assert!(matches!(
                stranger.load_latest("e").await,
                Err(Error::Seal(_))
            ));
        });
    }

    #[test]
    fn a_profiler_never_reports_stored_sizes_over_a_sealing_store() {
        block_on(async {
            let sealing = std::sync::Arc::new(
                EncryptingSnapshotStore::compressing(
                    MemorySnapshotStore::new(Codec::None).unwrap(),
                    keys(),
                    LengthLeak::Accept,
                )
                .unwrap(),
            );
            assert!(matches!(
                ProfilingSnapshotStore::new(sealing.clone(), Measure::Stored),
                Err(Error::Profiling(_))
            ));
            let profiled = ProfilingSnapshotStore::new(sealing, Measure::Auto).unwrap();
            let state = repetitive();
            profiled.save(&snapshot("e", 1, &state)).await.unwrap();
            profiled.load_latest("e").await.unwrap();
            let profile = profiled.profile();
            assert_eq!(profile.measured, Measure::Json);
            assert_eq!(
                profile.sizes.max,
                state.len() as u64,
                "JSON bytes, not the envelope's"
            );
            assert_eq!(
                (profile.save_micros.count, profile.load_micros.count),
                (1, 1)
            );

            let zstd = ProfilingSnapshotStore::new(
                MemorySnapshotStore::new(Codec::Zstd).unwrap(),
                Measure::Auto,
            )
            .unwrap();
            zstd.save(&snapshot("e", 1, &state)).await.unwrap();
            let frame = pgloom_core::frame::encode(&state, Codec::Zstd).unwrap();
            assert_eq!(zstd.profile().measured, Measure::Stored);
            assert_eq!(
                zstd.profile().sizes.max,
                frame.len() as u64,
                "stored bytes over a zstd store"
            );
        });
    }
}

#[test]
fn resume_and_retention_conform_on_memory_and_sqlite() {
    use pgloom::conformance::check_resume_and_retention;
    use pgloom::event_store::{MemoryEventStore, SqliteEventStore};
    block_on(async {
        for codec in [Codec::None, Codec::Zstd] {
            check_resume_and_retention(
                &MemoryEventStore::new(),
                &MemorySnapshotStore::new(codec).unwrap(),
            )
            .await
            .unwrap();
            check_resume_and_retention(
                &SqliteEventStore::open_in_memory().unwrap(),
                &SqliteSnapshotStore::open_in_memory(codec).unwrap(),
            )
            .await
            .unwrap();
        }
    });
}

/// A profiler must never measure a sealed shard (ADR 0141 D3): a sharded
/// store whose shards seal differently is refused, and one that seals says
/// so.
#[test]
fn a_sharded_store_seals_all_its_shards_or_none() {
    use pgloom::dyn_stores::DynSnapshotStore;
    use pgloom::snapshot_store::{EncryptingSnapshotStore, KeyRing, ShardedSnapshotStore};
    use std::sync::Arc;
    let sealed = || -> Arc<dyn DynSnapshotStore> {
        Arc::new(EncryptingSnapshotStore::new(
            MemorySnapshotStore::new(Codec::None).unwrap(),
            KeyRing::new("k1", [7; 32]),
        ))
    };
    let plain = || -> Arc<dyn DynSnapshotStore> {
        Arc::new(MemorySnapshotStore::new(Codec::None).unwrap())
    };
    assert!(matches!(
        ShardedSnapshotStore::new(vec![sealed(), plain()]),
        Err(Error::Unsupported(_))
    ));
    let all_sealed = ShardedSnapshotStore::new(vec![sealed(), sealed()]).unwrap();
    assert!(SnapshotStore::seals_whole_state(&all_sealed));
    assert!(!SnapshotStore::seals_whole_state(
        &ShardedSnapshotStore::new(vec![plain(), plain()]).unwrap()
    ));
}
