//! The write path's statements, prepared once per backend and kept
//! (`SPI_keepplan`), so an append costs their execution alone: no parse,
//! no plan, no PL/pgSQL frame, no `SET search_path` per call.
//!
//! Callers of the C functions that run these keep their own search_path
//! (pinning it per call was a tenth of an append), so every statement here
//! is written to resolve nothing through it: relations and functions are
//! schema-qualified, parameters are typed by OID to exactly the columns'
//! types (no coercion to look up), and no operator appears. A re-plan
//! after an invalidation, under whatever search_path is current then,
//! resolves the same objects.

/// Declares `pg_finfo_<name>`, which marks the raw C function `<name>` as
/// a version-1 function for PostgreSQL's fmgr (what `#[pg_extern]` does
/// for its own wrappers).
macro_rules! v1_function_info {
    ($finfo:ident) => {
        #[doc(hidden)]
        #[no_mangle]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}
pub(crate) use v1_function_info;

/// Argument `n` of a raw V1 function's call, `None` for SQL NULL: passed
/// on to a kept plan as it came, undecoded.
///
/// # Safety
/// `fcinfo` is the call's, with at least `n + 1` arguments.
pub(crate) unsafe fn arg(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<pg_sys::Datum> {
    unsafe {
        (!pgrx::fcinfo::pg_arg_is_null(fcinfo, n))
            .then(|| pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, n))
    }
}

/// The schema of the function being called: where loom's other functions
/// are, which its statements name.
///
/// # Safety
/// `fcinfo` is the call's.
pub(crate) unsafe fn own_schema(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    unsafe { pg_sys::get_func_namespace((*(*fcinfo).flinfo).fn_oid) }
}

use std::cell::RefCell;
use std::ffi::{CStr, CString};

use pgrx::pg_sys;
use pgrx::prelude::*;

/// One of the kept statements. Those naming loom's own functions are kept
/// per extension schema (a database may drop and re-create the extension
/// elsewhere within one backend's life).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Statement {
    /// One event, `loom_append_event`'s INSERT.
    AppendOne,
    /// One event with its metadata (0.11.0's column; the statements
    /// without it serve a schema from before, and calls without metadata).
    AppendOneWithMetadata,
    /// A batch as four arrays, `loom_append_events`' INSERT.
    AppendMany,
    /// A batch as five arrays, the fifth the events' metadata.
    AppendManyWithMetadata,
    /// A batch where no trigger keeps loom.executions (Citus, a disabled
    /// trigger): the PL/pgSQL path, with its subtransaction.
    AppendManyWithoutTrigger,
    /// The same with the events' metadata.
    AppendManyWithMetadataWithoutTrigger,
    /// `loom_track_appended(text[])`, after an append no trigger tracked.
    TrackAppended,
    /// `loom_track_appended(ARRAY[$1])`, after one such event.
    TrackAppendedOne,
    /// The executions rows of a statement's appended ids (a `text[]`,
    /// sorted and distinct): each added, or locked, in id order.
    TrackInsertedIds,
    /// The executions row of one appended id its stripe's lock protects:
    /// added if missing.
    TrackNewId,
    /// The executions rows of the ids a DELETE took events of, locked in
    /// id order (appends over many stripes and Citus lock rows).
    LockEmptiedRows,
    /// Those of them left without events, removed: run after
    /// [`Statement::LockEmptiedRows`], with a fresh snapshot.
    DeleteEmptied,
    /// `loom_read_events`: from the first event, or after a sequence, with
    /// the declared row's metadata column read as the table has it.
    Read { after: bool, metadata: ReadMetadata },
    /// `loom_check_page_size(integer)`, to raise its error.
    CheckPageSize,
}

/// What a read's last column is: `loom_read_events` as declared before
/// 0.11.0 has none; from 0.11.0 it has metadata, which is NULL while
/// loom.events lacks the column (an update adds it only if it can lock the
/// table in time: `loom_ensure_event_metadata`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ReadMetadata {
    /// The four columns of before 0.11.0.
    Undeclared,
    /// loom.events' metadata column.
    Column,
    /// NULL, loom.events having no such column yet.
    Missing,
}

