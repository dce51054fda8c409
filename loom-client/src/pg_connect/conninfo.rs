//! Reading a connection string as libpq does: `key=value` pairs (with
//! libpq's quoting) or a `postgres://` URL. The TLS keys (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`, `sslpassword`) are taken out
//! ([`TlsKeys`]); the rest is handed to tokio-postgres as written.

use std::error::Error as StdError;
use std::fmt;

/// A connection string that does not parse, or asks for what loom cannot
/// do. Its message never repeats any of the string: not the string, a
/// value, nor a key (a password with a space in it reads as a value and a
/// key). It says what is wrong, where (which pair or query parameter), and
/// the key only when it is one of the known names below, printed from this
/// file's lists, never from the input: every part is `'static` text or a
/// number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseConnectionStringError {
    reason: &'static str,
    key: Option<&'static str>,
    place: Option<Place>,
}

/// Where in a connection string, counted from 1. An ordinal, never a byte
/// offset: an offset past a password would tell its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The n-th `key=value` pair (or the word where one should be).
    Pair(usize),
    /// The n-th parameter of a URL's query.
    QueryParameter(usize),
}

impl fmt::Display for ParseConnectionStringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid PostgreSQL connection string: ")?;
        match self.place {
            Some(Place::Pair(n)) => write!(f, "key=value pair {n}: ")?,
            Some(Place::QueryParameter(n)) => write!(f, "URL query parameter {n}: ")?,
            None => {}
        }
        f.write_str(self.reason)?;
        if let Some(key) = self.key {
            write!(f, " ({key})")?;
        }
        Ok(())
    }
}

impl StdError for ParseConnectionStringError {}

