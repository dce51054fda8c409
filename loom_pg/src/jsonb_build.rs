//! A frame's state as Postgres jsonb, built from loom's own reading of the
//! text that decode has just validated, straight into jsonb's binary
//! layout: no second lexer (`jsonb_in`), no tree of `JsonbValue`s.
//! `jsonb_in` cost ~4 ms of a 600 KB state's ~6 ms read; this is the
//! difference between `loom_snapshot_state` and reading a JSONB column.
//!
//! The result is byte for byte what `text::jsonb` gives (the pg_tests
//! compare them on random JSON): keys sorted by length then bytes, the last
//! of duplicate keys kept, numbers as `numeric_in` makes them, JEntries
//! with an offset every `JB_OFFSET_STRIDE`, containers and numerics padded
//! to 4 bytes; and where `text::jsonb` refuses, the same ERROR.
//!
//! Its memory is bounded and Postgres's (issue 16): no tree. Two passes
//! over the text, everything palloc'd in the current memory context (freed
//! with it on an ERROR; a request Postgres cannot meet is palloc's ERROR,
//! never an abort):
//!
//! 1. [`outline`]: one explicit stack of at most [`MAX_DEPTH`] open
//!    containers, and per non-empty container, in preorder, a [`Span`]:
//!    where it ends, how many children it has, where its subtree's spans
//!    end (12 bytes; `jsonb_in` spends ~200 on each container). It counts
//!    as `jsonb_in` does and refuses in the same place, with the same
//!    ERROR, an array or object past jsonb's limits ([`MAX_ELEMS`],
//!    [`MAX_PAIRS`]), and checks every number `numeric_in` could refuse,
//!    in text order, so that the first error is `jsonb_in`'s.
//! 2. [`Builder`]: writes the jsonb into one palloc'd varlena, arrays in
//!    text order, objects by collecting (key, value position) in a palloc'd
//!    scratch stack, sorting in place, and skipping container values
//!    through the spans; total sizes are checked as `convertToJsonb`
//!    checks them, with its ERRORs.
//!
//! Both passes check for interrupts (issue 25) through the hook `_PG_init`
//! installs: the outline where each value ends, the builder every
//! [`ITEMS_PER_CHECK`] elements, members and sort comparisons, and both
//! inside every long run of whitespace, digits or string bytes.
//!
//! What `jsonb_in` refuses with an error naming where in the text
//! (`\u0000`, a lone surrogate) or treats by its own stack (nesting deeper
//! than [`MAX_DEPTH`]) is not built here: the text goes to `jsonb_in`
//! as it is (the decoded buffer is its cstring, no copy), which gives the
//! same result or its own error, in memory of its own making.

use pgloom_core::interrupt::{self, Ticker, CHECK_INTERVAL};
use pgloom_core::json;
use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED;

use crate::palloc_text::{PallocCString, PallocVec};

/// Deeper than this, `jsonb_in` (with its stack-depth check) builds it.
const MAX_DEPTH: usize = 200;

const OFFLEN_MASK: u32 = pg_sys::JENTRY_OFFLENMASK;
const TYPE_MASK: u32 = pg_sys::JENTRY_TYPEMASK;
const STRIDE: usize = pg_sys::JB_OFFSET_STRIDE as usize;

/// memutils.h's `MaxAllocSize` (a macro bindgen does not carry).
const MAX_ALLOC_SIZE: usize = 0x3fff_ffff;

/// The most elements `text::jsonb` (PostgreSQL 15) builds in one array:
/// 16,777,216. jsonb_util.c's `appendElement` refuses past
/// `JSONB_MAX_ELEMS` (`Min(MaxAllocSize / sizeof(JsonbValue), JB_CMASK)`,
/// 33,554,431), but first doubles its `JsonbValue` array from 4, and the
/// doubling past 2^24 asks `repalloc` for 1 GiB, over `MaxAllocSize`: it
/// raises "invalid memory alloc request size 1073741824" (XX000) at element
/// 2^24 + 1. loom refuses at that same element, so that the two accept the
/// same texts, with jsonb's own limit error (54000) naming the limit that
/// holds.
const MAX_ELEMS: usize = doubling_limit(
    std::mem::size_of::<pg_sys::JsonbValue>(),
    MAX_ALLOC_SIZE / std::mem::size_of::<pg_sys::JsonbValue>(),
);
/// The most pairs (duplicate keys counted) `text::jsonb` builds in one
/// object: 8,388,608, below `JSONB_MAX_PAIRS` (14,913,080) the same way
/// (`appendKey` doubles a `JsonbPair` array).
const MAX_PAIRS: usize = doubling_limit(
    std::mem::size_of::<pg_sys::JsonbPair>(),
    MAX_ALLOC_SIZE / std::mem::size_of::<pg_sys::JsonbPair>(),
);

