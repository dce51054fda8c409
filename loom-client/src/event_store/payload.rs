//! An event's data as exact JSON text.
//!
//! A payload is what a runtime, `psql` or another service wrote: any JSON
//! PostgreSQL's jsonb holds must come back, whole and exact, or an
//! execution could never be read or resumed from Rust. `serde_json::Value`
//! cannot promise that: it refuses nesting deeper than 128 levels (jsonb
//! nests as deep as the server's `max_stack_depth` allows), turns
//! `12345678901234567890123` and `0.1000000000000000000000000000001` into
//! the nearest f64, and refuses `1e400`; its drop, clone and comparison
//! recurse, so a deep enough value overflows the stack. So a payload is
//! kept as validated text, a [`crate::snapshot_store::JsonText`] as
//! snapshot states are, and only parsed when the caller asks for a typed
//! value ([`Payload::parse`]), with the caller's limits. It is its own
//! type for one reason, its equality: two payloads are equal when they are
//! the same JSON value (a store may give back jsonb's text of what was
//! appended), two states when they are the same text.

use std::fmt;

use pgloom_core::json::InvalidJsonError;

use crate::snapshot_store::JsonText;

/// An event's data: one JSON text, kept as given (memory, SQLite) or as
/// PostgreSQL's jsonb prints it (keys in jsonb's order, `1e400` as its
/// 401 digits): never rounded, never refused for its depth.
///
/// Two payloads are equal when they are the same JSON value, as jsonb
/// compares them: objects by their members whatever their order (a
/// repeated key: its last value), numbers by exact decimal value (`1e2`
/// is `100`, `1.0` is `1`), strings by their characters however escaped.
/// So an event read back from any store equals the event appended.
/// [`Payload::as_str`] is the exact text.
///
/// ```
/// use pgloom::event_store::{Event, Payload};
///
/// // From a serde_json value, as most callers build events...
/// let event = Event::new("exec-1", 1, "started", serde_json::json!({"n": 1}));
/// assert_eq!(event.payload, serde_json::json!({"n": 1}));
/// // ...or from text, which keeps what no f64 and no 128-level parser can.
/// let exact = Payload::new(r#"{"big": 12345678901234567890123, "deep": [[[[1]]]]}"#)?;
/// assert_eq!(exact, Payload::new(r#"{"deep":[[[[1]]]],"big":12345678901234567890123}"#)?);
/// assert_ne!(exact, Payload::new(r#"{"big": 12345678901234567890124, "deep": [[[[1]]]]}"#)?);
/// assert_eq!(Payload::new("1e400")?, Payload::new(format!("1{}", "0".repeat(400)))?);
/// // A typed value, with serde_json's own limits (an error, never a panic).
/// let n: u64 = Event::new("exec-1", 2, "step", serde_json::json!(7)).payload.parse()?;
/// assert_eq!(n, 7);
/// assert!(exact.to_value().is_ok());
/// assert!(Payload::new("1e400")?.to_value().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Payload(JsonText);

impl Payload {
    /// Checks `text` is one JSON text (iteratively: any depth).
    ///
    /// # Errors
    ///
    /// [`InvalidJsonError`] with where it stops being JSON.
    pub fn new(text: impl Into<String>) -> Result<Self, InvalidJsonError> {
        JsonText::new(text.into()).map(Payload)
    }

