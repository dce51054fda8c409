//! loom's Debian packages (issue 17), installed as a user would: the
//! package for Debian's PostgreSQL 15 with `dpkg -i` into that server,
//! where `CREATE EXTENSION loom` and an update from 0.1.0 work in a fresh
//! cluster and `dpkg -r` removes every file; the packages for 16, 17 and
//! 18 unpacked and loaded by a server of their major from the package's
//! own files (`dynamic_library_path`, and on 18 `extension_control_path`).
//!
//! `make test.package` builds each package and runs this with
//! `LOOM_PACKAGE_DEB`, `LOOM_PACKAGE_MAJOR` and `LOOM_PACKAGE_BIN` (the
//! server's programs) set; a plain run lists it as ignored.

use std::path::Path;
use std::process::Command;

use loom_harness::cluster_control::pgroot;
use loom_harness::scratch_server::{fresh_postgres_dir, ScratchServer};
use loom_harness::{describe, LOOM_VERSION};

fn env(var: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{var} is not set: run `make test.package`"))
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A server of the package's major on a fresh data directory under `root`,
/// started with `options`; stopped when dropped.
fn server(bin: &str, root: &Path, options: &str) -> ScratchServer {
    let server = ScratchServer::init(
        bin,
        root.join("data"),
        loom_harness::scratch_port("PACKAGE"),
        &["--locale=C.UTF-8"],
    );
    server.start(options);
    server
}

/// CREATE EXTENSION in a fresh database, an update from 0.1.0 in another,
/// and loom's calls in both; returns the loom.so the backend mapped.
fn smoke(server: &ScratchServer) -> String {
    let mut admin = server.connect("postgres");
    for db in ["fresh", "from_0_1_0"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .unwrap_or_else(|e| panic!("{}", describe(&e)));
    }
    let mut fresh = server.connect("fresh");
    fresh
        .batch_execute("CREATE EXTENSION loom")
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    let mut old = server.connect("from_0_1_0");
    old.batch_execute(
        "CREATE EXTENSION loom VERSION '0.1.0';
         SELECT loom_append_event('a_b', 1, 'started', '{}');
         SET statement_timeout = 0; ALTER EXTENSION loom UPDATE;",
    )
    .unwrap_or_else(|e| panic!("{}", describe(&e)));
    for client in [&mut fresh, &mut old] {
        let appended: i64 = client
            .query_one(
                "SELECT loom_append_events(ARRAY['A1', 'B'], ARRAY[1, 1]::bigint[], ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[])",
                &[],
            )
            .unwrap_or_else(|e| panic!("{}", describe(&e)))
            .get(0);
        assert_eq!(appended, 2);
        let row = client
            .query_one(
                "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'loom'),
                        (SELECT string_agg(id, ',') FROM loom_list_executions(NULL, 10) AS id),
                        loom_snapshot_state(loom_snapshot_frame(repeat('{\"k\":[1,2,3]}', 1)::text, 'zstd'))::text",
                &[],
            )
            .unwrap_or_else(|e| panic!("{}", describe(&e)));
        assert_eq!(row.get::<_, String>(0), LOOM_VERSION);
        let ids: String = row.get(1);
        assert!(ids.starts_with("A1,B"), "code point order: {ids}");
        assert_eq!(row.get::<_, String>(2), "{\"k\": [1, 2, 3]}");
    }
    let pid: i32 = fresh
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.ends_with("/loom.so"))
        .unwrap_or_else(|| panic!("no loom.so mapped in backend {pid}"))
        .to_owned()
}

#[test]
#[ignore = "needs a built package: make test.package"]
fn the_package_installs_works_and_goes() {
    let deb = env("LOOM_PACKAGE_DEB");
    let major = env("LOOM_PACKAGE_MAJOR");
    let bin = env("LOOM_PACKAGE_BIN");
    let name = format!("postgresql-{major}-loom");
    let lib = format!("/usr/lib/postgresql/{major}/lib/loom.so");
    let control = format!("/usr/share/postgresql/{major}/extension/loom.control");
    let fields = run(
        "dpkg-deb",
        &["--field", &deb, "Package", "Version", "Depends"],
    );
    println!("{deb}:\n{fields}");
    assert!(
        fields.contains(&format!("Version: {LOOM_VERSION}")),
        "{fields}"
    );
    assert!(fields.contains(&format!("postgresql-{major}")), "{fields}");

    let root = pgroot().join(format!("package-{major}"));
    if bin.starts_with("/usr/lib/postgresql/") {
        // Debian's own server: dpkg -i, use, dpkg -r.
        run("dpkg", &["-i", &deb]);
        let listed = run("dpkg", &["-L", &name]);
        assert!(
            listed.contains(&lib) && listed.contains(&control),
            "{listed}"
        );
        {
            let server = server(&bin, &root, "");
            let mapped = smoke(&server);
            assert_eq!(mapped, lib, "the backend loaded the package's library");
        }
        run("dpkg", &["-r", &name]);
        assert!(
            !Path::new(&lib).exists() && !Path::new(&control).exists(),
            "dpkg -r left files"
        );
        let status = Command::new("dpkg").args(["-s", &name]).output().unwrap();
        assert!(!String::from_utf8_lossy(&status.stdout).contains("Status: install ok installed"));
        println!("dpkg -i, CREATE EXTENSION, UPDATE from 0.1.0, dpkg -r: ok");
        return;
    }
    // Another major's build: the package's own files, unpacked, loaded by
    // path (loom's module_pathname is 'loom', found through
    // dynamic_library_path).
    let unpacked = root.join("unpacked");
    fresh_postgres_dir(&root);
    run("dpkg-deb", &["-x", &deb, unpacked.to_str().unwrap()]);
    run("chmod", &["-R", "a+rX", root.to_str().unwrap()]);
    let lib_dir = unpacked.join(format!("usr/lib/postgresql/{major}/lib"));
    let share = unpacked.join(format!("usr/share/postgresql/{major}"));
    // The package's directory first, then $libdir for PostgreSQL's own
    // modules (18's plpgsql is found through the path too); the backend's
    // mapped loom.so, checked below, must be the package's. Quoted: pg_ctl
    // starts the server through a shell.
    let mut options = format!("-c 'dynamic_library_path={}:$libdir'", lib_dir.display());
    if major.parse::<u32>().unwrap() >= 18 {
        options.push_str(&format!(
            " -c 'extension_control_path={}:$system'",
            share.display()
        ));
    } else {
        // Before 18 a server reads control files from its own sharedir
        // only: the package's go there, as its installation would put them.
        let sharedir = run(&format!("{bin}/pg_config"), &["--sharedir"]);
        for entry in std::fs::read_dir(share.join("extension")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(
                entry.path(),
                Path::new(sharedir.trim())
                    .join("extension")
                    .join(entry.file_name()),
            )
            .unwrap();
        }
    }
    let server = server(&bin, &root, &options);
    let mapped = smoke(&server);
    assert_eq!(
        Path::new(&mapped),
        lib_dir.join("loom.so"),
        "the backend loaded the package's library"
    );
    println!(
        "PostgreSQL {major}: the unpacked package loads from {}: ok",
        lib_dir.display()
    );
}
