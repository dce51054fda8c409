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

/// A frame's text decoded into Postgres memory with a NUL after it, so that
/// `jsonb_in` can take it as its `cstring` without a copy (the jsonb
/// builder hands it what it declines). Freed with the memory context, or
/// earlier with [`PallocCString::free`].
pub(crate) struct PallocCString {
    data: *mut u8,
    len: usize,
}

impl PallocCString {
    /// `len` zeroed bytes and the NUL after them, in the current memory
    /// context (zeroed so that Rust may hand them out as `&mut [u8]`).
    pub(crate) fn zeroed(len: usize) -> Self {
        // The codec's ceiling (256 MiB) keeps this below MaxAllocSize; an
        // allocation that fails is palloc's own ERROR.
        // SAFETY: palloc0 returns `len + 1` zeroed bytes or raises an ERROR.
        let data = unsafe { pg_sys::palloc0(len + 1) }.cast::<u8>();
        PallocCString { data, len }
    }

    /// A copy of `text`, which holds no NUL byte (decoded JSON never does:
    /// a raw control character is not JSON).
    pub(crate) fn from_str(text: &str) -> Self {
        let mut copy = Self::zeroed(text.len());
        copy.as_mut().copy_from_slice(text.as_bytes());
        copy
    }

    /// The bytes, without the NUL.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes owned by this value.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// The bytes and the NUL after them, as a C string.
    pub(crate) fn as_c_str(&self) -> *const std::ffi::c_char {
        self.data.cast()
    }

    /// Gives the memory back now rather than with the memory context.
    pub(crate) fn free(self) {
        // SAFETY: palloc'd by `zeroed` and not freed before (self is moved).
        unsafe { pg_sys::pfree(self.data.cast()) }
    }
}

impl AsMut<[u8]> for PallocCString {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` zeroed (initialized) bytes owned by this value;
        // the NUL after them is not handed out.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }
}

/// A growable array of `Copy` values in palloc'd memory (the current
/// memory context's, at the first allocation): accounted by Postgres, freed
/// with the context on an ERROR, and a request Postgres cannot meet is
/// palloc's ERROR, never an abort. Grows by doubling, through
/// `repalloc_huge`, so it is not capped at MaxAllocSize (what it holds is
/// bounded by its callers).
pub(crate) struct PallocVec<T: Copy> {
    data: *mut T,
    len: usize,
    cap: usize,
}

impl<T: Copy> PallocVec<T> {
    pub(crate) fn new() -> Self {
        PallocVec {
            data: std::ptr::null_mut(),
            len: 0,
            cap: 0,
        }
    }

    pub(crate) fn with_capacity(cap: usize) -> Self {
        let mut vec = Self::new();
        vec.reserve(cap);
        vec
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Room for `additional` more values.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let needed = self
            .len
            .checked_add(additional)
            .unwrap_or_else(|| too_large());
        if needed <= self.cap {
            return;
        }
        let cap = needed.max(self.cap.saturating_mul(2)).max(16);
        let bytes = cap
            .checked_mul(std::mem::size_of::<T>())
            .unwrap_or_else(|| too_large());
        // SAFETY: `data` is null or this vector's own palloc'd chunk; both
        // calls return `bytes` bytes (MAXALIGNed, enough for T) keeping the
        // old contents, or raise an ERROR.
        self.data = unsafe {
            if self.data.is_null() {
                pg_sys::MemoryContextAllocHuge(pg_sys::CurrentMemoryContext, bytes)
            } else {
                pg_sys::repalloc_huge(self.data.cast(), bytes)
            }
        }
        .cast::<T>();
        self.cap = cap;
    }

    pub(crate) fn push(&mut self, value: T) {
        self.reserve(1);
        // SAFETY: `len < cap` after reserve.
        unsafe { self.data.add(self.len).write(value) };
        self.len += 1;
    }

    pub(crate) fn extend_from_slice(&mut self, values: &[T]) {
        self.reserve(values.len());
        // SAFETY: room for `values.len()` more after reserve; `values` is
        // not inside this vector's spare capacity (nothing hands that out).
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), self.data.add(self.len), values.len());
        }
        self.len += values.len();
    }

    /// Appends copies of `value` up to `len` values.
    pub(crate) fn resize(&mut self, len: usize, value: T) {
        if len > self.len {
            self.reserve(len - self.len);
            for i in self.len..len {
                // SAFETY: `i < cap` after reserve.
                unsafe { self.data.add(i).write(value) };
            }
        }
        self.len = len;
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        if self.data.is_null() {
            return &[];
        }
        // SAFETY: the first `len` values are initialized and owned here.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        if self.data.is_null() {
            return &mut [];
        }
        // SAFETY: as in as_slice, and `&mut self` makes it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }

    /// The palloc'd chunk, handed over (null if nothing was allocated).
    pub(crate) fn into_raw(self) -> *mut T {
        self.data
    }

    /// Gives the memory back now rather than with the memory context.
    pub(crate) fn free(self) {
        if !self.data.is_null() {
            // SAFETY: this vector's own palloc'd chunk, not freed before.
            unsafe { pg_sys::pfree(self.data.cast()) }
        }
    }
}

fn too_large() -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        "loom: allocation size overflows"
    );
}
