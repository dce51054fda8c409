//! The snapshot frame (ADR 0141 D1): one format byte, then the state's JSON
//! text, either as it is or as one zstd frame.
//!
//! | byte | payload |
//! |---|---|
//! | `0x01` | the UTF-8 JSON text, uncompressed |
//! | `0x02` | zstd level 3 of the same text: content checksum, content size in the header, exactly one frame, no dictionary |
//! | `0x03` | a delta: the keyframe it was written against (its sequence, length and XXH64), then zstd level 3 of the text with that keyframe's text as its prefix ([`delta`]) |
//!
//! Both format bytes are control characters, which can never start a JSON
//! text, so a reader that may also meet bare JSON tells them apart by the
//! first byte alone. The payload is JSON text and nothing else: decoding
//! gives back the exact bytes that were encoded (key order, duplicate keys,
//! `__proto__`, escaped lone surrogates and all), because nothing here ever
//! parses the state into a value.
//!
//! Decoding is defensive, because a frame is read from a table anyone with
//! write access could have tampered with: an unknown format byte is refused
//! (never guessed), a frame must carry its checksum, nothing may follow it,
//! and no frame may make the reader allocate more than
//! [`MAX_DECODED_STATE_BYTES`].

pub mod delta;
mod error;
mod zstd_header;
#[cfg(feature = "zstd")]
pub(crate) mod zstd_payload;

use std::fmt;
use std::str::FromStr;

pub use error::{
    CodecUnavailableError, DecodeFrameError, EncodeFrameError, ParseCodecError, TrailingKind,
};

use crate::json::{self, JsonString};
use zstd_header::ZstdHeader;

/// The largest state, in bytes of JSON text, that loom writes or reads:
/// 256 MiB. A frame that declares more is refused before a byte is
/// inflated; one that declares nothing is stopped when it reaches this.
pub const MAX_DECODED_STATE_BYTES: u64 = 256 * 1024 * 1024;

/// The largest window a zstd frame that declares no content size may ask
/// for: 4 MiB (window log 22). Such a frame can only be inflated by
/// streaming, which allocates its window with malloc, outside PostgreSQL's
/// memory accounting; loom writes level 3 (windows of at most 2 MiB) and
/// always declares the size, so only foreign frames ever come near it.
pub const MAX_UNDECLARED_WINDOW_BYTES: u64 = 1 << 22;

/// What the JSONB `state` column holds on a row whose real state is a frame
/// in `state_z` (ADR 0141 D5). A top-level `__loomEnc` string is a shape every
/// older reader refuses loudly, so a pre-codec reader fails instead of taking
/// the row for an empty state.
pub const SNAPSHOT_FRAME_SENTINEL: &str = r#"{"__loomEnc":"loom.snapshot-frame/state_z"}"#;

/// How [`encode`] stores the payload.
///
/// Parsed from the names used in configuration and SQL:
///
/// ```
/// use pgloom_core::frame::Codec;
/// assert_eq!("zstd".parse::<Codec>()?, Codec::Zstd);
/// assert_eq!("none".parse::<Codec>()?, Codec::None);
/// assert_eq!("delta".parse::<Codec>()?, Codec::Delta);
/// assert!("lz4".parse::<Codec>().is_err());
/// # Ok::<(), pgloom_core::frame::ParseCodecError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Codec {
    /// The JSON text as it is (`0x01`).
    #[default]
    None,
    /// zstd level 3 (`0x02`), or `0x01` when zstd would not make it smaller.
    Zstd,
    /// Deltas (`0x03`) against the execution's latest keyframe, and a
    /// keyframe as [`Codec::Zstd`] writes it when the
    /// [`delta::KeyframePolicy`] asks for one. Only a store, which holds
    /// the keyframe, writes deltas; [`encode`] alone writes the keyframe.
    Delta,
}

