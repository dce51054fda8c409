//! Keeping `loom.executions` (the id pager's index) in step with
//! `loom.events`: the statement trigger that does it on one node, and the
//! probe loom's functions use to know whether it does.
//!
//! In C, not PL/pgSQL: the trigger runs on every append, and a PL/pgSQL
//! frame with its pinned search_path, its nested isolation check and its
//! set-based upsert over the transition table cost a quarter of a
//! one-event append (issue 18). Here a statement's ids are read from its
//! transition table directly; each found in loom.executions under its
//! stripe's lock costs one index probe and writes nothing
//! ([`crate::execution_stripes`]), each missing is inserted through a kept
//! plan. A statement of more than [`ROWS_READ_DIRECTLY`] rows (a COPY, a
//! restore) is handled set-based over the transition table, locking rows
//! as before, so the ids held in memory stay bounded.
//!
//! A delete takes both the stripes and the rows (see
//! `loom_track_emptied`), stripes in ascending order and rows in byte
//! order ("C"), so two statements sharing executions cannot deadlock on
//! them.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{PgSqlErrorCode, PgTrigger, PgTupleDesc};

use crate::execution_stripes::{stripe_of, Stripes, MAX_STRIPES_PER_APPEND};
use crate::saved_plans::{self, Statement};

/// The trigger names loom creates on loom.events, the only ones this
/// function serves.
const TRIGGERS: [&str; 3] = [
    "events_track_inserted_executions",
    "events_track_deleted_executions",
    "events_track_truncated_executions",
];

/// Statements of up to this many rows have their ids read, sorted and
/// upserted one by one; larger ones go set-based through SQL.
const ROWS_READ_DIRECTLY: i64 = 10_000;

thread_local! {
    // How many INSERT statements on loom.events this backend's trigger has
    // tracked: an append compares it before and after its INSERT.
    static INSERTS_TRACKED: Cell<u64> = const { Cell::new(0) };
}

/// A count that grows each time the trigger keeps loom.executions for an
/// INSERT on loom.events. An append that sees it unchanged across its own
/// INSERT knows no trigger fired for it (Citus, a disabled trigger, one
/// dropped while the INSERT waited for its lock), and tracks its ids
/// itself: decided after the INSERT, with no catalog probe.
pub(crate) fn inserts_tracked() -> u64 {
    INSERTS_TRACKED.get()
}

/// Whether the trigger keeping loom.executions after INSERTs exists on
/// loom.events and fires in this session: false once `loom_distribute`
/// dropped it for Citus, or while it is disabled (`ALTER TABLE ... DISABLE
/// TRIGGER`, or an origin trigger under `session_replication_role`
/// replica), where loom's functions keep loom.executions themselves.
///
/// Read from the relation's cached trigger descriptor: no catalog query
/// per append. Called after an append's INSERT, whose lock on loom.events
/// keeps the triggers from coming or going before the transaction ends.
pub(crate) fn tracked_by_trigger() -> bool {
    unsafe {
        let namespace = pg_sys::get_namespace_oid(c"loom".as_ptr(), false);
        let relid = pg_sys::get_relname_relid(c"events".as_ptr(), namespace);
        if relid == pg_sys::InvalidOid {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                "relation \"loom.events\" does not exist"
            );
        }
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let trigdesc = (*rel).trigdesc;
        let fires = !trigdesc.is_null()
            && std::slice::from_raw_parts((*trigdesc).triggers, (*trigdesc).numtriggers as usize)
                .iter()
                .any(|t| {
                    CStr::from_ptr(t.tgname).to_bytes() == TRIGGERS[0].as_bytes()
                        && fires_in_this_session(t.tgenabled as u8)
                });
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        fires
    }
}

/// PostgreSQL's own rule for whether a trigger with `tgenabled` fires.
fn fires_in_this_session(tgenabled: u8) -> bool {
    let replica = unsafe { pg_sys::SessionReplicationRole }
        == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
    match tgenabled {
        pg_sys::TRIGGER_FIRES_ALWAYS => true,
        pg_sys::TRIGGER_FIRES_ON_ORIGIN => !replica,
        pg_sys::TRIGGER_FIRES_ON_REPLICA => replica,
        _ => false,
    }
}

