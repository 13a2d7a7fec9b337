//! The draft model of speculative decoding (`{"method": "draft_model"}`): a second model that
//! shares the target's tokenizer proposes each drafting sequence's next tokens greedily, after
//! the target's step and in the same engine step, batched over the sequences.
//!
//! Its KV cache is its own (blocks from a free list, a block-table row per sequence), so the
//! target's prefix sharing, swaps and copies never touch it. A sequence's state counts the
//! tokens whose keys and values the draft holds (`cached`) and keeps the draft tokens it fed
//! past them (`fed`): once the target has verified a draft, the accepted ones among those stay
//! cached and the others' slots are written over by the next catch-up, a forward over every
//! token the draft has not seen (the whole prompt the first time). The draft's first token comes
//! from that forward, each further one from a one-token forward of every sequence at once.
//! A sequence the cache cannot hold does not draft; states of finished sequences are dropped,
//! and when blocks run short the least recently drafting sequences give theirs back.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;

use model::{KvCacheSize, Model, ModelConfig, ModelFolder, Runner, RunnerConfig, StepInput, Tokenizer};
use scheduler::{Scheduler, SeqId};

use super::DraftModelParams;
use crate::config::EngineConfig;
use crate::error::EngineError;

/// One sequence's place in the draft's cache.
#[derive(Debug)]
struct DraftSeq {
    row: u32,
    blocks: Vec<u32>,
    /// Leading tokens of the sequence whose keys and values the cache holds.
    cached: usize,
    /// Draft tokens fed after those, at positions `cached..`: valid while the sequence's
    /// tokens there turn out to be the same.
    fed: Vec<u32>,
    /// The proposal round this sequence last drafted in (least recent gives blocks back first).
    last_used: u64,
}

/// One sequence's share of a proposal round.
#[derive(Debug, Clone, Copy)]
struct Plan {
    seq: SeqId,
    /// Tokens of the sequence when the round starts (the target's latest included).
    len: usize,
    /// Draft tokens it asks for (its forwards feed `rounds - 1` of them).
    rounds: usize,
}

/// The draft model and its cache (see the module doc).
#[derive(Debug)]
pub struct Drafter {
    runner: Runner,
    block_size: usize,
    max_model_len: usize,
    max_batch_tokens: usize,
    /// KV cache groups of the draft's runner (each gets the same blocks).
    groups: usize,
    free_blocks: Vec<u32>,
    free_rows: Vec<u32>,
    seqs: HashMap<SeqId, DraftSeq>,
    round: u64,
    buf: StepArrays,
}

/// The flat arrays of one draft forward.
#[derive(Debug, Default)]
struct StepArrays {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<i64>,
    starts: Vec<usize>,
    lens: Vec<usize>,
    rows: Vec<u32>,
    samples: Vec<usize>,
    /// Which plan each sampled row belongs to.
    sampled: Vec<usize>,
}

impl StepArrays {
    fn clear(&mut self) {
        for v in [&mut self.starts, &mut self.lens, &mut self.samples, &mut self.sampled] {
            v.clear();
        }
        for v in [&mut self.tokens, &mut self.rows] {
            v.clear();
        }
        self.positions.clear();
        self.slots.clear();
        self.starts.push(0);
    }
}

