//! Benchmark group `kv`: what the hybrid KV cache saves on Gemma 3 270M (five sliding-window
//! layers for every full one), measured through the engine under one fixed KV byte budget.
//!
//! Each layout is a real [`Engine`] of the real model (its GGUF, `Engine::from_parts`) with the
//! default configuration (watermark, step budget, prefix caching) and a [`KvCacheSize::Bytes`]
//! budget, so the engine sizes and allocates its `KvCache` itself. The hybrid layout is the
//! engine's own on the CPU; the full layout is the same model with every layer's sliding window
//! taken off, so that every layer keeps its KV in one full-attention group (what vLLM's
//! `disable_hybrid_kv_cache_manager` does: the engine has no such switch).
//!
//! The figures need dozens of 32k-token prefills, far more forward passes than a bench run can
//! afford on a CPU, so the 32k requests run through a scheduler stepped without the forward
//! pass (`kv_twin/`): configured from the engine as the engine configures its own (its cache's
//! block count, KV groups, watermark, budgets), and planned and updated as the engine's step
//! does. The forward pass neither takes nor frees a block; to show that the stepped scheduler
//! holds what the engine holds, each engine first serves a short request for real (three
//! prefill chunks and a decode step) beside one, block count for block count.
//!
//! - `kv.gemma3_prefill_peak_over_full`: the most KV bytes one 32k request holds during its
//!   prefill (after a chunk is written: a sliding group holds its window and the chunk), hybrid
//!   over full.
//! - `kv.gemma3_bytes_per_token_32k_over_full`: at the steady state (every admitted request past
//!   its prefill and decoding, the next one waiting for memory), the cache's bytes in use per
//!   token held, hybrid over full.
//! - `kv.gemma3_max_seqs_32k_over_full`: the most 32k requests running at once in the budget,
//!   hybrid over full (`kv.gemma3_max_seqs_32k_hybrid`, `kv.gemma3_max_seqs_32k_full`).
//! - `kv.int8_max_seqs_over_bf16`: SmolLM2 with the int8 KV cache against the default bf16 one,
//!   the engine's default byte budget: the most requests of 1 000 prompt tokens
//!   running at once, stepped as above after each engine served a request for real
//!   (`kv.int8_max_seqs`, `kv.bf16_max_seqs`); `kv.int8_tokens_held_over_bf16`, the tokens the
//!   running requests hold at the steady state, int8 over bf16.
//!
//! Writes `$BENCH_FIGURES_DIR/kv.json` and the fragment `kv.md`.

use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use engine::{Engine, EngineConfig, KvCacheSize};
use model::ModelFolder;

mod kv_twin;
mod support;

use kv_twin::{Layout, Run};

/// Gemma 3 270M's context (`max_position_embeddings`): each request's prompt and output.
const SEQ_TOKENS: usize = 32_768;
/// The KV cache's byte budget, both layouts: a little more than four 32k requests of every
/// layer in bf16, so that the full layout runs four.
const BUDGET_BYTES: usize = 5 << 29;
/// The int8-against-bf16 comparison's prompt tokens, and the requests submitted: more than
/// int8 runs at once in the engine's default KV budget (SmolLM2: ~90 such requests in bf16, so
/// that one request is about 1 % of either count).
const INT8_PROMPT: usize = 1_000;
const INT8_REQUESTS: usize = 256;

