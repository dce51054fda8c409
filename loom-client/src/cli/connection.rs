//! Where the `loom` command connects, found as PostgreSQL's own tools find
//! it: `--db`, else `LOOM_DB`, else `DATABASE_URL`, else libpq's `PG*`
//! variables (`PGHOST`, `PGPORT`, `PGDATABASE`, `PGUSER`, `PGPASSWORD`,
//! `PGSSLMODE`, ...). A PostgreSQL connection with no password takes one
//! from the password file, as libpq does (`PGPASSFILE`, else `~/.pgpass`;
//! ignored, with a word, when others may read it), so that no password
//! need go on the command line, where `ps` shows it.

use std::path::{Path, PathBuf};

use super::is_postgres;

/// libpq's variables and the connection keys they stand for.
const PG_VARIABLES: [(&str, &str); 14] = [
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
    ("PGPORT", "port"),
    ("PGDATABASE", "dbname"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGSSLCERT", "sslcert"),
    ("PGSSLKEY", "sslkey"),
    ("PGAPPNAME", "application_name"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGOPTIONS", "options"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
];

/// Why no database was found: a usage error.
pub(super) const NO_DATABASE: &str = "no database: give --db, or set LOOM_DB, DATABASE_URL or libpq's PG* variables (PGHOST, PGDATABASE, PGUSER, ...)";

/// The database to use, from `flag` or the environment `var` reads, with
/// a password from the password file where a PostgreSQL one has none.
/// `Err` (a usage error) when nothing names one.
///
/// `os_user` is who the connection is made as when it names no user: the
/// effective user's name from the system's user database, which libpq and
/// tokio-postgres both take (never `$USER`, which anyone can set). Where it
/// is the lookup's user, it is added to the string with the password, so
/// that the server is asked for the very user the password is for.
pub(super) fn resolve(
    flag: Option<String>,
    var: &impl Fn(&str) -> Option<String>,
    os_user: Option<String>,
) -> Result<String, &'static str> {
    let named = [flag, var("LOOM_DB"), var("DATABASE_URL")]
        .into_iter()
        .flatten()
        .find(|db| !db.trim().is_empty());
    let db = match named {
        Some(db) => {
            unused_pg_variables(var);
            db
        }
        None => from_pg_variables(var).ok_or(NO_DATABASE)?,
    };
    if !is_postgres(&db) {
        return Ok(db);
    }
    let Some(lookup) = crate::pg_connect::password_lookup(&db, os_user) else {
        return Ok(db);
    };
    let Some(text) = password_file(var).and_then(|file| read_password_file(&file)) else {
        return Ok(db);
    };
    // libpq finds a password for each host: a string naming several whose
    // lines differ gets none, so that a host is never sent another's.
    let found: Vec<Option<String>> = lookup
        .hosts
        .iter()
        .map(|(host, port)| find_password(&text, host, *port, &lookup.dbname, &lookup.user))
        .collect();
    match found.split_first() {
        Some((Some(first), rest)) if rest.iter().all(|p| p.as_ref() == Some(first)) => Ok(
            added_cleanly(&db, lookup.user_defaulted.then_some(&*lookup.user), first).unwrap_or(db),
        ),
        _ if found.iter().any(Option::is_some) => {
            eprintln!(
                "loom: WARNING: the password file has different passwords (or none) for the connection's hosts: none is used; give them in the connection string"
            );
            Ok(db)
        }
        _ => Ok(db),
    }
}

/// Says, naming no value, which libpq variables go unused: libpq applies
/// them as defaults under any connection string, loom only where none is
/// given, so a `PGSSLMODE=verify-full` beside `--db` would otherwise be
/// dropped without a word.
fn unused_pg_variables(var: &impl Fn(&str) -> Option<String>) {
    let unused: Vec<&str> = PG_VARIABLES
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| var(name).is_some_and(|v| !v.is_empty()))
        .collect();
    if !unused.is_empty() {
        eprintln!(
            "loom: WARNING: {} set, but --db, LOOM_DB or DATABASE_URL names the database: they are not applied; put what they say in the connection string",
            unused.join(", ")
        );
    }
}