    /// The JSON text of a value `serde` serializes: a typed payload, no
    /// `serde_json::Value` in between.
    ///
    /// ```
    /// #[derive(serde::Serialize)]
    /// struct ToolCall<'a> { tool: &'a str, ok: bool }
    /// let payload = pgloom::event_store::Payload::from_serialize(&ToolCall { tool: "search", ok: true })?;
    /// assert_eq!(payload.as_str(), r#"{"tool":"search","ok":true}"#);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What `serde_json` fails with (a map whose keys are not strings, a
    /// `Serialize` impl that fails).
    pub fn from_serialize<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        JsonText::from_serialize(value).map(Payload)
    }

    /// Text PostgreSQL printed from a jsonb value: JSON by construction.
    #[cfg(feature = "postgres")]
    pub(crate) fn printed_by_server(text: String) -> Self {
        Payload(JsonText::printed_by_server(text))
    }

    /// The JSON text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The JSON text, owned.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0.into_string()
    }

    /// Deserializes the payload into `T`, with serde_json's limits (128
    /// levels, numbers that fit `T`).
    ///
    /// # Errors
    ///
    /// When the text does not fit `T` or those limits.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        self.0.parse()
    }

    /// The payload as a `serde_json::Value`.
    ///
    /// # Errors
    ///
    /// When a `Value` cannot hold it: nested deeper than 128, or a number
    /// outside f64 (`1e400`). A number inside f64's range with more digits
    /// than f64 keeps is rounded, as `serde_json` always does: keep the
    /// payload where that matters.
    pub fn to_value(&self) -> serde_json::Result<serde_json::Value> {
        self.parse()
    }

    /// What in this payload PostgreSQL's jsonb cannot hold, if anything: a
    /// string holding U+0000 (`\u0000`) or an escaped lone surrogate.
    /// Every first-party store refuses such a payload the same way
    /// ([`crate::Error::UnsupportedPayload`]), so an execution written to
    /// one backend can move to any other.
    #[must_use]
    pub fn unsupported(&self) -> Option<&'static str> {
        unsupported_escape(self.as_str())
    }

    /// Whether this is JSON `null`: its text, which is valid JSON, is
    /// `null` between JSON whitespace. Read off the text, without parsing
    /// it as a comparison with `Value::Null` would.
    pub(crate) fn is_null(&self) -> bool {
        self.as_str().trim_matches([' ', '\t', '\n', '\r']) == "null"
    }
}

/// Whether two JSON texts are the same value: the same text, or the same
/// canonical text. (Text that did not parse, which a `Payload` never
/// holds, is equal only to itself.)
fn same_json(a: &str, b: &str) -> bool {
    a == b || matches!((canonical(a), canonical(b)), (Some(a), Some(b)) if a == b)
}

#[cfg(feature = "serde")]
impl serde::Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        JsonText::deserialize(deserializer).map(Payload)
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        same_json(self.as_str(), other.as_str())
    }
}

impl Eq for Payload {}

/// The same JSON value (see [`Payload`]'s equality).
impl PartialEq<serde_json::Value> for Payload {
    fn eq(&self, other: &serde_json::Value) -> bool {
        same_json(self.as_str(), &other.to_string())
    }
}

impl From<serde_json::Value> for Payload {
    fn from(value: serde_json::Value) -> Self {
        Payload::from(&value)
    }
}

impl From<&serde_json::Value> for Payload {
    fn from(value: &serde_json::Value) -> Self {
        // serde_json prints only JSON.
        Payload(JsonText::proven(value.to_string()))
    }
}

/// A snapshot state's text is JSON already.
impl From<JsonText> for Payload {
    fn from(text: JsonText) -> Self {
        Payload(text)
    }
}

/// Validated text is JSON already.
impl From<pgloom_core::json::JsonString> for Payload {
    fn from(text: pgloom_core::json::JsonString) -> Self {
        Payload(JsonText::from(text))
    }
}

impl AsRef<str> for Payload {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.debug_as("Payload", f)
    }
}

/// `\u0000` or an escaped lone surrogate in JSON text, found from its
/// backslashes alone: in JSON text a backslash only ever starts an escape
/// inside a string.
fn unsupported_escape(text: &str) -> Option<&'static str> {
    let bytes = text.as_bytes();
    let unit = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u16::from_str_radix(hex, 16).ok())
    };
    let mut from = 0;
    while let Some(found) = text.get(from..).and_then(|rest| rest.find('\\')) {
        let at = from + found;
        if bytes.get(at + 1) != Some(&b'u') {
            from = at + 2;
            continue;
        }
        let Some(code) = unit(at + 2) else {
            from = at + 2;
            continue;
        };
        from = at + 6;
        match code {
            0 => return Some("a string with U+0000 (\\u0000)"),
            0xD800..=0xDBFF => {
                let low = (bytes.get(at + 6..at + 8) == Some(b"\\u"))
                    .then(|| unit(at + 8))
                    .flatten();
                match low {
                    Some(0xDC00..=0xDFFF) => from = at + 12,
                    _ => return Some("a string with an escaped lone surrogate"),
                }
            }
            0xDC00..=0xDFFF => return Some("a string with an escaped lone surrogate"),
            _ => {}
        }
    }
    None
}

