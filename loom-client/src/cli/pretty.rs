//! Indenting a JSON text without parsing it into a value: key order,
//! duplicate keys and every escape stay exactly as stored. Optionally
//! replaces the values of some keys with "[redacted]".

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Open(u8),
    Close(u8),
    Colon,
    Comma,
    /// A string or a scalar, exactly as written.
    Raw(&'a str),
}

/// The tokens of a JSON text the codec already validated.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b @ (b'{' | b'[') => {
                out.push(Token::Open(b));
                i += 1;
            }
            b @ (b'}' | b']') => {
                out.push(Token::Close(b));
                i += 1;
            }
            b':' => {
                out.push(Token::Colon);
                i += 1;
            }
            b',' => {
                out.push(Token::Comma);
                i += 1;
            }
            b'"' => {
                let start = i;
                i += 1;
                while bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push(Token::Raw(&text[start..i]));
            }
            _ => {
                let start = i;
                while i < bytes.len() && !b" \t\n\r,:]}".contains(&bytes[i]) {
                    i += 1;
                }
                out.push(Token::Raw(&text[start..i]));
            }
        }
    }
    out
}

/// Index just past the value that starts at `tokens[i]`.
fn skip_value(tokens: &[Token<'_>], mut i: usize) -> usize {
    let mut depth = 0usize;
    loop {
        match tokens[i] {
            Token::Open(_) => depth += 1,
            Token::Close(_) => depth -= 1,
            _ => {}
        }
        i += 1;
        if depth == 0 {
            return i;
        }
    }
}

/// `text` indented by two spaces a level, starting at `depth`, with the
/// values of the keys in `redact` replaced.
pub(super) fn indent(text: &str, redact: &[String], depth: usize) -> String {
    let tokens = tokens(text);
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = depth;
    let mut in_object: Vec<bool> = Vec::new();
    let mut expect_key = false;
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i] {
            Token::Open(open) => {
                let close = if open == b'{' { b'}' } else { b']' };
                if tokens.get(i + 1) == Some(&Token::Close(close)) {
                    out.push(char::from(open));
                    out.push(char::from(close));
                    i += 2;
                    continue;
                }
                out.push(char::from(open));
                in_object.push(open == b'{');
                expect_key = open == b'{';
                depth += 1;
                newline(&mut out, depth);
            }
            Token::Close(close) => {
                in_object.pop();
                depth -= 1;
                newline(&mut out, depth);
                out.push(char::from(close));
            }
            Token::Comma => {
                out.push(',');
                expect_key = in_object.last() == Some(&true);
                newline(&mut out, depth);
            }
            Token::Colon => out.push_str(": "),
            Token::Raw(raw) => {
                out.push_str(raw);
                if expect_key {
                    expect_key = false;
                    // The key as JSON means it: "api\u004bey" is "apiKey".
                    let name = serde_json::from_str::<std::borrow::Cow<'_, str>>(raw)
                        .unwrap_or(std::borrow::Cow::Borrowed(raw));
                    if redact.iter().any(|r| *r == name) {
                        out.push_str(": \"[redacted]\"");
                        // Past the colon and the whole value.
                        i = skip_value(&tokens, i + 2);
                        continue;
                    }
                }
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::indent;

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
}