/// How many items an array of `item` bytes that starts at 4 and doubles
/// within `MaxAllocSize` holds, and at most `nominal` (JB_CMASK is larger
/// still).
const fn doubling_limit(item: usize, nominal: usize) -> usize {
    let mut size = 4;
    while size * 2 * item <= MAX_ALLOC_SIZE {
        size *= 2;
    }
    if size < nominal {
        size
    } else {
        nominal
    }
}

/// The builder declines: `jsonb_in` takes the text instead.
struct Declined;

/// An owned, palloc'd jsonb varlena.
pub(crate) struct PallocJsonb(*mut pg_sys::varlena);

// SAFETY: the datum is a complete, palloc'd jsonb varlena.
unsafe impl BoxRet for PallocJsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(pg_sys::Datum::from(self.0)) }
    }
}

impl_sql_translatable!(PallocJsonb, "jsonb");

/// `text` (one valid JSON text, as decode leaves it) as jsonb, exactly as
/// `text::jsonb` would make it or refuse it.
pub(crate) fn to_jsonb(text: &PallocCString) -> PallocJsonb {
    let bytes = text.as_bytes();
    match outline(bytes) {
        Ok(spans) => {
            let jsonb = build(bytes, spans.as_slice());
            spans.free();
            jsonb
        }
        Err(Declined) => jsonb_in(text),
    }
}

/// Postgres's own `jsonb_in`, for what the builder declines.
fn jsonb_in(text: &PallocCString) -> PallocJsonb {
    // SAFETY: jsonb_in takes one NUL-terminated cstring (a JSON text holds
    // no NUL byte) and returns a jsonb datum, or raises its own ERROR,
    // which pgrx turns into a panic and back.
    let datum = unsafe {
        pgrx::direct_function_call_as_datum(
            pg_sys::jsonb_in,
            &[Some(pg_sys::Datum::from(text.as_c_str()))],
        )
    }
    .expect("jsonb_in returns a value");
    PallocJsonb(datum.cast_mut_ptr())
}

/// A non-empty container, in preorder: the offset just past it, its
/// children (elements, or pairs counting duplicates), and the index of the
/// first span after its subtree.
#[derive(Clone, Copy)]
struct Span {
    end: u32,
    count: u32,
    next: u32,
}

/// No span: a scalar or an empty container.
const NO_SPAN: u32 = u32::MAX;

/// An open container in [`outline`].
#[derive(Clone, Copy, Default)]
struct Open {
    span: u32,
    count: u32,
    object: bool,
}

// The scans below check for interrupts (issue 25) every CHECK_INTERVAL
// bytes of a run, through the hook `_PG_init` installs: 256 MiB of
// whitespace, of one number or of `\n` in one string would otherwise each
// be one uninterruptible loop. A run shorter than that never checks.

