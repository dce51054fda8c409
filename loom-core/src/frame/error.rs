//! The codec's typed errors: one variant per cause, so that callers (and
//! the extension, which gives each its own SQLSTATE) can tell them apart
//! without reading messages.

use std::fmt;

use crate::json::InvalidJsonError;

/// This build of loom cannot write or read zstd frames: it was built
/// without the `zstd` cargo feature.
///
/// Asking for zstd then fails loudly; it never falls back to writing JSON,
/// so an operator who asked for compression does not find out from a bill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("zstd snapshot frames need a loom built with the `zstd` feature; build with it, or leave the codec off")]
pub struct CodecUnavailableError;

/// A codec name that is not `"none"`, `"zstd"` or `"delta"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown snapshot codec {name:?}: expected \"none\", \"zstd\" or \"delta\"")]
pub struct ParseCodecError {
    name: String,
}

impl ParseCodecError {
    pub(crate) fn new(name: &str) -> Self {
        ParseCodecError {
            name: name.to_owned(),
        }
    }

    /// The name that was given.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why a state could not be framed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeFrameError {
    /// The state is not one JSON text.
    #[error("snapshot state is not JSON: {0}")]
    NotJson(#[from] InvalidJsonError),
    /// The state is longer than any reader accepts.
    #[error("snapshot state too large: {bytes} bytes of JSON, over the {limit}-byte limit")]
    StateTooLarge {
        /// The state's length in bytes.
        bytes: u64,
        /// [`MAX_DECODED_STATE_BYTES`](super::MAX_DECODED_STATE_BYTES).
        limit: u64,
    },
    /// The codec is not in this build.
    #[error(transparent)]
    CodecUnavailable(#[from] CodecUnavailableError),
    /// zstd failed to compress (it only does so when out of memory).
    #[error("zstd failed to compress the snapshot state: {0}")]
    Compress(&'static str),
    /// The keyframe a delta was to be written against does not decode
    /// ([`delta::KeyframePolicy::encode_against`](super::delta::KeyframePolicy::encode_against)):
    /// never a delta against it.
    #[error("the keyframe to write a delta against does not decode: {0}")]
    Keyframe(DecodeFrameError),
}

/// What follows a frame that should have ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrailingKind {
    /// A second zstd frame (the library would decode both, silently).
    ZstdFrame,
    /// A zstd skippable frame.
    SkippableFrame,
    /// Anything else.
    Bytes,
}

impl fmt::Display for TrailingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrailingKind::ZstdFrame => "a second zstd frame",
            TrailingKind::SkippableFrame => "a skippable frame",
            TrailingKind::Bytes => "trailing bytes",
        })
    }
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeFrameError {
    /// Zero bytes: not even a format byte.
    #[error("empty snapshot frame: a frame starts with a format byte")]
    Empty,
    /// A format byte this loom does not know.
    #[error("unknown snapshot frame format byte 0x{byte:02x}: written by a newer loom? this one reads 0x01 (json), 0x02 (zstd) and 0x03 (delta)")]
    UnknownFormat {
        /// The byte.
        byte: u8,
    },
    /// A `0x02` payload that does not start with a zstd frame.
    #[error("snapshot frame 0x02 does not hold a zstd frame: {found}")]
    NotZstd {
        /// What it starts with instead.
        found: &'static str,
    },
    /// A zstd frame without a content checksum: loom always writes one, so
    /// corruption of this frame could not be detected.
    #[error(
        "zstd frame has no content checksum: loom always writes one, so the frame is not loom's"
    )]
    MissingChecksum,
    /// A zstd frame that declares no content size and a window larger than
    /// [`MAX_UNDECLARED_WINDOW_BYTES`](super::MAX_UNDECLARED_WINDOW_BYTES):
    /// inflating it would allocate that window. loom declares the size of
    /// every frame it writes, and its level-3 windows are far smaller.
    #[error("zstd frame declares no content size and a {window}-byte window, over the {limit}-byte limit for such frames: loom always declares the size")]
    WindowTooLarge {
        /// The window the frame header asks for.
        window: u64,
        /// [`MAX_UNDECLARED_WINDOW_BYTES`](super::MAX_UNDECLARED_WINDOW_BYTES).
        limit: u64,
    },
    /// A zstd frame that needs a dictionary: loom never uses one.
    #[error("zstd frame needs dictionary {id}: loom never writes one, so the frame is not loom's")]
    DictionaryRequired {
        /// The dictionary id in the frame header.
        id: u32,
    },
    /// Something follows the one zstd frame a loom frame holds.
    #[error("{kind} after the zstd frame ({count} bytes at offset {offset}): a loom frame holds exactly one zstd frame")]
    TrailingBytes {
        /// What it looks like.
        kind: TrailingKind,
        /// Where, counted from the start of the zstd frame.
        offset: usize,
        /// How many bytes follow.
        count: usize,
    },
    /// The frame ends before its header, a block or its checksum does.
    #[error("snapshot frame is truncated: it ends inside {inside}")]
    Truncated {
        /// Which part it ends inside.
        inside: &'static str,
    },
    /// The content checksum does not match the inflated text.
    #[error("snapshot frame content checksum mismatch: the stored bytes are corrupt")]
    ChecksumMismatch,
    /// zstd refused the frame's data as malformed.
    #[error("snapshot frame is corrupt: {reason}")]
    Corrupt {
        /// What zstd or the header walk found.
        reason: String,
    },
    /// The state would be larger than [`MAX_DECODED_STATE_BYTES`](super::MAX_DECODED_STATE_BYTES).
    #[error("snapshot state too large: {} over the {limit}-byte limit", match .declared { Some(n) => format!("the frame declares {n} bytes,"), None => "the frame declares no size and inflated".to_owned() })]
    StateTooLarge {
        /// The size the frame declares, if it declares one.
        declared: Option<u64>,
        /// The ceiling.
        limit: u64,
    },
    /// The payload is not UTF-8.
    #[error("snapshot frame payload is not UTF-8: invalid byte at offset {valid_up_to}")]
    NotUtf8 {
        /// The length of the longest valid UTF-8 prefix.
        valid_up_to: usize,
    },
    /// The payload is UTF-8 but not JSON.
    #[error("snapshot frame payload is not JSON: {0}")]
    NotJson(#[from] InvalidJsonError),
    /// A `0x02` frame in a build without the `zstd` feature.
    #[error(transparent)]
    CodecUnavailable(#[from] CodecUnavailableError),
    /// A delta frame (`0x03`) read without the keyframe it names: it
    /// decodes only with that keyframe's text.
    #[error("snapshot frame 0x03 is a delta against the keyframe at sequence {base_sequence}, which is missing: a delta decodes only with its keyframe")]
    DeltaBaseMissing {
        /// The sequence of the keyframe the delta names.
        base_sequence: i64,
    },
    /// The keyframe given for a delta is not the one it was written
    /// against (another execution's, or one saved over since): its length
    /// or its content hash differs.
    #[error("the keyframe given for this delta (sequence {base_sequence}) is not the one it was written against: another execution's, or saved over since")]
    DeltaBaseMismatch {
        /// The sequence of the keyframe the delta names.
        base_sequence: i64,
    },
    /// The keyframe given for a delta does not decode.
    #[error("the keyframe of this delta (sequence {base_sequence}) does not decode: {cause}")]
    DeltaBaseCorrupt {
        /// The sequence of the keyframe the delta names.
        base_sequence: i64,
        /// Why the keyframe does not decode.
        cause: Box<DecodeFrameError>,
    },
    /// The keyframe given for a delta is itself a delta: a delta names a
    /// keyframe (`0x01` or `0x02`), never a chain, so a read costs at most
    /// two decodes.
    #[error("the keyframe given for this delta (sequence {base_sequence}) is itself a delta: a delta names a keyframe (0x01 or 0x02), never another delta")]
    DeltaOfDelta {
        /// The sequence of the keyframe the delta names.
        base_sequence: i64,
    },
}
