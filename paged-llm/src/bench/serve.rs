//! `paged-llm bench serve`: a load generator against a running OpenAI-compatible server, as
//! `vllm bench serve`. Random prompts (`--random-input-len` words, `--random-output-len` tokens
//! with `ignore_eos`) arrive as a Poisson process at `--request-rate` (gamma with
//! `--burstiness`; `inf` sends all at once), at most `--max-concurrency` in flight; each is a
//! streamed `/v1/completions`. Per request: TTFT (send to first token), ITL (between tokens),
//! TPOT ((latency − TTFT) / (tokens − 1)), E2E latency; the report gives their mean, median and
//! percentiles, and the request and token throughput (`--json` / `--save-result` for machines).

mod report;
mod sse;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::Semaphore;

use crate::progress::{Progress, Unit};

#[derive(Debug, Args)]
pub struct ServeBenchArgs {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// The model name to send (default: the first of the server's `/v1/models`).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Requests per second (Poisson arrivals); `inf` sends every request at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: f64,
    /// The arrivals' burstiness (gamma shape; 1 is Poisson, lower is burstier).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight at once (default: no limit).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Words per random prompt (about one token each).
    #[arg(long, default_value_t = 128)]
    pub random_input_len: usize,
    /// Tokens per answer (generated to the end: `ignore_eos`).
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Percentiles to report.
    #[arg(long, value_delimiter = ',', default_value = "50,90,99")]
    pub metric_percentiles: Vec<f64>,
    /// Print the result as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON result to this file.
    #[arg(long, value_name = "FILE")]
    pub save_result: Option<std::path::PathBuf>,
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct RequestResult {
    pub ok: bool,
    pub error: String,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Seconds from sending to the first token.
    pub ttft: f64,
    /// Seconds between consecutive tokens.
    pub itl: Vec<f64>,
    /// Seconds from sending to the last byte.
    pub latency: f64,
}

pub fn run(args: &ServeBenchArgs) -> anyhow::Result<()> {
    if args.num_prompts == 0 || args.random_output_len == 0 {
        bail!("--num-prompts and --random-output-len must be at least 1");
    }
    if args.request_rate.is_nan()
        || args.request_rate <= 0.0
        || args.burstiness.is_nan()
        || args.burstiness <= 0.0
    {
        bail!("--request-rate and --burstiness must be positive (--request-rate inf: all at once)");
    }
    if args.max_concurrency == Some(0) {
        bail!("--max-concurrency must be at least 1");
    }
    if let Some(bad) = args.metric_percentiles.iter().find(|p| !(0.0..=100.0).contains(*p)) {
        bail!("--metric-percentiles: {bad} is not within 0..100");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (results, duration) = runtime.block_on(drive(args))?;
    let report = report::Report::new(args, &results, duration);
    let json = report.to_json();
    if let Some(path) = &args.save_result {
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        report.print();
    }
    if report.completed == 0 {
        bail!(
            "no request succeeded: {}",
            results.iter().map(|r| r.error.as_str()).find(|e| !e.is_empty()).unwrap_or("?")
        );
    }
    Ok(())
}

/// Sends every request on its schedule; returns their results and the benchmark's duration.
async fn drive(args: &ServeBenchArgs) -> anyhow::Result<(Vec<RequestResult>, Duration)> {
    let client = sse::client();
    let base = args.base_url.trim_end_matches('/').to_owned();
    let model = match &args.model {
        Some(model) => model.clone(),
        None => first_model(&client, &base).await?,
    };
    let url = format!("{base}{}", args.endpoint);
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let prompts: Vec<String> =
        (0..args.num_prompts).map(|_| random_prompt(&mut rng, args.random_input_len)).collect();
    let gaps = arrival_gaps(&mut rng, args.num_prompts, args.request_rate, args.burstiness);
    let limit = Arc::new(Semaphore::new(args.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS)));
    let progress =
        Arc::new(Mutex::new(Progress::new(args.num_prompts as u64, "bench serve", Unit::Items("requests"))));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.num_prompts);
    for (prompt, gap) in prompts.into_iter().zip(gaps) {
        tokio::time::sleep(Duration::from_secs_f64(gap)).await;
        let body = serde_json::json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": args.random_output_len,
            "ignore_eos": true,
            "temperature": 0.0,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let (client, url, limit, progress) = (client.clone(), url.clone(), limit.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await;
            let result = sse::stream_completion(&client, &url, &body).await;
            if let Ok(mut progress) = progress.lock() {
                progress.inc(1);
            }
            result
        }));
    }
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.context("a request task panicked")?);
    }
    let duration = started.elapsed();
    if let Some(progress) = Arc::into_inner(progress).and_then(|p| p.into_inner().ok()) {
        progress.finish();
    }
    Ok((results, duration))
}

/// The id of the server's first model.
async fn first_model(client: &sse::HttpClient, base: &str) -> anyhow::Result<String> {
    let url = format!("{base}/v1/models");
    let models =
        sse::get_json(client, &url).await.with_context(|| format!("GET {url} (is the server running?)"))?;
    models["data"][0]["id"].as_str().map(str::to_owned).with_context(|| format!("{url} lists no model"))
}

/// A prompt of `words` random common words.
fn random_prompt(rng: &mut ChaCha8Rng, words: usize) -> String {
    const WORDS: [&str; 32] = [
        "the", "time", "people", "way", "water", "day", "world", "house", "light", "river", "music",
        "garden", "city", "story", "morning", "paper", "number", "voice", "table", "window", "mountain",
        "letter", "road", "friend", "market", "summer", "school", "question", "animal", "picture", "ocean",
        "forest",
    ];
    (0..words).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect::<Vec<_>>().join(" ")
}

/// Seconds before each request: gamma-distributed gaps of mean `1 / rate` and shape
/// `burstiness` (exponential, a Poisson process, at 1); all zero at an infinite rate.
fn arrival_gaps(rng: &mut ChaCha8Rng, n: usize, rate: f64, burstiness: f64) -> Vec<f64> {
    if rate.is_infinite() {
        return vec![0.0; n];
    }
    let scale = 1.0 / (rate * burstiness);
    (0..n).map(|_| gamma(rng, burstiness) * scale).collect()
}

/// A Gamma(shape, 1) sample (Marsaglia and Tsang; shape < 1 boosted by `U^(1/shape)`).
fn gamma(rng: &mut ChaCha8Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = standard_normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_have_the_asked_mean_rate_and_infinite_rate_sends_at_once() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for burstiness in [1.0, 0.5, 3.0] {
            let gaps = arrival_gaps(&mut rng, 20_000, 4.0, burstiness);
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            assert!((mean - 0.25).abs() < 0.01, "burstiness {burstiness}: mean gap {mean}");
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            // Gamma(k, θ): variance k θ², so the squared coefficient of variation is 1 / k.
            let cv2 = var / (mean * mean);
            assert!((cv2 - 1.0 / burstiness).abs() < 0.1 / burstiness, "burstiness {burstiness}: cv² {cv2}");
        }
        assert_eq!(arrival_gaps(&mut rng, 3, f64::INFINITY, 1.0), vec![0.0; 3]);
    }

    #[test]
    fn a_random_prompt_has_the_asked_number_of_words() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        assert_eq!(random_prompt(&mut rng, 37).split(' ').count(), 37);
    }
}
