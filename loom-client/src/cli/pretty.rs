//! Indenting a JSON text without parsing it into a value: key order,
//! duplicate keys and every escape stay exactly as stored. Optionally
//! replaces the values of some keys with "[redacted]".
//!
//! The text is streamed to a [`Write`] token by token, so that printing
//! needs no memory beyond the input and one flag a level open. Output is
//! linear in the input too: a state any writer can save (a 35-byte zstd
//! frame inflates to 50,000 nested arrays) would print O(depth²) spaces if
//! every level indented by two more, 2.5 GB for that frame. So only the
//! first [`MAX_INDENTED_DEPTH`] levels are indented; a value that starts
//! deeper is printed compactly on its line (tokens as stored, no white
//! space), which a reader of such a state can still feed to any JSON tool.

use std::io::{self, Write};

/// How many levels are indented, each by two spaces: beyond it no reader
/// follows the indentation, and each printed token costs at most this many
/// times two bytes of indentation.
pub(super) const MAX_INDENTED_DEPTH: usize = 32;

/// The indentation of the deepest indented line, sliced for shallower ones:
/// no line allocates its own.
const INDENT: &str = match std::str::from_utf8(&[b' '; 2 * MAX_INDENTED_DEPTH]) {
    Ok(spaces) => spaces,
    Err(_) => panic!("spaces are UTF-8"),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Open(u8),
    Close(u8),
    Colon,
    Comma,
    /// A string or a scalar, exactly as written.
    Raw(&'a str),
}

/// The tokens of a JSON text the codec already validated, one at a time.
/// Text that is not JSON ends the tokens where it stops making sense,
/// never in a panic.
struct Tokens<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        let bytes = self.text.as_bytes();
        while bytes.get(self.at).is_some_and(|b| b" \t\n\r".contains(b)) {
            self.at += 1;
        }
        let start = self.at;
        let token = match *bytes.get(start)? {
            b @ (b'{' | b'[') => Token::Open(b),
            b @ (b'}' | b']') => Token::Close(b),
            b':' => Token::Colon,
            b',' => Token::Comma,
            b'"' => {
                let mut i = start + 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                self.at = (i + 1).min(bytes.len());
                return Some(Token::Raw(&self.text[start..self.at]));
            }
            _ => {
                let mut i = start;
                while i < bytes.len() && !b" \t\n\r,:]}[{\"".contains(&bytes[i]) {
                    i += 1;
                }
                // A byte no token starts with: nothing more to print.
                if i == start {
                    self.at = bytes.len();
                    return None;
                }
                self.at = i;
                return Some(Token::Raw(&self.text[start..i]));
            }
        };
        self.at += 1;
        Some(token)
    }
}

/// Writes `text` to `out` indented by two spaces a level, starting at
/// `depth`, the values of the keys in `redact` replaced by "[redacted]",
/// and values that start deeper than [`MAX_INDENTED_DEPTH`] compact.
pub(super) fn write_indented(
    out: &mut impl Write,
    text: &str,
    redact: &[String],
    depth: usize,
) -> io::Result<()> {
    let mut tokens = Tokens { text, at: 0 }.peekable();
    let mut depth = depth;
    // Per open level: whether it is an object. One byte a level of input.
    let mut in_object: Vec<bool> = Vec::new();
    let mut expect_key = false;
    let newline = |out: &mut dyn Write, depth: usize| {
        if depth <= MAX_INDENTED_DEPTH {
            out.write_all(b"\n")?;
            out.write_all(&INDENT.as_bytes()[..2 * depth])?;
        }
        Ok::<_, io::Error>(())
    };
    while let Some(token) = tokens.next() {
        match token {
            Token::Open(open) => {
                let close = if open == b'{' { b'}' } else { b']' };
                if tokens.next_if_eq(&Token::Close(close)).is_some() {
                    out.write_all(&[open, close])?;
                    continue;
                }
                out.write_all(&[open])?;
                in_object.push(open == b'{');
                expect_key = open == b'{';
                depth += 1;
                newline(out, depth)?;
            }
            Token::Close(close) => {
                in_object.pop();
                depth = depth.saturating_sub(1);
                // The last line of a compact value is the one it started
                // on: it closes there too.
                if depth < MAX_INDENTED_DEPTH {
                    newline(out, depth)?;
                }
                out.write_all(&[close])?;
            }
            Token::Comma => {
                out.write_all(b",")?;
                expect_key = in_object.last() == Some(&true);
                newline(out, depth)?;
            }
            Token::Colon => out.write_all(if depth <= MAX_INDENTED_DEPTH {
                b": "
            } else {
                b":"
            })?,
            Token::Raw(raw) => {
                out.write_all(raw.as_bytes())?;
                if std::mem::take(&mut expect_key) && is_redacted(raw, redact) {
                    out.write_all(if depth <= MAX_INDENTED_DEPTH {
                        b": \"[redacted]\""
                    } else {
                        b":\"[redacted]\""
                    })?;
                    // Past the colon and the whole value.
                    tokens.next_if_eq(&Token::Colon);
                    skip_value(&mut tokens);
                }
            }
        }
    }
    Ok(())
}

