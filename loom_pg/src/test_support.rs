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