fn skip_whitespace(text: &[u8], mut pos: usize) -> usize {
    let mut ticker = Ticker::starting_at(pos);
    while matches!(text.get(pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        pos += 1;
        ticker.at(pos);
    }
    pos
}

/// Where the string whose opening quote is at `pos` ends (past its closing
/// quote), and whether it has escapes.
fn string_end(text: &[u8], pos: usize) -> (usize, bool) {
    let mut ticker = Ticker::starting_at(pos);
    let mut end = pos + 1;
    let mut escaped = false;
    loop {
        let window = &text[end..text.len().min(end + CHECK_INTERVAL)];
        assert!(!window.is_empty(), "a validated string ends");
        match memchr::memchr2(b'"', b'\\', window) {
            Some(at) if window[at] == b'"' => return (end + at + 1, escaped),
            Some(at) => {
                escaped = true;
                end += at + 2;
            }
            None => end += window.len(),
        }
        ticker.at(end);
    }
}

fn number_end(text: &[u8], mut pos: usize) -> usize {
    let mut ticker = Ticker::starting_at(pos);
    while matches!(
        text.get(pos),
        Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
    ) {
        pos += 1;
        ticker.at(pos);
    }
    pos
}

/// If `text[pos]` opens an empty container, the position past it.
fn empty_container_end(text: &[u8], pos: usize) -> Option<usize> {
    let inner = skip_whitespace(text, pos + 1);
    matches!(text[inner], b']' | b'}').then_some(inner + 1)
}

/// Declines a string body `jsonb_in` refuses: `\u0000` (which Postgres
/// text cannot hold) or a lone surrogate.
fn check_escapes(body: &[u8]) -> Result<(), Declined> {
    let mut nul = false;
    json::unescape_with(body, |run| nul |= memchr::memchr(0, run).is_some()).ok_or(Declined)?;
    if nul {
        return Err(Declined);
    }
    Ok(())
}

/// Raises `numeric_in`'s ERROR where it would refuse `number`, as
/// `jsonb_in` would at this point of the text. Only numbers with an
/// exponent or longer than 1,000 bytes can be refused (past 131,072
/// integer digits, 16,383 decimals, or an exponent out of range); the rest
/// are not looked at twice.
fn check_number(number: &[u8]) {
    if number.len() > 1000 || number.iter().any(|&b| b == b'e' || b == b'E') {
        // SAFETY: as append_numeric's: a palloc'd numeric, freed here.
        unsafe { pg_sys::pfree(numeric_in(number).cast()) };
    }
}

fn too_many_elements() -> ! {
    ereport!(
        ERROR,
        ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("number of jsonb array elements exceeds the maximum allowed ({MAX_ELEMS})")
    );
}

fn too_many_pairs() -> ! {
    ereport!(
        ERROR,
        ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("number of jsonb object pairs exceeds the maximum allowed ({MAX_PAIRS})")
    );
}

/// Pass 1: the spans of `text` (one valid JSON text), or an ERROR where
/// `jsonb_in` would raise one of its limits, or [`Declined`].
fn outline(text: &[u8]) -> Result<PallocVec<Span>, Declined> {
    if u32::try_from(text.len()).is_err() {
        return Err(Declined);
    }
    let mut spans = PallocVec::new();
    let mut stack = [Open::default(); MAX_DEPTH];
    let mut depth = 0;
    let mut pos = skip_whitespace(text, 0);
    // Every value ends in the loop below (and no more than MAX_DEPTH
    // containers open in a row): the one check the structure needs.
    let mut ticker = Ticker::starting_at(0);
    // An object's key and colon: jsonb_in counts the pair at its key.
    let key = |pos: usize, open: &mut Open| -> Result<usize, Declined> {
        let (end, escaped) = string_end(text, pos);
        if escaped {
            check_escapes(&text[pos + 1..end - 1])?;
        }
        open.count += 1;
        if open.count as usize > MAX_PAIRS {
            too_many_pairs();
        }
        // The ':'.
        Ok(skip_whitespace(text, skip_whitespace(text, end) + 1))
    };
    'value: loop {
        match text[pos] {
            open @ (b'[' | b'{') => match empty_container_end(text, pos) {
                Some(end) => pos = end,
                None => {
                    if depth == MAX_DEPTH {
                        return Err(Declined);
                    }
                    stack[depth] = Open {
                        span: spans.len() as u32,
                        count: 0,
                        object: open == b'{',
                    };
                    depth += 1;
                    spans.push(Span {
                        end: 0,
                        count: 0,
                        next: 0,
                    });
                    pos = skip_whitespace(text, pos + 1);
                    if open == b'{' {
                        pos = key(pos, &mut stack[depth - 1])?;
                    }
                    continue 'value;
                }
            },
            b'"' => {
                let (end, escaped) = string_end(text, pos);
                if escaped {
                    check_escapes(&text[pos + 1..end - 1])?;
                }
                pos = end;
            }
            b't' | b'n' => pos += 4,
            b'f' => pos += 5,
            _ => {
                let end = number_end(text, pos);
                check_number(&text[pos..end]);
                pos = end;
            }
        }
        // A value ended: count it (jsonb_in counts an element when it
        // ends, a nested container's after its contents), then close
        // containers until one has more.
        loop {
            ticker.at(pos);
            pos = skip_whitespace(text, pos);
            let Some(top) = depth.checked_sub(1).map(|top| &mut stack[top]) else {
                return Ok(spans);
            };
            if !top.object {
                top.count += 1;
                if top.count as usize > MAX_ELEMS {
                    too_many_elements();
                }
            }
            if text[pos] == b',' {
                pos = skip_whitespace(text, pos + 1);
                if top.object {
                    pos = key(pos, top)?;
                }
                continue 'value;
            }
            pos += 1;
            let next = spans.len() as u32;
            spans.as_mut_slice()[top.span as usize] = Span {
                end: pos as u32,
                count: top.count,
                next,
            };
            depth -= 1;
            if depth == 0 {
                return Ok(spans);
            }
        }
    }
}

/// Pass 2: the jsonb of `text`, whose spans `outline` found.
fn build(text: &[u8], spans: &[Span]) -> PallocJsonb {
    let mut builder = Builder {
        text,
        spans,
        // A jsonb is about as long as its text.
        out: PallocVec::with_capacity(text.len() + text.len() / 4 + 64),
        members: PallocVec::new(),
        keys: PallocVec::new(),
        items: 0,
    };
    // The varlena header, set below.
    builder.out.extend_from_slice(&[0; 4]);
    let pos = skip_whitespace(text, 0);
    match text[pos] {
        b'[' | b'{' => {
            let span = if empty_container_end(text, pos).is_some() {
                NO_SPAN
            } else {
                0
            };
            builder.value(pos, span);
        }
        // A scalar is stored as a one-element array marked scalar.
        _ => {
            let (base, jentries) = builder.open(1 | pg_sys::JB_FARRAY | pg_sys::JB_FSCALAR, 1);
            let (meta, _) = builder.value(pos, NO_SPAN);
            let mut total = 0;
            builder.set_jentry(jentries, 0, meta, &mut total, Kind::Array);
            builder.close(base, Kind::Array);
        }
    }
    let Builder {
        out, members, keys, ..
    } = builder;
    members.free();
    keys.free();
    let len = out.len();
    let varlena = out.into_raw().cast::<pg_sys::varlena>();
    // SAFETY: a palloc'd chunk of `len` bytes (checked below 1 GB by the
    // size checks: every container's data is at most OFFLEN_MASK) whose
    // first 4 are the header.
    unsafe { pgrx::set_varsize_4b(varlena, len as i32) };
    PallocJsonb(varlena)
}