impl Codec {
    /// The name used in configuration and SQL: `"none"`, `"zstd"` or
    /// `"delta"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
            Codec::Delta => "delta",
        }
    }

    /// Whether this build can write (and read) this codec's frames.
    #[must_use]
    pub fn is_available(self) -> bool {
        match self {
            Codec::None => true,
            Codec::Zstd | Codec::Delta => cfg!(feature = "zstd"),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Codec {
    type Err = ParseCodecError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "none" => Ok(Codec::None),
            "zstd" => Ok(Codec::Zstd),
            "delta" => Ok(Codec::Delta),
            _ => Err(ParseCodecError::new(name)),
        }
    }
}

/// The format byte that opens a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// `0x01`: the JSON text, uncompressed.
    Json,
    /// `0x02`: one zstd frame of the JSON text.
    Zstd,
    /// `0x03`: a delta against a keyframe ([`delta`]).
    Delta,
}

impl Format {
    /// The byte that opens a frame of this format.
    #[must_use]
    pub fn byte(self) -> u8 {
        match self {
            Format::Json => 0x01,
            Format::Zstd => 0x02,
            Format::Delta => 0x03,
        }
    }

    /// The format a frame's first byte names, if this loom knows it.
    #[must_use]
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0x01 => Some(Format::Json),
            0x02 => Some(Format::Zstd),
            0x03 => Some(Format::Delta),
            _ => None,
        }
    }

    /// `"json"`, `"zstd"` or `"delta"`, as `loom_snapshot_frame_info`
    /// reports it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Zstd => "zstd",
            Format::Delta => "delta",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a frame's header says about it, read without inflating a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// The format byte's meaning.
    pub format: Format,
    /// The whole frame's length, format byte included.
    pub stored_bytes: usize,
    /// The JSON text's length as the frame declares it: the payload's length
    /// for `0x01`, the zstd header's content size for `0x02` (`None` when the
    /// zstd frame does not declare one; loom always does).
    pub declared_bytes: Option<u64>,
    /// Whether the payload carries a content checksum (always for frames
    /// loom writes as `0x02`; never for `0x01`, whose text is not compressed).
    pub has_checksum: bool,
}

/// Frames a state's JSON text.
///
/// With [`Codec::Zstd`] the frame is `0x02` unless zstd would not make the
/// text smaller, in which case it is `0x01`: a frame is never larger than
/// the text plus one byte.
///
/// # Errors
///
/// - [`EncodeFrameError::NotJson`]: `json` is not one JSON text (a frame
///   holds JSON and nothing else, so that it always decodes).
/// - [`EncodeFrameError::StateTooLarge`]: longer than
///   [`MAX_DECODED_STATE_BYTES`], which no reader would accept back.
/// - [`EncodeFrameError::CodecUnavailable`]: `Codec::Zstd` (or `Delta`) in a build
///   without the `zstd` feature. Never silently written as `0x01`.
/// - [`EncodeFrameError::Compress`]: zstd itself failed (out of memory).
///
/// ```
/// use pgloom_core::frame::{encode, Codec};
/// assert_eq!(encode("[1,2]", Codec::None)?, b"\x01[1,2]");
/// // Too small for zstd to help: still 0x01.
/// assert_eq!(encode("[1,2]", Codec::Zstd)?[0], 0x01);
/// assert!(encode("{oops}", Codec::Zstd).is_err());
/// # Ok::<(), pgloom_core::frame::EncodeFrameError>(())
/// ```
pub fn encode(json: &str, codec: Codec) -> Result<Vec<u8>, EncodeFrameError> {
    if json.len() as u64 > MAX_DECODED_STATE_BYTES {
        return Err(EncodeFrameError::StateTooLarge {
            bytes: json.len() as u64,
            limit: MAX_DECODED_STATE_BYTES,
        });
    }
    json::validate(json.as_bytes())?;
    match codec {
        Codec::None => Ok(json_frame(json)),
        // A delta store's keyframe: a delta needs the keyframe the store
        // holds ([`delta::KeyframePolicy::encode`]).
        Codec::Zstd | Codec::Delta => zstd_frame(json),
    }
}

fn json_frame(json: &str) -> Vec<u8> {
    let mut frame = Vec::with_capacity(json.len() + 1);
    frame.push(Format::Json.byte());
    frame.extend_from_slice(json.as_bytes());
    frame
}

