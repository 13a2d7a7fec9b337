//! Benchmark group `peer`: our engine against llama.cpp on the same models, prompts and machine,
//! in one run. llama.cpp is llama-cpp-python built from its sdist for this CPU in
//! `target/venv-llamacpp` (`cargo xtask llamacpp-python` builds it when missing or made for
//! another CPU, ~11 min on two cores; AMX off where the CPU has it, see `xtask/src/llamacpp.rs`) running the GGUFs of the default model (Q4_1) and of Gemma 3 270M (Q4_K_M); ours
//! loads the same GGUF natively (weights kept quantized, the default activations: int16 on AVX2
//! and AVX-512 CPUs), prefix caching off (the same prompt runs several times).
//!
//! Cases (token-id prompts, greedy, `ignore_eos`): `prefill_512` (one 512-token prompt),
//! `prefill_6000` (one 6 000-token prompt, chunked by both sides' 2 048-token batch),
//! `decode_6000` (the 128 tokens that same run decodes after it; llama.cpp keeps only the window
//! of a sliding-window layer, `swa_full` off), `decode_b1` (128 tokens after a 40-token prompt),
//! `e2e_16` and `e2e_64` (16 or 64 requests of ~40 tokens in, 128 out, all at once, prefill
//! included). Figures `peer.<case>_over_llamacpp` (ours ÷ theirs, tok/s; `peer.gemma3.<case>_…`
//! for Gemma) and both sides' raw tok/s, medians of 3; the same for ours with f32 activations
//! (`peer.f32.<case>_…`, `peer.gemma3.f32.<case>_…`); a table and a bar chart per model in the
//! report.
//!
//! Real model sizes: random weights at Llama-3.2-1B's shapes in Q4_0 (`peer.l1b.`) and Q4_K_M
//! (`peer.l1b_q4km.`), and at Llama-3.1-8B's in Q4_K_M (`peer.l8b.`, 32 output tokens per
//! decode case), made by `cargo xtask make-model` when missing (llama.cpp's quantizer, the real
//! vocabulary size); their cases are `prefill_512`, `decode_b1` and the `e2e` ones. Not part of
//! `cargo xtask test`. With `PEER_ONLY=<text>` only the models whose figure prefix or name contains
//! it run (`PEER_ONLY=gemma3`, `PEER_ONLY=smollm2`), with `PEER_CASES=decode_b1,prefill_512` only
//! those cases. With `PEER_SIDE=ours` only ours (the default
//! activations) is measured, into `<prefix><case>_ours_tok_s`: for comparing two builds of ours in alternation,
//! against one llama.cpp build whose figures do not change between them.
//!
//! 8-bit KV caches (the default model): `decode_6000` again with our int8 cache against
//! llama.cpp's q8_0 keys and values (flash attention on), `peer.decode_6000_int8kv_over_llamacpp_q8kv`
//! (and both sides' tok/s, `peer.decode_6000_int8kv_ours_tok_s`, `peer.decode_6000_q8kv_llamacpp_tok_s`).

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use engine::{ActivationPrecision, Engine, EngineConfig, KvCacheSize, SamplingParams};
use plotters::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

mod support;

const REPS: usize = 3;
/// Every case a model may run: its name, what it is (`N`: the model's output tokens).
const CASES: [(&str, &str); 6] = [
    ("prefill_512", "prefill of one 512-token prompt"),
    ("prefill_6000", "prefill of one 6 000-token prompt (chunks of 2 048)"),
    ("decode_6000", "batch-1 decode, 128 tokens after 6 000"),
    ("decode_b1", "batch-1 decode, N tokens after 40"),
    ("e2e_16", "16 requests × 40 in / N out"),
    ("e2e_64", "64 requests × 40 in / N out"),
];
/// The cases of the small models (all of them).
const ALL_CASES: &[&str] = &["prefill_512", "prefill_6000", "decode_6000", "decode_b1", "e2e_16", "e2e_64"];

