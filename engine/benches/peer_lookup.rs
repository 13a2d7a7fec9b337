//! Benchmark `peer_lookup` (group `peer`): batch-1 speculative decoding against llama.cpp's
//! prompt lookup decoding on the same GGUF (SmolLM2's Q4_1), prompts and machine. Ours runs
//! n-gram drafts (`{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
//! "prompt_lookup_max": 5}`); llama.cpp runs llama-cpp-python's `LlamaPromptLookupDecoding` with
//! the same 4 draft tokens and n-grams of up to 5 (`peer_lookup_llamacpp.py`). The workload is
//! the `spec` group's answers that copy from their prompt (`spec_data/prompts.json`, `grounded`),
//! rendered with the model's chat template into the same token ids for both, one request at a
//! time, greedy, at most 128 tokens; 3 rounds, each side's drafted and plain runs alternating.
//!
//! Figures (`$BENCH_FIGURES_DIR/peer_lookup.json`): `peer.decode_b1_spec_over_llamacpp_lookup`
//! (ours with drafts ÷ llama.cpp with lookup, output tok/s, medians of rounds), both sides' tok/s
//! with and without drafts (`peer.decode_b1_spec_ours_tok_s`, `…_plain_ours_tok_s`,
//! `…_lookup_llamacpp_tok_s`, `…_plain_llamacpp_tok_s`), and each side's drafted ÷ plain.

use std::error::Error;
use std::process::Command;
use std::time::Instant;

use engine::spec::SpeculativeConfig;
use engine::{Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use serde_json::{Value, json};

mod support;

const ROUNDS: usize = 3;
const MAX_TOKENS: usize = 128;
const NGRAM: &str =
    r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}"#;
const PROMPTS: &str = include_str!("spec_data/prompts.json");

fn engine(gguf: &std::path::Path, spec: bool) -> Result<Engine, Box<dyn Error>> {
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(1024),
        log_interval: std::time::Duration::ZERO,
        // The same prompt runs every round: nothing may come from an earlier one.
        enable_prefix_caching: false,
        speculative_config: if spec { Some(SpeculativeConfig::from_json(NGRAM)?) } else { None },
        ..EngineConfig::default()
    };
    Ok(Engine::new(gguf, config)?)
}

type Res<T> = Result<T, Box<dyn Error>>;

/// One round over `prompts`, one at a time: output tokens per second and the answers.
fn round_of(engine: &mut Engine, prompts: &[Vec<u32>]) -> Res<(f64, Vec<Vec<u32>>)> {
    let params = SamplingParams::greedy(MAX_TOKENS);
    let (start, mut tokens, mut answers) = (Instant::now(), 0, Vec::new());
    for p in prompts {
        let out = engine.generate(vec![Prompt::Tokens(p.clone())], &params)?;
        let ids = out.into_iter().next().ok_or("no output")??.completions[0].token_ids.clone();
        tokens += ids.len();
        answers.push(ids);
    }
    Ok((tokens as f64 / start.elapsed().as_secs_f64(), answers))
}

fn main() -> Result<(), Box<dyn Error>> {
    let gguf = model::testing::default_model_fetched()?;
    let (mut plain, mut spec) = (engine(&gguf, false)?, engine(&gguf, true)?);
    let all: Value = serde_json::from_str(PROMPTS)?;
    let mut prompts = Vec::new();
    for (i, p) in all["grounded"].as_array().ok_or("no grounded prompts")?.iter().enumerate() {
        let text = p["prompt"].as_str().ok_or("a prompt without text")?;
        let id = format!("p{i}");
        let chat = plain.render_chat(&id, &[model::ChatMessage::new("user", text)])?;
        prompts.push(plain.tokenize(&id, Prompt::Text(chat))?);
    }
    let python = support::llamacpp::llamacpp_python()?;
    let threads = rayon::current_num_threads();
    let workload =
        json!({"prompts": prompts, "max_tokens": MAX_TOKENS, "k": 4, "max_ngram": 5, "reps": ROUNDS});
    let dir = support::figures_dir()?;
    let workload_path = dir.parent().unwrap_or(&dir).join("peer-lookup-workload.json");
    std::fs::write(&workload_path, workload.to_string())?;
    let script = support::root().join("engine/benches/peer_lookup_llamacpp.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&gguf)
        .arg(&workload_path)
        .arg(threads.to_string())
        .output()?;
    if !out.status.success() {
        return Err(format!("llama.cpp side failed:\n{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let theirs: Value = serde_json::from_slice(&out.stdout)?;

    round_of(&mut plain, &prompts)?; // warm-up
    let (mut ours_spec, mut ours_plain, mut same) = (Vec::new(), Vec::new(), true);
    for r in 0..ROUNDS {
        let ((a, plain_answers), (b, spec_answers)) = if r % 2 == 0 {
            let a = round_of(&mut plain, &prompts)?;
            (a, round_of(&mut spec, &prompts)?)
        } else {
            let b = round_of(&mut spec, &prompts)?;
            (round_of(&mut plain, &prompts)?, b)
        };
        same &= plain_answers == spec_answers;
        ours_plain.push(a);
        ours_spec.push(b);
    }
    let (o_spec, o_plain) = (support::stats(ours_spec).0, support::stats(ours_plain).0);
    let t = |k: &str| theirs[k].as_f64().unwrap_or(f64::NAN);
    let (t_lookup, t_plain) = (t("lookup_tok_s"), t("plain_tok_s"));
    let figures = json!({
        "peer.decode_b1_spec_over_llamacpp_lookup": o_spec / t_lookup,
        "peer.decode_b1_spec_ours_tok_s": o_spec,
        "peer.decode_b1_plain_ours_tok_s": o_plain,
        "peer.decode_b1_lookup_llamacpp_tok_s": t_lookup,
        "peer.decode_b1_plain_llamacpp_tok_s": t_plain,
        "peer.decode_b1_spec_over_plain_ours": o_spec / o_plain,
        "peer.decode_b1_lookup_over_plain_llamacpp": t_lookup / t_plain,
    });
    let mut md = format!(
        "\n### Speculative decoding against llama.cpp's prompt lookup (batch 1)\n\nSmolLM2-135M-Instruct \
         Q4_1, {threads} threads, the `spec` group's grounded prompts one at a time, greedy, ≤ {MAX_TOKENS} \
         tokens, medians of {ROUNDS} alternating rounds: ours with n-gram drafts (k = 4, n-grams 2–5) \
         against llama-cpp-python {} with `LlamaPromptLookupDecoding` (k = 4, n-grams ≤ 5). Our answers \
         with and without drafts identical: {same}; llama.cpp's: {}.\n\n",
        theirs["llama_cpp_python"].as_str().unwrap_or("?"),
        theirs["same_answers"],
    );
    support::figures_table(&mut md, &figures);
    std::fs::write(dir.join("peer_lookup.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    std::fs::write(dir.join("peer_lookup.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}