#[cfg(feature = "zstd")]
fn zstd_frame(json: &str) -> Result<Vec<u8>, EncodeFrameError> {
    Ok(
        zstd_payload::compress(json.as_bytes(), Format::Zstd.byte())?
            .unwrap_or_else(|| json_frame(json)),
    )
}

#[cfg(not(feature = "zstd"))]
fn zstd_frame(_json: &str) -> Result<Vec<u8>, EncodeFrameError> {
    Err(CodecUnavailableError.into())
}

/// Decodes a frame back to the exact JSON text that was encoded.
///
/// # Errors
///
/// A distinct [`DecodeFrameError`] for each way a frame can be wrong: empty;
/// an unknown format byte (a newer loom's frame); a `0x02` payload that is
/// not a zstd frame, lacks the checksum, needs a dictionary, is truncated,
/// is followed by anything, or fails its checksum or decompression; a state
/// that declares or reaches more than [`MAX_DECODED_STATE_BYTES`]; a payload
/// that is not UTF-8 or not JSON.
///
/// ```
/// use pgloom_core::frame::{decode, DecodeFrameError};
/// assert_eq!(decode(b"\x01{\"b\":1,\"a\":2}")?, r#"{"b":1,"a":2}"#);
/// assert_eq!(decode(b"\x07..."), Err(DecodeFrameError::UnknownFormat { byte: 7 }));
/// # Ok::<(), DecodeFrameError>(())
/// ```
pub fn decode(frame: &[u8]) -> Result<String, DecodeFrameError> {
    decode_json(frame).map(JsonString::into_string)
}

/// Decodes a frame as [`decode`] does, into a [`JsonString`]: the decoded
/// text with the proof that it is JSON, so that a caller keeping it as
/// JSON (pgloom's `JsonText`) does not validate it a second time.
///
/// # Errors
///
/// As [`decode`].
///
/// ```
/// use pgloom_core::frame::{decode_json, encode, Codec};
/// let frame = encode(r#"{"turn":1}"#, Codec::Zstd)?;
/// assert_eq!(decode_json(&frame)?.as_str(), r#"{"turn":1}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode_json(frame: &[u8]) -> Result<JsonString, DecodeFrameError> {
    // Inflated into the Vec's spare capacity, which zstd writes and Rust
    // reads only up to what zstd reports written: no zeroing of a buffer
    // that is about to be overwritten (a memset of the whole text, ~5% of
    // decode), and a corrupt frame still fails the same way whatever the
    // allocator left there (the fuzz target checks decode and decode_into
    // agree).
    let text = match open(frame)? {
        Payload::Json(json) => json.to_vec(),
        Payload::Zstd {
            payload,
            len,
            header,
        } => inflate_to_vec(payload, &header, len)?,
    };
    decode_bare(text)
}

/// Checks a state stored as bare JSON text, not framed (a row or envelope
/// written before frames, ADR 0141 D3), exactly as decoding checks a
/// frame's text, in the same single pass, and keeps it as a [`JsonString`].
///
/// # Errors
///
/// [`DecodeFrameError::NotUtf8`] or [`DecodeFrameError::NotJson`], as
/// [`decode`] names them.
///
/// ```
/// use pgloom_core::frame::{decode_bare, DecodeFrameError};
/// assert_eq!(decode_bare(br#"{"turn":1}"#.to_vec())?.as_str(), r#"{"turn":1}"#);
/// assert!(matches!(decode_bare(b"\xff".to_vec()), Err(DecodeFrameError::NotUtf8 { .. })));
/// assert!(matches!(decode_bare(b"{".to_vec()), Err(DecodeFrameError::NotJson(_))));
/// # Ok::<(), DecodeFrameError>(())
/// ```
pub fn decode_bare(text: Vec<u8>) -> Result<JsonString, DecodeFrameError> {
    check_text(&text)?;
    // SAFETY: check_text ran over exactly these bytes, which proved them
    // UTF-8 (and one JSON text): neither is scanned again.
    let text = unsafe { String::from_utf8_unchecked(text) };
    Ok(JsonString::validated(text))
}

