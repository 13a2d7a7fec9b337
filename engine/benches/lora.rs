//! Benchmark group `lora`: what serving LoRA adapters costs on the CPU, on SmolLM2 (the default
//! Q4_1 GGUF) with random rank-16 adapters on all seven projections (`model::testing::
//! write_peft_adapter`).
//!
//! - `lora.mixed_b64_over_base`: 64 requests spread over 8 adapters (request `i` under adapter
//!   `i mod 8`, `max_loras` 8), end-to-end output tokens per second over the same 64 on the base
//!   model; `lora.single_b64_over_base`: all 64 under one adapter, over the base. Greedy,
//!   `ignore_eos`, 128 tokens each, every prompt distinct (the chat template's system prompt is
//!   shared, within one adapter, as users' are) and every run under its own `cache_salt` (cold
//!   prefix cache: no run reads what an earlier one left); the three runs alternate in each
//!   of [`ROUNDS`] rounds (each round in another order), and each ratio is the median of its
//!   rounds (mean and p90 in the fragment).
//! - `lora.load_ms_p50`: registering and reading one rank-16 adapter from its folder
//!   (`LoraRegistry::load`, cold page cache not forced), [`LOADS`] times, the median.
//!
//! Writes `$BENCH_FIGURES_DIR/lora.json` and the fragment `lora.md`.

use std::error::Error;
use std::time::Instant;

use engine::{
    Engine, EngineConfig, KvCacheSize, LoraConfig, LoraRequest, Prompt, RequestOptions, SamplingParams,
};

mod support;

use support::stats;

/// Rounds of the three end-to-end runs (odd, for the median).
const ROUNDS: usize = 5;
const LOADS: usize = 11;
const ADAPTERS: usize = 8;
const RANK: usize = 16;
const REQUESTS: usize = 64;
const MAX_TOKENS: usize = 128;
const PROMPTS: &str = include_str!("spec_data/prompts.json");

type Res<T> = Result<T, Box<dyn Error>>;

fn prompts() -> Res<Vec<Prompt>> {
    let all: serde_json::Value = serde_json::from_str(PROMPTS)?;
    let texts: Vec<&str> = ["grounded", "open"]
        .iter()
        .flat_map(|set| all[set].as_array().into_iter().flatten())
        .filter_map(|p| p["prompt"].as_str())
        .collect();
    Ok(texts
        .iter()
        .cycle()
        .take(REQUESTS)
        .enumerate()
        .map(|(i, t)| Prompt::Chat(vec![model::ChatMessage::new("user", format!("Request {i}. {t}"))]))
        .collect())
}

/// Runs every prompt at once, prompt `i` under `adapter(i)`, under a prefix-cache salt of this
/// run alone; output tokens per second.
fn run(engine: &mut Engine, prompts: &[Prompt], adapter: impl Fn(usize) -> Option<String>) -> Res<f64> {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let salt = format!("run-{}", RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(MAX_TOKENS) };
    let t = Instant::now();
    for (i, p) in prompts.iter().enumerate() {
        let mut options = RequestOptions::default().with_cache_salt(salt.clone());
        if let Some(name) = adapter(i) {
            options = options.with_lora(LoraRequest::named(name));
        }
        engine.add_request_with_options(format!("r{i}"), p.clone(), params.clone(), options)?;
    }
    let mut tokens = 0;
    while engine.has_unfinished() {
        for out in engine.step()? {
            tokens += out.outputs.iter().map(|c| c.token_ids.len()).sum::<usize>();
        }
    }
    if tokens != prompts.len() * MAX_TOKENS {
        return Err(format!("{tokens} tokens generated, {} expected", prompts.len() * MAX_TOKENS).into());
    }
    Ok(tokens as f64 / t.elapsed().as_secs_f64())
}

fn main() -> Res<()> {
    let smol = model::testing::default_model_fetched()?;
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(2048),
        log_interval: std::time::Duration::ZERO,
        lora: Some(LoraConfig {
            max_loras: ADAPTERS,
            max_lora_rank: RANK,
            max_cpu_loras: Some(ADAPTERS + 1),
        }),
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(&smol, config)?;
    let dir = tempfile::tempdir()?;
    let model_config = model::ModelFolder::open(&smol)?.config;
    for a in 0..ADAPTERS {
        let path = dir.path().join(format!("a{a}"));
        model::testing::write_peft_adapter(&path, &model_config, RANK, 100 + a as u64)?;
        engine.loras().load(&format!("a{a}"), &path)?;
    }
    let prompts = prompts()?;
    let (mut mixed, mut single) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let mut base = 0.0;
        let (mut m, mut s) = (0.0, 0.0);
        // Each round another order, so no configuration always runs first.
        for k in 0..3 {
            match (round + k) % 3 {
                0 => base = run(&mut engine, &prompts, |_| None)?,
                1 => m = run(&mut engine, &prompts, |i| Some(format!("a{}", i % ADAPTERS)))?,
                _ => s = run(&mut engine, &prompts, |_| Some("a0".into()))?,
            }
        }
        eprintln!("round {round}: base {base:.1} tok/s, 8 adapters {m:.1}, one adapter {s:.1}");
        mixed.push(m / base);
        single.push(s / base);
    }
    let (mixed, single) = (stats(mixed), stats(single));

    let mut loads = Vec::new();
    for i in 0..LOADS {
        let name = format!("load{i}");
        let t = Instant::now();
        engine.loras().load(&name, &dir.path().join(format!("a{}", i % ADAPTERS)))?;
        loads.push(t.elapsed().as_secs_f64() * 1e3);
        engine.loras().unload(&name)?;
    }
    let loads = stats(loads);
    eprintln!("mixed/base {:.3}, single/base {:.3}, load {:.1} ms", mixed.0, single.0, loads.0);

    let figures = serde_json::json!({
        "lora.mixed_b64_over_base": mixed.0,
        "lora.single_b64_over_base": single.0,
        "lora.load_ms_p50": loads.0,
    });
    let mut md = format!(
        "## lora (SmolLM2, rank-{RANK} adapters on all projections, {} threads)\n\n",
        rayon::current_num_threads()
    );
    support::figures_table(&mut md, &figures);
    md.push_str(&format!(
        "\nMedian, mean, p90 — mixed over base {:.3} / {:.3} / {:.3}, single over base {:.3} / {:.3} / {:.3} \
         ({ROUNDS} rounds of {REQUESTS} requests × {MAX_TOKENS} tokens); load {:.1} / {:.1} / {:.1} ms ({LOADS} loads).\n",
        mixed.0, mixed.1, mixed.2, single.0, single.1, single.2, loads.0, loads.1, loads.2
    ));
    let dir = support::figures_dir()?;
    std::fs::write(dir.join("lora.json"), serde_json::to_string_pretty(&figures)?)?;
    std::fs::write(dir.join("lora.md"), md)?;
    Ok(())
}