/// `loom_executions_tracked_by_trigger()`, for loom's PL/pgSQL functions.
#[pg_extern(sql = false, stable)]
fn loom_executions_tracked_by_trigger() -> bool {
    tracked_by_trigger()
}

/// The statement trigger on loom.events (after INSERT, DELETE and
/// TRUNCATE). SECURITY DEFINER in SQL, so it trusts nothing about how it
/// was called: it refuses (42501) to run for any relation, timing, level
/// or trigger name but loom.events' own, before it reads anything.
#[pg_trigger(sql = false)]
fn loom_events_track_executions<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    refuse_unless_loom_events(trigger)?;
    let data = trigger.trigger_data();
    let schema = unsafe { pg_sys::get_func_namespace(trigger.trigger().tgfoid) };
    let mut spi = LazySpi::default();
    unsafe {
        match data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_TRUNCATE => {
                spi.connect();
                saved_plans::execute_once("TRUNCATE loom.executions");
            }
            pg_sys::TRIGGER_EVENT_INSERT => {
                if pg_sys::XactIsoLevel != pg_sys::XACT_READ_COMMITTED as i32 {
                    spi.connect();
                    refuse_outside_read_committed(schema, "appended to");
                }
                track_inserted(data, schema, &mut spi);
                INSERTS_TRACKED.set(INSERTS_TRACKED.get() + 1);
            }
            pg_sys::TRIGGER_EVENT_DELETE => {
                spi.connect();
                if pg_sys::XactIsoLevel != pg_sys::XACT_READ_COMMITTED as i32 {
                    refuse_outside_read_committed(schema, "deleted from");
                }
                track_deleted(data, schema);
            }
            _ => {}
        }
        spi.finish();
    }
    Ok(None)
}

/// SPI, connected on first need: an append onto executions that already
/// have their row runs no statement at all.
#[derive(Default)]
struct LazySpi {
    connected: bool,
}

impl LazySpi {
    unsafe fn connect(&mut self) {
        if !self.connected {
            unsafe { saved_plans::connect() };
            self.connected = true;
        }
    }

    unsafe fn finish(self) {
        if self.connected {
            unsafe { saved_plans::finish() };
        }
    }
}

fn refuse_unless_loom_events(trigger: &PgTrigger<'_>) -> Result<(), pgrx::PgTriggerError> {
    let rel = trigger.relation()?;
    let data = trigger.trigger_data();
    let name = trigger.name()?;
    let ours = rel.namespace() == "loom"
        && rel.name() == "events"
        && data.tg_event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_AFTER
        && data.tg_event & pg_sys::TRIGGER_EVENT_ROW == 0
        && TRIGGERS.contains(&name);
    if !ours {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "loom_events_track_executions() only keeps loom.executions for loom.events, not for {}.{} (trigger {name})",
                rel.namespace(),
                rel.name()
            )
        );
    }
    Ok(())
}

/// Appends are refused outside READ COMMITTED: `loom_require_read_committed`
/// raises the error (one message for every path).
unsafe fn refuse_outside_read_committed(schema: pg_sys::Oid, operation: &str) {
    unsafe {
        saved_plans::execute_once(&format!(
            "SELECT {}.loom_require_read_committed('{operation}')",
            saved_plans::quoted_schema(schema)
        ))
    };
}

