//! pgloom's public API names no type of the libraries it runs on
//! (deadpool, tokio-postgres, rusqlite, tokio) outside `pgloom::interop`,
//! so that upgrading one of them is not a breaking release of pgloom
//! (docs/client.md#versions).
//!
//! It reads the crate's public API as rustdoc does (its JSON output, every
//! feature on; stable's rustdoc through RUSTC_BOOTSTRAP, as check.docs
//! builds the docs) and walks it from the crate root: every public item's
//! signature, field, variant, re-export, impl and trait implementation,
//! and any item of another crate inlined into it. Allowed outside the
//! interop module (`pgloom::interop`, by its path): std's `From` into a
//! type of pgloom's (what `?` makes of a driver's error, and a service's
//! deadpool pool made a `PgPool`) and std's `AsRef` on one (to what a
//! `PgPool` wraps); the interop module's docs list them. pgloom-core,
//! whose modules pgloom re-exports, depends on none of those libraries.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::process::Command;

use serde_json::Value;

/// The crates whose types must stay behind `pgloom::interop`.
const FOREIGN: [&str; 9] = [
    "deadpool",
    "deadpool_postgres",
    "deadpool_runtime",
    "tokio_postgres",
    "postgres_types",
    "postgres_protocol",
    "rusqlite",
    "tokio",
    "tokio_util",
];

/// std's conversion traits whose impls on a type of pgloom's may name a
/// foreign type, by their paths.
const CONVERSIONS: [&[&str]; 2] = [&["core", "convert", "From"], &["core", "convert", "AsRef"]];

/// The one module whose items may name foreign types.
const INTEROP: &str = "::pgloom::interop";

struct Api<'a> {
    index: &'a serde_json::Map<String, Value>,
    /// Every id's summary (`crate_id`, `path`).
    paths: &'a serde_json::Map<String, Value>,
    /// Each crate id's name.
    crates: BTreeMap<u64, String>,
    /// Each foreign id's path, for the report.
    foreign: BTreeMap<String, String>,
    seen: HashSet<String>,
    /// The path of every item walked.
    walked: BTreeSet<String>,
    /// The conversion impls let through, by the item they are on.
    conversions: Vec<String>,
    /// Item path → the foreign paths it names.
    found: BTreeMap<String, BTreeSet<String>>,
}

