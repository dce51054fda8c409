//! Delta frames (`0x03`): a state compressed against a keyframe of the same
//! execution, so that a run saved after every turn stores each turn's
//! change, not the whole state again.
//!
//! ```text
//! 0x03                       format byte
//! base_sequence   i64 BE     the keyframe's sequence (same execution)
//! base_bytes      u64 BE     the keyframe's text length
//! base_xxh64      u64 BE     XXH64 of the keyframe's text
//! zstd frame                 the text, level 3, with the keyframe's text as
//!                            its prefix (ZSTD_refPrefix): content size,
//!                            content checksum, no dictionary id
//! ```
//!
//! A delta names a *keyframe*, a `0x01` or `0x02` frame, never another
//! delta: the latest state costs one keyframe decode and one delta decode,
//! whatever the run's length. The base is named by sequence (where to find
//! it) and by content (its length and hash), so that a wrong base (another
//! execution's, one saved over since, a delta) is a typed error before a
//! byte is inflated, never a wrong text. The writer decides when to start a
//! new keyframe ([`KeyframePolicy`]).
//!
//! Memory is bounded as for every frame: the text and the keyframe's text
//! each at most [`MAX_DECODED_STATE_BYTES`]; zstd inflates into the
//! output and reads the prefix where it lies, allocating no window.
//!
//! ```
//! use pgloom_core::frame::delta::{decode_with_base, encode_delta, Keyframe};
//! use pgloom_core::frame::{encode, Codec};
//! let turn_1 = r#"{"turns":["plan the search, then read each page"]}"#;
//! let turn_2 = r#"{"turns":["plan the search, then read each page","read page 1"]}"#;
//! let keyframe = encode(turn_1, Codec::Zstd)?;
//! let delta = encode_delta(turn_2, Keyframe { sequence: 1, text: turn_1 })?;
//! assert_eq!(delta[0], 0x03);
//! assert_eq!(decode_with_base(&delta, Some(&keyframe))?, turn_2);
//! // Without its keyframe, or with another, it is an error, never a text.
//! assert!(decode_with_base(&delta, None).is_err());
//! assert!(decode_with_base(&delta, Some(&encode("[]", Codec::None)?)).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::{open, DecodeFrameError, EncodeFrameError, Format, Payload, MAX_DECODED_STATE_BYTES};
use crate::json::{self, JsonString};
use crate::xxh64::xxh64;

/// The bytes before a delta's zstd frame: the format byte, the keyframe's
/// sequence, length and hash.
pub const HEADER_BYTES: usize = 25;

/// What a delta frame says of the keyframe it was written against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaHeader {
    /// The keyframe's sequence, in the same execution.
    pub base_sequence: i64,
    /// The keyframe's text length.
    pub base_bytes: u64,
    /// XXH64 of the keyframe's text.
    pub base_xxh64: u64,
}

/// A keyframe a delta is written against: its sequence and its text.
#[derive(Debug, Clone, Copy)]
pub struct Keyframe<'a> {
    /// The keyframe's sequence.
    pub sequence: i64,
    /// The keyframe's JSON text, as it decodes.
    pub text: &'a str,
}

/// Reads a delta frame's header.
///
/// # Errors
///
/// [`DecodeFrameError::Empty`], [`DecodeFrameError::UnknownFormat`] when
/// the frame is not `0x03`, [`DecodeFrameError::Truncated`] when it ends
/// inside the header, [`DecodeFrameError::StateTooLarge`] when it names a
/// keyframe over the ceiling.
///
/// ```
/// use pgloom_core::frame::delta::{encode_delta, header, Keyframe};
/// let delta = encode_delta("[1,2]", Keyframe { sequence: 7, text: "[1]" })?;
/// assert_eq!(header(&delta)?.base_sequence, 7);
/// assert_eq!(header(&delta)?.base_bytes, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn header(frame: &[u8]) -> Result<DeltaHeader, DecodeFrameError> {
    let (&byte, _) = frame.split_first().ok_or(DecodeFrameError::Empty)?;
    if Format::from_byte(byte) != Some(Format::Delta) {
        return Err(DecodeFrameError::UnknownFormat { byte });
    }
    let head = frame
        .get(..HEADER_BYTES)
        .ok_or(DecodeFrameError::Truncated {
            inside: "the delta header",
        })?;
    let word = |at: usize| u64::from_be_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let header = DeltaHeader {
        base_sequence: word(1) as i64,
        base_bytes: word(9),
        base_xxh64: word(17),
    };
    if header.base_bytes > MAX_DECODED_STATE_BYTES {
        return Err(DecodeFrameError::StateTooLarge {
            declared: Some(header.base_bytes),
            limit: MAX_DECODED_STATE_BYTES,
        });
    }
    Ok(header)
}

