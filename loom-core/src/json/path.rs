//! One value out of a JSON text by path, without building the rest: what
//! `jsonb #> path` returns, for a text that was never made jsonb. A psql
//! user asking for `turns, 0` of a 600 KB state needs the keys of the top
//! object and the first element of one array, not a jsonb of everything.
//!
//! Linear in the text, whatever the path (issue 25). Walking a step means
//! stepping over the members of one container: all of them in an object
//! (of duplicate keys the last counts) and for a negative index. Stepping
//! over a member by scanning it made each step cost the rest of the text,
//! and a path as deep as the text quadratic: a 36-byte zstd frame of
//! `{"a":{"a":…}}` 20,000 deep took 1.6 s, 160,000 deep minutes. So one
//! pass first outlines where each container that the walk may step over
//! ends ([`Outline`]), and the walk steps over any of them in O(1).

use super::{unescape_with, JsonString};
use crate::interrupt::{Ticker, CHECK_INTERVAL};

/// The exact text of the value at `path` in `json`, or `None` where there
/// is none, with `jsonb #> path`'s rules: in an object, a step is a key
/// (compared after unescaping; of duplicate keys the last counts, as
/// jsonb keeps it); in an array, a step is an index, negative from the end;
/// a scalar has nothing under it. An empty path is the whole value.
///
/// Time is linear in the text and the path; memory is the outline, 8
/// bytes per non-empty container no deeper than the path is long: twice
/// the text for `[[0],[0],…]`, four times for `[[[…]]]` and a path as
/// deep, a few KB for an agent's state.
///
/// ```
/// use pgloom_core::json::{find_path, JsonString};
/// let state = JsonString::new(r#"{"turns":[{"tool":"search"},{"tool":"read"}],"turns":[7]}"#.to_owned())?;
/// assert_eq!(find_path(&state, &["turns", "0"]), Some("7"));
/// assert_eq!(find_path(&state, &["turns", "-1"]), Some("7"));
/// assert_eq!(find_path(&state, &["turns", "1"]), None);
/// assert_eq!(find_path(&state, &["nope"]), None);
/// # Ok::<(), pgloom_core::json::InvalidJsonError>(())
/// ```
#[must_use]
pub fn find_path<'a>(json: &'a JsonString, path: &[&str]) -> Option<&'a str> {
    let text = json.as_str();
    let bytes = text.as_bytes();
    let start = skip_whitespace(bytes, 0);
    if path.is_empty() {
        // Only whitespace follows the value of a valid text.
        return Some(text[start..].trim_end_matches([' ', '\t', '\n', '\r']));
    }
    if !matches!(bytes[start], b'[' | b'{') {
        return None;
    }
    // Offsets of 4 bytes halve the outline of any text loom stores
    // (at most 256 MiB); a larger text (a client's own) gets 8.
    if u32::try_from(bytes.len()).is_ok() {
        Walk::<u32>::new(bytes, path.len()).find(text, start, path)
    } else {
        Walk::<usize>::new(bytes, path.len()).find(text, start, path)
    }
}

/// A byte offset or span index, stored as `u32` where the text allows.
trait Offset: Copy {
    fn new(n: usize) -> Self;
    fn get(self) -> usize;
}

impl Offset for u32 {
    fn new(n: usize) -> Self {
        // Only made for texts shorter than 4 GiB, whose offsets and span
        // counts fit.
        n as u32
    }

    fn get(self) -> usize {
        self as usize
    }
}

impl Offset for usize {
    fn new(n: usize) -> Self {
        n
    }

    fn get(self) -> usize {
        self
    }
}

/// A non-empty container that the walk may step over: where its closing
/// bracket is, and the index of the first span after its subtree.
#[derive(Clone, Copy)]
struct Span<O> {
    end: O,
    next: O,
}

