//! `loom_read_events`, the tail a resume reads after its snapshot, in C.
//!
//! As PL/pgSQL, a pinned search_path, a nested page-size check and the
//! frame of `RETURN QUERY` cost a 50-event tail read a fifth more than the
//! same keyset SELECT on a plain table (issue 18). Here it is one kept
//! plan (see [`crate::saved_plans`]) whose rows go straight into the
//! result set, read with the caller's snapshot (the function is STABLE)
//! and the caller's privileges.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::saved_plans::{self, arg, own_schema, ReadMetadata, Statement};

saved_plans::v1_function_info!(pg_finfo_loom_read_events_wrapper);

/// `loom_read_events(execution_id text, after_sequence bigint DEFAULT
/// NULL, max_events integer DEFAULT 1000) RETURNS TABLE(sequence bigint,
/// kind text, payload jsonb, created_at timestamptz)`, as declared before
/// 0.11.0.
///
/// # Safety
/// Called by PostgreSQL's fmgr, as declared in `log_api.sql`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_read_events_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { read_events(fcinfo) }
}

saved_plans::v1_function_info!(pg_finfo_loom_read_events_with_metadata_wrapper);

/// The same, returning `metadata jsonb` last (0.11.0). A symbol of its
/// own: a backend still holding an older library, which would fill the
/// declared row with four columns, fails to find it instead.
///
/// # Safety
/// Called by PostgreSQL's fmgr, as declared in `log_api.sql`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_read_events_with_metadata_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { read_events(fcinfo) }
}

/// A page of one log, through either declaration: the declared row says
/// whether it ends with metadata.
///
/// # Safety
/// `fcinfo` is a call of `loom_read_events`.
unsafe fn read_events(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let schema = own_schema(fcinfo);
        let (execution_id, after, max_events) = (arg(fcinfo, 0), arg(fcinfo, 1), arg(fcinfo, 2));
        let max_events = max_events.map(|d| d.value() as i32);
        // The result set, in the per-query context, of the declared row.
        pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
        let resultinfo = (*fcinfo).resultinfo.cast::<pg_sys::ReturnSetInfo>();
        let (result, context) = (
            (*resultinfo).setResult,
            (*(*resultinfo).econtext).ecxt_per_query_memory,
        );
        // The declared row says which columns to read: 0.11.0's has
        // metadata, NULL while loom.events lacks the column.
        let metadata = if (*(*resultinfo).setDesc).natts <= 4 {
            ReadMetadata::Undeclared
        } else if saved_plans::events_have_metadata() {
            ReadMetadata::Column
        } else {
            ReadMetadata::Missing
        };
        saved_plans::connect();
        match max_events {
            Some(limit) if limit >= 1 => {
                let limit = Some(pg_sys::Datum::from(i64::from(limit)));
                let (after, args) = match after {
                    None => (false, vec![execution_id, limit]),
                    after => (true, vec![execution_id, after, limit]),
                };
                let statement = Statement::Read { after, metadata };
                saved_plans::read_into(statement, schema, &args, result, context);
            }
            // loom_check_page_size raises the error (one message for every
            // pager).
            _ => {
                saved_plans::execute_read_only(
                    Statement::CheckPageSize,
                    schema,
                    &[max_events.map(pg_sys::Datum::from)],
                );
            }
        }
        saved_plans::finish();
        pg_sys::Datum::from(0)
    }
}
