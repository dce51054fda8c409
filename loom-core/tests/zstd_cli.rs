//! Interoperability with the reference zstd implementation, and every
//! refusal ADR 0141 D1 lists, on frames the `zstd` CLI made.

mod support;

use loom_fixtures::agent_state;
use pgloom_core::frame::{decode, encode, inspect, Codec, DecodeFrameError, TrailingKind};
use pgloom_core::MAX_DECODED_STATE_BYTES;
use support::zstd_cli_frame;

#[test]
fn the_cli_decompresses_what_loom_writes() {
    let state = agent_state(20, false);
    let frame = encode(&state, Codec::Zstd).unwrap();
    let text = zstd_cli_frame("zstd -d -c", &frame[1..]);
    assert_eq!(&text[1..], state.as_bytes());
}

#[test]
fn loom_reads_a_cli_frame_with_declared_size() {
    let state = agent_state(20, true);
    let frame = zstd_cli_frame(
        &format!("zstd -3 -c --stream-size={}", state.len()),
        state.as_bytes(),
    );
    let info = inspect(&frame).unwrap();
    assert_eq!(info.declared_bytes, Some(state.len() as u64));
    assert!(info.has_checksum);
    assert_eq!(decode(&frame).unwrap(), state);
}

#[test]
fn loom_reads_a_cli_frame_streamed_without_a_size() {
    let state = agent_state(200, false);
    let frame = zstd_cli_frame("cat | zstd -3 -c", state.as_bytes());
    assert_eq!(inspect(&frame).unwrap().declared_bytes, None);
    assert_eq!(decode(&frame).unwrap(), state);
}

#[test]
fn refuses_a_cli_frame_made_with_no_check() {
    let state = agent_state(5, false);
    let frame = zstd_cli_frame("zstd -3 -c --no-check", state.as_bytes());
    assert!(!inspect(&frame).unwrap().has_checksum);
    assert_eq!(decode(&frame), Err(DecodeFrameError::MissingChecksum));
}

#[test]
fn refuses_two_cli_frames_concatenated() {
    let state = agent_state(5, false);
    let one = zstd_cli_frame("zstd -3 -c", state.as_bytes());
    let two = [&one[..], &one[1..]].concat();
    // The reference decoder happily returns the state twice.
    let twice = zstd_cli_frame("zstd -d -c", &two[1..]);
    assert_eq!(twice.len() - 1, 2 * state.len());
    assert_eq!(
        decode(&two),
        Err(DecodeFrameError::TrailingBytes {
            kind: TrailingKind::ZstdFrame,
            offset: one.len() - 1,
            count: one.len() - 1,
        })
    );
}

#[test]
fn refuses_a_19_kb_cli_frame_that_declares_600_mib_without_inflating() {
    let declared = 600u64 * 1024 * 1024;
    let frame = zstd_cli_frame(
        &format!("head -c {declared} /dev/zero | zstd -3 -c --stream-size={declared}"),
        b"",
    );
    assert!(frame.len() < 40 * 1024, "{} bytes", frame.len());
    let started = std::time::Instant::now();
    assert_eq!(
        decode(&frame),
        Err(DecodeFrameError::StateTooLarge {
            declared: Some(declared),
            limit: MAX_DECODED_STATE_BYTES,
        })
    );
    // Inflating 600 MiB takes far longer than reading a header; this bound
    // is loose on purpose (a shared machine), the memory test is exact.
    assert!(started.elapsed().as_millis() < 200);
}

#[test]
fn stops_a_cli_frame_streamed_without_a_size_at_the_ceiling() {
    let frame = zstd_cli_frame(
        &format!(
            "head -c {} /dev/zero | zstd -3 -c",
            MAX_DECODED_STATE_BYTES + 4096
        ),
        b"",
    );
    assert_eq!(inspect(&frame).unwrap().declared_bytes, None);
    assert_eq!(
        decode(&frame),
        Err(DecodeFrameError::StateTooLarge {
            declared: None,
            limit: MAX_DECODED_STATE_BYTES,
        })
    );
}

#[test]
fn refuses_a_truncated_cli_frame() {
    let state = agent_state(5, false);
    let frame = zstd_cli_frame("zstd -3 -c", state.as_bytes());
    let cut = &frame[..frame.len() - 3];
    assert!(matches!(
        decode(cut),
        Err(DecodeFrameError::Truncated { .. })
    ));
}
