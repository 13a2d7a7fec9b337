//! The browser test's fixture: chromedriver (and the Chromium it starts) in a process group
//! of their own, the server over the real SmolLM2 on loopback, and `Ctx`, what every step
//! drives the page and asks the server through (scripts, waits, screenshots, `/metrics`).

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{Engine, EngineConfig, EngineHandle};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use server::{AppState, ServerConfig};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const INSTALL: &str = "install them with `apt-get install -y chromium chromium-driver` \
                       (`cargo xtask test` does this when run as root)";
/// Device blocks of the test engine (16 tokens each).
pub(crate) const BLOCKS: usize = 384;

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

pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    pub(crate) shots: PathBuf,
    stop_server: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
    // Dropped last: kills chromedriver and Chromium.
    _driver: Driver,
}

impl Ctx {
    pub(crate) async fn start() -> Ctx {
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

    pub(crate) async fn stop(self) {
        let _ = self.client.close().await;
        let _ = self.stop_server.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.served).await;
    }

    pub(crate) async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls until the assistant message exists and passes `test`, a JS expression over `m` (the
    /// message) and `state` (its `data-state`): `state === 'done'`.
    pub(crate) async fn until_reply(&self, what: &str, secs: u64, test: &str) -> Value {
        let script = format!(
            "const m = document.querySelector('.msg.assistant'); const state = m && m.dataset.state; return m && ({test})"
        );
        self.until(what, secs, &script).await
    }

    /// Polls `script` (a function body returning a value) until it is truthy; returns it.
    pub(crate) async fn until(&self, what: &str, secs: u64, script: &str) -> Value {
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

    pub(crate) async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("screenshot: {e}"));
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Chromium's console entries since the last call (chromedriver's log endpoint).
    pub(crate) async fn console(&self) -> Vec<Value> {
        let v =
            self.client.issue_cmd(BrowserLog).await.unwrap_or_else(|e| panic!("reading the console: {e}"));
        v.as_array().cloned().unwrap_or_default()
    }

    pub(crate) async fn assert_no_console_errors(&self) {
        let severe: Vec<Value> =
            self.console().await.into_iter().filter(|e| e["level"] == "SEVERE").collect();
        assert!(severe.is_empty(), "console errors: {severe:#?}");
    }

    pub(crate) async fn server_json(&self, path: &str) -> Value {
        let resp =
            self.http.get(format!("{}{path}", self.base)).send().await.unwrap_or_else(|e| panic!("{e}"));
        resp.json().await.unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A metric's value, summed over its label sets (`request_success_total` has one per
    /// finish reason).
    pub(crate) async fn metric(&self, name: &str) -> f64 {
        let text =
            self.http.get(format!("{}/metrics", self.base)).send().await.unwrap_or_else(|e| panic!("{e}"));
        let text = text.text().await.unwrap_or_default();
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(!values.is_empty(), "no {name} in /metrics");
        values.iter().sum()
    }

    /// Waits until the engine holds no block (`GET /v1/kv_map`: no table, nothing owned or
    /// shared); returns the last map.
    pub(crate) async fn wait_server_idle(&self, secs: u64) -> Value {
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
    pub(crate) async fn fresh_page(&self) {
        self.wait_server_idle(30).await;
        self.client.goto(&self.base).await.unwrap_or_else(|e| panic!("goto: {e}"));
        self.until("the model name", 30, "return document.getElementById('model-name').textContent === 'SmolLM2-135M-Instruct' || document.getElementById('model-name').textContent.length > 0 && document.getElementById('model-len').textContent").await;
        self.until("the live KV map", 30, "return document.getElementById('kv-canvas').dataset.generation")
            .await;
    }

    pub(crate) async fn set_value(&self, id: &str, value: &str) {
        self.client
            .execute(
                "const e = document.getElementById(arguments[0]); e.value = arguments[1]; \
                 e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true}));",
                vec![json!(id), json!(value)],
            )
            .await
            .unwrap_or_else(|e| panic!("setting #{id}: {e}"));
    }

    pub(crate) async fn type_into(&self, id: &str, text: &str) {
        let e = self.client.find(Locator::Id(id)).await.unwrap_or_else(|e| panic!("#{id}: {e}"));
        e.send_keys(text).await.unwrap_or_else(|e| panic!("typing into #{id}: {e}"));
    }

    pub(crate) async fn click(&self, id: &str) {
        let e = self.client.find(Locator::Id(id)).await.unwrap_or_else(|e| panic!("#{id}: {e}"));
        e.click().await.unwrap_or_else(|e| panic!("clicking #{id}: {e}"));
    }

    /// The page's counts of block states (data attributes the KV canvas carries).
    pub(crate) async fn page_blocks(&self) -> Value {
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
pub(crate) struct Cdp(pub(crate) &'static str, pub(crate) Value);

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/goog/cdp/execute", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (axum::http::Method, Option<String>) {
        (axum::http::Method::POST, Some(json!({"cmd": self.0, "params": self.1}).to_string()))
    }
}

pub(crate) fn v_arr(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}
