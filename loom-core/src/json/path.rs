//! One value out of a JSON text by path, without building the rest: what
//! `jsonb #> path` returns, for a text that was never made jsonb. A psql
//! user asking for `turns, 0` of a 600 KB state needs the keys of the top
//! object and the first element of one array, not a jsonb of everything.

use super::{unescape, JsonString};

/// The exact text of the value at `path` in `json`, or `None` where there
/// is none, with `jsonb #> path`'s rules: in an object, a step is a key
/// (compared after unescaping; of duplicate keys the last counts, as
/// jsonb keeps it); in an array, a step is an index, negative from the end;
/// a scalar has nothing under it. An empty path is the whole value.
///
/// ```
/// use loom_core::json::{find_path, JsonString};
/// let state = JsonString::new(r#"{"turns":[{"tool":"search"},{"tool":"read"}],"turns":[7]}"#.to_owned())?;
/// assert_eq!(find_path(&state, &["turns", "0"]), Some("7"));
/// assert_eq!(find_path(&state, &["turns", "-1"]), Some("7"));
/// assert_eq!(find_path(&state, &["turns", "1"]), None);
/// assert_eq!(find_path(&state, &["nope"]), None);
/// # Ok::<(), loom_core::json::InvalidJsonError>(())
/// ```
#[must_use]
pub fn find_path<'a>(json: &'a JsonString, path: &[&str]) -> Option<&'a str> {
    let text = json.as_str();
    let bytes = text.as_bytes();
    let mut start = skip_whitespace(bytes, 0);
    for step in path {
        start = match bytes[start] {
            b'{' => object_member(bytes, start, step)?,
            b'[' => array_element(bytes, start, step)?,
            _ => return None,
        };
    }
    // Every boundary found is an ASCII byte of a valid text: a char
    // boundary.
    Some(&text[start..skip_value(bytes, start)])
}

fn skip_whitespace(bytes: &[u8], mut pos: usize) -> usize {
    while matches!(bytes.get(pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        pos += 1;
    }
    pos
}

/// The position after the string whose opening quote is at `pos`.
fn skip_string(bytes: &[u8], pos: usize) -> usize {
    let mut i = pos + 1;
    loop {
        match bytes[i] {
            b'"' => return i + 1,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// The position after the value starting at `pos`.
fn skip_value(bytes: &[u8], pos: usize) -> usize {
    match bytes[pos] {
        b'"' => skip_string(bytes, pos),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = pos;
            loop {
                match bytes[i] {
                    b'"' => {
                        i = skip_string(bytes, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        // A number or a literal runs to the next delimiter.
        _ => {
            let mut i = pos;
            while i < bytes.len()
                && !matches!(bytes[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                i += 1;
            }
            i
        }
    }
}

/// Where the value of the last member named `key` starts, in the object
/// whose `{` is at `pos`.
fn object_member(bytes: &[u8], pos: usize, key: &str) -> Option<usize> {
    let mut found = None;
    let mut i = skip_whitespace(bytes, pos + 1);
    if bytes[i] == b'}' {
        return None;
    }
    loop {
        let key_end = skip_string(bytes, i);
        let matches = key_equals(&bytes[i + 1..key_end - 1], key);
        i = skip_whitespace(bytes, key_end);
        // The ':'.
        i = skip_whitespace(bytes, i + 1);
        if matches {
            found = Some(i);
        }
        i = skip_whitespace(bytes, skip_value(bytes, i));
        if bytes[i] == b'}' {
            return found;
        }
        // The ','.
        i = skip_whitespace(bytes, i + 1);
    }
}

/// Where element `step` starts in the array whose `[` is at `pos`; `step`
/// is an integer, negative counting from the end, as jsonb reads it
/// ([`array_index`]). A negative index counts the elements first, then
/// walks to the one it names: no list of where each starts.
fn array_element(bytes: &[u8], pos: usize, step: &str) -> Option<usize> {
    let index = array_index(step)?;
    let first = skip_whitespace(bytes, pos + 1);
    if bytes[first] == b']' {
        return None;
    }
    // The position after the element starting at `i`, and whether it was
    // the last.
    let next = |i: usize| {
        let after = skip_whitespace(bytes, skip_value(bytes, i));
        if bytes[after] == b']' {
            None
        } else {
            Some(skip_whitespace(bytes, after + 1))
        }
    };
    let wanted = if index >= 0 {
        u64::try_from(index).ok()?
    } else {
        let mut len = 1u64;
        let mut i = first;
        while let Some(after) = next(i) {
            len += 1;
            i = after;
        }
        len.checked_sub(index.unsigned_abs())?
    };
    let mut i = first;
    for _ in 0..wanted {
        i = next(i)?;
    }
    Some(i)
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

/// Whether the raw bytes of a JSON string (between its quotes) spell `key`.
fn key_equals(raw: &[u8], key: &str) -> bool {
    if !raw.contains(&b'\\') {
        return raw == key.as_bytes();
    }
    unescape(raw).is_some_and(|unescaped| unescaped == key.as_bytes())
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
    }
}
