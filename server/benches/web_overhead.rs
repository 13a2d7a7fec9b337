//! Benchmark `web_overhead` (group `web`): what a subscribed KV-map page costs the engine.
//! The same batch (64 requests of 40 prompt tokens, 128 greedy output tokens each, all at once,
//! on the default SmolLM2 Q4_1 GGUF) runs alternately without and with a subscriber doing what
//! the page's SSE stream does: every 250 ms it asks for a snapshot at the next step boundary,
//! awaits it and encodes it as the endpoint's JSON (`server::kv_map::kv_map_json`). Four pairs,
//! which half goes first alternating;
//! `web.dashboard_overhead` is the median of the per-pair ratios (output tok/s with ÷ without):
//! both halves of a pair see the same machine load. Writes `$BENCH_FIGURES_DIR/web_overhead.json`.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engine::{Engine, EngineConfig, EngineHandle, KvCacheSize, Prompt, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const REQUESTS: usize = 64;
const PROMPT_TOKENS: usize = 40;
const OUTPUT_TOKENS: usize = 128;
const PAIRS: usize = 4;
/// The page's refresh period (the stream's default).
const PERIOD: Duration = Duration::from_millis(250);

/// Output tokens per second of one batch of `prompts`.
fn run_batch(handle: &EngineHandle, prompts: &[Vec<u32>]) -> Result<f64, Box<dyn Error>> {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(OUTPUT_TOKENS) };
    let start = Instant::now();
    let streams = prompts
        .iter()
        .map(|p| handle.add_request(Prompt::Tokens(p.clone()), params.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tokens = 0;
    for stream in streams {
        tokens += stream.collect_final()?.completions.iter().map(|c| c.token_ids.len()).sum::<usize>();
    }
    Ok(tokens as f64 / start.elapsed().as_secs_f64())
}

/// A subscriber like the page's stream, until `stop`: returns how many snapshots it encoded.
fn subscribe(handle: EngineHandle, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        runtime.block_on(async move {
            let mut encoded = 0;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(PERIOD).await;
                let Ok(snapshot) = handle.kv_map().await else { break };
                encoded += usize::from(!server::kv_map::kv_map_json(&snapshot).is_empty());
            }
            encoded
        })
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn Error>> {
    let gguf = model::testing::default_model_fetched()?;
    let config = EngineConfig {
        // 64 × 168 tokens in blocks of 16, and room to spare.
        kv_cache: KvCacheSize::Blocks(64 * 12 + 64),
        enable_prefix_caching: false,
        log_interval: Duration::ZERO,
        ..EngineConfig::default()
    };
    let handle = EngineHandle::spawn(Engine::new(&gguf, config)?)?;
    let mut rng = ChaCha8Rng::seed_from_u64(2025);
    let prompts: Vec<Vec<u32>> =
        (0..REQUESTS).map(|_| (0..PROMPT_TOKENS).map(|_| rng.random_range(1000..20_000)).collect()).collect();
    run_batch(&handle, &prompts[..4])?; // warm-up

    let (mut plain, mut subscribed, mut ratios, mut snapshots) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let mut with_page = || -> Result<f64, Box<dyn Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let page = subscribe(handle.clone(), stop.clone());
        let rate = run_batch(&handle, &prompts)?;
        stop.store(true, Ordering::Relaxed);
        snapshots += page.join().map_err(|_| "subscriber panicked")?;
        Ok(rate)
    };
    for pair in 0..PAIRS {
        // Alternate which half runs first, so a drift over the run favours neither.
        let (without, with) = if pair % 2 == 0 {
            let without = run_batch(&handle, &prompts)?;
            (without, with_page()?)
        } else {
            let with = with_page()?;
            (run_batch(&handle, &prompts)?, with)
        };
        eprintln!("web_overhead: {without:.1} tok/s alone, {with:.1} tok/s with a page subscribed");
        plain.push(without);
        subscribed.push(with);
        ratios.push(with / without);
    }
    let ratio = median(ratios);
    eprintln!("web.dashboard_overhead = {ratio:.4} ({snapshots} snapshots encoded)");
    assert!(snapshots > 0, "the subscriber never received a snapshot");
    let figures = serde_json::json!({
        "web.dashboard_overhead": ratio,
        "web.e2e_tok_s_plain": median(plain),
        "web.e2e_tok_s_subscribed": median(subscribed),
    });
    let dir = std::env::var_os("BENCH_FIGURES_DIR").map(PathBuf::from);
    if let Some(dir) = dir {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("web_overhead.json"), figures.to_string())?;
    }
    handle.shutdown(engine::ShutdownMode::Drain);
    Ok(())
}
