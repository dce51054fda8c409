//! Reading a connection string as libpq does: `key=value` pairs (with
//! libpq's quoting) or a `postgres://` URL. The TLS keys (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`, `sslpassword`) are taken out
//! ([`TlsKeys`]); the rest is handed to tokio-postgres as written.

use std::error::Error as StdError;
use std::fmt;

/// A connection string that does not parse, or asks for what loom cannot
/// do. Its message never repeats the string (it may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PostgreSQL connection string: {reason}")]
pub struct ParseConnectionStringError {
    reason: String,
}

impl ParseConnectionStringError {
    pub(super) fn new(reason: impl Into<String>) -> Self {
        ParseConnectionStringError {
            reason: reason.into(),
        }
    }

    /// tokio-postgres's own messages name keys, never values.
    pub(super) fn from_tokio(e: &tokio_postgres::Error) -> Self {
        Self::new(
            e.source()
                .map_or_else(|| e.to_string(), ToString::to_string),
        )
    }
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const ALL: [SslMode; 6] = [
        SslMode::Disable,
        SslMode::Allow,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// libpq compares exactly (no case folding), and so does loom: an
    /// unknown mode is refused, never read as a weaker one.
    fn parse(value: &str) -> Result<Self, ParseConnectionStringError> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or_else(|| {
                ParseConnectionStringError::new(format!(
                    "unknown sslmode {value:?}: expected disable, allow, prefer, require, verify-ca or verify-full"
                ))
            })
    }
}

/// The TLS keys taken out of a connection string.
#[derive(Default, Clone, PartialEq, Eq)]
pub(super) struct TlsKeys {
    pub(super) mode: Option<SslMode>,
    pub(super) root_cert: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
    pub(super) password: Option<String>,
}

impl fmt::Debug for TlsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsKeys")
            .field("mode", &self.mode)
            .field("root_cert", &self.root_cert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .finish()
    }
}

impl TlsKeys {
    /// Takes `key` when it is a TLS key (true); any other is left for
    /// tokio-postgres. An empty file name means none, as in libpq.
    fn take(&mut self, key: &str, value: String) -> Result<bool, ParseConnectionStringError> {
        let file = |value: String| (!value.is_empty()).then_some(value);
        match key {
            "sslmode" => self.mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => self.root_cert = file(value),
            "sslcert" => self.cert = file(value),
            "sslkey" => self.key = file(value),
            "sslpassword" => self.password = Some(value),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A connection string split in two: what tokio-postgres parses (as
/// written), and the TLS keys.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Split {
    pub(super) rest: String,
    pub(super) tls: TlsKeys,
}

pub(super) fn split(conninfo: &str) -> Result<Split, ParseConnectionStringError> {
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        split_url(conninfo)
    } else {
        split_keyword_value(conninfo)
    }
}

/// libpq's `key = value …` syntax: spaces around `=` allowed, a value
/// either bare (up to white space) or in single quotes, `\` escaping the
/// next character in both. A repeated key keeps its last value, as libpq
/// does (tokio-postgres would add a second host or port instead).
fn split_keyword_value(s: &str) -> Result<Split, ParseConnectionStringError> {
    let mut tls = TlsKeys::default();
    let mut kept: Vec<(&str, &str)> = Vec::new();
    let mut chars = s.char_indices().peekable();
    let position = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        chars.peek().map_or(s.len(), |&(i, _)| i)
    };
    loop {
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let start = position(&mut chars);
        if start == s.len() {
            break;
        }
        while chars
            .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
            .is_some()
        {}
        let key = &s[start..position(&mut chars)];
        if key.is_empty() {
            return Err(ParseConnectionStringError::new(
                "\"=\" without a key before it",
            ));
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            return Err(ParseConnectionStringError::new(format!(
                "missing \"=\" after {key:?}"
            )));
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let value = if chars.next_if(|&(_, c)| c == '\'').is_some() {
            quoted_value(&mut chars).ok_or_else(|| {
                ParseConnectionStringError::new(format!("unterminated quoted value of {key:?}"))
            })?
        } else {
            bare_value(&mut chars)
        };
        let raw = &s[start..position(&mut chars)];
        if !tls.take(key, value)? {
            kept.retain(|(k, _)| *k != key);
            kept.push((key, raw));
        }
    }
    let rest = kept
        .iter()
        .map(|(_, raw)| *raw)
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Split { rest, tls })
}

/// After the opening quote, up to and past the closing one; `None` when
/// there is none.
fn quoted_value(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> Option<String> {
    let mut value = String::new();
    loop {
        match chars.next()?.1 {
            '\'' => return Some(value),
            '\\' => value.push(chars.next()?.1),
            c => value.push(c),
        }
    }
}

fn bare_value(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> String {
    let mut value = String::new();
    while let Some((_, c)) = chars.next_if(|&(_, c)| !c.is_whitespace()) {
        if c == '\\' {
            if let Some((_, escaped)) = chars.next() {
                value.push(escaped);
            }
        } else {
            value.push(c);
        }
    }
    value
}

/// A `postgres://` URL: TLS keys come out of its query (percent-decoded);
/// the rest of the URL is left as written.
fn split_url(s: &str) -> Result<Split, ParseConnectionStringError> {
    let mut tls = TlsKeys::default();
    // As tokio-postgres reads it: user info up to the first '@', then the
    // query from the first '?' after it.
    let after_user = s.find('@').map_or(0, |at| at + 1);
    let Some(question) = s[after_user..].find('?').map(|i| after_user + i) else {
        return Ok(Split {
            rest: s.to_owned(),
            tls,
        });
    };
    let mut kept: Vec<(String, &str)> = Vec::new();
    for param in s[question + 1..].split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').ok_or_else(|| {
            ParseConnectionStringError::new("a URL query parameter without \"=\"")
        })?;
        let key = percent_decode(key)?;
        if !tls.take(&key, percent_decode(value)?)? {
            kept.retain(|(k, _)| *k != key);
            kept.push((key, param));
        }
    }
    let mut rest = s[..question].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.iter().map(|(_, p)| *p).collect::<Vec<_>>().join("&"));
    }
    Ok(Split { rest, tls })
}

