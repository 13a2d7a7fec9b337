//! The web page in a real browser: headless Chromium (Debian's `chromium`) driven over
//! WebDriver (`fantoccini` → Debian's `chromium-driver`, started here on a free loopback port)
//! against the server on 127.0.0.1 over the real SmolLM2 model (whose tokens arrive slowly
//! enough on a CPU to watch them stream). One browser and one server serve every step, in
//! order; each step reloads the page and starts from an idle engine.
//!
//! Steps: the page loads without console errors (a 100 000-block pool aggregates into cells, a
//! swapped sequence draws in the host pool); every control has an accessible label; Shift+Enter
//! is a new line, and a chat message sent with Enter streams into the page token by token
//! while the KV map shows owned blocks; two requests sharing a long prompt show shared blocks
//! (and a hovered or focused sequence its block table), none held after they finish; Stop and
//! Escape abort a long generation and free its blocks (the page's map, `GET /v1/kv_map` and
//! `/metrics` agree); a 400 and an SSE error event show as errors; the calculator draws its
//! chart and shows a 400 as an error; at 390 px nothing overflows horizontally. Screenshots of
//! each state go to `target/web-screenshots/`.
//!
//! Its own harness (`harness = false`): the steps share one browser, run in order, and print
//! libtest's lines (`test … ok`, `test result: …`) so `cargo xtask test` counts them. Needs
//! `chromium` and `chromium-driver` (`cargo xtask test` installs them as root; otherwise
//! `apt-get install -y chromium chromium-driver`) and the model (`cargo xtask fetch-model`).
//! Never skips: a missing piece fails with what to install.

use std::future::Future;
use std::net::TcpListener as StdListener;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{Engine, EngineConfig, EngineHandle};
use fantoccini::actions::{InputSource, MouseActions, PointerAction};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::{Value, json};
use server::{AppState, ServerConfig};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const INSTALL: &str = "install them with `apt-get install -y chromium chromium-driver` \
                       (`cargo xtask test` does this when run as root)";
/// Device blocks of the test engine (16 tokens each).
const BLOCKS: usize = 384;

type StepFn = for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

fn main() {
    // libtest's arguments: filters, and flags (some with a value) that this harness ignores.
    let (mut filter, mut args) = (Vec::new(), std::env::args().skip(1));
    while let Some(a) = args.next() {
        if ["--test-threads", "--skip", "--format", "--color", "--logfile", "-Z"].contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            filter.push(a);
        }
    }
    let steps: [(&str, StepFn); 10] = [
        ("page_loads_without_console_errors", |c| Box::pin(page_loads_without_console_errors(c))),
        ("every_control_has_an_accessible_label", |c| Box::pin(every_control_has_an_accessible_label(c))),
        ("enter_sends_and_the_reply_streams_token_by_token", |c| {
            Box::pin(enter_sends_and_the_reply_streams(c))
        }),
        ("shared_prompt_blocks_show_as_shared_and_none_after", |c| Box::pin(shared_prompt_blocks(c))),
        ("stop_button_aborts_and_frees_the_blocks", |c| Box::pin(stop_button_frees_blocks(c))),
        ("escape_aborts_and_frees_the_blocks", |c| Box::pin(escape_frees_blocks(c))),
        ("server_errors_show_as_errors", |c| Box::pin(server_errors_show_as_errors(c))),
        ("sse_error_events_show_as_errors", |c| Box::pin(sse_error_event_shows_as_error(c))),
        ("calculator_draws_its_chart_and_shows_bad_sizes", |c| Box::pin(calculator(c))),
        ("phone_width_has_no_horizontal_overflow", |c| Box::pin(phone_width(c))),
    ];
    let chosen: Vec<_> = steps
        .iter()
        .filter(|(name, _)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if chosen.is_empty() {
        println!(
            "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {} filtered out\n",
            steps.len()
        );
        return;
    }
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let ctx = runtime.block_on(Ctx::start());
    println!("\nrunning {} tests (one browser, in order)", chosen.len());
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, step) in &chosen {
        let t = Instant::now();
        let result = runtime.block_on(AssertUnwindSafe(step(&ctx)).catch_unwind());
        match result {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
            }
            Err(_) => {
                println!("test {name} ... FAILED ({:.1} s)", t.elapsed().as_secs_f64());
                failed.push(*name);
            }
        }
    }
    runtime.block_on(ctx.stop());
    drop(runtime);
    println!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        steps.len() - chosen.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        eprintln!("failed: {}", failed.join(", "));
        std::process::exit(101);
    }
}

