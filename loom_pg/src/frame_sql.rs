//! The snapshot frame (ADR 0141 D1) in SQL: decode in the server, so that
//! `state->'x'` works on a frame from psql, and encode there too.

use pgloom_core::frame::delta::{self, KeyframePolicy, StoredKeyframe};
use pgloom_core::frame::{self, Codec, Format};
use pgloom_core::interrupt::Ticker;
use pgloom_core::json;
use pgrx::prelude::*;
use pgrx::VariadicArray;

use crate::errors::{raise_codec, raise_decode, raise_encode};
use crate::jsonb_build::{self, PallocJsonb};
use crate::palloc_text::{PallocCString, PallocText};

/// The exact JSON text a frame holds, byte for byte: key order, duplicate
/// keys, `__proto__` and escaped lone surrogates included, which jsonb
/// cannot keep.
#[pg_extern(sql = false)]
fn loom_snapshot_state_text(frame: &[u8]) -> PallocText {
    refuse_delta(frame);
    frame::decode_into(frame, PallocText::zeroed).unwrap_or_else(|err| raise_decode(err))
}

/// The readers of a bare frame cannot decode a delta (`0x03`), which needs
/// its keyframe: refused as the SQL-only flavour refuses it (0A000), with
/// where it does decode. Nothing is corrupt, so never XX001.
fn refuse_delta(frame: &[u8]) {
    if frame.first() == Some(&Format::Delta.byte()) {
        ereport!(
            ERROR,
            pgrx::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "a delta snapshot frame (0x03) decodes only with its keyframe, which this function does not take",
            "Read it from loom.snapshots_decoded or loom_load_snapshot, or call loom_snapshot_state_text(frame, base) with the frame of the keyframe loom_snapshot_base_sequence(frame) names."
        );
    }
}

/// A frame's state as Postgres jsonb, built from loom's own parse of the
/// validated text straight into jsonb's layout (the same bytes
/// `text::jsonb` makes, without a second lexer): see [`jsonb_build`].
#[pg_extern(sql = false)]
fn loom_snapshot_state(frame: &[u8]) -> PallocJsonb {
    refuse_delta(frame);
    // Decoded into palloc'd memory, as the text function does: accounted,
    // and jsonb_in's cstring as it is when the builder declines.
    let state =
        frame::decode_into(frame, PallocCString::zeroed).unwrap_or_else(|err| raise_decode(err));
    let jsonb = jsonb_build::to_jsonb(&state);
    state.free();
    jsonb
}

/// Any frame with the keyframe it may name: a keyframe decodes as
/// [`loom_snapshot_state_text`] does (`base` unused), a delta against
/// `base`, its keyframe's frame as stored. Not strict: a keyframe's base is
/// NULL.
#[pg_extern(sql = false)]
fn loom_snapshot_state_text_with_base(
    frame: Option<&[u8]>,
    base: Option<&[u8]>,
) -> Option<PallocText> {
    let frame = frame?;
    if frame.first() != Some(&Format::Delta.byte()) {
        return Some(loom_snapshot_state_text(frame));
    }
    let text = delta::decode_with_base(frame, base).unwrap_or_else(|err| raise_decode(err));
    let mut out = PallocText::zeroed(text.len());
    out.as_mut().copy_from_slice(text.as_bytes());
    Some(out)
}

/// [`loom_snapshot_state_text_with_base`] as jsonb, built as
/// [`loom_snapshot_state`] builds it (not through jsonb's own parser): a
/// delta read through `loom.snapshots_decoded` costs what a keyframe does.
#[pg_extern(sql = false)]
fn loom_snapshot_state_with_base(frame: Option<&[u8]>, base: Option<&[u8]>) -> Option<PallocJsonb> {
    let frame = frame?;
    if frame.first() != Some(&Format::Delta.byte()) {
        return Some(loom_snapshot_state(frame));
    }
    let text = delta::decode_with_base(frame, base).unwrap_or_else(|err| raise_decode(err));
    let state = PallocCString::from_str(&text);
    drop(text);
    let jsonb = jsonb_build::to_jsonb(&state);
    state.free();
    Some(jsonb)
}