/// A member of the object being written: where its key's unescaped bytes
/// are (in the text, or in the scratch `keys`), where its value starts and
/// its span, and its place in the text (of equal keys the last wins).
#[derive(Clone, Copy)]
struct Member {
    key: u32,
    key_len: u32,
    key_in_scratch: bool,
    order: u32,
    value: u32,
    span: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Array,
    Object,
}

struct Builder<'a> {
    text: &'a [u8],
    spans: &'a [Span],
    /// The jsonb varlena, header included.
    out: PallocVec<u8>,
    /// The members of every object being written, innermost last.
    members: PallocVec<Member>,
    /// The unescaped keys (those with escapes) of those members.
    keys: PallocVec<u8>,
    /// Elements and members written, and sort comparisons made: the
    /// interrupt check comes every [`ITEMS_PER_CHECK`] (by count, as
    /// objects are written in key order, not text order).
    items: usize,
}

/// How many elements, members or comparisons [`Builder`] goes through
/// between interrupt checks: well under a millisecond's work, the long
/// tokens among them checked inside their own scans.
const ITEMS_PER_CHECK: usize = 4096;

/// Counts one item of `items`, and checks for interrupts every
/// [`ITEMS_PER_CHECK`].
fn count_item(items: &mut usize) {
    *items += 1;
    if (*items).is_multiple_of(ITEMS_PER_CHECK) {
        interrupt::check();
    }
}

