//! What a client submits (`Prompt` + `SamplingParams` + `RequestOptions`) and the engine's one
//! record of each admitted request (`RequestRecord`): its client id, its state, one `SeqState`
//! per parallel sample with its sampler, detokenizer and unsent deltas, and where its outputs
//! go (`Sink`, for requests a handle submitted).

use std::sync::Arc;
use std::time::Instant;

use model::{ChatMessage, Conversation};

use crate::detok::{IncrementalDetokenizer, TokenDecoder};
use crate::output::{
    CompletionDelta, FinishReason, PositionLogprobs, PromptLogprobs, RequestKey, RequestOutput,
    RequestTiming, Sink,
};
use crate::sampling::{SamplingParams, SequenceSampler};
use crate::spec::DraftGate;
use crate::structured::Guide;

/// A prompt: plain text, token ids, or chat messages rendered with the model's template (with
/// tools, documents or extra template variables: a whole `Conversation`).
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Chat(Vec<ChatMessage>),
    Conversation(Conversation),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

/// `From` each variant's payload.
macro_rules! prompt_from {
    ($($payload:ty => $variant:ident),* $(,)?) => {$(
        impl From<$payload> for Prompt {
            fn from(payload: $payload) -> Self {
                Self::$variant(payload)
            }
        }
    )*};
}

prompt_from!(String => Text, Vec<u32> => Tokens, Vec<ChatMessage> => Chat, Conversation => Conversation);

/// Scheduling options of one request, beside its sampling parameters (vLLM's `priority`
/// argument and the prompt's `cache_salt`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// Under `Policy::Priority`, lower runs first (ties by arrival) and a waiting request may
    /// preempt running ones of a higher number; ignored under FCFS.
    pub priority: i64,
    /// Isolates this request's prefix-cache entries: blocks are only shared between requests
    /// that bring the same salt (so one tenant cannot probe another's cached prompts).
    pub cache_salt: Option<String>,
    /// A pooling request: the prompt's hidden states pooled into an embedding
    /// (`RequestOutput::embedding`) instead of generated tokens; its sampling parameters are
    /// ignored.
    pub pooling: Option<crate::PoolingParams>,
    /// The LoRA adapter it runs under (`None`: the base model). Its KV blocks are shared only
    /// with requests of the same adapter.
    pub lora: Option<crate::LoraRequest>,
}

impl RequestOptions {
    pub fn with_priority(mut self, priority: i64) -> Self {
        self.priority = priority;
        self
    }

    pub fn with_pooling(mut self, pooling: crate::PoolingParams) -> Self {
        self.pooling = Some(pooling);
        self
    }

    pub fn with_lora(mut self, lora: crate::LoraRequest) -> Self {
        self.lora = Some(lora);
        self
    }

    pub fn with_cache_salt(mut self, salt: impl Into<String>) -> Self {
        self.cache_salt = Some(salt.into());
        self
    }

    /// The scheduler's numeric salt: `None` without one; a salt string maps to a stable 64-bit
    /// hash that is never 0 (0 is the unsalted namespace).
    pub(crate) fn salt_hash(&self) -> Option<u64> {
        use sha2::{Digest, Sha256};
        let salt = self.cache_salt.as_ref()?;
        let digest = Sha256::digest(salt.as_bytes());
        let mut word = [0u8; 8];
        word.copy_from_slice(&digest[..8]);
        Some(u64::from_le_bytes(word).max(1))
    }

    /// The prefix-cache namespace of a request: its salt's, or, under a LoRA adapter (id
    /// `lora`), one of that adapter's own (vLLM keys block hashes on the adapter id), never 0.
    pub(crate) fn namespace(&self, lora: Option<u32>) -> Option<u64> {
        let salt = self.salt_hash();
        let Some(lora) = lora else { return salt };
        let mixed =
            (salt.unwrap_or(0) ^ 0x4c6f_5241_0000_0000 ^ u64::from(lora)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Some(mixed.max(1))
    }
}

/// One sample of a request.
#[derive(Debug)]
pub(crate) struct SeqState {
    /// Its RNG and penalty counts; it counts the sample's generated tokens.
    pub sampler: SequenceSampler,
    /// The constraint's state for this sample (a constrained request only).
    pub guide: Option<Guide>,
    /// Whether its drafts pay (speculative decoding).
    pub gate: DraftGate,
    /// Its own suffix trie (suffix decoding only).
    pub suffix: Option<crate::spec::suffix::LocalSuffix>,
    pub detok: IncrementalDetokenizer,
    pub new_tokens: Vec<u32>,
    pub new_logprobs: Vec<PositionLogprobs>,
    pub cumulative_logprob: f64,
    pub finish: Option<FinishReason>,
    /// The finish has been reported in an output.
    pub finish_sent: bool,
}

impl SeqState {
    /// Tokens generated so far (the sampler's one count).
    pub fn num_generated(&self) -> usize {
        self.sampler.num_generated()
    }

