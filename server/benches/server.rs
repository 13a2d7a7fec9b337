//! Benchmark group `server`: what HTTP costs. 64 streaming requests (random prompts of 64
//! tokens, 64 greedy output tokens with `ignore_eos`) on SmolLM2-135M-Instruct, all at once,
//! through the OpenAI API on 127.0.0.1 (reqwest, SSE) and, in the same run, through the
//! engine's async API in-process (`EngineHandle::submit`), alternating, twice each.
//!
//! Figures (`$BENCH_FIGURES_DIR/server.json`): `server.http_over_inprocess` (median output
//! tok/s over HTTP ÷ median in-process), `server.ttft_ms_p50_64` (over HTTP),
//! `server.http_output_tok_s`, `server.inprocess_output_tok_s`.

use std::error::Error;
use std::time::{Duration, Instant};

use engine::{EngineConfig, EngineHandle, KvCacheSize, RequestOptions, SamplingParams};
use futures_util::StreamExt;

mod support;

const REQUESTS: usize = 64;
const PROMPT: usize = 64;
const OUTPUT: usize = 64;
const ROUNDS: usize = 2;

/// One run's totals: output tokens over wall time, and each request's time to first token.
struct RunResult {
    tok_s: f64,
    ttft_ms: Vec<f64>,
}

fn params() -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(OUTPUT) }
}

async fn in_process(handle: &EngineHandle, prompts: &[Vec<u32>]) -> Result<RunResult, Box<dyn Error>> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let mut stream =
            handle.submit(format!("bench-{i}"), p.clone(), params(), RequestOptions::default())?;
        tasks.push(tokio::spawn(async move {
            let (mut tokens, mut first) = (0, None);
            while let Some(item) = stream.next().await {
                let out = item.map_err(|e| e.to_string())?;
                let n: usize = out.outputs.iter().map(|c| c.token_ids.len()).sum();
                if n > 0 {
                    first.get_or_insert_with(|| start.elapsed());
                }
                tokens += n;
            }
            Ok::<_, String>((tokens, first.unwrap_or_default()))
        }));
    }
    collect(start, tasks).await
}

async fn over_http(
    client: &reqwest::Client,
    base: &str,
    prompts: &[Vec<u32>],
) -> Result<RunResult, Box<dyn Error>> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in prompts {
        let body = serde_json::json!({
            "prompt": p, "max_tokens": OUTPUT, "temperature": 0, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true}
        });
        let req = client.post(format!("{base}/v1/completions")).json(&body).send();
        tasks.push(tokio::spawn(async move {
            let resp = req.await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("status {}", resp.status()));
            }
            let (mut tokens, mut first, mut buf) = (0, None, String::new());
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                buf.push_str(&String::from_utf8_lossy(&chunk.map_err(|e| e.to_string())?));
                while let Some(end) = buf.find("\n\n") {
                    let event: String = buf.drain(..end + 2).collect();
                    let Some(data) = event.trim().strip_prefix("data: ") else { continue };
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: serde_json::Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
                    if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
                        first.get_or_insert_with(|| start.elapsed());
                    }
                    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                        tokens = n as usize;
                    }
                }
            }
            Ok::<_, String>((tokens, first.unwrap_or_default()))
        }));
    }
    collect(start, tasks).await
}

async fn collect(
    start: Instant,
    tasks: Vec<tokio::task::JoinHandle<Result<(usize, Duration), String>>>,
) -> Result<RunResult, Box<dyn Error>> {
    let (mut tokens, mut ttft_ms) = (0, Vec::new());
    for t in tasks {
        let (n, first) = t.await??;
        tokens += n;
        ttft_ms.push(first.as_secs_f64() * 1e3);
    }
    if tokens != REQUESTS * OUTPUT {
        return Err(format!("{tokens} output tokens, expected {}", REQUESTS * OUTPUT).into());
    }
    Ok(RunResult { tok_s: tokens as f64 / start.elapsed().as_secs_f64(), ttft_ms })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { 0.0 } else { s[s.len() / 2] }
}

fn main() -> Result<(), Box<dyn Error>> {
    let config = EngineConfig {
        max_model_len: Some(1024),
        kv_cache: KvCacheSize::Blocks(1024),
        log_interval: Duration::ZERO,
        ..EngineConfig::default()
    };
    let (handle, prompts) = support::engine_and_prompts(config, REQUESTS, PROMPT, 7)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (inproc, http) = runtime.block_on(async {
        let base = support::serve_loopback(&handle).await?;
        let client = reqwest::Client::builder().pool_max_idle_per_host(REQUESTS).build()?;
        // Warm-up: one small run each way.
        in_process(&handle, &prompts[..4]).await.ok();
        let (mut inproc, mut http) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            inproc.push(in_process(&handle, &prompts).await?);
            http.push(over_http(&client, &base, &prompts).await?);
        }
        Ok::<_, Box<dyn Error>>((inproc, http))
    })?;
    let inproc_tok_s = median(&inproc.iter().map(|r| r.tok_s).collect::<Vec<_>>());
    let http_tok_s = median(&http.iter().map(|r| r.tok_s).collect::<Vec<_>>());
    let ttft: Vec<f64> = http.iter().flat_map(|r| r.ttft_ms.iter().copied()).collect();
    let figures = serde_json::json!({
        "server.http_over_inprocess": http_tok_s / inproc_tok_s,
        "server.ttft_ms_p50_64": median(&ttft),
        "server.http_output_tok_s": http_tok_s,
        "server.inprocess_output_tok_s": inproc_tok_s,
    });
    let md = format!(
        "## Server (`server`)\n\n{REQUESTS} streaming requests ({PROMPT}-token random prompts, {OUTPUT} greedy \
         output tokens) on SmolLM2-135M-Instruct, through HTTP (SSE, 127.0.0.1) and in-process \
         (`EngineHandle::submit`), alternating, {ROUNDS} rounds each. Command: `cargo xtask bench --only server`.\n\n\
         | figure | value |\n|---|---:|\n| `server.http_over_inprocess` | {:.3} |\n| `server.ttft_ms_p50_64` | {:.1} |\n\
         | `server.http_output_tok_s` | {http_tok_s:.1} |\n| `server.inprocess_output_tok_s` | {inproc_tok_s:.1} |\n",
        http_tok_s / inproc_tok_s,
        median(&ttft),
    );
    support::write_figures("server", &figures, &md)?;
    handle.shutdown(engine::ShutdownMode::Drain);
    Ok(())
}
