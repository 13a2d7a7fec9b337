//! What the engine hands back per step and per request: deltas of token ids and text
//! since the previous output, why a sequence finished, token counts and optional logprobs;
//! and where a handle's request sends them (`Sink`), or why its stream ended early. Plain data
//! that the sampler and the guides fill in, so this module depends on neither.

use std::time::Duration;

use serde::Serialize;

use crossbeam_channel::Sender;

use crate::error::RequestError;

/// Why a sequence stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum FinishReason {
    /// The model's end-of-sequence token.
    Eos(u32),
    /// One of the request's `stop_token_ids`.
    StopToken(u32),
    /// One of the request's stop strings (not included in the text by default).
    StopString(String),
    /// The request's constraint (grammar, schema, choices) was complete and could take no more.
    GrammarEnd,
    /// `max_tokens` or the model's max length was reached.
    Length,
    /// The client aborted the request (or dropped its stream).
    Abort,
}

impl FinishReason {
    /// vLLM / OpenAI spelling: `stop`, `length` or `abort`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Eos(_) | Self::StopToken(_) | Self::StopString(_) | Self::GrammarEnd => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// New output of one of a request's `n` samples since its previous output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionDelta {
    /// Which of the `n` samples (0-based).
    pub index: usize,
    /// Token ids generated since the previous output.
    pub token_ids: Vec<u32>,
    /// Text added since the previous output (never half a character, never part of a stop string).
    pub text: String,
    /// One entry per new token when the request asked for logprobs.
    pub logprobs: Option<Vec<PositionLogprobs>>,
    /// Sum of the sampled tokens' logprobs so far (with `logprobs` only).
    pub cumulative_logprob: Option<f64>,
    /// Tokens generated so far by this sample.
    pub num_generated: usize,
    /// Set on the output that finishes this sample.
    pub finish_reason: Option<FinishReason>,
}

/// A token's log-probability under the model's raw (unprocessed) distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Logprob {
    pub token: u32,
    pub logprob: f32,
}

/// Logprobs of one position: the sampled (or, for a prompt position, the prompt's) token and
/// the top-N alternatives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PositionLogprobs {
    pub sampled: Logprob,
    /// The sampled token's rank in the raw distribution: 1 + the number of tokens more likely.
    pub rank: usize,
    /// Most likely tokens first.
    pub top: Vec<Logprob>,
}

/// Timing of one request, for TTFT / TPOT statistics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct RequestTiming {
    /// Arrival to first generated token.
    pub time_to_first_token: Option<Duration>,
    /// Arrival to finish (set once finished).
    pub latency: Option<Duration>,
    /// Arrival to the request's first scheduled step (vLLM's queue time).
    pub queue_time: Option<Duration>,
    /// Since the request's previous output with tokens, on an output with tokens that is not
    /// its first (vLLM's inter-token latency).
    pub inter_token_latency: Option<Duration>,
}

/// The engine's own number for one admitted request, the scheduler's key of it: unique over
/// the engine's lifetime, so outputs reach the request that produced them even when a finished
/// or aborted request's id string is reused at once (an abort's final output comes a step later).
pub use scheduler::RequestKey;

/// `RequestKey` as its number (the scheduler crate carries no serde).
fn serialize_key<S: serde::Serializer>(key: &RequestKey, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(key.0)
}

/// The logprob of every prompt token given the tokens before it (vLLM's `prompt_logprobs`),
/// in the request's first output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptLogprobs {
    /// The prompt as the model saw it.
    pub token_ids: Vec<u32>,
    /// One entry per prompt token: `None` for the first (nothing comes before it), then the
    /// token's logprob and rank and the top alternatives at its position.
    pub positions: Vec<Option<PositionLogprobs>>,
}

/// One request's news from one engine step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestOutput {
    pub request_id: String,
    /// Which admission this output belongs to (see [`RequestKey`]).
    #[serde(serialize_with = "serialize_key")]
    pub request_key: RequestKey,
    /// Only the samples with news this step.
    pub outputs: Vec<CompletionDelta>,
    /// Set on the first output of a request with `SamplingParams::prompt_logprobs`.
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// True on the request's last output (all samples finished or aborted).
    pub finished: bool,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache when the request was first scheduled
    /// (OpenAI's `prompt_tokens_details.cached_tokens`).
    pub num_cached_tokens: usize,
    /// Tokens generated so far over all samples.
    pub completion_tokens: usize,
    /// A pooling request's embedding, on its last output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
    pub timing: RequestTiming,
}

impl RequestOutput {
    /// Concatenated new text of sample `index` in this output.
    pub fn text_of(&self, index: usize) -> &str {
        self.outputs.iter().find(|c| c.index == index).map_or("", |c| c.text.as_str())
    }
}

/// A request's final result, gathered from all its outputs (what `generate` returns).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalOutput {
    pub request_id: String,
    pub prompt_tokens: usize,
    /// One per sample, in index order.
    pub completions: Vec<Completion>,
    /// With `SamplingParams::prompt_logprobs`.
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// A pooling request's embedding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
    pub timing: RequestTiming,
}

