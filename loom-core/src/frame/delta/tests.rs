use super::*;
use crate::frame::{decode, decode_into, encode, inspect, Codec, DecodeFrameError, Format};
use loom_fixtures::agent_state;
use proptest::prelude::*;

fn keyframe(sequence: i64, text: &str) -> Keyframe<'_> {
    Keyframe { sequence, text }
}

/// A 40-turn run saved after every turn as the stores save it: every
/// state comes back exactly, from its frame and the keyframe it names.
#[test]
fn every_save_of_a_run_decodes_to_its_exact_text() {
    let policy = KeyframePolicy::default();
    let states: Vec<String> = (1..=40).map(|t| agent_state(t, false)).collect();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut current: Option<usize> = None;
    let mut since = 0;
    for state in &states {
        let base = current.map(|k| KeyframeBase {
            keyframe: keyframe(k as i64, &states[k]),
            frame_bytes: frames[k].len(),
            deltas_since: since,
        });
        let frame = policy.encode(state, base).unwrap();
        if frame[0] == Format::Delta.byte() {
            since += 1;
        } else {
            current = Some(frames.len());
            since = 0;
        }
        frames.push(frame);
    }
    let deltas = frames.iter().filter(|f| f[0] == 0x03).count();
    assert!(deltas > 30, "{deltas} deltas of 40");
    for (i, frame) in frames.iter().enumerate() {
        let base = base_sequence(frame).map(|k| frames[k as usize].as_slice());
        assert_eq!(
            decode_with_base(frame, base).unwrap(),
            states[i],
            "save {i}"
        );
    }
}

#[test]
fn a_delta_of_a_run_is_a_fraction_of_its_keyframe() {
    let base = agent_state(100, false);
    let next = agent_state(101, false);
    let delta = encode_delta(&next, keyframe(100, &base)).unwrap();
    let full = encode(&next, Codec::Zstd).unwrap();
    assert!(
        delta.len() * 10 < full.len(),
        "{} vs {}",
        delta.len(),
        full.len()
    );
    let info = inspect(&delta).unwrap();
    assert_eq!(info.format, Format::Delta);
    assert_eq!(info.declared_bytes, Some(next.len() as u64));
    assert!(info.has_checksum);
}

#[test]
fn the_header_names_the_keyframe_by_sequence_length_and_hash() {
    let delta = encode_delta("[1,2]", keyframe(-5, "[1]")).unwrap();
    assert_eq!(&delta[..9], b"\x03\xff\xff\xff\xff\xff\xff\xff\xfb");
    assert_eq!(
        header(&delta).unwrap(),
        DeltaHeader {
            base_sequence: -5,
            base_bytes: 3,
            base_xxh64: crate::xxh64::xxh64(b"[1]"),
        }
    );
}