impl Api<'_> {
    /// The foreign paths named anywhere in `value`: a path is an object
    /// with a string `path` (or `name`) and a numeric `id`.
    fn names(&self, value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(id) = map.get("id").and_then(Value::as_u64) {
                    if map.contains_key("path") || map.contains_key("name") {
                        if let Some(path) = self.foreign.get(&id.to_string()) {
                            out.insert(path.clone());
                        }
                    }
                }
                for value in map.values() {
                    self.names(value, out);
                }
            }
            Value::Array(values) => values.iter().for_each(|value| self.names(value, out)),
            _ => {}
        }
    }

    /// The ids an item holds as children (fields, variants, methods,
    /// impls, a module's items), which are walked as items of their own.
    fn children(inner: &Value) -> Vec<String> {
        let mut ids = Vec::new();
        let mut take = |value: Option<&Value>| {
            for id in value.and_then(Value::as_array).into_iter().flatten() {
                if let Some(id) = id.as_u64() {
                    ids.push(id.to_string());
                }
            }
        };
        for key in ["items", "impls", "implementations", "variants", "fields"] {
            take(inner.get(key));
        }
        if let Some(kind) = inner.get("kind") {
            take(kind.get("tuple"));
            take(kind.get("plain").and_then(|plain| plain.get("fields")));
            take(kind.get("struct").and_then(|fields| fields.get("fields")));
        }
        ids
    }

    /// The crate and path of `id`, from the paths summary.
    fn path_of(&self, id: &Value) -> Option<(u64, Vec<&str>)> {
        let summary = self.paths.get(&id.as_u64()?.to_string())?;
        let path = summary["path"]
            .as_array()?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        Some((summary["crate_id"].as_u64()?, path))
    }

    /// Whether the impl `inner` is std's `From` or `AsRef` on a type of
    /// pgloom's own (crate 0): the direction that lets a driver's value
    /// in, never one that hands pgloom's out as a driver's type.
    fn is_conversion_onto_ours(&self, inner: &Value) -> bool {
        let std_conversion = self
            .path_of(&inner["trait"]["id"])
            .is_some_and(|(_, path)| CONVERSIONS.contains(&path.as_slice()));
        let onto_ours = self
            .path_of(&inner["for"]["resolved_path"]["id"])
            .is_some_and(|(krate, _)| krate == 0);
        std_conversion && onto_ours
    }

    fn walk(&mut self, id: &str, parent: &str) {
        if !self.seen.insert(id.to_owned()) {
            return;
        }
        let Some(item) = self.index.get(id) else {
            // An item of another crate, reached by a re-export.
            if let Some(path) = self.foreign.get(id) {
                self.found
                    .entry(parent.to_owned())
                    .or_default()
                    .insert(format!("re-export of {path}"));
            }
            return;
        };
        let name = item.get("name").and_then(Value::as_str).unwrap_or("");
        let here = if name.is_empty() {
            parent.to_owned()
        } else {
            format!("{parent}::{name}")
        };
        // Another crate's item inlined into pgloom's docs (a re-export
        // with `#[doc(inline)]`, an impl it brings): one of the foreign
        // crates' is reported whatever it holds.
        let krate = item["crate_id"].as_u64().unwrap_or(0);
        if let Some(krate) = self
            .crates
            .get(&krate)
            .filter(|k| FOREIGN.contains(&k.as_str()))
        {
            self.found
                .entry(here)
                .or_default()
                .insert(format!("an item of {krate}, inlined"));
            return;
        }
        let Some((kind, inner)) = item["inner"].as_object().and_then(|o| o.iter().next()) else {
            return;
        };
        self.walked.insert(here.clone());
        match kind.as_str() {
            "module" if here == INTEROP => return,
            "use" => {
                if let Some(target) = inner.get("id").and_then(Value::as_u64) {
                    self.walk(&target.to_string(), parent);
                }
                return;
            }
            "impl" => {
                if inner["is_synthetic"].as_bool() == Some(true) || !inner["blanket_impl"].is_null()
                {
                    return;
                }
                if self.is_conversion_onto_ours(inner) {
                    self.conversions.push(here);
                    return;
                }
            }
            _ => {}
        }
        // The item's own signature, without its children (walked below,
        // each under its own name).
        let mut own = inner.clone();
        if let Some(map) = own.as_object_mut() {
            for key in ["items", "impls", "implementations", "variants", "fields"] {
                map.remove(key);
            }
            if let Some(kind) = map.get_mut("kind").and_then(Value::as_object_mut) {
                kind.remove("tuple");
                kind.remove("plain");
                kind.remove("struct");
            }
        }
        let mut named = BTreeSet::new();
        self.names(&own, &mut named);
        if !named.is_empty() {
            self.found
                .entry(format!("{here} ({kind})"))
                .or_default()
                .extend(named);
        }
        for child in Self::children(inner) {
            self.walk(&child, &here);
        }
    }
}

