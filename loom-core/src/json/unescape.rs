//! A JSON string's body, unescaped: what reading a value out of the text
//! (`find_path`) and building jsonb from it (the extension) both need, and
//! what must mean the same in both.

use crate::interrupt::{Ticker, CHECK_INTERVAL};

/// The bytes the body of a JSON string (the raw bytes between its quotes,
/// from a valid text) stands for: UTF-8, escapes replaced, surrogate pairs
/// joined. `None` when it holds a lone surrogate, which no UTF-8 text can.
/// `\u0000` becomes a 0 byte (Postgres text cannot hold one: callers that
/// make text refuse it).
///
/// ```
/// use pgloom_core::json::unescape;
/// assert_eq!(
///     unescape(br#"caf\u00e9 \"x\"\n\ud834\udd1e"#).as_deref(),
///     Some("café \"x\"\n𝄞".as_bytes())
/// );
/// assert_eq!(unescape(br"\ud800"), None);
/// ```
#[must_use]
pub fn unescape(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    unescape_with(raw, |bytes| out.extend_from_slice(bytes))?;
    Some(out)
}

/// [`unescape`] without a buffer of its own: hands the unescaped bytes to
/// `emit`, a run at a time and in order, so that a caller can write them
/// where they belong (the extension's jsonb builder writes them straight
/// into the palloc'd jsonb) or only look at them. `None` when the body
/// holds a lone surrogate; `emit` may have had the bytes before it.
///
/// ```
/// use pgloom_core::json::unescape_with;
/// let mut len = 0;
/// assert_eq!(unescape_with(br#"a\u00e9\n"#, |run| len += run.len()), Some(()));
/// assert_eq!(len, 4);
/// assert_eq!(unescape_with(br"x\udc00", |_| {}), None);
/// ```
pub fn unescape_with(raw: &[u8], mut emit: impl FnMut(&[u8])) -> Option<()> {
    // A body of 256 MiB is 128M escapes, or one run of plain bytes: both
    // are checked along the way.
    let mut ticker = Ticker::starting_at(0);
    let mut i = 0;
    while i < raw.len() {
        ticker.at(i);
        // The run up to the next escape, whole up to CHECK_INTERVAL bytes.
        let window = &raw[i..raw.len().min(i + CHECK_INTERVAL)];
        let run = memchr::memchr(b'\\', window).unwrap_or(window.len());
        if run > 0 {
            emit(&raw[i..i + run]);
        }
        i += run;
        if i == raw.len() {
            break;
        }
        if run == window.len() {
            continue;
        }
        let simple = match raw[i + 1] {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(byte) = simple {
            emit(&[byte]);
            i += 2;
            continue;
        }
        // \uXXXX, perhaps the high half of a surrogate pair.
        let unit = hex4(raw.get(i + 2..i + 6)?)?;
        i += 6;
        let code = if (0xD800..0xDC00).contains(&unit) {
            if raw.get(i..i + 2) != Some(b"\\u") {
                return None;
            }
            let low = hex4(raw.get(i + 2..i + 6)?)?;
            if !(0xDC00..0xE000).contains(&low) {
                return None;
            }
            i += 6;
            0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
        } else {
            unit
        };
        let c = char::from_u32(code)?;
        emit(c.encode_utf8(&mut [0; 4]).as_bytes());
    }
    Some(())
}

fn hex4(digits: &[u8]) -> Option<u32> {
    digits
        .iter()
        .try_fold(0u32, |acc, &d| Some(acc * 16 + (d as char).to_digit(16)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_what_serde_json_does() {
        for body in [
            "",
            "plain",
            r#"\"\\\/\b\f\n\r\t"#,
            r"caf\u00e9 e\u0301 \u00E9",
            r"\ud834\udd1e astral",
            r"\u0000nul",
            r"mixed \n run \u0041\u0042 end",
        ] {
            let expected: String = serde_json::from_str(&format!("\"{body}\"")).unwrap();
            assert_eq!(
                unescape(body.as_bytes()).as_deref(),
                Some(expected.as_bytes()),
                "{body}"
            );
        }
    }

    #[test]
    fn a_lone_surrogate_has_no_bytes() {
        for body in [
            r"\ud800",
            r"\udc00",
            r"\ud800x",
            r"\ud800\u0041",
            r"\ud800\ud800",
        ] {
            assert_eq!(unescape(body.as_bytes()), None, "{body}");
        }
    }
}