/// The sequence of the keyframe `frame` names, if it is a delta: what a
/// reader fetches beside it. `None` for any other frame, a malformed one
/// included (decoding it says what is wrong).
///
/// ```
/// use pgloom_core::frame::delta::{base_sequence, encode_delta, Keyframe};
/// let delta = encode_delta("[1,2]", Keyframe { sequence: 7, text: "[1]" })?;
/// assert_eq!(base_sequence(&delta), Some(7));
/// assert_eq!(base_sequence(b"\x01[1]"), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub fn base_sequence(frame: &[u8]) -> Option<i64> {
    header(frame).ok().map(|h| h.base_sequence)
}

/// The zstd frame after a delta's header.
pub(super) fn zstd_payload(frame: &[u8]) -> Result<&[u8], DecodeFrameError> {
    header(frame)?;
    Ok(&frame[HEADER_BYTES..])
}

/// Frames `json` as a delta against `keyframe`.
///
/// # Errors
///
/// [`EncodeFrameError::NotJson`]; [`EncodeFrameError::StateTooLarge`] for
/// a text or a keyframe text over [`MAX_DECODED_STATE_BYTES`];
/// [`EncodeFrameError::CodecUnavailable`] without the `zstd` feature;
/// [`EncodeFrameError::Compress`].
pub fn encode_delta(json: &str, keyframe: Keyframe<'_>) -> Result<Vec<u8>, EncodeFrameError> {
    for bytes in [json.len(), keyframe.text.len()] {
        if bytes as u64 > MAX_DECODED_STATE_BYTES {
            return Err(EncodeFrameError::StateTooLarge {
                bytes: bytes as u64,
                limit: MAX_DECODED_STATE_BYTES,
            });
        }
    }
    json::validate(json.as_bytes())?;
    let mut head = Vec::with_capacity(HEADER_BYTES);
    head.push(Format::Delta.byte());
    head.extend_from_slice(&keyframe.sequence.to_be_bytes());
    head.extend_from_slice(&(keyframe.text.len() as u64).to_be_bytes());
    head.extend_from_slice(&xxh64(keyframe.text.as_bytes()).to_be_bytes());
    compress(json.as_bytes(), keyframe.text.as_bytes(), &head)
}

#[cfg(feature = "zstd")]
fn compress(text: &[u8], prefix: &[u8], head: &[u8]) -> Result<Vec<u8>, EncodeFrameError> {
    super::zstd_payload::compress_with_prefix(text, prefix, head)
}

#[cfg(not(feature = "zstd"))]
fn compress(_: &[u8], _: &[u8], _: &[u8]) -> Result<Vec<u8>, EncodeFrameError> {
    Err(super::CodecUnavailableError.into())
}

/// Decodes any frame: a keyframe (`0x01`, `0x02`) as [`super::decode`]
/// does, `base` unused; a delta against `base`, the frame of the keyframe
/// it names, as stored.
///
/// # Errors
///
/// What [`super::decode`] names, and for a delta:
/// [`DecodeFrameError::DeltaBaseMissing`] (no `base`),
/// [`DecodeFrameError::DeltaOfDelta`] (`base` is a delta),
/// [`DecodeFrameError::DeltaBaseMismatch`] (`base` is not the keyframe it
/// was written against), or why `base` itself does not decode.
pub fn decode_with_base(frame: &[u8], base: Option<&[u8]>) -> Result<String, DecodeFrameError> {
    decode_json_with_base(frame, base).map(JsonString::into_string)
}

/// [`decode_with_base`], into a [`JsonString`].
///
/// # Errors
///
/// As [`decode_with_base`].
pub fn decode_json_with_base(
    frame: &[u8],
    base: Option<&[u8]>,
) -> Result<JsonString, DecodeFrameError> {
    if frame.first() != Some(&Format::Delta.byte()) {
        return super::decode_json(frame);
    }
    let header = header(frame)?;
    let base_sequence = header.base_sequence;
    // The delta's own zstd frame is walked first, the cheapest refusal:
    // a malformed delta never costs its keyframe's inflation.
    let payload = &frame[HEADER_BYTES..];
    let zstd = walk(payload)?;
    let base = base.ok_or(DecodeFrameError::DeltaBaseMissing { base_sequence })?;
    if base.first() == Some(&Format::Delta.byte()) {
        return Err(DecodeFrameError::DeltaOfDelta { base_sequence });
    }
    let corrupt = |cause| DecodeFrameError::DeltaBaseCorrupt {
        base_sequence,
        cause: Box::new(cause),
    };
    // Checked against the header before the keyframe is inflated: a
    // keyframe of another length is the wrong one, whatever it holds.
    let base_text = match open(base).map_err(corrupt)? {
        Payload::Json(text) => std::borrow::Cow::Borrowed(text),
        Payload::Zstd { len, .. } if len as u64 != header.base_bytes => {
            return Err(DecodeFrameError::DeltaBaseMismatch { base_sequence })
        }
        Payload::Zstd {
            payload,
            len,
            header: zstd,
        } => std::borrow::Cow::Owned(super::inflate_to_vec(payload, &zstd, len).map_err(corrupt)?),
    };
    if base_text.len() as u64 != header.base_bytes || xxh64(&base_text) != header.base_xxh64 {
        return Err(DecodeFrameError::DeltaBaseMismatch { base_sequence });
    }
    let text = inflate(payload, &zstd, &base_text)?;
    super::decode_bare(text)
}