/// The spans of the non-empty containers at most `max_depth` deep (the
/// whole value is 0 deep), in the order they open. A walk of `n` steps
/// only ever stands at values at most `n` deep, so deeper containers are
/// only counted: `[[[…]]]` a million deep costs a path of 3 steps 3 spans.
/// Empty containers get none: stepping over `[]` takes no outline.
struct Outline<O> {
    spans: Vec<Span<O>>,
}

impl<O: Offset> Outline<O> {
    /// One pass over `bytes` (a valid JSON text), strings skipped a word at
    /// a time.
    fn new(bytes: &[u8], max_depth: usize, ticker: &mut Ticker) -> Self {
        let mut spans: Vec<Span<O>> = Vec::new();
        // The innermost open container with a span. While a container is
        // open, its span's `next` holds the index of its parent's: the
        // spans double as the stack, so deep nesting costs nothing more.
        let mut innermost = 0usize;
        // Open non-empty containers, spans or not.
        let mut depth = 0usize;
        let mut pos = 0;
        while pos < bytes.len() {
            ticker.at(pos);
            match bytes[pos] {
                b'"' => {
                    pos = skip_string(bytes, pos, ticker);
                    continue;
                }
                b'[' | b'{' => {
                    if let Some(end) = empty_container_end(bytes, pos) {
                        pos = end;
                        continue;
                    }
                    if depth <= max_depth {
                        spans.push(Span {
                            end: O::new(0),
                            next: O::new(innermost),
                        });
                        innermost = spans.len() - 1;
                    }
                    depth += 1;
                }
                b']' | b'}' => {
                    depth -= 1;
                    if depth <= max_depth {
                        let open = innermost;
                        innermost = spans[open].next.get();
                        spans[open] = Span {
                            end: O::new(pos),
                            next: O::new(spans.len()),
                        };
                    }
                }
                _ => {}
            }
            pos += 1;
        }
        Outline { spans }
    }
}

/// A value the walk stands at: where it starts, and the index of the first
/// span at or after that position (the value's own, if it has one).
#[derive(Clone, Copy)]
struct At {
    pos: usize,
    span: usize,
}

struct Walk<'a, O> {
    bytes: &'a [u8],
    outline: Outline<O>,
    ticker: Ticker,
}

impl<'a, O: Offset> Walk<'a, O> {
    fn new(bytes: &'a [u8], steps: usize) -> Self {
        let mut ticker = Ticker::starting_at(0);
        let outline = Outline::new(bytes, steps, &mut ticker);
        Walk {
            bytes,
            outline,
            ticker,
        }
    }