/// The frame a delta store writes for `state`: a delta against `base`
/// (the frame of the keyframe at `base_sequence`), or a keyframe (what
/// codec `'zstd'` writes) when there is no base or [`KeyframePolicy`]
/// asks for one. The keyframe is decoded here, so a wrong one (a delta, a
/// corrupt frame) is an ERROR, never a delta against it.
#[pg_extern(sql = false)]
fn loom_snapshot_delta_frame(
    state: Option<&str>,
    base_sequence: Option<i64>,
    base: Option<&[u8]>,
    deltas_since: Option<i32>,
) -> Option<Vec<u8>> {
    let state = state?;
    let keyframe = base_sequence
        .zip(base)
        .map(|(sequence, frame)| StoredKeyframe {
            sequence,
            frame,
            deltas_since: u32::try_from(deltas_since.unwrap_or(0)).unwrap_or(0),
        });
    Some(
        KeyframePolicy::default()
            .encode_against(state, keyframe)
            .unwrap_or_else(|err| raise_encode(err)),
    )
}

/// Frames a state's JSON text: `'zstd'` (the default) gives `0x02`, or
/// `0x01` when zstd would not make it smaller; `'none'` gives `0x01`.
#[pg_extern(sql = false)]
fn loom_snapshot_frame(state: &str, codec: default!(&str, "'zstd'")) -> Vec<u8> {
    let codec: Codec = codec.parse().unwrap_or_else(|err| raise_codec(err));
    if codec == Codec::Delta {
        // A delta is made against the execution's keyframe, which a bare
        // state does not name: never a keyframe passed off as one.
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "codec 'delta' needs the execution's keyframe: save with loom_save_snapshot(..., 'delta'), or frame with 'zstd' or 'none'"
        );
    }
    frame::encode(state, codec).unwrap_or_else(|err| raise_encode(err))
}

/// A frame's header, read without inflating it.
#[pg_extern(sql = false)]
fn loom_snapshot_frame_info(
    frame: &[u8],
) -> TableIterator<
    'static,
    (
        name!(format, String),
        name!(stored_bytes, i32),
        name!(declared_bytes, Option<i64>),
        name!(has_checksum, bool),
    ),
> {
    let info = frame::inspect(frame).unwrap_or_else(|err| raise_decode(err));
    TableIterator::once((
        info.format.as_str().to_owned(),
        // A bytea is at most 1 GB, so its length always fits.
        i32::try_from(info.stored_bytes).unwrap_or(i32::MAX),
        info.declared_bytes
            .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        info.has_checksum,
    ))
}

/// The exact text of the value at `path` in a frame's state, found by
/// `#>`'s rules (keys, array indexes, negative from the end) without making
/// the whole state jsonb: what `loom_snapshot_get` reads `->'turns'->0`
/// with. NULL where there is no such value, or a path element is NULL.
#[pg_extern(sql = false)]
fn loom_snapshot_get_text(frame: &[u8], path: VariadicArray<'_, &str>) -> Option<String> {
    let steps = path_steps(&path)?;
    refuse_delta(frame);
    let state = frame::decode_json(frame).unwrap_or_else(|err| raise_decode(err));
    json::find_path(&state, &steps).map(str::to_owned)
}

/// [`loom_snapshot_get_text`] of any frame: a delta with `base`, the
/// frame of the keyframe it names, as [`loom_snapshot_state_text_with_base`]
/// takes it. NULL for a NULL frame or path.
#[pg_extern(sql = false)]
fn loom_snapshot_get_text_with_base(
    frame: Option<&[u8]>,
    base: Option<&[u8]>,
    path: Option<VariadicArray<'_, &str>>,
) -> Option<String> {
    let (frame, path) = (frame?, path?);
    let steps = path_steps(&path)?;
    let state = delta::decode_json_with_base(frame, base).unwrap_or_else(|err| raise_decode(err));
    json::find_path(&state, &steps).map(str::to_owned)
}

