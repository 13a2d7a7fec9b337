//! Admission, in two halves. `Intake::prepare` runs on the caller's thread and needs no engine
//! step: one request's checks, in the order a client's mistakes are most useful to hear about
//! (id, queue room, parameters, prompt, vocabulary, lengths, then whether it could ever fit the
//! KV cache alone), all with checked arithmetic on the client's sizes, and the tokenization.
//! `Engine::insert` then runs on the engine's thread: the scheduler entry and the per-request
//! state. Nothing is kept for a refused request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use model::ChatTemplate;
use parking_lot::Mutex;
use rand::RngCore;
use scheduler::{Request, RequestFit};

use super::Engine;
use crate::error::RequestError;
use crate::lora::{ActiveLora, LoraRegistry};
use crate::output::{RequestKey, Sink};
use crate::pooling::PoolState;
use crate::request::{Prompt, RequestOptions, RequestRecord};
use crate::sampling::{IntoValidParams, SamplingParams, SequenceSampler, seeded_rng};
use crate::structured::{ConstraintError, Grammars, Guide};

/// What admission needs to know, shared by the engine and every handle (`Send + Sync`): the
/// model's text side and limits, and the three pieces of state a submission touches before it
/// reaches the engine thread: the live id strings, the one key counter and the waiting count.
#[derive(Debug)]
pub(crate) struct Intake {
    pub model_name: String,
    pub tokenizer: model::Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub eos_ids: Vec<u32>,
    /// vLLM's sampling defaults under the model's generation config.
    pub default_params: SamplingParams,
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// The model's hidden size (an embedding's length).
    pub hidden_size: usize,
    /// Whether the device computes pooled rows (the CPU does).
    pub pools: bool,
    /// What one request may ask of the KV cache alone (the fits-alone check).
    pub fit: RequestFit,
    /// Most requests admitted but not yet scheduled for the first time.
    pub max_waiting: usize,
    /// The scheduling policy (whether a request's priority means anything).
    pub policy: scheduler::Policy,
    /// Client id → key of every unfinished request (the only place id strings are looked up).
    ids: Mutex<HashMap<String, RequestKey>>,
    /// The one source of `RequestKey`s (and of the handles' generated id strings).
    next_key: AtomicU64,
    /// Admitted requests not yet scheduled for the first time.
    waiting: AtomicUsize,
    /// The constraint compiler, built for the first constrained request.
    grammars: OnceLock<Result<Grammars, ConstraintError>>,
    /// The LoRA adapters requests may name.
    pub lora: LoraRegistry,
}

/// A request that passed every check, reserved its id and its place in the waiting queue, on
/// its way to `Engine::insert`.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub id: String,
    pub key: RequestKey,
    pub tokens: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub options: RequestOptions,
    /// The compiled constraint of a constrained request (its first sample's state).
    pub guide: Option<Guide>,
    /// When the client submitted it (TTFT and latency count from here).
    pub arrival: Instant,
    /// Its LoRA adapter, resolved (and read from its folder if it had to be) on the caller's thread.
    pub lora: Option<ActiveLora>,
}

/// Fields of [`Intake`] fixed at start-up.
#[derive(Debug)]
pub(crate) struct IntakeLimits {
    pub model_name: String,
    pub max_model_len: usize,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub pools: bool,
    pub fit: RequestFit,
    pub max_waiting: usize,
    pub policy: scheduler::Policy,
    pub lora: LoraRegistry,
}

impl Intake {
    pub fn new(folder: model::ModelFolder, limits: IntakeLimits) -> Self {
        let IntakeLimits {
            model_name,
            max_model_len,
            vocab_size,
            hidden_size,
            pools,
            fit,
            max_waiting,
            policy,
            lora,
        } = limits;
        Self {
            model_name,
            default_params: SamplingParams::with_generation_defaults(&folder.generation),
            eos_ids: folder.generation.eos_token_ids,
            tokenizer: folder.tokenizer,
            chat_template: folder.chat_template,
            max_model_len,
            vocab_size,
            hidden_size,
            pools,
            fit,
            max_waiting,
            policy,
            ids: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            grammars: OnceLock::new(),
            lora,
        }
    }

