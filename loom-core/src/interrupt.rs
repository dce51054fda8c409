//! A hook that every loop over input-sized data calls regularly, so that a
//! host can stop the work between two steps (issue 25).
//!
//! In a PostgreSQL backend, `statement_timeout`, `pg_cancel_backend` and
//! `pg_terminate_backend` only set a flag; the work stops where the code
//! calls `CHECK_FOR_INTERRUPTS()`. A loop that never does ignores them all,
//! and a 30-byte zstd frame can declare a state that takes minutes to walk.
//! So the validator, the path walk, unescaping, the zstd header walk and
//! inflating each call [`check`] at least once every [`CHECK_INTERVAL`]
//! bytes of their input (compressing, slower per byte, every MiB), and the
//! extension installs `pgrx::check_for_interrupts!()` as the hook once,
//! when it is loaded.
//!
//! Why a process-wide hook rather than a parameter: the checks sit deep
//! inside loops that every public function of this crate reaches (decode,
//! encode, validate, `find_path`, unescape), and a callback threaded through
//! each of them would change every caller's API for a concern only the
//! server has. What the hook reads is process-wide too: a backend's
//! interrupt flag, one per process. The client installs nothing, and then
//! a check costs one atomic load.
//!
//! The hook may unwind (a PostgreSQL ERROR arrives in Rust as a panic). It
//! is only called between steps, where nothing this crate holds is
//! half-done: every buffer is owned by a frame that unwinding drops, and
//! the per-thread zstd contexts are reset before each frame they start.
//!
//! ```
//! // What loom's extension does in `_PG_init`, with its own check.
//! fn check_for_interrupts() {}
//! let _ = pgloom_core::interrupt::install(check_for_interrupts);
//! assert!(pgloom_core::interrupt::install(check_for_interrupts).is_err());
//! ```

use std::sync::OnceLock;

static HOOK: OnceLock<fn()> = OnceLock::new();

/// The most input, in bytes, that any loop of this crate goes through
/// between two calls of the hook: 64 KiB, a few microseconds of work (a
/// scan of 256 MiB checks 4,096 times), so that the checks cost nothing
/// measurable and an interrupt is seen within microseconds.
pub const CHECK_INTERVAL: usize = 64 * 1024;

/// Installs `hook`, which [`check`] calls from then on, for the whole
/// process.
///
/// # Errors
///
/// The hook already installed, when there is one: it stays, as
/// [`OnceLock::set`] keeps its first value, so that no thread ever sees
/// the hook change under it.
pub fn install(hook: fn()) -> Result<(), fn()> {
    HOOK.set(hook)
}

/// Calls the installed hook, if any: where a loop of this crate may be
/// stopped.
#[inline]
pub fn check() {
    if let Some(hook) = HOOK.get() {
        hook();
    }
}

/// Calls [`check`] from a loop over a text, once its position has moved
/// [`CHECK_INTERVAL`] bytes past the last check: one comparison a step.
///
/// ```
/// use pgloom_core::interrupt::Ticker;
/// let text = vec![b' '; 1 << 20];
/// let mut ticker = Ticker::starting_at(0);
/// for pos in 0..text.len() {
///     ticker.at(pos); // 16 checks in all
/// }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Ticker {
    next: usize,
}

impl Ticker {
    /// A ticker whose first check comes [`CHECK_INTERVAL`] bytes after
    /// `start`: a call that handles less never checks.
    #[must_use]
    pub fn starting_at(start: usize) -> Self {
        Ticker {
            next: start.saturating_add(CHECK_INTERVAL),
        }
    }

    /// Calls [`check`] if `pos` has passed the next check point.
    #[inline(always)]
    pub fn at(&mut self, pos: usize) {
        if pos >= self.next {
            self.passed(pos);
        }
    }

