//! The snapshot frame (ADR 0141 D1) in SQL: decode in the server, so that
//! `state->'x'` works on a frame from psql, and encode there too.

use pgloom_core::frame::{self, Codec};
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
    frame::decode_into(frame, PallocText::zeroed).unwrap_or_else(|err| raise_decode(err))
}

/// A frame's state as Postgres jsonb, built from loom's own parse of the
/// validated text straight into jsonb's layout (the same bytes
/// `text::jsonb` makes, without a second lexer): see [`jsonb_build`].
#[pg_extern(sql = false)]
fn loom_snapshot_state(frame: &[u8]) -> PallocJsonb {
    // Decoded into palloc'd memory, as the text function does: accounted,
    // and jsonb_in's cstring as it is when the builder declines.
    let state =
        frame::decode_into(frame, PallocCString::zeroed).unwrap_or_else(|err| raise_decode(err));
    let jsonb = jsonb_build::to_jsonb(&state);
    state.free();
    jsonb
}

/// Frames a state's JSON text: `'zstd'` (the default) gives `0x02`, or
/// `0x01` when zstd would not make it smaller; `'none'` gives `0x01`.
#[pg_extern(sql = false)]
fn loom_snapshot_frame(state: &str, codec: default!(&str, "'zstd'")) -> Vec<u8> {
    let codec: Codec = codec.parse().unwrap_or_else(|err| raise_codec(err));
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
    // A path of millions of steps is input too (issue 25): checked for
    // interrupts as it is read, as find_path checks as it walks.
    let mut ticker = Ticker::starting_at(0);
    let steps: Vec<&str> = path
        .iter()
        .enumerate()
        .map(|(i, step)| {
            ticker.at(i);
            step
        })
        .collect::<Option<_>>()?;
    let state = frame::decode_json(frame).unwrap_or_else(|err| raise_decode(err));
    json::find_path(&state, &steps).map(str::to_owned)
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

    fn state_text(frame: &[u8]) -> String {
        Spi::get_one_with_args::<String>("SELECT loom_snapshot_state_text($1)", &[frame.into()])
            .unwrap()
            .unwrap()
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
        error = "unknown snapshot frame format byte 0x7f: written by a newer loom? this one reads 0x01 (json) and 0x02 (zstd)"
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
        let wrong = Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM pg_proc WHERE proname IN {names}
               AND (provolatile <> 'i' OR NOT proisstrict OR proparallel <> 's')"
        ))
        .unwrap();
        assert_eq!(wrong, Some(0));
        let count = Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM pg_proc WHERE proname IN {names}"
        ))
        .unwrap();
        assert_eq!(count, Some(6));
        let undocumented = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'loom\\_%'
               AND pg_catalog.obj_description(oid, 'pg_proc') IS NULL",
        )
        .unwrap();
        assert_eq!(undocumented, Some(0), "every function has a COMMENT");
    }
}