/// A key=value connection string from libpq's variables; `None` when none
/// of those that say where to connect is set. What libpq defaults the
/// others to: host `localhost` here; the OS user, and a database named
/// after the user, by tokio-postgres and the server as by libpq.
fn from_pg_variables(var: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let set: Vec<(&str, String)> = PG_VARIABLES
        .iter()
        .filter_map(|(name, key)| var(name).filter(|v| !v.is_empty()).map(|v| (*key, v)))
        .collect();
    let locates = ["host", "hostaddr", "port", "dbname", "user"];
    if !set.iter().any(|(key, _)| locates.contains(key)) {
        return None;
    }
    let mut parts: Vec<String> = set.iter().map(|(key, value)| pair(key, value)).collect();
    let has = |key: &str| set.iter().any(|(k, _)| *k == key);
    if !has("host") && !has("hostaddr") {
        parts.push(pair("host", "localhost"));
    }
    Some(parts.join(" "))
}

/// `key='value'`, the value quoted as libpq reads it.
fn pair(key: &str, value: &str) -> String {
    format!(
        "{key}='{}'",
        value.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

/// The password file libpq would read: `PGPASSFILE`, else `.pgpass` in
/// the home directory.
fn password_file(var: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    var("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| Path::new(&home).join(".pgpass")))
}

/// The password file's text; `None` when it is missing, unreadable, not a
/// plain file, or readable by group or others (libpq ignores such a file
/// too, and says so).
fn read_password_file(path: &Path) -> Option<String> {
    let metadata = std::fs::metadata(path).ok()?;
    if !metadata.is_file() {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if metadata.permissions().mode() & 0o077 != 0 {
            eprintln!(
                "loom: WARNING: password file {} has group or world access; permissions should be u=rw (0600) or less: ignored",
                path.display()
            );
            return None;
        }
    }
    // Bytes that are not UTF-8 read as U+FFFD, which [`find_password`]
    // stops at: a line is neither skipped (a later line would then be
    // "first") nor the whole file lost.
    Some(String::from_utf8_lossy(&std::fs::read(path).ok()?).into_owned())
}

/// The password of the first line of a password file that matches
/// `host`, `port`, the database and the user, as libpq reads the file:
/// `hostname:port:database:username:password`, each of the first four a
/// value or a bare `*` (an escaped `\*` is a star, not a wildcard), `\`
/// escaping `:` and `\`; the password ends at the next bare `:`; `#`
/// starts a comment line.
fn find_password(text: &str, host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        let [h, p, d, u, password] = fields.as_slice() else {
            continue;
        };
        let matches = |(field, wildcard): &(String, bool), value: &str| *wildcard || field == value;
        if matches(h, host) && matches(p, &port) && matches(d, dbname) && matches(u, user) {
            // The line libpq would use holds bytes that are not UTF-8: its
            // password cannot go into a connection string, and no later
            // line's may stand in for it.
            if line.contains(char::REPLACEMENT_CHARACTER) {
                eprintln!(
                    "loom: WARNING: the password file's line for this connection is not UTF-8: no password is used"
                );
                return None;
            }
            return Some(password.0.clone());
        }
    }
    None
}

/// A password file line's fields, each with whether it is a bare `*`:
/// split at each `:` not escaped, `\:` and `\\` read as `:` and `\`; what
/// follows the fifth field's bare `:` is not its own. A line of fewer than
/// five gives fewer (and matches nothing).
fn split_fields(line: &str) -> Vec<(String, bool)> {
    let mut fields: Vec<(String, bool)> = vec![(String::new(), false)];
    let mut escaped = false;
    let mut chars = line.chars();
    let bare_star = |field: &(String, bool), escaped: bool| !escaped && field.0 == "*";
    while let Some(c) = chars.next() {
        let current = fields.len() - 1;
        match c {
            // A `\` escapes what follows it; a last one is itself (libpq).
            '\\' => {
                escaped = true;
                fields[current].0.push(chars.next().unwrap_or('\\'));
            }
            ':' => {
                fields[current].1 = bare_star(&fields[current], escaped);
                if fields.len() == 5 {
                    return fields;
                }
                fields.push((String::new(), false));
                escaped = false;
            }
            c => fields[current].0.push(c),
        }
    }
    let current = fields.len() - 1;
    fields[current].1 = bare_star(&fields[current], escaped);
    fields
}

/// `db` with `password` (and `user`, where the lookup supplied it) added,
/// only when the result reads back as `db` plus those, every other field
/// as it was: a `db` ending in a backslash (`user=svc\`) or a URL whose
/// `?` is not the query's would otherwise make the password part of the
/// user, database or host name, which the server echoes in its refusal
/// and the command prints. `None` then: nothing is added, and the server
/// asks for a password.
fn added_cleanly(db: &str, user: Option<&str>, password: &str) -> Option<String> {
    use tokio_postgres::Config;
    let with_user = match user {
        Some(user) => with_key(db, "user", user),
        None => db.to_owned(),
    };
    let with = with_key(&with_user, "password", password);
    let (before, after): (Config, Config) = (db.parse().ok()?, with.parse().ok()?);
    let user_as_meant = match user {
        Some(user) => before.get_user().is_none() && after.get_user() == Some(user),
        None => before.get_user() == after.get_user(),
    };
    let same = user_as_meant
        && before.get_dbname() == after.get_dbname()
        && before.get_hosts() == after.get_hosts()
        && before.get_ports() == after.get_ports()
        && before.get_options() == after.get_options()
        && before.get_application_name() == after.get_application_name();
    (same && after.get_password() == Some(password.as_bytes())).then_some(with)
}

/// `db` with `key` set to `value`: a key=value pair, or a URL's query
/// parameter, percent-encoded.
fn with_key(db: &str, key: &str, value: &str) -> String {
    if db.starts_with("postgres://") || db.starts_with("postgresql://") {
        let encoded: String = value
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let separator = if db.contains('?') { '&' } else { '?' };
        format!("{db}{separator}{key}={encoded}")
    } else {
        format!("{db} {}", pair(key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// [`resolve`] as the command runs it, the OS user being `os-user`.
    fn resolve(
        flag: Option<String>,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<String, &'static str> {
        super::resolve(flag, var, Some("os-user".to_owned()))
    }

    fn with_password(db: &str, password: &str) -> String {
        with_key(db, "password", password)
    }

    /// Review: a string ending in a backslash escaped the space before
    /// the added password, which became part of the user's name.
    #[test]
    fn a_password_is_added_only_where_it_reads_back_as_the_password() {
        assert_eq!(
            added_cleanly("host=db user=svc", None, "s3cret").as_deref(),
            Some("host=db user=svc password='s3cret'")
        );
        assert_eq!(
            added_cleanly(r"host=db dbname=app user=svc\", None, "s3cret"),
            None
        );
        assert_eq!(
            added_cleanly(r"host=db user=svc dbname=app\", None, "s3cret"),
            None
        );
        assert!(added_cleanly("postgres://svc@db/app", None, "p@ss").is_some());
        // The user the password was looked up for goes with it; a string
        // that would read it otherwise gets neither.
        assert_eq!(
            added_cleanly("host=db", Some("os-user"), "s3cret").as_deref(),
            Some("host=db user='os-user' password='s3cret'")
        );
        assert_eq!(
            added_cleanly("postgres://db/app", Some("o s"), "x").as_deref(),
            Some("postgres://db/app?user=o%20s&password=x")
        );
        assert_eq!(
            added_cleanly(r"host=db dbname=app\", Some("os-user"), "s3cret"),
            None
        );
    }

    #[test]
    fn the_flag_then_loom_db_then_database_url_then_pg_variables() {
        let all = [
            ("LOOM_DB", "host=from-loom-db"),
            ("DATABASE_URL", "postgres://from-url/app"),
            ("PGHOST", "from-pghost"),
        ];
        assert_eq!(
            resolve(Some("host=flag".into()), &env(&all)).unwrap(),
            "host=flag"
        );
        assert_eq!(resolve(None, &env(&all)).unwrap(), "host=from-loom-db");
        assert_eq!(
            resolve(None, &env(&all[1..])).unwrap(),
            "postgres://from-url/app"
        );
        assert_eq!(
            resolve(
                None,
                &env(&[("PGHOST", "db"), ("PGPORT", "6432"), ("PGUSER", "o'neil")])
            )
            .unwrap(),
            r"host='db' port='6432' user='o\'neil'"
        );
        // No user is the OS user, as the driver finds it: never `$USER`.
        assert_eq!(
            resolve(None, &env(&[("PGDATABASE", "app"), ("USER", "svc")])).unwrap(),
            "dbname='app' host='localhost'"
        );
        assert_eq!(
            resolve(None, &env(&[("PGSSLMODE", "require")])),
            Err(NO_DATABASE)
        );
        assert_eq!(resolve(None, &env(&[])), Err(NO_DATABASE));
    }

    #[test]
    fn a_quoted_value_stays_one_value_whatever_it_holds() {
        // A variable's quote, space or backslash cannot add a key.
        let db = resolve(
            None,
            &env(&[
                ("PGHOST", "db"),
                ("PGUSER", r"o'neil sslmode=disable \x"),
                ("PGDATABASE", "app"),
            ]),
        )
        .unwrap();
        let lookup = crate::pg_connect::password_lookup(&db, None).unwrap();
        assert_eq!(lookup.user, r"o'neil sslmode=disable \x");
        assert_eq!(lookup.dbname, "app");
        assert_eq!(lookup.hosts, [("db".to_owned(), 5432)]);
        let with = with_password(&db, r"it's \ a=b");
        assert!(
            crate::pg_connect::password_lookup(&with, None).is_none(),
            "a password now"
        );
    }

    #[test]
    fn a_password_file_line_matches_as_libpq_reads_it() {
        let file = "# comment\n\
                    other:5432:app:svc:wrong\n\
                    db:*:app:svc:pa\\:ss\\\\word:comment after a bare colon\n\
                    \\*:5432:stars:svc:not a wildcard\n\
                    *:*:*:*:fallback\n";
        let find = |host, db| find_password(file, host, 5432, db, "svc");
        assert_eq!(find("db", "app").as_deref(), Some(r"pa:ss\word"));
        assert_eq!(find("db", "other").as_deref(), Some("fallback"));
        assert_eq!(find("*", "stars").as_deref(), Some("not a wildcard"));
        assert_eq!(
            find("db", "stars").as_deref(),
            Some("fallback"),
            "an escaped * is a star"
        );
        assert_eq!(
            find_password("db:5433:app:svc:x\n", "db", 5432, "app", "svc"),
            None
        );
        assert_eq!(
            find_password("db:5432:app:svc\n", "db", 5432, "app", "svc"),
            None,
            "four fields"
        );
    }

    /// Review: a lone last `\` was dropped (libpq keeps it), one byte
    /// that is not UTF-8 anywhere lost the whole file, and skipping such a
    /// line made a later one "first".
    #[cfg(unix)]
    #[test]
    fn a_password_file_is_read_as_bytes_line_by_line_as_libpq_reads_it() {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            find_password("db:5432:app:svc:ends\\\n", "db", 5432, "app", "svc").as_deref(),
            Some("ends\\")
        );
        let dir = std::env::temp_dir().join(format!("loom-pgpass-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(
            &file,
            b"db:5432:other:svc:caf\xe9\ndb:5432:app:svc:s3cret\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let vars = [("PGPASSFILE", file.to_str().unwrap())];
        assert_eq!(
            resolve(Some("host=db user=svc dbname=app".into()), &env(&vars)).unwrap(),
            "host=db user=svc dbname=app password='s3cret'"
        );
        std::fs::write(&file, b"db:5432:app:svc:caf\xe9\n*:*:*:svc:other\n").unwrap();
        assert_eq!(
            resolve(Some("host=db user=svc dbname=app".into()), &env(&vars)).unwrap(),
            "host=db user=svc dbname=app",
            "the first matching line is not UTF-8: no password, not the next line's"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_password_is_added_quoted_or_percent_encoded() {
        assert_eq!(
            with_password("host=db user=svc", "a b'c"),
            r"host=db user=svc password='a b\'c'"
        );
        assert_eq!(
            with_password("postgres://svc@db/app", "p@ss/w:d"),
            "postgres://svc@db/app?password=p%40ss%2Fw%3Ad"
        );
        assert_eq!(
            with_password("postgres://svc@db/app?sslmode=require", "x"),
            "postgres://svc@db/app?sslmode=require&password=x"
        );
    }

    #[cfg(unix)]
    #[test]
    fn the_password_file_fills_in_a_missing_password_and_is_ignored_when_others_can_read_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("loom-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(&file, "db:5432:app:svc:s3cret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let path = file.to_str().unwrap();
        let vars = [("PGPASSFILE", path)];
        assert_eq!(
            resolve(Some("host=db user=svc dbname=app".into()), &env(&vars)).unwrap(),
            "host=db user=svc dbname=app password='s3cret'"
        );
        // A password given wins; another database finds none.
        assert_eq!(
            resolve(
                Some("host=db user=svc dbname=app password=given".into()),
                &env(&vars)
            )
            .unwrap(),
            "host=db user=svc dbname=app password=given"
        );
        assert_eq!(
            resolve(Some("host=db user=svc dbname=other".into()), &env(&vars)).unwrap(),
            "host=db user=svc dbname=other"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            resolve(Some("host=db user=svc dbname=app".into()), &env(&vars)).unwrap(),
            "host=db user=svc dbname=app"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn each_host_gets_its_own_password_or_none_and_libpq_s_defaults_hold() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("loom-pgpass-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(
            &file,
            "b:5432:app:svc:pwB\na:5432:app:svc:pwA\nc:5432:app:svc:pwB\n\
             localhost:5432:app:svc:socket\n/srv/pg:5432:app:svc:other-socket\n\
             db:5432:app:os-user:from-os-user\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let path = file.to_str().unwrap();
        let vars = [("PGPASSFILE", path), ("USER", "svc")];
        let resolved = |db: &str| resolve(Some(db.to_owned()), &env(&vars)).unwrap();
        // Two hosts whose lines differ: neither is sent the other's.
        assert_eq!(
            resolved("host=a,b user=svc dbname=app"),
            "host=a,b user=svc dbname=app"
        );
        assert_eq!(
            resolved("host=b,c user=svc dbname=app"),
            "host=b,c user=svc dbname=app password='pwB'"
        );
        // The default socket directory is localhost; another is its path,
        // /tmp's too (anyone can put a socket there).
        assert!(
            resolved("host=/var/run/postgresql user=svc dbname=app").ends_with("password='socket'")
        );
        assert_eq!(
            resolved("host=/tmp user=svc dbname=app"),
            "host=/tmp user=svc dbname=app"
        );
        assert_eq!(
            resolved("host=/run/postgresql user=svc dbname=app"),
            "host=/run/postgresql user=svc dbname=app"
        );
        assert!(resolved("host=/srv/pg user=svc dbname=app").ends_with("password='other-socket'"));
        // An empty password is none; no user is the OS user.
        assert!(resolved("host=db user=os-user dbname=app password=''")
            .ends_with("password='from-os-user'"));
        // No user: the OS user's password, sent with that user named,
        // whatever `$USER` says.
        assert_eq!(
            resolved("host=db dbname=app"),
            "host=db dbname=app user='os-user' password='from-os-user'"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        // An empty LOOM_DB hides nothing.
        assert_eq!(
            resolve(
                None,
                &env(&[("LOOM_DB", " "), ("DATABASE_URL", "host=url")])
            )
            .unwrap(),
            "host=url"
        );
    }
}