/// Why `draft` cannot draft for `target`, if it cannot: another vocabulary (size or any token)
/// or a shorter context than the target serves.
pub fn check_compatible(
    draft: (&ModelConfig, &Tokenizer),
    target: (&ModelConfig, &Tokenizer),
    max_model_len: usize,
) -> Result<(), String> {
    let ((dc, dt), (tc, tt)) = (draft, target);
    if dc.vocab_size != tc.vocab_size || dt.vocab_size() != tt.vocab_size() {
        return Err(format!(
            "the draft model's vocabulary ({} logits, {} tokens) is not the target's ({} logits, {} tokens)",
            dc.vocab_size,
            dt.vocab_size(),
            tc.vocab_size,
            tt.vocab_size()
        ));
    }
    if let Some(id) = (0..tt.vocab_size() as u32).find(|&id| dt.id_to_token(id) != tt.id_to_token(id)) {
        return Err(format!(
            "the draft model's tokenizer differs from the target's at token {id} ({:?} vs {:?})",
            dt.id_to_token(id),
            tt.id_to_token(id)
        ));
    }
    if dc.max_position_embeddings < max_model_len {
        return Err(format!(
            "the draft model serves {} positions, the target {max_model_len} (lower max_model_len)",
            dc.max_position_embeddings
        ));
    }
    Ok(())
}

/// The draft model of `params`, loaded for a target of `target` (its config and tokenizer)
/// serving `max_model_len` and checked against it, quantized as asked, run as the engine's
/// `config` runs the target.
pub fn open(
    params: &DraftModelParams,
    target: (&ModelConfig, &Tokenizer),
    max_model_len: usize,
    config: &EngineConfig,
) -> Result<Model, EngineError> {
    let bad = |why: String| EngineError::Config(format!("speculative config: draft model: {why}"));
    let (folder, mut model) = ModelFolder::open_with_weights(Path::new(&params.model))
        .map_err(|e| bad(format!("{}: {e}", params.model.display())))?;
    check_compatible((&model.config, &folder.tokenizer), target, max_model_len).map_err(bad)?;
    if let Some(q) = params.quantization {
        model.quantize_weights(q.ggml_type())?;
    }
    model.activations = config.decode_activations;
    model.set_context(max_model_len);
    Ok(model)
}

/// The target's share of a KV cache budget of `kv_cache` shared with a draft model: both caches
/// get the same number of blocks, whose bytes together fit the budget (a block count is the
/// target's, the draft's the same beside it).
pub fn target_share(
    kv_cache: KvCacheSize,
    target_block_bytes: usize,
    draft_block_bytes: usize,
) -> KvCacheSize {
    match kv_cache {
        KvCacheSize::Bytes(budget) => {
            let both = (target_block_bytes as u128 + draft_block_bytes as u128).max(1);
            KvCacheSize::Bytes((budget as u128 * target_block_bytes as u128 / both) as usize)
        }
        blocks => blocks,
    }
}

impl Drafter {
    /// The draft model's runner over a cache of `num_blocks` blocks as the engine's `config`
    /// lays them out, serving `max_model_len`.
    pub fn new(
        model: Model,
        num_blocks: usize,
        max_model_len: usize,
        config: &EngineConfig,
    ) -> Result<Self, EngineError> {
        let runner = Runner::new(
            model,
            &RunnerConfig {
                device: config.device,
                kv_cache: KvCacheSize::Blocks(num_blocks),
                kv_dtype: config.kv_dtype,
                block_size: config.block_size,
                max_model_len,
                swap_bytes: 0,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_num_seqs: config.max_num_seqs,
                gpu_memory_utilization: config.gpu_memory_utilization,
            },
        )?;
        let blocks = runner.cache_config().num_blocks as u32;
        Ok(Self {
            groups: runner.kv_group_windows().len().max(1),
            block_size: config.block_size,
            max_model_len,
            max_batch_tokens: config.max_num_batched_tokens.max(1),
            free_blocks: (0..blocks).rev().collect(),
            free_rows: (0..config.max_num_seqs as u32).rev().collect(),
            seqs: HashMap::new(),
            round: 0,
            buf: StepArrays::default(),
            runner,
        })
    }

    /// The draft's runner (the engine measures its step's cost on it before serving).
    pub fn runner_mut(&mut self) -> &mut Runner {
        &mut self.runner
    }