impl Builder<'_> {
    /// Zeros up to a 4-byte boundary of the whole varlena; how many.
    fn pad(&mut self) -> u32 {
        let pad = (4 - self.out.len() % 4) % 4;
        self.out.resize(self.out.len() + pad, 0);
        pad as u32
    }

    /// The span of the value at `pos`, advancing `cursor` past its subtree
    /// if it is a non-empty container.
    fn child_span(&self, pos: usize, cursor: &mut u32) -> u32 {
        if matches!(self.text[pos], b'[' | b'{') && empty_container_end(self.text, pos).is_none() {
            let span = *cursor;
            *cursor = self.spans[span as usize].next;
            span
        } else {
            NO_SPAN
        }
    }

    /// Writes the value at `pos` (with its span, if a non-empty
    /// container); returns its JEntry (type and length) and where it ends.
    fn value(&mut self, pos: usize, span: u32) -> (u32, usize) {
        let text = self.text;
        match text[pos] {
            b'[' | b'{' => {
                let kind = if text[pos] == b'[' {
                    Kind::Array
                } else {
                    Kind::Object
                };
                if span == NO_SPAN {
                    let end = empty_container_end(text, pos).expect("an empty container");
                    let flag = match kind {
                        Kind::Array => pg_sys::JB_FARRAY,
                        Kind::Object => pg_sys::JB_FOBJECT,
                    };
                    let (base, _) = self.open(flag, 0);
                    return (self.close(base, kind), end);
                }
                let meta = match kind {
                    Kind::Array => self.array(pos, span),
                    Kind::Object => self.object(pos, span),
                };
                (meta, self.spans[span as usize].end as usize)
            }
            b'"' => {
                let (end, escaped) = string_end(text, pos);
                let body = &text[pos + 1..end - 1];
                let before = self.out.len();
                if escaped {
                    let out = &mut self.out;
                    json::unescape_with(body, |run| out.extend_from_slice(run))
                        .expect("outline checked the escapes");
                } else {
                    self.out.extend_from_slice(body);
                }
                // At most the text's 256 MiB less the quotes: under
                // OFFLEN_MASK, so checkStringLen never refuses.
                let len = (self.out.len() - before) as u32;
                (pg_sys::JENTRY_ISSTRING | len, end)
            }
            b't' => (pg_sys::JENTRY_ISBOOL_TRUE, pos + 4),
            b'f' => (pg_sys::JENTRY_ISBOOL_FALSE, pos + 5),
            b'n' => (pg_sys::JENTRY_ISNULL, pos + 4),
            _ => {
                let end = number_end(text, pos);
                let pad = self.pad();
                let len = append_numeric(&mut self.out, &text[pos..end]);
                (pg_sys::JENTRY_ISNUMERIC | (pad + len), end)
            }
        }
    }

    /// The container header and a zeroed JEntry for each of `entries`;
    /// returns where the container began (before its padding) and where
    /// its JEntries are.
    fn open(&mut self, header: u32, entries: usize) -> (usize, usize) {
        let base = self.out.len();
        self.pad();
        self.out.extend_from_slice(&header.to_ne_bytes());
        let jentries = self.out.len();
        self.out.resize(jentries + 4 * entries, 0);
        (base, jentries)
    }

    /// Stores child `i`'s JEntry, its length added to `total`: every
    /// STRIDE-th holds the end offset instead of the length. Raises
    /// convertJsonbArray's / convertJsonbObject's ERROR where they would.
    fn set_jentry(&mut self, jentries: usize, i: usize, meta: u32, total: &mut u32, kind: Kind) {
        // Each length is at most OFFLEN_MASK and total no more: no overflow.
        *total += meta & OFFLEN_MASK;
        if *total > OFFLEN_MASK {
            too_big(kind);
        }
        let meta = if i.is_multiple_of(STRIDE) {
            (meta & TYPE_MASK) | *total | pg_sys::JENTRY_HAS_OFF
        } else {
            meta
        };
        self.out.as_mut_slice()[jentries + 4 * i..jentries + 4 * i + 4]
            .copy_from_slice(&meta.to_ne_bytes());
    }

    fn close(&self, base: usize, kind: Kind) -> u32 {
        let len = self.out.len() - base;
        if len > OFFLEN_MASK as usize {
            too_big(kind);
        }
        pg_sys::JENTRY_ISCONTAINER | len as u32
    }

    /// The next element or member after a value that ended at `end`.
    fn next_item(&self, end: usize) -> usize {
        let pos = skip_whitespace(self.text, end);
        // A ',' (or the closing bracket, past which nothing is read).
        skip_whitespace(self.text, pos + 1)
    }

    fn array(&mut self, pos: usize, span: u32) -> u32 {
        let count = self.spans[span as usize].count as usize;
        let (base, jentries) = self.open(count as u32 | pg_sys::JB_FARRAY, count);
        let mut total = 0;
        let mut cursor = span + 1;
        let mut pos = skip_whitespace(self.text, pos + 1);
        for i in 0..count {
            count_item(&mut self.items);
            let child = self.child_span(pos, &mut cursor);
            let (meta, end) = self.value(pos, child);
            self.set_jentry(jentries, i, meta, &mut total, Kind::Array);
            pos = self.next_item(end);
        }
        self.close(base, Kind::Array)
    }

    fn object(&mut self, pos: usize, span: u32) -> u32 {
        let text = self.text;
        let count = self.spans[span as usize].count as usize;
        let base_member = self.members.len();
        let base_key = self.keys.len();
        self.members.reserve(count);
        let mut cursor = span + 1;
        let mut pos = skip_whitespace(text, pos + 1);
        for order in 0..count {
            count_item(&mut self.items);
            let (key_end, escaped) = string_end(text, pos);
            let body = &text[pos + 1..key_end - 1];
            let (key, key_len) = if escaped {
                let start = self.keys.len();
                let keys = &mut self.keys;
                json::unescape_with(body, |run| keys.extend_from_slice(run))
                    .expect("outline checked the escapes");
                (start, self.keys.len() - start)
            } else {
                (pos + 1, body.len())
            };
            // The ':'.
            let value = skip_whitespace(text, skip_whitespace(text, key_end) + 1);
            let child = self.child_span(value, &mut cursor);
            let end = match child {
                NO_SPAN => match text[value] {
                    b'[' | b'{' => empty_container_end(text, value).expect("an empty container"),
                    b'"' => string_end(text, value).0,
                    b't' | b'n' => value + 4,
                    b'f' => value + 5,
                    _ => number_end(text, value),
                },
                child => self.spans[child as usize].end as usize,
            };
            self.members.push(Member {
                key: key as u32,
                key_len: key_len as u32,
                key_in_scratch: escaped,
                order: order as u32,
                value: value as u32,
                span: child,
            });
            pos = self.next_item(end);
        }
        // jsonb's key order: shorter first, then bytewise; of equal keys
        // the last written wins (sorted first here, the rest dropped).
        let pairs = {
            let keys = self.keys.as_slice();
            let key_of = |m: &Member| -> &[u8] {
                let source = if m.key_in_scratch { keys } else { text };
                &source[m.key as usize..(m.key + m.key_len) as usize]
            };
            let members = &mut self.members.as_mut_slice()[base_member..];
            let items = &mut self.items;
            // An ERROR from the check unwinds out of the sort, which
            // leaves the palloc'd members in some order, freed with the
            // memory context.
            members.sort_unstable_by(|a, b| {
                count_item(items);
                a.key_len
                    .cmp(&b.key_len)
                    .then_with(|| key_of(a).cmp(key_of(b)))
                    .then_with(|| b.order.cmp(&a.order))
            });
            let mut kept = 0;
            for i in 0..members.len() {
                count_item(items);
                if kept == 0 || key_of(&members[i]) != key_of(&members[kept - 1]) {
                    members[kept] = members[i];
                    kept += 1;
                }
            }
            kept
        };
        self.members.truncate(base_member + pairs);
        let (base, jentries) = self.open(pairs as u32 | pg_sys::JB_FOBJECT, 2 * pairs);
        let mut total = 0;
        for i in 0..pairs {
            count_item(&mut self.items);
            let m = self.members.as_slice()[base_member + i];
            let before = self.out.len();
            if m.key_in_scratch {
                self.out.extend_from_slice(
                    &self.keys.as_slice()[m.key as usize..(m.key + m.key_len) as usize],
                );
            } else {
                self.out
                    .extend_from_slice(&text[m.key as usize..(m.key + m.key_len) as usize]);
            }
            let meta = pg_sys::JENTRY_ISSTRING | (self.out.len() - before) as u32;
            self.set_jentry(jentries, i, meta, &mut total, Kind::Object);
        }
        for i in 0..pairs {
            count_item(&mut self.items);
            // Copied out: writing a nested object grows `members`.
            let m = self.members.as_slice()[base_member + i];
            let (meta, _) = self.value(m.value as usize, m.span);
            self.set_jentry(jentries, pairs + i, meta, &mut total, Kind::Object);
        }
        self.members.truncate(base_member);
        self.keys.truncate(base_key);
        self.close(base, Kind::Object)
    }
}