// ------------------------------------------------------------------------------------ fixture

/// chromedriver (and the Chromium it starts) in a process group of their own, killed together
/// on drop.
struct Driver {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group id is chromedriver's pid (`process_group(0)`): this ends the browser too.
        let pgid = self.child.id();
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start() -> Driver {
        for (path, what) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromedriver (chromium-driver)")] {
            assert!(Path::new(path).exists(), "{what} not found at {path}: {INSTALL}");
        }
        let port = free_port();
        let child = {
            use std::os::unix::process::CommandExt;
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {CHROMEDRIVER}: {e} ({INSTALL})"))
        };
        let profile = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let driver = Driver { child, port, profile };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }
}

fn free_port() -> u16 {
    let l = StdListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    l.local_addr().unwrap_or_else(|e| panic!("{e}")).port()
}

struct Ctx {
    client: Client,
    base: String,
    http: reqwest::Client,
    shots: PathBuf,
    stop_server: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
    // Dropped last: kills chromedriver and Chromium.
    _driver: Driver,
}

impl Ctx {
    async fn start() -> Ctx {
        let driver = Driver::start();
        let dir = model::testing::smollm2_dir_for_tests();
        let config = EngineConfig {
            kv_cache: engine::KvCacheSize::Blocks(BLOCKS),
            max_model_len: Some(2048),
            max_num_batched_tokens: 512,
            enable_prefix_caching: true,
            log_interval: Duration::ZERO,
            ..EngineConfig::default()
        };
        let handle = EngineHandle::spawn(Engine::new(&dir, config).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
        let server_config = ServerConfig::default();
        let state = Arc::new(AppState::new(handle, &server_config).unwrap_or_else(|e| panic!("{e}")));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let base = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
        let (stop_server, rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let _ = server::serve(listener, state, &server_config, async {
                let _ = rx.await;
            })
            .await;
        });

        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--disable-crash-reporter", "--disable-breakpad", "--hide-scrollbars", "--window-size=1280,1000",
                    format!("--user-data-dir={}", driver.profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
            .unwrap_or_else(|e| panic!("WebDriver session with {CHROMIUM}: {e} ({INSTALL})"));
        let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/web-screenshots");
        std::fs::create_dir_all(&shots).unwrap_or_else(|e| panic!("{}: {e}", shots.display()));
        Ctx { client, base, http: reqwest::Client::new(), shots, stop_server, served, _driver: driver }
    }

    async fn stop(self) {
        let _ = self.client.close().await;
        let _ = self.stop_server.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.served).await;
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` (a function body returning a value) until it is truthy; returns it.
    async fn until(&self, what: &str, secs: u64, script: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.js(script).await;
            if !matches!(v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("") {
                return v;
            }
            if Instant::now() >= deadline {
                // What the page said may tell why (a script error, a failed fetch).
                let console = self.console().await;
                panic!("timed out after {secs} s waiting for {what}; console: {console:#?}");
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("screenshot: {e}"));
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Chromium's console entries since the last call (chromedriver's log endpoint).
    async fn console(&self) -> Vec<Value> {
        let v =
            self.client.issue_cmd(BrowserLog).await.unwrap_or_else(|e| panic!("reading the console: {e}"));
        v.as_array().cloned().unwrap_or_default()
    }

    async fn assert_no_console_errors(&self) {
        let severe: Vec<Value> =
            self.console().await.into_iter().filter(|e| e["level"] == "SEVERE").collect();
        assert!(severe.is_empty(), "console errors: {severe:#?}");
    }

    async fn server_json(&self, path: &str) -> Value {
        let resp =
            self.http.get(format!("{}{path}", self.base)).send().await.unwrap_or_else(|e| panic!("{e}"));
        resp.json().await.unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    async fn metric(&self, name: &str) -> f64 {
        let text =
            self.http.get(format!("{}/metrics", self.base)).send().await.unwrap_or_else(|e| panic!("{e}"));
        let text = text.text().await.unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// Waits until the engine holds no block (`GET /v1/kv_map`: no table, nothing owned or
    /// shared); returns the last map.
    async fn wait_server_idle(&self, secs: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.server_json("/v1/kv_map").await;
            let dev = v["device"].as_str().unwrap_or_default();
            if v["tables"].as_array().is_some_and(Vec::is_empty) && !dev.contains(['o', 's']) {
                return v;
            }
            assert!(Instant::now() < deadline, "the server still holds blocks after {secs} s: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A fresh page at `width`×`height`, with the model shown and the KV map live.
    async fn fresh_page(&self) {
        self.wait_server_idle(30).await;
        self.client.goto(&self.base).await.unwrap_or_else(|e| panic!("goto: {e}"));
        self.until("the model name", 30, "return document.getElementById('model-name').textContent === 'SmolLM2-135M-Instruct' || document.getElementById('model-name').textContent.length > 0 && document.getElementById('model-len').textContent").await;
        self.until("the live KV map", 30, "return document.getElementById('kv-canvas').dataset.generation")
            .await;
    }

    async fn set_value(&self, id: &str, value: &str) {
        self.client
            .execute(
                "const e = document.getElementById(arguments[0]); e.value = arguments[1]; \
                 e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true}));",
                vec![json!(id), json!(value)],
            )
            .await
            .unwrap_or_else(|e| panic!("setting #{id}: {e}"));
    }

    async fn type_into(&self, id: &str, text: &str) {
        let e = self.client.find(Locator::Id(id)).await.unwrap_or_else(|e| panic!("#{id}: {e}"));
        e.send_keys(text).await.unwrap_or_else(|e| panic!("typing into #{id}: {e}"));
    }

    async fn click(&self, id: &str) {
        let e = self.client.find(Locator::Id(id)).await.unwrap_or_else(|e| panic!("#{id}: {e}"));
        e.click().await.unwrap_or_else(|e| panic!("clicking #{id}: {e}"));
    }

    /// The page's counts of block states (data attributes the KV canvas carries).
    async fn page_blocks(&self) -> Value {
        self.js("const d = document.getElementById('kv-canvas').dataset; return {owned: +d.owned, shared: +d.shared, cached: +d.cached, free: +d.free, generation: +d.generation};").await
    }
}

/// `POST /session/{id}/se/log {"type": "browser"}`: chromedriver's console log.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (axum::http::Method, Option<String>) {
        (axum::http::Method::POST, Some(json!({"type": "browser"}).to_string()))
    }
}

/// `POST /session/{id}/goog/cdp/execute`: a DevTools command (the phone-width emulation).
#[derive(Debug)]
struct Cdp(&'static str, Value);

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/goog/cdp/execute", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (axum::http::Method, Option<String>) {
        (axum::http::Method::POST, Some(json!({"cmd": self.0, "params": self.1}).to_string()))
    }
}

// ------------------------------------------------------------------------------------ steps

async fn page_loads_without_console_errors(c: &Ctx) {
    c.fresh_page().await;
    let v = c.js("return {name: document.getElementById('model-name').textContent, len: document.getElementById('model-len').textContent, title: document.title};").await;
    assert_eq!(v["name"], "SmolLM2-135M-Instruct", "{v}");
    assert!(v["len"].as_str().is_some_and(|s| s.contains("2,048")), "max length shown: {v}");
    let blocks = c.page_blocks().await;
    assert_eq!(
        blocks["free"].as_u64().unwrap_or(0) + blocks["cached"].as_u64().unwrap_or(0),
        BLOCKS as u64,
        "{blocks}"
    );
    assert_eq!(c.js("return document.getElementById('kv-status').textContent").await, "live");
    // The calculator runs once on load.
    c.until("the calculator's first result", 30, "return !document.getElementById('calc-results').hidden")
        .await;
    // A large pool aggregates blocks per cell (at most 4096 cells), and drawing it stays cheap.
    let big = c.js("const L = gridLayout(100000, 600); const cv = document.createElement('canvas'); const wrap = document.createElement('div'); wrap.style.width = '600px'; wrap.appendChild(cv); document.body.appendChild(wrap); const states = '.cos'.repeat(25000); const t = performance.now(); drawPool(cv, states, false, new Set([5, 99999])); const ms = performance.now() - t; wrap.remove(); return {per: L.per, cells: L.cells, ms};").await;
    assert_eq!((big["per"].clone(), big["cells"].clone()), (json!(25), json!(4000)), "{big}");
    assert!(big["ms"].as_f64().is_some_and(|ms| ms < 100.0), "drawing 100 000 blocks: {big}");
    c.shot("01-loaded").await;
    // The host swap pool (the test engine has none): a snapshot with a swapped sequence draws
    // the host grid in the swapped colour and lists the sequence as swapped, its table in the
    // host pool. The next live snapshot replaces it.
    let swapped = c.js(r#"
        const fake = {generation: 1, block_size: 16, device: 'c...', host: 'o.o.',
          tables: [{id: 'req-swapped', key: 9, seq: 0, swapped: true, tokens: 20, blocks: [0, 2]}],
          counters: {kv_usage: 0, prefix_hit_rate: 0, prefix_queried_tokens: 0, num_running: 0,
                     num_waiting: 0, num_swapped: 1, num_preemptions: 1}};
        applySnapshot(fake);
        kv.selected = '9:0';
        render();
        const px = Array.from(document.getElementById('host-canvas').getContext('2d').getImageData(3, 3, 1, 1).data);
        const out = {shown: !document.getElementById('host-wrap').hidden, px,
          item: document.querySelector('#tables li').textContent,
          table: document.getElementById('block-table').textContent,
          swappedCount: document.getElementById('c-swapped').textContent};
        kv.selected = null;
        return out;
    "#).await;
    assert_eq!(swapped["shown"], true, "{swapped}");
    assert_eq!(swapped["px"], json!([139, 92, 246, 255]), "the swapped colour: {swapped}");
    assert!(
        swapped["item"].as_str().is_some_and(|t| t.contains("req-swapped") && t.contains("swapped")),
        "{swapped}"
    );
    assert!(
        swapped["table"].as_str().is_some_and(|t| t.contains("host pool") && t.contains("1 → 2")),
        "{swapped}"
    );
    assert_eq!(swapped["swappedCount"], "1");
    c.until("the live map back", 10, "return document.getElementById('host-wrap').hidden && document.querySelectorAll('#tables li').length === 0").await;
    c.assert_no_console_errors().await;
}

async fn every_control_has_an_accessible_label(c: &Ctx) {
    c.fresh_page().await;
    let unlabeled = c
        .js(r#"
        const bad = [];
        for (const e of document.querySelectorAll('input, select, textarea, button')) {
          const byLabel = Array.from(e.labels || []).some((l) => l.textContent.trim().length > 0);
          const byAria = (e.getAttribute('aria-label') || '').trim().length > 0 ||
            (e.getAttribute('aria-labelledby') || '').split(' ').some((id) => id && document.getElementById(id));
          const byText = e.tagName === 'BUTTON' && e.textContent.trim().length > 0;
          if (!byLabel && !byAria && !byText) bad.push(e.outerHTML.slice(0, 120));
        }
        const focusable = document.querySelectorAll('#tables li[tabindex="0"]').length;
        return {bad, count: document.querySelectorAll('input, select, textarea, button').length, focusable};
        "#)
        .await;
    assert_eq!(v_arr(&unlabeled["bad"]).len(), 0, "controls without an accessible label: {unlabeled:#}");
    assert!(unlabeled["count"].as_u64().unwrap_or(0) >= 20, "{unlabeled}");
    // Keyboard: the prompt takes focus with Tab order intact (nothing has a positive tabindex).
    let positive = c
        .js("return Array.from(document.querySelectorAll('[tabindex]')).filter((e) => e.tabIndex > 0).length")
        .await;
    assert_eq!(positive, 0);
    c.assert_no_console_errors().await;
}

fn v_arr(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// Records every length the newest assistant message's text takes (a MutationObserver).
const WATCH_LENGTHS: &str = r#"
  window.__lengths = [];
  window.__owned = 0;
  new MutationObserver(() => {
    const m = document.querySelectorAll('.msg.assistant .body');
    const last = m[m.length - 1];
    if (!last) return;
    const n = last.textContent.length;
    if (window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
  }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
  new MutationObserver(() => {
    window.__owned = Math.max(window.__owned, +document.getElementById('kv-canvas').dataset.owned || 0);
  }).observe(document.getElementById('kv-canvas'), {attributes: true});
"#;

async fn enter_sends_and_the_reply_streams(c: &Ctx) {
    c.fresh_page().await;
    c.js(WATCH_LENGTHS).await;
    c.set_value("max-tokens", "48").await;
    c.set_value("temperature", "0").await;
    // Shift+Enter is a new line, not a send.
    c.type_into("prompt", "first line\u{E008}\u{E007}\u{E000}second line").await;
    let v = c.js("return {value: document.getElementById('prompt').value, sent: document.querySelectorAll('.msg').length}").await;
    assert_eq!(v, json!({"value": "first line\nsecond line", "sent": 0}));
    c.set_value("prompt", "").await;
    c.type_into("prompt", "Write three sentences about the ocean.").await;
    c.type_into("prompt", "\u{E007}").await; // Enter
    c.until("streaming to start", 30, "const m = document.querySelector('.msg.assistant'); return m && +m.dataset.deltas >= 4 && m.dataset.state === 'streaming'").await;
    assert_eq!(c.js("return document.getElementById('prompt').value").await, "", "Enter sent the message");
    assert_eq!(c.js("return document.querySelectorAll('.msg.user').length").await, 1);
    c.until(
        "owned blocks in the page's map",
        20,
        "return window.__owned > 0 || +document.getElementById('kv-canvas').dataset.owned > 0",
    )
    .await;
    c.shot("02-streaming").await;
    c.until(
        "the reply to finish",
        60,
        "return document.querySelector('.msg.assistant').dataset.state !== 'streaming'",
    )
    .await;
    let v = c.js("const m = document.querySelector('.msg.assistant'); return {state: m.dataset.state, deltas: +m.dataset.deltas, updates: +m.dataset.updates, text: m.querySelector('.body').textContent, meta: m.querySelector('.meta').textContent, lengths: window.__lengths};").await;
    assert_eq!(v["state"], "done", "{v:#}");
    let deltas = v["deltas"].as_u64().unwrap_or(0);
    let tokens: u64 =
        v["meta"].as_str().and_then(|m| m.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    // One content chunk per generated token (the last may be the end-of-sequence token, sent as
    // an empty delta with the finish reason), each applied as it came.
    assert!(deltas >= 2 && tokens >= 2, "{v:#}");
    assert!(deltas + 1 >= tokens && deltas <= tokens, "one delta per token: {v:#}");
    let lengths: Vec<u64> = v_arr(&v["lengths"]).iter().filter_map(Value::as_u64).collect();
    assert!(lengths.len() as u64 >= tokens / 2, "the text grew in many steps, not at once: {v:#}");
    assert!(lengths.windows(2).all(|w| w[0] < w[1]), "the text only grew: {v:#}");
    assert!(v["text"].as_str().is_some_and(|t| t.len() > 10), "{v:#}");
    c.wait_server_idle(10).await;
    c.until("the page's map to show no owned blocks", 10, "return +document.getElementById('kv-canvas').dataset.owned === 0 && +document.getElementById('kv-canvas').dataset.shared === 0").await;
    c.assert_no_console_errors().await;
}

/// A prompt of several blocks (the test engine's blocks hold 16 tokens).
fn long_prompt() -> String {
    let mut s = String::from("You are reading a long shared system prompt about paged attention. ");
    for i in 0..6 {
        s.push_str(&format!("Paragraph {i}: the key-value cache is split into fixed-size blocks, and a block table maps each sequence's logical blocks onto physical ones. "));
    }
    s
}

async fn shared_prompt_blocks(c: &Ctx) {
    c.fresh_page().await;
    let prompt = long_prompt();
    let body =
        json!({"prompt": prompt, "max_tokens": 24, "ignore_eos": true, "temperature": 0, "stream": true});
    let url = format!("{}/v1/completions", c.base);
    // The first request; the second starts once the first is decoding (its prompt blocks are
    // in the prefix cache by then), so its full prompt blocks are prefix hits: shared.
    let first = c.http.post(&url).json(&body).send().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(first.status().is_success());
    let mut first_body = first.bytes_stream();
    let _ = futures_util::StreamExt::next(&mut first_body).await;
    let second = c.http.post(&url).json(&body).send().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(second.status().is_success());
    let seen = c.until("shared blocks in the page's map", 20, "const d = document.getElementById('kv-canvas').dataset; return +d.shared > 0 && document.querySelectorAll('#tables li').length >= 2 ? {shared: +d.shared, owned: +d.owned} : null").await;
    assert!(
        seen["shared"].as_u64().unwrap_or(0) >= 4,
        "a prompt of {} chars spans several shared blocks: {seen}",
        prompt.len()
    );
    // Hover the first sequence: its block table appears and its blocks are outlined.
    let li = c.client.find(Locator::Css("#tables li")).await.unwrap_or_else(|e| panic!("{e}"));
    let hover = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
        element: li,
        duration: None,
        x: 0.0,
        y: 0.0,
    });
    c.client.perform_actions(hover).await.unwrap_or_else(|e| panic!("hovering the sequence: {e}"));
    let table = c
        .until("the block table", 5, "return document.querySelectorAll('#block-table .bt-cell').length")
        .await;
    let shared_cells = c.js("return document.querySelectorAll('#block-table .bt-cell.shared').length").await;
    assert!(
        table.as_u64().unwrap_or(0) >= 5 && shared_cells.as_u64().unwrap_or(0) >= 4,
        "{table} cells, {shared_cells} shared"
    );
    c.client.execute("window.scrollTo(0, 0)", vec![]).await.unwrap_or_else(|e| panic!("{e}"));
    c.shot("03-shared-blocks").await;
    // The keyboard reaches the same view: the second sequence, focused, shows its own table.
    let v = c.js("const li = document.querySelectorAll('#tables li')[1]; li.focus(); return {focused: document.activeElement === li, selected: li.classList.contains('selected'), title: document.querySelector('#block-table .bt-title').textContent, id: li.querySelector('.rid').textContent};").await;
    assert_eq!((v["focused"].clone(), v["selected"].clone()), (json!(true), json!(true)), "{v}");
    assert!(v["title"].as_str().zip(v["id"].as_str()).is_some_and(|(t, id)| t.contains(id)), "{v}");
    // Let both finish.
    while futures_util::StreamExt::next(&mut first_body).await.is_some() {}
    let _ = second.bytes().await;
    c.wait_server_idle(10).await;
    let after = c.until("no held blocks in the page's map", 10, "const d = document.getElementById('kv-canvas').dataset; return +d.owned === 0 && +d.shared === 0 && document.querySelectorAll('#tables li').length === 0 ? {cached: +d.cached} : null").await;
    assert!(after["cached"].as_u64().unwrap_or(0) > 0, "finished prompts stay cached (evictable): {after}");
    c.shot("04-after-finish").await;
    c.assert_no_console_errors().await;
}

/// Starts a long generation from the page and waits until it streams with blocks held.
async fn start_long_generation(c: &Ctx) {
    c.fresh_page().await;
    c.set_value("max-tokens", "1500").await;
    c.client
        .execute("document.getElementById('ignore-eos').checked = true", vec![])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    c.type_into("prompt", "Tell me a very long story about a lighthouse keeper.").await;
    c.click("send").await;
    c.until("streaming with blocks held", 30, "const m = document.querySelector('.msg.assistant'); return m && +m.dataset.deltas >= 3 && +document.getElementById('kv-canvas').dataset.owned > 0").await;
    let server = c.server_json("/v1/kv_map").await;
    assert_eq!(server["tables"].as_array().map(Vec::len), Some(1), "{server}");
}

/// After a stop: the page says so, the server aborted the request (it never finished, no token
/// is generated any more) and holds no block, and the page's map agrees.
async fn assert_stopped_and_freed(c: &Ctx, finished_before: f64, name: &str) {
    c.until(
        "the message to show it stopped",
        10,
        "return document.querySelector('.msg.assistant').dataset.state === 'stopped'",
    )
    .await;
    let v = c.js("const m = document.querySelector('.msg.assistant'); return {deltas: +m.dataset.deltas, meta: m.querySelector('.meta').textContent, send: document.getElementById('send').disabled, stop: document.getElementById('stop').disabled};").await;
    assert!(v["deltas"].as_u64().unwrap_or(0) < 1500, "{v}");
    assert!(v["meta"].as_str().is_some_and(|m| m.contains("stopped")), "{v}");
    assert_eq!((v["send"].clone(), v["stop"].clone()), (json!(false), json!(true)), "{v}");
    let map = c.wait_server_idle(5).await;
    assert_eq!(map["counters"]["num_running"], 0, "{map}");
    let tokens = c.metric("vllm:generation_tokens_total").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.metric("vllm:generation_tokens_total").await, tokens, "the engine stopped generating");
    assert_eq!(
        c.metric("vllm:request_success_total").await,
        finished_before,
        "the request was aborted, not finished"
    );
    c.until("the page's map to free the blocks", 5, "const d = document.getElementById('kv-canvas').dataset; return +d.owned === 0 && +d.shared === 0 && document.querySelectorAll('#tables li').length === 0").await;
    c.shot(name).await;
    c.assert_no_console_errors().await;
}

async fn stop_button_frees_blocks(c: &Ctx) {
    start_long_generation(c).await;
    let finished = c.metric("vllm:request_success_total").await;
    c.click("stop").await;
    assert_stopped_and_freed(c, finished, "05-after-stop").await;
}

async fn escape_frees_blocks(c: &Ctx) {
    start_long_generation(c).await;
    let finished = c.metric("vllm:request_success_total").await;
    c.type_into("prompt", "\u{E00C}").await; // Escape
    assert_stopped_and_freed(c, finished, "06-after-escape").await;
}

async fn server_errors_show_as_errors(c: &Ctx) {
    c.fresh_page().await;
    // More tokens than the model's length: the server answers 400 with a message.
    c.set_value("max-tokens", "100000").await;
    c.type_into("prompt", "hello\u{E007}").await;
    let err = c
        .until(
            "an error message",
            20,
            "const e = document.querySelector('.msg.error'); return e && e.textContent",
        )
        .await;
    let text = err.as_str().unwrap_or_default();
    assert!(text.contains("HTTP 400") && text.contains("exceeds max_model_len 2048"), "{text}");
    assert_eq!(c.js("return document.getElementById('send').disabled").await, false);
    // The one console entry is the browser's own report of the 400.
    let severe: Vec<Value> = c.console().await.into_iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(severe.iter().all(|e| e["message"].as_str().is_some_and(|m| m.contains("400"))), "{severe:#?}");
    c.shot("07-server-error").await;
}

/// An error event inside a 200 stream (what the server sends when a request fails after its
/// first chunk) shows as an error, after the text that came before it. The page's `fetch` of
/// the chat endpoint is replaced by such a stream: the engine has no way to fail on demand.
async fn sse_error_event_shows_as_error(c: &Ctx) {
    c.fresh_page().await;
    c.js(r#"
      const real = window.fetch;
      window.fetch = (url, opts) => {
        if (url !== '/v1/chat/completions') return real(url, opts);
        const events = [
          {choices: [{index: 0, delta: {role: 'assistant', content: ''}}]},
          {choices: [{index: 0, delta: {content: 'Partial'}}]},
          {choices: [{index: 0, delta: {content: ' answer'}}]},
          {error: {message: 'the engine failed: boom', type: 'server_error', code: 500}},
        ].map((e) => 'data: ' + JSON.stringify(e) + '\n\n').join('') + 'data: [DONE]\n\n';
        return Promise.resolve(new Response(events, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
      };
    "#)
    .await;
    c.type_into("prompt", "hello\u{E007}").await;
    let v = c.until("the error", 10, "const e = document.querySelector('.msg.error'); const m = document.querySelector('.msg.assistant'); return e && m && {error: e.textContent, text: m.querySelector('.body').textContent, state: m.dataset.state}").await;
    assert_eq!(v["text"], "Partial answer", "{v}");
    assert_eq!(v["state"], "error", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("the engine failed: boom")), "{v}");
    c.assert_no_console_errors().await;
}

async fn calculator(c: &Ctx) {
    c.fresh_page().await;
    c.until("the calculator's presets", 30, "return document.getElementById('calc-model').options.length >= 4 && !document.getElementById('calc-run').disabled").await;
    c.set_value("calc-model", "smollm2-135m").await;
    c.set_value("calc-hw", "a100-40gb").await;
    c.set_value("calc-requests", "300").await;
    c.click("calc-run").await;
    c.until("the result", 30, "return !document.getElementById('calc-run').disabled && document.getElementById('calc-status').textContent.includes('300 requests')").await;
    let v = c.js("return {figures: document.getElementById('calc-figures').textContent, bars: document.querySelectorAll('#calc-chart svg rect').length, error: !document.getElementById('calc-error').hidden};").await;
    // SmolLM2-135M: 2 × 30 layers × 3 KV heads × 64 × 2 bytes = 23 040 B = 22.5 KiB per token.
    assert!(v["figures"].as_str().is_some_and(|f| f.contains("22.5 KiB")), "{v:#}");
    assert_eq!(v["bars"], 6, "four simulated systems and two static fits: {v:#}");
    assert_eq!(v["error"], false);
    // The same numbers as the endpoint gives (the page shows the server's simulation).
    let memory: f64 = c
        .js("return document.getElementById('calc-mem').value")
        .await
        .as_str()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0.0);
    let direct = c
        .http
        .post(format!("{}/v1/plan", c.base))
        .json(&json!({"model": "smollm2-135m", "hardware": "a100-40gb", "gpu_memory_gib": memory, "num_requests": 300, "max_model_len": 2048, "max_num_seqs": 256, "block_size": 16, "gpu_memory_utilization": 0.9}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let direct: Value = direct.json().await.unwrap_or_else(|e| panic!("{e}"));
    let blocks = direct["num_blocks"].as_u64().unwrap_or(0);
    let shown = v["figures"].as_str().unwrap_or_default().replace(',', "");
    assert!(shown.contains(&format!("{blocks} × 16")), "{blocks} blocks: {shown}");
    // The screenshot: Llama-2-7B on an A100-40GB, where memory is the limit.
    c.set_value("calc-model", "llama2-7b").await;
    c.set_value("calc-requests", "500").await;
    c.click("calc-run").await;
    c.until("the Llama-2 result", 30, "return !document.getElementById('calc-run').disabled && document.getElementById('calc-figures').textContent.includes('512 KiB')").await;
    let panel = c.client.find(Locator::Css(".calc-panel")).await.unwrap_or_else(|e| panic!("{e}"));
    c.client
        .execute("arguments[0].scrollIntoView()", vec![serde_json::to_value(&panel).unwrap_or_default()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let png = panel.screenshot().await.unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(c.shots.join("08-calculator.png"), png).unwrap_or_else(|e| panic!("{e}"));
    c.assert_no_console_errors().await;
    // A custom shape past the bounds (the form's own checks pass it): the 400's message is shown.
    c.set_value("calc-layers", "100000").await;
    assert_eq!(c.js("return document.getElementById('calc-model').value").await, "custom");
    c.click("calc-run").await;
    let err = c
        .until(
            "the calculator's error",
            20,
            "const e = document.getElementById('calc-error'); return !e.hidden && e.textContent",
        )
        .await;
    assert!(
        err.as_str()
            .is_some_and(|e| e.contains("layers must be between 1 and 4096") && e.contains("HTTP 400")),
        "{err}"
    );
    let severe: Vec<Value> = c.console().await.into_iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(severe.iter().all(|e| e["message"].as_str().is_some_and(|m| m.contains("400"))), "{severe:#?}");
}

async fn phone_width(c: &Ctx) {
    c.client
        .issue_cmd(Cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
        ))
        .await
        .unwrap_or_else(|e| panic!("emulating a phone: {e}"));
    c.fresh_page().await;
    // Some content in every panel: a message, the calculator's chart.
    c.set_value("max-tokens", "12").await;
    c.type_into("prompt", "Hi!\u{E007}").await;
    c.until(
        "the reply",
        60,
        "const m = document.querySelector('.msg.assistant'); return m && m.dataset.state === 'done'",
    )
    .await;
    c.until("the calculator's chart", 30, "return document.querySelectorAll('#calc-chart svg rect').length")
        .await;
    let v = c.js("return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth, body: document.body.scrollWidth};").await;
    assert_eq!(v["inner"], 390, "{v}");
    assert!(
        v["scroll"].as_u64() <= v["inner"].as_u64() && v["body"].as_u64() <= v["inner"].as_u64(),
        "horizontal overflow at 390 px: {v}"
    );
    // Which element sticks out, if any (a clearer failure than the widths alone).
    let wide = c.js("return Array.from(document.querySelectorAll('body *')).filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5 && e.offsetParent !== null).map((e) => e.tagName + '#' + e.id + '.' + e.className).slice(0, 10)").await;
    assert_eq!(v_arr(&wide).len(), 0, "elements past the right edge: {wide}");
    c.shot("09-phone").await;
    c.js("document.getElementById('calc-results').scrollIntoView()").await;
    c.shot("10-phone-calculator").await;
    c.assert_no_console_errors().await;
    c.client
        .issue_cmd(Cdp("Emulation.clearDeviceMetricsOverride", json!({})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
