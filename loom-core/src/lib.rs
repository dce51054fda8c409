//! The code loom's PostgreSQL extension and its client share: the snapshot
//! frame codec (ADR 0141 D1) and the execution-id order (ADR 0108 D1).
//!
//! It lives in one crate with no database dependency so that the server and
//! every client encode, decode and order exactly alike: a frame written by
//! `pgloom` decodes in the server's `loom_snapshot_state`, and an id
//! cursor means the same thing in Rust and in SQL.
//!
//! ```
//! use pgloom_core::frame::{self, Codec, Format};
//!
//! let state = r#"{"turns":[{"tool":"search","output":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}"#;
//! let bytes = frame::encode(state, Codec::Zstd)?;
//! assert_eq!(frame::inspect(&bytes)?.format, Format::Zstd);
//! assert_eq!(frame::decode(&bytes)?, state); // the exact text, byte for byte
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `zstd` | yes | writing and reading `0x02` (zstd) frames. Without it, [`frame::Codec::Zstd`] and `0x02` frames are refused with [`frame::CodecUnavailableError`], never silently written as JSON. |
#![warn(missing_docs)]
// On docs.rs, each feature-gated item says which feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod frame;
pub mod interrupt;
pub mod json;
pub mod order;
pub mod sql;
pub(crate) mod xxh64;

pub use frame::{
    decode, decode_into, encode, inspect, Codec, CodecUnavailableError, DecodeFrameError,
    EncodeFrameError, Format, FrameInfo, ParseCodecError, MAX_DECODED_STATE_BYTES,
    SNAPSHOT_FRAME_SENTINEL,
};
pub use json::InvalidJsonError;
pub use order::compare_execution_ids;
