//! The snapshot conformance kit on memory and SQLite, in both codecs, and
//! what each must refuse. (Postgres: `tests/snapshot_stores.rs`.)

use loom_client::conformance::{check_snapshot_store, Fidelity};
use loom_client::snapshot_store::{
    codec_from_name, Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore,
    SqliteSnapshotStore,
};
use loom_client::Error;
use loom_core::frame::DecodeFrameError;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn snapshot(sequence: i64, text: &str) -> NewSnapshot {
    NewSnapshot {
        execution_id: "e".into(),
        workflow_id: "wf".into(),
        sequence,
        state: JsonText::new(text.to_owned()).unwrap(),
    }
}

#[test]
fn memory_and_sqlite_conform_in_both_codecs() {
    block_on(async {
        for codec in [Codec::None, Codec::Zstd] {
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
        plain.save(&snapshot(1, &big)).await.unwrap();
        zstd.save(&snapshot(2, &big)).await.unwrap();
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
        plain.save(&snapshot(2, r#"{"plain":true}"#)).await.unwrap();
        assert_eq!(
            zstd.load_at("e", 2).await.unwrap().unwrap().state.as_str(),
            r#"{"plain":true}"#
        );
    });
}

#[test]
fn a_tampered_or_newer_frame_is_a_typed_error_never_a_state() {
    let path = std::env::temp_dir().join(format!("loom-snapshots-{}.db", std::process::id()));
    block_on(async {
        let store = SqliteSnapshotStore::open(&path, Codec::Zstd).unwrap();
        store
            .save(&snapshot(
                1,
                &format!(r#"{{"log":"{}"}}"#, "words ".repeat(200)),
            ))
            .await
            .unwrap();
        store.save(&snapshot(2, r#"{"ok":1}"#)).await.unwrap();
    });
    let raw = rusqlite::Connection::open(&path).unwrap();
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
    });
    std::fs::remove_file(&path).ok();
}

#[test]
fn configuration_refuses_unknown_codecs_loudly() {
    assert_eq!(codec_from_name("zstd").unwrap(), Codec::Zstd);
    assert_eq!(codec_from_name("none").unwrap(), Codec::None);
    assert!(matches!(codec_from_name("brotli"), Err(Error::Codec(_))));
}
