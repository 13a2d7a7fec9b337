//! `paged-llm run` (and `cargo xtask run`, the README's main command). Fetches the default model if missing,
//! starts the engine on its own thread, sends a batch of varied prompts (chat and plain,
//! short and long, greedy and sampled), streams their text to the terminal as it arrives,
//! and ends with a summary (requests, tokens, throughput, TTFT, KV usage, preemptions,
//! prefix-cache hits).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use engine::{ChatMessage, EngineHandle, FinishReason, Prompt, SamplingParams, ShutdownMode};
use server::cli::EngineKnobs;

use crate::start::{StartEngine, read_jsonl};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// JSONL prompts: `{"prompt": "..."}` or `{"messages": [{"role": .., "content": ..}]}`,
    /// optionally with `"params": {SamplingParams fields}`. Default: a built-in varied batch.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub knobs: EngineKnobs,
}

/// One line of a prompts file.
#[derive(Debug, serde::Deserialize)]
struct PromptLine {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    /// Sampling fields; those left out come from `defaults` (the model's generation config).
    params: Option<serde_json::Value>,
}

/// Prompts of a JSONL file; a line's `params` are laid over `defaults` (the model's sampling
/// defaults), with `max_tokens` 128 where the line does not set it.
fn load_prompts(path: &Path, defaults: &SamplingParams) -> anyhow::Result<Vec<(Prompt, SamplingParams)>> {
    let defaults = SamplingParams { max_tokens: Some(128), ..defaults.clone() };
    read_jsonl(path, "not a prompt object", |at, p: PromptLine| {
        let prompt = match (p.prompt, p.messages) {
            (Some(text), None) => Prompt::Text(text),
            (None, Some(messages)) => Prompt::Chat(messages),
            _ => bail!("{at}: give exactly one of \"prompt\" and \"messages\""),
        };
        let params = match p.params {
            Some(fields) => SamplingParams::from_json_over(&defaults, &fields)
                .with_context(|| format!("{at}: bad \"params\""))?,
            None => defaults.clone(),
        };
        Ok((prompt, params))
    })
}

/// The built-in batch: chat and plain prompts of different lengths and sampling settings.
fn builtin_prompts() -> Vec<(Prompt, SamplingParams)> {
    let chat = |system: Option<&str>, user: &str| {
        let system = system.map(|s| ChatMessage::new("system", s));
        Prompt::Chat(system.into_iter().chain([ChatMessage::new("user", user)]).collect())
    };
    let greedy = SamplingParams::greedy;
    let sampled = |t, p, n| SamplingParams {
        temperature: t,
        top_p: p,
        max_tokens: Some(n),
        seed: Some(7),
        ..Default::default()
    };
    let long_context = "Paged attention splits the key-value cache of every sequence into fixed-size blocks \
        that need not be contiguous in memory, the way an operating system pages virtual memory. A block table \
        maps each sequence's logical blocks to physical ones, so memory is allocated on demand, fragmentation \
        stays within the last block, and sequences that share a prefix can share its blocks. ";
    vec![
        (chat(None, "What is the capital of France?"), greedy(48)),
        (
            chat(Some("You are a concise assistant."), "Explain what a KV cache is in two sentences."),
            greedy(96),
        ),
        (chat(None, "Write a haiku about the sea."), sampled(0.7, 0.9, 64)),
        (
            chat(None, "List three uses of the Rust programming language."),
            SamplingParams { top_k: 40, ..sampled(0.8, 1.0, 128) },
        ),
        (
            chat(None, &format!("{}\n\nSummarize the text above in one sentence.", long_context.repeat(3))),
            greedy(80),
        ),
        (Prompt::Text("The history of the Roman Empire".into()), sampled(1.0, 0.95, 120)),
        (
            Prompt::Text("def fibonacci(n):".into()),
            SamplingParams { stop: vec!["\n\n".into()], ..greedy(100) },
        ),
        (
            Prompt::Text("Once upon a time, in a small village,".into()),
            SamplingParams { n: 2, ..sampled(0.9, 0.95, 60) },
        ),
        (
            chat(None, "Count from one to ten in words."),
            SamplingParams { repetition_penalty: 1.1, ..greedy(60) },
        ),
        (
            chat(None, "Give me a short motivational quote."),
            SamplingParams { min_p: 0.1, ..sampled(1.2, 1.0, 48) },
        ),
        (
            Prompt::Text("Q: What is 12 times 12?\nA:".into()),
            SamplingParams { stop: vec!["\n".into()], ..greedy(32) },
        ),
        (
            chat(Some("You are a poet."), "Describe autumn."),
            SamplingParams { presence_penalty: 0.5, ..sampled(0.8, 0.9, 100) },
        ),
    ]
}

