//! Faults on the Makefile's clusters, for the tests that must see loom and
//! its client survive them: stop a server the hard way, start it again as
//! the Makefile runs it, kill a backend with SIGKILL, wait out the crash
//! recovery that follows.
//!
//! Starting and stopping are the Makefile's (`make cluster.start`,
//! `cluster.stop`, `cluster.status` in mk/clusters.mk): it holds the table
//! of clusters, their ports and settings, and the test of a stale lock
//! file, so none of that is written twice. What is left here is what only a
//! test does: wait for a server to take connections again, kill a backend.
//! A test that stops or crashes a server holds a [`RestartOnDrop`] guard,
//! so that a failing assertion cannot leave the server down for the next
//! test binary: its `Drop` starts the server again and waits until it takes
//! connections.

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

/// Runs `make -s <target> PG_CONFIG=<bin>/pg_config NAME= DIR= MODE=` in
/// the repository, with `vars` set among those three, as root (the
/// Makefile runs PostgreSQL's programs as `postgres` itself).
///
/// Nothing of the make that runs the tests reaches it: not its MAKEFLAGS
/// (its jobserver, its command line), nor a `NAME`, `DIR` or `MODE` in the
/// environment, which each empty assignment on the command line beats. A
/// value is refused unless it is letters, digits and `/ . _ -`: the
/// recipes hand it to a shell. pg_ctl waits up to [`SERVER_TIMEOUT`].
///
/// # Errors
///
/// A value outside that set; when make cannot run or fails, with what it
/// printed.
pub fn make(target: &str, bin: &str, vars: &[(&str, &str)]) -> Result<()> {
    let mut assigned = vec![format!("PG_CONFIG={bin}/pg_config")];
    for name in ["NAME", "DIR", "MODE"] {
        let value = vars
            .iter()
            .find_map(|(n, v)| (*n == name).then_some(*v))
            .unwrap_or_default();
        assigned.push(format!("{name}={value}"));
    }
    for value in assigned.iter() {
        if !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=".contains(&b))
        {
            return Err(ClusterControlError(format!(
                "make {target}: {value:?} holds more than letters, digits and / . _ -"
            )));
        }
    }
    let mut command = Command::new("make");
    command
        .args([
            "-s",
            "--no-print-directory",
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            target,
        ])
        .args(&assigned)
        .env("PGCTLTIMEOUT", SERVER_TIMEOUT.as_secs().to_string())
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("GNUMAKEFLAGS")
        .env_remove("MAKEFILES")
        .env_remove("MAKELEVEL");
    let out = command
        .output()
        .map_err(|e| ClusterControlError(format!("cannot run make {target}: {e}")))?;
    check(&format!("make {target} {}", assigned.join(" ")), &out)
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

    /// Whether a postmaster runs on the data directory (`make
    /// cluster.status`: `pg_ctl status`, once stale lock files are
    /// cleared); it may still be in crash recovery.
    #[must_use]
    pub fn is_running(self) -> bool {
        make("cluster.status", &pg_bin(), &[("NAME", &self.dir_name())]).is_ok()
    }

    /// Stops the server with `pg_ctl stop -m immediate` (`make cluster.stop
    /// MODE=immediate`): every backend quits at once, nothing is
    /// checkpointed, the next start runs crash recovery; to clients it looks
    /// like a server that died. Returns the guard that starts it again.
    ///
    /// # Errors
    ///
    /// When make fails (the server would not stop, say).
    pub fn stop_immediately(self) -> Result<RestartOnDrop> {
        // make stops what runs and succeeds where nothing does: a fault
        // test must know it stopped a server, not nothing.
        if !self.is_running() {
            return Err(ClusterControlError(format!(
                "the {self} cluster is not running: nothing to stop"
            )));
        }
        let guard = RestartOnDrop::new(self);
        make(
            "cluster.stop",
            &pg_bin(),
            &[("NAME", &self.dir_name()), ("MODE", "immediate")],
        )?;
        if self.is_running() {
            return Err(ClusterControlError(format!(
                "the {self} cluster still runs after pg_ctl stop -m immediate"
            )));
        }
        Ok(guard)
    }

    /// Starts the server as `make clusters` does (`make cluster.start`: the
    /// table's port and settings, logging to `server.log`), and waits until
    /// it takes connections. Returns how long that took.
    ///
    /// # Errors
    ///
    /// When make fails or the server does not take connections in time.
    pub fn start(self) -> Result<Duration> {
        let started = Instant::now();
        make("cluster.start", &pg_bin(), &[("NAME", &self.dir_name())])?;
        self.wait_until_accepting(SERVER_TIMEOUT)?;
        Ok(started.elapsed())
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
    //! The Makefile's test of a stale lock file, as the harness reaches it
    //! (`make cluster.status DIR=`), case by case. `make test.clusters`
    //! covers the same logic end to end, on a real cluster.
    use super::*;
    use crate::scratch_server::fresh_postgres_dir;

    /// A data directory of its own, postgres's (the Makefile removes stale
    /// files as postgres), under the cluster root.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir = pgroot().join(format!("lock-test-{name}-{}", std::process::id()));
        fresh_postgres_dir(&dir);
        dir
    }

    /// `make cluster.status DIR=dir`, whose exit status (no server runs in
    /// these directories) matters less than what it cleared.
    fn clear(dir: &Path) -> Result<()> {
        make(
            "cluster.status",
            &pg_bin(),
            &[("DIR", &dir.to_string_lossy())],
        )
    }

    #[test]
    fn a_pid_file_whose_process_runs_elsewhere_is_stale() {
        let dir = scratch_dir("stale-pid");
        let pid_file = dir.join("postmaster.pid");
        // A live process (this test's), whose working directory is not dir:
        // a PID a gone server's file names, since reused. Then a PID no
        // process has, and an empty file: stale too.
        for contents in [
            format!("{}\n{}\n", std::process::id(), dir.display()),
            "2147483646\n".to_owned(),
            String::new(),
        ] {
            std::fs::write(&pid_file, &contents).unwrap();
            let _ = clear(&dir);
            assert!(!pid_file.exists(), "kept a pid file of {contents:?}");
        }
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
        // pg_ctl status ran, so the recipe got past the lock test (it says
        // the directory is no cluster's: nothing else is in it).
        let kept = clear(&dir);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            kept.as_ref()
                .is_err_and(|e| e.to_string().contains("pg_ctl: directory")),
            "{kept:?}"
        );
        assert!(pid_file.exists(), "a running server's pid file went");
        assert!(socket_lock.exists(), "a running server's socket lock went");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What a machine killed with its servers running keeps: the socket's
    /// lock file, naming a PID that a live process may hold by now (this
    /// test's), which the next server refuses to start beside ("lock file
    /// ... already exists").
    #[test]
    fn the_socket_files_of_a_gone_server_are_removed() {
        let dir = scratch_dir("stale-socket");
        let socket = dir.join(".s.PGSQL.25451");
        let socket_lock = dir.join(".s.PGSQL.25451.lock");
        let data_file = dir.join("PG_VERSION");
        std::fs::write(&data_file, "17\n").unwrap();
        // A live PID that is not the server, with no postmaster.pid; the
        // stale one of a gone server beside a stale pid file; a lock that
        // is not a number; one whose data directory is gone.
        for (lock, pid_file) in [
            (format!("{}\n{}\n", std::process::id(), dir.display()), None),
            ("1\n".to_owned(), Some("2147483646\n")),
            ("self\n/\n".to_owned(), None),
            (format!("{}\n/nonexistent\n", std::process::id()), None),
        ] {
            std::fs::write(&socket, "").unwrap();
            std::fs::write(&socket_lock, &lock).unwrap();
            if let Some(pid) = pid_file {
                std::fs::write(dir.join("postmaster.pid"), pid).unwrap();
            }
            let _ = clear(&dir);
            assert!(!socket.exists() && !socket_lock.exists(), "kept {lock:?}");
            assert!(!dir.join("postmaster.pid").exists());
        }
        // Nothing else in the directory is touched, nor a directory that
        // looks like a lock.
        std::fs::create_dir(dir.join(".s.PGSQL.1.lock")).unwrap();
        let _ = clear(&dir);
        assert!(data_file.exists() && dir.join(".s.PGSQL.1.lock").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Nothing is removed through a symlinked data directory: the files
    /// behind it may be anyone's.
    #[test]
    fn a_symlinked_directory_is_refused() {
        let target = scratch_dir("symlink-target");
        let link = pgroot().join(format!("lock-test-symlink-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let lock = target.join(".s.PGSQL.5432.lock");
        std::fs::write(&lock, "2147483646\n/\n").unwrap();
        let refused = clear(&link);
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("is a symlink")),
            "{refused:?}"
        );
        assert!(lock.exists());
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&target).unwrap();
    }

    #[test]
    fn a_value_a_shell_would_read_is_refused_before_make_runs() {
        for dir in [
            "/tmp/a b",
            "/tmp/x;true",
            "/tmp/$(id)",
            "/tmp/`id`",
            "/tmp/'q'",
        ] {
            let refused = make("cluster.status", &pg_bin(), &[("DIR", dir)]);
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("more than letters")),
                "{dir}: {refused:?}"
            );
        }
    }

    /// A postmaster.pid planted as a symlink is refused, never read: its
    /// first line is nowhere in what make says.
    #[test]
    fn a_symlinked_pid_file_is_refused_and_not_read() {
        let dir = scratch_dir("pid-link");
        let secret = dir.join("secret");
        std::fs::write(&secret, "a line nobody may read\n").unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("postmaster.pid")).unwrap();
        let refused = clear(&dir);
        let message = format!("{refused:?}");
        assert!(message.contains("is a symlink"), "{message}");
        assert!(!message.contains("nobody may read"), "{message}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// DIR in the environment (the test run's) never redirects a named
    /// cluster: is_running still asks about the cluster itself.
    #[test]
    fn a_dir_in_the_environment_does_not_redirect_a_named_cluster() {
        let empty = scratch_dir("env-dir");
        let out = Command::new("make")
            .args([
                "-s",
                "--no-print-directory",
                "-C",
                env!("CARGO_MANIFEST_DIR"),
                "cluster.status",
            ])
            .arg(format!("PG_CONFIG={}/pg_config", pg_bin()))
            .args(["NAME=icu", "DIR=", "MODE="])
            .env("DIR", &empty)
            .env_remove("MAKEFLAGS")
            .env_remove("MAKELEVEL")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(Cluster::Icu.is_running());
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn a_name_outside_the_table_is_refused() {
        let refused = make("cluster.start", &pg_bin(), &[("NAME", "nosuch")]);
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("no cluster of the table")),
            "{refused:?}"
        );
    }

    #[test]
    fn cluster_directories_follow_the_makefile() {
        assert_eq!(Cluster::Shard(1).dir_name(), "s2");
        assert!(Cluster::Icu.data_dir().ends_with("icu"));
    }
}
