//! XXH64, the 64-bit hash zstd checksums its frames with, written out here
//! so that a delta frame can name its keyframe's text by content without a
//! dependency: a delta decoded against any other text is refused before a
//! byte is inflated (`frame::delta`).
//!
//! It is a check against the wrong base (another execution's keyframe, a
//! keyframe re-saved since), not a MAC: whoever can write a snapshot row
//! can write any state anyway. Its output is checked against zstd's own
//! frame checksums in the tests.

use crate::interrupt::CHECK_INTERVAL;

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(acc: u64, value: u64) -> u64 {
    (acc ^ round(0, value)).wrapping_mul(P1).wrapping_add(P4)
}

fn read_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

/// XXH64 of `data` with seed 0, as zstd computes it, with an interrupt
/// check every [`CHECK_INTERVAL`] bytes (a keyframe may be 256 MiB).
#[must_use]
pub(crate) fn xxh64(data: &[u8]) -> u64 {
    let mut rest = data;
    let mut hash = if data.len() >= 32 {
        let mut v = [P1.wrapping_add(P2), P2, 0, 0u64.wrapping_sub(P1)];
        let mut stripes = rest.chunks_exact(32);
        for (n, stripe) in (&mut stripes).enumerate() {
            if n % (CHECK_INTERVAL / 32) == CHECK_INTERVAL / 32 - 1 {
                crate::interrupt::check();
            }
            for (lane, word) in v.iter_mut().zip(stripe.chunks_exact(8)) {
                *lane = round(*lane, read_u64(word));
            }
        }
        rest = stripes.remainder();
        let mut hash = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            hash = merge(hash, lane);
        }
        hash
    } else {
        P5
    };
    hash = hash.wrapping_add(data.len() as u64);
    let mut words = rest.chunks_exact(8);
    for word in &mut words {
        hash ^= round(0, read_u64(word));
        hash = hash.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
    }
    rest = words.remainder();
    if rest.len() >= 4 {
        hash ^= u64::from(read_u32(rest)).wrapping_mul(P1);
        hash = hash.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &byte in rest {
        hash ^= u64::from(byte).wrapping_mul(P5);
        hash = hash.rotate_left(11).wrapping_mul(P1);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(P2);
    hash ^= hash >> 29;
    hash = hash.wrapping_mul(P3);
    hash ^ (hash >> 32)
}

#[cfg(all(test, feature = "zstd"))]
mod tests {
    use super::xxh64;
    use crate::frame::{encode, Codec};

    /// zstd's checksum is the low 32 bits of XXH64 of the content, little
    /// endian, in the frame's last 4 bytes: every length across the
    /// 32-byte stripes, 8- and 4-byte tails agrees.
    #[test]
    fn agrees_with_the_checksums_zstd_writes() {
        let mut checked = 0;
        for len in (0u64..200).chain([1000, 4096, 65_537, 300_001]) {
            let text = format!(
                "[{}]",
                (0..len)
                    .map(|i: u64| ((i * 7919 % 26) as u8 + b'a') as char)
                    .collect::<String>()
                    .chars()
                    .map(|c| format!("\"{c}\""))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let frame = encode(&text, Codec::Zstd).unwrap();
            if frame[0] != 0x02 {
                continue;
            }
            let stored = u32::from_le_bytes(frame[frame.len() - 4..].try_into().unwrap());
            assert_eq!(
                xxh64(text.as_bytes()) as u32,
                stored,
                "length {}",
                text.len()
            );
            checked += 1;
        }
        assert!(checked > 150, "only {checked} texts compressed");
    }

    /// Every length from 0 to 100 (each tail after the 32-byte stripes,
    /// 8- and 4-byte words), one JSON string of that many bytes each.
    #[test]
    fn agrees_with_zstd_at_every_length_to_100() {
        for len in 2..=100usize {
            let text = format!("\"{}\"", "a".repeat(len - 2));
            let frame = crate::frame::zstd_payload::compress(text.as_bytes(), 2)
                .unwrap()
                .unwrap_or_else(|| {
                    // Too small to shrink: the frame zstd would write anyway.
                    let mut cctx = zstd_safe::CCtx::create();
                    cctx.set_parameter(zstd_safe::CParameter::ChecksumFlag(true))
                        .unwrap();
                    let mut out = vec![2u8];
                    out.resize(1 + zstd_safe::compress_bound(len), 0);
                    let n = cctx.compress2(&mut out[1..], text.as_bytes()).unwrap();
                    out.truncate(1 + n);
                    out
                });
            let stored = u32::from_le_bytes(frame[frame.len() - 4..].try_into().unwrap());
            assert_eq!(xxh64(text.as_bytes()) as u32, stored, "length {len}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(xxh64(b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a"), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc"), 0x44BC_2CF5_AD77_0999);
    }
}
