//! `paged-llm perplexity`: llama-perplexity's measurement on this engine's forward pass. The
//! text's tokens in windows of `--ctx` (every `--stride`, at most `--chunks`), each window's
//! second half scored; prints the running perplexity per window and the final estimate with
//! its ±. `--save-logits F` writes the reference file (`model::quality`'s format: top tokens of
//! every scored row); `--kl-reference F` runs over that file's tokens and reports the KL
//! divergence to it (mean ±, p99, max), the same-top-token share, RMS Δp and the perplexity
//! ratio; with `--evaluated F` as well, of another implementation's rows over the reference's
//! windows instead of this engine's (llama.cpp's, from `engine/benches/quality_llamacpp.py`).
//! The default text is CPython's reference-manual topics (`pydoc_data`, on every
//! machine with python3; the Python version and the text's SHA-256 are printed with it).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use engine::config::{DECODE_ACTIVATIONS, KV_DTYPE};
use model::quality::{
    EvaluatedReader, Evaluation, QualityReport, ReferenceHeader, ReferenceReader, ReferenceWriter, Tally,
    WindowPlan, compare_evaluated, evaluate, pydoc_topics,
};
use model::{ActivationPrecision, Model, ModelFolder};
use sha2::Digest;

use crate::cache_dir;

#[derive(Debug, Args)]
pub struct PerplexityArgs {
    /// The model: a folder or GGUF path, or a name `fetch-model` knows (smollm2, gemma3-270m).
    #[arg(long)]
    pub model: PathBuf,
    /// The text (default: CPython's reference-manual topics, from this machine's python3).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Tokens per window (default 512; with `--kl-reference`, the reference's).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Tokens between window starts (default: `--ctx`, windows side by side).
    #[arg(long)]
    pub stride: Option<usize>,
    /// At most this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Activations of the matmuls over quantized weights: auto, f32 or int16.
    #[arg(long, default_value = "auto", value_parser = parse_activations)]
    pub decode_activations: ActivationPrecision,
    /// KV cache dtype: auto (the CPU default, bf16), f32, bf16, f16 or int8.
    #[arg(long, default_value = "auto", value_parser = parse_kv_dtype)]
    pub kv_cache_dtype: engine::DType,
    /// Write the reference file (the top tokens of every scored row) here.
    #[arg(long)]
    pub save_logits: Option<PathBuf>,
    /// Compare every scored row with this reference file (and run over its tokens).
    #[arg(long)]
    pub kl_reference: Option<PathBuf>,
    /// With `--kl-reference`: compare this evaluated-rows file (another implementation's run over
    /// the reference's windows, e.g. `engine/benches/quality_llamacpp.py`'s) instead of running
    /// the model.
    #[arg(long, requires = "kl_reference")]
    pub evaluated: Option<PathBuf>,
    /// Also write the final figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn parse_activations(s: &str) -> Result<ActivationPrecision, String> {
    DECODE_ACTIVATIONS
        .parse(s)
        .ok_or_else(|| format!("one of {}", DECODE_ACTIVATIONS.names().collect::<Vec<_>>().join(", ")))
}

fn parse_kv_dtype(s: &str) -> Result<engine::DType, String> {
    KV_DTYPE.parse(s).ok_or_else(|| format!("one of {}", KV_DTYPE.names().collect::<Vec<_>>().join(", ")))
}

pub fn run(args: &PerplexityArgs) -> anyhow::Result<()> {
    if let (Some(evaluated), Some(reference)) = (&args.evaluated, &args.kl_reference) {
        return compare_files(reference, evaluated, args.json.as_deref());
    }
    let path = crate::fetch_model::resolve_model(&args.model)?;
    let folder = ModelFolder::open(&path)?;
    let mut model = Model::load(&path)?;
    model.activations = args.decode_activations;
    let name =
        path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let vocab = model.config.vocab_size;
    let mut reference = args.kl_reference.as_deref().map(ReferenceReader::open).transpose()?;
    let (plan, tokens) = match &reference {
        Some(r) => reference_windows(r, args, vocab)?,
        None => {
            let (text, about) = read_text(args.text.as_deref())?;
            eprintln!("perplexity: text {about}");
            let ids = folder.tokenizer.encode(&text, false, false)?;
            let bos = folder.tokenizer.encode("", false, true)?.first().copied();
            let plan = WindowPlan::new(ids.len(), args.ctx.unwrap_or(512), args.stride, args.chunks)?;
            eprintln!(
                "perplexity: {} tokens, {} windows of {} (BOS {bos:?})",
                ids.len(),
                plan.windows,
                plan.ctx
            );
            (plan, plan.window_tokens(&ids, bos))
        }
    };
    model.set_context(plan.ctx);
    let mut writer = match &args.save_logits {
        Some(out) => {
            let header = ReferenceHeader::for_plan(&plan, vocab, name.clone());
            Some(ReferenceWriter::create(out, &header, &tokens)?)
        }
        None => None,
    };
    eprintln!(
        "perplexity: {name}, activations {:?}, KV cache {:?}, scoring rows {}..{} of each window",
        args.decode_activations,
        args.kv_cache_dtype,
        plan.first_scored(),
        plan.ctx - 1
    );
    let started = std::time::Instant::now();
    let mut progress = |w: usize, t: &Tally| eprint!("[{}]{:.4},", w + 1, t.ppl());
    let ev =
        Evaluation { save: writer.as_mut(), reference: reference.as_mut(), progress: Some(&mut progress) };
    let tally = evaluate(&model, &plan, &tokens, args.kv_cache_dtype, ev)?;
    eprintln!();
    if let Some(wr) = writer {
        wr.finish()?;
    }
    finish(&tally.report(), started, args.json.as_deref())
}