/// A value parsed into an arena: no recursion, whatever the depth.
enum Node {
    /// A string, number or literal, in canonical text.
    Scalar(String),
    Array(Vec<usize>),
    /// Members as (canonical key text, value node).
    Object(Vec<(String, usize)>),
}

/// One canonical text per JSON value: no whitespace, strings with one
/// escaping, numbers as `[-]digits e exponent` without surplus zeros,
/// object members sorted by key with a repeated key's last value.
/// Iterative (heap stack). `None` for text that is not JSON.
fn canonical(text: &str) -> Option<String> {
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    let mut nodes: Vec<Node> = Vec::new();
    // Open containers: the node, and (objects) the key of the value next.
    let mut open: Vec<(usize, Option<String>)> = Vec::new();
    let root = loop {
        parser.skip_whitespace();
        let node = match parser.peek()? {
            b'[' | b'{' => {
                let object = parser.peek()? == b'{';
                parser.at += 1;
                parser.skip_whitespace();
                let close = if object { b'}' } else { b']' };
                nodes.push(if object {
                    Node::Object(Vec::new())
                } else {
                    Node::Array(Vec::new())
                });
                let id = nodes.len() - 1;
                if parser.peek()? == close {
                    parser.at += 1;
                    id
                } else {
                    let key = if object { Some(parser.key()?) } else { None };
                    open.push((id, key));
                    continue;
                }
            }
            _ => {
                nodes.push(Node::Scalar(parser.scalar()?));
                nodes.len() - 1
            }
        };
        // Attach the finished value, closing every container it finishes.
        let mut done = node;
        while let Some((parent, key)) = open.last_mut() {
            match (&mut nodes[*parent], key.take()) {
                (Node::Array(items), None) => items.push(done),
                (Node::Object(members), Some(key)) => members.push((key, done)),
                _ => return None,
            }
            parser.skip_whitespace();
            match parser.peek()? {
                b',' => {
                    parser.at += 1;
                    if matches!(nodes[*parent], Node::Object(_)) {
                        parser.skip_whitespace();
                        *key = Some(parser.key()?);
                    }
                    break;
                }
                b']' | b'}' => {
                    parser.at += 1;
                    done = *parent;
                    open.pop();
                    if let Node::Object(members) = &mut nodes[done] {
                        // Stable: of a repeated key, the last stays last.
                        members.sort_by(|a, b| a.0.cmp(&b.0));
                        let mut kept: Vec<(String, usize)> = Vec::with_capacity(members.len());
                        for member in members.drain(..) {
                            match kept.last_mut() {
                                Some(last) if last.0 == member.0 => *last = member,
                                _ => kept.push(member),
                            }
                        }
                        *members = kept;
                    }
                }
                _ => return None,
            }
        }
        if open.is_empty() {
            break done;
        }
    };
    parser.skip_whitespace();
    if parser.at != parser.bytes.len() {
        return None;
    }
    // Print, depth first, with a heap stack of (node, next child).
    let mut out = String::with_capacity(text.len());
    let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
    while let Some((node, child)) = stack.pop() {
        match &nodes[node] {
            Node::Scalar(text) => out.push_str(text),
            Node::Array(items) => {
                out.push(if child == 0 { '[' } else { ',' });
                match items.get(child) {
                    Some(&item) => {
                        stack.push((node, child + 1));
                        stack.push((item, 0));
                    }
                    None => {
                        if items.is_empty() {
                            out.push(']');
                        } else {
                            out.pop();
                            out.push(']');
                        }
                    }
                }
            }
            Node::Object(members) => {
                out.push(if child == 0 { '{' } else { ',' });
                match members.get(child) {
                    Some((key, value)) => {
                        out.push_str(key);
                        out.push(':');
                        stack.push((node, child + 1));
                        stack.push((*value, 0));
                    }
                    None => {
                        if members.is_empty() {
                            out.push('}');
                        } else {
                            out.pop();
                            out.push('}');
                        }
                    }
                }
            }
        }
    }
    Some(out)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// An object key and its `:`.
    fn key(&mut self) -> Option<String> {
        if self.peek()? != b'"' {
            return None;
        }
        let key = self.string()?;
        self.skip_whitespace();
        (self.peek()? == b':').then(|| self.at += 1)?;
        Some(key)
    }

    fn scalar(&mut self) -> Option<String> {
        match self.peek()? {
            b'"' => self.string(),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            _ => self.number(),
        }
    }

    fn literal(&mut self, word: &str) -> Option<String> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word.as_bytes()).then(|| self.at = end)?;
        Some(word.to_owned())
    }

    /// A string in canonical text: `"` and `\` escaped, control characters
    /// as `\u00xx`, a lone surrogate as `\udxxx`, everything else as itself.
    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let mut out = String::from('"');
        let mut pending_high: Option<u16> = None;
        loop {
            let start = self.at;
            while !matches!(self.peek()?, b'"' | b'\\') {
                self.at += 1;
            }
            if self.at > start {
                flush_high(&mut out, &mut pending_high);
                for c in self.text.get(start..self.at)?.chars() {
                    push_char(&mut out, c);
                }
            }
            if self.peek()? == b'"' {
                self.at += 1;
                flush_high(&mut out, &mut pending_high);
                out.push('"');
                return Some(out);
            }
            let escape = *self.bytes.get(self.at + 1)?;
            self.at += 2;
            let c = match escape {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let hex = std::str::from_utf8(self.bytes.get(self.at..self.at + 4)?).ok()?;
                    let unit = u16::from_str_radix(hex, 16).ok()?;
                    self.at += 4;
                    match unit {
                        0xD800..=0xDBFF => {
                            flush_high(&mut out, &mut pending_high);
                            pending_high = Some(unit);
                            continue;
                        }
                        0xDC00..=0xDFFF => match pending_high.take() {
                            Some(high) => char::from_u32(
                                0x10000
                                    + ((u32::from(high) - 0xD800) << 10)
                                    + (u32::from(unit) - 0xDC00),
                            )?,
                            None => {
                                out.push_str(&format!("\\u{unit:04x}"));
                                continue;
                            }
                        },
                        _ => char::from_u32(u32::from(unit))?,
                    }
                }
                _ => return None,
            };
            flush_high(&mut out, &mut pending_high);
            push_char(&mut out, c);
        }
    }

    /// A number in canonical text: its exact decimal value.
    fn number(&mut self) -> Option<String> {
        let negative = self.peek()? == b'-';
        if negative {
            self.at += 1;
        }
        let digits_from = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        let int = self.text.get(digits_from..self.at)?;
        let mut frac = "";
        if self.peek() == Some(b'.') {
            self.at += 1;
            let from = self.at;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.at += 1;
            }
            frac = self.text.get(from..self.at)?;
        }
        let mut exponent: i128 = 0;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            let sign = match self.peek()? {
                b'-' => {
                    self.at += 1;
                    -1
                }
                b'+' => {
                    self.at += 1;
                    1
                }
                _ => 1,
            };
            let from = self.at;
            while let Some(digit) = self.peek().filter(u8::is_ascii_digit) {
                // Saturates far beyond any number a store can hold.
                exponent = (exponent * 10 + i128::from(digit - b'0')).min(i128::from(i64::MAX));
                self.at += 1;
            }
            if self.at == from {
                return None;
            }
            exponent *= sign;
        }
        if int.is_empty() {
            return None;
        }
        let all = format!("{int}{frac}");
        let significant = all.trim_start_matches('0');
        if significant.is_empty() {
            return Some("0".to_owned());
        }
        let trimmed = significant.trim_end_matches('0');
        let scale = exponent - frac.len() as i128 + (significant.len() - trimmed.len()) as i128;
        Some(format!(
            "{}{trimmed}e{scale}",
            if negative { "-" } else { "" }
        ))
    }
}

