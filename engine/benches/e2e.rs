//! End-to-end offline benchmark (group `e2e`): 64 requests on SmolLM2-135M-Instruct with
//! ShareGPT-shaped lengths scaled to the model (input ~160, output ~256 tokens, seeded),
//! greedy with `ignore_eos`, all submitted at once. Also measures, in the same run, the
//! single-request decode rate (for `e2e.batching_gain`), output throughput against batch size,
//! and the time to first token of one 6 000-token prompt (`e2e.ttft_ms_6000`). Writes
//! `$BENCH_FIGURES_DIR/e2e.json`, the fragment `e2e.md`, and two SVG charts next to the report.
//! `BENCH_QUICK=1` changes nothing here: every workload is measured once.

use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use engine::{Engine, EngineConfig, KvCacheSize, SamplingParams};
use plotters::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod support;

const NUM_REQUESTS: usize = 64;
const SEED: u64 = 2024;

/// One point of the run's timeline, taken after every step.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t_s: f64,
    step_s: f64,
    kv_usage: f64,
    kv_util: f64,
    running: usize,
    /// Prompt tokens this step computed (0 for a decode-only step).
    prompt_tokens: u64,
}

/// What one offline run measured.
#[derive(Debug, Default)]
struct RunResult {
    wall_s: f64,
    output_tokens: usize,
    ttft_ms: Vec<f64>,
    tpot_ms: Vec<f64>,
    timeline: Vec<Sample>,
    preemptions: u64,
}