    /// The constraint compiler over this model's vocabulary (built once, on first use).
    pub fn grammars(&self) -> Result<&Grammars, ConstraintError> {
        self.grammars
            .get_or_init(|| Grammars::new(&self.tokenizer, self.vocab_size, &self.eos_ids))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The request's constraint compiled, and its logit bias checked against the vocabulary.
    fn guide(&self, id: &str, params: &SamplingParams) -> Result<Option<Guide>, RequestError> {
        if let Some(&token) = params.logit_bias.keys().find(|&&t| t as usize >= self.vocab_size) {
            return Err(RequestError::LogitBiasOutOfVocab {
                id: id.to_owned(),
                token,
                vocab_size: self.vocab_size,
            });
        }
        let Some(constraint) = &params.constraint else { return Ok(None) };
        let constraint_error = |source| RequestError::Constraint { id: id.to_owned(), source };
        let grammars = self.grammars().map_err(constraint_error)?;
        grammars.compile(constraint).map(Some).map_err(constraint_error)
    }

    /// Renders chat messages with the model's template (generation prompt added).
    pub fn render_chat(&self, id: &str, messages: &[model::ChatMessage]) -> Result<String, RequestError> {
        crate::prompt_tokens::render_chat(self.chat_template.as_ref(), id, messages)
    }

    /// Prompt to token ids (see [`crate::prompt_tokens::tokenize`]).
    pub fn tokenize(&self, id: &str, prompt: Prompt) -> Result<Vec<u32>, RequestError> {
        crate::prompt_tokens::tokenize(&self.tokenizer, self.chat_template.as_ref(), id, prompt)
    }

    /// Checks a request and reserves its id and a waiting place; on success the caller must
    /// hand the result to `Engine::insert` (or give it back with [`Intake::release`]).
    pub fn prepare(
        &self,
        id: String,
        prompt: Prompt,
        params: impl IntoValidParams,
        options: RequestOptions,
    ) -> Result<Prepared, RequestError> {
        if self.ids.lock().contains_key(&id) {
            return Err(RequestError::DuplicateId(id));
        }
        let mut params = params
            .into_valid()
            .map_err(|source| RequestError::InvalidParams { id: id.clone(), source })?
            .into_inner();
        if let Some(pooling) = &options.pooling {
            self.check_pooling(&id, pooling)?;
            // The prompt is prefilled; the one greedy token after it only closes the request.
            params = SamplingParams::greedy(1);
        }
        let tokens = self.tokenize(&id, prompt)?;
        let max_tokens = self.check_lengths(&id, &tokens, &params, options.pooling.is_some())?;
        let guide = self.guide(&id, &params)?;
        let lora = match &options.lora {
            Some(request) => Some(
                self.lora.resolve(request).map_err(|source| RequestError::Lora { id: id.clone(), source })?,
            ),
            None => None,
        };
        // The reservations come last, so a refused request holds neither.
        let key = self.issue_key();
        {
            let mut ids = self.ids.lock();
            if ids.contains_key(&id) {
                return Err(RequestError::DuplicateId(id));
            }
            let waiting = self.waiting.load(Ordering::Relaxed);
            if waiting >= self.max_waiting {
                return Err(RequestError::QueueFull { id, waiting });
            }
            self.waiting.fetch_add(1, Ordering::Relaxed);
            ids.insert(id.clone(), key);
        }
        Ok(Prepared { id, key, tokens, max_tokens, params, options, guide, arrival: Instant::now(), lora })
    }

    /// A pooling request's parameters against the model and the device.
    fn check_pooling(&self, id: &str, pooling: &crate::PoolingParams) -> Result<(), RequestError> {
        let refuse = |reason: String| RequestError::Pooling { id: id.to_owned(), reason };
        if !self.pools {
            return Err(refuse(
                "pooling (embeddings) runs on the CPU device; this engine runs on CUDA".into(),
            ));
        }
        pooling.check(self.hidden_size).map_err(refuse)
    }

    /// The prompt's tokens against the vocabulary, and prompt + output against the model's
    /// length and the whole KV cache; returns `max_tokens` (filled in when unset). A pooling
    /// request's closing token is never a position of the model: its prompt alone must fit.
    fn check_lengths(
        &self,
        id: &str,
        tokens: &[u32],
        params: &SamplingParams,
        pooling: bool,
    ) -> Result<usize, RequestError> {
        let id = id.to_owned();
        if tokens.is_empty() {
            return Err(RequestError::EmptyPrompt(id));
        }
        let vocab_size = self.vocab_size;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(RequestError::TokenOutOfVocab { id, token, vocab_size });
        }
        // Every size here comes from the client: checked arithmetic only.
        let prompt_len = tokens.len();
        let max_tokens = match params.max_tokens {
            Some(max_tokens) => max_tokens,
            // Unset: up to the model's max length, or as far as the KV cache could ever hold
            // this request alone, whichever is shorter.
            None => {
                let room = self.max_model_len.saturating_sub(prompt_len);
                room.min(self.fit.max_new_tokens(prompt_len, params.n)).max(1)
            }
        };
        let positions = if pooling { Some(prompt_len) } else { prompt_len.checked_add(max_tokens) };
        if positions.is_none_or(|total| total > self.max_model_len) {
            return Err(RequestError::TooLong {
                id,
                prompt_len,
                max_tokens,
                max_model_len: self.max_model_len,
            });
        }
        // A request that could not finish even alone on the device would be cut short later
        // ("capacity exceeded"), which a client cannot tell from reaching max_tokens: refuse it.
        // The one fits-alone check: the scheduler's own (its prompt part) cannot fail after it.
        self.fit.check(prompt_len, max_tokens, params.n).map_err(|e| RequestError::ExceedsKvCache {
            id,
            blocks_needed: e.blocks_needed,
            pool_blocks: e.pool_blocks,
        })?;
        Ok(max_tokens)
    }

