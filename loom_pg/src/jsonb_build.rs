//! A frame's state as Postgres jsonb, built from loom's own parse of the
//! text that decode has just validated, straight into jsonb's binary
//! layout: no second lexer (`jsonb_in`), no tree of palloc'd `JsonbValue`s.
//! `jsonb_in` cost ~4 ms of a 600 KB state's ~6 ms read; this is the
//! difference between `loom_snapshot_state` and reading a JSONB column.
//!
//! The result is byte for byte what `text::jsonb` gives (the pg_tests
//! compare them on every test state): keys sorted by length then bytes, the
//! last of duplicate keys kept, numbers as `numeric_in` makes them, JEntries
//! with an offset every `JB_OFFSET_STRIDE`, containers and numerics padded
//! to 4 bytes. What jsonb_in would refuse or treat specially (`\u0000`, a
//! lone surrogate, nesting deeper than [`MAX_DEPTH`], a container over
//! jsonb's 256 MB limit) is not built here: the text goes to `jsonb_in`,
//! which gives the same result or its own error.

use std::borrow::Cow;
use std::ffi::CString;

use loom_core::json;
use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Deeper than this, `jsonb_in` (with its stack-depth check) builds it:
/// the builder recurses, and a backend's stack must not be the limit.
const MAX_DEPTH: usize = 200;

const OFFLEN_MASK: u32 = pg_sys::JENTRY_OFFLENMASK;
const TYPE_MASK: u32 = pg_sys::JENTRY_TYPEMASK;
const STRIDE: usize = pg_sys::JB_OFFSET_STRIDE as usize;

