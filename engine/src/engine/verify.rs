//! Speculative decoding in the step (`crate::spec`): drafts proposed after a step for the next
//! ([`Engine::propose_drafts`]), and verified: row `j` of a drafted sequence's logits scores the
//! position after its draft token `j - 1`, and the target draws there only while its token at
//! `j - 1` was that draft token, with the request's own sampler in order, so each request gets
//! exactly the tokens it would have got a step at a time. Drafted rows draw in rounds, the
//! rows still matching their drafts together.

use model::runner::kv_bytes_per_block;
use model::{KvCacheSize, Model, ModelConfig, Runner, StepInput, Tokenizer};
use scheduler::{Scheduler, SeqId};

use super::Engine;
use super::live::{Row, SampleMut};
use super::rows::gather_logit_rows;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::request::{RequestRecord, SeqState};
use crate::sampling::{SampleRow, SamplerError, TokenChoice, sample_batch};
use crate::spec::draft::{self, Drafter};
use crate::spec::suffix::{LocalSuffix, SuffixCache};
use crate::spec::{DraftCost, MAX_SUFFIX_CACHE_NODES, SpecMethod, ngram};
use crate::structured::Advance;

/// Whether `token`, the target's draw at `j`, is draft token `j` of `row` (`drafts`: the plan's
/// token ids), so that the next position is scored against the right context.
fn matches_draft(row: &Row, drafts: &[u32], j: usize, token: u32) -> bool {
    j < row.draft.len() && drafts.get(row.draft.start + j) == Some(&token)
}

