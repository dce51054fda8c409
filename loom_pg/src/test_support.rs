//! What the pg_tests of several modules share.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::panic::AssertUnwindSafe;

/// The SQLSTATE and message of the ERROR `f` raises: a test of bad input
/// asserts the error a user sees, and that it is an ERROR, not a panic.
pub(crate) fn error_of<R>(f: impl FnOnce() -> R) -> (PgSqlErrorCode, String) {
    PgTryBuilder::new(AssertUnwindSafe(|| {
        f();
        panic!("expected an ERROR");
    }))
    .catch_others(|caught| match caught {
        CaughtError::ErrorReport(report) | CaughtError::PostgresError(report) => {
            (report.sql_error_code(), report.message().to_owned())
        }
        CaughtError::RustPanic { ereport, .. } => panic!("a panic, not an ERROR: {ereport:?}"),
    })
    .execute()
}

/// The SQLSTATE `query` fails with ("no error" when it succeeds), caught
/// in a plpgsql EXCEPTION block: a real subtransaction, which undoes
/// the failed statement and the search_path its function had set.
pub(crate) fn sqlstate_of(query: &str) -> String {
    Spi::run(
        "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN EXECUTE q; RETURN 'no error'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$",
    )
    .unwrap();
    Spi::get_one::<String>(&format!(
        "SELECT pg_temp.sqlstate_of({})",
        pgrx::spi::quote_literal(query)
    ))
    .unwrap()
    .unwrap()
}

pub(crate) fn column(query: &str) -> Vec<String> {
    Spi::connect(|client| {
        client
            .select(query, None, &[])
            .unwrap()
            .map(|row| row.get::<String>(1).unwrap().unwrap())
            .collect()
    })
}

pub(crate) fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(query: &str) -> Option<T> {
    Spi::get_one::<T>(query).unwrap()
}

pub(crate) const MIXED: &str =
    "ARRAY['a_b','A1','a-b','B','é','e' || U&'\\0301', U&'\\FFFD', U&'\\+01D11E','0','_']";

pub(crate) fn append_mixed() {
    Spi::run(&format!(
        "SELECT loom_append_events({MIXED}, array_fill(1::bigint, ARRAY[10]),
                                   array_fill('started'::text, ARRAY[10]),
                                   array_fill('{{}}'::jsonb, ARRAY[10]))"
    ))
    .unwrap();
}

pub(crate) fn sorted_mixed() -> Vec<String> {
    let mut ids = column(&format!("SELECT unnest({MIXED})"));
    ids.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    ids
}

pub(crate) fn log_of(id: &str, events: i64) {
    Spi::run(&format!(
        "SELECT loom_append_event({}, s, 'step', jsonb_build_object('n', s)) FROM generate_series(1, {events}) s",
        pgrx::spi::quote_literal(id)
    ))
    .unwrap();
}

/// Opting in to frames (ADR 0141 D5): a no-op on a fresh install.
pub(crate) fn opt_in_to_frames() {
    assert_eq!(
        one::<bool>("SELECT loom_ensure_snapshot_zstd()"),
        Some(true)
    );
}
