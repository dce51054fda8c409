//! zstd compression and bounded decompression of a frame's payload.
//!
//! Contexts are kept per thread: creating a level-3 compression context
//! costs more than compressing a small state, and a Postgres backend (one
//! thread) or a client worker decodes many snapshots in a row.
//!
//! Neither direction hands libzstd a whole large state in one call (issue
//! 25): a call cannot be interrupted, and a 30 KB frame inflates to
//! 256 MiB. Text is compressed [`COMPRESS_PIECE_BYTES`] a call, and a
//! frame inflated a few blocks a call (about [`CHECK_INTERVAL`] bytes of
//! text), with an interrupt check between calls. Each context is reset
//! before the frame it starts, so one that an interrupt (an ERROR that
//! unwinds) left in the middle of a frame starts clean.

use std::cell::RefCell;

use zstd_safe::zstd_sys::{ZSTD_ErrorCode, ZSTD_getErrorCode};
use zstd_safe::{CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};

use super::zstd_header::{Blocks, ZstdHeader};
use super::{
    DecodeFrameError, EncodeFrameError, MAX_DECODED_STATE_BYTES, MAX_UNDECLARED_WINDOW_BYTES,
};
use crate::interrupt::{self, CHECK_INTERVAL};

/// ADR 0141 D1: level 3, measured as the best size/speed trade for states.
const LEVEL: i32 = 3;

thread_local! {
    static COMPRESSOR: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

fn compressor<'a>() -> Result<CCtx<'a>, EncodeFrameError> {
    let mut cctx = CCtx::try_create().ok_or(EncodeFrameError::Compress("out of memory"))?;
    for parameter in [
        CParameter::CompressionLevel(LEVEL),
        CParameter::ChecksumFlag(true),
        CParameter::ContentSizeFlag(true),
        CParameter::DictIdFlag(false),
    ] {
        cctx.set_parameter(parameter)
            .map_err(|code| EncodeFrameError::Compress(zstd_safe::get_error_name(code)))?;
    }
    Ok(cctx)
}

/// `format_byte` then one zstd frame of `text`; `None` when that would not
/// be smaller than the text itself.
pub(crate) fn compress(text: &[u8], format_byte: u8) -> Result<Option<Vec<u8>>, EncodeFrameError> {
    COMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let cctx = match slot.as_mut() {
            Some(cctx) => cctx,
            None => slot.insert(compressor()?),
        };
        // A frame an interrupt left unfinished must not colour this one.
        cctx.reset(ResetDirective::SessionOnly)
            .map_err(|code| EncodeFrameError::Compress(zstd_safe::get_error_name(code)))?;
        // Declared in the header, though zstd sees the text in pieces.
        cctx.set_pledged_src_size(Some(text.len() as u64))
            .map_err(|code| EncodeFrameError::Compress(zstd_safe::get_error_name(code)))?;
        let mut frame = Vec::with_capacity(1 + zstd_safe::compress_bound(text.len()));
        frame.push(format_byte);
        let mut output = OutBuffer::around_pos(&mut frame, 1);
        let failure = compress_pieces(cctx, text, &mut output);
        if let Some(reason) = failure {
            // Leave the context clean for the next state.
            let _ = cctx.reset(ResetDirective::SessionOnly);
            return Err(EncodeFrameError::Compress(reason));
        }
        Ok((frame.len() - 1 < text.len()).then_some(frame))
    })
}

/// How much text one compressing call takes: 1 MiB, a few milliseconds
/// at level 3 (compressing is slower per byte than the scans that check
/// every [`CHECK_INTERVAL`]). A state no larger is one call, as before:
/// in pieces, zstd copies the text into a window of its own first, which
/// cost 4% on a 600 KB state.
const COMPRESS_PIECE_BYTES: usize = 1024 * 1024;

