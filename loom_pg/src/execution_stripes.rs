//! The locks that keep an append and a delete of an execution's last
//! events from passing each other, without writing to `loom.executions`.
//!
//! An append must not find an execution's row in `loom.executions` and
//! rely on it while a concurrent delete of that execution's last events
//! removes it. Locking the row (an upsert whose update never applies)
//! would cost a WAL record and a dirtied page per append, most of the
//! trigger's cost. So an append holds a shared lock on the execution's
//! *stripe* (one of [`STRIPES`], by a stable hash
//! of the id) while it looks for the row with a fresh snapshot, and a
//! delete that may empty an execution takes the stripe exclusively before
//! it looks for events left (`loom_track_emptied`, through
//! `loom_lock_execution_for_delete`). Lock-manager locks, in memory: no
//! page is written unless the execution is new.
//!
//! Striped, not one lock per id, so that a transaction never holds more
//! than [`STRIPES`] of them, whatever it appends or deletes (the lock
//! table is shared and sized by `max_locks_per_transaction`); the price
//! is that a delete emptying an execution holds back, until it commits,
//! appends to the executions sharing its stripe. Stripes are taken in
//! ascending order within a statement, so appends and deletes cannot
//! deadlock on them. In `pg_locks` they are advisory locks with `classid`
//! 1819242349 ("loom"), `objid` the stripe and `objsubid` 3, a key no
//! `pg_advisory_*` function can take.
//!
//! Appends that name more than [`MAX_STRIPES_PER_APPEND`] stripes, and
//! every path without the trigger (Citus), lock the rows instead, as
//! before; deletes take both, so either protocol alone is enough.

use pgrx::pg_sys;
use pgrx::prelude::*;

/// How many stripes the execution ids hash into.
pub(crate) const STRIPES: u32 = 64;

/// An append statement whose ids fall in more stripes than this locks
/// their rows instead (bounding the locks a statement takes).
pub(crate) const MAX_STRIPES_PER_APPEND: u32 = 8;

/// `classid` of the stripes' lock tag: "loom" in ASCII, as the migration
/// lock's key.
const LOCK_CLASS: u32 = 0x6C6F_6F6D;

/// `objsubid`: advisory locks taken from SQL use 1 (one bigint key) and 2
/// (two integer keys).
const LOCK_KIND: u16 = 3;

/// The stripe of an execution id: FNV-1a of its bytes, a hash fixed here
/// for good (backends running two builds of loom must agree).
pub(crate) fn stripe_of(id: &[u8]) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(STRIPES)) as u32
}

/// A set of stripes, one bit each.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Stripes(u64);

impl Stripes {
    pub(crate) fn insert(&mut self, stripe: u32) {
        self.0 |= 1 << stripe;
    }

    pub(crate) fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Takes each stripe's lock, in ascending order, held to the end of the
    /// transaction: shared for an append, exclusive for a delete.
    pub(crate) fn lock(self, exclusive: bool) {
        for stripe in 0..STRIPES {
            if self.0 & (1 << stripe) != 0 {
                lock_stripe(stripe, exclusive);
            }
        }
    }
}

fn lock_stripe(stripe: u32, exclusive: bool) {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: LOCK_CLASS,
        locktag_field3: stripe,
        locktag_field4: LOCK_KIND,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    let mode = if exclusive {
        pg_sys::ExclusiveLock
    } else {
        pg_sys::ShareLock
    };
    unsafe {
        pg_sys::LockAcquire(&tag, mode as pg_sys::LOCKMODE, false, false);
    }
}

/// `loom_lock_execution_for_delete(execution_id text)`: what
/// `loom_track_emptied` takes before it looks for events left. The
/// owner's alone (a caller could hold back appends).
#[pg_extern(sql = false, volatile, strict)]
fn loom_lock_execution_for_delete(execution_id: &str) {
    lock_stripe(stripe_of(execution_id.as_bytes()), true);
}

/// `loom_lock_executions_for_delete(execution_ids text[])`: the stripes
/// of many ids taken exclusively at once, in ascending order, as a delete
/// statement takes them, so a batch of a sweep or a repair cannot deadlock
/// with appends over several stripes (as it could taking them id by id).
/// A NULL element is passed over. The owner's alone, as the one-id form.
#[pg_extern(sql = false, volatile, strict)]
fn loom_lock_executions_for_delete(execution_ids: pgrx::Array<&str>) {
    let mut stripes = Stripes::default();
    for id in execution_ids.iter().flatten() {
        stripes.insert(stripe_of(id.as_bytes()));
        pgrx::check_for_interrupts!();
    }
    stripes.lock(true);
}

/// `loom_lock_execution_for_write(execution_id text)`: the lock appends
/// hold, shared, taken by the writes of an execution's snapshots and refs,
/// so that a sweep that deletes the execution waits for them and then sees
/// what they wrote (deleting it with the rest) instead of leaving a row for
/// an execution that is gone. Writers' only (held, it holds back deletes).
#[pg_extern(sql = false, volatile, strict)]
fn loom_lock_execution_for_write(execution_id: &str) {
    lock_stripe(stripe_of(execution_id.as_bytes()), false);
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn the_stripe_hash_is_fixed() {
        // FNV-1a 64 of "" and "a", published values: a build that changed
        // the hash would not exclude a delete running in an older build.
        assert_eq!(stripe_of(b""), (0xcbf2_9ce4_8422_2325_u64 % 64) as u32);
        assert_eq!(stripe_of(b"a"), (0xaf63_dc4c_8601_ec8c_u64 % 64) as u32);
    }

    #[pg_test]
    fn stripes_count_their_members() {
        let mut stripes = Stripes::default();
        for s in [3, 3, 63, 0] {
            stripes.insert(s);
        }
        assert_eq!(stripes.len(), 3);
    }
}
