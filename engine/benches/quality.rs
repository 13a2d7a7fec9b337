//! Benchmark group `quality`: how far each arithmetic path is from the f32 reference, measured as
//! llama.cpp measures quantizations (`llama-perplexity --kl-divergence`), on SmolLM2-135M (Q4_1)
//! and Gemma 3 270M (Q4_K_M), over CPython's reference-manual topics (`model::quality`'s default
//! text) in windows of 512 tokens, the second half of each scored.
//!
//! The reference is this engine with f32 activations and an f32 KV cache (which the golden tests
//! tie to llama.cpp's exact f32 math); its top-64 rows go to `target/quality/<model>-f32.ref`.
//! Every path runs the same windows and is compared row by row:
//! - `f32`: the reference's arithmetic again (the instrument reads zero);
//! - `int16`, `int8`: activations rounded per group of 32 for the integer kernels, f32 KV;
//! - `bf16_kv`: f32 activations over a bf16 KV cache;
//! - `int8_kv`: f32 activations over the int8 KV cache;
//! - `default`: what users run on this CPU (`auto` activations, the default bf16 KV cache);
//! - `llamacpp_default`: llama.cpp (llama-cpp-python, the `peer` bench's build) on the same GGUF
//!   with its default CPU arithmetic (8-bit activations, f16 KV cache), through
//!   `quality_llamacpp.py`;
//! - `llamacpp_q8_kv`: the same with q8_0 keys and values (`-ctk q8_0 -ctv q8_0`), beside which
//!   `int8_kv` is read.
//!
//! Figures `quality.<model>.<path>.kld_mean`, `.top1_agree` (0..1), `.ppl_ratio`, `.kld_p99`;
//! `quality.<model>.rows` (rows scored). `BENCH_QUICK=1` scores 16 windows instead of 128.
//! Writes `$BENCH_FIGURES_DIR/quality.json` and the fragment `quality.md`.

use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use engine::ActivationPrecision;
use engine::DType;
use model::quality::{
    EvaluatedReader, Evaluation, QualityReport, ReferenceHeader, ReferenceReader, ReferenceWriter,
    WindowPlan, compare_evaluated, evaluate, pydoc_topics,
};
use model::{Model, ModelFolder};
use serde_json::{Map, Value};

mod support;

const CTX: usize = 512;

/// Where a model's GGUF is, fetched if missing.
type FetchModel = fn() -> Result<std::path::PathBuf, String>;

/// The engine's paths: name, activations, KV cache dtype.
const PATHS: [(&str, ActivationPrecision, DType); 6] = [
    ("f32", ActivationPrecision::F32, DType::F32),
    ("int16", ActivationPrecision::Int16, DType::F32),
    ("int8", ActivationPrecision::Int8, DType::F32),
    ("bf16_kv", ActivationPrecision::F32, DType::BF16),
    ("int8_kv", ActivationPrecision::F32, DType::Int8),
    ("default", ActivationPrecision::Auto, DType::BF16),
];