#[test]
fn a_keyframe_decodes_whatever_base_is_given() {
    let frame = encode(r#"{"a":1}"#, Codec::Zstd).unwrap();
    assert_eq!(decode_with_base(&frame, None).unwrap(), r#"{"a":1}"#);
    assert_eq!(
        decode_with_base(&frame, Some(b"\x01[]")).unwrap(),
        r#"{"a":1}"#
    );
}

/// Every way a delta can meet the wrong base, or be malformed: a typed
/// error each, never a text.
#[test]
fn hostile_deltas_are_typed_errors() {
    let base = agent_state(20, false);
    let next = agent_state(21, false);
    let good_base = encode(&base, Codec::Zstd).unwrap();
    let delta = encode_delta(&next, keyframe(20, &base)).unwrap();
    let missing = DecodeFrameError::DeltaBaseMissing { base_sequence: 20 };
    let mismatch = DecodeFrameError::DeltaBaseMismatch { base_sequence: 20 };

    // Without its base, by every entry point.
    assert_eq!(decode_with_base(&delta, None), Err(missing.clone()));
    assert_eq!(decode(&delta), Err(missing.clone()));
    assert_eq!(decode_into(&delta, |n| vec![0; n]), Err(missing));
    // Another execution's keyframe; the same one saved over with a state
    // of the same length; as a 0x01 frame of another text.
    let other = encode(&agent_state(20, true), Codec::Zstd).unwrap();
    assert_eq!(
        decode_with_base(&delta, Some(&other)),
        Err(mismatch.clone())
    );
    let mut swapped = base.clone().into_bytes();
    let at = swapped.iter().rposition(|&b| b == b'a').unwrap();
    swapped[at] = b'b';
    let swapped = encode(std::str::from_utf8(&swapped).unwrap(), Codec::Zstd).unwrap();
    assert_eq!(
        decode_with_base(&delta, Some(&swapped)),
        Err(mismatch.clone())
    );
    assert_eq!(
        decode_with_base(&delta, Some(b"\x01[]")),
        Err(mismatch.clone())
    );
    // A delta of a delta.
    let delta_base = encode_delta(&base, keyframe(19, &agent_state(19, false))).unwrap();
    assert_eq!(
        decode_with_base(&delta, Some(&delta_base)),
        Err(DecodeFrameError::DeltaOfDelta { base_sequence: 20 })
    );
    // A base that is not a frame at all.
    assert_eq!(
        decode_with_base(&delta, Some(b"\x09")),
        Err(DecodeFrameError::DeltaBaseCorrupt {
            base_sequence: 20,
            cause: Box::new(DecodeFrameError::UnknownFormat { byte: 9 })
        })
    );
    // A header that claims a keyframe over the ceiling.
    let mut huge = delta.clone();
    huge[9..17].copy_from_slice(&(MAX_DECODED_STATE_BYTES + 1).to_be_bytes());
    assert!(matches!(
        decode_with_base(&huge, Some(&good_base)),
        Err(DecodeFrameError::StateTooLarge { .. })
    ));
    // The hash or the length of the header tampered with.
    for at in [16, 17, 24] {
        let mut tampered = delta.clone();
        tampered[at] ^= 1;
        assert_eq!(
            decode_with_base(&tampered, Some(&good_base)),
            Err(mismatch.clone()),
            "byte {at}"
        );
    }
    // Cut inside the header, inside the zstd frame; a flipped checksum;
    // bytes after the frame.
    assert_eq!(
        decode_with_base(&delta[..10], Some(&good_base)),
        Err(DecodeFrameError::Truncated {
            inside: "the delta header"
        })
    );
    assert!(matches!(
        decode_with_base(&delta[..delta.len() - 6], Some(&good_base)),
        Err(DecodeFrameError::Truncated { .. } | DecodeFrameError::Corrupt { .. })
    ));
    let mut flipped = delta.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert_eq!(
        decode_with_base(&flipped, Some(&good_base)),
        Err(DecodeFrameError::ChecksumMismatch)
    );
    let mut trailing = delta.clone();
    trailing.extend_from_slice(b"\0\0");
    assert!(matches!(
        decode_with_base(&trailing, Some(&good_base)),
        Err(DecodeFrameError::TrailingBytes { .. })
    ));
    // A zstd frame of something that is not JSON, against the right base.
    let mut not_json = delta[..HEADER_BYTES].to_vec();
    let bare =
        super::super::zstd_payload::compress_with_prefix(b"{oops", base.as_bytes(), &[]).unwrap();
    not_json.extend_from_slice(&bare);
    assert!(matches!(
        decode_with_base(&not_json, Some(&good_base)),
        Err(DecodeFrameError::NotJson(_))
    ));
    // And it still decodes with its own base.
    assert_eq!(decode_with_base(&delta, Some(&good_base)).unwrap(), next);
}

/// The delta is judged before its keyframe is read, and a keyframe that
/// does not decode says so, with its own cause.
#[test]
fn a_bad_delta_is_refused_before_its_keyframe_and_a_bad_keyframe_is_named() {
    let base = agent_state(20, false);
    let delta = encode_delta(&agent_state(21, false), keyframe(20, &base)).unwrap();
    let mut corrupt_base = encode(&base, Codec::Zstd).unwrap();
    *corrupt_base.last_mut().unwrap() ^= 1;
    let mut trailing = delta.clone();
    trailing.extend_from_slice(b"\0\0");
    assert!(matches!(
        decode_with_base(&trailing, Some(&corrupt_base)),
        Err(DecodeFrameError::TrailingBytes { .. })
    ));
    assert_eq!(
        decode_with_base(&delta, Some(&corrupt_base)),
        Err(DecodeFrameError::DeltaBaseCorrupt {
            base_sequence: 20,
            cause: Box::new(DecodeFrameError::ChecksumMismatch),
        })
    );
}

/// States past a level-3 dictionary's reach (about 1 MiB): the whole
/// keyframe stays matchable, so a turn's delta stays a turn's size.
#[test]
fn a_delta_of_a_state_over_two_mib_is_still_a_turns_worth() {
    let base = agent_state(800, false);
    let next = agent_state(801, false);
    assert!(base.len() > 2 * 1024 * 1024, "{}", base.len());
    let delta = encode_delta(&next, keyframe(800, &base)).unwrap();
    let full = encode(&next, Codec::Zstd).unwrap();
    assert!(
        delta.len() * 10 < full.len(),
        "{} vs {}",
        delta.len(),
        full.len()
    );
    assert_eq!(
        decode_with_base(&delta, Some(&encode(&base, Codec::Zstd).unwrap())).unwrap(),
        next
    );
}

#[test]
fn encoding_refuses_what_no_reader_would_take_back() {
    assert!(matches!(
        encode_delta("{oops", keyframe(1, "[]")),
        Err(EncodeFrameError::NotJson(_))
    ));
    let over = " ".repeat(MAX_DECODED_STATE_BYTES as usize + 1);
    assert!(matches!(
        encode_delta("[]", keyframe(1, &over)),
        Err(EncodeFrameError::StateTooLarge { .. })
    ));
}

#[test]
fn the_policy_counts_deltas_and_weighs_their_size() {
    let policy = KeyframePolicy {
        max_deltas: 2,
        max_delta_percent: 50,
    };
    assert!(policy.allows_delta(1) && !policy.allows_delta(2));
    // A keyframe of 100 bytes for 1000 of text: 2000 of text would be ~200.
    assert!(policy.keeps_delta(100, 2000, 100, 1000));
    assert!(!policy.keeps_delta(101, 2000, 100, 1000));
}

/// Documents of the shapes JSON parsers disagree on, for random pairs.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = [
        "[]",
        "{}",
        "0",
        "-0.0e-0",
        "\"\"",
        "[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]",
        r#"{"a":1,"a":2,"__proto__":{}}"#,
        r#"["\ud800","\u0000","\"\\\/\b\f\n\r\t"]"#,
        "[1e308,-1e-308,123456789012345678901234567890]",
        " \t\r\n[ 1 , 2 ] \n",
        "[\"\u{e9}\u{1d11e}\u{fffd}\"]",
        r#"{"":{"":[null,true,false]}}"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for turns in [1, 7, 30] {
        docs.push(agent_state(turns, false));
        docs.push(agent_state(turns, true));
    }
    docs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_pair_of_documents_round_trips(
        base in 0usize..18,
        target in 0usize..18,
        sequence in any::<i64>(),
        as_json in any::<bool>(),
    ) {
        let docs = documents();
        let (base, target) = (&docs[base % docs.len()], &docs[target % docs.len()]);
        let delta = encode_delta(target, keyframe(sequence, base)).unwrap();
        let base_frame = encode(base, if as_json { Codec::None } else { Codec::Zstd }).unwrap();
        prop_assert_eq!(header(&delta).unwrap().base_sequence, sequence);
        prop_assert_eq!(&decode_with_base(&delta, Some(&base_frame)).unwrap(), target);
    }

    #[test]
    fn any_bytes_after_the_header_are_an_error_or_the_exact_text(
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let base = "[1,2,3]";
        let mut frame = encode_delta("[1,2,3,4]", keyframe(1, base)).unwrap();
        frame.truncate(HEADER_BYTES);
        frame.extend_from_slice(&tail);
        if let Ok(text) = decode_with_base(&frame, Some(b"\x01[1,2,3]")) {
            prop_assert!(crate::json::validate(text.as_bytes()).is_ok());
        }
    }
}
