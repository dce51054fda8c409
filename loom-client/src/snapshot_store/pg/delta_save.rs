//! A [`Codec::Delta`](super::Codec::Delta) save: encoded in the client
//! against the execution's latest keyframe, as a zstd save is encoded in
//! the client, and stored through `loom_store_snapshot`, which holds that
//! keyframe `FOR SHARE` and refuses the delta (`40001`) unless the stored
//! keyframe is still the frame whose SHA-256 it names.
//!
//! The keyframe comes from the store's cache when the store saved it (one
//! statement a save, as for zstd), else from `loom_snapshot_keyframe` (two).
//! A save that lost a race to a peer (the keyframe saved over or deleted
//! since it was read, or deltas the cache did not know of naming the row
//! saved over) fetches the keyframe and encodes again, at most
//! [`ATTEMPTS`] times, on the store's own connections. On the caller's
//! connection ([`super::PgSnapshotStore::on`]) the keyframe is always
//! read in the caller's transaction, which then holds it until it ends,
//! and nothing is cached from it (it may roll back).

use std::sync::Arc;

use pgloom_core::frame::delta::{Keyframe, KeyframeBase};
use pgloom_core::frame::{self, Format};
use sha2::{Digest, Sha256};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::{PgSnapshotStore, DELTA_SINCE};
use crate::pg_executor::Conn;
use crate::pg_row::column;
use crate::snapshot_store::keyframe_cache::CachedKeyframe;
use crate::snapshot_store::NewSnapshot;
use crate::telemetry;
use crate::{Error, Result};

/// The keyframe a save at `$2` is written against (0.16.0+).
const KEYFRAME: &str = "SELECT k.keyframe_sequence, k.keyframe, k.deltas_since, k.is_keyframe
     FROM @extschema@.loom_snapshot_keyframe($1::pg_catalog.text, $2::pg_catalog.int8) AS k";

/// How many times a delta save encodes: once, then again for each peer
/// that changed the keyframe under it, at most twice.
const ATTEMPTS: u32 = 3;

/// Whether a delta save that failed with `e` is encoded again against the
/// keyframe as it is now: when the server found its keyframe changed or
/// gone (`40001`), or a keyframe from the cache turned out to be named by
/// deltas it did not know of (`55006`). Never on the caller's connection,
/// whose transaction the error aborted.
fn retried(e: &Error, from_cache: bool, client: &Conn<'_>) -> bool {
    if matches!(client, Conn::Caller(_)) {
        return false;
    }
    match e {
        Error::KeyframeInUse { .. } => from_cache,
        _ => e.sqlstate() == Some(SqlState::T_R_SERIALIZATION_FAILURE.code()),
    }
}

/// What the server said a save is written against.
enum Base {
    /// A keyframe, as the store caches it.
    Keyframe(CachedKeyframe),
    /// Nothing: the execution has no keyframe before the save.
    None,
    /// The save replaces a row that deltas name: it stays a keyframe.
    StaysKeyframe,
}

impl PgSnapshotStore {
    pub(super) async fn save_delta(
        &self,
        client: &Conn<'_>,
        snapshot: &NewSnapshot,
    ) -> Result<i64> {
        self.schema
            .require(
                client,
                "a delta snapshot",
                DELTA_SINCE,
                "loom_store_snapshot",
            )
            .await?;
        // On the caller's connection the keyframe is read in the caller's
        // transaction, held FOR SHARE until it ends: never the cache, which
        // may hold what another of the caller's transactions rolled back.
        let caller = matches!(client, Conn::Caller(_));
        let cached = if caller {
            None
        } else {
            self.keyframes
                .lock()
                .expect("never poisoned")
                .get(&snapshot.execution_id, snapshot.sequence)
        };
        let mut from_cache = cached.is_some();
        let mut base = match cached {
            Some(keyframe) => Base::Keyframe(keyframe),
            None => self.fetch_keyframe(client, snapshot).await?,
        };
        let mut attempt = 1;
        loop {
            match self.store_against(client, snapshot, &base).await {
                Ok(id) => return Ok(id),
                Err(e) if attempt < ATTEMPTS && retried(&e, from_cache, client) => {
                    // A peer saved over or deleted the keyframe (or wrote
                    // deltas naming the row saved over) since it was read.
                    self.forget(&snapshot.execution_id);
                    base = self.fetch_keyframe(client, snapshot).await?;
                    from_cache = false;
                    attempt += 1;
                }
                Err(e) => {
                    self.forget(&snapshot.execution_id);
                    return Err(e);
                }
            }
        }
    }