/// Compresses `text` into `output`, [`COMPRESS_PIECE_BYTES`] a call with
/// an interrupt check between calls, and ends the frame; why it failed,
/// if it did.
fn compress_pieces(
    cctx: &mut CCtx<'_>,
    text: &[u8],
    output: &mut OutBuffer<'_, Vec<u8>>,
) -> Option<&'static str> {
    use zstd_safe::zstd_sys::ZSTD_EndDirective::{ZSTD_e_continue, ZSTD_e_end};
    let mut pieces = text.chunks(COMPRESS_PIECE_BYTES).peekable();
    loop {
        // An empty text is one call that ends the frame.
        let piece = pieces.next().unwrap_or_default();
        let last = pieces.peek().is_none();
        let mut input = InBuffer::around(piece);
        let directive = if last { ZSTD_e_end } else { ZSTD_e_continue };
        match cctx.compress_stream2(output, &mut input, directive) {
            Err(code) => return Some(zstd_safe::get_error_name(code)),
            // zstd takes all of a piece and, given the last, ends the frame
            // whenever the output has compress_bound's room; never hand
            // out a frame it did not finish.
            Ok(remaining) if input.pos() < piece.len() || (last && remaining != 0) => {
                return Some("the output buffer was too small");
            }
            Ok(_) if last => return None,
            Ok(_) => interrupt::check(),
        }
    }
}

fn decompress_error(code: usize) -> DecodeFrameError {
    // SAFETY: ZSTD_getErrorCode only classifies a result code.
    match unsafe { ZSTD_getErrorCode(code) } {
        ZSTD_ErrorCode::ZSTD_error_checksum_wrong => DecodeFrameError::ChecksumMismatch,
        ZSTD_ErrorCode::ZSTD_error_srcSize_wrong => {
            DecodeFrameError::Truncated { inside: "a block" }
        }
        _ => DecodeFrameError::Corrupt {
            reason: zstd_safe::get_error_name(code).to_owned(),
        },
    }
}

fn with_decompressor<T>(
    f: impl FnOnce(&mut DCtx<'static>) -> Result<T, DecodeFrameError>,
) -> Result<T, DecodeFrameError> {
    DECOMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let dctx = match slot.as_mut() {
            Some(dctx) => dctx,
            None => slot.insert(decompressor()?),
        };
        // Start every frame from a clean session: a corrupt frame, or one
        // decoded with the streaming API, must not colour the next.
        dctx.reset(ResetDirective::SessionOnly)
            .map_err(|code| DecodeFrameError::Corrupt {
                reason: zstd_safe::get_error_name(code).to_owned(),
            })?;
        f(dctx)
    })
}

/// The per-thread context: it inflates straight into the caller's buffer,
/// which holds the whole text (`StableOutBuffer`), so that it can be fed a
/// few blocks a call and still allocates no window of its own, whatever
/// window a frame declares (the caller's buffer is the window: hence no
/// window limit below zstd's own). What it allocates is one block's input
/// buffer, 128 KiB, for as long as the thread lives.
fn decompressor<'a>() -> Result<DCtx<'a>, DecodeFrameError> {
    let mut dctx = DCtx::try_create().ok_or_else(|| DecodeFrameError::Corrupt {
        reason: "out of memory for a zstd context".to_owned(),
    })?;
    for parameter in [
        DParameter::StableOutBuffer(true),
        DParameter::WindowLogMax(if cfg!(target_pointer_width = "64") {
            zstd_safe::WINDOWLOG_MAX_64
        } else {
            zstd_safe::WINDOWLOG_MAX_32
        }),
    ] {
        dctx.set_parameter(parameter).map_err(decompress_error)?;
    }
    Ok(dctx)
}

/// The exact length a payload whose headers [`super::zstd_header::walk`]
/// accepted inflates to: declared (already checked against the ceiling and
/// the blocks), or counted.
pub(super) fn inflated_len(payload: &[u8], header: &ZstdHeader) -> Result<usize, DecodeFrameError> {
    match header.content_size {
        Some(declared) => Ok(declared as usize),
        None => count_undeclared(&mut streaming_decompressor()?, payload),
    }
}

