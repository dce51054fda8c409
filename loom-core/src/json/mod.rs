//! A strict, iterative JSON (RFC 8259) validator.
//!
//! The codec checks that what it writes and what it reads is JSON text, but
//! must never parse it into a value: a value would reorder or merge keys and
//! could not hold an escaped lone surrogate. So it validates the text in
//! place. The validator keeps its container stack on the heap, so a
//! 2,000-deep (or 2,000,000-deep) state cannot overflow the stack of a
//! Postgres backend, and it scans string bodies a word at a time, since
//! strings are most of a snapshot's bytes.
//!
//! [`find_path`] reads one value out of a validated text by path, without
//! building the rest; [`unescape`] gives a string's body as its bytes.

use std::fmt;

use crate::interrupt::{Ticker, CHECK_INTERVAL};

mod path;
mod scan;
mod unescape;
pub use path::find_path;
pub use unescape::{unescape, unescape_with};

use scan::Scanner;

/// The text is not a JSON text.
///
/// ```
/// let err = pgloom_core::json::validate(br#"{"a":1,}"#).unwrap_err();
/// assert_eq!(err.offset(), 7);
/// assert_eq!(err.to_string(), "expected a string key at byte 7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidJsonError {
    offset: usize,
    reason: &'static str,
}

impl InvalidJsonError {
    /// The byte offset at which the text stopped being JSON.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// What was wrong there, e.g. "expected a value".
    #[must_use]
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// Whether the text stopped being JSON by not being UTF-8 there (a
    /// malformed sequence inside a string).
    #[must_use]
    pub fn is_invalid_utf8(&self) -> bool {
        self.reason == INVALID_UTF8
    }
}

const INVALID_UTF8: &str = "invalid UTF-8 in a string";

impl fmt::Display for InvalidJsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.offset)
    }
}

impl std::error::Error for InvalidJsonError {}

/// Checks that `text` is exactly one JSON value with optional surrounding
/// whitespace (RFC 8259), without building it.
///
/// JSON text is UTF-8 (RFC 8259 8.1), and non-ASCII bytes can only stand
/// inside strings: each sequence there is checked as the scan meets it
/// ([`InvalidJsonError::is_invalid_utf8`]), so bytes need no separate
/// `std::str::from_utf8` pass first. Escaped lone surrogates (`"\ud800"`)
/// are valid JSON text and accepted.
///
/// # Errors
///
/// [`InvalidJsonError`] with the offset of the first byte that is not JSON.
///
/// ```
/// use pgloom_core::json::validate;
/// assert!(validate(br#" {"__proto__":[1,-2.5e3,"\ud800",null]} "#).is_ok());
/// assert!(validate(b"[1 2]").is_err());
/// ```
pub fn validate(text: &[u8]) -> Result<(), InvalidJsonError> {
    Validator::new(text, Scanner::detect()).run()
}

/// A `String` known to hold one JSON text. It is made only by validating
/// ([`JsonString::new`]) or by decoding a frame
/// ([`crate::frame::decode_json`], which validates), so whoever holds one
/// never needs to scan the text again: the proof travels with it.
///
/// ```
/// use pgloom_core::json::JsonString;
/// let state = JsonString::new(r#"{"b":1,"a":[]}"#.to_owned())?;
/// assert_eq!(state.as_str(), r#"{"b":1,"a":[]}"#);
/// assert!(JsonString::new("{oops}".to_owned()).is_err());
/// # Ok::<(), pgloom_core::json::InvalidJsonError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonString(String);

impl JsonString {
    /// Checks `text` is one JSON text.
    ///
    /// # Errors
    ///
    /// [`InvalidJsonError`] with where it stops being JSON.
    pub fn new(text: String) -> Result<Self, InvalidJsonError> {
        validate(text.as_bytes())?;
        Ok(JsonString(text))
    }

    /// For text this crate has just validated.
    pub(crate) fn validated(text: String) -> Self {
        JsonString(text)
    }

    /// The text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }
}

impl AsRef<str> for JsonString {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JsonString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

struct Validator<'a> {
    text: &'a [u8],
    pos: usize,
    scan: Scanner,
    /// When the interrupt hook is next due inside a token (issue 25): in
    /// runs of whitespace, at escapes, and between scans of a string's
    /// plain bytes, which stop after [`scan::MAX_RUN`]. With the
    /// structure's own checks (in [`Validator::run`]) and the digits'
    /// (`digits_window`), no text (256 MiB of `]`, of `\n`, of spaces, of
    /// one string or number) keeps the validator from the hook for more
    /// than [`CHECK_INTERVAL`] bytes.
    ticker: Ticker,
    /// The text up to where a run of digits next stops for an interrupt
    /// check. The run's loop reads through it, so that the bound check it
    /// pays anyway says when: a comparison a digit of its own cost 5% of
    /// validating token-dense states.
    digits_window: &'a [u8],
}