    /// Up to `k` greedy draft tokens for each of `seqs` (sequences of `scheduler`), in order: an
    /// empty draft for one the cache cannot hold or at the end of its context.
    pub fn propose(
        &mut self,
        scheduler: &Scheduler,
        seqs: &[SeqId],
        k: usize,
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        self.round += 1;
        self.drop_finished(scheduler);
        let mut drafts = vec![Vec::new(); seqs.len()];
        let mut plans = Vec::with_capacity(seqs.len());
        for (i, &seq) in seqs.iter().enumerate() {
            let tokens =
                scheduler.seq_tokens(seq).ok_or(EngineError::Internal("drafting unknown sequence"))?;
            let rounds = k.min(self.max_model_len.saturating_sub(tokens.len()));
            if rounds > 0 && self.hold(seq, tokens, rounds, seqs)? {
                plans.push((i, Plan { seq, len: tokens.len(), rounds }));
            }
        }
        self.catch_up(scheduler, &plans, &mut drafts)?;
        for j in 1..plans.iter().map(|(_, p)| p.rounds).max().unwrap_or(0) {
            self.feed_drafts(&plans, j, &mut drafts)?;
        }
        Ok(drafts)
    }

    /// Forgets the sequences `scheduler` no longer has, giving their blocks and rows back.
    fn drop_finished(&mut self, scheduler: &Scheduler) {
        let gone: Vec<SeqId> =
            self.seqs.keys().filter(|&&s| scheduler.seq_tokens(s).is_none()).copied().collect();
        for seq in gone {
            self.release(seq);
        }
    }