/// A context of its own for one streamed frame, dropped (and its window
/// freed) when the frame is counted. The per-thread context would keep the
/// window it grew for as long as the thread lives: in a Postgres backend,
/// memory a hostile row could pin outside any memory context. The window
/// is capped too, as the header walk already checked.
fn streaming_decompressor() -> Result<DCtx<'static>, DecodeFrameError> {
    let out_of_memory = || DecodeFrameError::Corrupt {
        reason: "out of memory for a zstd context".to_owned(),
    };
    let mut dctx = DCtx::try_create().ok_or_else(out_of_memory)?;
    dctx.set_parameter(DParameter::WindowLogMax(
        MAX_UNDECLARED_WINDOW_BYTES.trailing_zeros(),
    ))
    .map_err(decompress_error)?;
    Ok(dctx)
}

/// Inflates into `out`, which is exactly `len` bytes long.
pub(super) fn inflate_to_slice(
    payload: &[u8],
    header: &ZstdHeader,
    len: usize,
    out: &mut [u8],
) -> Result<(), DecodeFrameError> {
    with_decompressor(|dctx| {
        let mut output = OutBuffer::around(out);
        inflate(dctx, payload, header, &mut output)?;
        check_len(output.pos(), len)
    })
}

/// Inflates into a new Vec of exactly `len` bytes, written by zstd into
/// its spare capacity (nothing zeroed first).
pub(super) fn inflate_to_vec(
    payload: &[u8],
    header: &ZstdHeader,
    len: usize,
) -> Result<Vec<u8>, DecodeFrameError> {
    let mut out = Vec::with_capacity(len);
    with_decompressor(|dctx| {
        let mut output = OutBuffer::around(&mut out);
        inflate(dctx, payload, header, &mut output)?;
        check_len(output.pos(), len)
    })?;
    Ok(out)
}

/// Feeds the frame to `dctx` whole blocks at a time, each batch ending
/// with the block that may bring its text to [`CHECK_INTERVAL`] bytes (a
/// block makes at most 128 KiB), so that zstd decodes every block straight
/// from `payload` and a call does a bounded amount of work, with an
/// interrupt check after it. A frame of a few such blocks is one call, as
/// before.
fn inflate<C: zstd_safe::WriteBuf + ?Sized>(
    dctx: &mut DCtx<'_>,
    payload: &[u8],
    header: &ZstdHeader,
    output: &mut OutBuffer<'_, C>,
) -> Result<(), DecodeFrameError> {
    let mut blocks = Blocks::of(payload, header);
    let mut fed = 0;
    loop {
        let mut end = payload.len();
        let mut batch: u64 = 0;
        for block in &mut blocks {
            let block = block?;
            batch += block.regenerated;
            // The last block's batch takes the checksum too.
            if !block.last && batch >= CHECK_INTERVAL as u64 {
                end = block.end;
                break;
            }
        }
        let mut input = InBuffer::around(&payload[..end]);
        input.set_pos(fed);
        let remaining = dctx
            .decompress_stream(output, &mut input)
            .map_err(decompress_error)?;
        fed = input.pos();
        if remaining == 0 {
            // The header walk refused anything after the frame.
            return Ok(());
        }
        if end == payload.len() {
            // zstd wants more than the whole frame.
            return Err(DecodeFrameError::Truncated { inside: "a block" });
        }
        interrupt::check();
    }
}

/// zstd refuses a frame whose content size disagrees with its data, and an
/// output buffer of exactly `len` bytes cannot take more: this only turns
/// a short frame into an error instead of a short text.
fn check_len(written: usize, len: usize) -> Result<(), DecodeFrameError> {
    if written == len {
        Ok(())
    } else {
        Err(DecodeFrameError::Corrupt {
            reason: format!("the frame declares {len} bytes but inflates to {written}"),
        })
    }
}