/// The same prompts for both sides (random ids of the model's vocabulary, no special tokens),
/// and which of `CASES` run with how many output tokens. `e2e_16`'s prompts are `e2e_64`'s first
/// sixteen.
fn workload(engine: &Engine, m: &PeerModel) -> Value {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let (vocab, eos) = (engine.model_config().vocab_size, engine.eos_token_ids().to_vec());
    let mut prompt = |n| engine::workload::random_prompt(&mut rng, n, vocab, &eos);
    let prefill = prompt(512);
    let long = prompt(6000);
    let b1 = prompt(40);
    let mut lengths = ChaCha8Rng::seed_from_u64(3);
    let e2e: Vec<Vec<u32>> = (0..64).map(|_| prompt(lengths.random_range(38..=42))).collect();
    json!({
        "reps": REPS,
        "cases": chosen_cases(m),
        "prefill_512": prefill,
        "long_6000": {"prompt": long, "max_tokens": 128},
        "decode_b1": {"prompt": b1, "max_tokens": m.out_tokens},
        "e2e_64": {"prompts": e2e, "max_tokens": m.out_tokens},
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One run of some requests to the end.
struct RunResult {
    wall_s: f64,
    output_tokens: usize,
    /// Each request's (time to first token, latency), seconds.
    times: Vec<(f64, f64)>,
}

/// Runs `prompts` at once to the end.
fn run(engine: &mut Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Result<RunResult, Box<dyn Error>> {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) };
    let start = Instant::now();
    for (i, p) in prompts.iter().enumerate() {
        engine.add_request(format!("peer-{i}"), p.clone(), params.clone())?;
    }
    let (mut output_tokens, mut times) = (0, Vec::new());
    while engine.has_unfinished() {
        for out in engine.step()? {
            output_tokens += out.outputs.iter().map(|c| c.token_ids.len()).sum::<usize>();
            if let (true, Some(ttft), Some(lat)) =
                (out.finished, out.timing.time_to_first_token, out.timing.latency)
            {
                times.push((ttft.as_secs_f64(), lat.as_secs_f64()));
            }
        }
    }
    Ok(RunResult { wall_s: start.elapsed().as_secs_f64(), output_tokens, times })
}

fn measure_ours(engine: &mut Engine, w: &Value) -> Result<Value, Box<dyn Error>> {
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array().into_iter().flatten().filter_map(|x| x.as_u64()).map(|x| x as u32).collect()
    };
    let has = |case: &str| w["cases"].as_array().is_some_and(|c| c.iter().any(|x| x == case));
    let prefill = ids(&w["prefill_512"]);
    let long = ids(&w["long_6000"]["prompt"]);
    let after = w["long_6000"]["max_tokens"].as_u64().unwrap_or(128) as usize;
    let b1 = ids(&w["decode_b1"]["prompt"]);
    let out = w["decode_b1"]["max_tokens"].as_u64().unwrap_or(128) as usize;
    let e2e: Vec<Vec<u32>> = w["e2e_64"]["prompts"].as_array().into_iter().flatten().map(ids).collect();
    run(engine, &[prefill[..8].to_vec()], 2)?; // warm-up
    let mut rates: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    // The last round's decode steps of each e2e case, phase by phase.
    let mut phases = serde_json::Map::new();
    let mut push = |case, rate| rates.entry(case).or_default().push(rate);
    for _ in 0..REPS {
        if has("prefill_512") {
            let r = run(engine, std::slice::from_ref(&prefill), 1)?;
            push("prefill_512", prefill.len() as f64 / r.times[0].0);
        }
        if has("prefill_6000") || has("decode_6000") {
            let r = run(engine, std::slice::from_ref(&long), after)?;
            push("prefill_6000", long.len() as f64 / r.times[0].0);
            push("decode_6000", (r.output_tokens - 1) as f64 / (r.times[0].1 - r.times[0].0));
        }
        if has("decode_b1") {
            let r = run(engine, std::slice::from_ref(&b1), out)?;
            push("decode_b1", (r.output_tokens - 1) as f64 / (r.times[0].1 - r.times[0].0));
        }
        for (case, n) in [("e2e_16", 16), ("e2e_64", 64)] {
            if has(case) {
                engine.reset_metrics();
                let r = run(engine, &e2e[..n], out)?;
                push(case, r.output_tokens as f64 / r.wall_s);
                phases.insert(format!("{case}_decode_step"), step_phases_ms(&engine.metrics().decode_steps));
            }
        }
    }
    let medians = rates.into_iter().map(|(case, v)| (format!("{case}_tok_s"), json!(median(v))));
    Ok(Value::Object(medians.chain(phases).collect()))
}

/// A decode step's mean milliseconds by phase, from the engine's sums.
fn step_phases_ms(p: &engine::StepPhases) -> Value {
    let ms = |s: f64| s * 1e3 / p.steps.max(1) as f64;
    json!({
        "steps": p.steps,
        "step": ms(p.total_s()),
        "schedule": ms(p.schedule_s),
        "prepare": ms(p.prepare_s),
        "forward": ms(p.forward_s),
        "sample": ms(p.sample_s),
        "update": ms(p.update_s),
    })
}

/// The report's table of ours' decode steps in the e2e cases, phase by phase (the forward's
/// own phases are the `model` group's breakdown).
fn step_phases_md(ours: &Value) -> String {
    let mut md =
        "\nOurs' decode steps in the e2e cases (the last round's steps that prefilled nothing), mean \
                  ms by phase: `forward` includes the greedy argmax; `update` stop checks, \
                  detokenization, the scheduler's update and the outputs.\n\n\
                  | case | steps | step ms | schedule | prepare | forward | sample | update |\n\
                  |---|---:|---:|---:|---:|---:|---:|---:|\n"
            .to_owned();
    let mut any = false;
    for case in ["e2e_16", "e2e_64"] {
        let p = &ours[format!("{case}_decode_step")];
        if p.is_object() {
            any = true;
            let f = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
            md += &format!(
                "| {case} | {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} |\n",
                p["steps"],
                f("step"),
                f("schedule"),
                f("prepare"),
                f("forward"),
                f("sample"),
                f("update")
            );
        }
    }
    if any { md } else { String::new() }
}

/// One model the group compares on.
struct PeerModel {
    /// How the report names it.
    label: &'static str,
    /// Prefix of its figures' names (`peer.` for the default model).
    prefix: &'static str,
    /// What the GGUF holds, for the report.
    weights: &'static str,
    /// Its GGUF, fetched when missing.
    gguf: fn() -> Result<PathBuf, String>,
    /// KV blocks of 16 tokens: 64 × 168 tokens, or one 6 000-token prompt, in its layout (a
    /// hybrid layout's block holds a group of layers, so the same memory is more blocks).
    kv_blocks: usize,
    /// Which of [`CASES`] it runs.
    cases: &'static [&'static str],
    /// Output tokens of `decode_b1` and the `e2e` cases.
    out_tokens: usize,
    /// Whether ours runs again with f32 activations (`<prefix>f32.<case>_…`).
    f32_too: bool,
    /// Whether `decode_6000` runs again over 8-bit KV caches (ours int8, llama.cpp q8_0).
    int8_kv: bool,
}