/// convertJsonbArray's / convertJsonbObject's ERROR for a container whose
/// data passes what a JEntry can address.
fn too_big(kind: Kind) -> ! {
    let what = match kind {
        Kind::Array => "array",
        Kind::Object => "object",
    };
    ereport!(
        ERROR,
        ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("total size of jsonb {what} elements exceeds the maximum of {OFFLEN_MASK} bytes")
    );
}

/// `numeric_in(number)`: a palloc'd numeric varlena, or numeric_in's ERROR.
fn numeric_in(number: &[u8]) -> *mut pg_sys::varlena {
    // SAFETY: pnstrdup makes a palloc'd NUL-terminated copy (accounted,
    // where a CString of a 256 MiB number would not be); numeric_in takes
    // (cstring, oid, typmod) and returns a numeric datum or raises.
    unsafe {
        let cstring = pg_sys::pnstrdup(number.as_ptr().cast(), number.len());
        let numeric = pgrx::direct_function_call_as_datum(
            pg_sys::numeric_in,
            &[
                Some(pg_sys::Datum::from(cstring)),
                Some(pg_sys::Datum::from(pg_sys::InvalidOid)),
                Some(pg_sys::Datum::from(-1i32)),
            ],
        )
        .expect("numeric_in returns a value")
        .cast_mut_ptr::<pg_sys::varlena>();
        pg_sys::pfree(cstring.cast());
        numeric
    }
}