fn main() -> Result<(), Box<dyn Error>> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let windows = if quick { 16 } else { 128 };
    let dir = support::root().join("target/quality");
    let corpus = pydoc_topics(&dir)?;
    let models: [(&str, FetchModel); 2] =
        [("smollm2", model::testing::default_model_fetched), ("gemma3", model::testing::gemma3_gguf_fetched)];
    let python = support::llamacpp::llamacpp_python()?;
    let (mut figures, mut md) =
        (Map::new(), String::from("## Quality against the f32 reference (`quality`)\n"));
    for (name, fetch) in models {
        let mut md_llamacpp = String::new();
        let gguf = fetch()?;
        let mut model = Model::load(&gguf)?;
        let folder = ModelFolder::open(&gguf)?;
        let ids = folder.tokenizer.encode(&corpus.text, false, false)?;
        let bos = folder.tokenizer.encode("", false, true)?.first().copied();
        let plan = WindowPlan::new(ids.len(), CTX, None, Some(windows))?;
        let tokens = plan.window_tokens(&ids, bos);
        model.set_context(CTX);
        let reference = dir.join(format!("{name}-f32.ref"));
        save_reference(&mut model, &plan, &tokens, &reference, &gguf)?;
        let mut rows: Vec<(String, QualityReport)> = Vec::new();
        for (path, activations, dtype) in PATHS {
            model.activations = activations;
            let mut r = ReferenceReader::open(&reference)?;
            let tally = evaluate(
                &model,
                &plan,
                &tokens,
                dtype,
                Evaluation { reference: Some(&mut r), ..Evaluation::default() },
            )?;
            rows.push((path.to_owned(), tally.report()));
            eprintln!("quality: {name} {path}: {:?}", rows.last().map(|r| r.1));
        }
        for (path, args) in [("llamacpp_default", &[][..]), ("llamacpp_q8_kv", &["--kv-q8"][..])] {
            let out = dir.join(format!("{name}-{path}.evl"));
            let report = llamacpp(&python, &gguf, &reference, &out, args, &mut md_llamacpp)?;
            rows.push((path.to_owned(), report));
        }
        for (path, r) in &rows {
            let key = |k: &str| format!("quality.{name}.{path}.{k}");
            for (k, v) in [
                ("kld_mean", r.kld_mean),
                ("top1_agree", r.top1_agree),
                ("ppl_ratio", r.ppl_ratio),
                ("kld_p99", r.kld_p99),
            ] {
                if let Some(v) = v {
                    figures.insert(key(k), v.into());
                }
            }
        }
        figures.insert(format!("quality.{name}.rows"), rows[0].1.rows.into());
        md += &table(name, &gguf, &corpus.about, &plan, &rows);
        md += &md_llamacpp;
    }
    let out = support::figures_dir()?;
    std::fs::write(out.join("quality.json"), serde_json::to_string_pretty(&Value::Object(figures))? + "\n")?;
    std::fs::write(out.join("quality.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The reference run (f32 activations, f32 KV) with its rows saved to `out`.
fn save_reference(
    model: &mut Model,
    plan: &WindowPlan,
    tokens: &[u32],
    out: &Path,
    gguf: &Path,
) -> Result<(), Box<dyn Error>> {
    model.activations = ActivationPrecision::F32;
    let vocab = model.config.vocab_size;
    let header = ReferenceHeader::for_plan(
        plan,
        vocab,
        format!("{} (f32 activations, f32 KV)", gguf.file_name().unwrap_or_default().to_string_lossy()),
    );
    let mut writer = ReferenceWriter::create(out, &header, tokens)?;
    evaluate(
        model,
        plan,
        tokens,
        DType::F32,
        Evaluation { save: Some(&mut writer), ..Evaluation::default() },
    )?;
    writer.finish()?;
    Ok(())
}

/// llama.cpp's rows over the reference's windows, compared with the reference; a line saying
/// which llama.cpp ran goes to `md`.
fn llamacpp(
    python: &Path,
    gguf: &Path,
    reference: &Path,
    out: &Path,
    args: &[&str],
    md: &mut String,
) -> Result<QualityReport, Box<dyn Error>> {
    let threads = rayon::current_num_threads();
    let extra = support::llamacpp::extra_buffers_work(python, gguf, threads)?;
    *md = format!(
        "\n`llamacpp_default`: llama.cpp built with `{}`, {threads} threads, {}.\n",
        support::llamacpp::build_options(python),
        if extra {
            "its extra CPU buffer types (repacked weight layouts) on"
        } else {
            "its extra CPU buffer types off (with them its probe decode failed here)"
        }
    );
    let script = support::root().join("engine/benches/quality_llamacpp.py");
    let status = Command::new(python)
        .arg(&script)
        .args([
            "--model".as_ref(),
            gguf.as_os_str(),
            "--reference".as_ref(),
            reference.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
        ])
        .args(["--threads", &threads.to_string()])
        .args(args)
        .args(if extra { &[][..] } else { &["--no-extra-buffers"][..] })
        .status()?;
    if !status.success() {
        return Err(format!("{} failed: {status}", script.display()).into());
    }
    let mut r = ReferenceReader::open(reference)?;
    let mut e = EvaluatedReader::open(out, &r.header)?;
    let tally = compare_evaluated(&mut r, &mut e)?;
    Ok(tally.report())
}

fn table(
    name: &str,
    gguf: &Path,
    about: &str,
    plan: &WindowPlan,
    rows: &[(String, QualityReport)],
) -> String {
    let mut md = format!(
        "\n### {name} ({})\n\n{about}; {} windows of {} tokens, {} rows scored; reference: this engine, f32 \
         activations, f32 KV cache (PPL {:.4}).\n\n| path | PPL | PPL ratio | mean KLD | 99 % KLD | max KLD | same top | RMS Δp |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        gguf.file_name().unwrap_or_default().to_string_lossy(),
        plan.windows,
        plan.ctx,
        rows.first().map_or(0, |r| r.1.rows),
        rows.first().and_then(|r| r.1.reference_ppl).unwrap_or(f64::NAN),
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("–".to_owned(), |v| format!("{v:.digits$}"));
    for (path, r) in rows {
        let _ = writeln!(
            md,
            "| {path} | {:.4} ± {:.4} | {} | {} ± {} | {} | {} | {} % | {} % |",
            r.ppl,
            r.ppl_err,
            f(r.ppl_ratio, 5),
            f(r.kld_mean, 6),
            f(r.kld_err, 6),
            f(r.kld_p99, 5),
            f(r.kld_max, 4),
            f(r.top1_agree.map(|v| v * 100.0), 3),
            f(r.rms_delta_p.map(|v| v * 100.0), 4),
        );
    }
    md
}
