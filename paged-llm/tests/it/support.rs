//! Helpers of the command's tests: `paged-llm serve` started on a free port.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The program under test.
pub fn paged_llm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_paged-llm"))
}

/// Starts `paged-llm serve --model MODEL --port 0 EXTRA…`; returns it and its port, read from
/// its banner.
pub fn start(model: &std::path::Path, extra: &[&str]) -> (Child, u16) {
    let mut child = paged_llm()
        .args(["serve", "--model"])
        .arg(model)
        .args(["--port", "0"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("server binary: {e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("stderr"));
    let mut lines = BufReader::new(stderr).lines();
    let port = loop {
        let line =
            lines.next().unwrap_or_else(|| panic!("the server exited before listening")).unwrap_or_default();
        if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{line}"));
        }
    };
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, port)
}
