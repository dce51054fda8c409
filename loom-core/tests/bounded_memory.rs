//! Decoding a hostile frame never allocates more than the ceiling: measured
//! with a counting allocator, on frames the `zstd` CLI made.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use pgloom_core::frame::{decode, DecodeFrameError};
use pgloom_core::MAX_DECODED_STATE_BYTES;
use support::zstd_cli_frame;

struct PeakCounting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for PeakCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: PeakCounting = PeakCounting;

/// Peak bytes allocated while `f` runs, above what was live before it.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let result = f();
    (result, PEAK.load(Ordering::SeqCst) - before)
}

// One test per binary: the counters are process-wide.
#[test]
fn hostile_frames_stay_within_the_ceiling() {
    let declared = 600u64 * 1024 * 1024;
    let declaring = zstd_cli_frame(
        &format!("head -c {declared} /dev/zero | zstd -3 -c --stream-size={declared}"),
        b"",
    );
    let (result, peak) = peak_during(|| decode(&declaring));
    assert!(matches!(
        result,
        Err(DecodeFrameError::StateTooLarge {
            declared: Some(_),
            ..
        })
    ));
    assert!(
        peak < 1024 * 1024,
        "refused before inflating, yet {peak} bytes allocated"
    );

    let undeclared = zstd_cli_frame(
        &format!(
            "head -c {} /dev/zero | zstd -3 -c",
            2 * MAX_DECODED_STATE_BYTES
        ),
        b"",
    );
    let (result, peak) = peak_during(|| decode(&undeclared));
    assert!(matches!(
        result,
        Err(DecodeFrameError::StateTooLarge { declared: None, .. })
    ));
    let ceiling = MAX_DECODED_STATE_BYTES as usize + 4 * 1024 * 1024; // + zstd's window
    assert!(peak <= ceiling, "peak {peak} over {ceiling}");
}
