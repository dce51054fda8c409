//! pgloom's public API names no type of the libraries it runs on
//! (deadpool, tokio-postgres, rusqlite, tokio) outside `pgloom::interop`,
//! so that upgrading one of them is not a breaking release of pgloom
//! (docs/client.md#versions).
//!
//! It reads the crate's public API as rustdoc does (its JSON output, every
//! feature on; stable's rustdoc through RUSTC_BOOTSTRAP, as check.docs
//! builds the docs) and walks it from the crate root: every public item's
//! signature, field, variant, re-export and impl. Allowed outside the
//! interop module: the `From` conversions into loom's types (what `?`
//! makes of a driver's error, and a service's deadpool pool made a
//! `PgPool`) and `AsRef` to what a `PgPool` wraps; the interop module's
//! docs list them.

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

/// std's conversion traits whose impls may name a foreign type.
const CONVERSIONS: [&str; 2] = ["From", "AsRef"];

struct Api<'a> {
    index: &'a serde_json::Map<String, Value>,
    /// Each foreign id's path, for the report.
    foreign: BTreeMap<String, String>,
    seen: HashSet<String>,
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
        for key in ["items", "impls", "variants", "fields"] {
            take(inner.get(key));
        }
        if let Some(kind) = inner.get("kind") {
            take(kind.get("tuple"));
            take(kind.get("plain").and_then(|plain| plain.get("fields")));
            take(kind.get("struct").and_then(|fields| fields.get("fields")));
        }
        ids
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
        let Some((kind, inner)) = item["inner"].as_object().and_then(|o| o.iter().next()) else {
            return;
        };
        match kind.as_str() {
            "module" if name == "interop" => return,
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
                let conversion = inner["trait"]["path"]
                    .as_str()
                    .is_some_and(|path| CONVERSIONS.contains(&path));
                if conversion {
                    return;
                }
            }
            _ => {}
        }
        // The item's own signature, without its children (walked below,
        // each under its own name).
        let mut own = inner.clone();
        if let Some(map) = own.as_object_mut() {
            for key in ["items", "impls", "variants", "fields"] {
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

/// Every item outside `interop` that names a foreign type, in the rustdoc
/// JSON `doc`.
fn foreign_names(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
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
        foreign,
        seen: HashSet::new(),
        found: BTreeMap::new(),
    };
    let root = doc["root"].as_u64().expect("root").to_string();
    api.walk(&root, "");
    api.found
}

fn rustdoc_json() -> Value {
    let target = concat!(env!("CARGO_MANIFEST_DIR"), "/target/public-api");
    let output = Command::new(env!("CARGO"))
        .args(["rustdoc", "-q", "-p", "pgloom", "--lib", "--all-features"])
        .args(["--target-dir", target])
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        .env("RUSTC_BOOTSTRAP", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo rustdoc runs");
    assert!(
        output.status.success(),
        "cargo rustdoc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(format!("{target}/doc/pgloom.json"))
        .expect("rustdoc wrote pgloom.json");
    serde_json::from_str(&text).expect("rustdoc's JSON parses")
}

#[test]
fn no_public_item_outside_interop_names_a_type_of_deadpool_tokio_postgres_rusqlite_or_tokio() {
    let doc = rustdoc_json();
    let found = foreign_names(&doc);
    let report: Vec<String> = found
        .iter()
        .map(|(item, names)| format!("  {item}: {names:?}"))
        .collect();
    assert!(
        found.is_empty(),
        "pgloom's public API names other crates' types outside pgloom::interop:\n{}",
        report.join("\n")
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
    let found = foreign_names(&doc);
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
