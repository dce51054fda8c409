//! Faults on the Makefile's clusters, for the tests that must see loom and
//! its client survive them: stop a server the hard way, start it again
//! exactly as it ran before, kill a backend with SIGKILL, wait out the crash
//! recovery that follows.
//!
//! Everything runs PostgreSQL's own programs as the `postgres` user
//! (`runuser`, as the Makefile does: the tests run as root, and `pg_ctl`
//! refuses root). A test that stops or crashes a server holds a
//! [`RestartOnDrop`] guard, so that a failing assertion cannot leave the
//! server down for the next test binary: its `Drop` starts the server again
//! and waits until it takes connections.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

use crate::{pg_bin, Cluster};

/// Where the Makefile keeps cluster data when `LOOM_PGROOT` is not set (the
/// Makefile's own default).
pub const DEFAULT_PGROOT: &str = "/var/lib/postgresql/loom";

/// How long a start, or a crash recovery, may take before a helper gives up:
/// longer than any replay of a test's WAL, short enough that a broken server
/// fails the test instead of hanging it.
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(90);

/// A cluster command that failed, with what the program said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterControlError(String);

impl fmt::Display for ClusterControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterControlError {}

type Result<T> = std::result::Result<T, ClusterControlError>;

/// The root of the Makefile's cluster directories: `LOOM_PGROOT` (which the
/// Makefile exports), else its default.
#[must_use]
pub fn pgroot() -> PathBuf {
    std::env::var_os("LOOM_PGROOT")
        .filter(|root| !root.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_PGROOT), PathBuf::from)
}

/// Runs a PostgreSQL program as `postgres`, from the cluster root (a
/// directory postgres can enter, unlike a checkout under /root).
fn run_as_postgres(program: &str, args: &[&str]) -> Result<std::process::Output> {
    run_as_postgres_from(&pg_bin(), &pgroot(), program, args)
}

/// Runs `program` of the PostgreSQL build whose programs are in `bin` as
/// `postgres`, in `cwd` (which postgres must be able to enter and, for
/// `pg_upgrade`, write).
fn run_as_postgres_from(
    bin: &str,
    cwd: &Path,
    program: &str,
    args: &[&str],
) -> Result<std::process::Output> {
    run_as_postgres_with_env(bin, cwd, program, args, &[])
}

