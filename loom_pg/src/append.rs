//! `loom_append_event` and `loom_append_events`, the write path, in C.
//!
//! As PL/pgSQL they cost a frame, a `SET search_path` (a tenth of a
//! one-event append by itself) and a catalog probe per call (issue 18).
//! Here each is one kept INSERT (see [`crate::saved_plans`]) with the
//! caller's arguments passed through as they came, undecoded: loom.events
//! checks them (NOT NULL, the primary key's 23505), its trigger keeps
//! loom.executions. Where no trigger does (Citus, a disabled trigger) they
//! call loom's PL/pgSQL functions for it, decided after the INSERT: by
//! whether the trigger ran for it.
//!
//! Raw V1 functions, not `#[pg_extern]`: pgrx would decode each jsonb
//! payload into a Rust value only to encode it again.

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

use crate::execution_stripes::{stripe_of, Stripes};
use crate::executions_index::{inserts_tracked, tracked_by_trigger};
use crate::saved_plans::{self, arg, own_schema, Statement};

saved_plans::v1_function_info!(pg_finfo_loom_append_event_wrapper);

/// `loom_append_event(execution_id text, sequence bigint, kind text,
/// payload jsonb) RETURNS void`, as declared before 0.11.0 (a schema not
/// yet updated under this library).
///
/// # Safety
/// Called by PostgreSQL's fmgr, as declared in `log_api.sql`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_append_event_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { append_one(fcinfo) }
}

saved_plans::v1_function_info!(pg_finfo_loom_append_event_with_metadata_wrapper);

/// `loom_append_event(execution_id text, sequence bigint, kind text,
/// payload jsonb, metadata jsonb DEFAULT NULL) RETURNS void` (0.11.0). A
/// symbol of its own: a backend still holding an older library, which
/// would read four arguments and drop the fifth, fails to find it instead.
///
/// # Safety
/// Called by PostgreSQL's fmgr, as declared in `log_api.sql`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_append_event_with_metadata_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { append_one(fcinfo) }
}

/// One event, through either declaration.
///
/// # Safety
/// `fcinfo` is a call of `loom_append_event`.
unsafe fn append_one(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let schema = own_schema(fcinfo);
        let args = [
            arg(fcinfo, 0),
            arg(fcinfo, 1),
            arg(fcinfo, 2),
            arg(fcinfo, 3),
            metadata(fcinfo, false),
        ];
        saved_plans::connect();
        hold_stripes(args[0], false);
        let tracked = inserts_tracked();
        match args[4] {
            Some(_) => saved_plans::execute(Statement::AppendOneWithMetadata, schema, &args),
            None => saved_plans::execute(Statement::AppendOne, schema, &args[..4]),
        };
        if inserts_tracked() == tracked {
            saved_plans::execute(Statement::TrackAppendedOne, schema, &args[..1]);
        }
        saved_plans::finish();
        pgrx::fcinfo::pg_return_void()
    }
}

saved_plans::v1_function_info!(pg_finfo_loom_append_events_wrapper);

/// `loom_append_events(execution_ids text[], sequences bigint[], kinds
/// text[], payloads jsonb[]) RETURNS bigint`, as declared before 0.11.0.
///
/// # Safety
/// Called by PostgreSQL's fmgr, as declared in `log_api.sql`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_append_events_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { append_many(fcinfo) }
}

saved_plans::v1_function_info!(pg_finfo_loom_append_events_with_metadata_wrapper);

/// `loom_append_events(execution_ids text[], sequences bigint[], kinds
/// text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL) RETURNS
/// bigint` (0.11.0): how many were appended. A symbol of its own, as
/// [`loom_append_event_with_metadata_wrapper`]'s.
///
/// # Safety
/// Called by PostgreSQL's fmgr, as declared in `log_api.sql`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_append_events_with_metadata_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { append_many(fcinfo) }
}

/// A batch, through either declaration.
///
/// # Safety
/// `fcinfo` is a call of `loom_append_events`.
unsafe fn append_many(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let schema = own_schema(fcinfo);
        let declared_with_metadata = (*fcinfo).nargs > 4;
        let mut args = [
            arg(fcinfo, 0),
            arg(fcinfo, 1),
            arg(fcinfo, 2),
            arg(fcinfo, 3),
            metadata(fcinfo, true),
        ];
        refuse_unequal_lengths(&mut args);
        // Without metadata, the INSERTs of old: they name no column a table
        // without it lacks.
        let with_metadata = args[4].is_some();
        saved_plans::connect();
        hold_stripes(args[0], true);
        let appended = if tracked_by_trigger() {
            // One node: one INSERT, no subtransaction on the hot path.
            let tracked = inserts_tracked();
            let statement = if with_metadata {
                Statement::AppendManyWithMetadata
            } else {
                Statement::AppendMany
            };
            let args = if with_metadata { &args[..] } else { &args[..4] };
            let (_, rows) = saved_plans::execute(statement, schema, args);
            if inserts_tracked() == tracked {
                // Dropped (loom_distribute) or disabled while the INSERT
                // waited for its lock: its rows are tracked all the same.
                saved_plans::execute(Statement::TrackAppended, schema, &args[..1]);
            }
            rows as i64
        } else if declared_with_metadata {
            // All five arguments, whatever the metadata: a call with four
            // would also match a four-parameter function someone created
            // beside loom's in its schema, and be ambiguous.
            saved_plans::execute(
                Statement::AppendManyWithMetadataWithoutTrigger,
                schema,
                &args,
            );
            saved_plans::first_int8()
        } else {
            saved_plans::execute(Statement::AppendManyWithoutTrigger, schema, &args[..4]);
            saved_plans::first_int8()
        };
        saved_plans::finish();
        pg_sys::Datum::from(appended)
    }
}