/// Whether loom.events has the metadata column (0.11.0), of type jsonb:
/// a few syscache look-ups, no table access. An update that could not lock
/// loom.events in time leaves it to `loom_ensure_event_metadata`; a column
/// of that name and another type (someone else's) is not loom's, and its
/// values are never handed out as jsonb.
pub(crate) fn events_have_metadata() -> bool {
    unsafe {
        let loom = pg_sys::get_namespace_oid(c"loom".as_ptr(), true);
        if loom == pg_sys::InvalidOid {
            return false;
        }
        let events = pg_sys::get_relname_relid(c"events".as_ptr(), loom);
        if events == pg_sys::InvalidOid {
            return false;
        }
        let column = pg_sys::get_attnum(events, c"metadata".as_ptr());
        column != pg_sys::InvalidAttrNumber as i16
            && pg_sys::get_atttype(events, column) == pg_sys::JSONBOID
    }
}

impl Statement {
    fn sql(self, schema: &str) -> String {
        match self {
            Self::AppendOne => {
                "INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4)"
                    .to_owned()
            }
            Self::AppendMany => "INSERT INTO loom.events (execution_id, sequence, kind, payload) \
                                 SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), \
                                 pg_catalog.unnest($3), pg_catalog.unnest($4))"
                .to_owned(),
            Self::AppendOneWithMetadata => "INSERT INTO loom.events \
                                            (execution_id, sequence, kind, payload, metadata) \
                                            VALUES ($1, $2, $3, $4, $5)"
                .to_owned(),
            Self::AppendManyWithMetadata => "INSERT INTO loom.events \
                                             (execution_id, sequence, kind, payload, metadata) \
                                             SELECT * FROM ROWS FROM (pg_catalog.unnest($1), \
                                             pg_catalog.unnest($2), pg_catalog.unnest($3), \
                                             pg_catalog.unnest($4), pg_catalog.unnest($5))"
                .to_owned(),
            Self::AppendManyWithoutTrigger => {
                format!("SELECT {schema}.loom_append_events_without_trigger($1, $2, $3, $4)")
            }
            Self::AppendManyWithMetadataWithoutTrigger => {
                format!("SELECT {schema}.loom_append_events_without_trigger($1, $2, $3, $4, $5)")
            }
            Self::TrackAppended => format!("SELECT {schema}.loom_track_appended($1)"),
            Self::TrackAppendedOne => format!("SELECT {schema}.loom_track_appended(ARRAY[$1])"),
            // An upsert whose update never applies still locks the row: a
            // delete of the execution's last events waits for this commit
            // (see loom_track_emptied).
            Self::TrackInsertedIds => "INSERT INTO loom.executions AS x (execution_id) \
                                       SELECT u.id FROM pg_catalog.unnest($1) AS u(id) \
                                       ON CONFLICT (execution_id) DO UPDATE \
                                       SET execution_id = excluded.execution_id WHERE false"
                .to_owned(),
            Self::TrackNewId => "INSERT INTO loom.executions (execution_id) VALUES ($1) \
                                 ON CONFLICT (execution_id) DO NOTHING"
                .to_owned(),
            Self::LockEmptiedRows => "SELECT 1 FROM loom.executions x \
                                      WHERE x.execution_id OPERATOR(pg_catalog.=) ANY ($1) \
                                      ORDER BY x.execution_id FOR UPDATE"
                .to_owned(),
            // Each id is compared with loom.events' column as a parameter,
            // not as loom.executions' column: the two collations differ
            // until a conversion, and a parameter's yields to either.
            Self::DeleteEmptied => "DELETE FROM loom.executions x \
                                    WHERE x.execution_id OPERATOR(pg_catalog.=) ANY (ARRAY( \
                                    SELECT u.id FROM pg_catalog.unnest($1) AS u(id) \
                                    WHERE NOT EXISTS (SELECT FROM loom.events e \
                                    WHERE e.execution_id OPERATOR(pg_catalog.=) u.id)))"
                .to_owned(),
            // Keyset over the primary key (execution_id, sequence): the tail
            // after a snapshot costs what it returns, not the log's length.
            // `=` and `>` named in pg_catalog: operators resolve through the
            // search_path.
            Self::Read { after, metadata } => {
                let metadata = match metadata {
                    ReadMetadata::Undeclared => "",
                    ReadMetadata::Column => ", e.metadata",
                    ReadMetadata::Missing => ", NULL::pg_catalog.jsonb",
                };
                let (after, limit) = if after {
                    ("AND e.sequence OPERATOR(pg_catalog.>) $2 ", "$3")
                } else {
                    ("", "$2")
                };
                format!(
                    "SELECT e.sequence, e.kind, e.payload, e.created_at{metadata} FROM loom.events e \
                     WHERE e.execution_id OPERATOR(pg_catalog.=) $1 {after}\
                     ORDER BY e.sequence LIMIT {limit}"
                )
            }
            Self::CheckPageSize => format!("SELECT {schema}.loom_check_page_size($1)"),
        }
    }

