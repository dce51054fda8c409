//! Finding the end of a run of plain string bytes: the validator's hot loop.
//!
//! Strings are most of a snapshot's bytes, and most of a string is bytes
//! that need no attention: anything but `"`, `\`, a control character or a
//! non-ASCII byte (whose UTF-8 the validator checks). This finds the first
//! byte that does need it, as many bytes a step as the CPU allows.
//!
//! Most strings in a state are keys and short values that end within a
//! few 16-byte steps, and each is one link in a chain of dependent loads
//! (where a string ends decides where the next token starts): their cost is
//! latency, not width. So the first [`INLINE_BYTES`] are tested inline with
//! SSE2 (x86-64 itself), and only longer bodies call a loop of 32-byte AVX2
//! steps where the CPU has it. Measured on the bench's states (Zen 4, one
//! thread): plain ones (1-4 KB tool outputs) validate at 15 GB/s instead of
//! 11.7, token-dense ones unchanged (±3%); calling AVX2 for every string
//! cost those 7%, and 64-byte AVX-512 steps 45%.

/// How [`Scanner::skip`] reads: the widest instructions this CPU has,
/// detected at run time (loom's extension and client are built for the
/// x86-64 baseline, not for the machine they run on).
///
/// A value is only made by [`Scanner::detect`] (or, in tests, by
/// `Scanner::available`), so holding one proves its instructions exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scanner(Isa);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    /// 8 bytes a step in a `u64`: any CPU.
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    Portable,
    /// 16 bytes a step: part of x86-64 itself.
    #[cfg(target_arch = "x86_64")]
    Sse2,
    /// 32 bytes a step.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Scanner {
    /// The widest scanner this CPU runs. `std` caches what it detected, so
    /// this costs a few loads.
    pub(super) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                return Scanner(Isa::Avx2);
            }
            Scanner(Isa::Sse2)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Scanner(Isa::Portable)
    }

    /// Every scanner this CPU runs, so that tests check each one.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Self> {
        let mut all = vec![Scanner(Isa::Portable)];
        #[cfg(target_arch = "x86_64")]
        {
            all.push(Scanner(Isa::Sse2));
            if is_x86_feature_detected!("avx2") {
                all.push(Scanner(Isa::Avx2));
            }
        }
        all
    }

    /// The position of the first byte at or after `pos` that is `"`, `\`,
    /// below 0x20 or above 0x7F; `text.len()` if there is none.
    ///
    /// It may stop early in a long run of plain bytes, at a plain byte at
    /// least [`MAX_RUN`] (and at most twice that) bytes after `pos`; the
    /// caller scans on from there once it has checked for interrupts
    /// (issue 25: a string of 256 MiB is otherwise one uninterruptible
    /// scan). Only the loops past the inline part look at the bound, so
    /// short strings pay nothing for it.
    #[inline(always)]
    pub(super) fn skip(self, text: &[u8], mut pos: usize) -> usize {
        debug_assert!(pos <= text.len());
        // Inline, with SSE2 (x86-64 itself): up to MAX_RUN bytes of the
        // string without AVX2, its first INLINE_BYTES with it. Most
        // strings end there, and pay no call.
        #[cfg(target_arch = "x86_64")]
        if self.0 != Isa::Portable {
            let inline_end = match self.0 {
                Isa::Avx2 => pos.saturating_add(INLINE_BYTES),
                _ => pos.saturating_add(MAX_RUN),
            };
            while pos < inline_end {
                let Some(chunk) = text.get(pos..pos + 16) else {
                    break;
                };
                // SAFETY: SSE2 is part of x86-64.
                let mask = unsafe { x86::special_16(chunk) };
                if mask != 0 {
                    return pos + mask.trailing_zeros() as usize;
                }
                pos += 16;
            }
        }
        match self.0 {
            Isa::Portable => skip_words(text, pos),
            // Fewer than 16 bytes left, or MAX_RUN plain ones seen.
            #[cfg(target_arch = "x86_64")]
            Isa::Sse2 => skip_bytes(&text[..text.len().min(pos + 15)], pos),
            // SAFETY: AVX2 was detected by whoever made this Scanner
            // (`detect`, `available`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::skip_avx2(text, pos) },
        }
    }
}

/// The most bytes one [`Scanner::skip`] looks at: as many as the
/// validator goes through between interrupt checks.
pub(super) const MAX_RUN: usize = crate::interrupt::CHECK_INTERVAL;

/// How many bytes of a string [`Scanner::skip`] tests inline, 16 at a
/// time, before it calls the AVX2 loop: a call (and leaving AVX2) costs
/// about what 32-byte steps save over 16-byte ones on 500 bytes, so strings
/// shorter than this never make one.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const INLINE_BYTES: usize = 256;

fn is_special(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || !(0x20..0x80).contains(&byte)
}

/// One byte a step, for what is left after the wide steps.
fn skip_bytes(text: &[u8], pos: usize) -> usize {
    text[pos..]
        .iter()
        .position(|&b| is_special(b))
        .map_or(text.len(), |at| pos + at)
}