/// A delta's zstd frame, walked and checked as a `0x02` one is, and with
/// its size declared: counting an undeclared one would inflate without the
/// prefix, which no real delta survives.
#[cfg(feature = "zstd")]
fn walk(payload: &[u8]) -> Result<super::zstd_header::ZstdHeader, DecodeFrameError> {
    let zstd = super::zstd_header::walk(payload)?;
    zstd.check_is_loom_frame()?;
    if zstd.content_size.is_none() {
        return Err(DecodeFrameError::Corrupt {
            reason: "a delta's zstd frame declares no content size: loom always declares it"
                .to_owned(),
        });
    }
    Ok(zstd)
}

#[cfg(not(feature = "zstd"))]
fn walk(_: &[u8]) -> Result<super::zstd_header::ZstdHeader, DecodeFrameError> {
    Err(super::CodecUnavailableError.into())
}

#[cfg(feature = "zstd")]
fn inflate(
    payload: &[u8],
    header: &super::zstd_header::ZstdHeader,
    prefix: &[u8],
) -> Result<Vec<u8>, DecodeFrameError> {
    let len = super::zstd_payload::inflated_len(payload, header)?;
    super::zstd_payload::inflate_with_prefix(payload, header, len, prefix)
}

#[cfg(not(feature = "zstd"))]
fn inflate(
    _: &[u8],
    _: &super::zstd_header::ZstdHeader,
    _: &[u8],
) -> Result<Vec<u8>, DecodeFrameError> {
    Err(super::CodecUnavailableError.into())
}

/// When a delta store writes a keyframe (`0x02`) instead of a delta.
///
/// A delta against a keyframe holds every change since that keyframe, so
/// deltas grow as a run moves away from it; a keyframe costs the whole
/// state. The store writes a keyframe when the execution has none, after
/// [`max_deltas`](Self::max_deltas) deltas against the current one, or
/// when a delta comes out larger than
/// [`max_delta_percent`](Self::max_delta_percent) of what a keyframe of the
/// state would be (estimated from the current keyframe's compression).
/// The defaults are measured (docs/benchmarks.md, delta snapshots).
///
/// ```
/// use pgloom_core::frame::delta::KeyframePolicy;
/// let policy = KeyframePolicy::default();
/// assert!(policy.max_deltas > 0 && policy.max_delta_percent > 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyframePolicy {
    /// The most deltas written against one keyframe.
    pub max_deltas: u32,
    /// A delta larger than this percent of the estimated keyframe is
    /// replaced by a keyframe.
    pub max_delta_percent: u32,
}

impl Default for KeyframePolicy {
    fn default() -> Self {
        KeyframePolicy {
            max_deltas: 16,
            max_delta_percent: 40,
        }
    }
}

impl KeyframePolicy {
    /// Whether a delta may be tried at all: the keyframe has taken fewer
    /// than [`max_deltas`](Self::max_deltas) deltas.
    #[must_use]
    pub fn allows_delta(&self, deltas_since_keyframe: u32) -> bool {
        deltas_since_keyframe < self.max_deltas
    }

    /// Whether a delta of `delta_bytes` for a text of `text_bytes` is kept,
    /// given the keyframe it was written against (`keyframe_frame_bytes`
    /// stored, `keyframe_text_bytes` of text): a keyframe of the new text
    /// is estimated at the keyframe's own ratio.
    #[must_use]
    pub fn keeps_delta(
        &self,
        delta_bytes: usize,
        text_bytes: usize,
        keyframe_frame_bytes: usize,
        keyframe_text_bytes: usize,
    ) -> bool {
        let estimated =
            keyframe_frame_bytes as u128 * text_bytes as u128 / keyframe_text_bytes.max(1) as u128;
        (delta_bytes as u128) * 100 <= estimated * u128::from(self.max_delta_percent)
    }
}

/// The keyframe a delta store writes the next save against: the latest
/// keyframe of the execution before the save, as the store holds it.
#[derive(Debug, Clone, Copy)]
pub struct KeyframeBase<'a> {
    /// Its sequence and text.
    pub keyframe: Keyframe<'a>,
    /// Its frame's stored length: with the text's length, the ratio a
    /// keyframe of the new state is estimated at.
    pub frame_bytes: usize,
    /// How many deltas name it already.
    pub deltas_since: u32,
}