    fn arg_types(self) -> &'static [pg_sys::Oid] {
        use pg_sys::BuiltinOid::*;
        const ONE: &[pg_sys::Oid] = &[
            TEXTOID.value(),
            INT8OID.value(),
            TEXTOID.value(),
            JSONBOID.value(),
        ];
        const MANY: &[pg_sys::Oid] = &[
            TEXTARRAYOID.value(),
            INT8ARRAYOID.value(),
            TEXTARRAYOID.value(),
            JSONBARRAYOID.value(),
        ];
        const ONE_WITH_METADATA: &[pg_sys::Oid] = &[
            TEXTOID.value(),
            INT8OID.value(),
            TEXTOID.value(),
            JSONBOID.value(),
            JSONBOID.value(),
        ];
        const MANY_WITH_METADATA: &[pg_sys::Oid] = &[
            TEXTARRAYOID.value(),
            INT8ARRAYOID.value(),
            TEXTARRAYOID.value(),
            JSONBARRAYOID.value(),
            JSONBARRAYOID.value(),
        ];
        const IDS: &[pg_sys::Oid] = &[TEXTARRAYOID.value()];
        const FIRST: &[pg_sys::Oid] = &[TEXTOID.value(), INT8OID.value()];
        const PAGE_SIZE: &[pg_sys::Oid] = &[INT4OID.value()];
        const AFTER: &[pg_sys::Oid] = &[TEXTOID.value(), INT8OID.value(), INT8OID.value()];
        const ID: &[pg_sys::Oid] = &[TEXTOID.value()];
        match self {
            Self::AppendOne => ONE,
            Self::AppendOneWithMetadata => ONE_WITH_METADATA,
            Self::AppendMany | Self::AppendManyWithoutTrigger => MANY,
            Self::AppendManyWithMetadata | Self::AppendManyWithMetadataWithoutTrigger => {
                MANY_WITH_METADATA
            }
            Self::TrackAppended
            | Self::TrackInsertedIds
            | Self::LockEmptiedRows
            | Self::DeleteEmptied => IDS,
            Self::TrackAppendedOne | Self::TrackNewId => ID,
            Self::Read { after: false, .. } => FIRST,
            Self::Read { after: true, .. } => AFTER,
            Self::CheckPageSize => PAGE_SIZE,
        }
    }
}

struct Kept {
    statement: Statement,
    schema: pg_sys::Oid,
    plan: pg_sys::SPIPlanPtr,
}

thread_local! {
    // A backend is one thread; the plans live in CacheMemoryContext, kept.
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
}