    /// The value at `path` from the container at `start`.
    fn find(mut self, text: &'a str, start: usize, path: &[&str]) -> Option<&'a str> {
        let mut at = At {
            pos: start,
            span: 0,
        };
        for step in path {
            at = match self.bytes[at.pos] {
                b'{' => self.member(at, step)?,
                b'[' => self.element(at, step)?,
                _ => return None,
            };
        }
        // Every boundary found is an ASCII byte of a valid text: a char
        // boundary.
        Some(&text[at.pos..self.after(at).pos])
    }

    /// The first member of the container at `at`, or `None` if it is
    /// empty.
    fn first(&self, at: At) -> Option<At> {
        let pos = skip_whitespace(self.bytes, at.pos + 1);
        if matches!(self.bytes[pos], b']' | b'}') {
            return None;
        }
        Some(At {
            pos,
            span: at.span + 1,
        })
    }

    /// Just past the value at `at`, and the first span after it: O(1) for
    /// a container, the token's length for a scalar.
    fn after(&mut self, at: At) -> At {
        let bytes = self.bytes;
        let pos = match bytes[at.pos] {
            b'"' => skip_string(bytes, at.pos, &mut self.ticker),
            b'[' | b'{' => match empty_container_end(bytes, at.pos) {
                Some(end) => end,
                None => {
                    let span = self.outline.spans[at.span];
                    return At {
                        pos: span.end.get() + 1,
                        span: span.next.get(),
                    };
                }
            },
            // A number or a literal runs to the next delimiter.
            _ => {
                let mut i = at.pos;
                while i < bytes.len()
                    && !matches!(bytes[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    i += 1;
                    self.ticker.at(i);
                }
                i
            }
        };
        At { pos, span: at.span }
    }

    /// The member after the one at `at`, or `None` if it was the last.
    fn next(&mut self, at: At) -> Option<At> {
        let after = self.after(at);
        let pos = skip_whitespace(self.bytes, after.pos);
        self.ticker.at(pos);
        if matches!(self.bytes[pos], b']' | b'}') {
            return None;
        }
        // Past the ','.
        Some(At {
            pos: skip_whitespace(self.bytes, pos + 1),
            span: after.span,
        })
    }

    /// The value of the last member named `key` in the object at `at`.
    fn member(&mut self, at: At, key: &str) -> Option<At> {
        let mut found = None;
        let mut member = self.first(at)?;
        loop {
            let key_end = skip_string(self.bytes, member.pos, &mut self.ticker);
            let matches = key_equals(&self.bytes[member.pos + 1..key_end - 1], key);
            // Past the ':'.
            let value = At {
                pos: skip_whitespace(self.bytes, skip_whitespace(self.bytes, key_end) + 1),
                span: member.span,
            };
            if matches {
                found = Some(value);
            }
            match self.next(value) {
                Some(next) => member = next,
                None => return found,
            }
        }
    }

    /// Element `step` of the array at `at`; `step` is an integer, negative
    /// counting from the end, as jsonb reads it ([`array_index`]). A
    /// negative index counts the elements first, then walks to the one it
    /// names: no list of where each starts.
    fn element(&mut self, at: At, step: &str) -> Option<At> {
        let index = array_index(step)?;
        let first = self.first(at)?;
        let wanted = if index >= 0 {
            u64::try_from(index).ok()?
        } else {
            let mut len = 1u64;
            let mut element = first;
            while let Some(next) = self.next(element) {
                len += 1;
                element = next;
            }
            len.checked_sub(index.unsigned_abs())?
        };
        let mut element = first;
        for _ in 0..wanted {
            element = self.next(element)?;
        }
        Some(element)
    }
}

fn skip_whitespace(bytes: &[u8], mut pos: usize) -> usize {
    while matches!(bytes.get(pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        pos += 1;
    }
    pos
}

/// If `bytes[pos]` opens an empty container, the position past it.
fn empty_container_end(bytes: &[u8], pos: usize) -> Option<usize> {
    let inner = skip_whitespace(bytes, pos + 1);
    matches!(bytes[inner], b']' | b'}').then_some(inner + 1)
}

/// The position after the string whose opening quote is at `pos`, found
/// [`CHECK_INTERVAL`] bytes a search at most.
fn skip_string(bytes: &[u8], pos: usize, ticker: &mut Ticker) -> usize {
    let mut i = pos + 1;
    loop {
        let window = &bytes[i..bytes.len().min(i + CHECK_INTERVAL)];
        assert!(!window.is_empty(), "a valid text's string ends");
        match memchr::memchr2(b'"', b'\\', window) {
            Some(at) if window[at] == b'"' => return i + at + 1,
            Some(at) => i += at + 2,
            None => i += window.len(),
        }
        ticker.at(i);
    }
}

/// A path step as an array index, read as `jsonb #>` reads it (PostgreSQL's
/// `jsonb_get_element`: `strtol(step, &end, 10)`, then NULL unless the
/// whole step was read, without overflow, into an `int`): leading
/// whitespace (`isspace`: space, `\t`, `\n`, `\v`, `\f`, `\r`), an optional
/// sign, then decimal digits to the end. So `" 1"`, `"+1"`, `"01"` and
/// `"-0"` are indexes; `"1 "`, `""`, `"1e0"`, `"0x1"` and `"2147483648"` are
/// not. `i32::MIN` is one, but no array is that long.
fn array_index(step: &str) -> Option<i64> {
    let digits_and_sign = step.trim_start_matches([' ', '\t', '\n', '\u{0b}', '\u{0c}', '\r']);
    let (negative, digits) = match digits_and_sign.as_bytes().first()? {
        b'-' => (true, &digits_and_sign[1..]),
        b'+' => (false, &digits_and_sign[1..]),
        _ => (false, digits_and_sign),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Past an int is NULL whatever the digits: stop before i64 overflows.
    let mut magnitude = 0i64;
    for digit in digits.bytes() {
        magnitude = magnitude * 10 + i64::from(digit - b'0');
        if magnitude > 1 << 31 {
            return None;
        }
    }
    let index = if negative { -magnitude } else { magnitude };
    i32::try_from(index).ok().map(i64::from)
}

/// Whether the raw bytes of a JSON string (between its quotes) spell `key`,
/// compared as they are unescaped, without a copy.
fn key_equals(raw: &[u8], key: &str) -> bool {
    let key = key.as_bytes();
    if !raw.contains(&b'\\') {
        return raw == key;
    }
    // Unescaping never lengthens a body.
    if key.len() > raw.len() {
        return false;
    }
    let mut rest = key;
    let mut equal = true;
    let spelled = unescape_with(raw, |run| {
        equal = equal && rest.starts_with(run);
        if equal {
            rest = &rest[run.len()..];
        }
    });
    spelled.is_some() && equal && rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> JsonString {
        JsonString::new(text.to_owned()).unwrap()
    }

    #[test]
    fn follows_keys_and_indexes_to_the_exact_text() {
        let state =
            json(r#" { "a" : [ 1 , {"b":"x,}]\"y"} , [ ] ] , "c" : -2.5e3 , "d":{"":null} } "#);
        assert_eq!(find_path(&state, &[]), Some(state.as_str().trim()));
        assert_eq!(find_path(&state, &["a", "1", "b"]), Some(r#""x,}]\"y""#));
        assert_eq!(find_path(&state, &["a", "1"]), Some(r#"{"b":"x,}]\"y"}"#));
        assert_eq!(find_path(&state, &["a", "2"]), Some("[ ]"));
        assert_eq!(find_path(&state, &["a", "-3"]), Some("1"));
        assert_eq!(find_path(&state, &["a", "-4"]), None);
        assert_eq!(find_path(&state, &["a", "3"]), None);
        assert_eq!(find_path(&state, &["a", "x"]), None);
        assert_eq!(find_path(&state, &["a", "2", "0"]), None);
        assert_eq!(find_path(&state, &["c"]), Some("-2.5e3"));
        assert_eq!(find_path(&state, &["c", "0"]), None);
        assert_eq!(find_path(&state, &["d", ""]), Some("null"));
        assert_eq!(find_path(&json("{}"), &["a"]), None);
        assert_eq!(find_path(&json("[]"), &["-1"]), None);
        assert_eq!(find_path(&json("true"), &[]), Some("true"));
    }

    #[test]
    fn reads_an_index_as_jsonb_does() {
        let state = json("[10,11,12]");
        for (step, expected) in [
            ("1", Some("11")),
            (" 1", Some("11")),
            ("\t\n\u{0b}\u{0c}\r 1", Some("11")),
            ("+1", Some("11")),
            ("01", Some("11")),
            ("-0", Some("10")),
            ("+0", Some("10")),
            ("-1", Some("12")),
            (" -3", Some("10")),
            ("-4", None),
            ("3", None),
            ("1 ", None),
            ("", None),
            (" ", None),
            ("+", None),
            ("-", None),
            ("+-1", None),
            ("- 1", None),
            ("1e0", None),
            ("1.0", None),
            ("0x1", None),
            ("\u{a0}1", None),
            ("2147483647", None),
            ("2147483648", None),
            ("-2147483648", None),
            ("-2147483649", None),
            ("99999999999999999999999", None),
        ] {
            assert_eq!(find_path(&state, &[step]), expected, "{step:?}");
        }
        assert_eq!(array_index("2147483647"), Some(i64::from(i32::MAX)));
        assert_eq!(array_index("-2147483648"), Some(i64::from(i32::MIN)));
        assert_eq!(array_index("-2147483649"), None);
    }

    #[test]
    fn the_last_of_duplicate_keys_counts_as_in_jsonb() {
        let state = json(r#"{"k":1,"k":2,"other":3}"#);
        assert_eq!(find_path(&state, &["k"]), Some("2"));
    }

    #[test]
    fn compares_keys_after_unescaping() {
        let state = json(r#"{"caf\u00e9":1,"e\u0301":2,"\ud834\udd1e":3,"\ud800":4,"a\"b":5}"#);
        assert_eq!(find_path(&state, &["caf\u{e9}"]), Some("1"));
        assert_eq!(find_path(&state, &["e\u{301}"]), Some("2"));
        assert_eq!(find_path(&state, &["\u{e9}"]), None);
        assert_eq!(find_path(&state, &["\u{1d11e}"]), Some("3"));
        assert_eq!(find_path(&state, &["a\"b"]), Some("5"));
    }

    /// A JSON value and a path into it, keys drawn from a few names so
    /// that paths hit; objects may repeat a key.
    fn value_and_path() -> impl proptest::strategy::Strategy<Value = (String, Vec<String>)> {
        use proptest::prelude::*;
        // Keys as they stand between quotes in the text: escapes included.
        let key = prop::sample::select(vec!["a", "b", r"caf\u00e9", r#"x\"y"#, ""]);
        let leaf = prop_oneof![
            Just("null".to_owned()),
            any::<i32>().prop_map(|n| n.to_string()),
            "[a-z \\\\\"]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        ];
        let value = leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key.clone(), inner), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\" : {v}"))
                        .collect();
                    format!("{{ {} }}", members.join(" , "))
                }),
            ]
        });
        let step =
            prop::sample::select(vec!["a", "b", "caf\u{e9}", "x\"y", "", "0", "1", "-1", "2"])
                .prop_map(str::to_owned);
        (value, prop::collection::vec(step, 0..4))
    }

    proptest::proptest! {
        /// What serde_json finds at the same path (its maps keep the last
        /// of duplicate keys, as jsonb does), for any value and path.
        #[test]
        fn agrees_with_a_parsed_value((text, path) in value_and_path()) {
            let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            let mut expected = Some(&parsed);
            for step in &path {
                expected = expected.and_then(|v| match v {
                    serde_json::Value::Object(map) => map.get(step),
                    serde_json::Value::Array(items) => step.parse::<i64>().ok().and_then(|i| {
                        let i = if i < 0 { items.len() as i64 + i } else { i };
                        usize::try_from(i).ok().and_then(|i| items.get(i))
                    }),
                    _ => None,
                });
            }
            let steps: Vec<&str> = path.iter().map(String::as_str).collect();
            let found = find_path(&json(&text), &steps)
                .map(|t| serde_json::from_str::<serde_json::Value>(t).unwrap());
            proptest::prop_assert_eq!(found.as_ref(), expected);
        }

        /// The exact text: the value's own bytes, the same with either
        /// width of outline offsets.
        #[test]
        fn finds_the_same_exact_text_with_wide_offsets((text, path) in value_and_path()) {
            let state = json(&text);
            let steps: Vec<&str> = path.iter().map(String::as_str).collect();
            let found = find_path(&state, &steps);
            proptest::prop_assert_eq!(found, find_wide(&state, &steps));
            if let Some(found) = found {
                proptest::prop_assert_eq!(found, found.trim());
            }
        }
    }

    /// [`find_path`] with 8-byte outline offsets, which only texts of
    /// 4 GiB and more get otherwise.
    fn find_wide<'a>(json: &'a JsonString, path: &[&str]) -> Option<&'a str> {
        let text = json.as_str();
        let start = skip_whitespace(text.as_bytes(), 0);
        if path.is_empty() || !matches!(text.as_bytes()[start], b'[' | b'{') {
            return find_path(json, path);
        }
        Walk::<usize>::new(text.as_bytes(), path.len()).find(text, start, path)
    }

    fn nested(open: &str, leaf: &str, close: &str, depth: usize) -> String {
        format!("{}{leaf}{}", open.repeat(depth), close.repeat(depth))
    }

    #[test]
    fn walks_deep_paths_of_every_kind_of_step() {
        let depth = 40_000;
        let arrays = json(&nested("[", "7", "]", depth));
        let objects = json(&nested(r#"{"a":"#, "7", "}", depth));
        let dup_objects = json(&nested(r#"{"a":0,"a":[],"a":"#, "7", r#","b":{}}"#, depth));
        let escaped = json(&nested(r#"{"\u0061":"#, "7", "}", depth));
        let mixed = json(&nested(r#"[0,{"a":"#, "7", "}]", depth));
        let mixed_path: Vec<&str> = ["-1", "a"].repeat(depth);
        for (state, path) in [
            (&arrays, vec!["0"; depth]),
            (&arrays, vec!["-1"; depth]),
            (&objects, vec!["a"; depth]),
            (&dup_objects, vec!["a"; depth]),
            (&escaped, vec!["a"; depth]),
            (&mixed, mixed_path.clone()),
        ] {
            assert_eq!(find_path(state, &path), Some("7"), "{:.20}", state.as_str());
            assert_eq!(find_wide(state, &path), Some("7"));
            // One step short: the innermost container, exactly.
            let inner = find_path(state, &path[..path.len() - 1]).unwrap();
            assert!(inner.starts_with(['[', '{']) && inner.ends_with([']', '}']));
            assert!(inner.len() < 40, "{inner}");
            // One step too many: under a scalar there is nothing.
            let mut longer = path.clone();
            longer.push("0");
            assert_eq!(find_path(state, &longer), None);
        }
        // Containers deeper than the path is long get no span: the walk
        // still steps over them whole.
        assert_eq!(
            find_path(&arrays, &["0", "0"]),
            Some(nested("[", "7", "]", depth - 2).as_str())
        );
        let wide = json(&format!("[{},7]", nested("[", "0", "]", depth)));
        assert_eq!(find_path(&wide, &["1"]), Some("7"));
        assert_eq!(
            find_path(&wide, &["-2", "-1", "0"]).map(str::len),
            Some(2 * depth - 3)
        );
    }

    /// Median milliseconds of three runs of `f`.
    fn median_ms(mut f: impl FnMut()) -> f64 {
        let mut runs: Vec<f64> = (0..3)
            .map(|_| {
                let started = std::time::Instant::now();
                f();
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        runs[1]
    }

    /// Issue 25: a path as deep as the text took time quadratic in it
    /// (2,500 deep 16-29 ms, 20,000 deep 0.9-1.6 s, release build). Eight
    /// times deeper must take well under 64 times as long: under 20 times,
    /// against a floor of 5 ms for the shallower run, so that a shared
    /// machine's noise on a fast run cannot fail it.
    #[test]
    fn takes_time_linear_in_the_depth_of_the_path() {
        let n = 20_000;
        for (name, open, close, step) in [
            ("[[…]] by 0", "[", "]", "0"),
            ("[[…]] by -1", "[", "]", "-1"),
            (r#"{"a":{"a":…}} by a"#, r#"{"a":"#, "}", "a"),
            (r#"{"a":[],"a":{…}} by a"#, r#"{"a":[],"a":"#, "}", "a"),
        ] {
            let [shallow, deep] = [n, 8 * n].map(|depth| {
                let state = json(&nested(open, "0", close, depth));
                let path = vec![step; depth];
                median_ms(|| assert_eq!(find_path(&state, &path), Some("0")))
            });
            let ratio = deep / shallow.max(5.0);
            assert!(
                ratio < 20.0,
                "{name}: {shallow:.1} ms at {n} deep, {deep:.1} ms at {} deep",
                8 * n
            );
        }
    }
}
