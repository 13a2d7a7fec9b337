//! `paged-llm serve` and SIGTERM: it stops accepting, lets an in-flight stream finish (the
//! default) or aborts it (`--abort-on-shutdown`), and exits 0.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};

use crate::support::start;

/// The tiny model's cache and length.
const TINY: &[&str] = &["--num-kv-blocks", "64", "--max-model-len", "512"];
use std::time::{Duration, Instant};

/// Sends a streaming completion and reads until its first SSE event; returns the open socket.
fn open_stream(port: u16, max_tokens: usize) -> (TcpStream, String) {
    let body =
        format!(r#"{{"prompt": "hello", "max_tokens": {max_tokens}, "ignore_eos": true, "stream": true}}"#);
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect: {e}"));
    sock.set_read_timeout(Some(Duration::from_secs(120))).unwrap_or_else(|e| panic!("{e}"));
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("data: ") {
        let n = sock.read(&mut buf).unwrap_or_else(|e| panic!("read: {e}"));
        assert!(n > 0, "closed before the first event: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    (sock, seen)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -TERM failed");
}

/// Waits (bounded) for the process to exit; returns its status.
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not exit within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_drains_in_flight_streams_then_exits_0() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    model::testing::write_tiny_llama(dir.path(), 42);
    let (mut child, port) = start(dir.path(), TINY);
    let (mut sock, mut seen) = open_stream(port, 200);
    sigterm(&child);
    sock.read_to_string(&mut seen).unwrap_or_else(|e| panic!("{e}"));
    assert!(seen.contains("\"finish_reason\":\"length\"") && seen.contains("data: [DONE]"), "{seen}");
    assert!(wait_exit(&mut child).success());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "still accepting after shutdown");
}

#[test]
fn sigterm_with_abort_on_shutdown_ends_streams_at_once() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    model::testing::write_tiny_llama(dir.path(), 42);
    let (mut child, port) = start(dir.path(), &[TINY, &["--abort-on-shutdown"]].concat());
    let (mut sock, mut seen) = open_stream(port, 400);
    sigterm(&child);
    sock.read_to_string(&mut seen).unwrap_or_else(|e| panic!("{e}"));
    assert!(seen.contains("\"finish_reason\":\"abort\""), "{seen}");
    assert!(wait_exit(&mut child).success());
}