/// The kept plan of `statement`, naming the extension in `schema` (the
/// namespace of the calling function), prepared on first use.
///
/// # Safety
/// SPI must be connected.
pub(crate) unsafe fn plan(statement: Statement, schema: pg_sys::Oid) -> pg_sys::SPIPlanPtr {
    let kept = KEPT.with_borrow(|kept| {
        kept.iter()
            .find(|k| k.statement == statement && k.schema == schema)
            .map(|k| k.plan)
    });
    if let Some(plan) = kept {
        return plan;
    }
    let sql =
        CString::new(statement.sql(&quoted_schema(schema))).expect("loom's statements hold no NUL");
    let types = statement.arg_types();
    let plan =
        unsafe { pg_sys::SPI_prepare(sql.as_ptr(), types.len() as i32, types.as_ptr().cast_mut()) };
    if plan.is_null() {
        spi_failed("SPI_prepare", unsafe { pg_sys::SPI_result });
    }
    unsafe { pg_sys::SPI_keepplan(plan) };
    KEPT.with_borrow_mut(|kept| {
        kept.push(Kept {
            statement,
            schema,
            plan,
        })
    });
    plan
}

/// The name of schema `schema`, quoted as an identifier where it needs
/// to be: how loom's statements name the extension's own functions.
pub(crate) fn quoted_schema(schema: pg_sys::Oid) -> String {
    let name = unsafe { pg_sys::get_namespace_name(schema) };
    if name.is_null() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_SCHEMA_NAME,
            format!("loom's schema (oid {}) does not exist", schema.to_u32())
        );
    }
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(name)) }
        .to_string_lossy()
        .into_owned()
}

/// Runs a kept `statement` with `args` (SQL NULL where `None`), with a
/// fresh snapshot (the caller is in READ COMMITTED, or is refused before),
/// and returns SPI's result code and the rows it processed.
///
/// # Safety
/// SPI must be connected, and each datum must be of the statement's
/// argument type.
pub(crate) unsafe fn execute(
    statement: Statement,
    schema: pg_sys::Oid,
    args: &[Option<pg_sys::Datum>],
) -> (u32, u64) {
    unsafe { run(statement, schema, args, false) }
}

/// [`execute`] for a STABLE function's read: with the caller's snapshot,
/// writing nothing.
///
/// # Safety
/// As [`execute`].
pub(crate) unsafe fn execute_read_only(
    statement: Statement,
    schema: pg_sys::Oid,
    args: &[Option<pg_sys::Datum>],
) -> (u32, u64) {
    unsafe { run(statement, schema, args, true) }
}

unsafe fn run(
    statement: Statement,
    schema: pg_sys::Oid,
    args: &[Option<pg_sys::Datum>],
    read_only: bool,
) -> (u32, u64) {
    let plan = unsafe { plan(statement, schema) };
    let mut values: Vec<pg_sys::Datum> = args
        .iter()
        .map(|a| a.unwrap_or(pg_sys::Datum::from(0)))
        .collect();
    let nulls: Vec<std::ffi::c_char> = args
        .iter()
        .map(|a| if a.is_some() { b' ' } else { b'n' } as std::ffi::c_char)
        .collect();
    let rc = unsafe {
        pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), read_only, 0)
    };
    if rc < 0 {
        spi_failed("SPI_execute_plan", rc);
    }
    (rc as u32, unsafe { pg_sys::SPI_processed })
}

// tcop/tstoreReceiver.h, which pgrx does not bind; this signature since
// PostgreSQL 14. It only records its arguments.
extern "C" {
    fn SetTuplestoreDestReceiverParams(
        receiver: *mut pg_sys::DestReceiver,
        store: *mut pg_sys::Tuplestorestate,
        context: pg_sys::MemoryContext,
        detoast: bool,
        target_tupdesc: pg_sys::TupleDesc,
        map_failure_msg: *const std::ffi::c_char,
    );
}