/// The keyframe a delta store writes the next save against, as stored:
/// [`KeyframePolicy::encode_against`] decodes it only when a delta may be
/// written.
#[derive(Debug, Clone, Copy)]
pub struct StoredKeyframe<'a> {
    /// Its sequence.
    pub sequence: i64,
    /// Its frame (`0x01` or `0x02`).
    pub frame: &'a [u8],
    /// How many deltas name it already.
    pub deltas_since: u32,
}

impl KeyframePolicy {
    /// [`KeyframePolicy::encode`] against a keyframe as stored, decoded
    /// here only when the policy allows a delta at all.
    ///
    /// ```
    /// use pgloom_core::frame::delta::{KeyframePolicy, StoredKeyframe};
    /// use pgloom_core::frame::{encode, Codec};
    /// let policy = KeyframePolicy::default();
    /// let keyframe = encode(r#"{"turns":["a"]}"#, Codec::Zstd)?;
    /// let next = policy.encode_against(
    ///     r#"{"turns":["a","b"]}"#,
    ///     Some(StoredKeyframe { sequence: 1, frame: &keyframe, deltas_since: 0 }),
    /// )?;
    /// // A delta of so small a state would not be smaller: a keyframe.
    /// assert_eq!(next, encode(r#"{"turns":["a","b"]}"#, Codec::Zstd)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`EncodeFrameError::Keyframe`] when the keyframe is a delta
    /// ([`DecodeFrameError::DeltaOfDelta`]) or does not decode; what
    /// [`KeyframePolicy::encode`] names.
    pub fn encode_against(
        &self,
        json: &str,
        keyframe: Option<StoredKeyframe<'_>>,
    ) -> Result<Vec<u8>, EncodeFrameError> {
        let Some(stored) = keyframe.filter(|k| self.allows_delta(k.deltas_since)) else {
            return self.encode(json, None);
        };
        if stored.frame.first() == Some(&Format::Delta.byte()) {
            return Err(EncodeFrameError::Keyframe(DecodeFrameError::DeltaOfDelta {
                base_sequence: stored.sequence,
            }));
        }
        let text = super::decode(stored.frame).map_err(EncodeFrameError::Keyframe)?;
        self.encode(
            json,
            Some(KeyframeBase {
                keyframe: Keyframe {
                    sequence: stored.sequence,
                    text: &text,
                },
                frame_bytes: stored.frame.len(),
                deltas_since: stored.deltas_since,
            }),
        )
    }

    /// Frames the next save of a delta store: a delta against `base` when
    /// the policy keeps one, else a keyframe (`0x02`, or `0x01` when zstd
    /// would not make the text smaller). The one decision every writer of
    /// deltas makes (pgloom's stores, `loom_save_snapshot(..., 'delta')`).
    ///
    /// ```
    /// use pgloom_core::frame::delta::{Keyframe, KeyframeBase, KeyframePolicy};
    /// use pgloom_core::frame::{encode, Codec, Format};
    /// let run = |turns: u32| {
    ///     let said: Vec<String> = (1..=turns)
    ///         .map(|t| format!(r#""turn {t}: read page {t}, found {} matches""#, t * 7 % 13))
    ///         .collect();
    ///     format!(r#"{{"turns":[{}]}}"#, said.join(","))
    /// };
    /// let policy = KeyframePolicy::default();
    /// let (first, second) = (run(40), run(41));
    /// // No keyframe yet: the save is one, as codec zstd writes it.
    /// let keyframe = policy.encode(&first, None)?;
    /// assert_eq!(keyframe, encode(&first, Codec::Zstd)?);
    /// let base = KeyframeBase {
    ///     keyframe: Keyframe { sequence: 1, text: &first },
    ///     frame_bytes: keyframe.len(),
    ///     deltas_since: 0,
    /// };
    /// let next = policy.encode(&second, Some(base))?;
    /// assert_eq!(next[0], Format::Delta.byte());
    /// assert!(next.len() < keyframe.len() / 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What [`encode_delta`] and [`super::encode`] name.
    pub fn encode(
        &self,
        json: &str,
        base: Option<KeyframeBase<'_>>,
    ) -> Result<Vec<u8>, EncodeFrameError> {
        if let Some(base) = base.filter(|b| self.allows_delta(b.deltas_since)) {
            let delta = encode_delta(json, base.keyframe)?;
            if self.keeps_delta(
                delta.len(),
                json.len(),
                base.frame_bytes,
                base.keyframe.text.len(),
            ) {
                return Ok(delta);
            }
        }
        super::encode(json, super::Codec::Zstd)
    }
}

#[cfg(all(test, feature = "zstd"))]
mod tests;