/// After an INSERT: each id's executions row, found or added, under its
/// stripe's shared lock; or, for a statement over too many rows or
/// stripes, each row locked by an upsert, as loom_track_appended does.
unsafe fn track_inserted(data: &pg_sys::TriggerData, schema: pg_sys::Oid, spi: &mut LazySpi) {
    let rows = data.tg_newtable;
    if rows.is_null() {
        return;
    }
    if unsafe { pg_sys::tuplestore_tuple_count(rows) } > ROWS_READ_DIRECTLY {
        unsafe {
            spi.connect();
            track_inserted_set_based(data);
        }
        return;
    }
    let ids = unsafe { distinct_ids(data, rows) };
    let stripes = unsafe { stripes_of(&ids) };
    if stripes.len() > MAX_STRIPES_PER_APPEND {
        // One statement for all of them (a batch that starts a hundred
        // executions ran a hundred), rows in id order as ever.
        unsafe {
            spi.connect();
            let ids = text_array(&ids);
            saved_plans::execute(Statement::TrackInsertedIds, schema, &[Some(ids)]);
        }
        return;
    }
    stripes.lock(false);
    let executions = unsafe { ExecutionsIndex::open() };
    for id in ids {
        // A fresh snapshot, taken under the stripe's lock: a delete that
        // removed the row has committed, and none can remove it now.
        if unsafe { !executions.has(id) } {
            unsafe {
                spi.connect();
                // A concurrent append may be adding it: ON CONFLICT waits
                // for that one, and adds the row only if it rolled back.
                saved_plans::execute(
                    Statement::TrackNewId,
                    schema,
                    &[Some(pg_sys::Datum::from(id))],
                );
            }
        }
    }
    unsafe { executions.close() };
}

/// After a DELETE: each id's stripe locked exclusively first (in
/// ascending order, as appends take them), then their rows (in id order),
/// then, in a fresh statement, the rows of the executions left without
/// events removed: what `loom_track_emptied` does for one id, for the
/// whole statement at once (a retention batch deletes thousands).
unsafe fn track_deleted(data: &pg_sys::TriggerData, schema: pg_sys::Oid) {
    let rows = data.tg_oldtable;
    if rows.is_null() {
        return;
    }
    if unsafe { pg_sys::tuplestore_tuple_count(rows) } > ROWS_READ_DIRECTLY {
        // The stripes from one pass that keeps no id; the ids themselves
        // sorted in SQL.
        let mut stripes = Stripes::default();
        unsafe {
            for_each_id(data, rows, |id| {
                stripes.insert(stripe_of(pgrx::varlena::varlena_to_byte_slice(id)));
                false
            });
        }
        stripes.lock(true);
        unsafe { track_emptied_set_based(data) };
        return;
    }
    let ids = unsafe { distinct_ids(data, rows) };
    unsafe { stripes_of(&ids) }.lock(true);
    let ids = unsafe { text_array(&ids) };
    for statement in [Statement::LockEmptiedRows, Statement::DeleteEmptied] {
        unsafe { saved_plans::execute(statement, schema, &[Some(ids)]) };
    }
}

/// `ids` as one `text[]` datum, for a kept statement's `ANY ($1)`.
unsafe fn text_array(ids: &[*mut pg_sys::varlena]) -> pg_sys::Datum {
    let mut datums: Vec<pg_sys::Datum> = ids.iter().map(|&id| pg_sys::Datum::from(id)).collect();
    let array = unsafe {
        pg_sys::construct_array(
            datums.as_mut_ptr(),
            datums.len() as i32,
            pg_sys::TEXTOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
        )
    };
    pg_sys::Datum::from(array)
}

/// A large DELETE's emptied executions, through SQL over its transition
/// table: their rows locked in id order, then those left without events
/// removed, in a fresh statement.
unsafe fn track_emptied_set_based(data: &pg_sys::TriggerData) {
    unsafe { register_transition_tables(data) };
    for sql in [
        // loom_deleted's ids are in loom.events' collation, which differs
        // from loom.executions' until a conversion: named "C" against the
        // one, compared as they are with the other. pg_catalog's "C": this
        // runs as the owner under the caller's search_path.
        "SELECT 1 FROM loom.executions x \
         JOIN (SELECT DISTINCT o.execution_id AS id FROM loom_deleted o) d \
           ON x.execution_id OPERATOR(pg_catalog.=) d.id COLLATE pg_catalog.\"C\" \
         ORDER BY x.execution_id FOR UPDATE OF x",
        "DELETE FROM loom.executions x \
         USING (SELECT DISTINCT o.execution_id AS id FROM loom_deleted o \
                WHERE NOT EXISTS (SELECT FROM loom.events e \
                                  WHERE e.execution_id OPERATOR(pg_catalog.=) o.execution_id)) d \
         WHERE x.execution_id OPERATOR(pg_catalog.=) d.id COLLATE pg_catalog.\"C\"",
    ] {
        unsafe { saved_plans::execute_once(sql) };
    }
}

