//! A throwaway PostgreSQL server of any build, for the tests that need a
//! server of their own beside the Makefile's clusters: two majors' servers
//! around `pg_upgrade` (tests/install/pg_upgrade.rs), or a server started with the
//! settings that load a package from where it was unpacked
//! (tests/install/packages.rs).
//!
//! Like the cluster helpers, it runs PostgreSQL's programs as `postgres`
//! from the cluster root; a server a killed run left behind is stopped
//! before its directory is made afresh.

use std::path::{Path, PathBuf};
use std::process::Command;

use postgres::{Client, NoTls};

use crate::cluster_control::{
    make, pgroot, run_postgres_program, run_postgres_program_with_env, ClusterControlError,
};

/// A directory emptied (or made) and handed to `postgres`, for data
/// directories and for what `postgres` must write beside them.
///
/// # Panics
///
/// When it cannot be made or handed over.
pub fn fresh_postgres_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap_or_else(|e| panic!("chown: {e}"));
    assert!(status.success(), "chown -R postgres {}", path.display());
}

/// One server: the build whose programs are in `bin`, its data directory,
/// its port. Stopped, if running, when dropped; its data stays (the next
/// [`ScratchServer::init`] of the directory removes it).
pub struct ScratchServer {
    bin: String,
    dir: PathBuf,
    port: u16,
}

impl ScratchServer {
    /// Makes `dir` a fresh data directory with `bin`'s initdb (trust, user
    /// `postgres`, UTF8, then `initdb_args`: the locale, say), not started.
    ///
    /// # Panics
    ///
    /// When initdb fails.
    #[must_use]
    pub fn init(bin: &str, dir: PathBuf, port: u16, initdb_args: &[&str]) -> ScratchServer {
        let server = ScratchServer {
            bin: bin.to_owned(),
            dir,
            port,
        };
        // A server a killed run left there: stopped, or the directory is
        // not emptied under it.
        server
            .stop_if_running("immediate")
            .unwrap_or_else(|e| panic!("{e}"));
        fresh_postgres_dir(&server.dir);
        let data = server.dir.to_string_lossy();
        let mut args = vec![
            "-D",
            &*data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--encoding=UTF8",
        ];
        args.extend_from_slice(initdb_args);
        run_postgres_program(bin, &pgroot(), "initdb", &args).unwrap_or_else(|e| panic!("{e}"));
        server
    }

    /// Starts it on its port, listening on 127.0.0.1 and a socket in its
    /// data directory, with the server `options` (`-c name=value ...`;
    /// pg_ctl passes them through a shell, so quote what holds a `$`).
    ///
    /// # Panics
    ///
    /// When pg_ctl fails.
    pub fn start(&self, options: &str) {
        self.start_with_env(options, &[]);
    }

    /// [`ScratchServer::start`] with `env` in the server's environment
    /// (which the harness otherwise keeps free of `RUST_BACKTRACE` and
    /// `RUST_LIB_BACKTRACE`), for what only an environment sets.
    ///
    /// # Panics
    ///
    /// When pg_ctl fails.
    pub fn start_with_env(&self, options: &str, env: &[(&str, &str)]) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 {options}",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        let data = self.dir.to_string_lossy();
        let log = log.to_string_lossy();
        let args = ["-D", &*data, "-w", "-l", &*log, "-o", &options, "start"];
        run_postgres_program_with_env(&self.bin, &pgroot(), "pg_ctl", &args, env)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops it (fast shutdown: a clean one, as `pg_upgrade` needs).
    ///
    /// # Panics
    ///
    /// When it does not stop.
    pub fn stop(&self) {
        self.stop_if_running("fast")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A session as `postgres` on database `db`.
    ///
    /// # Panics
    ///
    /// When it cannot connect.
    #[must_use]
    pub fn connect(&self, db: &str) -> Client {
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        );
        Client::connect(&conninfo, NoTls).unwrap_or_else(|e| panic!("{conninfo}: {e}"))
    }

    /// Its data directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops a server that may be running there (one a killed run left, or
    /// this one as it is dropped), with the Makefile's `cluster.stop`: a
    /// stale pid file is removed first, never signalled, since its PID may
    /// be another process's by now.
    fn stop_if_running(&self, mode: &str) -> Result<(), ClusterControlError> {
        let dir = self.dir.to_string_lossy();
        make("cluster.stop", &self.bin, &[("DIR", &dir), ("MODE", mode)])
    }
}

impl Drop for ScratchServer {
    fn drop(&mut self) {
        let _ = self.stop_if_running("fast");
    }
}
