//! `paged-llm bench throughput`: offline throughput like `vllm bench throughput`. Random prompts
//! (`--num-prompts N --input-len L --output-len M`, random token ids, `ignore_eos`) or a JSONL
//! dataset (`{"prompt": "...", "output_len": M}` or `{"input_len": L, "output_len": M}` per
//! line); all requests are submitted at once and the engine runs until every one finishes.
//! Prints requests/s, total tokens/s and output tokens/s (`--json` for machines).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::bail;
use clap::Args;
use engine::{Prompt, SamplingParams};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use server::cli::EngineKnobs;

use crate::progress::{Progress, Unit};
use crate::start::{StartEngine, read_jsonl};

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

/// The dataset's prompts with their output lengths; `random(len)` makes an `input_len` prompt.
fn load_dataset(
    path: &Path,
    random: &mut impl FnMut(usize) -> Prompt,
    default_output: usize,
) -> anyhow::Result<Vec<(Prompt, usize)>> {
    read_jsonl(path, "bad dataset line", |at, d: DatasetLine| {
        let prompt = match (d.prompt, d.input_len) {
            (Some(p), _) => Prompt::Text(p),
            (None, Some(len)) => random(len),
            (None, None) => bail!("{at}: needs \"prompt\" or \"input_len\""),
        };
        Ok((prompt, d.output_len.unwrap_or(default_output)))
    })
}

pub fn run(args: &ThroughputArgs) -> anyhow::Result<()> {
    // Offline, every prompt is queued at once (as vLLM's offline engine does): no queue bound.
    let config = engine::EngineConfig { max_waiting: usize::MAX, ..args.knobs.config() };
    let mut engine = args.knobs.start_engine_with(args.json, config)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.knobs.seed);
    let (vocab, eos) = (engine.model_config().vocab_size, engine.eos_token_ids().to_vec());
    let mut random = |len| Prompt::Tokens(engine::workload::random_prompt(&mut rng, len, vocab, &eos));
    let requests = match &args.dataset {
        Some(path) => load_dataset(path, &mut random, args.output_len)?,
        None => (0..args.num_prompts).map(|_| (random(args.input_len), args.output_len)).collect(),
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
        let ids = engine.tokenize(&i.to_string(), prompt)?;
        prompt_tokens += ids.len();
        engine.add_request(i.to_string(), ids, params)?;
    }
    let num_requests = engine.num_unfinished();
    let mut output_tokens = 0usize;
    let mut progress =
        (!args.json).then(|| Progress::new(num_requests as u64, "bench throughput", Unit::Items("requests")));
    while engine.has_unfinished() {
        for out in engine.step()? {
            output_tokens += out.outputs.iter().map(|c| c.token_ids.len()).sum::<usize>();
            if let (true, Some(progress)) = (out.finished, progress.as_mut()) {
                progress.inc(1);
            }
        }
    }
    if let Some(progress) = progress {
        progress.finish();
    }
    let secs = started.elapsed().as_secs_f64();
    let m = engine.metrics();
    let per_s = |n: usize| n as f64 / secs;
    let (requests_per_s, output_per_s) = (per_s(num_requests), per_s(output_tokens));
    let total_per_s = per_s(prompt_tokens + output_tokens);
    if args.json {
        let report = serde_json::json!({
            "requests": num_requests,
            "elapsed_s": secs,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "requests_per_s": requests_per_s,
            "total_tokens_per_s": total_per_s,
            "output_tokens_per_s": output_per_s,
            "peak_kv_usage": m.peak_kv_usage,
            "preemptions": m.gauges.num_preemptions,
            "ttft_ms_p50": m.ttft.p50_ms,
            "tpot_ms_p50": m.tpot.p50_ms,
        });
        println!("{report}");
    } else {
        println!(
            "Throughput: {requests_per_s:.2} requests/s, {total_per_s:.2} total tokens/s, \
             {output_per_s:.2} output tokens/s"
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