/// The 1B–8B shapes (`cargo xtask make-model`: random weights, llama.cpp's quantizer).
fn l1b_q4_0() -> Result<PathBuf, String> {
    model::testing::made_model_fetched("llama-3.2-1b", "q4_0")
}
fn l1b_q4_k_m() -> Result<PathBuf, String> {
    model::testing::made_model_fetched("llama-3.2-1b", "q4_k_m")
}
fn l8b_q4_k_m() -> Result<PathBuf, String> {
    model::testing::made_model_fetched("llama-3.1-8b", "q4_k_m")
}

/// A made model of Llama-3.2-1B's size: the default model's KV blocks and output tokens, every
/// case but the long-prompt ones, ours with its default activations only.
fn made(
    label: &'static str,
    prefix: &'static str,
    weights: &'static str,
    gguf: fn() -> Result<PathBuf, String>,
) -> PeerModel {
    PeerModel {
        label,
        prefix,
        weights,
        gguf,
        kv_blocks: 64 * 12 + 64,
        cases: &["prefill_512", "decode_b1", "e2e_16", "e2e_64"],
        out_tokens: 128,
        f32_too: false,
        int8_kv: false,
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let models = [
        PeerModel {
            label: "SmolLM2-135M-Instruct",
            prefix: "peer.",
            weights: "Q4_1",
            gguf: model::testing::default_model_fetched,
            kv_blocks: 64 * 12 + 64,
            cases: ALL_CASES,
            out_tokens: 128,
            f32_too: true,
            int8_kv: true,
        },
        PeerModel {
            label: "Gemma 3 270M",
            prefix: "peer.gemma3.",
            weights: "Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)",
            gguf: model::testing::gemma3_gguf_fetched,
            // Six groups of three layers (five sliding, one full): six blocks per 16 tokens.
            kv_blocks: (64 * 12 + 64) * 6,
            cases: ALL_CASES,
            out_tokens: 128,
            f32_too: true,
            int8_kv: false,
        },
        made(
            "Llama-3.2-1B's shapes, random weights",
            "peer.l1b.",
            "Q4_0 (llama.cpp's quantizer: Q4_0 layers, a Q6_K tied embedding and LM head)",
            l1b_q4_0,
        ),
        made(
            "Llama-3.2-1B's shapes, random weights, Q4_K_M",
            "peer.l1b_q4km.",
            "Q4_K_M (llama.cpp's quantizer: Q4_K, Q6_K for half of attn_v / ffn_down and the LM head)",
            l1b_q4_k_m,
        ),
        PeerModel {
            kv_blocks: 16 * 12 + 16,
            cases: &["prefill_512", "decode_b1", "e2e_16"],
            out_tokens: 32,
            ..made(
                "Llama-3.1-8B's shapes, random weights, Q4_K_M",
                "peer.l8b.",
                "Q4_K_M (llama.cpp's quantizer), untied LM head",
                l8b_q4_k_m,
            )
        },
    ];
    let figures_dir = support::figures_dir()?;
    // Beside the figures folder, whose every .json is read as figures.
    let report_dir = figures_dir.parent().unwrap_or(&figures_dir).to_path_buf();
    let only = std::env::var("PEER_ONLY").unwrap_or_default();
    let ours_only = std::env::var("PEER_SIDE").is_ok_and(|s| s == "ours");
    let python = if ours_only { None } else { Some(support::llamacpp::llamacpp_python()?) };
    let mut figures = serde_json::Map::new();
    let mut md = "## Against llama.cpp (`peer`)\n".to_owned();
    for (i, m) in models.iter().enumerate().filter(|(_, m)| runs(m, &only)) {
        let svg = format!("peer{}.svg", if i == 0 { String::new() } else { format!("-{i}") });
        md += &match &python {
            Some(python) => compare(m, python, &report_dir, &svg, &mut figures)?,
            None => ours_alone(m, &mut figures)?,
        };
    }
    let figures = Value::Object(figures);
    std::fs::write(figures_dir.join("peer.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    std::fs::write(figures_dir.join("peer.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}

/// Whether `PEER_ONLY` (empty: every model) picks `m`: a part of its figures' prefix or, case
/// aside, of its label (`PEER_ONLY=smollm2` runs the default model alone, whose prefix `peer.`
/// every prefix contains).
fn runs(m: &PeerModel, only: &str) -> bool {
    m.prefix.contains(only) || m.label.to_lowercase().contains(&only.to_lowercase())
}

/// The cases of `m` that run: all of them, or those `PEER_CASES` (a comma-separated list) names.
fn chosen_cases(m: &PeerModel) -> Vec<&'static str> {
    let only = std::env::var("PEER_CASES").unwrap_or_default();
    let named: Vec<&str> = only.split(',').map(str::trim).filter(|c| !c.is_empty()).collect();
    m.cases.iter().copied().filter(|c| named.is_empty() || named.contains(c)).collect()
}

/// The engine's configuration for `m`: prefix caching off, since the same prompts run again.
fn engine_config(m: &PeerModel) -> EngineConfig {
    EngineConfig {
        max_model_len: Some(8192),
        kv_cache: KvCacheSize::Blocks(m.kv_blocks),
        enable_prefix_caching: false,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// Ours alone on `m` (the default activations): its raw tok/s into `figures`; returns its
/// section of the report.
fn ours_alone(m: &PeerModel, figures: &mut serde_json::Map<String, Value>) -> Result<String, Box<dyn Error>> {
    let mut engine = Engine::new(&(m.gguf)()?, engine_config(m))?;
    let w = workload(&engine, m);
    let ours = measure_ours(&mut engine, &w)?;
    let mut md = format!("\n### {} (ours alone)\n\n| case | ours tok/s |\n|---|---:|\n", m.label);
    for (case, what) in CASES.into_iter().filter(|(c, _)| chosen_cases(m).contains(c)) {
        let what = what.replace('N', &m.out_tokens.to_string());
        let o = ours[format!("{case}_tok_s")].as_f64().unwrap_or(f64::NAN);
        figures.insert(format!("{}{case}_ours_tok_s", m.prefix), json!(o));
        writeln!(md, "| {what} | {o:.1} |")?;
    }
    md += &step_phases_md(&ours);
    Ok(md)
}

/// Both sides on `m`: its figures into `figures`, a bar chart into `report_dir/svg`; returns
/// its section of the report.
fn compare(
    m: &PeerModel,
    python: &Path,
    report_dir: &Path,
    svg: &str,
    figures: &mut serde_json::Map<String, Value>,
) -> Result<String, Box<dyn Error>> {
    let gguf = &(m.gguf)()?;
    let config = engine_config(m);
    let mut engine = Engine::new(gguf, config.clone())?;
    let w = workload(&engine, m);
    let workload_path = report_dir.join(format!("{}workload.json", m.prefix.replace('.', "-")));
    std::fs::write(&workload_path, w.to_string())?;

    let threads = rayon::current_num_threads().to_string();
    let script = support::root().join("engine/benches/peer_llamacpp.py");
    // llama.cpp's extra CPU buffer types (AMX, repacked layouts) crash on some machines that
    // advertise AMX; a probe decides whether the measured run may use them.
    let no_extra_bufts = !support::llamacpp::extra_buffers_work(python, gguf, rayon::current_num_threads())?;
    if no_extra_bufts {
        eprintln!("peer: llama.cpp with its extra buffer types failed; measuring it without them");
    }
    let llamacpp = |workload: &Path, kv_type: &str| -> Result<Value, Box<dyn Error>> {
        let out = Command::new(python)
            .arg(&script)
            .arg(gguf)
            .arg(workload)
            .arg(&threads)
            .env("PEER_NO_EXTRA_BUFTS", if no_extra_bufts { "1" } else { "0" })
            .env("PEER_KV_TYPE", kv_type)
            .output()?;
        if !out.status.success() {
            return Err(format!("llama.cpp side failed:\n{}", String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let theirs = llamacpp(&workload_path, "f16")?;
    let ours = measure_ours(&mut engine, &w)?;
    drop(engine);
    // The same with f32 activations (what the weights' f32 dequantization computes; llama.cpp's
    // own CPU matmuls round activations to 8 bits).
    let f32_config = EngineConfig { decode_activations: ActivationPrecision::F32, ..config };
    let ours_f32 =
        if m.f32_too { Some(measure_ours(&mut Engine::new(gguf, f32_config)?, &w)?) } else { None };
    // Both GGUFs hold integer-code formats only.
    let int16_here = ActivationPrecision::default()
        .resolve(quant_kernels::Isa::detected(), quant_kernels::quant::INTEGER_CODE_FORMATS.into_iter())
        == ActivationPrecision::Int16;
    let default = if int16_here { "int16" } else { "f32" };

    let mut md = format!(
        "\n### {}\n\nSame token ids, {threads} threads, medians of {REPS}: both on the same {} GGUF, ours \
         loading it natively (weights kept quantized, the default activations: on this CPU {default}), \
         llama.cpp (llama-cpp-python {}, built with `{}`). Command: `cargo xtask bench --only peer`.\n\n\
         `f32` is ours with `--decode-activations f32` (what the weights' f32 dequantization computes).\n\n\
         | case | ours tok/s | llama.cpp tok/s | ours ÷ llama.cpp | f32 tok/s | f32 ÷ llama.cpp |\n\
         |---|---:|---:|---:|---:|---:|\n",
        m.label,
        m.weights,
        theirs["llama_cpp_python"].as_str().unwrap_or("?"),
        support::llamacpp::build_options(python),
    );
    let prefix = m.prefix;
    let mut bars = Vec::new();
    for (case, what) in CASES.into_iter().filter(|(c, _)| chosen_cases(m).contains(c)) {
        let key = format!("{case}_tok_s");
        let rate = |v: &Value| v[&key].as_f64().unwrap_or(f64::NAN);
        let (o, t) = (rate(&ours), rate(&theirs));
        figures.insert(format!("{prefix}{case}_over_llamacpp"), json!(o / t));
        figures.insert(format!("{prefix}{case}_ours_tok_s"), json!(o));
        figures.insert(format!("{prefix}{case}_llamacpp_tok_s"), json!(t));
        let what = what.replace('N', &m.out_tokens.to_string());
        match &ours_f32 {
            Some(f) => {
                let of = rate(f);
                figures.insert(format!("{prefix}f32.{case}_over_llamacpp"), json!(of / t));
                figures.insert(format!("{prefix}f32.{case}_ours_tok_s"), json!(of));
                writeln!(md, "| {what} | {o:.1} | {t:.1} | {:.2} | {of:.1} | {:.2} |", o / t, of / t)?;
            }
            None => writeln!(md, "| {what} | {o:.1} | {t:.1} | {:.2} | – | – |", o / t)?,
        }
        bars.push((case, o, t));
    }
    if no_extra_bufts {
        writeln!(
            md,
            "\nllama.cpp ran without its extra CPU buffer types (`use_extra_bufts = false`): with them \
             its probe decode failed on this machine (seen: SIGSEGV in `ggml_backend_amx_mul_mat` on a \
             VM that advertises AMX)."
        )?;
    }
    if m.int8_kv && chosen_cases(m).contains(&"decode_6000") {
        // decode_6000 alone, over 8-bit caches on both sides.
        let mut w8 = w.clone();
        w8["cases"] = json!(["decode_6000"]);
        let path8 = report_dir.join(format!("{}workload-kv8.json", m.prefix.replace('.', "-")));
        std::fs::write(&path8, w8.to_string())?;
        let theirs8 = llamacpp(&path8, "q8_0")?;
        let int8 = EngineConfig { kv_dtype: engine::DType::Int8, ..engine_config(m) };
        let ours8 = measure_ours(&mut Engine::new(gguf, int8)?, &w8)?;
        let rate = |v: &Value| v["decode_6000_tok_s"].as_f64().unwrap_or(f64::NAN);
        let (o, t) = (rate(&ours8), rate(&theirs8));
        figures.insert(format!("{prefix}decode_6000_int8kv_over_llamacpp_q8kv"), json!(o / t));
        figures.insert(format!("{prefix}decode_6000_int8kv_ours_tok_s"), json!(o));
        figures.insert(format!("{prefix}decode_6000_q8kv_llamacpp_tok_s"), json!(t));
        writeln!(
            md,
            "\n8-bit KV caches, batch-1 decode of 128 tokens after 6 000: ours with `--kv-cache-dtype int8` \
             {o:.1} tok/s, llama.cpp with q8_0 keys and values (flash attention) {t:.1} tok/s: {:.2}.",
            o / t
        )?;
    }
    md += &step_phases_md(&ours);
    draw_bars(&report_dir.join(svg), &bars)?;
    writeln!(md, "\n![ours and llama.cpp on {}, tokens per second per case]({svg})", m.label)?;
    Ok(md)
}

/// Two bars per case: ours (blue) and llama.cpp (grey), tokens per second.
fn draw_bars(path: &Path, bars: &[(&str, f64, f64)]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = bars.iter().map(|b| b.1.max(b.2)).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("tokens / s: ours (blue) vs llama.cpp (grey)", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..bars.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|x| bars.get(*x as usize).map_or(String::new(), |b| b.0.to_owned()))
        .y_desc("tokens / s")
        .draw()?;
    for (i, (_, o, t)) in bars.iter().enumerate() {
        let x = i as f64;
        chart.draw_series([
            Rectangle::new([(x + 0.15, 0.0), (x + 0.48, *o)], BLUE.filled()),
            Rectangle::new([(x + 0.52, 0.0), (x + 0.85, *t)], RGBColor(150, 150, 150).filled()),
        ])?;
    }
    root.present()?;
    Ok(())
}
