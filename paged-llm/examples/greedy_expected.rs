//! The Python suite's oracle for greedy text: the prompts of `python/tests/greedy_prompts.json`
//! run through the Rust engine's `Engine::generate`, in process, written as JSON.
//! `cargo xtask test` runs it (the test build makes it): `greedy_expected MODEL PROMPTS OUT`.

use std::path::Path;

use anyhow::Context;
use engine::{ChatMessage, Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use serde::{Deserialize, Serialize};

fn main() -> anyhow::Result<()> {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let [model, prompts, out] = <[_; 3]>::try_from(args)
        .map_err(|_| anyhow::anyhow!("usage: greedy_expected MODEL PROMPTS.json OUT.json"))?;
    write_expected(&model, &prompts, &out)
}

/// `python/tests/greedy_prompts.json`: the engine's settings (the Python side passes the same
/// as engine arguments), prompts and the number of greedy tokens to generate.
#[derive(Debug, Deserialize)]
struct GreedyPrompts {
    engine: GreedyEngine,
    max_tokens: usize,
    prompts: Vec<GreedyPrompt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GreedyEngine {
    num_kv_blocks: usize,
    max_model_len: usize,
    enable_prefix_caching: bool,
}

/// Plain text, or a conversation rendered with the model's chat template.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum GreedyPrompt {
    Prompt(String),
    Messages(Vec<ChatMessage>),
}

/// One prompt's greedy output as the Rust engine produced it.
#[derive(Debug, Serialize)]
struct Expected {
    #[serde(flatten)]
    prompt: GreedyPrompt,
    text: String,
    token_ids: Vec<u32>,
    finish_reason: Option<&'static str>,
}

/// Runs each prompt of `prompts_file` greedily through `Engine::generate` on `model`, alone (a
/// greedy token can depend on what shares its batch, through the rounding of the quantized
/// matmuls), and writes `{"max_tokens": N, "cases": [{prompt or messages, text, token_ids,
/// finish_reason}]}`.
fn write_expected(model: &Path, prompts_file: &Path, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(prompts_file)
        .with_context(|| format!("reading {}", prompts_file.display()))?;
    let spec: GreedyPrompts =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", prompts_file.display()))?;
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(spec.engine.num_kv_blocks),
        max_model_len: Some(spec.engine.max_model_len),
        enable_prefix_caching: spec.engine.enable_prefix_caching,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model, config).with_context(|| format!("loading {}", model.display()))?;
    let params = SamplingParams::greedy(spec.max_tokens);
    let mut cases = Vec::with_capacity(spec.prompts.len());
    for prompt in spec.prompts {
        let input = match &prompt {
            GreedyPrompt::Prompt(text) => Prompt::Text(text.clone()),
            GreedyPrompt::Messages(messages) => Prompt::Chat(messages.clone()),
        };
        let result = engine.generate(vec![input], &params)?.pop().context("generate returned no result")?;
        let completion = result?.completions.swap_remove(0);
        cases.push(Expected {
            prompt,
            text: completion.text,
            token_ids: completion.token_ids,
            finish_reason: completion.finish_reason.as_ref().map(engine::FinishReason::as_str),
        });
    }
    let json = serde_json::json!({ "max_tokens": spec.max_tokens, "cases": cases });
    std::fs::write(out, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", out.display()))
}
