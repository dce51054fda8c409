//! Any JSON text and path through `find_path` (issue 25): it must never
//! panic, what it finds must be a trimmed slice of the text that is JSON
//! itself, and walking a path must agree with walking its first step and
//! then the rest inside what that found. The input is the path's steps,
//! separated by `/`, then a NUL, then the text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgloom_core::json::{find_path, JsonString};

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&b| b == 0) else {
        return;
    };
    let path = String::from_utf8_lossy(&data[..split]);
    let steps: Vec<&str> = if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    };
    let Ok(text) = std::str::from_utf8(&data[split + 1..]) else {
        return;
    };
    let Ok(json) = JsonString::new(text.to_owned()) else {
        return;
    };
    let found = find_path(&json, &steps);
    if let Some(value) = found {
        assert_eq!(value, value.trim_matches([' ', '\t', '\n', '\r']));
        let offset = value.as_ptr() as usize - json.as_str().as_ptr() as usize;
        assert!(offset + value.len() <= json.as_str().len());
        pgloom_core::json::validate(value.as_bytes()).expect("a value is JSON");
    }
    if let Some((first, rest)) = steps.split_first() {
        let stepwise = find_path(&json, &[first]).and_then(|value| {
            let value = JsonString::new(value.to_owned()).expect("a value is JSON");
            find_path(&value, rest).map(str::to_owned)
        });
        assert_eq!(found.map(str::to_owned), stepwise);
    }
});