/// Decodes a frame into memory the caller provides, for callers that must
/// own the result in their own allocator (the extension writes straight
/// into the `text` value Postgres returns, instead of copying a `String`).
///
/// `buffer(len)` is called once, after every check that needs no
/// inflating, with the exact length of the text; it must return a buffer of
/// exactly `len` initialized bytes. On success the buffer holds the text,
/// which is UTF-8 JSON.
///
/// # Errors
///
/// As [`decode`].
///
/// # Panics
///
/// When `buffer` returns a buffer of another length.
///
/// ```
/// use pgloom_core::frame::{decode_into, encode, Codec};
/// let frame = encode(r#"{"turn":1}"#, Codec::Zstd)?;
/// let text = decode_into(&frame, |len| vec![0u8; len])?;
/// assert_eq!(text, br#"{"turn":1}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode_into<B: AsMut<[u8]>>(
    frame: &[u8],
    buffer: impl FnOnce(usize) -> B,
) -> Result<B, DecodeFrameError> {
    let payload = open(frame)?;
    let mut out = buffer(payload.len());
    let text = out.as_mut();
    assert_eq!(
        text.len(),
        payload.len(),
        "decode_into: buffer of the wrong length"
    );
    match payload {
        Payload::Json(json) => text.copy_from_slice(json),
        Payload::Zstd {
            payload,
            len,
            header,
        } => inflate_to_slice(payload, &header, len, text)?,
    }
    check_text(text)?;
    Ok(out)
}

/// A frame's payload, checked as far as it can be without inflating.
enum Payload<'a> {
    Json(&'a [u8]),
    Zstd {
        payload: &'a [u8],
        len: usize,
        header: ZstdHeader,
    },
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Json(text) => text.len(),
            Payload::Zstd { len, .. } => *len,
        }
    }
}

fn open(frame: &[u8]) -> Result<Payload<'_>, DecodeFrameError> {
    let (&byte, payload) = frame.split_first().ok_or(DecodeFrameError::Empty)?;
    match Format::from_byte(byte) {
        Some(Format::Json) if payload.len() as u64 > MAX_DECODED_STATE_BYTES => {
            Err(DecodeFrameError::StateTooLarge {
                declared: Some(payload.len() as u64),
                limit: MAX_DECODED_STATE_BYTES,
            })
        }
        Some(Format::Json) => Ok(Payload::Json(payload)),
        Some(Format::Zstd) => {
            let (len, header) = inflated_len(payload)?;
            Ok(Payload::Zstd {
                payload,
                len,
                header,
            })
        }
        Some(Format::Delta) => Err(DecodeFrameError::DeltaBaseMissing {
            base_sequence: delta::header(frame)?.base_sequence,
        }),
        None => Err(DecodeFrameError::UnknownFormat { byte }),
    }
}

/// The checks every decoded text passes: UTF-8, then JSON.
/// One pass: the validator checks UTF-8 inside strings as it meets it. On
/// a failure the cause is named as the two separate passes named it: text
/// that is not UTF-8 anywhere is `NotUtf8`, whatever else is wrong.
fn check_text(text: &[u8]) -> Result<(), DecodeFrameError> {
    match json::validate(text) {
        Ok(()) => Ok(()),
        Err(e) if e.is_invalid_utf8() => Err(DecodeFrameError::NotUtf8 {
            valid_up_to: e.offset(),
        }),
        Err(e) => {
            std::str::from_utf8(text).map_err(not_utf8)?;
            Err(e.into())
        }
    }
}

fn not_utf8(err: std::str::Utf8Error) -> DecodeFrameError {
    DecodeFrameError::NotUtf8 {
        valid_up_to: err.valid_up_to(),
    }
}

/// The length `payload` inflates to, and its headers, which inflating
/// reads again to feed it a few blocks at a time.
#[cfg(feature = "zstd")]
fn inflated_len(payload: &[u8]) -> Result<(usize, ZstdHeader), DecodeFrameError> {
    let header = zstd_header::walk(payload)?;
    header.check_is_loom_frame()?;
    Ok((zstd_payload::inflated_len(payload, &header)?, header))
}

#[cfg(feature = "zstd")]
fn inflate_to_slice(
    payload: &[u8],
    header: &ZstdHeader,
    len: usize,
    out: &mut [u8],
) -> Result<(), DecodeFrameError> {
    zstd_payload::inflate_to_slice(payload, header, len, out)
}