/// What encloses the current position.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Container {
    Array,
    Object,
}

/// The open containers, one bit each (set for an object): a hostile
/// 256 MiB of `[` costs the validator 32 MiB, not 256 (or the 512 a
/// doubling `Vec<Container>` can hold while it grows).
#[derive(Default)]
struct Stack {
    words: Vec<u64>,
    depth: usize,
}

impl Stack {
    fn push(&mut self, container: Container) {
        let (word, bit) = (self.depth / 64, self.depth % 64);
        if word == self.words.len() {
            self.words.push(0);
        }
        let mask = 1u64 << bit;
        match container {
            Container::Object => self.words[word] |= mask,
            Container::Array => self.words[word] &= !mask,
        }
        self.depth += 1;
    }

    fn last(&self) -> Option<Container> {
        let top = self.depth.checked_sub(1)?;
        Some(if self.words[top / 64] & (1u64 << (top % 64)) != 0 {
            Container::Object
        } else {
            Container::Array
        })
    }

    fn pop(&mut self) {
        self.depth -= 1;
    }
}

impl<'a> Validator<'a> {
    fn new(text: &'a [u8], scan: Scanner) -> Self {
        Validator {
            text,
            pos: 0,
            scan,
            ticker: Ticker::starting_at(0),
            digits_window: &text[..text.len().min(CHECK_INTERVAL)],
        }
    }

    fn run(mut self) -> Result<(), InvalidJsonError> {
        let mut stack = Stack::default();
        // Checked where each value ends and each container opens: one
        // comparison a token, against a local the compiler can keep in a
        // register.
        let mut ticker = Ticker::starting_at(0);
        'value: loop {
            self.skip_whitespace();
            match self.peek() {
                Some(b'{') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                    } else {
                        ticker.at(self.pos);
                        stack.push(Container::Object);
                        self.key()?;
                        continue 'value;
                    }
                }
                Some(b'[') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                    } else {
                        ticker.at(self.pos);
                        stack.push(Container::Array);
                        continue 'value;
                    }
                }
                Some(b'"') => self.string()?,
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                _ => return Err(self.error("expected a value")),
            }
            // A value just ended: close containers until one wants more.
            loop {
                ticker.at(self.pos);
                self.skip_whitespace();
                let Some(top) = stack.last() else {
                    return if self.pos == self.text.len() {
                        Ok(())
                    } else {
                        Err(self.error("unexpected text after the JSON value"))
                    };
                };
                match (top, self.peek()) {
                    (_, Some(b',')) => {
                        self.pos += 1;
                        if top == Container::Object {
                            self.skip_whitespace();
                            self.key()?;
                        }
                        continue 'value;
                    }
                    (Container::Array, Some(b']')) | (Container::Object, Some(b'}')) => {
                        self.pos += 1;
                        stack.pop();
                    }
                    (Container::Array, _) => return Err(self.error("expected ',' or ']'")),
                    (Container::Object, _) => return Err(self.error("expected ',' or '}'")),
                }
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn error(&self, reason: &'static str) -> InvalidJsonError {
        InvalidJsonError {
            offset: self.pos,
            reason,
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
            self.ticker.at(self.pos);
        }
    }

    /// An object key and its colon, leaving the position at the value.
    #[inline(always)]
    fn key(&mut self) -> Result<(), InvalidJsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a string key"));
        }
        self.string()?;
        self.skip_whitespace();
        if self.peek() != Some(b':') {
            return Err(self.error("expected ':' after an object key"));
        }
        self.pos += 1;
        Ok(())
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), InvalidJsonError> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        loop {
            while let Some(b'0'..=b'9') = self.digits_window.get(self.pos) {
                self.pos += 1;
            }
            if self.pos < self.digits_window.len() || self.pos >= self.text.len() {
                return self.pos - start;
            }
            self.ticker.at(self.pos);
            self.digits_window = &self.text[..self.text.len().min(self.pos + CHECK_INTERVAL)];
        }
    }

    fn number(&mut self) -> Result<(), InvalidJsonError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("expected a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.error("expected a digit after '.'"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("expected a digit in the exponent"));
            }
        }
        Ok(())
    }

    /// A string, from its opening quote to just past its closing one.
    ///
    /// Inlined into every caller: most strings are a key or a short value
    /// with nothing to unescape, one scan to the closing quote, and a call
    /// per string was a fifth of the validator's time on token-dense states.
    #[inline(always)]
    fn string(&mut self) -> Result<(), InvalidJsonError> {
        self.pos += 1;
        self.skip_plain_string_bytes();
        if self.peek() == Some(b'"') {
            self.pos += 1;
            Ok(())
        } else {
            self.string_rest()
        }
    }

    /// The rest of a string from its first escape, non-ASCII or invalid
    /// byte, or from where the scan of a long run stopped.
    #[inline(never)]
    fn string_rest(&mut self) -> Result<(), InvalidJsonError> {
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.pos += 1;
                        }
                        Some(b'u') => {
                            self.pos += 1;
                            let hex = self.text.get(self.pos..self.pos + 4);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return Err(self.error("expected four hex digits after \\u"));
                            }
                            self.pos += 4;
                        }
                        _ => return Err(self.error("invalid escape in a string")),
                    }
                }
                Some(lead) if lead >= 0x80 => match utf8_sequence_len(&self.text[self.pos..]) {
                    Some(len) => self.pos += len,
                    None => return Err(self.error(INVALID_UTF8)),
                },
                // Where the scan stopped in a long run of plain bytes.
                Some(0x20..=0x7f) => {}
                Some(_) => return Err(self.error("unescaped control character in a string")),
                None => return Err(self.error("unterminated string")),
            }
            self.ticker.at(self.pos);
            self.skip_plain_string_bytes();
        }
    }

    /// Skips string bytes that need no attention: anything but '"', '\\',
    /// control characters and non-ASCII bytes (whose UTF-8 the caller
    /// checks), as many bytes a step as the CPU allows ([`scan`]).
    /// A run longer than [`scan::MAX_RUN`] stops at a plain byte, which
    /// [`Self::string_rest`] takes for the rest of the run, after an
    /// interrupt check.
    #[inline(always)]
    fn skip_plain_string_bytes(&mut self) {
        self.pos = self.scan.skip(self.text, self.pos);
    }
}

