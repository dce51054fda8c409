//! The pg_tests of `loom-core/sql/snapshot_api.sql`: snapshots saved and loaded in both formats, resume, and the frame column.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{column, log_of, one, opt_in_to_frames, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn resumes_from_the_latest_snapshot_and_the_events_after_it() {
        log_of("e", 10);
        // No snapshot: the whole log, no snapshot row.
        assert_eq!(
            column("SELECT sequence::text FROM loom_resume('e') WHERE snapshot_id IS NULL"),
            (1..=10).map(|n| n.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_resume('e') WHERE snapshot_id IS NOT NULL"),
            Some(0)
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 3, '{"at":3}')"#).unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 6, '{"at":6}', 'zstd')"#).unwrap();
        // The snapshot row first (a frame, as stored), then 7..10.
        assert_eq!(
            column(
                "SELECT coalesce(kind, 'snapshot') || ':' || sequence || ':' || (state_z IS NOT NULL)::text FROM loom_resume('e')"
            ),
            [
                "snapshot:6:true",
                "step:7:false",
                "step:8:false",
                "step:9:false",
                "step:10:false"
            ]
        );
        assert_eq!(
            one::<String>("SELECT loom_snapshot_state_text(state_z) FROM loom_resume('e') WHERE snapshot_id IS NOT NULL"),
            Some(r#"{"at":6}"#.to_owned())
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_resume('nobody')"),
            Some(0)
        );
    }

    #[pg_test]
    fn saves_and_loads_snapshots_in_both_formats() {
        opt_in_to_frames();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"b":1,"a":[1,2]}')"#).unwrap();
        Spi::run(
            r#"SELECT loom_save_snapshot('e', 'wf', 2, '{"turn":2,"log":"' || repeat('agent tool ', 50) || '"}', 'zstd')"#,
        )
        .unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 4, '{"turn":4}', 'none')"#).unwrap();
        assert_eq!(
            one::<i64>("SELECT sequence FROM loom_load_snapshot('e')"),
            Some(4)
        );
        assert_eq!(
            one::<i32>("SELECT (state->>'turn')::int FROM loom_load_snapshot('e', 2)"),
            Some(2)
        );
        // Exactly at_sequence, never a neighbour.
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_load_snapshot('e', 3)"),
            Some(0)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_load_snapshot('nobody')"),
            Some(0)
        );
        // The frame row: sentinel in state, frame in state_z.
        assert_eq!(
            one::<bool>(
                r#"SELECT state = '{"__loomEnc":"loom.snapshot-frame/state_z"}' AND substr(state_z, 1, 1) = '\x02'::bytea
                   FROM loom.snapshots WHERE sequence = 2"#
            ),
            Some(true)
        );
        // The view decodes every row whatever its format.
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.snapshots_decoded WHERE state ? '__loomEnc'"),
            Some(0)
        );
    }

    #[pg_test]
    fn a_resave_flips_the_format_and_clears_the_other_column() {
        opt_in_to_frames();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"v":1}', 'zstd')"#).unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"v":2}')"#).unwrap();
        assert_eq!(
            one::<bool>(r#"SELECT state_z IS NULL AND state = '{"v":2}' FROM loom.snapshots"#),
            Some(true)
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"v":3}', 'zstd')"#).unwrap();
        assert_eq!(
            one::<bool>(
                r#"SELECT state_z IS NOT NULL AND state ? '__loomEnc' FROM loom.snapshots"#
            ),
            Some(true)
        );
        assert_eq!(one::<i64>("SELECT count(*) FROM loom.snapshots"), Some(1));
        assert_eq!(
            one::<i32>("SELECT (state->>'v')::int FROM loom_load_snapshot('e')"),
            Some(3)
        );
    }

    #[pg_test]
    fn refuses_corrupt_rows_and_bad_arguments() {
        opt_in_to_frames();
        // The CHECK refuses a real state beside a frame.
        assert_eq!(
            sqlstate_of(
                r#"INSERT INTO loom.snapshots (execution_id, workflow_id, sequence, state, state_z) VALUES ('e','w',1,'{"a":1}','\x015b5d')"#
            ),
            "23514"
        );
        // A sentinel without its frame is corruption, never a state.
        Spi::run(r#"INSERT INTO loom.snapshots (execution_id, workflow_id, sequence, state) VALUES ('e','w',1,'{"__loomEnc":"loom.snapshot-frame/state_z"}')"#).unwrap();
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_load_snapshot('e')"),
            "XX001"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_save_snapshot('e', 'w', 2, '{}', 'lz4')"),
            "22023"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_save_snapshot('e', 'w', 2, '{nope', 'zstd')"),
            "22P02"
        );
    }

    #[pg_test]
    fn a_fresh_install_has_the_frame_column_a_restore_copies_into() {
        assert_eq!(
            one::<bool>("SELECT has_column AND has_check FROM loom_snapshot_frame_catalog()"),
            Some(true)
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'w', 1, '{"a":1}', 'zstd')"#).unwrap();
        assert_eq!(
            one::<i32>("SELECT (state->>'a')::int FROM loom.snapshots_decoded"),
            Some(1)
        );
    }

    /// Saves `turns` states of one execution with codec 'delta', as a
    /// runtime saves after every turn.
    fn save_run(id: &str, turns: usize) {
        for turn in 1..=turns {
            Spi::run(&format!(
                "SELECT loom_save_snapshot('{id}', 'wf', {turn}, {}, 'delta')",
                pgrx::spi::quote_literal(loom_fixtures::agent_state(turn, false))
            ))
            .unwrap();
        }
    }

    #[pg_test]
    fn saves_deltas_and_reads_every_one_back_exactly() {
        opt_in_to_frames();
        save_run("d", 30);
        let formats = column(
            "SELECT string_agg(i.format, ',' ORDER BY s.sequence)
             FROM loom.snapshots s, loom_snapshot_frame_info(s.state_z) i WHERE s.execution_id = 'd'",
        );
        let formats: Vec<&str> = formats[0].split(',').collect();
        assert_eq!(formats[0], "zstd", "the first save is a keyframe");
        assert!(
            formats.iter().filter(|f| **f == "delta").count() >= 20,
            "{formats:?}"
        );
        for turn in 1..=30 {
            let expected = loom_fixtures::agent_state(turn, false);
            assert_eq!(
                one::<String>(&format!(
                    "SELECT loom_snapshot_state_text(s.state_z, b.state_z)
                     FROM loom.snapshots s LEFT JOIN loom.snapshots b
                       ON b.execution_id = s.execution_id
                      AND b.sequence = loom_snapshot_base_sequence(s.state_z)
                     WHERE s.execution_id = 'd' AND s.sequence = {turn}"
                ))
                .as_deref(),
                Some(expected.as_str()),
                "turn {turn}"
            );
            assert_eq!(
                one::<bool>(&format!(
                    "SELECT state = {}::jsonb FROM loom.snapshots_decoded
                     WHERE execution_id = 'd' AND sequence = {turn}",
                    pgrx::spi::quote_literal(&expected)
                )),
                Some(true),
                "turn {turn} through the view"
            );
        }
        assert_eq!(
            one::<i64>("SELECT sequence FROM loom_load_snapshot('d')"),
            Some(30)
        );
    }

    /// The latest delta of an execution and the keyframe it names.
    fn latest_delta(id: &str) -> (i64, i64) {
        Spi::connect(|client| {
            let row = client
                .select(
                    &format!(
                        "SELECT sequence, loom_snapshot_base_sequence(state_z) FROM loom.snapshots
                         WHERE execution_id = '{id}' AND loom_snapshot_base_sequence(state_z) IS NOT NULL
                         ORDER BY sequence DESC LIMIT 1"
                    ),
                    None,
                    &[],
                )
                .unwrap()
                .first();
            (
                row.get::<i64>(1).unwrap().expect("a delta"),
                row.get::<i64>(2).unwrap().expect("its keyframe"),
            )
        })
    }

    #[pg_test]
    fn a_keyframe_deltas_name_is_saved_over_only_with_the_same_frame() {
        opt_in_to_frames();
        save_run("k", 12);
        let (delta, keyframe) = latest_delta("k");
        assert!(keyframe < delta);
        let again = pgrx::spi::quote_literal(loom_fixtures::agent_state(keyframe as usize, false));
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT loom_save_snapshot('k', 'wf', {keyframe}, '{{\"other\":true}}', 'zstd')"
            )),
            "55006"
        );
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT loom_save_snapshot('k', 'wf', {keyframe}, '{{\"other\":true}}')"
            )),
            "55006"
        );
        // The same state, framed as it was: allowed, and nothing changes.
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT loom_save_snapshot('k', 'wf', {keyframe}, {again}, 'zstd')"
            )),
            "no error"
        );
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT loom_save_snapshot('k', 'wf', {keyframe}, {again}, 'delta')"
            )),
            "no error"
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.snapshots_decoded WHERE execution_id = 'k'"),
            Some(12)
        );
        // A delta itself is saved over freely.
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT loom_save_snapshot('k', 'wf', {delta}, '{{\"other\":true}}', 'delta')"
            )),
            "no error"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_save_snapshot('k', 'wf', 4, '[]', 'lz4')"),
            "22023"
        );
    }

    #[pg_test]
    fn deleting_snapshots_in_batches_never_strands_a_delta() {
        opt_in_to_frames();
        save_run("x", 40);
        let keyframes = one::<i64>(
            "SELECT count(*) FROM loom.snapshots s, loom_snapshot_frame_info(s.state_z) i
             WHERE s.execution_id = 'x' AND i.format <> 'delta'",
        )
        .unwrap();
        assert!(keyframes >= 2, "{keyframes} keyframes");
        let mut left = 40;
        loop {
            let deleted = one::<i64>("SELECT loom_delete_snapshots('x', 3)").unwrap();
            if deleted == 0 {
                break;
            }
            left -= deleted;
            // Every row left still decodes: no batch took a keyframe whose
            // deltas stayed.
            assert_eq!(
                one::<i64>(
                    "SELECT count(*) FROM loom.snapshots_decoded WHERE execution_id = 'x' AND state IS NOT NULL"
                ),
                Some(left)
            );
        }
        assert_eq!(left, 0);
    }

    #[pg_test]
    fn a_delta_without_its_keyframe_is_data_corrupted_never_a_state() {
        opt_in_to_frames();
        save_run("m", 12);
        let (_, keyframe) = latest_delta("m");
        Spi::run(&format!(
            "DELETE FROM loom.snapshots WHERE execution_id = 'm' AND sequence > {keyframe} + 1"
        ))
        .unwrap();
        // The keyframe gone behind loom's back (a DELETE by hand).
        Spi::run(&format!(
            "DELETE FROM loom.snapshots WHERE execution_id = 'm' AND sequence = {keyframe}"
        ))
        .unwrap();
        assert_eq!(
            sqlstate_of("SELECT state FROM loom.snapshots_decoded WHERE execution_id = 'm'"),
            "XX001"
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_load_snapshot('m')"),
            "XX001"
        );
        // Another state swapped in as the keyframe.
        Spi::run(&format!(
            "INSERT INTO loom.snapshots (execution_id, workflow_id, sequence, state, state_z)
             VALUES ('m', 'wf', {keyframe}, '{{\"__loomEnc\":\"loom.snapshot-frame/state_z\"}}',
                     loom_snapshot_frame({}, 'zstd'))",
            pgrx::spi::quote_literal(loom_fixtures::agent_state(keyframe as usize, true))
        ))
        .unwrap();
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_load_snapshot('m')"),
            "XX001"
        );
    }
}
