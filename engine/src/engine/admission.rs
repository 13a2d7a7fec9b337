//! Admission: one request's checks, in the order a client's mistakes are most useful to hear
//! about (id, parameters, prompt, vocabulary, lengths, then whether it could ever fit the KV
//! cache alone), all with checked arithmetic on the client's sizes; then its scheduler entry
//! and per-request state. Nothing is stored for a refused request.

use std::sync::Arc;

use rand::RngCore;
use scheduler::{Request, SchedulerError};

use super::Engine;
use crate::error::RequestError;
use crate::output::RequestKey;
use crate::request::{Prompt, RequestOptions, RequestState};
use crate::sampling::{SamplingParams, SequenceSampler, seeded_rng};

impl Engine {
    pub(super) fn admit(
        &mut self,
        id: String,
        prompt: Prompt,
        params: SamplingParams,
        options: &RequestOptions,
    ) -> Result<RequestKey, RequestError> {
        if self.live.ids.contains_key(&id) {
            return Err(RequestError::DuplicateId(id));
        }
        params.validate().map_err(|source| RequestError::InvalidParams { id: id.clone(), source })?;
        let tokens = self.tokenize(&id, prompt)?;
        if tokens.is_empty() {
            return Err(RequestError::EmptyPrompt(id));
        }
        let vocab_size = self.runner.model_config().vocab_size;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(RequestError::TokenOutOfVocab { id, token, vocab_size });
        }
        // Every size here comes from the client: checked arithmetic only.
        let prompt_len = tokens.len();
        let pool = self.scheduler.device_pool();
        let (block_size, pool_blocks) = (pool.block_size(), pool.num_blocks());
        let max_tokens = match params.max_tokens {
            Some(max_tokens) => max_tokens,
            // Unset: up to the model's max length, or as far as the KV cache could ever hold
            // this request alone, whichever is shorter.
            None => {
                let room = self.info.max_model_len.saturating_sub(prompt_len);
                room.min(scheduler::max_new_tokens_within(block_size, prompt_len, params.n, pool_blocks))
                    .max(1)
            }
        };
        if prompt_len.checked_add(max_tokens).is_none_or(|total| total > self.info.max_model_len) {
            return Err(RequestError::TooLong {
                id,
                prompt_len,
                max_tokens,
                max_model_len: self.info.max_model_len,
            });
        }
        // A request that could not finish even alone on the device would be cut short later
        // ("capacity exceeded"), which a client cannot tell from reaching max_tokens: refuse it.
        match scheduler::blocks_for_request(block_size, prompt_len, max_tokens, params.n) {
            Some(blocks_needed) if blocks_needed <= pool_blocks => {}
            need => {
                let blocks_needed = need.unwrap_or(usize::MAX);
                return Err(RequestError::ExceedsKvCache { id, blocks_needed, pool_blocks });
            }
        }
        let sid = self.live.next_id;
        let mut request =
            Request::new(sid, tokens.clone(), max_tokens).with_n(params.n).with_priority(options.priority);
        if let Some(salt) = options.salt_hash() {
            request = request.with_salt(salt);
        }
        self.scheduler.add_request(request).map_err(|e| match e {
            SchedulerError::EmptyPrompt(_) => RequestError::EmptyPrompt(id.clone()),
            SchedulerError::ExceedsPool { blocks_needed, pool_blocks, .. } => {
                RequestError::ExceedsKvCache { id: id.clone(), blocks_needed, pool_blocks }
            }
            other => RequestError::Rejected { id: id.clone(), reason: other.to_string() },
        })?;
        self.live.next_id += 1;
        let prompt_set = SequenceSampler::prompt_set(&params, &tokens);
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend_from_slice(&self.info.eos_ids);
        }
        let stop_ids: Arc<[u32]> = stop_ids.into();
        let seed = params.seed.unwrap_or_else(|| self.seed_rng.next_u64());
        let samplers = (0..params.n)
            .map(|i| SequenceSampler::new(seeded_rng(seed, i), prompt_set.clone(), stop_ids.clone()))
            .collect();
        let key = RequestKey(sid);
        self.live.states.insert(sid, RequestState::new(id.clone(), key, Arc::new(params), &tokens, samplers));
        self.live.ids.insert(id, sid);
        Ok(key)
    }
}
