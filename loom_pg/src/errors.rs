//! Every codec error becomes an ERROR with its own SQLSTATE and pgloom-core's
//! message, so that a caller can match on the code and a human reads the
//! cause. Never a panic message, never a crashed backend, never a Rust
//! backtrace ([`keep_backtraces_out_of_errors`]).

use pgloom_core::frame::{DecodeFrameError, EncodeFrameError, ParseCodecError};
use pgrx::prelude::*;
use pgrx::{PgSqlErrorCode, PgSqlErrorCode::*};

/// The SQLSTATE of each way a frame can fail to decode.
pub(crate) fn decode_sqlstate(err: &DecodeFrameError) -> PgSqlErrorCode {
    match err {
        DecodeFrameError::UnknownFormat { .. } | DecodeFrameError::CodecUnavailable(_) => {
            ERRCODE_FEATURE_NOT_SUPPORTED
        }
        DecodeFrameError::Empty
        | DecodeFrameError::NotZstd { .. }
        | DecodeFrameError::MissingChecksum
        | DecodeFrameError::DictionaryRequired { .. }
        | DecodeFrameError::TrailingBytes { .. } => ERRCODE_INVALID_BINARY_REPRESENTATION,
        DecodeFrameError::Truncated { .. }
        | DecodeFrameError::ChecksumMismatch
        | DecodeFrameError::Corrupt { .. }
        | DecodeFrameError::DeltaBaseMissing { .. }
        | DecodeFrameError::DeltaBaseMismatch { .. } => ERRCODE_DATA_CORRUPTED,
        // The keyframe's own cause decides, as if it had been read alone.
        DecodeFrameError::DeltaBaseCorrupt { cause, .. } => decode_sqlstate(cause),
        DecodeFrameError::DeltaOfDelta { .. } => ERRCODE_INVALID_BINARY_REPRESENTATION,
        DecodeFrameError::StateTooLarge { .. } | DecodeFrameError::WindowTooLarge { .. } => {
            ERRCODE_PROGRAM_LIMIT_EXCEEDED
        }
        DecodeFrameError::NotUtf8 { .. } => ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
        DecodeFrameError::NotJson(_) => ERRCODE_INVALID_TEXT_REPRESENTATION,
        // A cause added to pgloom-core later still carries its own message.
        _ => ERRCODE_DATA_EXCEPTION,
    }
}

/// The SQLSTATE of each way a state can fail to be framed.
pub(crate) fn encode_sqlstate(err: &EncodeFrameError) -> PgSqlErrorCode {
    match err {
        EncodeFrameError::NotJson(_) => ERRCODE_INVALID_TEXT_REPRESENTATION,
        EncodeFrameError::StateTooLarge { .. } => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        EncodeFrameError::CodecUnavailable(_) => ERRCODE_FEATURE_NOT_SUPPORTED,
        EncodeFrameError::Compress(_) => ERRCODE_OUT_OF_MEMORY,
        _ => ERRCODE_INTERNAL_ERROR,
    }
}

fn hint(err: &DecodeFrameError) -> Option<&'static str> {
    match err {
        DecodeFrameError::UnknownFormat { .. } => {
            Some("upgrade loom on this server before reading frames a newer loom wrote")
        }
        DecodeFrameError::StateTooLarge { .. } => {
            Some("loom refuses states over 256 MiB so that a tampered row cannot exhaust memory")
        }
        DecodeFrameError::WindowTooLarge { .. } => Some(
            "loom refuses frames without a declared size whose window would be allocated outside PostgreSQL's memory accounting",
        ),
        DecodeFrameError::DeltaBaseMissing { .. } | DecodeFrameError::DeltaBaseMismatch { .. } => {
            Some("a delta decodes only with the keyframe it names, of the same execution: restore that keyframe from a backup, or re-save the snapshot")
        }
        _ => None,
    }
}

/// Raises a decode error as an ERROR.
pub(crate) fn raise_decode(err: DecodeFrameError) -> ! {
    let report = pgrx::pg_sys::panic::ErrorReport::new(
        decode_sqlstate(&err),
        err.to_string(),
        pgrx::function_name!(),
    );
    let report = match hint(&err) {
        Some(hint) => report.set_hint(hint),
        None => report,
    };
    report.report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// Raises an encode error as an ERROR.
pub(crate) fn raise_encode(err: EncodeFrameError) -> ! {
    if let EncodeFrameError::Keyframe(cause) = err {
        // The keyframe's own error, with its SQLSTATE and hint.
        raise_decode(cause);
    }
    ereport!(ERROR, encode_sqlstate(&err), err.to_string());
}

/// Raises an unknown codec name as an ERROR.
pub(crate) fn raise_codec(err: ParseCodecError) -> ! {
    ereport!(ERROR, ERRCODE_INVALID_PARAMETER_VALUE, err.to_string());
}

/// Replaces pgrx's panic hook, on the backend's own thread, with one that
/// records nothing, so that no loom ERROR carries a Rust backtrace to its
/// client, whatever the server's environment (issue 25).
///
/// pgrx 0.18's hook (`register_pg_guard_panic_hook`, installed by
/// `Pg_magic_func`) stores `std::backtrace::Backtrace::capture()` for every
/// panic, and every ERROR crossing a pgrx boundary in Rust is one. When the
/// ERROR is PostgreSQL's own, raised under loom's frames (a unique
/// violation under an append, `jsonb_in` refusing a decoded state), or a
/// Rust panic, pgrx appends that backtrace to the DETAIL it reports. With
/// `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` set for the server, the capture
/// resolves, and any role that can make loom fail reads loom's build paths
/// and call stack (and the backend loads ~40 MiB of debug info to print
/// them). Unsetting the variables would not do: std reads them once per
/// process and caches the answer, which a capture before this library was
/// loaded (another extension's, in the postmaster) has already fixed.
///
/// Without the hook, pgrx reports a panic with its message and an unknown
/// location (no build path in the ERROR's file field either), and
/// PostgreSQL's own ERRORs exactly as PostgreSQL raised them. Panics on
/// other threads still go to pgrx's hook, which prints them to the server
/// log: no client is attached to those.
pub(crate) fn keep_backtraces_out_of_errors() {
    let pgrx_hook = std::panic::take_hook();
    // Backends are single-threaded: this is the thread every ERROR is
    // raised on. A backend forked from a postmaster that loaded loom keeps
    // its id (thread-locals are copied by fork).
    let backend_thread = std::thread::current().id();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() != backend_thread {
            pgrx_hook(info);
        }
    }));
}
