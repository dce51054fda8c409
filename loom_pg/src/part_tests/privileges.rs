//! The pg_tests of `loom-core/sql/privileges.sql`: what no role or planted object can turn: search paths, SECURITY DEFINER.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{append_mixed, column, one, opt_in_to_frames, sorted_mixed};
    use pgrx::prelude::*;

    #[pg_test]
    fn hostile_public_objects_are_never_picked_up() {
        opt_in_to_frames();
        append_mixed();
        Spi::run(r#"SELECT loom_save_snapshot('a_b', 'wf', 1, '{"real":true}')"#).unwrap();
        Spi::run(
            r#"
            CREATE SCHEMA hostile;
            CREATE TABLE hostile.events (execution_id text, sequence bigint);
            INSERT INTO hostile.events VALUES ('planted', 1);
            CREATE TABLE hostile.snapshots (execution_id text);
            CREATE FUNCTION hostile.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
            CREATE OPERATOR hostile.= (LEFTARG = text, RIGHTARG = text, FUNCTION = hostile.always);
            CREATE OPERATOR hostile.> (LEFTARG = text, RIGHTARG = text, FUNCTION = hostile.always);
            CREATE FUNCTION hostile.loom_snapshot_state(bytea) RETURNS jsonb LANGUAGE sql AS $$SELECT '{"hijacked":true}'::jsonb$$;
            SET search_path = hostile, public, pg_catalog;
            "#,
        )
        .unwrap();
        assert_eq!(
            column("SELECT * FROM public.loom_list_executions()"),
            sorted_mixed()
        );
        assert_eq!(
            one::<bool>("SELECT (state->>'real')::boolean FROM public.loom_load_snapshot('a_b')"),
            Some(true)
        );
        Spi::run(r#"SELECT public.loom_save_snapshot('a_b', 'wf', 2, '{"framed":true}', 'zstd')"#)
            .unwrap();
        assert_eq!(
            one::<bool>("SELECT (state->>'framed')::boolean FROM public.loom_load_snapshot('a_b')"),
            Some(true)
        );
        assert_eq!(
            one::<bool>("SELECT public.loom_delete_ref('nothing')"),
            Some(false)
        );
        // The C append functions and trigger pin no search_path: their
        // statements name nothing it could resolve.
        Spi::run(
            r#"
            CREATE FUNCTION hostile.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS $$SELECT 'planted'$$;
            CREATE FUNCTION hostile.loom_track_appended(text[]) RETURNS void LANGUAGE sql AS 'SELECT 1/0';
            CREATE TABLE hostile.executions (execution_id text);
            SELECT public.loom_append_events(ARRAY['h1', 'h2'], ARRAY[1, 1]::bigint[],
                                             ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[]);
            SELECT public.loom_append_event('h3', 1, 's', '{}');
            SET search_path = pg_catalog, public;
            "#,
        )
        .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.events WHERE execution_id IN ('h1', 'h2', 'h3')"),
            Some(3)
        );
        assert_eq!(
            one::<i64>(
                "SELECT count(*) FROM loom.executions WHERE execution_id IN ('h1', 'h2', 'h3')"
            ),
            Some(3)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM hostile.executions"),
            Some(0)
        );
    }

    #[pg_test]
    fn only_the_index_keepers_are_security_definer_and_every_one_pins_its_search_path() {
        // What keeps loom.executions writes it for any writer of
        // loom.events: the trigger reads only its statement's transition
        // table, and the two functions add only ids that have events and
        // remove only ids that have none; loom_lock_idle_executions locks
        // executions' stripes and rows and reads their last events. The
        // change feed's trigger writes loom.feed_state's high water mark,
        // which no writer may.
        assert_eq!(
            column("SELECT proname::text FROM pg_proc WHERE proname LIKE 'loom\\_%' AND prosecdef ORDER BY 1"),
            [
                "loom_events_feed",
                "loom_events_track_executions",
                "loom_lock_idle_executions",
                "loom_track_appended",
                "loom_track_emptied"
            ]
        );
        let unpinned = column(
            "SELECT proname::text FROM pg_proc
             WHERE proname LIKE 'loom\\_%' AND prolang IN (SELECT oid FROM pg_language WHERE lanname IN ('sql', 'plpgsql'))
               AND NOT coalesce(proconfig::text[] @> ARRAY['search_path=pg_catalog, pg_temp'], false)
             ORDER BY 1",
        );
        // The inlinable SQL functions (loom_snapshot_get in both its
        // forms) qualify every name instead, and so does the procedure
        // that commits between its batches (a SET clause forbids
        // transaction control).
        assert_eq!(
            unpinned,
            [
                "loom_snapshot_base_sequence",
                "loom_snapshot_frame",
                "loom_snapshot_get",
                "loom_snapshot_get",
                "loom_sweep_idle_executions"
            ]
        );
    }
}