/// One sample's full output.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Completion {
    pub token_ids: Vec<u32>,
    pub text: String,
    pub logprobs: Option<Vec<PositionLogprobs>>,
    /// Sum of the sampled tokens' logprobs (with `logprobs` only).
    pub cumulative_logprob: Option<f64>,
    pub finish_reason: Option<FinishReason>,
}

impl FinalOutput {
    pub fn new(request_id: String, prompt_tokens: usize) -> Self {
        Self {
            request_id,
            prompt_tokens,
            completions: Vec::new(),
            prompt_logprobs: None,
            embedding: None,
            timing: RequestTiming::default(),
        }
    }

    /// Folds one streamed output into the accumulated result.
    pub fn absorb(&mut self, out: &RequestOutput) {
        self.timing = out.timing;
        if out.prompt_logprobs.is_some() {
            self.prompt_logprobs.clone_from(&out.prompt_logprobs);
        }
        if out.embedding.is_some() {
            self.embedding.clone_from(&out.embedding);
        }
        for delta in &out.outputs {
            if self.completions.len() <= delta.index {
                self.completions.resize_with(delta.index + 1, Completion::default);
            }
            let c = &mut self.completions[delta.index];
            c.token_ids.extend_from_slice(&delta.token_ids);
            c.text.push_str(&delta.text);
            if let Some(lp) = &delta.logprobs {
                c.logprobs.get_or_insert_with(Vec::new).extend(lp.iter().cloned());
            }
            if delta.cumulative_logprob.is_some() {
                c.cumulative_logprob = delta.cumulative_logprob;
            }
            if delta.finish_reason.is_some() {
                c.finish_reason.clone_from(&delta.finish_reason);
            }
        }
    }

    pub fn completion_tokens(&self) -> usize {
        self.completions.iter().map(|c| c.token_ids.len()).sum()
    }
}

/// Why a stream ended without its final output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StreamError {
    #[error("engine step failed: {0}")]
    EngineFailed(String),
    #[error("the engine stopped before the request finished")]
    EngineStopped,
    /// The engine thread's half of admission refused the request (its first and last item).
    #[error(transparent)]
    Rejected(#[from] RequestError),
}

pub(crate) type StreamItem = Result<RequestOutput, StreamError>;

/// Where the engine sends one request's outputs when a handle submitted it: a blocking or an
/// async receiver. Kept in the request's record, so an output goes straight to its stream.
#[derive(Debug)]
pub(crate) enum Sink {
    Blocking(Sender<StreamItem>),
    Async(tokio::sync::mpsc::UnboundedSender<StreamItem>),
}

impl Sink {
    /// False once the receiver is gone.
    pub(crate) fn send(&self, item: StreamItem) -> bool {
        match self {
            Self::Blocking(tx) => tx.send(item).is_ok(),
            Self::Async(tx) => tx.send(item).is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(index: usize, ids: &[u32], text: &str, fin: Option<FinishReason>) -> CompletionDelta {
        CompletionDelta {
            index,
            token_ids: ids.to_vec(),
            text: text.into(),
            logprobs: None,
            cumulative_logprob: None,
            num_generated: ids.len(),
            finish_reason: fin,
        }
    }

    #[test]
    fn final_output_concatenates_deltas_per_sample() {
        let mut fin = FinalOutput::new("r".into(), 3);
        let mk = |outputs, finished| RequestOutput {
            request_id: "r".into(),
            request_key: RequestKey(0),
            prompt_logprobs: None,
            outputs,
            finished,
            prompt_tokens: 3,
            num_cached_tokens: 0,
            completion_tokens: 0,
            embedding: None,
            timing: RequestTiming::default(),
        };
        fin.absorb(&mk(vec![delta(1, &[5], "b", None), delta(0, &[1], "a", None)], false));
        fin.absorb(&mk(vec![delta(0, &[2, 3], "cd", Some(FinishReason::Length))], false));
        fin.absorb(&mk(vec![delta(1, &[6], "e", Some(FinishReason::StopString("x".into())))], true));
        assert_eq!(fin.completions[0].text, "acd");
        assert_eq!(fin.completions[0].token_ids, vec![1, 2, 3]);
        assert_eq!(fin.completions[1].text, "be");
        assert_eq!(fin.completions[1].finish_reason.as_ref().map(FinishReason::as_str), Some("stop"));
        assert_eq!(fin.completion_tokens(), 5);
    }

    #[test]
    fn finish_reason_strings() {
        assert_eq!(FinishReason::Eos(2).as_str(), "stop");
        assert_eq!(FinishReason::StopToken(7).as_str(), "stop");
        assert_eq!(FinishReason::Length.as_str(), "length");
        assert_eq!(FinishReason::GrammarEnd.as_str(), "stop");
        assert_eq!(FinishReason::Abort.as_str(), "abort");
    }
}
