use super::*;
use loom_fixtures::agent_state;
use proptest::prelude::*;

/// The agent states of the benchmarks; the states a parse would change
/// (pgloom's conformance::adversarial_states) are framed in that crate's
/// tests, and arbitrary JSON by the proptests below.
fn all_states() -> Vec<(String, String)> {
    let mut states = Vec::new();
    for turns in [1, 50, 200] {
        for claim_checked in [false, true] {
            states.push((
                format!("{turns} turns, claim-checked {claim_checked}"),
                agent_state(turns, claim_checked),
            ));
        }
    }
    states
}

#[test]
fn round_trips_every_state_byte_for_byte_in_both_codecs() {
    for (name, state) in all_states() {
        for codec in [Codec::None, Codec::Zstd] {
            let frame = encode(&state, codec).unwrap();
            assert!(frame.len() <= state.len() + 1, "{name} {codec}");
            assert_eq!(decode(&frame).unwrap(), state, "{name} {codec}");
        }
    }
}

#[test]
fn decode_into_gives_what_decode_gives() {
    for (name, state) in all_states() {
        for codec in [Codec::None, Codec::Zstd] {
            let frame = encode(&state, codec).unwrap();
            let text = decode_into(&frame, |len| vec![0u8; len]).unwrap();
            assert_eq!(text, state.as_bytes(), "{name} {codec}");
        }
    }
    let mut corrupt = zstd_frame_of(&agent_state(3, false));
    *corrupt.last_mut().unwrap() ^= 1;
    for bad in [&b""[..], b"\x05", b"\x01{", b"\x01\"\xff\"", &corrupt] {
        assert_eq!(
            decode_into(bad, |len| vec![0u8; len]).unwrap_err(),
            decode(bad).unwrap_err()
        );
    }
}