    fn release(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.free_blocks.extend(s.blocks);
            self.free_rows.push(s.row);
        }
    }

    /// Makes room for `seq` (now `tokens`) to feed its unseen tokens and `rounds - 1` drafts:
    /// its state, the accepted part of its last draft kept, and blocks through the last position
    /// it feeds, taken from the least recently drafting sequences outside `round` if need be.
    /// False where the cache cannot hold it.
    fn hold(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        rounds: usize,
        round: &[SeqId],
    ) -> Result<bool, EngineError> {
        let need = (tokens.len() + rounds - 1).div_ceil(self.block_size);
        let new = !self.seqs.contains_key(&seq);
        let missing = need.saturating_sub(self.seqs.get(&seq).map_or(0, |s| s.blocks.len()));
        while self.free_blocks.len() < missing || (new && self.free_rows.is_empty()) {
            let victim = self
                .seqs
                .iter()
                .filter(|(s, _)| **s != seq && !round.contains(s))
                .min_by_key(|(_, st)| st.last_used)
                .map(|(s, _)| *s);
            let Some(victim) = victim else { return Ok(false) };
            self.release(victim);
        }
        let state = match self.seqs.entry(seq) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let row = self.free_rows.pop().ok_or(EngineError::Internal("no draft row after eviction"))?;
                e.insert(DraftSeq { row, blocks: Vec::new(), cached: 0, fed: Vec::new(), last_used: 0 })
            }
        };
        let from = state.blocks.len();
        state.blocks.extend(self.free_blocks.drain(self.free_blocks.len() - missing..));
        state.last_used = self.round;
        // The draft tokens the target accepted are cached as they were fed; the newest token
        // never is (the catch-up feeds at least it).
        let accepted = tokens
            .get(state.cached..)
            .map_or(0, |rest| rest.iter().zip(&state.fed).take_while(|(a, b)| a == b).count());
        state.cached = (state.cached + accepted).min(tokens.len() - 1);
        state.fed.clear();
        if missing > 0 {
            let ids: Vec<u32> = (0..self.groups).flat_map(|_| state.blocks[from..].iter().copied()).collect();
            self.runner.write_table_row(state.row, from, &ids)?;
        }
        Ok(true)
    }

    /// Feeds every planned sequence's unseen tokens (in forwards of at most the batch budget,
    /// a long catch-up across several) and takes each one's first draft token from its last row.
    fn catch_up(
        &mut self,
        scheduler: &Scheduler,
        plans: &[(usize, Plan)],
        drafts: &mut [Vec<u32>],
    ) -> Result<(), EngineError> {
        let mut next = 0;
        while next < plans.len() {
            self.buf.clear();
            while next < plans.len() && self.buf.tokens.len() < self.max_batch_tokens {
                let (i, plan) = plans[next];
                let tokens = scheduler
                    .seq_tokens(plan.seq)
                    .ok_or(EngineError::Internal("drafting unknown sequence"))?;
                let state = &self.seqs[&plan.seq];
                let room = self.max_batch_tokens - self.buf.tokens.len();
                let end = (state.cached + room).min(plan.len);
                for (pos, &token) in tokens.iter().enumerate().take(end).skip(state.cached) {
                    self.buf.tokens.push(token);
                    self.buf.positions.push(pos as u32);
                    self.buf.slots.push(slot(&state.blocks, self.block_size, pos));
                }
                self.buf.starts.push(self.buf.tokens.len());
                self.buf.lens.push(end);
                self.buf.rows.push(state.row);
                if end == plan.len {
                    self.buf.samples.push(self.buf.tokens.len() - 1);
                    self.buf.sampled.push(i);
                    next += 1;
                }
                if let Some(s) = self.seqs.get_mut(&plan.seq) {
                    s.cached = end;
                }
            }
            self.forward_into(drafts)?;
        }
        Ok(())
    }

    /// Feeds draft token `j - 1` of every sequence still drafting and appends its next one.
    fn feed_drafts(
        &mut self,
        plans: &[(usize, Plan)],
        j: usize,
        drafts: &mut [Vec<u32>],
    ) -> Result<(), EngineError> {
        self.buf.clear();
        for &(i, plan) in plans {
            // A sequence whose draft stopped (no candidate) or that asked for fewer is done.
            if plan.rounds <= j || drafts[i].len() != j {
                continue;
            }
            let token = drafts[i][j - 1];
            let pos = plan.len + j - 1;
            let state = self.seqs.get_mut(&plan.seq).ok_or(EngineError::Internal("draft state lost"))?;
            state.fed.push(token);
            self.buf.tokens.push(token);
            self.buf.positions.push(pos as u32);
            self.buf.slots.push(slot(&state.blocks, self.block_size, pos));
            let row = state.row;
            self.buf.starts.push(self.buf.tokens.len());
            self.buf.lens.push(pos + 1);
            self.buf.rows.push(row);
            self.buf.samples.push(self.buf.tokens.len() - 1);
            self.buf.sampled.push(i);
        }
        if self.buf.tokens.is_empty() {
            return Ok(());
        }
        self.forward_into(drafts)
    }

    /// Runs the forward in the buffers and appends each sampled row's greedy token to its
    /// sequence's draft.
    fn forward_into(&mut self, drafts: &mut [Vec<u32>]) -> Result<(), EngineError> {
        let b = &self.buf;
        let others: Vec<Vec<i64>> = (1..self.groups).map(|_| b.slots.clone()).collect();
        let greedy = self.runner.forward_greedy(
            &StepInput {
                token_ids: &b.tokens,
                positions: &b.positions,
                slot_mapping: &b.slots,
                group_slot_mapping: &others,
                query_start_loc: &b.starts,
                seq_lens: &b.lens,
                seq_rows: &b.rows,
                sample_indices: &b.samples,
                pool_indices: &[],
                lora: None,
            },
            crate::sampling::filter::argmax,
        )?;
        for (&i, &token) in b.sampled.iter().zip(greedy) {
            if token != u32::MAX {
                drafts[i].push(token);
            }
        }
        Ok(())
    }
}

/// The cache slot of position `pos` of a sequence holding `blocks` of `block_size`.
fn slot(blocks: &[u32], block_size: usize, pos: usize) -> i64 {
    i64::from(blocks[pos / block_size]) * block_size as i64 + (pos % block_size) as i64
}