    fn has_news(&self) -> bool {
        !self.new_tokens.is_empty() || (self.finish.is_some() && !self.finish_sent)
    }
}

/// The prompt logprobs of a request that asked for them, filled chunk by chunk as its prompt
/// positions are computed and sent once, with its first output after the last one.
#[derive(Debug)]
pub(crate) struct PromptLogprobsState {
    /// Top alternatives per position.
    pub top: usize,
    pub prompt: Arc<[u32]>,
    /// Position `i`'s entry (`None` for position 0), until they are sent.
    pub positions: Vec<Option<PositionLogprobs>>,
    /// The next prompt position without an entry: a recomputed position (preemption by
    /// recompute, or a later sample's prompt) is never added twice.
    next: usize,
    pub sent: bool,
}

impl PromptLogprobsState {
    pub fn next(&self) -> usize {
        self.next
    }

    /// Enters the entries of the next positions.
    pub fn extend(&mut self, entries: Vec<Option<PositionLogprobs>>) {
        self.next += entries.len();
        self.positions.extend(entries);
    }

    fn complete(&self) -> bool {
        self.next >= self.prompt.len()
    }
}

/// An admitted request: the engine's only record of it, keyed by its `RequestKey`.
#[derive(Debug)]
pub(crate) struct RequestRecord {
    /// The client's id string (what `abort` by id and the outputs name).
    pub id: String,
    pub key: RequestKey,
    /// A handle's stream: its outputs are sent there; `None` returns them from `Engine::step`.
    pub sink: Option<Sink>,
    pub params: Arc<SamplingParams>,
    pub prompt_len: usize,
    /// Tokens a sample may generate: `max_tokens`, filled in when unset (within the model length).
    pub max_tokens: usize,
    pub arrival: Instant,
    /// Scheduled at least once (it no longer counts against `max_waiting`).
    pub scheduled: bool,
    /// When it was first scheduled (the end of its queue time).
    pub first_scheduled: Option<Instant>,
    /// Prompt tokens the prefix cache held when it was first scheduled.
    pub num_cached_tokens: usize,
    pub first_token: Option<Instant>,
    /// When its last output with tokens was taken.
    pub last_token_output: Option<Instant>,
    pub seqs: Vec<SeqState>,
    /// With `SamplingParams::prompt_logprobs` only.
    pub prompt_logprobs: Option<PromptLogprobsState>,
    /// A pooling request's pool.
    pub pooling: Option<crate::pooling::PoolState>,
    /// The LoRA adapter its rows run under (held until the record goes).
    pub lora: Option<crate::lora::LoraHold>,
}

impl RequestRecord {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        key: RequestKey,
        params: Arc<SamplingParams>,
        prompt: &[u32],
        max_tokens: usize,
        arrival: Instant,
        samplers: Vec<SequenceSampler>,
        sink: Option<Sink>,
    ) -> Self {
        let seqs = samplers
            .into_iter()
            .map(|s| SeqState {
                sampler: s,
                guide: None,
                gate: DraftGate::default(),
                suffix: None,
                detok: IncrementalDetokenizer::new(
                    prompt,
                    params.skip_special_tokens,
                    params.stop.clone(),
                    params.include_stop_str_in_output,
                ),
                new_tokens: Vec::new(),
                new_logprobs: Vec::new(),
                cumulative_logprob: 0.0,
                finish: None,
                finish_sent: false,
            })
            .collect();
        let prompt_logprobs = params.prompt_logprobs.map(|top| PromptLogprobsState {
            top,
            prompt: prompt.into(),
            positions: vec![None],
            next: 1,
            sent: false,
        });
        Self {
            id,
            key,
            sink,
            params,
            prompt_logprobs,
            prompt_len: prompt.len(),
            max_tokens,
            arrival,
            scheduled: false,
            first_scheduled: None,
            num_cached_tokens: 0,
            first_token: None,
            last_token_output: None,
            seqs,
            pooling: None,
            lora: None,
        }
    }

    /// Gives every sample the compiled constraint's state: the last takes it, the others a fork.
    pub fn with_guide(mut self, guide: Option<Guide>) -> Self {
        let mut guide = guide;
        let n = self.seqs.len();
        for (i, seq) in self.seqs.iter_mut().enumerate() {
            seq.guide = if i + 1 == n { guide.take() } else { guide.as_ref().map(Guide::fork) };
        }
        self
    }

