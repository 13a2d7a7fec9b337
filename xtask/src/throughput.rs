//! `cargo xtask throughput`: offline throughput like `vllm bench throughput`. Random prompts
//! (`--num-prompts N --input-len L --output-len M`, random token ids, `ignore_eos`) or a JSONL
//! dataset (`{"prompt": "...", "output_len": M}` or `{"input_len": L, "output_len": M}` per
//! line); all requests are submitted at once and the engine runs until every one finishes.
//! Prints requests/s, total tokens/s and output tokens/s (`--json` for machines).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use engine::{Engine, Prompt, SamplingParams};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::run::{EngineKnobs, init_tracing};

#[derive(Debug, Args)]
pub struct ThroughputArgs {
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    #[arg(long, default_value_t = 160)]
    pub input_len: usize,
    #[arg(long, default_value_t = 256)]
    pub output_len: usize,
    /// JSONL dataset instead of random prompts.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub knobs: EngineKnobs,
}

#[derive(Debug, serde::Deserialize)]
struct DatasetLine {
    prompt: Option<String>,
    input_len: Option<usize>,
    output_len: Option<usize>,
}

fn load_dataset(
    path: &Path,
    engine: &Engine,
    rng: &mut ChaCha8Rng,
    default_output: usize,
) -> anyhow::Result<Vec<(Prompt, usize)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let vocab = engine.model_config().vocab_size;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let d: DatasetLine = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: bad dataset line", path.display(), i + 1))?;
        let prompt = match (d.prompt, d.input_len) {
            (Some(p), _) => Prompt::Text(p),
            (None, Some(len)) => {
                Prompt::Tokens(engine::workload::random_prompt(rng, len, vocab, engine.eos_token_ids()))
            }
            (None, None) => bail!("{}:{}: needs \"prompt\" or \"input_len\"", path.display(), i + 1),
        };
        out.push((prompt, d.output_len.unwrap_or(default_output)));
    }
    Ok(out)
}

pub fn run(args: &ThroughputArgs) -> anyhow::Result<()> {
    crate::relaunch::ensure_release_build(args.knobs.device)?;
    if !args.json {
        init_tracing();
    }
    let dir = args.knobs.model_dir()?;
    let mut engine =
        Engine::new(&dir, args.knobs.config()).with_context(|| format!("loading {}", dir.display()))?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.knobs.seed);
    let requests: Vec<(Prompt, usize)> = match &args.dataset {
        Some(path) => load_dataset(path, &engine, &mut rng, args.output_len)?,
        None => {
            let vocab = engine.model_config().vocab_size;
            let eos = engine.eos_token_ids().to_vec();
            (0..args.num_prompts)
                .map(|_| {
                    (
                        Prompt::Tokens(engine::workload::random_prompt(
                            &mut rng,
                            args.input_len,
                            vocab,
                            &eos,
                        )),
                        args.output_len,
                    )
                })
                .collect()
        }
    };
    let started = Instant::now();
    let mut prompt_tokens = 0usize;
    for (i, (prompt, output_len)) in requests.into_iter().enumerate() {
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            ignore_eos: true,
            max_tokens: Some(output_len),
            ..Default::default()
        };
        let ids = engine.tokenize(&i.to_string(), prompt).map_err(|e| anyhow::anyhow!("{e}"))?;
        prompt_tokens += ids.len();
        engine.add_request(i.to_string(), ids, params).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let num_requests = engine.num_unfinished();
    let mut output_tokens = 0usize;
    while engine.has_unfinished() {
        for out in engine.step()? {
            output_tokens += out.outputs.iter().map(|c| c.token_ids.len()).sum::<usize>();
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let m = engine.metrics();
    let report = serde_json::json!({
        "requests": num_requests,
        "elapsed_s": secs,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "requests_per_s": num_requests as f64 / secs,
        "total_tokens_per_s": (prompt_tokens + output_tokens) as f64 / secs,
        "output_tokens_per_s": output_tokens as f64 / secs,
        "peak_kv_usage": m.peak_kv_usage,
        "preemptions": m.gauges.num_preemptions,
        "ttft_ms_p50": m.ttft.p50_ms,
        "tpot_ms_p50": m.tpot.p50_ms,
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "Throughput: {:.2} requests/s, {:.2} total tokens/s, {:.2} output tokens/s",
            num_requests as f64 / secs,
            (prompt_tokens + output_tokens) as f64 / secs,
            output_tokens as f64 / secs
        );
        println!(
            "{num_requests} requests, {prompt_tokens} prompt + {output_tokens} output tokens in {secs:.2} s; \
             peak KV usage {:.1} %, {} preemptions",
            m.peak_kv_usage * 100.0,
            m.gauges.num_preemptions
        );
    }
    Ok(())
}
