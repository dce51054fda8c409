//! A `text` value decoded straight into Postgres memory.
//!
//! A 600 KB state returned as a Rust `String` costs a second 600 KB buffer,
//! a copy, and the page faults of both on every call (measured with perf:
//! a third of the server's decode time). Decoding into the varlena Postgres
//! returns costs one buffer and no copy.

use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// An owned, palloc'd `text` varlena, filled through [`AsMut`].
pub(crate) struct PallocText {
    varlena: *mut pg_sys::varlena,
    len: usize,
}

impl PallocText {
    /// A zeroed `text` of `len` bytes in the current memory context (zeroed
    /// so that Rust may hand it out as an initialized `&mut [u8]`).
    pub(crate) fn zeroed(len: usize) -> Self {
        let total = len + pg_sys::VARHDRSZ;
        // The codec's ceiling (256 MiB) keeps this far below MaxAllocSize,
        // and palloc raises its own ERROR when memory runs out.
        let varlena = unsafe { pg_sys::palloc0(total) }.cast::<pg_sys::varlena>();
        // SAFETY: `varlena` points to `total` writable bytes.
        unsafe { pgrx::set_varsize_4b(varlena, total as i32) };
        PallocText { varlena, len }
    }
}

impl AsMut<[u8]> for PallocText {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: the data area follows the 4-byte header and is `len`
        // zeroed bytes owned by this value.
        unsafe {
            let data = self.varlena.cast::<u8>().add(pg_sys::VARHDRSZ);
            std::slice::from_raw_parts_mut(data, self.len)
        }
    }
}

// SAFETY: the datum is a complete, palloc'd text varlena.
unsafe impl BoxRet for PallocText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(pg_sys::Datum::from(self.varlena)) }
    }
}

impl_sql_translatable!(PallocText, "text");
