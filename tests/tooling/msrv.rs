//! The published crates' declared minimum Rust version is true: no crate
//! they depend on in the lockfile (every feature on, build scripts
//! included) declares a newer one. The registry offers no other toolchain
//! to build with here, so the declaration is checked against what each
//! dependency itself declares; a lockfile update that raises it fails
//! `make lint` until the workspace's `rust-version` is raised too.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// The crates a user adds from the registry.
const PUBLISHED: [&str; 2] = ["pgloom", "pgloom-core"];

fn version(text: &str) -> Vec<u64> {
    text.split('.')
        .map(|part| part.parse().expect("a rust-version is numeric"))
        .collect()
}

#[test]
fn the_declared_rust_version_covers_every_locked_dependency_of_the_published_crates() {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--all-features",
            "--filter-platform",
            "x86_64-unknown-linux-gnu",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata is JSON");
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let roots: Vec<&str> = packages
        .iter()
        .filter(|(_, p)| PUBLISHED.contains(&p["name"].as_str().unwrap()))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        roots.len(),
        PUBLISHED.len(),
        "both published crates are in the workspace"
    );

    let mut seen = BTreeSet::new();
    let mut stack = roots.clone();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let shipped = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if shipped {
                stack.push(dep["pkg"].as_str().unwrap());
            }
        }
    }

    for root in &roots {
        let name = packages[root]["name"].as_str().unwrap();
        let declared = packages[root]["rust_version"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} declares no rust-version"));
        let newest = seen
            .iter()
            .filter_map(|id| {
                let p = packages[id];
                p["rust_version"]
                    .as_str()
                    .map(|v| (version(v), p["name"].as_str().unwrap(), v))
            })
            .max()
            .expect("some dependency declares a rust-version");
        println!(
            "{name}: rust-version {declared}; the newest any locked dependency needs: {} ({})",
            newest.2, newest.1
        );
        assert!(
            version(declared) >= newest.0,
            "{name} declares rust-version {declared}, but the lockfile's {} needs {}: raise [workspace.package] rust-version",
            newest.1,
            newest.2
        );
    }
}