/// The stripes of `ids` (detoasted texts).
unsafe fn stripes_of(ids: &[*mut pg_sys::varlena]) -> Stripes {
    let mut stripes = Stripes::default();
    for &id in ids {
        stripes.insert(stripe_of(unsafe {
            pgrx::varlena::varlena_to_byte_slice(id)
        }));
    }
    stripes
}

/// The statement's transition tables, visible to SPI's queries by name.
unsafe fn register_transition_tables(data: &pg_sys::TriggerData) {
    let rc = unsafe { pg_sys::SPI_register_trigger_data(std::ptr::from_ref(data).cast_mut()) };
    if rc < 0 {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "SPI_register_trigger_data failed"
        );
    }
}

/// A large INSERT's ids, through SQL over its transition table (sorted
/// there, within work_mem or spilled: never all in this process's heap),
/// each row added or locked.
unsafe fn track_inserted_set_based(data: &pg_sys::TriggerData) {
    unsafe {
        register_transition_tables(data);
        saved_plans::execute_once(
            "INSERT INTO loom.executions AS x (execution_id) \
             SELECT DISTINCT i.execution_id FROM loom_inserted i ORDER BY 1 \
             ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false",
        )
    };
}

/// loom.events' execution_id column, which must be text: a SECURITY
/// DEFINER function reads no column typed by a caller.
fn execution_id_attnum(tupdesc: pg_sys::TupleDesc) -> i32 {
    let desc = unsafe { PgTupleDesc::from_pg_unchecked(tupdesc) };
    let found = desc
        .iter()
        .enumerate()
        .find(|(_, a)| !a.is_dropped() && a.name() == "execution_id");
    match found {
        Some((i, a)) if a.type_oid().value() == pg_sys::TEXTOID => i as i32 + 1,
        _ => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                "loom_events_track_executions() needs loom.events.execution_id of type text"
            );
        }
    }
}

