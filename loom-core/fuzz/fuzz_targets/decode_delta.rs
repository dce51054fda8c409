//! Any delta against any base: the input's first byte says where it splits
//! into a frame and a base frame (a real delta header is put in front half
//! the time, so the fuzzer reaches the zstd frame behind it). Decoding must
//! return the exact text a keyframe gives or a typed error, never panic,
//! never allocate past the ceiling; whatever it returns is JSON that a
//! delta against the same base gives back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgloom_core::frame::delta::{decode_with_base, encode_delta, Keyframe};
use pgloom_core::frame::{decode, encode, Codec};

fuzz_target!(|input: &[u8]| {
    let Some((&split, rest)) = input.split_first() else {
        return;
    };
    let at = usize::from(split).min(rest.len());
    let (frame, base) = rest.split_at(at);
    let mut framed = Vec::new();
    let frame = if split % 2 == 0 {
        // A header naming the base as it is, then the fuzzer's bytes.
        let text = decode(base).unwrap_or_default();
        framed.extend_from_slice(&encode_delta("[]", Keyframe { sequence: 1, text: &text })
            .map(|d| d[..25].to_vec())
            .unwrap_or_default());
        framed.extend_from_slice(frame);
        &framed[..]
    } else {
        frame
    };
    if let Ok(text) = decode_with_base(frame, Some(base)) {
        // A base whose bytes match the header's length and hash is taken
        // as it is (a keyframe decodes to JSON; this one need not): only
        // a base that decodes is re-encoded.
        if let (Some(&0x03), Ok(base_text)) = (frame.first(), decode(base)) {
            let again = encode_delta(&text, Keyframe { sequence: 1, text: &base_text })
                .expect("decoded text always re-encodes");
            let base_again = encode(&base_text, Codec::Zstd).expect("and so does its base");
            assert_eq!(decode_with_base(&again, Some(&base_again)).expect("and decodes"), text);
        } else if frame.first() != Some(&0x03) {
            assert_eq!(decode(frame).expect("a keyframe decodes alone"), text);
        }
    }
});