/// Appends the numeric `numeric_in` makes of `number` (a JSON number) and
/// returns its length; integers that fit an i64 go through
/// `int64_to_numeric`, which makes the same value without parsing text.
fn append_numeric(out: &mut PallocVec<u8>, number: &[u8]) -> u32 {
    let plain_integer = {
        let digits = number.strip_prefix(b"-").unwrap_or(number);
        !digits.is_empty()
            && digits.len() <= 19
            && digits.iter().all(u8::is_ascii_digit)
            && (digits == b"0" || digits[0] != b'0')
            && number != b"-0"
    };
    let as_i64 = plain_integer
        .then(|| std::str::from_utf8(number).ok()?.parse::<i64>().ok())
        .flatten();
    // SAFETY: both return a palloc'd numeric varlena (or raise an ERROR,
    // which pgrx unwinds through here); it is read for its VARSIZE bytes.
    unsafe {
        let numeric = match as_i64 {
            Some(n) => pg_sys::int64_to_numeric(n).cast::<pg_sys::varlena>(),
            None => numeric_in(number),
        };
        let len = pgrx::varsize_any(numeric);
        out.extend_from_slice(std::slice::from_raw_parts(numeric.cast::<u8>(), len));
        pg_sys::pfree(numeric.cast());
        len as u32
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::test_support::error_of;
    use loom_fixtures::agent_state;
    use pgrx::PgSqlErrorCode::*;

    fn bytes_of(jsonb: PallocJsonb) -> Vec<u8> {
        // SAFETY: a complete jsonb varlena, read for its VARSIZE bytes.
        unsafe {
            let len = pgrx::varsize_any(jsonb.0);
            std::slice::from_raw_parts(jsonb.0.cast::<u8>(), len).to_vec()
        }
    }

    fn to_jsonb(text: &str) -> PallocJsonb {
        super::to_jsonb(&PallocCString::from_str(text))
    }

    fn jsonb_in(text: &str) -> PallocJsonb {
        super::jsonb_in(&PallocCString::from_str(text))
    }

    fn declines(text: &str) -> bool {
        outline(text.as_bytes()).is_err()
    }

    /// Builds `text` (asserting the builder did, not jsonb_in) and checks
    /// the bytes are jsonb_in's.
    fn assert_built_as_jsonb_in(text: &str) {
        assert!(!declines(text), "declined: {text:.80}");
        assert_eq!(
            bytes_of(to_jsonb(text)),
            bytes_of(jsonb_in(text)),
            "{text:.200}"
        );
    }

    /// A deterministic pseudo-random JSON text: every kind of value,
    /// repeated and escaped keys, containers past a JEntry stride.
    fn random_json(seed: u64) -> String {
        struct Rng(u64);
        impl Rng {
            fn next(&mut self, n: u64) -> u64 {
                self.0 = self
                    .0
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (self.0 >> 33) % n
            }
        }
        fn value(rng: &mut Rng, depth: u32, out: &mut String) {
            const KEYS: [&str; 9] = [
                "a",
                "b",
                "ab",
                "aa",
                "",
                "caf\\u00e9",
                "x\\ny",
                "\\ud834\\udd1e",
                "a",
            ];
            const NUMBERS: [&str; 14] = [
                "0",
                "-0",
                "7",
                "-12",
                "10000",
                "123456789012345678",
                "9223372036854775807",
                "-9223372036854775808",
                "92233720368547758070",
                "1.50",
                "-2.5e3",
                "1E+2",
                "0.000001",
                "1e-7",
            ];
            const STRINGS: [&str; 6] = [
                "",
                "plain",
                "tab\\there",
                "\\\"quoted\\\"",
                "\\u00e9t\\u00e9 \\/ x",
                "\u{1f9f5} thread",
            ];
            let kind = if depth > 5 { rng.next(5) } else { rng.next(7) };
            match kind {
                0 => out.push_str("null"),
                1 => out.push_str(if rng.next(2) == 0 { "true" } else { "false" }),
                2 => out.push_str(NUMBERS[rng.next(NUMBERS.len() as u64) as usize]),
                3 | 4 => {
                    out.push('"');
                    out.push_str(STRINGS[rng.next(STRINGS.len() as u64) as usize]);
                    out.push('"');
                }
                5 => {
                    out.push('[');
                    let n = [0, 1, 3, 33, 70][rng.next(5) as usize];
                    for i in 0..n {
                        if i > 0 {
                            out.push_str(if rng.next(3) == 0 { " , " } else { "," });
                        }
                        value(rng, depth + 1, out);
                    }
                    out.push(']');
                }
                _ => {
                    out.push('{');
                    let n = [0, 1, 4, 40][rng.next(4) as usize];
                    for i in 0..n {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push('"');
                        out.push_str(KEYS[rng.next(KEYS.len() as u64) as usize]);
                        if rng.next(3) == 0 {
                            out.push_str(&i.to_string());
                        }
                        out.push_str("\" : ");
                        value(rng, depth + 1, out);
                    }
                    out.push('}');
                }
            }
        }
        let mut rng = Rng(seed);
        let mut out = String::new();
        value(&mut rng, 0, &mut out);
        out
    }

    #[pg_test]
    fn builds_the_bytes_jsonb_in_makes() {
        for (turns, claim_checked) in [(1, false), (3, true), (50, false), (50, true), (200, false)]
        {
            assert_built_as_jsonb_in(&agent_state(turns, claim_checked));
        }
        for text in [
            "5",
            "-0",
            "\"x\"",
            "null",
            "true",
            "false",
            "[]",
            "{}",
            " [ ] ",
            "[[[]]]",
            r#"{"k":1,"k":2,"kk":3,"":4,"k":{"a":[1,2]}}"#,
            r#"["\u00e9", "e\u0301", "\ud834\udd1e", "\/", "\b\f\n\r\t", "\"\\"]"#,
            r#"{"n":[0,-0,1.0,1.50,100,1e2,1E+2,-2.5e-3,12345678901234567890123,9223372036854775807,-9223372036854775808]}"#,
        ] {
            assert_built_as_jsonb_in(text);
        }
        let long = format!(
            r#"{{"s":"{}","t":[{}]}}"#,
            "agent ".repeat(20_000),
            "1,".repeat(999) + "1"
        );
        assert_built_as_jsonb_in(&long);
        for seed in 0..400 {
            assert_built_as_jsonb_in(&random_json(seed));
        }
    }

    fn repeated(open: &str, item: &str, n: usize, last: &str) -> String {
        let mut text = String::with_capacity(open.len() + item.len() * n + last.len());
        text.push_str(open);
        for _ in 0..n {
            text.push_str(item);
        }
        text.push_str(last);
        text
    }

    #[pg_test]
    fn counts_to_the_limits_jsonb_in_reaches() {
        // jsonb_in's arrays double from 4 within MaxAllocSize: the element
        // after 2^24 (2^23 pairs) asks for 1 GiB and is refused.
        assert_eq!(std::mem::size_of::<pg_sys::JsonbValue>(), 32);
        assert_eq!(std::mem::size_of::<pg_sys::JsonbPair>(), 72);
        assert_eq!(MAX_ELEMS, 1 << 24);
        assert_eq!(MAX_PAIRS, 1 << 23);
        let elems = |n: usize, last: &str| repeated("[", "0,", n, last);
        let pairs = |n: usize, last: &str| repeated("{", "\"a\":0,", n, last);
        assert!(outline(elems(MAX_ELEMS - 1, "0]").as_bytes()).is_ok());
        assert!(outline(pairs(MAX_PAIRS - 1, "\"a\":0}").as_bytes()).is_ok());
        let (code, message) = error_of(|| outline(elems(MAX_ELEMS, "0]").as_bytes()).is_ok());
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
        assert_eq!(
            message,
            "number of jsonb array elements exceeds the maximum allowed (16777216)"
        );
        let (code, message) = error_of(|| outline(pairs(MAX_PAIRS, "\"a\":0}").as_bytes()).is_ok());
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
        assert_eq!(
            message,
            "number of jsonb object pairs exceeds the maximum allowed (8388608)"
        );
        // Nested: an inner array counts in its parent when it closes, as
        // in jsonb_in, after its contents.
        let nested = repeated("[[", "0,", MAX_ELEMS, "0]]");
        let (code, _) = error_of(|| outline(nested.as_bytes()).is_ok());
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
    }

    #[pg_test]
    fn refuses_in_jsonb_ins_order() {
        // What jsonb_in meets first decides: a \u0000 before the limit goes
        // to jsonb_in (which refuses it there), and so does one in the
        // element past the limit (lexed before it is counted), or inside
        // it; one after that is never reached.
        assert!(declines(&repeated("[\"\\u0000\",", "0,", MAX_ELEMS, "0]")));
        assert!(declines(&repeated("[", "0,", MAX_ELEMS, "\"\\u0000\"]")));
        assert!(declines(&repeated("[", "0,", MAX_ELEMS, "[\"\\u0000\"]]")));
        let after = repeated("[", "0,", MAX_ELEMS + 1, "\"\\u0000\"]");
        let (code, _) = error_of(|| outline(after.as_bytes()).is_ok());
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
        // numeric_in's refusal before the limit is numeric_in's.
        let number_first = repeated("[1e999999999,", "0,", MAX_ELEMS, "0]");
        let (code, _) = error_of(|| outline(number_first.as_bytes()).is_ok());
        assert_eq!(code, ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE);
        for number in ["1e999999999", "-1E+999999", "1e-999999999"] {
            let text = format!("[{number}]");
            assert_eq!(
                error_of(|| to_jsonb(&text)),
                error_of(|| jsonb_in(&text)),
                "{number}"
            );
        }
        let long = format!("[{}]", "7".repeat(200_000));
        assert_eq!(error_of(|| to_jsonb(&long)), error_of(|| jsonb_in(&long)));
    }

    #[pg_test]
    fn refuses_an_array_over_jsonbs_size_as_jsonb_in_does() {
        let half = "x".repeat(OFFLEN_MASK as usize / 2 + 8);
        let text = format!("[\"{half}\",\"{half}\"]");
        drop(half);
        let (code, message) = error_of(|| to_jsonb(&text));
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
        assert_eq!(
            message,
            "total size of jsonb array elements exceeds the maximum of 268435455 bytes"
        );
        assert_eq!((code, message), error_of(|| jsonb_in(&text)));
    }

    #[pg_test]
    fn refuses_an_object_over_jsonbs_size_as_jsonb_in_does() {
        let half = "x".repeat(OFFLEN_MASK as usize / 2 + 8);
        let text = format!("{{\"a\":\"{half}\",\"b\":\"{half}\"}}");
        drop(half);
        let (code, message) = error_of(|| to_jsonb(&text));
        assert_eq!(code, ERRCODE_PROGRAM_LIMIT_EXCEEDED);
        assert_eq!(
            message,
            "total size of jsonb object elements exceeds the maximum of 268435455 bytes"
        );
        assert_eq!((code, message), error_of(|| jsonb_in(&text)));
    }

    #[pg_test]
    fn what_it_declines_jsonb_in_builds_or_refuses_as_ever() {
        // Deeper than MAX_DEPTH: built by jsonb_in, the same value.
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 5),
            "]".repeat(MAX_DEPTH + 5)
        );
        assert!(declines(&deep));
        assert_eq!(bytes_of(to_jsonb(&deep)), bytes_of(jsonb_in(&deep)));
        for declined in [
            r#"["\u0000"]"#,
            r#"["\ud800"]"#,
            r#"{"\udc00x":1}"#,
            r#"["\ud800\u0041"]"#,
        ] {
            assert!(declines(declined), "{declined}");
        }
    }
}