fn config() -> EngineConfig {
    EngineConfig {
        max_model_len: Some(SEQ_TOKENS),
        kv_cache: KvCacheSize::Bytes(BUDGET_BYTES),
        log_interval: Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// The engine of `layout` over the real model.
fn engine(gguf: &Path, layout: Layout) -> Result<Engine, Box<dyn Error>> {
    let (folder, mut model) = ModelFolder::open_with_weights(gguf)?;
    if layout == Layout::Full {
        // One kind of attention: the runner's layout is then one group of every layer.
        for layer in &mut model.config.layer_attention {
            layer.sliding_window = None;
        }
    }
    Ok(Engine::from_parts(folder, model, config())?)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn main() -> Result<(), Box<dyn Error>> {
    let started = Instant::now();
    let gguf = model::testing::gemma3_gguf_fetched()?;
    let (mut runs, mut checks) = (Vec::new(), Vec::new());
    for layout in [Layout::Hybrid, Layout::Full] {
        let mut engine = engine(&gguf, layout)?;
        let t0 = Instant::now();
        let check = kv_twin::cross_check(&mut engine)?;
        let check_s = t0.elapsed().as_secs_f64();
        eprintln!(
            "kv: {layout:?}: the engine's real steps and its twin's held {check:?} blocks ({check_s:.1} s)"
        );
        checks.push((check, check_s));
        let run = kv_twin::run_32k(&engine, layout, SEQ_TOKENS, kv_twin::REQUESTS)?;
        // The cache the engine sized holds as many blocks of the counted size as the budget has
        // room for: the bytes below are the engine's.
        let bytes = run.num_blocks * run.bytes_per_block;
        if bytes > BUDGET_BYTES || bytes + run.bytes_per_block <= BUDGET_BYTES {
            return Err(format!(
                "{layout:?}: {} blocks of {} bytes in a budget of {BUDGET_BYTES}",
                run.num_blocks, run.bytes_per_block
            )
            .into());
        }
        eprintln!("kv: {layout:?}: {run:?}");
        runs.push(run);
    }
    let [hybrid, full] = &runs[..] else { return Err("two layouts were run".into()) };

    let peak_ratio = hybrid.prefill_peak_bytes() as f64 / full.prefill_peak_bytes() as f64;
    let per_token_ratio = hybrid.steady_bytes_per_token() / full.steady_bytes_per_token();
    let seqs_ratio = hybrid.max_running as f64 / full.max_running.max(1) as f64;
    let mut figures = serde_json::json!({
        "kv.gemma3_prefill_peak_over_full": peak_ratio,
        "kv.gemma3_bytes_per_token_32k_over_full": per_token_ratio,
        "kv.gemma3_max_seqs_32k_over_full": seqs_ratio,
        "kv.gemma3_max_seqs_32k_hybrid": hybrid.max_running,
        "kv.gemma3_max_seqs_32k_full": full.max_running,
    });
    let mut md = report(&runs, &checks, &figures)?;
    int8_against_bf16(&mut figures, &mut md)?;
    let dir = support::figures_dir()?;
    std::fs::write(dir.join("kv.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    std::fs::write(dir.join("kv.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    eprintln!("kv: {:.0} s in all", started.elapsed().as_secs_f64());
    Ok(())
}

/// `kv.int8_max_seqs_over_bf16`: SmolLM2's engine with each KV dtype in the same budget, a
/// request served for real (block counts checked against the twin), then requests of
/// [`INT8_PROMPT`] tokens stepped to the steady state.
fn int8_against_bf16(figures: &mut serde_json::Value, md: &mut String) -> Result<(), Box<dyn Error>> {
    let gguf = model::testing::default_model_fetched()?;
    let mut counts = Vec::new();
    for dtype in [engine::DType::BF16, engine::DType::Int8] {
        let (folder, model) = ModelFolder::open_with_weights(&gguf)?;
        let config =
            EngineConfig { kv_dtype: dtype, log_interval: Duration::ZERO, ..EngineConfig::default() };
        let mut engine = Engine::from_parts(folder, model, config)?;
        let check = kv_twin::cross_check(&mut engine)?;
        let run =
            kv_twin::run_32k(&engine, Layout::Hybrid, INT8_PROMPT + kv_twin::OUTPUT_TOKENS, INT8_REQUESTS)?;
        eprintln!("kv: SmolLM2 {dtype}: real request held {check:?} blocks; {run:?}");
        counts.push((dtype, run.num_blocks, run.bytes_per_block, run.max_running, run.steady_tokens));
    }
    let [(_, _, _, bf16, bf16_tokens), (_, _, _, int8, int8_tokens)] = counts[..] else {
        return Err("two dtypes were run".into());
    };
    figures["kv.int8_max_seqs_over_bf16"] = (int8 as f64 / bf16.max(1) as f64).into();
    figures["kv.int8_tokens_held_over_bf16"] = (int8_tokens as f64 / bf16_tokens.max(1) as f64).into();
    figures["kv.int8_max_seqs"] = int8.into();
    figures["kv.bf16_max_seqs"] = bf16.into();
    let budget = match EngineConfig::default().kv_cache {
        KvCacheSize::Bytes(b) => b,
        KvCacheSize::Blocks(_) => 0,
    };
    writeln!(
        md,
        "\n### int8 against bf16 KV (SmolLM2)\n\nThe default model with each KV cache dtype in the engine's \
         default budget ({:.0} MiB); {INT8_REQUESTS} requests of {INT8_PROMPT} prompt and {} output tokens \
         stepped as above. `kv.int8_max_seqs_over_bf16` = {:.3}.\n\n\
         | KV dtype | blocks | bytes per block | most running at once | tokens held at the steady state |\n\
         |---|---:|---:|---:|---:|",
        mib(budget),
        kv_twin::OUTPUT_TOKENS,
        int8 as f64 / bf16.max(1) as f64,
    )?;
    for (dtype, blocks, bytes, running, tokens) in counts {
        writeln!(md, "| {dtype} | {blocks} | {bytes} | {running} | {tokens} |")?;
    }
    Ok(())
}

/// The Markdown fragment: the setting, the figures, each layout's counts, and the real requests
/// beside the stepped scheduler (`checks`: blocks held after each step, seconds it took).
fn report(
    runs: &[Run],
    checks: &[(Vec<usize>, f64)],
    figures: &serde_json::Value,
) -> Result<String, Box<dyn Error>> {
    let first = runs.first().ok_or("no run")?;
    let mut md = String::from("## Hybrid KV cache (`kv`)\n\n");
    writeln!(
        md,
        "Gemma 3 270M (its GGUF), the engine's default configuration (watermark {}, prefill chunks of \
         {} tokens, prefix caching) and a KV cache of {:.0} MiB allocated by the engine, in each layout: \
         the engine's hybrid one (KV groups: {}) and the full one (the same model, every layer in \
         one full-attention group). {} requests of {} prompt tokens and {} output tokens submitted at \
         once, stepped through a scheduler configured as the engine's, without the forward pass; \
         before that, one request of {} + {} tokens served by each engine for real held block for \
         block what the stepped scheduler held. Steady state: every admitted request decoding, the \
         next waiting for memory. Command: `cargo xtask bench --only kv`.\n",
        config().watermark,
        config().max_num_batched_tokens,
        mib(BUDGET_BYTES),
        first.group_names().join(", "),
        kv_twin::REQUESTS,
        SEQ_TOKENS - kv_twin::OUTPUT_TOKENS,
        kv_twin::OUTPUT_TOKENS,
        kv_twin::CHECK_PROMPT,
        kv_twin::CHECK_OUTPUT,
    )?;
    support::figures_table(&mut md, figures);
    md.push_str(
        "\n| layout | blocks (layer tensors each) | one request's prefill peak: blocks (MiB) | \
         one request after its prefill: blocks (MiB) | steady state: blocks in use (pool usage) | \
         KiB per token held | most running at once | preemptions | steps |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        writeln!(
            md,
            "| {:?} | {} ({}) | {} ({:.1}) | {} ({:.1}) | {} ({:.3}) | {:.2} | {} | {} | {} |",
            r.layout,
            r.num_blocks,
            r.slots,
            r.prefill_peak_blocks,
            mib(r.prefill_peak_bytes()),
            r.first_steady_blocks,
            mib(r.first_steady_blocks * r.bytes_per_block),
            r.steady_used,
            r.steady_used as f64 / r.num_blocks as f64,
            r.steady_bytes_per_token() / 1024.0,
            r.max_running,
            r.preemptions,
            r.steps,
        )?;
    }
    for (r, (blocks, secs)) in runs.iter().zip(checks) {
        writeln!(
            md,
            "\n{:?}: the real request held {blocks:?} blocks after its steps, as the stepped scheduler \
             did; the engine served it in {secs:.1} s.",
            r.layout
        )?;
    }
    Ok(md)
}
