//! The snapshot store contract (ADR 0141) and its backends.
//!
//! Resume is one snapshot read plus a short log tail, so this is the resume
//! path: it must be exact and fast. A state is exact JSON text
//! ([`JsonText`]): what [`SnapshotStore::save`] is given is what a load
//! returns, byte for byte, from every store that keeps text (memory,
//! SQLite, and Postgres frame rows; a Postgres JSONB row is as exact as
//! JSONB is, which is why frames exist).
//!
//! The codec ([`Codec`]) is each store's own choice and invisible at the
//! contract: every store reads both formats whatever it writes, so old rows
//! stay readable forever and nothing is rewritten.

#[cfg(feature = "encryption")]
mod encrypting;
#[cfg(feature = "postgres")]
mod keyframe_cache;
mod keyframes;
mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
mod profiling;
mod sharded;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tenant_scoped;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod verify;

use std::fmt;
use std::future::Future;
use std::time::SystemTime;

#[cfg(feature = "encryption")]
pub use encrypting::{is_sealed, EncryptingSnapshotStore, KeyRing, LengthLeak, SealError};
pub use memory::MemorySnapshotStore;
#[cfg(feature = "postgres")]
pub use pg::{
    Decode, FrameProvisioning, PgSnapshotStore, PgSnapshotStoreOn, PgSnapshotStoreOptions,
};
pub use pgloom_core::frame::Codec;
pub use profiling::{Histogram, Measure, Profile, ProfilingSnapshotStore};
pub use sharded::ShardedSnapshotStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteSnapshotStore;
pub use tenant_scoped::TenantScopedSnapshotStore;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use verify::{FrameCheck, UnreadableFrame};

use pgloom_core::json::InvalidJsonError;

use crate::id_scope::IdScope;
use crate::{Error, Result};

/// Validated JSON text, kept exactly as given: never parsed into a value,
/// which would reorder keys, merge duplicates or lose an escaped lone
/// surrogate. (Not `serde_json::RawValue`: it refuses nesting deeper than
/// 128, and agent states nest deeper.)
///
/// ```
/// use pgloom::snapshot_store::JsonText;
/// let state = JsonText::new(r#"{"z":1,"a":"\ud800"}"#.to_owned())?;
/// assert_eq!(state.as_str(), r#"{"z":1,"a":"\ud800"}"#);
/// assert!(JsonText::new("{oops}".to_owned()).is_err());
/// # Ok::<(), pgloom::json::InvalidJsonError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JsonText(String);

impl JsonText {
    /// Checks `text` is one JSON text.
    ///
    /// # Errors
    ///
    /// [`InvalidJsonError`] with where it stops being JSON.
    pub fn new(text: String) -> Result<Self, InvalidJsonError> {
        pgloom_core::json::validate(text.as_bytes())?;
        Ok(JsonText(text))
    }

    /// The JSON text of a state `serde` serializes: a typed state, no
    /// `serde_json::Value` in between.
    ///
    /// ```
    /// #[derive(serde::Serialize)]
    /// struct Agent { turns: u32 }
    /// let state = pgloom::snapshot_store::JsonText::from_serialize(&Agent { turns: 3 })?;
    /// assert_eq!(state.as_str(), r#"{"turns":3}"#);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What `serde_json` fails with.
    pub fn from_serialize<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        serde_json::to_string(value).map(JsonText)
    }

    /// JSON text PostgreSQL printed: `jsonb_out` of a jsonb value, or
    /// `loom_snapshot_state_text`, which validated what it decoded. JSON by
    /// construction: scanning it again would only repeat the server's work.
    #[cfg(feature = "postgres")]
    pub(crate) fn printed_by_server(text: String) -> Self {
        JsonText(text)
    }

    /// Text that is JSON by construction (what `serde_json` printed).
    pub(crate) fn proven(text: String) -> Self {
        JsonText(text)
    }

    /// `name(text)`, the text cut after 80 characters: a 10,000-deep
    /// value is legal, a debug line should stay readable, and little of a
    /// state (user data) should reach a log.
    pub(crate) fn debug_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 80;
        match self.0.char_indices().nth(SHOWN) {
            None => write!(f, "{name}({:?})", self.0),
            Some((cut, _)) => write!(f, "{name}({:?}… {} bytes)", &self.0[..cut], self.0.len()),
        }
    }

    /// The text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }

    /// Deserializes the state (a typed helper on top of the exact text).
    ///
    /// # Errors
    ///
    /// When the text does not fit `T`.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(&self.0)
    }
}

