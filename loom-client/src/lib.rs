//! The Rust client of loom: what a service uses to write and page a
//! durable-workflow engine's log in PostgreSQL (through the `loom`
//! extension), in SQLite, or in memory, and to grow from one database to
//! several shards without changing code.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use futures::TryStreamExt;
//! use pgloom::event_store::{iterate_execution_ids, Event, EventStore, MemoryEventStore, ShardedEventStore};
//!
//! // Three shards; a Postgres or SQLite store fits the same places.
//! let store = ShardedEventStore::new(vec![MemoryEventStore::new(), MemoryEventStore::new(), MemoryEventStore::new()]);
//! for id in ["a_b", "A1", "a-b", "B"] {
//!     store.append(&[Event::new(id, 1, "started", serde_json::json!({}))]).await?;
//! }
//! // One order everywhere: Unicode code point order, whatever a locale says.
//! let ids: Vec<String> = iterate_execution_ids(&store, 2).try_collect().await?;
//! assert_eq!(ids, ["A1", "B", "a-b", "a_b"]);
//! # Ok::<(), pgloom::Error>(()) })?;
//! # Ok::<(), pgloom::Error>(())
//! ```
//!
//! It also carries what every store is built on, from `pgloom-core`, the one
//! implementation the extension shares: the snapshot frame ([`frame`]) and
//! the id order ([`compare_execution_ids`]).
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `postgres` | yes | [`event_store::PgEventStore`], [`branch_registry::PgBranchRegistry`], [`snapshot_store::PgSnapshotStore`], [`migrate`]; needs one TLS backend below |
//! | `openssl` | yes | TLS through OpenSSL (libpq's library: `sslpassword` too) |
//! | `rustls` | no | TLS through rustls, no C library (musl, distroless); wins over `openssl` when both are on, so build it with `default-features = false` to leave OpenSSL out ([`event_store::TLS_BACKEND`] says which) |
//! | `blocking` | yes | [`blocking`]: `BlockingEventStore`, `BlockingSnapshotStore`, `BlockingBranchRegistry`, the synchronous face of any store, on a runtime with a worker thread of its own (tokio's `rt-multi-thread`) |
//! | (always) | | [`dyn_stores`]: every store as a trait object; [`event_store::MemoryEventStore`] and the other in-memory stores |
//! | `sqlite` | yes | [`event_store::SqliteEventStore`], [`branch_registry::SqliteBranchRegistry`], [`snapshot_store::SqliteSnapshotStore`] (SQLite bundled) |
//! | `zstd` | yes | zstd snapshot frames; without it a store configured for zstd is refused at construction |
//! | `serde` | no | `Serialize` and `Deserialize` for [`event_store::Event`], [`snapshot_store::Snapshot`] and [`branch_registry::BranchRef`], payloads and states written as the JSON they are (byte for byte) |
//! | `encryption` | no | `snapshot_store::EncryptingSnapshotStore`: snapshots sealed with AES-256-GCM under a `KeyRing` |
//! | `metrics` | no | every store operation's duration and snapshot sizes through the `metrics` facade ([`telemetry`]); traces (`tracing` spans and events) are always on |
//! | `test-kits` | no | `conformance`: the kits a third-party store checks itself with; for tests, not production builds |
//! | `cli` | no | the `loom` binary (`loom snapshot show`), in `pgloom::cli`; turns on `encryption` |
//!
//! # Versions
//!
//! pgloom follows [SemVer](https://semver.org), as Cargo reads it: while it
//! is 0.x, a minor release (0.1 to 0.2) may break the public API and a
//! patch release (0.1.0 to 0.1.1) never does. Breaking, besides a changed
//! or removed item: a raised minimum Rust version (`rust-version`), a
//! raised oldest supported extension ([`compat::OLDEST_EXTENSION`]), a
//! default feature removed. Not breaking: a new extension version
//! supported, or its SQL carried by [`migrate`]; a new variant of a
//! `#[non_exhaustive]` enum such as [`Error`]. Its version is not the
//! extension's: [`compat`] says which extensions it works with.
//!
//! No public item outside the `interop` module (feature `postgres`) names
//! a type of the libraries pgloom runs on (deadpool, tokio-postgres,
//! rusqlite, tokio): the pool is loom's own [`PgPool`], and a
//! driver's error is carried opaquely ([`error`]). What names them is
//! `interop` and the `From` conversions it lists (a driver's error into
//! [`Error`], a deadpool pool into [`PgPool`]): a new major version of one
//! of them is a minor release of pgloom (breaking, while it is 0.x), and
//! `tests/tooling/public_api.rs` checks the rule on every build of `make lint`.
#![warn(missing_docs)]
// On docs.rs, each feature-gated item says which feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "blocking")]
pub mod blocking;
pub mod branch_registry;
#[cfg(feature = "postgres")]
pub mod claims;
#[cfg(feature = "cli")]
pub mod cli;
pub mod compat;
#[cfg(feature = "test-kits")]
pub mod conformance;
pub mod contract;
pub mod dyn_stores;
pub mod error;
pub mod event_store;
#[cfg(feature = "postgres")]
mod flavour;
pub mod id_scope;
#[cfg(feature = "postgres")]
pub mod interop;
#[cfg(feature = "serde")]
mod json_serde;
#[cfg(feature = "postgres")]
pub mod migrate;
#[cfg(feature = "postgres")]
pub mod move_to_extension;
#[cfg(feature = "postgres")]
mod pg_connect;
#[cfg(feature = "postgres")]
mod pg_executor;
#[cfg(feature = "postgres")]
mod pg_pool;
#[cfg(feature = "postgres")]
mod pg_row;
#[cfg(feature = "postgres")]
mod pg_schema;
pub mod resume;
pub mod retention;
pub mod snapshot_store;
#[cfg(feature = "sqlite")]
mod sqlite_connection;
pub mod stores;
pub mod telemetry;
mod versions;

pub use error::{Error, Result};
#[cfg(feature = "postgres")]
pub use pg_pool::{PgPool, PgPoolOptions, PgPoolStatus};

// The Rust snippets of the README and of docs/client.md compile as doc
// tests (`make test.unit` turns on the features they use): a quick start
// that does not build is a bug.
#[cfg(all(doctest, feature = "postgres", feature = "sqlite", feature = "zstd"))]
#[doc = include_str!("../../README.md")]
mod readme {}
#[cfg(all(
    doctest,
    feature = "postgres",
    feature = "sqlite",
    feature = "zstd",
    feature = "test-kits",
    feature = "encryption"
))]
#[doc = include_str!("../../docs/client.md")]
mod client_md {}
pub use pgloom_core::{compare_execution_ids, frame, json};