/// A getter's path; `None` when a step is NULL. A path of millions of
/// steps is input too (issue 25): checked for interrupts as it is read, as
/// find_path checks as it walks.
fn path_steps<'a>(path: &'a VariadicArray<'_, &str>) -> Option<Vec<&'a str>> {
    let mut ticker = Ticker::starting_at(0);
    path.iter()
        .enumerate()
        .map(|(i, step)| {
            ticker.at(i);
            step
        })
        .collect()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::test_support::error_of;
    use loom_fixtures::agent_state;
    use pgloom_core::frame::{encode, Codec, MAX_DECODED_STATE_BYTES};
    use pgrx::prelude::*;
    use pgrx::PgSqlErrorCode::{self, *};

    fn decode_error(frame: &[u8]) -> (PgSqlErrorCode, String) {
        error_of(|| super::loom_snapshot_state_text(frame))
    }

    /// A keyframe of another state than the delta tests' keyframe.
    fn other_keyframe() -> Vec<u8> {
        encode(&agent_state(10, true), Codec::Zstd).unwrap()
    }

    fn state_text(frame: &[u8]) -> String {
        Spi::get_one_with_args::<String>("SELECT loom_snapshot_state_text($1)", &[frame.into()])
            .unwrap()
            .unwrap()
    }

    /// A delta written in the server decodes with its keyframe, and with
    /// nothing else: a missing or another keyframe is XX001, a delta as
    /// the keyframe 22P03, and the header is read without inflating.
    #[pg_test]
    fn deltas_decode_with_their_keyframe_and_refuse_any_other() {
        let base = agent_state(10, false);
        let next = agent_state(11, false);
        let keyframe = encode(&base, Codec::Zstd).unwrap();
        let delta =
            super::loom_snapshot_delta_frame(Some(&next), Some(10), Some(&keyframe), Some(0))
                .unwrap();
        assert_eq!(delta[0], 0x03);
        assert_eq!(
            Spi::get_one_with_args::<String>(
                "SELECT loom_snapshot_state_text($1, $2)",
                &[delta.clone().into(), keyframe.clone().into()]
            )
            .unwrap()
            .as_deref(),
            Some(next.as_str())
        );
        assert_eq!(
            Spi::get_one_with_args::<i64>(
                "SELECT loom_snapshot_base_sequence($1)",
                &[delta.clone().into()]
            )
            .unwrap(),
            Some(10)
        );
        assert_eq!(
            Spi::get_one_with_args::<String>(
                "SELECT (loom_snapshot_frame_info($1)).format",
                &[delta.clone().into()]
            )
            .unwrap()
            .as_deref(),
            Some("delta")
        );
        let other = other_keyframe();
        assert_eq!(
            error_of(|| super::loom_snapshot_state_text_with_base(Some(&delta), Some(&other))).0,
            ERRCODE_DATA_CORRUPTED
        );
        assert_eq!(
            error_of(|| super::loom_snapshot_state_text_with_base(Some(&delta), None)).0,
            ERRCODE_DATA_CORRUPTED
        );
        // The path getters of a delta take its keyframe; the bare-frame
        // getter, as every bare-frame reader, refuses it.
        let last_turn = Spi::get_one_with_args::<String>(
            "SELECT loom_snapshot_get_text($1, $2, 'turns', '-1')",
            &[delta.clone().into(), keyframe.clone().into()],
        )
        .unwrap()
        .unwrap();
        let expected = Spi::get_one_with_args::<String>(
            "SELECT ($1::jsonb #> '{turns,-1}')::text",
            &[next.clone().into()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            Spi::get_one_with_args::<bool>(
                "SELECT $1::jsonb = $2::jsonb AND loom_snapshot_get($3, $4, 'turns', '-1') = $2::jsonb",
                &[
                    last_turn.clone().into(),
                    expected.into(),
                    delta.clone().into(),
                    keyframe.clone().into()
                ]
            )
            .unwrap(),
            Some(true),
            "{last_turn}"
        );
        assert_eq!(
            Spi::get_one_with_args::<String>(
                "SELECT loom_snapshot_get_text($1, NULL::bytea, 'turns', '0')",
                &[keyframe.clone().into()],
            )
            .unwrap(),
            Spi::get_one_with_args::<String>(
                "SELECT loom_snapshot_get_text($1, 'turns', '0')",
                &[keyframe.clone().into()],
            )
            .unwrap(),
        );
        assert_eq!(
            error_of(|| {
                Spi::get_one_with_args::<String>(
                    "SELECT loom_snapshot_get_text($1, 'turns')",
                    &[delta.clone().into()],
                )
            })
            .0,
            ERRCODE_FEATURE_NOT_SUPPORTED
        );
        assert_eq!(
            error_of(|| {
                Spi::get_one_with_args::<String>(
                    "SELECT loom_snapshot_get_text($1, $2, 'turns')",
                    &[delta.clone().into(), other_keyframe().into()],
                )
            })
            .0,
            ERRCODE_DATA_CORRUPTED
        );
        // Codec 'delta' alone names no keyframe: refused, never a keyframe.
        assert_eq!(
            error_of(|| {
                Spi::get_one_with_args::<Vec<u8>>(
                    "SELECT loom_snapshot_frame($1, 'delta')",
                    &[next.clone().into()],
                )
            })
            .0,
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        // A bare-frame reader refuses a delta as the SQL-only flavour does.
        for (code, message) in [
            error_of(|| super::loom_snapshot_state_text(&delta)),
            error_of(|| super::loom_snapshot_state(&delta)),
        ] {
            assert_eq!(code, ERRCODE_FEATURE_NOT_SUPPORTED);
            assert!(message.contains("keyframe"), "{message}");
        }
        assert_eq!(
            error_of(|| super::loom_snapshot_state_text_with_base(Some(&delta), Some(&delta))).0,
            ERRCODE_INVALID_BINARY_REPRESENTATION
        );
        assert_eq!(
            error_of(|| super::loom_snapshot_delta_frame(
                Some(&next),
                Some(10),
                Some(&delta),
                Some(0)
            ))
            .0,
            ERRCODE_INVALID_BINARY_REPRESENTATION
        );
        // No base, or the policy's 16 deltas reached: a keyframe.
        for (base, since) in [(None, 0), (Some(keyframe.as_slice()), 16)] {
            let frame =
                super::loom_snapshot_delta_frame(Some(&next), Some(10), base, Some(since)).unwrap();
            assert_eq!(frame, encode(&next, Codec::Zstd).unwrap());
        }
    }

    #[pg_test]
    fn decodes_both_formats_to_the_exact_text() {
        let states = [
            r#"{"z":1,"a":2,"a":3}"#.to_owned(),
            r#"{"__proto__":{"x":"\ud800"},"nul":"\u0000"}"#.to_owned(),
            format!("{}0{}", "[".repeat(2000), "]".repeat(2000)),
            agent_state(50, false),
        ];
        for state in &states {
            for codec in [Codec::None, Codec::Zstd] {
                assert_eq!(&state_text(&encode(state, codec).unwrap()), state);
            }
        }
    }

    #[pg_test]
    fn decodes_to_postgres_jsonb() {
        let frame = encode(r#"{"b":{"turn":7},"a":[1,2]}"#, Codec::Zstd).unwrap();
        let turn = Spi::get_one_with_args::<i32>(
            "SELECT (loom_snapshot_state($1)->'b'->>'turn')::int",
            &[frame.as_slice().into()],
        )
        .unwrap();
        assert_eq!(turn, Some(7));
        let same = Spi::get_one_with_args::<bool>(
            r#"SELECT loom_snapshot_state($1) = '{"a":[1,2],"b":{"turn":7}}'::jsonb"#,
            &[frame.as_slice().into()],
        )
        .unwrap();
        assert_eq!(same, Some(true));
    }

    #[pg_test]
    fn gets_a_path_as_jsonb_would_without_making_the_whole_state_jsonb() {
        // Every path `#>` answers on the whole jsonb, on the bench's states
        // and a hand-made one with duplicates, escapes and scalars.
        let mut states: Vec<String> = [(3, false), (3, true), (50, true)]
            .iter()
            .map(|&(turns, claim_checked)| agent_state(turns, claim_checked))
            .collect();
        states.push(
            r#"{"k":[1,{"caf\u00e9":"x"}],"k":[true,[2,3]],"s":"t","n":-1.5e2,"":{}}"#.to_owned(),
        );
        let paths = [
            "{}",
            "{k}",
            "{k,0}",
            "{k,1}",
            "{k,1,1}",
            "{k,-1}",
            "{k,-3}",
            "{k,x}",
            "{s}",
            "{s,0}",
            "{n}",
            "{\"\"}",
            "{turns}",
            "{turns,0}",
            "{turns,-1}",
            "{turns,1,call}",
            "{turns,2,result}",
            "{turns,9999}",
            "{nothing,0}",
            // Indexes as jsonb_get_element reads them (strtol, then NULL
            // unless all of it was read into an int).
            "{k,\" 1\"}",
            "{k,\"\t\n1\"}",
            "{k,\"1 \"}",
            "{k,+1}",
            "{k,01}",
            "{k,-0}",
            "{k,\" -1\"}",
            "{k,-+1}",
            "{k,1e0}",
            "{k,1.0}",
            "{k,0x1}",
            "{k,\"\"}",
            "{k,\" \"}",
            "{k,-}",
            "{k,2147483648}",
            "{k,-2147483648}",
            "{k,99999999999999999999}",
            "{turns,\" 0\",call}",
            "{turns,+1}",
        ];
        for state in &states {
            let frame = encode(state, Codec::Zstd).unwrap();
            for path in paths {
                let same = Spi::get_one_with_args::<bool>(
                    "SELECT loom_snapshot_get($1, VARIADIC $2::text[]) IS NOT DISTINCT FROM
                            loom_snapshot_state($1) #> $2::text[]",
                    &[frame.as_slice().into(), path.into()],
                )
                .unwrap();
                assert_eq!(
                    same,
                    Some(true),
                    "{path} in {}",
                    &state[..state.len().min(80)]
                );
            }
        }
        let frame = encode(r#"{"a":{"b":[10,20]}}"#, Codec::None).unwrap();
        assert_eq!(
            Spi::get_one_with_args::<String>(
                "SELECT loom_snapshot_get_text($1, 'a', 'b', '-1')",
                &[frame.as_slice().into()],
            )
            .unwrap()
            .as_deref(),
            Some("20")
        );
        assert_eq!(
            Spi::get_one_with_args::<String>(
                "SELECT loom_snapshot_get_text($1, 'a', NULL)",
                &[frame.as_slice().into()],
            )
            .unwrap(),
            None
        );
    }

    #[pg_test]
    fn jsonb_refuses_what_jsonb_cannot_hold_with_its_own_error() {
        // Each as text::jsonb refuses it: a NUL escape, lone surrogates, a
        // number past numeric's range (raised inside loom's builder).
        for (state, expected) in [
            (r#"{"nul":"\u0000"}"#, ERRCODE_UNTRANSLATABLE_CHARACTER),
            (r#"["\ud800"]"#, ERRCODE_INVALID_TEXT_REPRESENTATION),
            (r#"{"k":"\udc00"}"#, ERRCODE_INVALID_TEXT_REPRESENTATION),
            ("[1e999999999]", ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
        ] {
            let frame = encode(state, Codec::None).unwrap();
            let (code, _) = error_of(|| {
                Spi::get_one_with_args::<pgrx::JsonB>(
                    "SELECT loom_snapshot_state($1)",
                    &[frame.as_slice().into()],
                )
            });
            assert_eq!(code, expected, "{state}");
        }
    }

    #[pg_test]
    fn frames_in_the_server_as_the_client_does() {
        let state = agent_state(20, false);
        for (codec, byte) in [("zstd", 2u8), ("none", 1u8)] {
            let frame = Spi::get_one_with_args::<Vec<u8>>(
                "SELECT loom_snapshot_frame($1, $2)",
                &[state.as_str().into(), codec.into()],
            )
            .unwrap()
            .unwrap();
            assert_eq!(frame[0], byte);
            assert_eq!(frame, encode(&state, codec.parse().unwrap()).unwrap());
        }
        let default = Spi::get_one_with_args::<Vec<u8>>(
            "SELECT loom_snapshot_frame($1)",
            &[state.as_str().into()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(default[0], 2, "zstd is the default codec");
    }

    #[pg_test]
    fn frames_jsonb_as_its_canonical_text() {
        let text = Spi::get_one::<String>(
            r#"SELECT loom_snapshot_state_text(loom_snapshot_frame('{"b":1,"a":2}'::jsonb, 'none'))"#,
        )
        .unwrap();
        assert_eq!(text.as_deref(), Some(r#"{"a": 2, "b": 1}"#));
    }

    #[pg_test]
    fn refuses_to_frame_bad_input() {
        let (code, message) = error_of(|| super::loom_snapshot_frame("{nope}", "zstd"));
        assert_eq!(code, ERRCODE_INVALID_TEXT_REPRESENTATION);
        assert!(message.contains("not JSON"), "{message}");
        let (code, message) = error_of(|| super::loom_snapshot_frame("{}", "lz4"));
        assert_eq!(code, ERRCODE_INVALID_PARAMETER_VALUE);
        assert!(message.contains("\"lz4\""), "{message}");
        let huge = format!("\"{}\"", "a".repeat(MAX_DECODED_STATE_BYTES as usize));
        let (code, _) = error_of(|| super::loom_snapshot_frame(&huge, "none"));
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
    }

    #[pg_test]
    fn reports_the_header_without_inflating() {
        let state = agent_state(10, false);
        let frame = encode(&state, Codec::Zstd).unwrap();
        let (format, stored, declared) = Spi::get_three_with_args::<String, i32, i64>(
            "SELECT format, stored_bytes, declared_bytes FROM loom_snapshot_frame_info($1)",
            &[frame.as_slice().into()],
        )
        .unwrap();
        assert_eq!(format.as_deref(), Some("zstd"));
        assert_eq!(stored, Some(frame.len() as i32));
        assert_eq!(declared, Some(state.len() as i64));
        let json = Spi::get_two::<String, bool>(
            r#"SELECT format, has_checksum FROM loom_snapshot_frame_info('\x015b315d')"#,
        )
        .unwrap();
        assert_eq!(json, (Some("json".to_owned()), Some(false)));
        let (code, _) = error_of(|| super::loom_snapshot_frame_info(b"\x09"));
        assert_eq!(code, ERRCODE_FEATURE_NOT_SUPPORTED);
    }

    #[pg_test]
    fn reports_a_declared_size_over_the_ceiling_without_refusing() {
        let declared: u64 = 600 * 1024 * 1024;
        let mut frame = vec![0x02, 0x28, 0xb5, 0x2f, 0xfd, 0xC4, 0x58];
        frame.extend_from_slice(&declared.to_le_bytes());
        frame.extend_from_slice(&[0x19, 0, 0, b'[', b'1', b']', 0, 0, 0, 0]);
        let reported = Spi::get_one_with_args::<i64>(
            "SELECT declared_bytes FROM loom_snapshot_frame_info($1)",
            &[frame.as_slice().into()],
        )
        .unwrap();
        assert_eq!(reported, Some(declared as i64));
        let (code, message) = decode_error(&frame);
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
        assert!(message.contains("too large"), "{message}");
    }

    #[pg_test]
    fn every_refusal_is_an_error_with_its_own_sqlstate() {
        let good = encode(&agent_state(3, false), Codec::Zstd).unwrap();
        let mut flipped_checksum = good.clone();
        *flipped_checksum.last_mut().unwrap() ^= 1;
        // Clear the descriptor's checksum flag and drop the checksum.
        let mut unchecked = good[..good.len() - 4].to_vec();
        unchecked[5] &= !0x04;
        let cases: Vec<(&str, Vec<u8>, PgSqlErrorCode, &str)> = vec![
            (
                "empty",
                vec![],
                ERRCODE_INVALID_BINARY_REPRESENTATION,
                "empty",
            ),
            (
                "unknown format",
                vec![0x04, b'{'],
                ERRCODE_FEATURE_NOT_SUPPORTED,
                "0x04",
            ),
            (
                "not zstd",
                b"\x02{\"a\":1}".to_vec(),
                ERRCODE_INVALID_BINARY_REPRESENTATION,
                "zstd",
            ),
            (
                "no checksum",
                unchecked,
                ERRCODE_INVALID_BINARY_REPRESENTATION,
                "checksum",
            ),
            (
                "second frame",
                [&good[..], &good[1..]].concat(),
                ERRCODE_INVALID_BINARY_REPRESENTATION,
                "second zstd frame",
            ),
            (
                "trailing bytes",
                [&good[..], b"!"].concat(),
                ERRCODE_INVALID_BINARY_REPRESENTATION,
                "trailing",
            ),
            (
                "truncated",
                good[..good.len() - 2].to_vec(),
                ERRCODE_DATA_CORRUPTED,
                "truncated",
            ),
            (
                "checksum mismatch",
                flipped_checksum,
                ERRCODE_DATA_CORRUPTED,
                "checksum mismatch",
            ),
            (
                "not UTF-8",
                b"\x01\"\xff\"".to_vec(),
                ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
                "UTF-8",
            ),
            (
                "not JSON",
                b"\x01{".to_vec(),
                ERRCODE_INVALID_TEXT_REPRESENTATION,
                "not JSON",
            ),
        ];
        for (name, frame, expected, needle) in cases {
            let (code, message) = decode_error(&frame);
            assert_eq!(code, expected, "{name}: {message}");
            assert!(message.contains(needle), "{name}: {message}");
        }
    }

    #[pg_test(
        error = "unknown snapshot frame format byte 0x7f: written by a newer loom? this one reads 0x01 (json), 0x02 (zstd) and 0x03 (delta)"
    )]
    fn an_unknown_format_reaches_sql_as_an_error() {
        Spi::run(r#"SELECT loom_snapshot_state('\x7f7b7d')"#).unwrap();
    }

    #[pg_test]
    fn state_text_is_null_on_null_input() {
        let state = Spi::get_one::<String>("SELECT loom_snapshot_state_text(NULL)").unwrap();
        assert_eq!(state, None);
    }

    #[pg_test]
    fn declares_volatility_strictness_and_parallel_safety() {
        let names = "('loom_snapshot_state', 'loom_snapshot_state_text', 'loom_snapshot_frame',
                       'loom_snapshot_frame_info', 'loom_compare_execution_ids')";
        // Strict but for the readers that take a keyframe: NULL is a
        // keyframe's base.
        let wrong = Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM pg_proc WHERE proname IN {names}
               AND (provolatile <> 'i' OR proparallel <> 's'
                    OR proisstrict = (proargtypes = '17 17'::oidvector))"
        ))
        .unwrap();
        assert_eq!(wrong, Some(0));
        let count = Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM pg_proc WHERE proname IN {names}"
        ))
        .unwrap();
        assert_eq!(count, Some(8));
        let undocumented = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'loom\\_%'
               AND pg_catalog.obj_description(oid, 'pg_proc') IS NULL",
        )
        .unwrap();
        assert_eq!(undocumented, Some(0), "every function has a COMMENT");
    }
}