/// Runs a kept read-only `statement` with the caller's snapshot, its rows
/// going straight into `store` (a set-returning function's result, which
/// lives in `context`): no copy in SPI's own table first.
///
/// # Safety
/// SPI must be connected; each datum must be of the statement's argument
/// type; the statement's rows must have `store`'s row type.
pub(crate) unsafe fn read_into(
    statement: Statement,
    schema: pg_sys::Oid,
    args: &[Option<pg_sys::Datum>],
    store: *mut pg_sys::Tuplestorestate,
    context: pg_sys::MemoryContext,
) {
    unsafe {
        let plan = plan(statement, schema);
        let types = statement.arg_types();
        let params = pg_sys::makeParamList(args.len() as i32);
        for (i, arg) in args.iter().enumerate() {
            (*params)
                .params
                .as_mut_ptr()
                .add(i)
                .write(pg_sys::ParamExternData {
                    value: arg.unwrap_or(pg_sys::Datum::from(0)),
                    isnull: arg.is_none(),
                    pflags: pg_sys::PARAM_FLAG_CONST as u16,
                    ptype: types[i],
                });
        }
        let receiver = pg_sys::CreateDestReceiver(pg_sys::CommandDest::DestTuplestore);
        SetTuplestoreDestReceiverParams(
            receiver,
            store,
            context,
            false,
            std::ptr::null_mut(),
            std::ptr::null(),
        );
        let options = pg_sys::SPIExecuteOptions {
            params,
            read_only: true,
            dest: receiver,
            ..Default::default()
        };
        let rc = pg_sys::SPI_execute_plan_extended(plan, &options);
        if rc < 0 {
            spi_failed("SPI_execute_plan_extended", rc);
        }
        if let Some(destroy) = (*receiver).rDestroy {
            destroy(receiver);
        }
    }
}

/// Runs `sql` once, unkept: for a statement over a trigger's transition
/// table, which a kept plan cannot name.
///
/// # Safety
/// SPI must be connected.
pub(crate) unsafe fn execute_once(sql: &str) -> u64 {
    let sql = CString::new(sql).expect("loom's statements hold no NUL");
    let rc = unsafe { pg_sys::SPI_execute(sql.as_ptr(), false, 0) };
    if rc < 0 {
        spi_failed("SPI_execute", rc);
    }
    unsafe { pg_sys::SPI_processed }
}

/// The first column of the first row the last statement returned, as an
/// int8 (0 for none or NULL).
///
/// # Safety
/// The last SPI statement must have returned a bigint column.
pub(crate) unsafe fn first_int8() -> i64 {
    let table = unsafe { pg_sys::SPI_tuptable };
    if table.is_null() || unsafe { pg_sys::SPI_processed } == 0 {
        return 0;
    }
    let mut isnull = false;
    let datum = unsafe { pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, 1, &mut isnull) };
    if isnull {
        0
    } else {
        datum.value() as i64
    }
}

/// SPI connects; the caller finishes with [`finish`] on success (an ERROR
/// unwinds SPI with the transaction or subtransaction).
///
/// # Safety
/// Called from a function executing in a backend.
pub(crate) unsafe fn connect() {
    let rc = unsafe { pg_sys::SPI_connect() };
    if rc != pg_sys::SPI_OK_CONNECT as i32 {
        spi_failed("SPI_connect", rc);
    }
}

/// # Safety
/// After a successful [`connect`].
pub(crate) unsafe fn finish() {
    let rc = unsafe { pg_sys::SPI_finish() };
    if rc != pg_sys::SPI_OK_FINISH as i32 {
        spi_failed("SPI_finish", rc);
    }
}

fn spi_failed(what: &str, rc: i32) -> ! {
    let code = unsafe { CStr::from_ptr(pg_sys::SPI_result_code_string(rc)) };
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("{what} failed: {}", code.to_string_lossy())
    );
}