#[test]
fn none_writes_the_text_after_0x01() {
    let frame = encode(r#"{"b":1}"#, Codec::None).unwrap();
    assert_eq!(frame, b"\x01{\"b\":1}");
}

#[test]
fn zstd_compresses_agent_state_and_declares_its_size_and_checksum() {
    let state = agent_state(50, false);
    let frame = encode(&state, Codec::Zstd).unwrap();
    assert_eq!(frame[0], 0x02);
    assert!(
        frame.len() * 3 < state.len(),
        "{} of {}",
        frame.len(),
        state.len()
    );
    let info = inspect(&frame).unwrap();
    assert_eq!(
        info,
        FrameInfo {
            format: Format::Zstd,
            stored_bytes: frame.len(),
            declared_bytes: Some(state.len() as u64),
            has_checksum: true,
        }
    );
}

#[test]
fn zstd_falls_back_to_0x01_only_when_it_would_not_be_smaller() {
    // Short, varied text: the zstd frame's own overhead (header, block
    // header, checksum) outweighs what it saves.
    let state = r#"{"id":"x7Qk","n":[3,1,4]}"#;
    let frame = encode(state, Codec::Zstd).unwrap();
    assert_eq!(frame[0], 0x01);
    assert_eq!(frame.len(), state.len() + 1);
}

#[test]
fn encode_refuses_what_could_not_be_decoded() {
    assert!(matches!(
        encode("{\"a\":}", Codec::Zstd),
        Err(EncodeFrameError::NotJson(_))
    ));
    assert!(matches!(
        encode("", Codec::None),
        Err(EncodeFrameError::NotJson(_))
    ));
}

#[test]
fn encode_refuses_a_state_over_the_ceiling() {
    let state = format!("\"{}\"", "a".repeat(MAX_DECODED_STATE_BYTES as usize));
    assert_eq!(
        encode(&state, Codec::Zstd),
        Err(EncodeFrameError::StateTooLarge {
            bytes: MAX_DECODED_STATE_BYTES + 2,
            limit: MAX_DECODED_STATE_BYTES
        })
    );
}

fn zstd_frame_of(state: &str) -> Vec<u8> {
    let frame = encode(state, Codec::Zstd).unwrap();
    assert_eq!(frame[0], 0x02, "the test needs a compressible state");
    frame
}

#[test]
fn refuses_empty_and_unknown_formats() {
    assert_eq!(decode(b""), Err(DecodeFrameError::Empty));
    assert_eq!(inspect(b""), Err(DecodeFrameError::Empty));
    for byte in [0x00, 0x04, b'{', b'[', 0xff] {
        assert_eq!(
            decode(&[byte, b'1']),
            Err(DecodeFrameError::UnknownFormat { byte })
        );
        assert_eq!(
            inspect(&[byte]),
            Err(DecodeFrameError::UnknownFormat { byte })
        );
    }
    let message = decode(b"\x7f").unwrap_err().to_string();
    assert!(
        message.contains("0x7f") && message.contains("newer loom"),
        "{message}"
    );
}

#[test]
fn refuses_a_json_frame_that_is_not_utf8_json() {
    assert_eq!(
        decode(b"\x01\"caf\xe9\""),
        Err(DecodeFrameError::NotUtf8 { valid_up_to: 4 })
    );
    assert!(matches!(
        decode(b"\x01{\"a\":"),
        Err(DecodeFrameError::NotJson(_))
    ));
    assert!(matches!(decode(b"\x01"), Err(DecodeFrameError::NotJson(_))));
}

#[test]
fn refuses_a_payload_that_is_not_a_zstd_frame() {
    assert_eq!(
        decode(b"\x02{\"a\":1}"),
        Err(DecodeFrameError::NotZstd {
            found: "no zstd magic number"
        })
    );
    let skippable = [&[0x02u8, 0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0][..]].concat();
    assert_eq!(
        decode(&skippable),
        Err(DecodeFrameError::NotZstd {
            found: "a skippable frame"
        })
    );
    assert_eq!(
        decode(b"\x02\x28\xb5"),
        Err(DecodeFrameError::Truncated {
            inside: "the zstd magic number"
        })
    );
}

#[test]
fn refuses_anything_after_the_frame() {
    let state = agent_state(2, false);
    let frame = zstd_frame_of(&state);
    let end = frame.len() - 1;
    let cases = [
        (b"x".to_vec(), TrailingKind::Bytes),
        (frame[1..].to_vec(), TrailingKind::ZstdFrame),
        (
            vec![0x5f, 0x2a, 0x4d, 0x18, 1, 0, 0, 0, 0],
            TrailingKind::SkippableFrame,
        ),
    ];
    for (tail, kind) in cases {
        let tampered = [&frame[..], &tail[..]].concat();
        let expected = DecodeFrameError::TrailingBytes {
            kind,
            offset: end,
            count: tail.len(),
        };
        assert_eq!(decode(&tampered), Err(expected.clone()));
        assert_eq!(inspect(&tampered), Err(expected));
    }
}

#[test]
fn refuses_a_truncated_frame_at_every_length() {
    let frame = zstd_frame_of(&agent_state(3, false));
    for len in 2..frame.len() {
        let err = decode(&frame[..len]).unwrap_err();
        assert!(
            matches!(err, DecodeFrameError::Truncated { .. }),
            "cut at {len}: {err}"
        );
    }
}

#[test]
fn refuses_corruption_by_checksum_or_structure() {
    let state = agent_state(3, false);
    let frame = zstd_frame_of(&state);
    let mut refused = 0;
    for at in 12..frame.len() {
        let mut corrupt = frame.clone();
        corrupt[at] ^= 0x20;
        match decode(&corrupt) {
            // A few bits zstd never reads (table padding) change nothing.
            Ok(text) => assert_eq!(text, state, "flip at {at} decoded to another state"),
            Err(
                DecodeFrameError::ChecksumMismatch
                | DecodeFrameError::Corrupt { .. }
                | DecodeFrameError::Truncated { .. }
                | DecodeFrameError::TrailingBytes { .. },
            ) => refused += 1,
            Err(other) => panic!("flip at {at}: unexpected {other}"),
        }
    }
    assert!(refused * 10 > (frame.len() - 12) * 9, "{refused} refused");
    // Flipping the stored checksum itself is always a mismatch.
    let mut corrupt = frame.clone();
    *corrupt.last_mut().unwrap() ^= 1;
    assert_eq!(decode(&corrupt), Err(DecodeFrameError::ChecksumMismatch));
}

/// A zstd frame header with the given descriptor bits and one raw block.
fn handmade(descriptor: u8, extra_header: &[u8], block: &[u8], checksum: bool) -> Vec<u8> {
    let mut frame = vec![0x02, 0x28, 0xb5, 0x2f, 0xfd, descriptor];
    frame.extend_from_slice(extra_header);
    let header = (block.len() as u32) << 3 | 1; // raw, last
    frame.extend_from_slice(&header.to_le_bytes()[..3]);
    frame.extend_from_slice(block);
    if checksum {
        frame.extend_from_slice(&[0, 0, 0, 0]);
    }
    frame
}

#[test]
fn refuses_a_frame_without_checksum_or_with_a_dictionary() {
    // single segment, 1-byte content size, no checksum
    let unchecked = handmade(0x20, &[3], b"[1]", false);
    assert_eq!(decode(&unchecked), Err(DecodeFrameError::MissingChecksum));
    let info = inspect(&unchecked).unwrap();
    assert!(!info.has_checksum);
    assert_eq!(info.declared_bytes, Some(3));
    // single segment, 1-byte dictionary id 7, checksum
    let with_dictionary = handmade(0x25, &[7, 3], b"[1]", true);
    assert_eq!(
        decode(&with_dictionary),
        Err(DecodeFrameError::DictionaryRequired { id: 7 })
    );
}

#[test]
fn refuses_a_declared_size_over_the_ceiling_before_inflating() {
    // 8-byte content size of 600 MiB, window descriptor, checksum.
    let declared = 600u64 * 1024 * 1024;
    let mut extra = vec![0x58]; // window 2^21
    extra.extend_from_slice(&declared.to_le_bytes());
    let frame = handmade(0xC4, &extra, b"[1]", true);
    assert_eq!(
        decode(&frame),
        Err(DecodeFrameError::StateTooLarge {
            declared: Some(declared),
            limit: MAX_DECODED_STATE_BYTES
        })
    );
    assert_eq!(inspect(&frame).unwrap().declared_bytes, Some(declared));
}

#[test]
fn refuses_a_declared_size_its_blocks_cannot_hold() {
    let frame = handmade(0x64, &[0x00, 0x10], b"[1]", true); // declares 4096+256
    assert!(matches!(
        decode(&frame),
        Err(DecodeFrameError::Corrupt { .. })
    ));
}

#[test]
fn refuses_reserved_bits_and_block_types() {
    let reserved_bit = handmade(0x28, &[3], b"[1]", false);
    assert!(matches!(
        decode(&reserved_bit),
        Err(DecodeFrameError::Corrupt { .. })
    ));
    let mut reserved_block = handmade(0x24, &[3], b"[1]", true);
    reserved_block[7] |= 0b110; // block type 3
    assert!(matches!(
        decode(&reserved_block),
        Err(DecodeFrameError::Corrupt { .. })
    ));
}

#[test]
fn refuses_a_zstd_payload_that_is_not_json() {
    let not_json = format!("{{\"a\":\"{}\"", "word ".repeat(100));
    let frame = zstd_payload::compress(not_json.as_bytes(), 0x02)
        .unwrap()
        .unwrap();
    assert!(matches!(decode(&frame), Err(DecodeFrameError::NotJson(_))));
    let latin1: Vec<u8> = [b"\"".as_slice(), &[0xe9; 200], b"\""].concat();
    let frame = zstd_payload::compress(&latin1, 0x02).unwrap().unwrap();
    assert_eq!(
        decode(&frame),
        Err(DecodeFrameError::NotUtf8 { valid_up_to: 1 })
    );
}

#[test]
fn every_error_names_its_cause() {
    let cases: Vec<(DecodeFrameError, &str)> = vec![
        (DecodeFrameError::Empty, "empty"),
        (DecodeFrameError::MissingChecksum, "checksum"),
        (DecodeFrameError::ChecksumMismatch, "checksum mismatch"),
        (
            DecodeFrameError::DictionaryRequired { id: 9 },
            "dictionary 9",
        ),
        (
            DecodeFrameError::StateTooLarge {
                declared: None,
                limit: 1,
            },
            "too large",
        ),
        (
            DecodeFrameError::TrailingBytes {
                kind: TrailingKind::ZstdFrame,
                offset: 3,
                count: 4,
            },
            "a second zstd frame",
        ),
    ];
    for (err, needle) in cases {
        assert!(err.to_string().contains(needle), "{err}");
    }
}

fn arbitrary_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,40}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..8)
                .prop_map(|entries| serde_json::Value::Object(entries.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn round_trips_arbitrary_json_exactly(value in arbitrary_json(), pretty in any::<bool>()) {
        let text = if pretty {
            serde_json::to_string_pretty(&value).unwrap()
        } else {
            serde_json::to_string(&value).unwrap()
        };
        for codec in [Codec::None, Codec::Zstd] {
            let frame = encode(&text, codec).unwrap();
            prop_assert!(frame.len() <= text.len() + 1);
            prop_assert_eq!(&decode(&frame).unwrap(), &text);
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
        let _ = inspect(&bytes);
    }

    #[test]
    fn never_panics_on_a_mutated_real_frame(at in 0usize..10_000, xor in 1u8..=255, cut in 0usize..10_000) {
        let mut frame = zstd_frame_of(&agent_state(2, false));
        let at = at % frame.len();
        frame[at] ^= xor;
        frame.truncate(cut.max(1).min(frame.len()));
        let _ = inspect(&frame);
        if let Ok(text) = decode(&frame) {
            // Whatever decodes is JSON: corruption never yields non-JSON.
            prop_assert!(crate::json::validate(text.as_bytes()).is_ok());
        }
    }
}

#[test]
fn refuses_a_block_larger_than_the_window() {
    // Found by fuzzing: a 1 KiB window (descriptor 0x00) with a 65,963-byte
    // RLE block. zstd's streaming and one-shot decoders disagreed on it.
    let frame = [
        2u8, 0x28, 0xb5, 0x2f, 0xfd, 0x14, 0x00, 0x5b, 0x0d, 0x08, 0, 0, 0, 0, 0,
    ];
    let err = decode(&frame).unwrap_err();
    assert!(
        matches!(&err, DecodeFrameError::Corrupt { reason } if reason.contains("1024-byte block limit")),
        "{err}"
    );
}

#[test]
fn refuses_an_undeclared_frame_whose_window_would_be_allocated_outside_accounting() {
    // No content size, checksum, window descriptor 0x88: 2^27 bytes, the
    // most zstd's streaming decoder accepts by default.
    let huge = handmade(0x04, &[0x88], b"[1]", true);
    assert_eq!(
        decode(&huge),
        Err(DecodeFrameError::WindowTooLarge {
            window: 1 << 27,
            limit: MAX_UNDECLARED_WINDOW_BYTES
        })
    );
    // At the limit (0x60: 2^22) the window passes and the frame is judged
    // on its content: this one's checksum is zeros.
    let at_limit = handmade(0x04, &[0x60], b"[1]", true);
    assert_eq!(decode(&at_limit), Err(DecodeFrameError::ChecksumMismatch));
    // A declared size is inflated into the output, which is the window:
    // any window.
    let declared = handmade(0x84, &[0x88, 3, 0, 0, 0], b"[1]", true);
    assert!(!matches!(
        decode(&declared),
        Err(DecodeFrameError::WindowTooLarge { .. })
    ));
}

/// A frame made with `parameters` on top of loom's own (level 3, checksum,
/// content size), for block layouts loom's encoder does not make.
fn zstd_frame_with(state: &str, parameters: &[zstd_safe::CParameter]) -> Vec<u8> {
    let mut cctx = zstd_safe::CCtx::create();
    for &parameter in [
        zstd_safe::CParameter::CompressionLevel(3),
        zstd_safe::CParameter::ChecksumFlag(true),
        zstd_safe::CParameter::ContentSizeFlag(true),
    ]
    .iter()
    .chain(parameters)
    {
        cctx.set_parameter(parameter).unwrap();
    }
    let mut frame = vec![0x02];
    frame.reserve(zstd_safe::compress_bound(state.len()));
    let mut output = zstd_safe::OutBuffer::around_pos(&mut frame, 1);
    let mut input = zstd_safe::InBuffer::around(state.as_bytes());
    let remaining = cctx
        .compress_stream2(
            &mut output,
            &mut input,
            zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end,
        )
        .unwrap();
    assert_eq!(remaining, 0);
    frame
}

#[test]
fn inflates_frames_of_every_block_layout_a_few_blocks_a_call() {
    // RLE blocks (runs of one byte), raw ones (no two bytes alike nearby),
    // compressed ones, and a few hundred small compressed ones.
    let mut noise = String::new();
    let mut x: u32 = 1;
    for _ in 0..300_000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        noise.push(char::from(b'#' + (x >> 16) as u8 % 56));
    }
    let state = format!(
        r#"{{"runs":"{}","noise":"{noise}","turns":{},"deep":{}}}"#,
        "a".repeat(1 << 20),
        agent_state(50, true).len(),
        format_args!("{}0{}", "[".repeat(300_000), "]".repeat(300_000)),
    );
    let small_blocks = zstd_frame_with(&state, &[zstd_safe::CParameter::TargetCBlockSize(1340)]);
    for frame in [zstd_frame_of(&state), small_blocks] {
        assert_eq!(decode(&frame).unwrap(), state);
        let text = decode_into(&frame, |len| vec![0u8; len]).unwrap();
        assert_eq!(text, state.as_bytes());
    }
}

#[test]
fn inflates_a_single_segment_frame_past_zstds_default_window_limit() {
    // Single segment: the window is the whole 130 MiB content, over the
    // 128 MiB a streaming decoder takes by default. Inflated into the
    // caller's buffer, it needs no window of its own, as in one shot.
    let state = format!("\"{}\"", "a".repeat(130 << 20));
    let frame = zstd_frame_with(&state, &[zstd_safe::CParameter::WindowLog(28)]);
    assert_eq!(frame[5] & 0x20, 0x20, "single segment");
    assert_eq!(decode_json(&frame).unwrap().as_str().len(), state.len());
}