/// The tokens after each row's `first`: for a drafted row, the target's draws at the positions
/// its matching draft tokens opened (the last one where it differed, or the token after the
/// whole draft); empty for the others. `logits` is the forward's, `scratch` a buffer to reuse.
pub(super) fn sample_drafted(
    rows: &[Row],
    drafts: &[u32],
    first: &[TokenChoice],
    samples: &mut [SampleMut<'_>],
    logits: &[f32],
    vocab: usize,
    scratch: &mut Vec<f32>,
) -> Result<Vec<Vec<TokenChoice>>, EngineError> {
    let mut more: Vec<Vec<TokenChoice>> = vec![Vec::new(); rows.len()];
    let mut active: Vec<usize> =
        (0..rows.len()).filter(|&i| matches_draft(&rows[i], drafts, 0, first[i].token)).collect();
    let mut j = 1;
    while !active.is_empty() {
        // A guided row's grammar takes the token before position `j` first (the step's last
        // token it is fed afterwards, with everyone's); one its grammar ends on drafts no more.
        active.retain(|&i| {
            let Some(guide) = samples[i].seq.guide.as_mut() else { return true };
            let before = if j == 1 { first[i].token } else { more[i][j - 2].token };
            matches!(guide.advance(before), Advance::Continue)
        });
        if active.is_empty() {
            break;
        }
        gather_logit_rows(active.iter().map(|&i| &rows[i]), j, logits, vocab, scratch)?;
        let mut picked = active.iter().copied().peekable();
        let mut batch: Vec<SampleRow<'_>> = Vec::with_capacity(active.len());
        for (i, s) in samples.iter_mut().enumerate() {
            if picked.next_if_eq(&i).is_some() {
                batch.push(SampleRow {
                    params: s.params,
                    state: &mut s.seq.sampler,
                    guide: s.seq.guide.as_mut(),
                });
            }
        }
        let drawn = sample_batch(scratch, vocab, &mut batch)?;
        drop(batch);
        let mut still = Vec::with_capacity(active.len());
        for (i, choice) in active.into_iter().zip(drawn) {
            if matches_draft(&rows[i], drafts, j, choice.token) {
                still.push(i);
            }
            more[i].push(choice);
        }
        active = still;
        j += 1;
    }
    Ok(more)
}

/// [`sample_drafted`] for a plain-greedy step, from the runner's greedy token of every logit row
/// (`u32::MAX`: no candidate): each row's first token, and a drafted row's further draws (an
/// empty list, which allocates nothing, for the others). A row without a candidate is the
/// sampler's `NoCandidate` error, as undrafted.
pub(super) fn greedy_drafted(
    rows: &[Row],
    drafts: &[u32],
    greedy: &[u32],
) -> Result<(Vec<u32>, Vec<Vec<u32>>), EngineError> {
    let (mut first, mut more) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for (row, r) in rows.iter().enumerate() {
        let at = |j: usize| {
            let t = greedy.get(r.logit + j).copied().filter(|&t| t != u32::MAX);
            t.ok_or(SamplerError::NoCandidate { row })
        };
        let mut token = at(0)?;
        first.push(token);
        let mut further = Vec::new();
        let mut j = 0;
        while matches_draft(r, drafts, j, token) {
            j += 1;
            token = at(j)?;
            further.push(token);
        }
        more.push(further);
    }
    Ok((first, more))
}

impl Engine {
    /// With speculative decoding, a draft for every sample that goes on decoding alone (a request
    /// of one sample; under a constraint, the part of the draft its grammar takes) for the
    /// scheduler to score next step: the draft model's for all of them in one batch.
    pub(super) fn propose_drafts(&mut self, forward_secs: f64) -> Result<(), EngineError> {
        let Some(spec) = &self.config.speculative_config else { return Ok(()) };
        if spec.disable_by_batch_size.is_some_and(|most| self.bufs.view.rows.len() > most) {
            return Ok(());
        }
        let (k, suffix, ngram) = (spec.num_speculative_tokens, spec.suffix_rule(), spec.ngram());
        let drafted = self.bufs.view.rows.iter().filter(|r| !r.draft.is_empty()).count();
        let cost = self.draft_cost.at(forward_secs, self.bufs.plan.seqs.len(), drafted);
        let mut by_model = Vec::new();
        for r in &self.bufs.view.rows {
            let Some(record) = self.live.at_mut(r.slot) else { continue };
            if record.seqs.len() > 1 {
                continue;
            }
            let prompt_len = record.prompt_len;
            let seq =
                record.seqs.get_mut(r.index).ok_or(EngineError::Internal("sample index out of range"))?;
            if seq.finish.is_some() {
                continue;
            }
            let tokens = self
                .scheduler
                .seq_tokens(r.seq_id)
                .ok_or(EngineError::Internal("sampled unknown sequence"))?;
            if let Some((p, _)) = suffix {
                // Fed every step, drafting or not, so that its output is whole when it finishes.
                let local = seq.suffix.get_or_insert_with(|| LocalSuffix::new(p.max_tree_depth, prompt_len));
                local.catch_up(tokens);
            }
            if !seq.gate.wants(k, cost) {
                continue;
            }
            self.bufs.draft.clear();
            match (suffix, &seq.suffix, ngram) {
                _ if self.drafter.is_some() => {
                    by_model.push((r.slot, r.index, r.seq_id));
                    continue;
                }
                (Some((_, rule)), Some(local), _) => {
                    let mine = local.trie.draft(tokens, rule, &mut self.bufs.draft);
                    if let Some(cache) = &self.suffix_cache
                        && cache.trie.draft(tokens, rule, &mut self.bufs.other_draft) > mine
                    {
                        std::mem::swap(&mut self.bufs.draft, &mut self.bufs.other_draft);
                    }
                }
                (_, _, Some((min_n, max_n))) => ngram::propose(tokens, min_n, max_n, k, &mut self.bufs.draft),
                _ => {}
            }
            offer_draft(seq, r.seq_id, &mut self.bufs.draft, &mut self.scheduler)?;
        }
        let Some(drafter) = self.drafter.as_mut().filter(|_| !by_model.is_empty()) else { return Ok(()) };
        let seqs: Vec<_> = by_model.iter().map(|&(_, _, id)| id).collect();
        let drafts = drafter.propose(&self.scheduler, &seqs, k)?;
        for ((slot, index, seq_id), mut draft) in by_model.into_iter().zip(drafts) {
            let seq = self.live.at_mut(slot).and_then(|r| r.seqs.get_mut(index));
            let seq = seq.ok_or(EngineError::Internal("drafted sample vanished"))?;
            offer_draft(seq, seq_id, &mut draft, &mut self.scheduler)?;
        }
        Ok(())
    }
}

/// `draft` for sample `seq` (scheduled as `id`) to the scheduler, cut to what its grammar takes.
fn offer_draft(
    seq: &mut SeqState,
    id: SeqId,
    draft: &mut Vec<u32>,
    scheduler: &mut Scheduler,
) -> Result<(), EngineError> {
    if let Some(guide) = seq.guide.as_mut() {
        let valid = guide.valid_prefix(draft);
        draft.truncate(valid);
    }
    if !draft.is_empty() {
        scheduler.set_draft(id, draft)?;
    }
    Ok(())
}

/// The cache of recent outputs suffix decoding drafts from (none under another method, or
/// with `suffix_decoding_max_cached_requests` 0).
pub(super) fn suffix_cache(config: &EngineConfig) -> Option<SuffixCache> {
    let (p, _) = config.speculative_config.as_ref()?.suffix_rule()?;
    (p.max_cached_requests > 0)
        .then(|| SuffixCache::new(p.max_tree_depth, p.max_cached_requests, MAX_SUFFIX_CACHE_NODES))
}

impl Engine {
    /// A finished request's outputs into the cache of recent outputs (suffix decoding).
    pub(super) fn cache_outputs(&mut self, record: &mut RequestRecord) {
        let Some(cache) = &mut self.suffix_cache else { return };
        for local in record.seqs.iter_mut().filter_map(|s| s.suffix.as_mut()) {
            cache.add(local.take_output());
        }
    }
}

/// Context of the calibration forwards (short: a decode's cost is its weights' reads).
const CALIBRATION_CONTEXT: usize = 64;
/// Timed pairs of the calibration (odd, for the median).
const CALIBRATION_PAIRS: usize = 5;

/// What verifying a draft costs: pinned in plain batch-1 steps, or measured in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum VerifyCost {
    /// A verification costs this many plain steps, whatever the batch.
    Pinned(f64),
    /// What a draft's `k` tokens add to a forward, measured in seconds.
    Measured { extra_secs: f64 },
}

