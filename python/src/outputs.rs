//! A request's outputs as the Python side receives them: JSON shaped like vLLM's
//! `RequestOutput` (`outputs[i].text`, `token_ids`, `cumulative_logprob`, `logprobs` as one
//! `{token id: (logprob, rank, decoded token)}` per position, `finish_reason`, `stop_reason`),
//! which `paged_llm.outputs` turns into dataclasses. `OutputKind` says whether a stream
//! reports what is new (`delta`), everything so far (`cumulative`, vLLM's default) or only the
//! end (`final_only`).

use std::sync::Arc;

use engine::{
    Completion, CompletionDelta, FinalOutput, FinishReason, PositionLogprobs, RequestOutput, RequestTiming,
};
use serde::Serialize;

/// vLLM's `RequestOutputKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Cumulative,
    Delta,
    FinalOnly,
}

impl OutputKind {
    pub fn parse(s: &str) -> pyo3::PyResult<Self> {
        match s {
            "cumulative" => Ok(Self::Cumulative),
            "delta" => Ok(Self::Delta),
            "final_only" => Ok(Self::FinalOnly),
            _ => Err(crate::errors::choice("output_kind", s, &["cumulative", "delta", "final_only"])),
        }
    }
}

/// One request's outputs folded together, and what it reports of each new one.
#[derive(Debug)]
pub struct Accumulator {
    kind: OutputKind,
    prompt: Option<String>,
    prompt_token_ids: Arc<[u32]>,
    total: FinalOutput,
    num_cached_tokens: usize,
    tokenizer: TokenText,
}

/// Decodes the tokens a logprobs entry names (the engine's tokenizer, shared).
#[derive(Debug, Clone)]
pub struct TokenText(pub engine::EngineHandle);

impl TokenText {
    fn text(&self, id: u32) -> String {
        self.0.tokenizer().decode(&[id], false).unwrap_or_default()
    }

    /// vLLM's per-position dict as `[token id, logprob, rank, decoded]` entries: the chosen
    /// token first (with its rank), then the most likely ones not already listed.
    fn position(&self, p: &PositionLogprobs) -> Vec<LogprobEntry> {
        let mut entries =
            vec![LogprobEntry(p.sampled.token, p.sampled.logprob, p.rank, self.text(p.sampled.token))];
        for (i, lp) in p.top.iter().enumerate().filter(|(_, lp)| lp.token != p.sampled.token) {
            entries.push(LogprobEntry(lp.token, lp.logprob, i + 1, self.text(lp.token)));
        }
        entries
    }
}

#[derive(Debug, Serialize)]
struct LogprobEntry(u32, f32, usize, String);

#[derive(Debug, Serialize)]
struct OutputJson<'a> {
    request_id: &'a str,
    prompt: Option<&'a str>,
    prompt_token_ids: &'a [u32],
    prompt_logprobs: Option<Vec<Option<Vec<LogprobEntry>>>>,
    outputs: Vec<CompletionJson<'a>>,
    finished: bool,
    num_cached_tokens: usize,
    metrics: TimingJson,
}

#[derive(Debug, Serialize)]
struct CompletionJson<'a> {
    index: usize,
    text: &'a str,
    token_ids: &'a [u32],
    cumulative_logprob: Option<f64>,
    logprobs: Option<Vec<Vec<LogprobEntry>>>,
    finish_reason: Option<&'static str>,
    /// vLLM's: the stop string or stop token id that ended the sample, `None` for EOS.
    stop_reason: Option<StopReason<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum StopReason<'a> {
    Token(u32),
    Text(&'a str),
}

/// Seconds.
#[derive(Debug, Serialize)]
struct TimingJson {
    time_to_first_token: Option<f64>,
    latency: Option<f64>,
    queue_time: Option<f64>,
}

impl From<&RequestTiming> for TimingJson {
    fn from(t: &RequestTiming) -> Self {
        let s = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
        Self {
            time_to_first_token: s(t.time_to_first_token),
            latency: s(t.latency),
            queue_time: s(t.queue_time),
        }
    }
}

impl Accumulator {
    pub fn new(
        kind: OutputKind,
        request_id: String,
        prompt: Option<String>,
        prompt_token_ids: Arc<[u32]>,
        tokenizer: TokenText,
    ) -> Self {
        let total = FinalOutput::new(request_id, prompt_token_ids.len());
        Self { kind, prompt, prompt_token_ids, total, num_cached_tokens: 0, tokenizer }
    }

    /// Folds `out` in; the JSON to hand to Python, if this kind reports this output.
    pub fn absorb(&mut self, out: &RequestOutput) -> Option<String> {
        self.total.absorb(out);
        self.num_cached_tokens = out.num_cached_tokens;
        // A delta reports the samples with news in this output, folded on their own.
        let fresh;
        let (folded, news): (&FinalOutput, Option<&[CompletionDelta]>) = match self.kind {
            OutputKind::FinalOnly if !out.finished => return None,
            OutputKind::Delta => {
                let mut only = FinalOutput::new(out.request_id.clone(), out.prompt_tokens);
                only.absorb(out);
                fresh = only;
                (&fresh, Some(out.outputs.as_slice()))
            }
            OutputKind::Cumulative | OutputKind::FinalOnly => (&self.total, None),
        };
        let reported = |index: &usize| news.is_none_or(|news| news.iter().any(|c| c.index == *index));
        let samples = folded.completions.iter().enumerate().filter(|(index, _)| reported(index));
        // The prompt's logprobs come once, with the first output; a delta reports them there.
        let prompt_logprobs = match self.kind {
            OutputKind::Delta => out.prompt_logprobs.as_ref(),
            OutputKind::Cumulative | OutputKind::FinalOnly => self.total.prompt_logprobs.as_ref(),
        };
        let json = OutputJson {
            request_id: &out.request_id,
            prompt: self.prompt.as_deref(),
            prompt_token_ids: &self.prompt_token_ids,
            prompt_logprobs: prompt_logprobs.map(|p| {
                p.positions.iter().map(|pos| pos.as_ref().map(|pos| self.tokenizer.position(pos))).collect()
            }),
            outputs: samples.map(|(index, c)| self.completion(index, c)).collect(),
            finished: out.finished,
            num_cached_tokens: self.num_cached_tokens,
            metrics: TimingJson::from(&out.timing),
        };
        // Plain data (strings, numbers, options): serializing it cannot fail.
        Some(serde_json::to_string(&json).unwrap_or_default())
    }

    fn completion<'a>(&self, index: usize, c: &'a Completion) -> CompletionJson<'a> {
        CompletionJson {
            index,
            text: &c.text,
            token_ids: &c.token_ids,
            cumulative_logprob: c.cumulative_logprob,
            logprobs: c.logprobs.as_ref().map(|lps| lps.iter().map(|p| self.tokenizer.position(p)).collect()),
            finish_reason: c.finish_reason.as_ref().map(FinishReason::as_str),
            stop_reason: match &c.finish_reason {
                Some(FinishReason::StopString(text)) => Some(StopReason::Text(text)),
                Some(FinishReason::StopToken(token)) => Some(StopReason::Token(*token)),
                _ => None,
            },
        }
    }
}
