//! `paged-llm bench latency`: the time one batch takes end to end, as `vllm bench latency`:
//! `--batch-size` random prompts of `--input-len` tokens, `--output-len` tokens each
//! (`ignore_eos`), `--num-iters-warmup` untimed rounds then `--num-iters` timed ones; prints the
//! mean and the percentiles of the rounds (`--json` for machines).

use std::time::Instant;

use anyhow::bail;
use clap::Args;
use engine::{Prompt, SamplingParams};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use server::cli::EngineKnobs;

use crate::start::StartEngine;

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 32)]
    pub input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    #[arg(long, default_value_t = 2)]
    pub num_iters_warmup: usize,
    /// Timed rounds (odd, so that the median is one of them).
    #[arg(long, default_value_t = 5)]
    pub num_iters: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub knobs: EngineKnobs,
}

pub fn run(args: &LatencyArgs) -> anyhow::Result<()> {
    if args.batch_size == 0 || args.num_iters == 0 || args.output_len == 0 {
        bail!("--batch-size, --num-iters and --output-len must be at least 1");
    }
    // Prefix caching off: every round runs its prompts' prefill, as the first did.
    let config =
        engine::EngineConfig { enable_prefix_caching: false, max_waiting: usize::MAX, ..args.knobs.config() };
    let mut engine = args.knobs.start_engine_with(args.json, config)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.knobs.seed);
    let (vocab, eos) = (engine.model_config().vocab_size, engine.eos_token_ids().to_vec());
    let prompts: Vec<Prompt> = (0..args.batch_size)
        .map(|_| Prompt::Tokens(engine::workload::random_prompt(&mut rng, args.input_len, vocab, &eos)))
        .collect();
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        ignore_eos: true,
        max_tokens: Some(args.output_len),
        ..Default::default()
    };
    let mut round = |label: String| -> anyhow::Result<f64> {
        let started = Instant::now();
        for (i, prompt) in prompts.iter().enumerate() {
            let id = format!("{label}-{i}");
            let ids = engine.tokenize(&id, prompt.clone())?;
            engine.add_request(id, ids, params.clone())?;
        }
        while engine.has_unfinished() {
            engine.step()?;
        }
        Ok(started.elapsed().as_secs_f64())
    };
    for i in 0..args.num_iters_warmup {
        round(format!("warmup{i}"))?;
    }
    let mut seconds = Vec::with_capacity(args.num_iters);
    for i in 0..args.num_iters {
        seconds.push(round(format!("iter{i}"))?);
        if !args.json {
            eprintln!("bench latency: round {} of {}: {:.3} s", i + 1, args.num_iters, seconds[i]);
        }
    }
    let percentile = |q: f64| {
        let mut sorted = seconds.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
    };
    let mean = seconds.iter().sum::<f64>() / seconds.len() as f64;
    let tokens_per_s = (args.batch_size * args.output_len) as f64 / mean;
    if args.json {
        let report = serde_json::json!({
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "avg_latency": mean,
            "latencies": seconds,
            "percentiles": {
                "10": percentile(0.10), "25": percentile(0.25), "50": percentile(0.50),
                "75": percentile(0.75), "90": percentile(0.90), "99": percentile(0.99),
            },
            "output_tokens_per_s": tokens_per_s,
        });
        println!("{report}");
    } else {
        println!("Avg latency: {mean:.4} seconds ({} rounds)", seconds.len());
        for q in [0.10, 0.25, 0.50, 0.75, 0.90, 0.99] {
            println!("{:.0}% percentile latency: {:.4} seconds", q * 100.0, percentile(q));
        }
        println!("Output: {tokens_per_s:.1} tokens/s over the batch");
    }
    Ok(())
}
