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
