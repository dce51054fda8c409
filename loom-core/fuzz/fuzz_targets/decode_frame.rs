//! Any bytes through the frame decoder: it must return a value or a typed
//! error, never panic, never allocate past the ceiling, and whatever it
//! returns must be JSON that re-encodes and decodes to itself, and that
//! path lookups walk without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgloom_core::frame::{decode, decode_into, decode_json, encode, inspect, Codec};
use pgloom_core::json::find_path;

fuzz_target!(|frame: &[u8]| {
    let _ = inspect(frame);
    let decoded = decode(frame);
    let into = decode_into(frame, |len| vec![0u8; len]);
    match (decoded, into) {
        (Ok(text), Ok(bytes)) => {
            assert_eq!(text.as_bytes(), &bytes[..]);
            for codec in [Codec::None, Codec::Zstd] {
                let again = encode(&text, codec).expect("decoded text always re-encodes");
                assert_eq!(decode(&again).expect("and decodes"), text);
            }
            // Path lookups on whatever a frame declares (issue 25): never a
            // panic, and the whole value for an empty path.
            let json = decode_json(frame).expect("decoded once already");
            assert_eq!(find_path(&json, &[]), Some(text.trim_matches([' ', '\t', '\n', '\r'])));
            for path in [&["0"][..], &["-1", "-1"], &["a", "0"], &["", "1", "a"]] {
                let _ = find_path(&json, path);
            }
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        (a, b) => panic!("decode and decode_into disagree: {a:?} vs {b:?}"),
    }
});