/// A decoded frame is proven JSON already ([`pgloom_core::frame::decode_json`]):
/// no second scan.
impl From<pgloom_core::json::JsonString> for JsonText {
    fn from(text: pgloom_core::json::JsonString) -> Self {
        JsonText(text.into_string())
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for JsonText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::json_serde::serialize(&self.0, serializer)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for JsonText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::json_serde::deserialize(deserializer, JsonText::new)
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_as("JsonText", f)
    }
}

impl fmt::Display for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A state to save.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewSnapshot {
    /// The execution.
    pub execution_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// The log position the state folds up to.
    pub sequence: i64,
    /// The folded state.
    pub state: JsonText,
}

impl NewSnapshot {
    /// A state to save.
    pub fn new(
        execution_id: impl Into<String>,
        workflow_id: impl Into<String>,
        sequence: i64,
        state: JsonText,
    ) -> Self {
        NewSnapshot {
            execution_id: execution_id.into(),
            workflow_id: workflow_id.into(),
            sequence,
            state,
        }
    }
}

/// A stored snapshot, decoded. With the `serde` feature it serializes
/// with its state as the JSON it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// The store's id of the row.
    pub id: i64,
    /// The execution.
    pub execution_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// The log position the state folds up to.
    pub sequence: i64,
    /// When it was (last) saved.
    pub created_at: SystemTime,
    /// The folded state, exactly as saved (see [`JsonText`]).
    pub state: JsonText,
}

impl Snapshot {
    /// A stored snapshot (what a store returns; a third-party store builds
    /// its answers with it): `new` is what was saved, `id` and `created_at`
    /// what the store gave it.
    #[must_use]
    pub fn new(id: i64, new: NewSnapshot, created_at: SystemTime) -> Self {
        Snapshot {
            id,
            execution_id: new.execution_id,
            workflow_id: new.workflow_id,
            sequence: new.sequence,
            created_at,
            state: new.state,
        }
    }
}

/// Checks a configured codec can be written by this build: an unknown
/// name, or zstd in a build without it, is refused, never silently
/// written as JSON.
///
/// ```
/// use pgloom::snapshot_store::{codec_from_name, Codec};
/// assert_eq!(codec_from_name("zstd")?, Codec::Zstd);
/// assert!(codec_from_name("gzip").is_err());
/// # Ok::<(), pgloom::Error>(())
/// ```
///
/// # Errors
///
/// [`Error::Codec`] for an unknown name, [`Error::CodecUnavailable`] for a
/// codec this build lacks.
pub fn codec_from_name(name: &str) -> Result<Codec> {
    let codec: Codec = name.parse()?;
    check_codec(codec)?;
    Ok(codec)
}

/// Refuses a codec this build cannot write.
pub(crate) fn check_codec(codec: Codec) -> Result<()> {
    if codec.is_available() {
        Ok(())
    } else {
        Err(Error::CodecUnavailable(
            pgloom_core::frame::CodecUnavailableError,
        ))
    }
}

/// Where snapshots are kept.
///
/// # Cancellation
///
/// A dropped future leaves the store usable: a load leaves nothing behind;
/// a save whose statement was sent may still commit (saving the same
/// snapshot again is an upsert, so a retry is safe); a delete batch is
/// called until it returns 0 anyway.
pub trait SnapshotStore: Send + Sync {
    /// The codec this store writes with (ADR 0141 D8's marker): a decorator
    /// reports its inner store's, so no wrapper can hide it.
    fn snapshot_codec(&self) -> Codec;

    /// The prefix this store puts before execution ids on their way to
    /// storage ([`IdScope`]): [`crate::resume::resume`] pairs a snapshot
    /// store only with an event store of the same scope. A backend returns
    /// [`IdScope::unscoped`]; a decorator its inner store's; a view its own
    /// within it. Required, with no default (see
    /// [`crate::event_store::EventStore::id_scope`]).
    fn id_scope(&self) -> IdScope;

    /// Whether this store seals whole states (then stored sizes are
    /// ciphertext sizes, and no profiler may report them: ADR 0141 D3).
    /// A decorator reports its inner store's.
    fn seals_whole_state(&self) -> bool {
        false
    }

    /// This store, when it is a plain [`PgSnapshotStore`]: what lets
    /// [`crate::resume::resume`] read a snapshot and its tail in one
    /// statement when the event store shares its pool
    /// ([`crate::event_store::EventStore::postgres_pool`]). `None`, the
    /// default, for every other store (a decorator that seals or profiles
    /// what it reads must see each load).
    #[cfg(feature = "postgres")]
    fn as_postgres(&self) -> Option<&PgSnapshotStore> {
        None
    }