    /// Gives back a prepared request's id and waiting place (it was refused after all, or the
    /// engine stopped before it arrived).
    pub fn release(&self, prepared: &Prepared) {
        self.forget(&prepared.id, prepared.key);
        self.leave_waiting();
    }

    /// Removes a finished or aborted request's id, if it still names that request.
    pub fn forget(&self, id: &str, key: RequestKey) {
        let mut ids = self.ids.lock();
        if ids.get(id) == Some(&key) {
            ids.remove(id);
        }
    }

    /// A request left the waiting queue (first scheduled, finished or aborted before).
    pub fn leave_waiting(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// The key of an unfinished request.
    pub fn key_of(&self, id: &str) -> Option<RequestKey> {
        self.ids.lock().get(id).copied()
    }

    /// Ids of the unfinished requests.
    pub fn unfinished_ids(&self) -> Vec<String> {
        self.ids.lock().keys().cloned().collect()
    }

    /// Admitted requests not yet scheduled.
    pub fn num_waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The next key (for ids the engine makes up itself).
    pub fn peek_next_key(&self) -> u64 {
        self.next_key.load(Ordering::Relaxed)
    }

    /// A key never issued before: an admission's, or the number in a handle's generated id
    /// (keys are unique, not dense).
    pub fn issue_key(&self) -> RequestKey {
        RequestKey(self.next_key.fetch_add(1, Ordering::Relaxed))
    }
}

impl Engine {
    /// The engine-thread half of admission: the scheduler entry, samplers and the request's
    /// record, holding `sink` (a handle's stream) when there is one. A refusal here (the
    /// scheduler's own checks) gives the reservations back and is also sent to `sink`.
    pub(crate) fn insert(&mut self, req: Prepared, sink: Option<Sink>) -> Result<RequestKey, RequestError> {
        if let Err(e) = self.enter_scheduler(&req) {
            self.intake.release(&req);
            self.metrics.record_rejected();
            if let Some(sink) = sink {
                sink.send(Err(e.clone().into()));
            }
            return Err(e);
        }
        let Prepared { id, key, tokens, max_tokens, params, arrival, guide, options, lora } = req;
        let req_pooling = options.pooling;
        let prompt_set = SequenceSampler::prompt_set(&params, &tokens);
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend_from_slice(&self.intake.eos_ids);
        }
        let stop_ids: Arc<[u32]> = stop_ids.into();
        let seed = params.seed.unwrap_or_else(|| self.seed_rng.next_u64());
        let samplers = (0..params.n)
            .map(|i| SequenceSampler::new(seeded_rng(seed, i), prompt_set.clone(), stop_ids.clone()))
            .collect();
        let pooling =
            req_pooling.map(|p| PoolState::new(p, tokens.len(), self.runner.model_config().hidden_size));
        let mut record =
            RequestRecord::new(id, key, Arc::new(params), &tokens, max_tokens, arrival, samplers, sink)
                .with_guide(guide);
        record.pooling = pooling;
        record.lora = lora.map(|l| l.hold);
        self.live.insert(record);
        Ok(key)
    }

    /// Takes the requests whose first chunk this step's plan holds out of the waiting queue
    /// (a request appears in a plan first with its first chunk, which starts past the prompt
    /// prefix the cache already held: a full hit leaves a one-token chunk that is no prefill).
    pub(super) fn mark_first_scheduled(&mut self, now: Instant) {
        for (s, &slot) in self.bufs.plan.seqs.iter().zip(&self.bufs.view.seq_slots) {
            if let Some(record) = self.live.at_mut(slot)
                && !record.scheduled
            {
                record.scheduled = true;
                record.first_scheduled = Some(now);
                if let Some(lora) = &mut record.lora {
                    lora.set_running();
                }
                record.num_cached_tokens = s.tokens.start;
                self.intake.leave_waiting();
            }
        }
    }

    /// The scheduler's entry; its own checks cannot refuse what `Intake::prepare` let through,
    /// so a refusal here is reported as it comes.
    fn enter_scheduler(&mut self, req: &Prepared) -> Result<(), RequestError> {
        let mut request = Request::new(req.key, req.tokens.clone(), req.max_tokens)
            .with_n(req.params.n)
            .with_priority(req.options.priority)
            // Positions served from the prefix cache have no logits to take logprobs from.
            .with_skip_prefix_hits(req.params.prompt_logprobs.is_some() || mean_pooled(&req.options));
        let lora = req.lora.as_ref().map(|l| l.id);
        if let Some(salt) = req.options.namespace(lora) {
            request = request.with_salt(salt);
        }
        if let Some(lora) = lora {
            request = request.with_lora(lora);
        }
        self.scheduler
            .add_request(request)
            .map_err(|e| RequestError::Rejected { id: req.id.clone(), reason: e.to_string() })
    }
}

/// A mean-pooled request computes every prompt position: one served from the prefix cache has
/// no hidden state to pool.
fn mean_pooled(options: &RequestOptions) -> bool {
    options.pooling.is_some_and(|p| p.pooling_type == crate::PoolingType::Mean)
}