fn flush_high(out: &mut String, pending_high: &mut Option<u16>) {
    if let Some(high) = pending_high.take() {
        out.push_str(&format!("\\u{high:04x}"));
    }
}

fn push_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_read_off_the_text() {
        for null in ["null", " null\n", "\t\r null "] {
            assert!(Payload::new(null).unwrap().is_null(), "{null:?}");
        }
        for other in ["{}", "[null]", "\"null\"", "0", "false"] {
            assert!(!Payload::new(other).unwrap().is_null(), "{other:?}");
        }
    }

    fn p(text: &str) -> Payload {
        Payload::new(text).unwrap()
    }

    #[test]
    fn equality_is_jsonb_value_equality() {
        for (a, b) in [
            (
                r#"{"a":1,"b":[true,null]}"#,
                r#"{ "b" : [ true , null ] , "a" : 1 }"#,
            ),
            (r#"{"a":1,"a":2}"#, r#"{"a":2}"#),
            ("1e400", &format!("1{}", "0".repeat(400))),
            ("1.0", "1"),
            ("-0", "0"),
            ("0.00", "0e5"),
            ("1E+2", "100"),
            ("12.5e-1", "1.25"),
            (r#""\u00e9\/\n""#, "\"\u{e9}/\\n\""),
            (r#""\ud834\udd1e""#, "\"\u{1d11e}\""),
            (r#""\uD800""#, r#""\ud800""#),
            ("[]", "[ ]"),
            ("{}", "{ }"),
        ] {
            assert_eq!(p(a), p(b), "{a} vs {b}");
        }
        for (a, b) in [
            ("12345678901234567890123", "12345678901234567890124"),
            (
                "0.1000000000000000000000000000001",
                "0.1000000000000000000000000000002",
            ),
            ("0.1000000000000000000000000000001", "0.1"),
            ("-1", "1"),
            (r#"{"a":1}"#, r#"{"a":1,"b":1}"#),
            ("[1,2]", "[2,1]"),
            (r#""\\u0041""#, r#""A""#),
            (r#"["a"]"#, r#""a""#),
            (r#""\ud800""#, r#""\udc00""#),
        ] {
            assert_ne!(p(a), p(b), "{a} vs {b}");
        }
    }

    #[test]
    fn deep_payloads_compare_and_drop_without_recursion() {
        let depth = 200_000;
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let spaced = format!("{}1{}", "[ ".repeat(depth), " ]".repeat(depth));
        let objects = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        assert_eq!(p(&deep), p(&spaced));
        assert_ne!(p(&deep), p(&objects));
        assert!(p(&deep).to_value().is_err());
        assert!(format!("{:?}", p(&deep)).len() < 200);
    }

    #[test]
    fn what_jsonb_cannot_hold_is_named() {
        for text in [
            r#""\u0000""#,
            r#"{"a":["x\u0000"]}"#,
            r#""\ud800""#,
            r#""\udc00x""#,
            r#""\ud800\u0041""#,
        ] {
            assert!(p(text).unsupported().is_some(), "{text}");
        }
        for text in [r#""\\u0000""#, r#""\ud834\udd1e""#, r#""\u0001""#, "0"] {
            assert_eq!(p(text).unsupported(), None, "{text}");
        }
    }

    #[test]
    fn values_convert_and_compare() {
        let value = serde_json::json!({"n": 1, "s": "é\u{0}"});
        let payload = Payload::from(&value);
        assert_eq!(payload, value);
        assert_eq!(payload.to_value().unwrap(), value);
        assert!(payload.unsupported().is_some());
    }
}