/// A conversation as a completion prompt: its messages' texts, one paragraph each.
fn as_plain_text((prompt, params): (Prompt, SamplingParams)) -> (Prompt, SamplingParams) {
    match prompt {
        Prompt::Chat(messages) => {
            let texts: Vec<&str> = messages.iter().filter_map(|m| m.content.as_deref()).collect();
            (Prompt::Text(texts.join("\n\n") + "\n\n"), params)
        }
        other => (other, params),
    }
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let engine = args.knobs.start_engine(false)?;
    let handle = EngineHandle::spawn(engine)?;
    let prompts = match &args.prompts {
        Some(path) => load_prompts(path, handle.default_sampling_params())?,
        // A base model (no chat template) gets the built-in conversations as plain text.
        None if handle.chat_template().is_none() => {
            builtin_prompts().into_iter().map(as_plain_text).collect()
        }
        None => builtin_prompts(),
    };
    let started = Instant::now();
    let mut clients = Vec::new();
    let batch = prompts
        .into_iter()
        .enumerate()
        .map(|(i, (prompt, params))| (format!("{i}"), prompt, params))
        .collect();
    for (i, admitted) in handle.add_requests(batch).into_iter().enumerate() {
        match admitted {
            Ok(stream) => clients.push(std::thread::spawn(move || print_stream(i, stream))),
            Err(e) => eprintln!("run: request {i} rejected: {e}"),
        }
    }
    let failures = clients.into_iter().map(|c| c.join()).filter(|r| !matches!(r, Ok(Ok(())))).count();
    let wall = started.elapsed().as_secs_f64();
    let m = handle.metrics()?;
    handle.shutdown(ShutdownMode::Drain);
    println!();
    println!("── summary ─────────────────────────────────────────────");
    println!(
        "requests           {} finished, {} rejected, {failures} failed",
        m.requests_finished, m.requests_rejected
    );
    println!("tokens             {} prompt, {} generated", m.prompt_tokens, m.generation_tokens);
    println!("wall time          {wall:.2} s");
    println!(
        "throughput         {:.1} generated tok/s, {:.1} total tok/s",
        m.generation_tokens as f64 / wall,
        (m.prompt_tokens + m.generation_tokens) as f64 / wall
    );
    println!("TTFT               p50 {:.0} ms, p90 {:.0} ms", m.ttft.p50_ms, m.ttft.p90_ms);
    println!("TPOT               p50 {:.1} ms, p90 {:.1} ms", m.tpot.p50_ms, m.tpot.p90_ms);
    println!("peak KV usage      {:.1} %", m.peak_kv_usage * 100.0);
    println!("preemptions        {}", m.gauges.num_preemptions);
    println!(
        "prefix cache       {:.1} % of prompt tokens hit ({} of {})",
        m.prefix_cache_hit_rate * 100.0,
        m.gauges.prefix_hits,
        m.gauges.prefix_queries
    );
    if let Some(kib) = peak_rss_kib() {
        println!(
            "peak RSS           {:.0} MiB (the weights once: in huge pages, or mapped from the file and counted once read)",
            kib as f64 / 1024.0
        );
    }
    if failures > 0 {
        bail!("{failures} request(s) failed");
    }
    Ok(())
}

/// This process's peak resident set (Linux `VmHWM`), in KiB; `None` where it is not reported.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Prints a request's text line by line as it streams in, then its finish reason (each line in
/// one write under stdout's lock, so the clients' lines do not interleave).
fn print_stream(i: usize, stream: engine::RequestStream) -> anyhow::Result<()> {
    let mut pending: HashMap<usize, String> = HashMap::new();
    for item in stream {
        let o = item?;
        for c in &o.outputs {
            let buf = pending.entry(c.index).or_default();
            buf.push_str(&c.text);
            let tag =
                if o.outputs.len() > 1 || c.index > 0 { format!("{i}.{}", c.index) } else { format!("{i}") };
            while let Some(nl) = buf.find('\n') {
                let line: String = buf.drain(..=nl).collect();
                let _ = writeln!(std::io::stdout().lock(), "[{tag}] {}", line.trim_end_matches('\n'));
            }
            if let Some(reason) = &c.finish_reason {
                let why = match reason {
                    FinishReason::StopString(s) => format!("stop string {s:?}"),
                    FinishReason::StopToken(t) => format!("stop token {t}"),
                    FinishReason::Eos(_) => "eos".into(),
                    FinishReason::Length => "length".into(),
                    FinishReason::Abort => "abort".into(),
                    FinishReason::GrammarEnd => "grammar end".into(),
                };
                let ttft = o.timing.time_to_first_token.map_or(0.0, |d| d.as_secs_f64() * 1e3);
                let _ = writeln!(
                    std::io::stdout().lock(),
                    "[{tag}] {}⏎ ({} tokens, {why}, TTFT {ttft:.0} ms)",
                    std::mem::take(buf),
                    c.num_generated
                );
            }
        }
    }
    Ok(())
}