#[cfg(feature = "zstd")]
fn inflate_to_vec(
    payload: &[u8],
    header: &ZstdHeader,
    len: usize,
) -> Result<Vec<u8>, DecodeFrameError> {
    zstd_payload::inflate_to_vec(payload, header, len)
}

#[cfg(not(feature = "zstd"))]
fn inflate_to_vec(_: &[u8], _: &ZstdHeader, _: usize) -> Result<Vec<u8>, DecodeFrameError> {
    Err(CodecUnavailableError.into())
}

#[cfg(not(feature = "zstd"))]
fn inflated_len(_payload: &[u8]) -> Result<(usize, ZstdHeader), DecodeFrameError> {
    Err(CodecUnavailableError.into())
}

#[cfg(not(feature = "zstd"))]
fn inflate_to_slice(
    _: &[u8],
    _: &ZstdHeader,
    _: usize,
    _: &mut [u8],
) -> Result<(), DecodeFrameError> {
    Err(CodecUnavailableError.into())
}

/// Reads what a frame's header says, without inflating it.
///
/// It walks the zstd header and block headers (O(blocks)) so that it also
/// reports a truncated frame or bytes after it, but it does not judge what a
/// decoder would refuse on policy (a missing checksum, a size over the
/// ceiling): those are what it is for reporting.
///
/// # Errors
///
/// [`DecodeFrameError::Empty`], [`DecodeFrameError::UnknownFormat`], and for
/// `0x02`: [`DecodeFrameError::NotZstd`], [`DecodeFrameError::Truncated`],
/// [`DecodeFrameError::Corrupt`] (a reserved bit or block type) and
/// [`DecodeFrameError::TrailingBytes`].
///
/// ```
/// use pgloom_core::frame::{encode, inspect, Codec, Format};
/// let state = format!("[{}]", vec!["\"same words again\""; 100].join(","));
/// let info = inspect(&encode(&state, Codec::Zstd)?)?;
/// assert_eq!(info.format, Format::Zstd);
/// assert_eq!(info.declared_bytes, Some(state.len() as u64));
/// assert!(info.has_checksum && info.stored_bytes < state.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn inspect(frame: &[u8]) -> Result<FrameInfo, DecodeFrameError> {
    let (&byte, payload) = frame.split_first().ok_or(DecodeFrameError::Empty)?;
    match Format::from_byte(byte) {
        Some(Format::Json) => Ok(FrameInfo {
            format: Format::Json,
            stored_bytes: frame.len(),
            declared_bytes: Some(payload.len() as u64),
            has_checksum: false,
        }),
        Some(Format::Zstd) => {
            let header = zstd_header::walk(payload)?;
            Ok(FrameInfo {
                format: Format::Zstd,
                stored_bytes: frame.len(),
                declared_bytes: header.content_size,
                has_checksum: header.has_checksum,
            })
        }
        Some(Format::Delta) => {
            let header = zstd_header::walk(delta::zstd_payload(frame)?)?;
            Ok(FrameInfo {
                format: Format::Delta,
                stored_bytes: frame.len(),
                declared_bytes: header.content_size,
                has_checksum: header.has_checksum,
            })
        }
        None => Err(DecodeFrameError::UnknownFormat { byte }),
    }
}

#[cfg(all(test, feature = "zstd"))]
mod tests;

#[cfg(all(test, not(feature = "zstd")))]
mod tests_without_zstd {
    use super::*;

    #[test]
    fn a_build_without_zstd_refuses_it_loudly() {
        assert!(!Codec::Zstd.is_available());
        assert_eq!(
            encode("[1]", Codec::Zstd),
            Err(EncodeFrameError::CodecUnavailable(CodecUnavailableError))
        );
        assert_eq!(
            decode(b"\x02\x28\xb5\x2f\xfd\x00"),
            Err(DecodeFrameError::CodecUnavailable(CodecUnavailableError))
        );
        assert_eq!(decode(b"\x01[1]").unwrap(), "[1]", "0x01 frames still read");
    }
}