    #[cold]
    #[inline(never)]
    fn passed(&mut self, pos: usize) {
        check();
        self.next = pos.saturating_add(CHECK_INTERVAL);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The checks every loop makes, counted per thread by a hook installed
    //! once for the whole test binary; and what unwinding from one leaves.

    use std::cell::Cell;

    use crate::json::{find_path, unescape, validate, JsonString};

    thread_local! {
        static CHECKS: Cell<u64> = const { Cell::new(0) };
        /// Unwind at this check (counting from 1), as an ERROR would.
        static FAIL_AT: Cell<u64> = const { Cell::new(0) };
    }

    fn hook() {
        let n = CHECKS.get() + 1;
        CHECKS.set(n);
        if FAIL_AT.get() == n {
            panic!("interrupted at check {n}");
        }
    }

    /// How many checks `f` made on this thread.
    pub(crate) fn checks_in<R>(f: impl FnOnce() -> R) -> (u64, R) {
        // Other tests run on other threads: the counts are per thread.
        let _ = super::install(hook);
        CHECKS.set(0);
        FAIL_AT.set(0);
        let result = f();
        (CHECKS.get(), result)
    }

    const MIB: usize = 1024 * 1024;

    /// At least one check per CHECK_INTERVAL of `bytes`, less one for the
    /// first interval.
    fn enough(bytes: usize) -> u64 {
        (bytes / super::CHECK_INTERVAL) as u64 - 1
    }

    fn deep(depth: usize) -> String {
        format!("{}0{}", "[".repeat(depth), "]".repeat(depth))
    }

    fn deep_object(depth: usize) -> String {
        format!("{}0{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
    }

    #[test]
    fn validating_checks_every_interval_whatever_the_text_is_made_of() {
        for text in [
            deep(MIB),
            format!("[{}0]", "0,".repeat(MIB)),
            format!("\"{}\"", r"\n".repeat(MIB)),
            format!("[{}]", " ".repeat(2 * MIB)),
            format!("[{}]", "7".repeat(2 * MIB)),
            format!("[\"{}\"]", "x".repeat(2 * MIB)),
        ] {
            let (checks, result) = checks_in(|| validate(text.as_bytes()));
            assert_eq!(result, Ok(()));
            assert!(checks >= enough(text.len()), "{checks} for {:.20}", text);
        }
    }

    #[test]
    fn walking_a_path_checks_every_interval() {
        let text = JsonString::new(deep_object(MIB / 4)).unwrap();
        let path = vec!["a"; MIB / 4];
        let (checks, found) = checks_in(|| find_path(&text, &path));
        assert_eq!(found, Some("0"));
        assert!(checks >= enough(text.as_str().len()), "{checks}");
        let text = JsonString::new(format!("[{}0]", "0,".repeat(MIB))).unwrap();
        let (checks, found) = checks_in(|| find_path(&text, &["-1"]));
        assert_eq!(found, Some("0"));
        assert!(checks >= enough(text.as_str().len()), "{checks}");
    }

    #[test]
    fn unescaping_checks_every_interval() {
        let body = r"\n".repeat(MIB);
        let (checks, unescaped) = checks_in(|| unescape(body.as_bytes()));
        assert_eq!(unescaped.map(|u| u.len()), Some(MIB));
        assert!(checks >= enough(body.len()), "{checks}");
    }

    /// The zstd codec is a feature: a build without it has nothing to
    /// inflate or compress.
    #[cfg(feature = "zstd")]
    mod zstd {
        use std::panic::{catch_unwind, AssertUnwindSafe};

        use super::{checks_in, deep, enough, CHECKS, FAIL_AT, MIB};
        use crate::frame::{decode, decode_into, decode_json, encode, Codec};

        /// Runs `f` with the hook unwinding at its `n`-th check; whether it
        /// did.
        fn unwinds_at<R>(n: u64, f: impl FnOnce() -> R) -> bool {
            let _ = crate::interrupt::install(super::hook);
            CHECKS.set(0);
            FAIL_AT.set(n);
            let unwound = catch_unwind(AssertUnwindSafe(f)).is_err();
            FAIL_AT.set(0);
            unwound
        }

        #[test]
        fn inflating_and_compressing_check_every_interval() {
            let state = deep(4 * MIB);
            let (checks, frame) = checks_in(|| encode(&state, Codec::Zstd).unwrap());
            assert!(frame.len() < 10_000, "{}", frame.len());
            // Validating, and compressing once a MiB.
            let mibs = (state.len() / MIB) as u64;
            assert!(checks >= enough(state.len()) + mibs - 1, "encode: {checks}");
            let (checks, text) = checks_in(|| decode_into(&frame, |len| vec![0u8; len]).unwrap());
            assert_eq!(text.len(), state.len());
            // Validating, and inflating once a block (at most 128 KiB).
            let blocks = (state.len() / (128 * 1024)) as u64;
            assert!(
                checks >= enough(state.len()) + blocks - 1,
                "decode: {checks}"
            );
        }

        #[test]
        fn a_check_that_unwinds_leaves_every_codec_usable() {
            let state = deep(4 * MIB);
            let frame = encode(&state, Codec::Zstd).unwrap();
            let small = encode(r#"{"turn":1}"#, Codec::Zstd).unwrap();
            // Unwind at check 3 (decode: inflating, 31 checks; encode:
            // validating, 63) and 65 (decode: validating; encode:
            // compressing); then the same thread's contexts must work on
            // another frame, and on the same one.
            for at in [3, 65] {
                assert!(unwinds_at(at, || decode_json(&frame)), "decode at {at}");
                assert_eq!(decode(&small).unwrap(), r#"{"turn":1}"#);
                assert_eq!(decode(&frame).unwrap().len(), state.len());
                assert!(
                    unwinds_at(at, || encode(&state, Codec::Zstd)),
                    "encode at {at}"
                );
                assert_eq!(encode(&state, Codec::Zstd).unwrap(), frame);
                assert_eq!(decode(&small).unwrap(), r#"{"turn":1}"#);
            }
        }
    }
}