/// No declared size: inflate once into a small scratch buffer only to count
/// (and checksum) the text, stopping at the ceiling, so that the caller can
/// then allocate exactly that much. Growing a buffer instead would hold the
/// old and the new allocation at once, half again over the ceiling. loom
/// always declares the size, so only foreign frames pay the second pass.
fn count_undeclared(dctx: &mut DCtx<'_>, payload: &[u8]) -> Result<usize, DecodeFrameError> {
    let mut scratch = vec![0u8; 256 * 1024];
    let mut input = InBuffer::around(payload);
    let mut total: u64 = 0;
    loop {
        let mut output = OutBuffer::around(scratch.as_mut_slice());
        let remaining = dctx
            .decompress_stream(&mut output, &mut input)
            .map_err(decompress_error)?;
        total += output.pos() as u64;
        if total > MAX_DECODED_STATE_BYTES {
            return Err(DecodeFrameError::StateTooLarge {
                declared: None,
                limit: MAX_DECODED_STATE_BYTES,
            });
        }
        if remaining == 0 {
            return Ok(total as usize);
        }
        if output.pos() == 0 && input.pos == payload.len() {
            return Err(DecodeFrameError::Truncated { inside: "a block" });
        }
        interrupt::check();
    }
}

/// `header` then one zstd frame of `text` compressed against `prefix` (a
/// delta frame: [`super::delta`]), in a context of its own, which the
/// prefix outlives and which is dropped with it. Level 3 like every
/// frame, with a window that reaches from the end of the text back over
/// the whole prefix, so that anything the prefix holds is a match.
pub(super) fn compress_with_prefix(
    text: &[u8],
    prefix: &[u8],
    header: &[u8],
) -> Result<Vec<u8>, EncodeFrameError> {
    let failed = |code| EncodeFrameError::Compress(zstd_safe::get_error_name(code));
    let mut cctx = compressor()?;
    let reach = (prefix.len() + text.len()).max(1).next_power_of_two();
    let window_log = reach
        .trailing_zeros()
        .clamp(zstd_safe::WINDOWLOG_MIN, DELTA_WINDOW_LOG_MAX);
    cctx.set_parameter(CParameter::WindowLog(window_log))
        .map_err(failed)?;
    // Level 3 indexes only the last 1 MiB of a prefix; long-distance
    // matching indexes all of it, so a state past that size still finds
    // its keyframe's start (its table bounded: 2^20 entries, 8 MiB).
    if prefix.len() > DICTIONARY_REACH {
        for parameter in [
            CParameter::EnableLongDistanceMatching(true),
            CParameter::LdmHashLog(20),
        ] {
            cctx.set_parameter(parameter).map_err(failed)?;
        }
    }
    cctx.set_pledged_src_size(Some(text.len() as u64))
        .map_err(failed)?;
    cctx.ref_prefix(prefix).map_err(failed)?;
    let mut frame = Vec::with_capacity(header.len() + zstd_safe::compress_bound(text.len()));
    frame.extend_from_slice(header);
    let mut output = OutBuffer::around_pos(&mut frame, header.len());
    match compress_pieces(&mut cctx, text, &mut output) {
        Some(reason) => Err(EncodeFrameError::Compress(reason)),
        None => Ok(frame),
    }
}

/// How much of a prefix level 3's own match finder indexes: its last
/// 1 MiB (`1 << max(hashLog + 3, chainLog + 1)` in zstd's dictionary
/// loading).
const DICTIONARY_REACH: usize = 1 << 20;

/// The largest window a delta frame is written with: 512 MiB, which
/// covers a prefix and a text of 256 MiB each. The decoder allocates no
/// window (it inflates into the caller's buffer and reads the prefix
/// where it lies), so this bounds no memory of its own.
pub(super) const DELTA_WINDOW_LOG_MAX: u32 = 29;

/// Inflates a delta frame's zstd `payload` (headers already walked and
/// checked) against `prefix` into a new Vec of exactly `len` bytes, a few
/// blocks a call with interrupt checks, in a context of its own.
pub(super) fn inflate_with_prefix(
    payload: &[u8],
    header: &ZstdHeader,
    len: usize,
    prefix: &[u8],
) -> Result<Vec<u8>, DecodeFrameError> {
    let mut dctx = decompressor()?;
    dctx.ref_prefix(prefix).map_err(decompress_error)?;
    let mut out = Vec::with_capacity(len);
    let mut output = OutBuffer::around(&mut out);
    inflate(&mut dctx, payload, header, &mut output)?;
    check_len(output.pos(), len)?;
    Ok(out)
}
