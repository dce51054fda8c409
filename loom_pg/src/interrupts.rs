//! PostgreSQL's interrupts in pgloom-core's loops (issue 25).
//!
//! `statement_timeout`, `pg_cancel_backend` and `pg_terminate_backend` only
//! set a flag; the work stops where the code checks it. pgloom-core's loops
//! over a state (validating, inflating, walking a path, unescaping,
//! compressing) call [`pgloom_core::interrupt::check`] at least every 64 KiB
//! of text, and this installs PostgreSQL's check there, once per process,
//! from `_PG_init`. Without it, a 30-byte frame that declares a deep state
//! held a backend for minutes, deaf to all three.
//!
//! Why a hook pgloom-core calls, not a callback passed to each function:
//! see [`pgloom_core::interrupt`]. The extension's own loops (the jsonb
//! builder) call the same hook through [`pgloom_core::interrupt::Ticker`].

/// Installs [`check_for_interrupts`] as pgloom-core's interrupt check. Called
/// from `_PG_init`; a second call changes nothing.
pub(crate) fn install() {
    // Err only when a hook is already installed: this one, by an earlier
    // call in the same process.
    let _ = pgloom_core::interrupt::install(check_for_interrupts);
}

/// `CHECK_FOR_INTERRUPTS()`: where a pending cancel or termination raises
/// its ERROR (or FATAL), which pgrx unwinds through pgloom-core's frames as a
/// panic and turns back into the ERROR at the `#[pg_extern]`. pgloom-core
/// holds no lock and leaves no shared state half-done between two checks,
/// and what it allocated is dropped on the way.
fn check_for_interrupts() {
    pgrx::check_for_interrupts!();
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::jsonb_build;
    use crate::palloc_text::PallocCString;
    use crate::test_support::error_of;
    use pgloom_core::frame::{decode, decode_json, encode, Codec};
    use pgloom_core::json::find_path;
    use pgrx::prelude::*;
    use pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED;

    /// `_PG_init` installed the check: installing another is refused.
    #[pg_test]
    fn pg_init_installed_the_check() {
        fn other() {}
        assert!(pgloom_core::interrupt::install(other).is_err());
    }

    /// What `pg_cancel_backend` does to the backend it signals.
    fn cancel_pending() {
        // SAFETY: the flags a signal handler sets, set in the backend's
        // own (only) thread.
        unsafe {
            pg_sys::QueryCancelPending = 1;
            pg_sys::InterruptPending = 1;
        }
    }

    /// Each loop ends at its next check with the cancel's ERROR, called
    /// directly: through SPI, the executor's own check would take the
    /// cancel before loom's code runs. The codecs then work as before.
    #[pg_test]
    fn a_pending_cancel_ends_each_loop_with_its_error() {
        let state = format!("[{}0]", "0,".repeat(1 << 20));
        let frame = encode(&state, Codec::Zstd).unwrap();
        let json = decode_json(&frame).unwrap();
        for call in ["decode", "encode", "find_path", "to_jsonb"] {
            cancel_pending();
            let (code, message) = error_of(|| match call {
                "decode" => drop(decode(&frame)),
                "encode" => drop(encode(&state, Codec::Zstd)),
                "find_path" => assert!(find_path(&json, &["-1"]).is_some()),
                _ => {
                    jsonb_build::to_jsonb(&PallocCString::from_str(&state));
                }
            });
            assert_eq!(code, ERRCODE_QUERY_CANCELED, "{call}: {message}");
        }
        assert_eq!(decode(&frame).unwrap(), state);
        assert_eq!(encode(&state, Codec::Zstd).unwrap(), frame);
        assert_eq!(find_path(&json, &["-1"]), Some("0"));
    }
}