    pub fn all_finished(&self) -> bool {
        self.seqs.iter().all(|s| s.finish.is_some())
    }

    pub fn completion_tokens(&self) -> usize {
        self.seqs.iter().map(SeqState::num_generated).sum()
    }

    /// Marks every unfinished sample finished with `reason`.
    pub fn finish_all(&mut self, reason: &FinishReason) {
        for s in &mut self.seqs {
            if s.finish.is_none() {
                s.finish = Some(reason.clone());
            }
        }
    }

    pub fn timing(&self, now: Instant) -> RequestTiming {
        RequestTiming {
            time_to_first_token: self.first_token.map(|t| t.duration_since(self.arrival)),
            latency: self.all_finished().then(|| now.duration_since(self.arrival)),
            queue_time: self.first_scheduled.map(|t| t.duration_since(self.arrival)),
            inter_token_latency: None,
        }
    }

    /// Hands `output` to the request's stream, or to `outputs` (returned by `Engine::step`) for
    /// a request without one. False when its stream's receiver is gone.
    pub fn deliver(&self, output: RequestOutput, outputs: &mut Vec<RequestOutput>) -> bool {
        match &self.sink {
            Some(sink) => sink.send(Ok(output)),
            None => {
                outputs.push(output);
                true
            }
        }
    }

    /// The prompt logprobs, once: when every prompt position has its entry.
    fn take_prompt_logprobs(&mut self) -> Option<PromptLogprobs> {
        let state = self.prompt_logprobs.as_mut().filter(|s| !s.sent && s.complete())?;
        state.sent = true;
        Some(PromptLogprobs {
            token_ids: state.prompt.to_vec(),
            positions: std::mem::take(&mut state.positions),
        })
    }

    /// Drains the unsent deltas into an output; `None` when there is nothing new. A sample
    /// that finished other than by a stop string flushes its held-back partial character.
    pub fn take_output(&mut self, now: Instant, decoder: &impl TokenDecoder) -> Option<RequestOutput> {
        if !self.seqs.iter().any(SeqState::has_news) {
            return None;
        }
        let mut timing = self.timing(now);
        if self.seqs.iter().any(|s| !s.new_tokens.is_empty()) {
            timing.inter_token_latency = self.last_token_output.map(|t| now.duration_since(t));
            self.last_token_output = Some(now);
        }
        let want_logprobs = self.params.logprobs.is_some();
        let pooling = self.pooling.is_some();
        let mut outputs = Vec::new();
        for (index, s) in self.seqs.iter_mut().enumerate() {
            if !s.has_news() {
                continue;
            }
            let finished = s.finish.is_some();
            if finished && !matches!(s.finish, Some(FinishReason::StopString(_))) {
                // Best effort: a decoder error leaves the partial character out.
                let _ = s.detok.flush(decoder);
            }
            s.finish_sent |= finished;
            if pooling {
                // The one token drawn after the prompt only closes the request.
                s.new_tokens.clear();
                s.detok.take_delta(finished);
            }
            outputs.push(CompletionDelta {
                index,
                token_ids: std::mem::take(&mut s.new_tokens),
                text: s.detok.take_delta(finished),
                logprobs: want_logprobs.then(|| std::mem::take(&mut s.new_logprobs)),
                cumulative_logprob: want_logprobs.then_some(s.cumulative_logprob),
                num_generated: s.num_generated(),
                finish_reason: s.finish.clone(),
            });
        }
        Some(RequestOutput {
            request_id: self.id.clone(),
            request_key: self.key,
            prompt_logprobs: self.take_prompt_logprobs(),
            outputs,
            finished: self.all_finished(),
            prompt_tokens: self.prompt_len,
            num_cached_tokens: self.num_cached_tokens,
            completion_tokens: if pooling { 0 } else { self.completion_tokens() },
            embedding: self
                .pooling
                .as_ref()
                .filter(|p| p.complete() && self.seqs.iter().all(|s| s.finish.is_some()))
                .map(crate::pooling::PoolState::embedding),
            timing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::RequestOptions;

    #[test]
    fn salt_hash_is_stable_distinct_and_never_the_unsalted_namespace() {
        let none = RequestOptions::default();
        assert_eq!(none.salt_hash(), None);
        let a = RequestOptions::default().with_cache_salt("tenant-a");
        let b = RequestOptions::default().with_cache_salt("tenant-b");
        assert_eq!(a.salt_hash(), a.clone().salt_hash());
        assert_ne!(a.salt_hash(), b.salt_hash());
        assert!(a.salt_hash().is_some_and(|h| h != 0));
        assert!(RequestOptions::default().with_cache_salt("").salt_hash().is_some_and(|h| h != 0));
    }
}