/// `%XX` to its byte; a `%` not followed by two hex digits stays as it is
/// (as tokio-postgres's decoder leaves it).
fn percent_decode(s: &str) -> Result<String, ParseConnectionStringError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        match (bytes[i], hex) {
            (b'%', Some(hex)) => {
                let hex = std::str::from_utf8(hex).expect("ASCII hex digits");
                out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| {
        ParseConnectionStringError::new("a URL query parameter is not UTF-8 once decoded")
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_postgres::config::Host;
    use tokio_postgres::Config;

    use super::*;
    use crate::pg_connect::pg_pool;
    use crate::Error;

    fn keys(mode: Option<SslMode>) -> TlsKeys {
        TlsKeys {
            mode,
            ..TlsKeys::default()
        }
    }

    #[test]
    fn reads_every_libpq_sslmode() {
        for mode in SslMode::ALL {
            let split = split(&format!("host=db sslmode={} user=app", mode.as_str())).unwrap();
            assert_eq!(split.rest, "host=db user=app");
            assert_eq!(split.tls, keys(Some(mode)));
        }
        assert_eq!(split("host=db").unwrap().tls, keys(None));
    }

    #[test]
    fn refuses_an_unknown_sslmode_rather_than_a_weaker_one() {
        for bad in ["verify_full", "VERIFY-FULL", "Require", "", "on"] {
            let err = split(&format!("host=db sslmode='{bad}'")).unwrap_err();
            assert!(err.to_string().contains("unknown sslmode"), "{bad}: {err}");
            let url = format!("postgres://db/app?sslmode={bad}");
            assert!(split(&url).is_err(), "{url}");
        }
        // Through the pool builder, typed.
        assert!(matches!(
            pg_pool("host=db sslmode=verify-fool", 1),
            Err(Error::InvalidConnectionString(_))
        ));
    }

    #[test]
    fn reads_quoted_and_escaped_values_as_libpq_does() {
        let split = split(
            r"host = db  sslrootcert='/etc/my certs/ca \'x\'.pem' sslcert=/a\ b.crt sslkey=''  password='p w' dbname=app",
        )
        .unwrap();
        assert_eq!(
            split.tls.root_cert.as_deref(),
            Some("/etc/my certs/ca 'x'.pem")
        );
        assert_eq!(split.tls.cert.as_deref(), Some("/a b.crt"));
        assert_eq!(split.tls.key, None, "an empty file name is none");
        // The rest is handed on as written, quotes and all.
        assert_eq!(split.rest, "host = db password='p w' dbname=app");
        let config: Config = split.rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"p w"[..]));
        assert_eq!(config.get_dbname(), Some("app"));
    }

    #[test]
    fn refuses_broken_key_value_strings_without_echoing_them() {
        for bad in ["host", "=db", "host=db sslrootcert='/x", "sslmode"] {
            assert!(split(bad).is_err(), "{bad}");
        }
        let err = split("password='s3cret sslmode=require").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn keeps_the_last_of_a_repeated_key_as_libpq_does() {
        let split = split("host=a port=1 host=b sslmode=disable sslmode=verify-full").unwrap();
        assert_eq!(split.rest, "port=1 host=b");
        assert_eq!(split.tls.mode, Some(SslMode::VerifyFull));
        let config: Config = split.rest.parse().unwrap();
        assert_eq!(config.get_hosts(), [Host::Tcp("b".to_owned())]);
    }

    #[test]
    fn takes_tls_keys_out_of_url_queries() {
        let split = split(
            "postgresql://u:p%3Fw@db:5433/app?application_name=x&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca%20b.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(split.tls.mode, Some(SslMode::VerifyCa));
        assert_eq!(split.tls.root_cert.as_deref(), Some("/etc/ca b.pem"));
        assert_eq!(
            split.rest,
            "postgresql://u:p%3Fw@db:5433/app?application_name=x&connect_timeout=3"
        );
        let config: Config = split.rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"p?w"[..]));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
        // Only TLS keys: no '?' left; none at all: as written.
        assert_eq!(
            super::split("postgres://db/app?sslmode=require")
                .unwrap()
                .rest,
            "postgres://db/app"
        );
        assert_eq!(
            super::split("postgres://db/app").unwrap(),
            Split {
                rest: "postgres://db/app".to_owned(),
                tls: TlsKeys::default()
            }
        );
        // A '?' in the user info (encoded or not) is not the query.
        assert_eq!(
            super::split("postgres://u:a?b@db/app?sslmode=disable")
                .unwrap()
                .rest,
            "postgres://u:a?b@db/app"
        );
        assert!(super::split("postgres://db/app?sslmode").is_err());
    }

    #[test]
    fn decodes_percent_escapes_and_leaves_stray_percents() {
        assert_eq!(percent_decode("a%20b%2fc").unwrap(), "a b/c");
        assert_eq!(percent_decode("100%").unwrap(), "100%");
        assert_eq!(percent_decode("%+1x").unwrap(), "%+1x");
        assert_eq!(percent_decode("%C3%A9").unwrap(), "é");
        assert!(percent_decode("%FF").is_err());
    }
}
