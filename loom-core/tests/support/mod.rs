//! Frames made by the `zstd` command-line tool, the reference
//! implementation: what loom must read, and what it must refuse.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `sh -c script` with `input` on stdin and returns stdout, prefixed
/// with loom's 0x02 format byte.
pub fn zstd_cli_frame(script: &str, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs (the zstd CLI is installed by `make deps`)");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    [&[0x02][..], &out.stdout].concat()
}
