//! The Rust client of loom: what a service uses to read and write a
//! durable-workflow engine's data in PostgreSQL.
//!
//! Today it carries the pieces every store is built on, from `loom-core`,
//! the one implementation the `loom` extension shares, so that a frame this
//! crate writes decodes in the server's `loom_snapshot_state`, and an id
//! cursor orders here exactly as `COLLATE "C"` orders there:
//!
//! ```
//! use loom_client::frame::{decode, encode, Codec};
//! use loom_client::compare_execution_ids;
//!
//! let frame = encode(r#"{"turns":[],"status":"running"}"#, Codec::Zstd)?;
//! assert_eq!(decode(&frame)?, r#"{"turns":[],"status":"running"}"#);
//!
//! let mut ids = vec!["a_b", "A1", "B"];
//! ids.sort_by(|a, b| compare_execution_ids(a, b));
//! assert_eq!(ids, ["A1", "B", "a_b"]); // code point order, not a locale's
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub use loom_core::{compare_execution_ids, frame, json};