    /// Saves a state and returns its row id; a save at the same (execution,
    /// sequence) replaces the row, in this store's format.
    fn save(&self, snapshot: &NewSnapshot) -> impl Future<Output = Result<i64>> + Send;

    /// The snapshot `query` names, decoded; `None` when there is none.
    fn load(
        &self,
        execution_id: &str,
        query: SnapshotQuery,
    ) -> impl Future<Output = Result<Option<Snapshot>>> + Send;

    /// The snapshot with the highest sequence.
    fn load_latest(
        &self,
        execution_id: &str,
    ) -> impl Future<Output = Result<Option<Snapshot>>> + Send {
        self.load(execution_id, SnapshotQuery::Latest)
    }

    /// The snapshot at exactly `sequence`, never a neighbour.
    fn load_at(
        &self,
        execution_id: &str,
        sequence: i64,
    ) -> impl Future<Output = Result<Option<Snapshot>>> + Send {
        self.load(execution_id, SnapshotQuery::At(sequence))
    }

    /// The snapshot with the highest sequence below `sequence`.
    fn load_latest_before(
        &self,
        execution_id: &str,
        sequence: i64,
    ) -> impl Future<Output = Result<Option<Snapshot>>> + Send {
        self.load(execution_id, SnapshotQuery::Before(sequence))
    }

    /// The sequence of the latest snapshot of `execution_id`, without
    /// decoding its state (the default loads it; loom's stores read only
    /// the sequence).
    fn latest_sequence(
        &self,
        execution_id: &str,
    ) -> impl Future<Output = Result<Option<i64>>> + Send {
        async move { Ok(self.load_latest(execution_id).await?.map(|s| s.sequence)) }
    }

    /// Deletes one batch of at most `limit` of an execution's snapshots,
    /// oldest first, and returns how many; call it until it returns 0
    /// (retention: [`crate::retention::delete_execution`]). The default
    /// refuses ([`Error::Unsupported`]); every loom store implements it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a limit of 0; the store's own.
    fn delete_snapshots(
        &self,
        execution_id: &str,
        limit: usize,
    ) -> impl Future<Output = Result<u64>> + Send {
        let _ = (execution_id, limit);
        async { Err(Error::Unsupported("SnapshotStore::delete_snapshots")) }
    }
}

/// Which snapshot of an execution a load asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotQuery {
    /// The highest sequence.
    Latest,
    /// Exactly this sequence, never a neighbour.
    At(i64),
    /// The highest sequence below this one.
    Before(i64),
}

/// A shared store is a store: a profiler and a service can wrap one.
impl<S: SnapshotStore> SnapshotStore for std::sync::Arc<S> {
    fn snapshot_codec(&self) -> Codec {
        (**self).snapshot_codec()
    }

    fn id_scope(&self) -> IdScope {
        (**self).id_scope()
    }

    fn seals_whole_state(&self) -> bool {
        (**self).seals_whole_state()
    }

    #[cfg(feature = "postgres")]
    fn as_postgres(&self) -> Option<&PgSnapshotStore> {
        (**self).as_postgres()
    }

    fn save(&self, snapshot: &NewSnapshot) -> impl Future<Output = Result<i64>> + Send {
        (**self).save(snapshot)
    }

    fn load(
        &self,
        execution_id: &str,
        query: SnapshotQuery,
    ) -> impl Future<Output = Result<Option<Snapshot>>> + Send {
        (**self).load(execution_id, query)
    }

    fn delete_snapshots(
        &self,
        execution_id: &str,
        limit: usize,
    ) -> impl Future<Output = Result<u64>> + Send {
        (**self).delete_snapshots(execution_id, limit)
    }

    fn latest_sequence(
        &self,
        execution_id: &str,
    ) -> impl Future<Output = Result<Option<i64>>> + Send {
        (**self).latest_sequence(execution_id)
    }
}

#[cfg(all(test, not(feature = "zstd")))]
mod tests_without_zstd {
    use super::*;

    #[test]
    fn a_build_without_zstd_refuses_it_at_construction() {
        assert!(matches!(
            codec_from_name("zstd"),
            Err(Error::CodecUnavailable(_))
        ));
        assert!(matches!(
            MemorySnapshotStore::new(Codec::Zstd),
            Err(Error::CodecUnavailable(_))
        ));
        assert!(MemorySnapshotStore::new(Codec::None).is_ok());
    }
}