    /// Encodes against `base` and stores; keeps what the save leaves as
    /// the execution's keyframe.
    async fn store_against(
        &self,
        client: &Conn<'_>,
        snapshot: &NewSnapshot,
        base: &Base,
    ) -> Result<i64> {
        let state = snapshot.state.as_str();
        let keyframe = match base {
            Base::Keyframe(keyframe) => Some(keyframe),
            Base::None | Base::StaysKeyframe => None,
        };
        let frame = match base {
            Base::StaysKeyframe => frame::encode(state, frame::Codec::Zstd)?,
            _ => self.keyframe_policy.encode(
                state,
                keyframe.map(|k| KeyframeBase {
                    keyframe: Keyframe {
                        sequence: k.sequence,
                        text: &k.text,
                    },
                    frame_bytes: k.frame_bytes,
                    deltas_since: k.deltas_since,
                }),
            )?,
        };
        telemetry::frame_stored(&self.db, &frame);
        let is_delta = frame.first() == Some(&Format::Delta.byte());
        let digest = keyframe.filter(|_| is_delta).map(|k| k.digest);
        let id = self
            .store_frame(
                client,
                snapshot,
                None,
                Some(&frame),
                digest.as_ref().map(<[u8; 32]>::as_slice),
            )
            .await?;
        let kept = match keyframe.filter(|_| is_delta) {
            Some(keyframe) => CachedKeyframe {
                deltas_since: keyframe.deltas_since + 1,
                last_saved: keyframe.last_saved.max(snapshot.sequence),
                ..keyframe.clone()
            },
            None => CachedKeyframe {
                sequence: snapshot.sequence,
                text: Arc::from(state),
                frame_bytes: frame.len(),
                digest: Sha256::digest(&frame).into(),
                deltas_since: 0,
                last_saved: snapshot.sequence,
            },
        };
        // Not from the caller's transaction, which may yet roll back.
        if !matches!(client, Conn::Caller(_)) {
            self.keyframes
                .lock()
                .expect("never poisoned")
                .put_unless_later(&snapshot.execution_id, kept);
        }
        Ok(id)
    }

    /// The keyframe a save of `snapshot` is written against, from the
    /// server, decoded.
    async fn fetch_keyframe(&self, client: &Conn<'_>, snapshot: &NewSnapshot) -> Result<Base> {
        let sql = self.schema.sql(client, KEYFRAME).await?;
        let row = client
            .query_one(
                &sql,
                &[
                    (&snapshot.execution_id, Type::TEXT),
                    (&snapshot.sequence, Type::INT8),
                ],
            )
            .await?;
        if column::<bool>(&row, 3)? {
            return Ok(Base::StaysKeyframe);
        }
        let (Some(sequence), Some(frame)) = (
            column::<Option<i64>>(&row, 0)?,
            column::<Option<Vec<u8>>>(&row, 1)?,
        ) else {
            return Ok(Base::None);
        };
        let deltas_since: Option<i32> = column(&row, 2)?;
        let text = frame::decode(&frame).map_err(Error::from)?;
        Ok(Base::Keyframe(CachedKeyframe {
            sequence,
            text: Arc::from(text),
            frame_bytes: frame.len(),
            digest: Sha256::digest(&frame).into(),
            deltas_since: u32::try_from(deltas_since.unwrap_or(0)).unwrap_or(0),
            // Fetched for this save: a later one may use it.
            last_saved: sequence,
        }))
    }

    fn forget(&self, execution_id: &str) {
        self.keyframes
            .lock()
            .expect("never poisoned")
            .remove(execution_id);
    }
}