/// [`run_as_postgres_from`] with `env` set for the program (and a server it
/// starts), after the backtrace switches are removed.
fn run_as_postgres_with_env(
    bin: &str,
    cwd: &Path,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<std::process::Output> {
    Command::new("runuser")
        .args(["-u", "postgres", "--", &format!("{bin}/{program}")])
        .args(args)
        // A server started here runs without Rust's backtrace switches, as
        // the Makefile's do (see its RUST_BACKTRACE note), unless a test
        // asks for them in `env`.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .envs(env.iter().copied())
        .current_dir(cwd)
        .output()
        .map_err(|e| ClusterControlError(format!("cannot run {program}: {e}")))
}

/// Runs `program` of the build in `bin` as `postgres` in `cwd`, as the
/// helpers here do, for tests that drive servers of their own (another
/// major's `initdb`, `pg_ctl`, `pg_upgrade`). Returns what it printed.
///
/// # Errors
///
/// When the program cannot run or exits unsuccessfully, with its output.
pub fn run_postgres_program(bin: &str, cwd: &Path, program: &str, args: &[&str]) -> Result<String> {
    run_postgres_program_with_env(bin, cwd, program, args, &[])
}

/// [`run_postgres_program`] with `env` in the program's environment (`runuser`
/// and `pg_ctl` pass it on to a server started so): a server with the
/// settings only an environment gives, `RUST_BACKTRACE` say.
///
/// # Errors
///
/// As [`run_postgres_program`].
pub fn run_postgres_program_with_env(
    bin: &str,
    cwd: &Path,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<String> {
    let out = run_as_postgres_with_env(bin, cwd, program, args, env)?;
    check(&format!("{program} {}", args.join(" ")), &out)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn check(what: &str, output: &std::process::Output) -> Result<()> {
    if output.status.success() {
        Ok(())
    } else {
        Err(ClusterControlError(format!(
            "{what}: {} {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Removes the lock files in `dir` that no running server owns, as the
/// Makefile's `clear_stale_pid` does before it starts or stops a cluster:
/// the `postmaster.pid`, and each socket lock (`.s.PGSQL.<port>.lock`, with
/// its socket) the server made there with `-k dir`. Returns whether it
/// removed any.
///
/// A machine restored from a snapshot, or rebooted, keeps the files of a
/// server that is gone, and their PID may since belong to any process,
/// another cluster's backend even. pg_ctl trusts a live PID (`status` says
/// running, `stop` signals it, `start` is refused), so the test here is the
/// process's working directory: a postmaster's is its data directory. The
/// server itself refuses to start while its socket's lock names a live
/// process of its user, which once PIDs wrap (32768 here) may be any
/// backend; a socket lock's second line names its server's data directory,
/// so it is tested the same way.
///
/// # Errors
///
/// When `dir` is a symlink (loom's data directories never are, and nothing
/// is removed through one), or a file cannot be read or removed.
pub fn clear_stale_lock_files(dir: &Path) -> Result<bool> {
    let fail = |what: &Path, e: &dyn std::fmt::Display| {
        ClusterControlError(format!("{}: {e}", what.display()))
    };
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(fail(dir, &"a symlink, not a data directory"))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(fail(dir, &e)),
    }
    let mut stale = Vec::new();
    let pid_file = dir.join("postmaster.pid");
    match std::fs::read_to_string(&pid_file) {
        Ok(contents) if !serves(contents.lines().next(), Some(dir)) => stale.push(pid_file),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(&pid_file, &e)),
    }
    for entry in std::fs::read_dir(dir).map_err(|e| fail(dir, &e))? {
        let lock = entry.map_err(|e| fail(dir, &e))?.path();
        let name = lock.file_name().unwrap_or_default().to_string_lossy();
        if !(name.starts_with(".s.PGSQL.") && name.ends_with(".lock")) {
            continue;
        }
        // A regular file only: a directory or symlink is not a lock.
        if !std::fs::symlink_metadata(&lock).is_ok_and(|m| m.file_type().is_file()) {
            continue;
        }
        let contents = std::fs::read_to_string(&lock).map_err(|e| fail(&lock, &e))?;
        let mut lines = contents.lines();
        let pid = lines.next();
        if !serves(pid, lines.next().map(Path::new)) {
            stale.push(lock.with_extension(""));
            stale.push(lock);
        }
    }
    let mut removed = false;
    for path in stale {
        match std::fs::remove_file(&path) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(&path, &format!("cannot remove it: {e}"))),
        }
    }
    Ok(removed)
}

/// Whether process `pid` (a lock file's first line) runs with `data_dir` as
/// its working directory, as the postmaster of that data directory does.
fn serves(pid: Option<&str>, data_dir: Option<&Path>) -> bool {
    let Some(pid) = pid
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    else {
        return false;
    };
    let (Ok(cwd), Some(Ok(data_dir))) = (
        std::fs::read_link(format!("/proc/{pid}/cwd")),
        data_dir.map(Path::canonicalize),
    ) else {
        return false;
    };
    cwd == data_dir
}

/// The postmaster's options from `postmaster.opts`, which pg_ctl rewrites at
/// every start with the exact command line, each argument double-quoted:
/// every argument after the program, less `-D DIR`, which pg_ctl adds
/// itself (kept, it would pile up in the file at each restart).
fn options_from_postmaster_opts(line: &str) -> Option<String> {
    let line = line.lines().next()?.trim();
    let rest = &line[line.find(" \"")? + 1..];
    let mut args = Vec::new();
    let mut parts = rest.split('"');
    // "a" "b" splits as ["", "a", " ", "b", ""]: arguments at odd places,
    // separators (spaces only, or the file is not pg_ctl's) between them.
    if parts.next() != Some("") {
        return None;
    }
    while let Some(arg) = parts.next() {
        args.push(arg);
        match parts.next() {
            Some(sep) if sep.trim().is_empty() => {}
            _ => return None,
        }
    }
    let mut kept = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-D" {
            args.next();
        } else {
            kept.push(format!("\"{arg}\""));
        }
    }
    Some(kept.join(" "))
}

impl Cluster {
    /// The Makefile's name of this cluster's directory: `c`, `icu`,
    /// `s1`..`s3`, `citus0` (the coordinator), `citus1`, `citus2`.
    #[must_use]
    pub fn dir_name(self) -> String {
        match self {
            Cluster::C => "c".to_owned(),
            Cluster::Icu => "icu".to_owned(),
            Cluster::Shard(i) => format!("s{}", i + 1),
            Cluster::Citus => "citus0".to_owned(),
            Cluster::CitusWorker(i) => format!("citus{}", i + 1),
            Cluster::Cron => "cron".to_owned(),
        }
    }

    /// This cluster's data directory, `$LOOM_PGROOT/<name>`.
    #[must_use]
    pub fn data_dir(self) -> PathBuf {
        pgroot().join(self.dir_name())
    }

    /// Whether a postmaster runs on the data directory (`pg_ctl status`,
    /// once stale lock files are cleared: [`clear_stale_lock_files`]);
    /// it may still be in crash recovery.
    #[must_use]
    pub fn is_running(self) -> bool {
        let dir = self.data_dir();
        if clear_stale_lock_files(&dir).is_err() {
            return false;
        }
        run_as_postgres("pg_ctl", &["-D", &dir.to_string_lossy(), "status"])
            .is_ok_and(|out| out.status.success())
    }

    /// Stops the server with `pg_ctl stop -m immediate`: every backend quits
    /// at once, nothing is checkpointed, the next start runs crash recovery;
    /// to clients it looks like a server that died. Returns the guard that
    /// starts it again.
    ///
    /// # Errors
    ///
    /// When pg_ctl fails (the server was not running, say).
    pub fn stop_immediately(self) -> Result<RestartOnDrop> {
        let guard = RestartOnDrop::new(self);
        let dir = self.data_dir();
        let out = run_as_postgres(
            "pg_ctl",
            &[
                "-D",
                &dir.to_string_lossy(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )?;
        check(&format!("pg_ctl stop -m immediate ({self})"), &out)?;
        Ok(guard)
    }

    /// Starts the server as it last ran (`postmaster.opts`; without one, the
    /// Makefile's options), logging to `server.log` like the Makefile, and
    /// waits until it takes connections. Returns how long that took.
    ///
    /// # Errors
    ///
    /// When pg_ctl fails or the server does not take connections in time.
    pub fn start(self) -> Result<Duration> {
        let started = Instant::now();
        let dir = self.data_dir();
        let options = self.postmaster_options(&dir);
        let log = dir.join("server.log");
        let out = run_as_postgres(
            "pg_ctl",
            &[
                "-D",
                &dir.to_string_lossy(),
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                &SERVER_TIMEOUT.as_secs().to_string(),
                "-o",
                &options,
                "start",
            ],
        )?;
        check(&format!("pg_ctl start ({self})"), &out)?;
        self.wait_until_accepting(SERVER_TIMEOUT)?;
        Ok(started.elapsed())
    }

    /// The postmaster options to start with: those of the last start, so a
    /// restarted server is the same server.
    fn postmaster_options(self, dir: &Path) -> String {
        std::fs::read_to_string(dir.join("postmaster.opts"))
            .ok()
            .and_then(|line| options_from_postmaster_opts(&line))
            .unwrap_or_else(|| {
                // The Makefile's start line, for a directory that never ran.
                let port = self
                    .conninfo()
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix("port=").map(str::to_owned))
                    .unwrap_or_else(|| "5432".to_owned());
                format!(
                    "-p {port} -k {} -c listen_addresses=127.0.0.1",
                    dir.display()
                )
            })
    }

    /// Starts the server if it is not running, and waits until it takes
    /// connections (a crash recovery may be under way): the state every
    /// fault test starts from, whatever a killed earlier run left.
    ///
    /// # Errors
    ///
    /// When it cannot be started or does not come up in time.
    pub fn ensure_running(self) -> Result<()> {
        if !self.is_running() {
            self.start()?;
        }
        self.wait_until_accepting(SERVER_TIMEOUT).map(|_| ())
    }

    /// Polls until a new session can run a query outside recovery. Returns
    /// how long it waited.
    ///
    /// # Errors
    ///
    /// When `timeout` passes first, with the last connection error.
    pub fn wait_until_accepting(self, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        let conninfo = format!("{} dbname=postgres connect_timeout=2", self.conninfo());
        loop {
            let last = match Client::connect(&conninfo, NoTls) {
                Ok(mut client) => match client.query_one("SELECT pg_is_in_recovery()", &[]) {
                    Ok(row) if !row.get::<_, bool>(0) => return Ok(started.elapsed()),
                    Ok(_) => "still in recovery".to_owned(),
                    Err(e) => crate::describe(&e),
                },
                Err(e) => crate::describe(&e),
            };
            if started.elapsed() > timeout {
                return Err(ClusterControlError(format!(
                    "the {self} cluster takes no connections after {timeout:?}: {last}"
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits out the crash recovery that SIGKILLing backend `pid` set off:
    /// first until the postmaster has reaped it (from then on it refuses
    /// connections until every backend is gone and the WAL is replayed; a
    /// session opened before that moment would only be killed with the
    /// rest), then until a new session works. Returns how long it took.
    ///
    /// # Errors
    ///
    /// When `timeout` passes first.
    pub fn wait_for_crash_recovery(self, pid: i32, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        let proc = PathBuf::from(format!("/proc/{pid}"));
        while proc.exists() {
            if started.elapsed() > timeout {
                return Err(ClusterControlError(format!(
                    "backend {pid} of the {self} cluster was never reaped"
                )));
            }
            thread::sleep(Duration::from_millis(5));
        }
        self.wait_until_accepting(timeout.saturating_sub(started.elapsed()))?;
        Ok(started.elapsed())
    }
}

/// Sends SIGKILL to process `pid` (`kill -9`): a backend killed so cannot
/// clean up, and the postmaster answers with a crash restart of every
/// backend of its cluster.
///
/// # Errors
///
/// When `kill` fails (no such process).
pub fn kill_9(pid: i32) -> Result<()> {
    let out = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .output()
        .map_err(|e| ClusterControlError(format!("cannot run kill: {e}")))?;
    check(&format!("kill -9 {pid}"), &out)
}

/// Holds a cluster that a test stops or crashes: dropped (at the end of the
/// test, or while a failed assertion unwinds), it starts the server again
/// if it is down and waits until it takes connections, so no later test
/// finds it stopped.
#[derive(Debug)]
#[must_use = "dropping the guard restarts the cluster at once"]
pub struct RestartOnDrop {
    cluster: Cluster,
}

impl RestartOnDrop {
    /// A guard over `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        RestartOnDrop { cluster }
    }

    /// Starts the cluster again now (see [`Cluster::start`]); the guard's
    /// drop then finds it running.
    ///
    /// # Errors
    ///
    /// As [`Cluster::start`].
    pub fn restart(&self) -> Result<Duration> {
        self.cluster.start()
    }
}

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        // Never panics: a panic while a failed test unwinds would abort the
        // whole binary. A failure here is printed; the next fault test's
        // ensure_running tries again.
        if let Err(e) = self.cluster.ensure_running() {
            eprintln!(
                "RestartOnDrop: could not bring the {} cluster back: {e}",
                self.cluster
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postmaster_opts_keep_everything_after_the_program() {
        let line = "/usr/lib/postgresql/15/bin/postgres \"-D\" \"/var/lib/postgresql/loom/s2\" \"-p\" \"25434\" \"-k\" \"/var/lib/postgresql/loom/s2\" \"-c\" \"listen_addresses=127.0.0.1\"\n";
        let expected =
            "\"-p\" \"25434\" \"-k\" \"/var/lib/postgresql/loom/s2\" \"-c\" \"listen_addresses=127.0.0.1\"";
        assert_eq!(
            options_from_postmaster_opts(line).as_deref(),
            Some(expected)
        );
        // A file an earlier restart wrote, -D twice: the same options.
        let twice = line.replacen("\"-D\"", "\"-D\" \"/x\" \"-D\"", 1);
        assert_eq!(
            options_from_postmaster_opts(&twice).as_deref(),
            Some(expected)
        );
        assert_eq!(
            options_from_postmaster_opts("/usr/lib/postgresql/15/bin/postgres"),
            None
        );
    }

    /// A directory of its own under the system's temporary directory.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("loom-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_pid_file_whose_process_runs_elsewhere_is_stale() {
        let dir = scratch_dir("stale-pid");
        let pid_file = dir.join("postmaster.pid");
        // A live process (this test's), whose working directory is not dir:
        // a PID a gone server's file names, since reused.
        std::fs::write(
            &pid_file,
            format!("{}\n{}\n", std::process::id(), dir.display()),
        )
        .unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        assert!(!pid_file.exists());
        // A PID no process has, and an empty file: stale too.
        std::fs::write(&pid_file, "2147483646\n").unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        std::fs::write(&pid_file, "").unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        // No file: nothing to do.
        assert_eq!(clear_stale_lock_files(&dir), Ok(false));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_pid_file_whose_process_runs_in_the_directory_is_kept() {
        let dir = scratch_dir("live-pid");
        let pid_file = dir.join("postmaster.pid");
        let socket_lock = dir.join(".s.PGSQL.25431.lock");
        let mut child = Command::new("sleep")
            .arg("30")
            .current_dir(&dir)
            .spawn()
            .unwrap();
        std::fs::write(&pid_file, format!("{}\n{}\n", child.id(), dir.display())).unwrap();
        std::fs::write(&socket_lock, format!("{}\n{}\n", child.id(), dir.display())).unwrap();
        let kept = clear_stale_lock_files(&dir);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(kept, Ok(false));
        assert!(pid_file.exists());
        assert!(socket_lock.exists(), "a running server's socket lock went");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What a machine killed with its servers running keeps: the socket's
    /// lock file, naming a PID that a live process of the same user may
    /// hold by now (this test's), which the next server refuses to start
    /// beside ("lock file ... already exists").
    #[test]
    fn the_socket_files_of_a_gone_server_are_removed() {
        let dir = scratch_dir("stale-socket");
        let socket = dir.join(".s.PGSQL.25451");
        let socket_lock = dir.join(".s.PGSQL.25451.lock");
        let data_file = dir.join("PG_VERSION");
        std::fs::write(&socket, "").unwrap();
        let lock = format!("{}\n{}\n", std::process::id(), dir.display());
        std::fs::write(&socket_lock, &lock).unwrap();
        std::fs::write(&data_file, "17\n").unwrap();
        // With no postmaster.pid, and with the stale one of a gone server.
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        assert!(!socket.exists() && !socket_lock.exists());
        std::fs::write(&socket_lock, "1\n").unwrap();
        std::fs::write(dir.join("postmaster.pid"), "2147483646\n").unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        assert!(!socket_lock.exists() && !dir.join("postmaster.pid").exists());
        // A lock that is not a number, and one whose data directory is gone.
        std::fs::write(&socket_lock, "self\n/\n").unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        std::fs::write(
            &socket_lock,
            format!("{}\n/nonexistent\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(true));
        // Nothing else in the directory is touched, nor a directory that
        // looks like a lock.
        std::fs::create_dir(dir.join(".s.PGSQL.1.lock")).unwrap();
        assert_eq!(clear_stale_lock_files(&dir), Ok(false));
        assert!(data_file.exists() && dir.join(".s.PGSQL.1.lock").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Nothing is removed through a symlinked data directory: the files
    /// behind it may be anyone's.
    #[test]
    fn a_symlinked_directory_is_refused() {
        let target = scratch_dir("symlink-target");
        let link = std::env::temp_dir().join(format!("loom-symlink-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let lock = target.join(".s.PGSQL.5432.lock");
        std::fs::write(&lock, "2147483646\n/\n").unwrap();
        assert!(clear_stale_lock_files(&link).is_err());
        assert!(lock.exists());
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&target).unwrap();
    }

    #[test]
    fn cluster_directories_follow_the_makefile() {
        assert_eq!(Cluster::Shard(1).dir_name(), "s2");
        assert!(Cluster::Icu.data_dir().ends_with("icu"));
    }
}