/// Calls `f` with each row's execution id in a transition table (a run of
/// one id once), as a palloc'd, detoasted text that stays valid when `f`
/// returns true (kept) and is freed when it returns false.
unsafe fn for_each_id(
    data: &pg_sys::TriggerData,
    rows: *mut pg_sys::Tuplestorestate,
    mut f: impl FnMut(*mut pg_sys::varlena) -> bool,
) {
    let tupdesc = unsafe { (*data.tg_relation).rd_att };
    let attnum = execution_id_attnum(tupdesc);
    let i = (attnum - 1) as usize;
    unsafe {
        // A read pointer of its own, rewound: other triggers on the same
        // statement share the tuplestore.
        let reader = pg_sys::tuplestore_alloc_read_pointer(rows, pg_sys::EXEC_FLAG_REWIND as i32);
        pg_sys::tuplestore_select_read_pointer(rows, reader);
        pg_sys::tuplestore_rescan(rows);
        let slot = pg_sys::MakeSingleTupleTableSlot(tupdesc, &pg_sys::TTSOpsMinimalTuple);
        // The previous id, and whether `f` kept it (else it is ours to free).
        let mut last: Option<(*mut pg_sys::varlena, bool)> = None;
        let release = |(id, kept): (*mut pg_sys::varlena, bool)| {
            if !kept {
                pg_sys::pfree(id.cast());
            }
        };
        while pg_sys::tuplestore_gettupleslot(rows, true, false, slot) {
            pg_sys::slot_getsomeattrs_int(slot, attnum);
            if *(*slot).tts_isnull.add(i) {
                continue;
            }
            // A copy, detoasted (an id near btree's limit can be stored
            // compressed).
            let id = pg_sys::pg_detoast_datum_copy((*(*slot).tts_values.add(i)).cast_mut_ptr());
            // Rows of one statement are mostly one execution's, in a run.
            if let Some((previous, _)) = last {
                if pgrx::varlena::varlena_to_byte_slice(previous)
                    == pgrx::varlena::varlena_to_byte_slice(id)
                {
                    pg_sys::pfree(id.cast());
                    continue;
                }
            }
            if let Some(previous) = last.take() {
                release(previous);
            }
            last = Some((id, f(id)));
        }
        if let Some(previous) = last {
            release(previous);
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
    }
}

/// The distinct ids of a transition table, each a palloc'd text, sorted by
/// their bytes (the order of COLLATE "C").
unsafe fn distinct_ids(
    data: &pg_sys::TriggerData,
    rows: *mut pg_sys::Tuplestorestate,
) -> Vec<*mut pg_sys::varlena> {
    let mut ids: Vec<*mut pg_sys::varlena> = Vec::new();
    unsafe {
        for_each_id(data, rows, |id| {
            ids.push(id);
            true
        });
    }
    ids.sort_by(|a, b| unsafe {
        pgrx::varlena::varlena_to_byte_slice(*a).cmp(pgrx::varlena::varlena_to_byte_slice(*b))
    });
    ids.dedup_by(|a, b| unsafe {
        pgrx::varlena::varlena_to_byte_slice(*a) == pgrx::varlena::varlena_to_byte_slice(*b)
    });
    ids
}

/// `loom.executions` and its primary key, open for probes of one
/// statement's ids, each with a fresh snapshot.
struct ExecutionsIndex {
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
}

impl ExecutionsIndex {
    unsafe fn open() -> Self {
        unsafe {
            let namespace = pg_sys::get_namespace_oid(c"loom".as_ptr(), false);
            let heap = pg_sys::get_relname_relid(c"executions".as_ptr(), namespace);
            let index = pg_sys::get_relname_relid(c"executions_pkey".as_ptr(), namespace);
            if heap == pg_sys::InvalidOid || index == pg_sys::InvalidOid {
                ereport!(
                    ERROR,
                    PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                    "loom.executions or its primary key executions_pkey does not exist",
                    "restore them, then run loom_rebuild_executions() from loom's schema (SELECT <schema>.loom_rebuild_executions())"
                );
            }
            ExecutionsIndex {
                heap: pg_sys::table_open(heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE),
                index: pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE),
            }
        }
    }

    /// Whether `id` has a row, committed as of now.
    unsafe fn has(&self, id: *mut pg_sys::varlena) -> bool {
        unsafe {
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
            let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
            pg_sys::ScanKeyInit(
                &mut key,
                1,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::Oid::from(pg_sys::F_TEXTEQ),
                pg_sys::Datum::from(id),
            );
            key.sk_collation = *(*self.index).rd_indcollation;
            #[cfg(feature = "pg18")]
            let scan = pg_sys::index_beginscan(
                self.heap,
                self.index,
                snapshot,
                std::ptr::null_mut(),
                1,
                0,
            );
            #[cfg(not(feature = "pg18"))]
            let scan = pg_sys::index_beginscan(self.heap, self.index, snapshot, 1, 0);
            pg_sys::index_rescan(scan, &mut key, 1, std::ptr::null_mut(), 0);
            let slot = pg_sys::table_slot_create(self.heap, std::ptr::null_mut());
            let found =
                pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
            pg_sys::index_endscan(scan);
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::UnregisterSnapshot(snapshot);
            found
        }
    }

    unsafe fn close(self) {
        unsafe {
            pg_sys::index_close(self.index, pg_sys::NoLock as pg_sys::LOCKMODE);
            pg_sys::table_close(self.heap, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
}