/// The length of the well-formed UTF-8 sequence `bytes` starts with (its
/// first byte non-ASCII), or `None`: RFC 3629's table, so no overlong form,
/// no surrogate, nothing past U+10FFFF.
fn utf8_sequence_len(bytes: &[u8]) -> Option<usize> {
    let continuation = |i: usize| bytes.get(i).is_some_and(|b| (0x80..=0xBF).contains(b));
    let second_in =
        |range: std::ops::RangeInclusive<u8>| bytes.get(1).is_some_and(|b| range.contains(b));
    let len = match bytes[0] {
        0xC2..=0xDF => 2,
        0xE0 if second_in(0xA0..=0xBF) => 3,
        0xE1..=0xEC | 0xEE..=0xEF if continuation(1) => 3,
        0xED if second_in(0x80..=0x9F) => 3,
        0xF0 if second_in(0x90..=0xBF) => 4,
        0xF1..=0xF3 if continuation(1) => 4,
        0xF4 if second_in(0x80..=0x8F) => 4,
        _ => return None,
    };
    (1..len).all(continuation).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `validate` with every scanner this CPU runs, which must all agree.
    fn validate_each(text: &[u8]) -> Result<(), InvalidJsonError> {
        let mut results = Scanner::available()
            .into_iter()
            .map(|scanner| (scanner, Validator::new(text, scanner).run()));
        let (_, first) = results.next().expect("the portable scanner");
        for (scanner, other) in results {
            assert_eq!(other, first, "{scanner:?} on {text:?}");
        }
        first
    }

    #[test]
    fn accepts_json_texts() {
        for ok in [
            "0",
            "-0",
            "1.5e-3",
            "-12E+4",
            "true",
            "null",
            r#""""#,
            r#""\u00e9\ud800\/\b\f\n\r\t\"\\""#,
            "[]",
            "{}",
            " [ 1 , { \"a\" : [ ] } ] \n",
            r#"{"a":1,"a":2}"#,
            "\"caf\u{e9} \u{1D11E}\"",
        ] {
            assert_eq!(validate_each(ok.as_bytes()), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_what_is_not_json_and_says_where() {
        for (bad, offset, reason) in [
            ("", 0, "expected a value"),
            ("   ", 3, "expected a value"),
            ("01", 1, "unexpected text after the JSON value"),
            ("1.", 2, "expected a digit after '.'"),
            ("1e", 2, "expected a digit in the exponent"),
            ("-", 1, "expected a digit"),
            ("+1", 0, "expected a value"),
            ("tru", 0, "expected a value"),
            ("[1,]", 3, "expected a value"),
            ("[1 2]", 3, "expected ',' or ']'"),
            ("{\"a\" 1}", 5, "expected ':' after an object key"),
            ("{1:2}", 1, "expected a string key"),
            ("{\"a\":1,}", 7, "expected a string key"),
            ("{\"a\":1]", 6, "expected ',' or '}'"),
            ("[", 1, "expected a value"),
            ("\"abc", 4, "unterminated string"),
            ("\"a\tb\"", 2, "unescaped control character in a string"),
            ("\"a\0b\"", 2, "unescaped control character in a string"),
            ("\"\\x\"", 2, "invalid escape in a string"),
            ("\"\\u12g4\"", 3, "expected four hex digits after \\u"),
            ("{} {}", 3, "unexpected text after the JSON value"),
            ("NaN", 0, "expected a value"),
        ] {
            let err = validate_each(bad.as_bytes()).unwrap_err();
            assert_eq!((err.offset(), err.reason()), (offset, reason), "{bad:?}");
        }
    }

    #[test]
    fn nests_deeper_than_any_stack() {
        let depth = 1_000_000;
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(validate_each(deep.as_bytes()), Ok(()));
        assert!(validate_each(&deep.as_bytes()[1..]).is_err());
    }

    #[test]
    fn finds_special_bytes_at_every_word_offset() {
        for at in 0..20 {
            let mut s = format!("\"{}\"", "x".repeat(20));
            s.replace_range(1 + at..2 + at, "\u{1}");
            assert!(validate_each(s.as_bytes()).is_err(), "control at {at}");
        }
    }

    fn json_ish() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop::sample::select(vec![
                "{",
                "}",
                "[",
                "]",
                ",",
                ":",
                "\"",
                "\\",
                "\"a\"",
                "1",
                "-",
                "0",
                ".",
                "e",
                "+",
                " ",
                "\n",
                "true",
                "nul",
                "null",
                "\\u00",
                "é",
                "\u{1}",
                "\"\\ud800\"",
            ]),
            0..24,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        // serde_json is the reference; its ignored-value path, like ours,
        // accepts escaped lone surrogates.
        #[test]
        fn agrees_with_serde_json(text in json_ish()) {
            let reference = serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok();
            prop_assert_eq!(validate_each(text.as_bytes()).is_ok(), reference, "{:?}", text);
        }

        /// Any bytes in a string, biased to the edges of UTF-8's table:
        /// valid exactly when they are UTF-8 and serde_json takes them, and
        /// a UTF-8 failure is reported where std reports it.
        #[test]
        fn checks_utf8_in_strings_as_std_does(
            body in proptest::collection::vec(
                prop_oneof![
                    Just(b'a'), Just(0x7Fu8), Just(0x80), Just(0x8F), Just(0x90), Just(0x9F),
                    Just(0xA0), Just(0xBF), Just(0xC0), Just(0xC2), Just(0xDF), Just(0xE0),
                    Just(0xED), Just(0xEF), Just(0xF0), Just(0xF4), Just(0xF5), Just(0xFF),
                    any::<u8>(),
                ],
                0..40,
            )
        ) {
            let mut text = vec![b'"'];
            text.extend(body.iter().filter(|b| **b != b'"' && **b != b'\\' && **b >= 0x20));
            text.push(b'"');
            let utf8 = std::str::from_utf8(&text);
            let reference = utf8.is_ok()
                && serde_json::from_slice::<serde::de::IgnoredAny>(&text).is_ok();
            let ours = validate_each(&text);
            prop_assert_eq!(ours.is_ok(), reference, "{:?}", text);
            if let (Err(std_err), Err(ours)) = (utf8, &ours) {
                prop_assert!(ours.is_invalid_utf8());
                prop_assert_eq!(ours.offset(), std_err.valid_up_to());
            }
        }
    }

    #[test]
    fn checks_each_utf8_sequence_in_a_string() {
        for good in [
            "\"é\"",
            "\"中文\"",
            "\"\u{1D11E}\"",
            "\"\u{10FFFF}\"",
            "\"\u{FFFD}\"",
            "\"aé中\u{1D11E}z\"",
        ] {
            assert!(validate_each(good.as_bytes()).is_ok(), "{good:?}");
        }
        for (bad, at) in [
            (&b"\"\x80\""[..], 1),        // a lone continuation byte
            (b"\"ab\xC0\x80\"", 3),       // an overlong NUL
            (b"\"\xE0\x80\xAF\"", 1),     // an overlong '/'
            (b"\"\xED\xA0\x80\"", 1),     // a UTF-16 surrogate
            (b"\"\xF4\x90\x80\x80\"", 1), // past U+10FFFF
            (b"\"\xF5\x80\x80\x80\"", 1),
            (b"\"\xE4\xB8\"", 1), // cut short by the quote
            (b"\"\xE4\xB8", 1),   // cut short by the end
        ] {
            let err = validate_each(bad).unwrap_err();
            assert!(err.is_invalid_utf8(), "{bad:?}: {err}");
            assert_eq!(err.offset(), at, "{bad:?}");
        }
        // Outside a string a non-ASCII byte is no value at all.
        assert!(!validate_each(b"[\xC3\xA9]").unwrap_err().is_invalid_utf8());
    }
}