/// A parsed JSON value; strings borrow from the text unless they had
/// escapes.
enum Node<'a> {
    Null,
    True,
    False,
    Str(Cow<'a, [u8]>),
    Num(&'a str),
    Array(Vec<Node<'a>>),
    Object(Vec<(Cow<'a, [u8]>, Node<'a>)>),
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

/// `json` (one valid JSON text) as jsonb, exactly as `json::jsonb` would be.
pub(crate) fn to_jsonb(json: &str) -> PallocJsonb {
    match build(json.as_bytes()) {
        Ok(bytes) => {
            // SAFETY: palloc returns bytes.len() writable bytes (the codec's
            // 256 MiB ceiling keeps it under MaxAllocSize), filled whole.
            unsafe {
                let varlena = pg_sys::palloc(bytes.len()).cast::<u8>();
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), varlena, bytes.len());
                let varlena = varlena.cast::<pg_sys::varlena>();
                pgrx::set_varsize_4b(varlena, bytes.len() as i32);
                PallocJsonb(varlena)
            }
        }
        Err(Declined) => jsonb_in(json),
    }
}

/// Postgres's own `jsonb_in`, for what the builder declines.
fn jsonb_in(json: &str) -> PallocJsonb {
    // A JSON text has no NUL byte (not even inside a string, where control
    // characters must be escaped).
    let text = CString::new(json).expect("a JSON text holds no NUL byte");
    // SAFETY: jsonb_in takes one cstring and returns a jsonb datum (or
    // raises its own ERROR, which pgrx turns into a panic and back).
    let datum = unsafe {
        pgrx::direct_function_call_as_datum(
            pg_sys::jsonb_in,
            &[Some(pg_sys::Datum::from(text.as_ptr()))],
        )
    }
    .expect("jsonb_in returns a value");
    PallocJsonb(datum.cast_mut_ptr())
}

fn build(text: &[u8]) -> Result<Vec<u8>, Declined> {
    let root = Parser { text, pos: 0 }.value(0)?;
    let mut writer = Writer {
        // The varlena header, set by the caller; a jsonb is about as long
        // as its text.
        buf: Vec::with_capacity(text.len() + text.len() / 4 + 64),
    };
    writer.buf.extend_from_slice(&[0; 4]);
    match &root {
        Node::Array(items) => writer.array(items, false)?,
        Node::Object(members) => writer.object(members)?,
        // A scalar is stored as a one-element array marked scalar.
        scalar => writer.array(std::slice::from_ref(scalar), true)?,
    };
    Ok(writer.buf)
}

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn skip_whitespace(&mut self) {
        while matches!(self.text.get(self.pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// The byte at the position after whitespace, consumed.
    fn next_byte(&mut self) -> u8 {
        self.skip_whitespace();
        let byte = self.text[self.pos];
        self.pos += 1;
        byte
    }

    fn value(&mut self, depth: usize) -> Result<Node<'a>, Declined> {
        self.skip_whitespace();
        Ok(match self.text[self.pos] {
            b'{' => {
                if depth == MAX_DEPTH {
                    return Err(Declined);
                }
                self.pos += 1;
                let mut members = Vec::new();
                self.skip_whitespace();
                if self.text[self.pos] == b'}' {
                    self.pos += 1;
                    return Ok(Node::Object(members));
                }
                loop {
                    self.skip_whitespace();
                    let key = self.string()?;
                    // The ':'.
                    self.next_byte();
                    let value = self.value(depth + 1)?;
                    members.push((key, value));
                    if self.next_byte() == b'}' {
                        break Node::Object(members);
                    }
                }
            }
            b'[' => {
                if depth == MAX_DEPTH {
                    return Err(Declined);
                }
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_whitespace();
                if self.text[self.pos] == b']' {
                    self.pos += 1;
                    return Ok(Node::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.next_byte() == b']' {
                        break Node::Array(items);
                    }
                }
            }
            b'"' => Node::Str(self.string()?),
            b't' => {
                self.pos += 4;
                Node::True
            }
            b'f' => {
                self.pos += 5;
                Node::False
            }
            b'n' => {
                self.pos += 4;
                Node::Null
            }
            _ => {
                let start = self.pos;
                while matches!(
                    self.text.get(self.pos),
                    Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                ) {
                    self.pos += 1;
                }
                // SAFETY of the unwrap: the bytes are ASCII.
                Node::Num(std::str::from_utf8(&self.text[start..self.pos]).unwrap_or("0"))
            }
        })
    }

    /// The string whose opening quote is at the position, unescaped
    /// (`loom_core::json::unescape`, as `find_path` reads keys). Declines
    /// `\u0000` and lone surrogates, which jsonb_in refuses with its own
    /// errors.
    fn string(&mut self) -> Result<Cow<'a, [u8]>, Declined> {
        let start = self.pos + 1;
        let text = self.text;
        let mut end = start;
        let mut escaped = false;
        loop {
            end += memchr::memchr2(b'"', b'\\', &text[end..]).ok_or(Declined)?;
            if text[end] == b'"' {
                break;
            }
            escaped = true;
            end += 2;
        }
        self.pos = end + 1;
        let body = &text[start..end];
        if !escaped {
            return Ok(Cow::Borrowed(body));
        }
        // A valid body holds no raw control byte: a 0 came from \u0000.
        match json::unescape(body) {
            Some(bytes) if !bytes.contains(&0) => Ok(Cow::Owned(bytes)),
            _ => Err(Declined),
        }
    }
}

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// Zeros up to a 4-byte boundary of the whole varlena; how many.
    fn pad(&mut self) -> u32 {
        let pad = (4 - self.buf.len() % 4) % 4;
        self.buf.resize(self.buf.len() + pad, 0);
        pad as u32
    }

    /// Writes `node`'s data; returns its JEntry (type and length).
    fn value(&mut self, node: &Node<'_>) -> Result<u32, Declined> {
        match node {
            Node::Null => Ok(pg_sys::JENTRY_ISNULL),
            Node::True => Ok(pg_sys::JENTRY_ISBOOL_TRUE),
            Node::False => Ok(pg_sys::JENTRY_ISBOOL_FALSE),
            Node::Str(bytes) => self.string(bytes),
            Node::Num(number) => {
                let pad = self.pad();
                let len = append_numeric(&mut self.buf, number);
                Ok(pg_sys::JENTRY_ISNUMERIC | (pad + len))
            }
            Node::Array(items) => self.array(items, false),
            Node::Object(members) => self.object(members),
        }
    }

    fn string(&mut self, bytes: &[u8]) -> Result<u32, Declined> {
        let len = u32::try_from(bytes.len()).map_err(|_| Declined)?;
        if len > OFFLEN_MASK {
            return Err(Declined);
        }
        self.buf.extend_from_slice(bytes);
        Ok(pg_sys::JENTRY_ISSTRING | len)
    }

    /// The container header and a zeroed JEntry for each of `entries`;
    /// returns where the container began (before its padding) and where
    /// its JEntries are.
    fn open(&mut self, header: u32, entries: usize) -> (usize, usize) {
        let base = self.buf.len();
        self.pad();
        self.buf.extend_from_slice(&header.to_ne_bytes());
        let jentries = self.buf.len();
        self.buf.resize(jentries + 4 * entries, 0);
        (base, jentries)
    }

    /// Stores child `i`'s JEntry, its length added to `total`: every
    /// STRIDE-th holds the end offset instead of the length.
    fn set_jentry(
        &mut self,
        jentries: usize,
        i: usize,
        meta: u32,
        total: &mut u32,
    ) -> Result<(), Declined> {
        *total = total.checked_add(meta & OFFLEN_MASK).ok_or(Declined)?;
        if *total > OFFLEN_MASK {
            return Err(Declined);
        }
        let meta = if i % STRIDE == 0 {
            (meta & TYPE_MASK) | *total | pg_sys::JENTRY_HAS_OFF
        } else {
            meta
        };
        self.buf[jentries + 4 * i..jentries + 4 * i + 4].copy_from_slice(&meta.to_ne_bytes());
        Ok(())
    }

    fn close(&self, base: usize) -> Result<u32, Declined> {
        let len = u32::try_from(self.buf.len() - base).map_err(|_| Declined)?;
        if len > OFFLEN_MASK {
            return Err(Declined);
        }
        Ok(pg_sys::JENTRY_ISCONTAINER | len)
    }

    fn array(&mut self, items: &[Node<'_>], raw_scalar: bool) -> Result<u32, Declined> {
        let mut header = u32::try_from(items.len()).map_err(|_| Declined)? | pg_sys::JB_FARRAY;
        if raw_scalar {
            header |= pg_sys::JB_FSCALAR;
        }
        let (base, jentries) = self.open(header, items.len());
        let mut total = 0;
        for (i, item) in items.iter().enumerate() {
            let meta = self.value(item)?;
            self.set_jentry(jentries, i, meta, &mut total)?;
        }
        self.close(base)
    }

    fn object(&mut self, members: &[(Cow<'_, [u8]>, Node<'_>)]) -> Result<u32, Declined> {
        // jsonb's key order: shorter first, then bytewise; of equal keys
        // the last written wins (sorted first here, the rest dropped).
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_unstable_by(|&a, &b| {
            let (ka, kb) = (&members[a].0, &members[b].0);
            ka.len()
                .cmp(&kb.len())
                .then_with(|| ka.as_ref().cmp(kb.as_ref()))
                .then_with(|| b.cmp(&a))
        });
        order.dedup_by(|later, kept| members[*later].0 == members[*kept].0);
        let pairs = order.len();
        let header = u32::try_from(pairs).map_err(|_| Declined)? | pg_sys::JB_FOBJECT;
        let (base, jentries) = self.open(header, 2 * pairs);
        let mut total = 0;
        for (i, &m) in order.iter().enumerate() {
            let meta = self.string(&members[m].0)?;
            self.set_jentry(jentries, i, meta, &mut total)?;
        }
        for (i, &m) in order.iter().enumerate() {
            let meta = self.value(&members[m].1)?;
            self.set_jentry(jentries, pairs + i, meta, &mut total)?;
        }
        self.close(base)
    }
}

/// Appends the numeric `numeric_in` makes of `number` (a JSON number) and
/// returns its length; integers that fit an i64 go through
/// `int64_to_numeric`, which makes the same value without parsing text.
fn append_numeric(buf: &mut Vec<u8>, number: &str) -> u32 {
    let plain_integer = {
        let digits = number.strip_prefix('-').unwrap_or(number);
        !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && number != "-0"
    };
    // SAFETY: both return a palloc'd numeric varlena (or raise an ERROR,
    // which pgrx unwinds through here); it is read for its VARSIZE bytes.
    unsafe {
        let numeric = match number.parse::<i64>() {
            Ok(n) if plain_integer => pg_sys::int64_to_numeric(n).cast::<pg_sys::varlena>(),
            _ => {
                let text = CString::new(number).expect("a JSON number has no NUL byte");
                pgrx::direct_function_call_as_datum(
                    pg_sys::numeric_in,
                    &[
                        Some(pg_sys::Datum::from(text.as_ptr())),
                        Some(pg_sys::Datum::from(pg_sys::InvalidOid)),
                        Some(pg_sys::Datum::from(-1i32)),
                    ],
                )
                .expect("numeric_in returns a value")
                .cast_mut_ptr::<pg_sys::varlena>()
            }
        };
        let len = pgrx::varsize_any(numeric);
        buf.extend_from_slice(std::slice::from_raw_parts(numeric.cast::<u8>(), len));
        pg_sys::pfree(numeric.cast());
        len as u32
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use loom_core::synthetic::agent_state;

    fn bytes_of(jsonb: PallocJsonb) -> Vec<u8> {
        // SAFETY: a complete jsonb varlena, read for its VARSIZE bytes.
        unsafe {
            let len = pgrx::varsize_any(jsonb.0);
            std::slice::from_raw_parts(jsonb.0.cast::<u8>(), len).to_vec()
        }
    }

    /// Builds `text` (asserting the builder did, not jsonb_in) and checks
    /// the bytes are jsonb_in's.
    fn assert_built_as_jsonb_in(text: &str) {
        assert!(build(text.as_bytes()).is_ok(), "declined: {text:.80}");
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

    #[pg_test]
    fn what_it_declines_jsonb_in_builds_or_refuses_as_ever() {
        // Deeper than MAX_DEPTH: built by jsonb_in, the same value.
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 5),
            "]".repeat(MAX_DEPTH + 5)
        );
        assert!(build(deep.as_bytes()).is_err());
        assert_eq!(bytes_of(to_jsonb(&deep)), bytes_of(jsonb_in(&deep)));
        for declined in [
            r#"["\u0000"]"#,
            r#"["\ud800"]"#,
            r#"{"\udc00x":1}"#,
            r#"["\ud800\u0041"]"#,
        ] {
            assert!(build(declined.as_bytes()).is_err(), "{declined}");
        }
    }
}