impl VerifyCost {
    /// The cost in a step like the last one: a forward of `forward_secs` for `seqs` scheduled
    /// sequences (each waits for the step, so a draft's extra time is paid by all of them),
    /// `drafted` of which scored drafts (whose extra time a token's cost leaves out).
    pub(super) fn at(self, forward_secs: f64, seqs: usize, drafted: usize) -> DraftCost {
        match self {
            Self::Pinned(cost) => DraftCost::batch1(cost),
            Self::Measured { extra_secs } => {
                let plain = (forward_secs - drafted as f64 * extra_secs).max(forward_secs / 8.0);
                DraftCost { extra: extra_secs, token: plain / seqs.max(1) as f64 }
            }
        }
    }
}

/// The draft model `config` names, loaded and checked against the target's vocabulary and
/// context, and the target's KV cache size: with a draft model a byte budget is shared by both
/// caches, as many blocks each.
pub(super) fn open_draft(
    config: &EngineConfig,
    target: (&ModelConfig, &Tokenizer),
    max_model_len: usize,
) -> Result<(Option<Model>, KvCacheSize), EngineError> {
    let Some(SpecMethod::DraftModel(params)) = config.speculative_config.as_ref().map(|s| &s.method) else {
        return Ok((None, config.kv_cache));
    };
    let model = draft::open(params, target, max_model_len, config)?;
    let bytes = |c: &ModelConfig| kv_bytes_per_block(c, config.device, config.block_size, config.kv_dtype);
    let share = draft::target_share(config.kv_cache, bytes(target.0), bytes(&model.config));
    Ok((Some(model), share))
}