/// Eight bytes a step in a `u64`, for at most [`MAX_RUN`] bytes.
fn skip_words(text: &[u8], mut pos: usize) -> usize {
    let text = &text[..text.len().min(pos.saturating_add(MAX_RUN))];
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Exact "some byte of x is zero" / "some byte of x is below n" tests
    // (n <= 0x80): each sets a high bit iff such a byte exists.
    let has_zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let has_byte_below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    while let Some(chunk) = text.get(pos..pos + 8) {
        let word = u64::from_ne_bytes(chunk.try_into().expect("an 8-byte slice"));
        let special = has_zero_byte(word ^ (ONES * u64::from(b'"')))
            | has_zero_byte(word ^ (ONES * u64::from(b'\\')))
            | has_byte_below(word, 0x20)
            | (word & HIGHS);
        if special != 0 {
            break;
        }
        pos += 8;
    }
    skip_bytes(text, pos)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::skip_bytes;

    /// One bit for each special byte of `chunk`, with SSE2: part of x86-64
    /// itself, so no detection, and inlined into any caller.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) fn special_16(chunk: &[u8]) -> u32 {
        debug_assert_eq!(chunk.len(), 16);
        // SAFETY: `chunk` is 16 readable bytes; loadu needs no alignment.
        let bytes = unsafe { _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>()) };
        // A byte <= 0x1f saturates to zero when 0x1f is subtracted.
        let control = _mm_cmpeq_epi8(
            _mm_subs_epu8(bytes, _mm_set1_epi8(0x1f)),
            _mm_setzero_si128(),
        );
        let special = _mm_or_si128(
            _mm_or_si128(
                _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'\\' as i8)),
            ),
            control,
        );
        // A non-ASCII byte's own high bit marks it, for free.
        (_mm_movemask_epi8(special) | _mm_movemask_epi8(bytes)) as u32
    }

    /// One bit for each special byte of `chunk`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn special_32(chunk: &[u8]) -> u32 {
        debug_assert_eq!(chunk.len(), 32);
        // SAFETY: `chunk` is 32 readable bytes; loadu needs no alignment.
        let bytes = unsafe { _mm256_loadu_si256(chunk.as_ptr().cast::<__m256i>()) };
        let control = _mm256_cmpeq_epi8(
            _mm256_subs_epu8(bytes, _mm256_set1_epi8(0x1f)),
            _mm256_setzero_si256(),
        );
        let special = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_cmpeq_epi8(bytes, _mm256_set1_epi8(b'"' as i8)),
                _mm256_cmpeq_epi8(bytes, _mm256_set1_epi8(b'\\' as i8)),
            ),
            control,
        );
        (_mm256_movemask_epi8(special) | _mm256_movemask_epi8(bytes)) as u32
    }

    /// 32 bytes a step, then one at a time for the last few (only at the
    /// end of the text), for at most [`super::MAX_RUN`] bytes.
    #[target_feature(enable = "avx2")]
    pub(super) fn skip_avx2(text: &[u8], mut pos: usize) -> usize {
        let text = &text[..text.len().min(pos.saturating_add(super::MAX_RUN))];
        while let Some(chunk) = text.get(pos..pos + 32) {
            let mask = special_32(chunk);
            if mask != 0 {
                return pos + mask.trailing_zeros() as usize;
            }
            pos += 32;
        }
        skip_bytes(text, pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(text: &[u8], pos: usize) -> usize {
        skip_bytes(text, pos)
    }

    #[test]
    fn finds_each_kind_of_special_byte_at_every_offset_and_length() {
        for scanner in Scanner::available() {
            // Past INLINE_BYTES too, where the loops take over.
            for len in (0..80).chain(INLINE_BYTES - 16..INLINE_BYTES + 80) {
                let plain = vec![b'x'; len];
                assert_eq!(scanner.skip(&plain, 0), len, "{scanner:?} plain {len}");
                for at in 0..len {
                    for special in [b'"', b'\\', 0x00, 0x1f, 0x80, 0xff] {
                        let mut text = plain.clone();
                        text[at] = special;
                        for start in [0, at / 2, at] {
                            assert_eq!(
                                scanner.skip(&text, start),
                                at,
                                "{scanner:?} len {len} special {special:#x} at {at} from {start}"
                            );
                        }
                        assert_eq!(scanner.skip(&text, at + 1), len, "{scanner:?} past it");
                    }
                }
            }
        }
    }

    #[test]
    fn stops_after_max_run_plain_bytes() {
        for scanner in Scanner::available() {
            let mut text = vec![b'x'; 3 * MAX_RUN];
            text[2 * MAX_RUN + 5] = b'"';
            for start in [0, 1, 17, MAX_RUN - 3] {
                let mut pos = start;
                while text[pos] != b'"' {
                    let stop = scanner.skip(&text, pos);
                    if text[stop] != b'"' {
                        assert!(stop >= pos + MAX_RUN, "{scanner:?} {pos}: {stop}");
                    }
                    assert!(stop <= pos + 2 * MAX_RUN, "{scanner:?} {pos}: {stop}");
                    pos = stop;
                }
                assert_eq!(pos, 2 * MAX_RUN + 5, "{scanner:?}");
            }
            // A special byte just before the bound is found.
            let mut text = vec![b'x'; 2 * MAX_RUN];
            text[MAX_RUN - 1] = b'\\';
            assert_eq!(scanner.skip(&text, 0), MAX_RUN - 1, "{scanner:?}");
            assert_eq!(scanner.skip(&text[..MAX_RUN - 7], 0), MAX_RUN - 7);
        }
    }

    #[test]
    fn plain_bytes_at_the_edges_of_the_ranges_are_plain() {
        let edges = [0x20u8, 0x21, 0x23, 0x5b, 0x5d, 0x7e, 0x7f];
        for scanner in Scanner::available() {
            let text: Vec<u8> = edges.iter().copied().cycle().take(130).collect();
            assert_eq!(scanner.skip(&text, 0), text.len(), "{scanner:?}");
        }
    }

    proptest! {
        #[test]
        fn every_scanner_agrees_with_one_byte_a_step(
            text in proptest::collection::vec(
                prop_oneof![40 => Just(b'a'), 1 => any::<u8>()], 0..700),
            start in 0usize..700,
        ) {
            let start = start.min(text.len());
            for scanner in Scanner::available() {
                prop_assert_eq!(scanner.skip(&text, start), reference(&text, start), "{:?}", scanner);
            }
        }
    }
}
