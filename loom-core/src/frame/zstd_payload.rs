//! zstd compression and bounded decompression of a frame's payload.
//!
//! Contexts are kept per thread: creating a level-3 compression context
//! costs more than compressing a small state, and a Postgres backend (one
//! thread) or a client worker decodes many snapshots in a row.

use std::cell::RefCell;

use zstd_safe::zstd_sys::{ZSTD_ErrorCode, ZSTD_getErrorCode};
use zstd_safe::{CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};

use super::zstd_header::ZstdHeader;
use super::{
    DecodeFrameError, EncodeFrameError, MAX_DECODED_STATE_BYTES, MAX_UNDECLARED_WINDOW_BYTES,
};

/// ADR 0141 D1: level 3, measured as the best size/speed trade for states.
const LEVEL: i32 = 3;

thread_local! {
    static COMPRESSOR: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

fn compressor() -> Result<CCtx<'static>, EncodeFrameError> {
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
pub(super) fn compress(text: &[u8], format_byte: u8) -> Result<Option<Vec<u8>>, EncodeFrameError> {
    COMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let cctx = match slot.as_mut() {
            Some(cctx) => cctx,
            None => slot.insert(compressor()?),
        };
        let mut frame = Vec::with_capacity(1 + zstd_safe::compress_bound(text.len()));
        frame.push(format_byte);
        let mut output = OutBuffer::around_pos(&mut frame, 1);
        let mut input = InBuffer::around(text);
        // One call with all the input and a compress_bound-sized output
        // ends the frame and records the content size in its header.
        let result = cctx.compress_stream2(
            &mut output,
            &mut input,
            zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end,
        );
        let failure = match result {
            Ok(0) => None,
            // Unreachable with a compress_bound-sized output, but never
            // hand out a frame zstd did not finish.
            Ok(_) => Some("the output buffer was too small"),
            Err(code) => Some(zstd_safe::get_error_name(code)),
        };
        if let Some(reason) = failure {
            // Leave the context clean for the next state.
            let _ = cctx.reset(ResetDirective::SessionOnly);
            return Err(EncodeFrameError::Compress(reason));
        }
        Ok((frame.len() - 1 < text.len()).then_some(frame))
    })
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
            None => slot.insert(DCtx::try_create().ok_or_else(|| DecodeFrameError::Corrupt {
                reason: "out of memory for a zstd context".to_owned(),
            })?),
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
    len: usize,
    out: &mut [u8],
) -> Result<(), DecodeFrameError> {
    with_decompressor(|dctx| {
        let written = dctx.decompress(out, payload).map_err(decompress_error)?;
        check_len(written, len)
    })
}

/// Inflates into a new Vec of exactly `len` bytes, written by zstd into
/// its spare capacity (nothing zeroed first).
pub(super) fn inflate_to_vec(payload: &[u8], len: usize) -> Result<Vec<u8>, DecodeFrameError> {
    let mut out = Vec::with_capacity(len);
    with_decompressor(|dctx| {
        let written = dctx
            .decompress(&mut out, payload)
            .map_err(decompress_error)?;
        check_len(written, len)
    })?;
    Ok(out)
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
    }
}