/// The keys tokio-postgres 0.7 reads (`Config::param`); loom takes the
/// TLS ones out first. Any other key is refused here, where its offset is
/// known, rather than by tokio-postgres, whose message quotes it.
const TOKIO_KEYS: [&str; 19] = [
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// libpq keys that neither loom nor tokio-postgres implements: named in
/// the refusal, as a hint that the string came from psql.
const UNSUPPORTED_LIBPQ_KEYS: [&str; 22] = [
    "passfile",
    "require_auth",
    "sslcompression",
    "sslcertmode",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslkeylogfile",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "requirepeer",
    "gssencmode",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "client_encoding",
    "fallback_application_name",
    "replication",
    "requiressl",
    "min_protocol_version",
    "max_protocol_version",
];

impl ParseConnectionStringError {
    pub(super) fn new(reason: &'static str) -> Self {
        ParseConnectionStringError {
            reason,
            key: None,
            place: None,
        }
    }

    fn at(reason: &'static str, place: Place) -> Self {
        ParseConnectionStringError {
            place: Some(place),
            ..Self::new(reason)
        }
    }

    /// A key tokio-postgres does not read, named only when it is one of
    /// libpq's.
    fn unknown_key(key: &str, at: Place) -> Self {
        match UNSUPPORTED_LIBPQ_KEYS.iter().find(|k| **k == key) {
            Some(known) => ParseConnectionStringError {
                key: Some(known),
                ..Self::at("a libpq key loom does not support", at)
            },
            None => Self::at("unknown key", at),
        }
    }

    /// tokio-postgres's refusal of what loom handed it, in its own words
    /// only where those are fixed text or name one of [`TOKIO_KEYS`]: some
    /// of its messages quote the input (an unknown key, an unexpected
    /// character).
    pub(super) fn from_tokio(e: &tokio_postgres::Error) -> Self {
        let said = e
            .source()
            .map_or_else(|| e.to_string(), ToString::to_string);
        if let Some(key) = said
            .strip_prefix("invalid value for option `")
            .and_then(|rest| rest.strip_suffix('`'))
            .and_then(|key| TOKIO_KEYS.iter().find(|k| **k == key))
        {
            return ParseConnectionStringError {
                key: Some(key),
                ..Self::new("invalid value")
            };
        }
        const FIXED: [&str; 4] = [
            "unexpected EOF",
            "unterminated quoted connection parameter value",
            "unterminated parameter",
            "invalid percent encoding",
        ];
        match FIXED.iter().find(|fixed| **fixed == said) {
            Some(fixed) => Self::new(fixed),
            None if said.starts_with("unknown option") => Self::new("unknown key"),
            None => Self::new(
                "tokio-postgres cannot read it (its message is withheld: it may quote the string)",
            ),
        }
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
    fn parse(value: &str) -> Result<Self, &'static str> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or(
            "unknown sslmode: expected disable, allow, prefer, require, verify-ca or verify-full",
        )
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
    /// Takes `key`, which is at `at`, when it is a TLS key (true);
    /// one of [`TOKIO_KEYS`] is left for tokio-postgres (false), any other
    /// refused. An empty file name means none, as in libpq.
    fn take(
        &mut self,
        key: &str,
        value: String,
        at: Place,
    ) -> Result<bool, ParseConnectionStringError> {
        let file = |value: String| (!value.is_empty()).then_some(value);
        match key {
            "sslmode" => {
                let mode = SslMode::parse(&value)
                    .map_err(|reason| ParseConnectionStringError::at(reason, at))?;
                self.mode = Some(mode);
            }
            "sslrootcert" => self.root_cert = file(value),
            "sslcert" => self.cert = file(value),
            "sslkey" => self.key = file(value),
            "sslpassword" => self.password = Some(value),
            _ if TOKIO_KEYS.contains(&key) => return Ok(false),
            _ => return Err(ParseConnectionStringError::unknown_key(key, at)),
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
    let mut pair = 0;
    loop {
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let start = position(&mut chars);
        if start == s.len() {
            break;
        }
        pair += 1;
        let here = Place::Pair(pair);
        while chars
            .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
            .is_some()
        {}
        let key = &s[start..position(&mut chars)];
        if key.is_empty() {
            return Err(ParseConnectionStringError::at(
                "\"=\" without a key before it",
                here,
            ));
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            return Err(ParseConnectionStringError::at(
                "a word without \"=\" (a connection string is key=value pairs, or a postgres:// or postgresql:// URL)",
                here,
            ));
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let value = if chars.next_if(|&(_, c)| c == '\'').is_some() {
            quoted_value(&mut chars)
                .ok_or_else(|| ParseConnectionStringError::at("unterminated quoted value", here))?
        } else {
            bare_value(&mut chars)
        };
        let raw = &s[start..position(&mut chars)];
        if !tls.take(key, value, here)? {
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
    for (n, param) in s[question + 1..]
        .split('&')
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        let param_at = Place::QueryParameter(n + 1);
        let (key, value) = param.split_once('=').ok_or_else(|| {
            ParseConnectionStringError::at("a URL query parameter without \"=\"", param_at)
        })?;
        let decode = |text| {
            percent_decode(text).ok_or_else(|| {
                ParseConnectionStringError::at(
                    "a URL query parameter is not UTF-8 once decoded",
                    param_at,
                )
            })
        };
        let key = decode(key)?;
        if !tls.take(&key, decode(value)?, param_at)? {
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
/// (as tokio-postgres's decoder leaves it). `None` when the bytes are not
/// UTF-8.
fn percent_decode(s: &str) -> Option<String> {
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
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_postgres::config::Host;
    use tokio_postgres::Config;

    use super::*;
    use crate::{Error, PgPool};

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
            PgPool::connect("host=db sslmode=verify-fool"),
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

    /// Issue 25, item 7: a string that does not parse was echoed, password
    /// and all ("missing \"=\" after \"postgre://app:pw@db1/app\""), and
    /// so were the words of a password with a space in it (read as a key),
    /// an sslmode's value, and tokio-postgres's quotes of unknown keys.
    /// Each is refused by where and what, through the pool builder too.
    #[test]
    fn refusals_say_where_and_never_quote_the_string() {
        let cases = [
            ("postgre://app:hunter2@db1/app", Place::Pair(1)),
            ("host=db1 password=hunter2 bogus", Place::Pair(3)),
            ("host=db1 password=my hunter2=x", Place::Pair(3)),
            ("host=db1 password='hunter2", Place::Pair(2)),
            ("host=db1 sslmode=hunter2", Place::Pair(2)),
            ("host=db1 =hunter2", Place::Pair(2)),
            (
                "postgres://app:hunter2@db1/app?hunter2=1",
                Place::QueryParameter(1),
            ),
            (
                "postgres://app:hunter2@db1/app?sslmode=hunter2",
                Place::QueryParameter(1),
            ),
            (
                "postgres://app:hunter2@db1/app?user=x&&hunter2",
                Place::QueryParameter(2),
            ),
            (
                "postgres://app:hunter2@db1/app?%FFhunter2=1",
                Place::QueryParameter(1),
            ),
        ];
        for (bad, place) in cases {
            let err = split(bad).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{bad}: {shown}");
            assert_eq!(err.place, Some(place), "{bad}: {shown}");
        }
        // Where is an ordinal: a byte offset past the password would tell
        // its length.
        assert_eq!(
            split("password=a bogus").unwrap_err(),
            split("password=a-much-longer-one bogus").unwrap_err()
        );
        // What tokio-postgres refuses once loom handed the string on.
        for bad in [
            "postgres://app:hunter2@db1:hunter2/app",
            "postgres://app:hunter2@[db1/app",
            "postgres://app:hunter2@db1/%FFhunter2",
            "host=db1 port=hunter2 password=hunter2",
            "host=db1 password=hunter2 connect_timeout=hunter2",
        ] {
            let err = PgPool::connect(bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidConnectionString(_)),
                "{bad}: {err}"
            );
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{bad}: {shown}");
        }
        // A key named only when it is one of libpq's, from loom's own list.
        let err = split("host=db1 sslcrl=/x.pem").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid PostgreSQL connection string: key=value pair 2: a libpq key loom does not support (sslcrl)"
        );
        let err = PgPool::connect("host=db1 port=x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid PostgreSQL connection string: invalid value (port)"
        );
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
        assert!(percent_decode("%FF").is_none());
    }
}