/// The drafter over the draft model [`open_draft`] loaded (its cache as many blocks as the
/// target's), and what a draft costs: pinned where the config says, or measured on the target's
/// verification plus `k` of the draft model's one-token steps.
pub(super) fn drafter_and_cost(
    config: &EngineConfig,
    draft: Option<Model>,
    runner: &mut Runner,
    max_model_len: usize,
) -> Result<(Option<Drafter>, VerifyCost), EngineError> {
    let Some(spec) = &config.speculative_config else { return Ok((None, VerifyCost::Pinned(1.0))) };
    let k = spec.num_speculative_tokens;
    let blocks = runner.cache_config().num_blocks;
    let mut drafter = draft.map(|model| Drafter::new(model, blocks, max_model_len, config)).transpose()?;
    if let Some(cost) = spec.verify_cost {
        return Ok((drafter, VerifyCost::Pinned(cost)));
    }
    let Some((_, extra)) = time_forwards(runner, k)? else {
        return Ok((drafter, VerifyCost::Pinned((k + 1) as f64)));
    };
    let cost = match drafter.as_mut().map(|d| time_forwards(d.runner_mut(), k)).transpose()? {
        Some(Some((draft_step, _))) => VerifyCost::Measured { extra_secs: extra + k as f64 * draft_step },
        Some(None) => VerifyCost::Pinned((2 * k + 1) as f64),
        None => VerifyCost::Measured { extra_secs: extra },
    };
    Ok((drafter, cost))
}

/// A forward of one token on `runner` and what `k` more tokens of the same sequence add to it:
/// medians over alternating pairs, run before the engine serves anything (the cache's first
/// blocks hold nothing yet, and the scheduler rewrites a sequence's whole table row the first
/// time it schedules it); `None` where the cache or the model length is too small to measure.
fn time_forwards(runner: &mut Runner, k: usize) -> Result<Option<(f64, f64)>, EngineError> {
    let bs = runner.cache_config().block_size;
    let n = CALIBRATION_CONTEXT + k + 1;
    let blocks = n.div_ceil(bs);
    if blocks > runner.cache_config().num_blocks {
        return Ok(None);
    }
    // Every KV cache group (a hybrid cache's sliding windows too) takes the same blocks.
    let groups = runner.kv_group_windows().len().max(1);
    let ids: Vec<u32> = (0..groups).flat_map(|_| 0..blocks as u32).collect();
    if runner.write_table_row(0, 0, &ids).is_err() {
        return Ok(None);
    }
    let tokens: Vec<u32> = (0..n as u32).map(|i| i % 17).collect();
    let positions: Vec<u32> = (0..n as u32).collect();
    let slots: Vec<i64> = (0..n as i64).collect();
    let other_groups: Vec<Vec<i64>> = vec![slots.clone(); groups - 1];
    let all: Vec<usize> = (0..n).collect();
    let mut forward = |from: usize, len: usize, sampled: &[usize]| -> Result<f64, EngineError> {
        let t = std::time::Instant::now();
        let others: Vec<Vec<i64>> = other_groups.iter().map(|s| s[from..from + len].to_vec()).collect();
        runner.forward(&StepInput {
            token_ids: &tokens[from..from + len],
            positions: &positions[from..from + len],
            slot_mapping: &slots[from..from + len],
            group_slot_mapping: &others,
            query_start_loc: &[0, len],
            seq_lens: &[from + len],
            seq_rows: &[0],
            sample_indices: sampled,
            pool_indices: &[],
            lora: None,
        })?;
        Ok(t.elapsed().as_secs_f64())
    };
    let c = CALIBRATION_CONTEXT;
    forward(0, c, &[c - 1])?;
    let (mut ones, mut extra) =
        (Vec::with_capacity(CALIBRATION_PAIRS), Vec::with_capacity(CALIBRATION_PAIRS));
    for i in 0..=CALIBRATION_PAIRS {
        let (one, verify) = if i % 2 == 0 {
            let one = forward(c, 1, &all[..1])?;
            (one, forward(c, k + 1, &all[..k + 1])?)
        } else {
            let verify = forward(c, k + 1, &all[..k + 1])?;
            (forward(c, 1, &all[..1])?, verify)
        };
        // The first pair warms the larger step's buffers up.
        if i > 0 {
            ones.push(one);
            extra.push((verify - one).max(0.0));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Some((median(&mut ones), median(&mut extra))))
}
