//! A deterministic synthetic agent state, the shape ADR 0141 measured: a
//! running agent loop whose turns carry 1-4 KB tool outputs drawn from a
//! 20-word vocabulary, optionally claim-checked (each output over 1 KB
//! replaced by a content reference).
//!
//! It exists so that benchmarks, the demo and tests of every store measure
//! the same bytes, run after run and machine after machine.
//!
//! ```
//! use pgloom_core::synthetic::agent_state;
//! let plain = agent_state(50, false);
//! let claim_checked = agent_state(50, true);
//! assert_eq!(plain, agent_state(50, false)); // deterministic
//! assert!(claim_checked.len() * 3 < plain.len());
//! assert!(pgloom_core::json::validate(plain.as_bytes()).is_ok());
//! ```

use std::fmt::Write;

const VOCABULARY: [&str; 20] = [
    "agent", "tool", "result", "search", "query", "page", "token", "model", "plan", "step",
    "error", "retry", "cache", "index", "vector", "answer", "source", "claim", "check", "loop",
];
const TOOLS: [&str; 4] = ["search", "fetch_page", "run_code", "read_file"];
/// Outputs over this many bytes are replaced by a content reference when
/// claim-checking.
pub const CLAIM_CHECK_CAP: usize = 1024;

/// splitmix64: tiny, deterministic, good enough to pick words.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn words(&mut self, target_bytes: usize) -> String {
        let mut text = String::with_capacity(target_bytes + 8);
        while text.len() < target_bytes {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(VOCABULARY[self.below(VOCABULARY.len())]);
        }
        text
    }
}

/// FNV-1a, to name claim-checked content deterministically.
fn content_hash(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// The JSON text of an agent loop's folded state after `turns` turns.
///
/// Every string is drawn from ASCII words, so the text needs no escaping.
#[must_use]
pub fn agent_state(turns: usize, claim_checked: bool) -> String {
    let mut rng = Rng(0x1008_0141);
    let mut json = String::from(
        r#"{"executionId":"exec-synthetic-0141","workflowId":"agentLoop$","status":"running","turns":["#,
    );
    for turn in 0..turns {
        if turn > 0 {
            json.push(',');
        }
        let len = 120 + rng.below(200);
        let thought = rng.words(len);
        let tool = TOOLS[rng.below(TOOLS.len())];
        let len = 16 + rng.below(32);
        let query = rng.words(len);
        let len = 1024 + rng.below(3072);
        let output = rng.words(len);
        let output = if claim_checked && output.len() > CLAIM_CHECK_CAP {
            format!(
                r#"{{"$contentRef":"fnv1a64:{:016x}","bytes":{}}}"#,
                content_hash(&output),
                output.len()
            )
        } else {
            format!("\"{output}\"")
        };
        write!(
            json,
            r#"{{"turn":{turn},"role":"assistant","thought":"{thought}","call":{{"tool":"{tool}","args":{{"query":"{query}","limit":{}}}}},"output":{output},"tokens":{{"in":{},"out":{}}}}}"#,
            1 + rng.below(20),
            200 + rng.below(4000),
            20 + rng.below(400),
        )
        .expect("writing to a String cannot fail");
    }
    json.push_str("]}");
    json
}

/// States whose exact text a parse-and-reserialize round trip would lose
/// (ADR 0141's test list): key order, duplicate keys, `__proto__`, escaped
/// lone surrogates, `\u0000`, 2,000-deep nesting, 2,000 steps. Each with a
/// name, for messages.
#[must_use]
pub fn adversarial_states() -> Vec<(&'static str, String)> {
    let deep = 2000;
    let steps: Vec<String> = (0..2000)
        .map(|i| format!(r#"{{"step":{i},"ok":true}}"#))
        .collect();
    vec![
        (
            "key order",
            r#"{"z":1,"a":2,"m":{"y":[],"b":{}}}"#.to_owned(),
        ),
        ("duplicate keys", r#"{"a":1,"a":2}"#.to_owned()),
        (
            "__proto__",
            r#"{"__proto__":{"polluted":true},"constructor":1}"#.to_owned(),
        ),
        (
            "lone surrogates",
            r#"["\ud800","\udfff","x\ud834y"]"#.to_owned(),
        ),
        (
            "NUL escape",
            r#"{"nul":"\u0000","ctl":"\u001f"}"#.to_owned(),
        ),
        (
            "escaped and raw unicode",
            "[\"\\u00e9\",\"\u{e9}\",\"e\u{301}\",\"\u{1D11E}\"]".to_owned(),
        ),
        ("whitespace", " {\n\t\"a\" : [ 1 ,2 ] }\r\n".to_owned()),
        ("number spellings", "[1.0,1e2,1E+2,-0,0.000001]".to_owned()),
        (
            "2,000-deep nesting",
            format!("{}1{}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (
            "2,000 steps",
            format!("{{\"steps\":[{}]}}", steps.join(",")),
        ),
        ("scalar", "\"just a string\"".to_owned()),
    ]
}