/// The call's metadata argument (its fifth), `None` for SQL NULL and for
/// a call through a declaration from before 0.11.0, which has four.
/// Metadata loom.events has no column for yet (an update could not lock
/// it in time) is refused, 55000: never written without it. A batch's
/// array of NULLs alone carries none, and is taken as none.
///
/// # Safety
/// `fcinfo` is the call's; for `many`, its fifth argument is a `jsonb[]`.
unsafe fn metadata(fcinfo: pg_sys::FunctionCallInfo, many: bool) -> Option<pg_sys::Datum> {
    let metadata = unsafe {
        if (*fcinfo).nargs > 4 {
            arg(fcinfo, 4)
        } else {
            None
        }
    };
    let datum = metadata?;
    if saved_plans::events_have_metadata() {
        return metadata;
    }
    if many && unsafe { only_nulls(datum) } {
        return None;
    }
    pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "loom.events has no metadata column yet: the update to loom 0.11.0 could not lock loom.events in time to add it; nothing was written",
        pgrx::function_name!(),
    )
    .set_hint(format!(
        "Run SELECT {}.loom_ensure_event_metadata(2000); as the extension's owner (pgloom's migrate() does at every boot).",
        saved_plans::quoted_schema(unsafe { own_schema(fcinfo) })
    ))
    .report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// Whether a `jsonb[]` holds no element but NULLs (or none at all).
///
/// # Safety
/// `array` is a non-NULL `jsonb[]` datum.
unsafe fn only_nulls(array: pg_sys::Datum) -> bool {
    unsafe {
        let array = pg_sys::pg_detoast_datum(array.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
        let mut elements = std::ptr::null_mut();
        let mut nulls = std::ptr::null_mut();
        let mut count = 0;
        // jsonb: varlena (-1), not by value, int alignment.
        pg_sys::deconstruct_array(
            array,
            pg_sys::JSONBOID,
            -1,
            false,
            b'i' as std::ffi::c_char,
            &mut elements,
            &mut nulls,
            &mut count,
        );
        let count = usize::try_from(count).unwrap_or(0);
        count == 0 || std::slice::from_raw_parts(nulls, count).iter().all(|&n| n)
    }
}

/// Takes, shared and to the end of the transaction, the stripes of the ids
/// an append is about to write (one id, or a `text[]` of them), before its
/// INSERT: a retention batch takes them exclusively before it looks at an
/// execution's last event, so it waits for an append that has started and
/// then sees its rows. Taken only in the trigger, after the INSERT, an
/// append still inserting was invisible to the batch, which deleted the
/// execution's earlier events under it. A NULL is left to the INSERT.
unsafe fn hold_stripes(ids: Option<pg_sys::Datum>, many: bool) {
    let Some(ids) = ids else { return };
    let mut stripes = Stripes::default();
    if many {
        let ids =
            unsafe { pgrx::Array::<&str>::from_datum(ids, false) }.expect("a non-NULL text[]");
        for id in ids.iter().flatten() {
            stripes.insert(stripe_of(id.as_bytes()));
        }
    } else {
        let id = unsafe { pg_sys::pg_detoast_datum_packed(ids.cast_mut_ptr()) };
        stripes.insert(stripe_of(unsafe {
            pgrx::varlena::varlena_to_byte_slice(id)
        }));
    }
    stripes.lock(false);
}

/// Refuses arrays of different lengths (22023), as the PL/pgSQL version
/// did; a NULL array of the first four is left to the INSERT, a NULL
/// metadata array means none for every event. Each array is detoasted
/// once here, and passed on detoasted.
unsafe fn refuse_unequal_lengths(args: &mut [Option<pg_sys::Datum>; 5]) {
    if args[..4].iter().any(Option::is_none) {
        return;
    }
    let mut lengths = [None; 5];
    for (arg, length) in args.iter_mut().zip(lengths.iter_mut()) {
        let Some(datum) = *arg else { continue };
        let array =
            unsafe { pg_sys::pg_detoast_datum(datum.cast_mut_ptr()).cast::<pg_sys::ArrayType>() };
        *length = Some(unsafe { cardinality(array) });
        *arg = Some(pg_sys::Datum::from(array));
    }
    let first = lengths[0];
    if lengths.iter().flatten().any(|&l| Some(l) != first) {
        let count = |i: usize| lengths[i].unwrap_or_default();
        let metadata = match lengths[4] {
            Some(n) => format!(", {n} metadata"),
            None => String::new(),
        };
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "loom_append_events needs arrays of one length, got {} ids, {} sequences, {} kinds, {} payloads{metadata}",
                count(0), count(1), count(2), count(3)
            )
        );
    }
}

/// Elements in an array of any dimensions (SQL's `cardinality`).
unsafe fn cardinality(array: *mut pg_sys::ArrayType) -> i32 {
    unsafe {
        let ndim = (*array).ndim;
        // ARR_DIMS: the dimensions follow the fixed header.
        let dims = array
            .cast::<u8>()
            .add(std::mem::size_of::<pg_sys::ArrayType>())
            .cast::<i32>();
        pg_sys::ArrayGetNItems(ndim, dims)
    }
}