/// Whether the key `raw` (quoted, as stored) is one to redact: the key as
/// JSON means it, so "api\u004bey" is "apiKey".
fn is_redacted(raw: &str, redact: &[String]) -> bool {
    let name = serde_json::from_str::<std::borrow::Cow<'_, str>>(raw)
        .unwrap_or(std::borrow::Cow::Borrowed(raw));
    redact.iter().any(|r| *r == name)
}

/// Consumes the tokens of the one value that comes next.
fn skip_value<'a>(tokens: &mut impl Iterator<Item = Token<'a>>) {
    let mut depth = 0usize;
    for token in tokens {
        match token {
            Token::Open(_) => depth += 1,
            Token::Close(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{write_indented, MAX_INDENTED_DEPTH};

    fn indent(text: &str, redact: &[String], depth: usize) -> String {
        let mut out = Vec::new();
        write_indented(&mut out, text, redact, depth).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn indents_without_touching_keys_or_escapes() {
        let text = r#"{"z":1,"a":[],"e":{},"s":"x\"y\ud800","n":[1,{"k":null}]}"#;
        assert_eq!(
            indent(text, &[], 0),
            "{\n  \"z\": 1,\n  \"a\": [],\n  \"e\": {},\n  \"s\": \"x\\\"y\\ud800\",\n  \"n\": [\n    1,\n    {\n      \"k\": null\n    }\n  ]\n}"
        );
    }

    #[test]
    fn redacts_the_values_of_named_keys_wherever_they_occur() {
        let text = r#"{"token":"secret","nested":[{"token":{"deep":[1,2]},"keep":1}],"token2":3}"#;
        let shown = indent(text, &["token".to_owned()], 0);
        assert!(
            !shown.contains("secret") && !shown.contains("deep"),
            "{shown}"
        );
        assert_eq!(shown.matches("[redacted]").count(), 2, "{shown}");
        assert!(
            shown.contains("\"keep\": 1") && shown.contains("\"token2\": 3"),
            "{shown}"
        );
        assert_eq!(indent("\"just a string\"", &[], 0), "\"just a string\"");
    }

    #[test]
    fn redacts_a_key_however_it_is_escaped() {
        let text = r#"{"api\u004bey":"secret","\u0074oken":{"x":"hidden"},"apiKeys":1}"#;
        let shown = indent(text, &["apiKey".to_owned(), "token".to_owned()], 0);
        assert!(
            !shown.contains("secret") && !shown.contains("hidden"),
            "{shown}"
        );
        // The key is printed as stored; only its value goes.
        assert!(shown.contains(r#""api\u004bey": "[redacted]""#), "{shown}");
        assert!(shown.contains("\"apiKeys\": 1"), "{shown}");
    }

    /// Issue 25, item 6: 50,000 nested arrays (what a 35-byte zstd frame
    /// holds) printed 2.5 GB of indentation, and the CLI aborted building
    /// it. Past the indented depth a value prints compactly, so the output
    /// stays within a small multiple of the input, at 8 times the depth too.
    #[test]
    fn deep_nesting_prints_in_output_linear_in_the_input() {
        for depth in [50_000, 400_000] {
            let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let started = std::time::Instant::now();
            let shown = indent(&text, &[], 1);
            assert!(
                shown.len() < 2 * text.len(),
                "{depth} levels: {} bytes of output for {} of input",
                shown.len(),
                text.len()
            );
            assert!(started.elapsed() < std::time::Duration::from_secs(5));
            // Still the same JSON, white space aside.
            let compact: String = shown.chars().filter(|c| !c.is_whitespace()).collect();
            assert_eq!(compact, text);
        }
        // Objects with content, and a redacted key deep down: the same.
        let depth = 50_000;
        let text = format!(
            "{}{{\"token\":\"secret\",\"k\":1}}{}",
            "{\"a\":[".repeat(depth),
            "]}".repeat(depth)
        );
        let shown = indent(&text, &["token".to_owned()], 1);
        assert!(shown.len() < 2 * text.len(), "{}", shown.len());
        assert!(!shown.contains("secret"));
        // The innermost levels close compactly, on the line they opened on.
        assert!(shown.contains(&format!(
            "{{\"token\":\"[redacted]\",\"k\":1}}{}]\n",
            "]}".repeat(depth - MAX_INDENTED_DEPTH / 2)
        )));
    }

    #[test]
    fn indents_the_first_levels_and_prints_deeper_values_compactly() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let text = format!("{{\"a\": {}, \"b\": 2}}", deep(MAX_INDENTED_DEPTH + 2));
        let shown = indent(&text, &[], 0);
        let lines: Vec<&str> = shown.lines().collect();
        let deepest = lines
            .iter()
            .map(|l| l.len() - l.trim_start().len())
            .max()
            .unwrap();
        assert_eq!(deepest, 2 * MAX_INDENTED_DEPTH, "{shown}");
        // Levels 33 and deeper on the line of the level above them.
        let compact = format!("\n{}[[[1]]]\n", " ".repeat(2 * MAX_INDENTED_DEPTH));
        assert!(shown.contains(&compact), "{shown}");
        assert!(shown.ends_with("\n  \"b\": 2\n}"), "{shown}");
        let reparsed: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(
            reparsed,
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        );
    }

    #[test]
    fn text_that_is_not_json_ends_the_output_without_a_panic() {
        for bad in ["\"unterminated", "[1,\"a\\", "{\"a\":\u{1}}", "[1 2 3"] {
            let _ = indent(bad, &["a".to_owned()], 0);
        }
    }
}