/// The report of an evaluated-rows file against its reference, row by row.
fn compare_files(reference: &Path, evaluated: &Path, json: Option<&Path>) -> anyhow::Result<()> {
    let mut reference = ReferenceReader::open(reference)?;
    let mut evaluated = EvaluatedReader::open(evaluated, &reference.header)?;
    eprintln!("perplexity: {} against {}", evaluated.name, reference.header.name);
    let started = std::time::Instant::now();
    let tally = compare_evaluated(&mut reference, &mut evaluated)?;
    finish(&tally.report(), started, json)
}

fn finish(report: &QualityReport, started: std::time::Instant, json: Option<&Path>) -> anyhow::Result<()> {
    print_report(report, started.elapsed().as_secs_f64());
    if let Some(out) = json {
        std::fs::write(out, serde_json::to_string_pretty(report)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// The windows of a reference file, checked against this model and the arguments given.
fn reference_windows(
    r: &ReferenceReader,
    args: &PerplexityArgs,
    vocab: usize,
) -> anyhow::Result<(WindowPlan, Vec<u32>)> {
    let h = &r.header;
    r.check_vocab(vocab)?;
    if let Some(ctx) = args.ctx.filter(|&c| c != h.ctx) {
        bail!("the reference's windows are of {} tokens, --ctx {ctx}", h.ctx);
    }
    if args.text.is_some() || args.stride.is_some() || args.chunks.is_some() {
        bail!(
            "with --kl-reference the text and its windows are the reference's: leave out --text, --stride, --chunks"
        );
    }
    let plan = WindowPlan::new(h.windows * h.ctx, h.ctx, Some(h.ctx), Some(h.windows))?;
    if plan.first_scored() != h.first_scored {
        bail!("the reference scores rows from {}, this plan from {}", h.first_scored, plan.first_scored());
    }
    eprintln!("perplexity: over the reference's {} windows of {} (made with {})", h.windows, h.ctx, h.name);
    Ok((plan, r.tokens.clone()))
}

/// The text and a line saying where it came from.
fn read_text(path: Option<&Path>) -> anyhow::Result<(String, String)> {
    let (text, source) = match path {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            p.display().to_string(),
        ),
        None => {
            let corpus = pydoc_topics(&cache_dir().join("quality"))?;
            (corpus.text, corpus.about)
        }
    };
    let sha = sha2::Sha256::digest(text.as_bytes());
    let hex: String = sha.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let about = format!("{source}: {} bytes, sha256 {hex}…", text.len());
    Ok((text, about))
}

fn print_report(r: &QualityReport, seconds: f64) {
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5} ({} scored tokens, {seconds:.1} s)",
        r.ppl, r.ppl_err, r.rows
    );
    if let (Some(rp), Some(ratio), Some(kld), Some(err), Some(p99), Some(max), Some(top1), Some(rms)) = (
        r.reference_ppl,
        r.ppl_ratio,
        r.kld_mean,
        r.kld_err,
        r.kld_p99,
        r.kld_max,
        r.top1_agree,
        r.rms_delta_p,
    ) {
        println!("Reference PPL:   {rp:.4}");
        println!("PPL ratio:       {ratio:.6}");
        println!("Mean KLD:        {kld:.6} +/- {err:.6}");
        println!("99.0% KLD:       {p99:.6}");
        println!("Maximum KLD:     {max:.6}");
        println!("Same top token:  {:.3} %", top1 * 100.0);
        println!("RMS Δp:          {:.4} %", rms * 100.0);
    }
}