/// Walks the rustdoc JSON `doc` from the crate root: every item outside
/// `interop` that names a foreign type, and what the walk went through.
fn walk(doc: &Value) -> Walk {
    let crates: BTreeMap<&str, &str> = doc["external_crates"]
        .as_object()
        .expect("external_crates")
        .iter()
        .map(|(id, krate)| (id.as_str(), krate["name"].as_str().unwrap_or("")))
        .collect();
    let foreign = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .filter(|(_, summary)| {
            let krate = summary["crate_id"].as_u64().unwrap_or(0).to_string();
            crates
                .get(krate.as_str())
                .is_some_and(|name| FOREIGN.contains(name))
        })
        .map(|(id, summary)| {
            let path: Vec<&str> = summary["path"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            (id.clone(), path.join("::"))
        })
        .collect();
    let mut api = Api {
        index: doc["index"].as_object().expect("index"),
        paths: doc["paths"].as_object().expect("paths"),
        crates: doc["external_crates"]
            .as_object()
            .expect("external_crates")
            .iter()
            .filter_map(|(id, krate)| Some((id.parse().ok()?, krate["name"].as_str()?.to_owned())))
            .collect(),
        foreign,
        seen: HashSet::new(),
        walked: BTreeSet::new(),
        conversions: Vec::new(),
        found: BTreeMap::new(),
    };
    let root = doc["root"].as_u64().expect("root").to_string();
    api.walk(&root, "");
    Walk {
        found: api.found,
        walked: api.walked,
        conversions: api.conversions,
    }
}

/// What a walk of the API saw.
struct Walk {
    /// Item path → the foreign paths it names.
    found: BTreeMap<String, BTreeSet<String>>,
    /// The path of every item walked.
    walked: BTreeSet<String>,
    /// The conversion impls let through.
    conversions: Vec<String>,
}

/// Runs cargo with `args` (and `RUSTC_BOOTSTRAP` when `bootstrap`) in the
/// workspace, failing the test with cargo's stderr unless it succeeds;
/// returns its stdout.
fn cargo(args: &[&str], bootstrap: bool) -> String {
    let mut command = Command::new(env!("CARGO"));
    command.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    if bootstrap {
        command.env("RUSTC_BOOTSTRAP", "1");
    }
    let output = command.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo {} failed: {}",
        args[0],
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("cargo prints UTF-8")
}

fn rustdoc_json() -> Value {
    let target = concat!(env!("CARGO_MANIFEST_DIR"), "/target/public-api");
    cargo(
        &[
            "rustdoc",
            "-q",
            "-p",
            "pgloom",
            "--lib",
            "--all-features",
            "--target-dir",
            target,
            "--",
            "-Z",
            "unstable-options",
            "--output-format",
            "json",
        ],
        true,
    );
    let text = std::fs::read_to_string(format!("{target}/doc/pgloom.json"))
        .expect("rustdoc wrote pgloom.json");
    serde_json::from_str(&text).expect("rustdoc's JSON parses")
}

#[test]
fn no_public_item_outside_interop_names_a_type_of_deadpool_tokio_postgres_rusqlite_or_tokio() {
    let doc = rustdoc_json();
    let walk = walk(&doc);
    let report: Vec<String> = walk
        .found
        .iter()
        .map(|(item, names)| format!("  {item}: {names:?}"))
        .collect();
    assert!(
        walk.found.is_empty(),
        "pgloom's public API names other crates' types outside pgloom::interop:\n{}",
        report.join("\n")
    );
    // An empty report from a walk that went everywhere: the error's
    // variants and their fields, a trait's implementations, and the
    // conversions it lets through (the driver errors into Error, a pool
    // into PgPool and back as a reference).
    for item in [
        "::pgloom::error::Error::Postgres",
        "::pgloom::error::Error::Postgres::0",
        "::pgloom::error::PgError",
        "::pgloom::PgPool",
        "::pgloom::event_store::EventStore",
    ] {
        assert!(walk.walked.contains(item), "the walk missed {item}");
    }
    assert!(
        walk.conversions.len() >= 5,
        "conversions let through: {:?}",
        walk.conversions
    );
}

/// The walk finds what it is there to find: the interop module itself
/// names the pool and the driver, and a public item that named one would
/// be reported (so an empty report is not an empty walk).
#[test]
fn the_walk_sees_the_interop_module_and_would_report_a_foreign_type() {
    let mut doc = rustdoc_json();
    // The interop module renamed: its items are walked like any other.
    let index = doc["index"].as_object_mut().expect("index");
    for item in index.values_mut() {
        if item["name"] == "interop" && item["inner"].get("module").is_some() {
            item["name"] = Value::from("interop_renamed");
        }
    }
    let found = walk(&doc).found;
    let all: BTreeSet<&String> = found.values().flatten().collect();
    assert!(
        all.iter().any(|name| name.contains("tokio_postgres")),
        "{found:?}"
    );
    assert!(
        all.iter().any(|name| name.contains("deadpool")),
        "{found:?}"
    );
}

/// A conversion the other way, out of pgloom's type into a driver's
/// (`AsRef<PgPool> for deadpool's Pool`, made from the real
/// `AsRef<Pool> for PgPool` by swapping its two types), is reported: only
/// std's conversions onto pgloom's own types are let through.
#[test]
fn a_conversion_onto_a_foreign_type_is_reported() {
    let mut doc = rustdoc_json();
    let index = doc["index"].as_object_mut().expect("index");
    let mut swapped = 0;
    for item in index.values_mut() {
        let Some(imp) = item["inner"].get_mut("impl") else {
            continue;
        };
        let ours = imp["for"]["resolved_path"]["path"] == "PgPool";
        let as_ref = imp["trait"]["path"] == "AsRef";
        if ours && as_ref {
            let ours = imp["for"].clone();
            let arg = &mut imp["trait"]["args"]["angle_bracketed"]["args"][0]["type"];
            imp["for"] = std::mem::replace(arg, ours);
            swapped += 1;
        }
    }
    assert_eq!(swapped, 1, "AsRef<Pool> for PgPool");
    let found = walk(&doc).found;
    assert!(
        found
            .values()
            .flatten()
            .any(|name| name.contains("deadpool")),
        "{found:?}"
    );
}

/// pgloom re-exports pgloom-core's modules (`frame`, `json`) without
/// walking them: pgloom-core must depend on none of the libraries the
/// rule is about, with every feature on.
#[test]
fn pgloom_core_depends_on_none_of_them() {
    let tree = cargo(
        &[
            "tree",
            "-q",
            "-p",
            "pgloom-core",
            "--all-features",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{lib}",
        ],
        false,
    );
    let libs: BTreeSet<&str> = tree.lines().map(str::trim).collect();
    assert!(libs.contains("pgloom_core"), "{tree}");
    for krate in FOREIGN {
        assert!(!libs.contains(krate), "pgloom-core depends on {krate}");
    }
}
