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
pub(super) fn resolve(
    flag: Option<String>,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<String, &'static str> {
    let named = flag
        .or_else(|| var("LOOM_DB"))
        .or_else(|| var("DATABASE_URL"))
        .filter(|db| !db.trim().is_empty());
    let db = match named {
        Some(db) => db,
        None => from_pg_variables(var).ok_or(NO_DATABASE)?,
    };
    if !is_postgres(&db) {
        return Ok(db);
    }
    let Some(lookup) = crate::pg_connect::password_lookup(&db) else {
        return Ok(db);
    };
    let Some(file) = password_file(var) else {
        return Ok(db);
    };
    match read_password_file(&file)
        .and_then(|text| find_password(&text, &lookup.hosts, &lookup.dbname, &lookup.user))
    {
        Some(password) => Ok(with_password(&db, &password)),
        None => Ok(db),
    }
}

/// A key=value connection string from libpq's variables; `None` when none
/// of those that say where to connect is set. What libpq defaults the
/// others to: host `localhost`, the OS user, a database named after it.
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
    if !has("user") {
        if let Some(user) = var("USER").or_else(|| var("LOGNAME")) {
            parts.push(pair("user", &user));
        }
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
    std::fs::read_to_string(path).ok()
}

/// The password of the first line of a password file that matches one of
/// `hosts`, the database and the user: `hostname:port:database:username:password`,
/// each of the first four a value or `*`, `\` escaping `:` and `\`; `#`
/// starts a comment line.
fn find_password(text: &str, hosts: &[(String, u16)], dbname: &str, user: &str) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        let [host, port, db, name, password] = fields.as_slice() else {
            continue;
        };
        let matches = |field: &str, value: &str| field == "*" || field == value;
        if hosts
            .iter()
            .any(|(h, p)| matches(host, h) && matches(port, &p.to_string()))
            && matches(db, dbname)
            && matches(name, user)
        {
            return Some(password.clone());
        }
    }
    None
}

/// A password file line's fields: split at each `:` not escaped, `\:`
/// and `\\` read as `:` and `\`. The last field takes the rest of the line.
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields
                        .last_mut()
                        .unwrap_or_else(|| unreachable!())
                        .push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap_or_else(|| unreachable!()).push(c),
        }
    }
    fields
}

/// `db` with `password` added: a key=value pair, or a URL's query
/// parameter, percent-encoded.
fn with_password(db: &str, password: &str) -> String {
    if db.starts_with("postgres://") || db.starts_with("postgresql://") {
        let encoded: String = password
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
        format!("{db}{separator}password={encoded}")
    } else {
        format!("{db} {}", pair("password", password))
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
        assert_eq!(
            resolve(None, &env(&[("PGDATABASE", "app"), ("USER", "svc")])).unwrap(),
            "dbname='app' host='localhost' user='svc'"
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
        let lookup = crate::pg_connect::password_lookup(&db).unwrap();
        assert_eq!(lookup.user, r"o'neil sslmode=disable \x");
        assert_eq!(lookup.dbname, "app");
        assert_eq!(lookup.hosts, [("db".to_owned(), 5432)]);
        let with = with_password(&db, r"it's \ a=b");
        assert!(
            crate::pg_connect::password_lookup(&with).is_none(),
            "a password now"
        );
    }

    #[test]
    fn a_password_file_line_matches_as_libpq_reads_it() {
        let file = "# comment\n\
                    other:5432:app:svc:wrong\n\
                    db:*:app:svc:pa\\:ss\\\\word:with colon\n\
                    *:*:*:*:fallback\n";
        let hosts = vec![("db".to_owned(), 5432)];
        assert_eq!(
            find_password(file, &hosts, "app", "svc").as_deref(),
            Some(r"pa:ss\word:with colon")
        );
        assert_eq!(
            find_password(file, &hosts, "other", "svc").as_deref(),
            Some("fallback")
        );
        assert_eq!(
            find_password("db:5433:app:svc:x\n", &hosts, "app", "svc"),
            None
        );
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
}
