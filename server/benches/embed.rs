//! Benchmark `embed` (group `server`): `/v1/embeddings` throughput. One request of 64 inputs of
//! 128 random tokens each on SmolLM2-135M-Instruct (the default pooling: last token,
//! normalised) over HTTP on 127.0.0.1, against the in-process prefill of the same tokens (the
//! 64 prompts submitted through `EngineHandle::submit` with `max_tokens: 1`), alternating, in
//! an odd number of rounds.
//!
//! Figures (`$BENCH_FIGURES_DIR/embed.json`): `server.embed_tok_s` (median prompt tokens/s over
//! HTTP), `server.embed_over_prefill` (each round's HTTP ÷ in-process, the median), and their
//! means and p90s.

use std::error::Error;
use std::time::{Duration, Instant};

use engine::{EngineConfig, EngineHandle, KvCacheSize, RequestOptions, SamplingParams};
use futures_util::StreamExt;

mod support;

const INPUTS: usize = 64;
const PROMPT: usize = 128;
const ROUNDS: usize = 5;

/// Prompt tokens per second of one in-process prefill of every prompt (one token generated).
async fn prefill(handle: &EngineHandle, prompts: &[Vec<u32>]) -> Result<f64, Box<dyn Error>> {
    let start = Instant::now();
    let mut streams = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let id = format!("prefill-{}-{i}", handle.next_request_id());
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(1) };
        streams.push(handle.submit(id, p.clone(), params, RequestOptions::default())?);
    }
    for mut s in streams {
        while let Some(item) = s.next().await {
            item?;
        }
    }
    Ok((INPUTS * PROMPT) as f64 / start.elapsed().as_secs_f64())
}

/// Prompt tokens per second of one `/v1/embeddings` call over every prompt.
async fn over_http(
    client: &reqwest::Client,
    base: &str,
    prompts: &[Vec<u32>],
) -> Result<f64, Box<dyn Error>> {
    let start = Instant::now();
    let body = serde_json::json!({ "input": prompts, "encoding_format": "base64" });
    let resp = client.post(format!("{base}/v1/embeddings")).json(&body).send().await?;
    if !resp.status().is_success() {
        return Err(format!("status {}: {}", resp.status(), resp.text().await?).into());
    }
    let v: serde_json::Value = resp.json().await?;
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
    let vectors = v["data"].as_array().map_or(0, Vec::len);
    if tokens != INPUTS * PROMPT || vectors != INPUTS {
        return Err(format!(
            "{vectors} vectors of {tokens} tokens, expected {INPUTS} of {}",
            INPUTS * PROMPT
        )
        .into());
    }
    Ok(tokens as f64 / start.elapsed().as_secs_f64())
}

/// Median, mean and p90 (numpy's linear interpolation) of `v`.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let x = q * (s.len().saturating_sub(1)) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
    };
    (at(0.5), s.iter().sum::<f64>() / s.len().max(1) as f64, at(0.9))
}

fn main() -> Result<(), Box<dyn Error>> {
    let config = EngineConfig {
        max_model_len: Some(1024),
        kv_cache: KvCacheSize::Blocks(1024),
        max_waiting: 256,
        log_interval: Duration::ZERO,
        // Every round computes every prompt (no round reuses the last one's cache).
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let (handle, prompts) = support::engine_and_prompts(config, INPUTS, PROMPT, 11)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (inproc, http) = runtime.block_on(async {
        let base = support::serve_loopback(&handle).await?;
        let client = reqwest::Client::new();
        // Warm-up: a small call each way.
        prefill(&handle, &prompts[..4]).await?;
        over_http(&client, &base, &prompts[..1]).await.ok();
        let (mut inproc, mut http) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            inproc.push(prefill(&handle, &prompts).await?);
            http.push(over_http(&client, &base, &prompts).await?);
        }
        Ok::<_, Box<dyn Error>>((inproc, http))
    })?;
    let ratios: Vec<f64> = http.iter().zip(&inproc).map(|(h, i)| h / i).collect();
    let (tok_s, tok_s_mean, tok_s_p90) = stats(&http);
    let (ratio, ratio_mean, ratio_p90) = stats(&ratios);
    let (prefill_tok_s, _, _) = stats(&inproc);
    let figures = serde_json::json!({
        "server.embed_tok_s": tok_s,
        "server.embed_tok_s_mean": tok_s_mean,
        "server.embed_tok_s_p90": tok_s_p90,
        "server.embed_over_prefill": ratio,
        "server.embed_over_prefill_mean": ratio_mean,
        "server.embed_over_prefill_p90": ratio_p90,
        "server.embed_prefill_tok_s": prefill_tok_s,
    });
    let md = format!(
        "## Embeddings (`embed`)\n\nOne `/v1/embeddings` call of {INPUTS} inputs of {PROMPT} random tokens \
         (SmolLM2-135M-Instruct, last-token pooling, normalised, base64) over HTTP on 127.0.0.1 against \
         the in-process prefill of the same prompts (`max_tokens: 1`), alternating, {ROUNDS} rounds. \
         Command: `cargo xtask bench --only server`.\n\n| figure | median | mean | p90 |\n|---|---:|---:|---:|\n\
         | `server.embed_tok_s` | {tok_s:.0} | {tok_s_mean:.0} | {tok_s_p90:.0} |\n\
         | `server.embed_over_prefill` | {ratio:.3} | {ratio_mean:.3} | {ratio_p90:.3} |\n\
         | in-process prefill tok/s | {prefill_tok_s:.0} | | |\n",
    );
    support::write_figures("embed", &figures, &md)?;
    handle.shutdown(engine::ShutdownMode::Drain);
    Ok(())
}