fn config() -> EngineConfig {
    EngineConfig {
        max_model_len: Some(1024),
        max_num_seqs: 256,
        max_num_batched_tokens: 2048,
        // 64 × (≤ 240 + ≤ 384) tokens fit without preemption: 2600 blocks of 16.
        kv_cache: KvCacheSize::Blocks(2600),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// ShareGPT-like spread scaled to a 135M model: input U[80, 240] (mean 160), output
/// U[128, 384] (mean 256).
fn workload(engine: &Engine) -> Vec<(Vec<u32>, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let vocab = engine.model_config().vocab_size;
    let eos = engine.eos_token_ids().to_vec();
    (0..NUM_REQUESTS)
        .map(|_| {
            let input = rng.random_range(80..=240);
            let output = rng.random_range(128..=384);
            (engine::workload::random_prompt(&mut rng, input, vocab, &eos), output)
        })
        .collect()
}

/// Submits everything at once and steps until done, sampling the timeline after each step.
fn run(engine: &mut Engine, requests: &[(Vec<u32>, usize)]) -> Result<RunResult, Box<dyn Error>> {
    engine.reset_metrics();
    let started = Instant::now();
    for (i, (prompt, output)) in requests.iter().enumerate() {
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(*output) };
        engine.add_request(format!("e2e-{i}"), prompt.clone(), params)?;
    }
    let mut res = RunResult::default();
    let mut prompt_done = 0;
    while engine.has_unfinished() {
        let t0 = Instant::now();
        for out in engine.step()? {
            res.output_tokens += out.outputs.iter().map(|c| c.token_ids.len()).sum::<usize>();
            if out.finished
                && let (Some(ttft), Some(latency)) = (out.timing.time_to_first_token, out.timing.latency)
            {
                res.ttft_ms.push(ttft.as_secs_f64() * 1e3);
                if out.completion_tokens > 1 {
                    let decode = latency.saturating_sub(ttft).as_secs_f64();
                    res.tpot_ms.push(decode * 1e3 / (out.completion_tokens - 1) as f64);
                }
            }
        }
        let metrics = engine.metrics();
        let g = metrics.gauges;
        let prompt_tokens = metrics.prompt_tokens - prompt_done;
        prompt_done = metrics.prompt_tokens;
        res.timeline.push(Sample {
            prompt_tokens,
            t_s: started.elapsed().as_secs_f64(),
            step_s: t0.elapsed().as_secs_f64(),
            kv_usage: g.kv_usage,
            kv_util: g.kv_token_util,
            running: g.num_running,
        });
    }
    res.wall_s = started.elapsed().as_secs_f64();
    res.preemptions = engine.metrics().gauges.num_preemptions;
    Ok(res)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { 0.0 } else { s[s.len() / 2] }
}

/// Time-weighted mean KV utilization over the steps that hold any block.
fn kv_util_mean(timeline: &[Sample]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for s in timeline.iter().filter(|s| s.kv_usage > 0.0) {
        num += s.kv_util * s.step_s;
        den += s.step_s;
    }
    if den > 0.0 { num / den } else { 0.0 }
}

/// Where the wall time of a run goes: steps that computed prompt tokens, then decode-only
/// steps by how many requests were running (the batch shrinking at the end is the tail).
fn time_breakdown(timeline: &[Sample]) -> Vec<(String, usize, f64, f64)> {
    let buckets: [(&str, usize, usize); 4] = [
        ("decode, 49-64 running", 49, 64),
        ("decode, 17-48", 17, 48),
        ("decode, 9-16", 9, 16),
        ("decode, 1-8", 1, 8),
    ];
    let mut rows = vec![];
    let prefill: Vec<&Sample> = timeline.iter().filter(|s| s.prompt_tokens > 0).collect();
    rows.push((
        "steps with prompt tokens".to_owned(),
        prefill.len(),
        prefill.iter().map(|s| s.step_s).sum(),
        prefill.iter().map(|s| s.prompt_tokens as f64).sum(),
    ));
    for (name, lo, hi) in buckets {
        let steps: Vec<&Sample> =
            timeline.iter().filter(|s| s.prompt_tokens == 0 && (lo..=hi).contains(&s.running)).collect();
        rows.push((name.to_owned(), steps.len(), steps.iter().map(|s| s.step_s).sum(), 0.0));
    }
    rows
}

fn main() -> Result<(), Box<dyn Error>> {
    let figures_dir = support::figures_dir()?;
    // The default model as users run it: the Q4_1 GGUF, weights kept quantized.
    let dir = model::testing::default_model_fetched()?;
    let mut engine = Engine::new(&dir, config())?;
    let requests = workload(&engine);

    // Warm-up (buffers, page faults), then the single-request decode rate.
    run(&mut engine, &requests[..1])?;
    let single = run(&mut engine, &[(requests[0].0.clone(), 128)])?;
    let single_tpot_ms = median(&single.tpot_ms);
    let single_decode_tok_s = 1e3 / single_tpot_ms;
    eprintln!("e2e: single request decode {single_decode_tok_s:.1} tok/s (TPOT {single_tpot_ms:.1} ms)");

    let main_run = run(&mut engine, &requests)?;
    let output_tok_s = main_run.output_tokens as f64 / main_run.wall_s;
    eprintln!(
        "e2e: {} requests, {} output tokens in {:.1} s = {output_tok_s:.1} tok/s",
        requests.len(),
        main_run.output_tokens,
        main_run.wall_s
    );

    let breakdown = time_breakdown(&main_run.timeline);
    for (name, steps, secs, prompt) in &breakdown {
        eprintln!("e2e: {name:<26} {steps:>4} steps {secs:>7.2} s  ({prompt:.0} prompt tokens)");
    }

    // Output throughput against batch size: b requests of 64 prompt tokens, 32 output tokens.
    let mut sweep = Vec::new();
    for b in [1usize, 2, 4, 8, 16, 32, 64] {
        let reqs: Vec<(Vec<u32>, usize)> =
            requests[..b].iter().map(|(p, _)| (p[..64].to_vec(), 32)).collect();
        let r = run(&mut engine, &reqs)?;
        let tput = r.output_tokens as f64 / r.wall_s;
        eprintln!("e2e: batch {b:>2}: {tput:.1} output tok/s");
        sweep.push((b, tput));
    }

    // Time to first token of one 6 000-token prompt (chunked by the 2 048-token budget), on
    // an engine whose max_model_len admits it.
    let ttft_6000_ms = {
        let long_config =
            EngineConfig { max_model_len: Some(8192), kv_cache: KvCacheSize::Blocks(400), ..config() };
        let mut long_engine = Engine::new(&dir, long_config)?;
        let vocab = long_engine.model_config().vocab_size;
        let eos = long_engine.eos_token_ids().to_vec();
        let prompt = engine::workload::random_prompt(&mut ChaCha8Rng::seed_from_u64(SEED), 6000, vocab, &eos);
        let r = run(&mut long_engine, &[(prompt, 1)])?;
        median(&r.ttft_ms)
    };
    eprintln!("e2e: one 6000-token prompt: TTFT {ttft_6000_ms:.0} ms");

    let figures = serde_json::json!({
        "e2e.output_tok_s": output_tok_s,
        "e2e.batching_gain": output_tok_s / single_decode_tok_s,
        "e2e.single_decode_tok_s": single_decode_tok_s,
        "e2e.ttft_ms_p50": median(&main_run.ttft_ms),
        "e2e.tpot_ms_p50": median(&main_run.tpot_ms),
        "e2e.kv_util_mean": kv_util_mean(&main_run.timeline),
        "e2e.kv_usage_peak": main_run.timeline.iter().map(|s| s.kv_usage).fold(0.0, f64::max),
        "e2e.preemptions": main_run.preemptions as f64,
        "e2e.ttft_ms_6000": ttft_6000_ms,
    });
    std::fs::write(figures_dir.join("e2e.json"), serde_json::to_string_pretty(&figures)? + "\n")?;

    let report_dir = figures_dir.parent().unwrap_or(&figures_dir).to_path_buf();
    draw_timeline(&report_dir.join("e2e_timeline.svg"), &main_run.timeline)?;
    draw_sweep(&report_dir.join("e2e_batch_sweep.svg"), &sweep)?;
    let mut md = String::from("## End-to-end (`e2e`)\n\n");
    writeln!(
        md,
        "{NUM_REQUESTS} requests on SmolLM2-135M-Instruct (f32 weights, f32 KV, CPU), random prompts of \
         U[80, 240] tokens and outputs of U[128, 384] tokens (seed {SEED}), greedy with `ignore_eos`, all \
         submitted at once; block size 16, prefix caching on. Command: `cargo xtask bench --only e2e`.\n"
    )?;
    support::figures_table(&mut md, &figures);
    md.push_str("\nWhere the main run's wall time goes (`running` is the batch after the step):\n\n");
    md.push_str("| steps | count | seconds | prompt tokens |\n|---|---:|---:|---:|\n");
    for (name, steps, secs, prompt) in &breakdown {
        writeln!(md, "| {name} | {steps} | {secs:.2} | {prompt:.0} |")?;
    }
    md.push_str("\n![KV usage, KV utilization and running requests over the run](e2e_timeline.svg)\n");
    md.push_str("\n![Output throughput against batch size](e2e_batch_sweep.svg)\n\n");
    md.push_str("| batch size | output tok/s |\n|---:|---:|\n");
    for (b, t) in &sweep {
        writeln!(md, "| {b} | {t:.1} |")?;
    }
    std::fs::write(figures_dir.join("e2e.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}

fn draw_timeline(path: &Path, timeline: &[Sample]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(290);
    let end = timeline.last().map_or(1.0, |s| s.t_s).max(1e-9);
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    let green = RGBColor(44, 160, 44);
    let mut chart = support::chart(
        &upper,
        "KV cache over the run (64 requests)",
        (0.0..end, 0.0..1.05),
        ("time (s)", "fraction"),
    )?;
    chart
        .draw_series(LineSeries::new(timeline.iter().map(|s| (s.t_s, s.kv_usage)), blue.stroke_width(2)))?
        .label("KV blocks in use / pool")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], blue.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            timeline.iter().filter(|s| s.kv_usage > 0.0).map(|s| (s.t_s, s.kv_util)),
            orange.stroke_width(2),
        ))?
        .label("tokens held / slots of blocks in use")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], orange.stroke_width(2)));
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    let max_running = timeline.iter().map(|s| s.running).max().unwrap_or(1).max(1);
    let mut chart =
        support::chart(&lower, "running requests", (0.0..end, 0..max_running + 2), ("time (s)", "requests"))?;
    chart.draw_series(LineSeries::new(timeline.iter().map(|s| (s.t_s, s.running)), green.stroke_width(2)))?;
    root.present()?;
    Ok(())
}

fn draw_sweep(path: &Path, sweep: &[(usize, f64)]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (700, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_t = sweep.iter().map(|s| s.1).fold(1.0, f64::max) * 1.1;
    let max_b = sweep.iter().map(|s| s.0).max().unwrap_or(1) as f64;
    let blue = RGBColor(31, 119, 180);
    let mut chart = support::chart(
        &root,
        "Output throughput against batch size (64-token prompts, 32 output tokens)",
        ((1.0..max_b * 1.2).log_scale(), 0.0..max_t),
        ("concurrent requests", "output tokens / s"),
    )?;
    let points: Vec<(f64, f64)> = sweep.iter().map(|&(b, t)| (b as f64, t)).collect();
    chart.draw_series(LineSeries::new(points.clone(), blue.stroke_width(2)))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, blue.filled())))?;
    root.present()?;
    Ok(())
}
