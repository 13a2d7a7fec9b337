//! The batch sampler: one `[batch, vocab]` logits buffer in, one token per row out, rows in
//! parallel (rayon). Each row carries its own `SequenceSampler` (RNG stream and penalty
//! history), so a row's result never depends on the other rows of the batch.

use std::collections::HashMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::filter::{self, Truncation};
use super::params::SamplingParams;
use crate::output::{Logprob, PositionLogprobs};
use crate::structured::Guide;

// Computed here, where the logits are: the type is plain output data (`output.rs`).
impl PositionLogprobs {
    /// `token`'s logprob and rank and the `n` most likely tokens of one row of raw logits whose
    /// log-sum-exp is `lse`.
    pub(crate) fn of_row(raw: &[f32], lse: f32, token: u32, n: usize) -> Self {
        let lp = |t: u32, v: f32| Logprob { token: t, logprob: v - lse };
        let value = raw.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
        Self {
            sampled: lp(token, value),
            rank: 1 + raw.iter().filter(|&&v| v > value).count(),
            top: filter::top_n(raw, n).into_iter().map(|(t, v)| lp(t, v)).collect(),
        }
    }
}

/// What the sampler picked for one row.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenChoice {
    pub token: u32,
    /// Present when the request asked for logprobs.
    pub logprobs: Option<PositionLogprobs>,
}

/// Why a batch could not be sampled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("logits buffer has {len} values, expected {rows} rows x {vocab} vocab")]
    Shape { len: usize, rows: usize, vocab: usize },
    #[error("row {row}: no token has a finite logit after masking")]
    NoCandidate { row: usize },
}

/// The RNG stream for sample `index` of a request seeded with `seed`: one ChaCha stream
/// per parallel sample, so `n` samples differ and each is reproducible on its own.
pub fn seeded_rng(seed: u64, index: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index as u64);
    rng
}

/// Per-sequence sampling state: its RNG and what the penalties need to know.
#[derive(Debug, Clone)]
pub struct SequenceSampler {
    rng: ChaCha8Rng,
    /// Sorted, deduplicated prompt tokens (repetition penalty); shared by a request's samples.
    prompt_set: Arc<[u32]>,
    /// Occurrences of each generated token (frequency / presence / repetition penalties).
    output_counts: HashMap<u32, u32>,
    num_generated: usize,
    /// Tokens banned until `min_tokens` were generated (EOS unless ignored, stop token ids).
    min_tokens_ban: Arc<[u32]>,
}

impl SequenceSampler {
    /// `prompt_set` from [`Self::prompt_set`]; `stop_ids` = the request's stop token ids plus
    /// the EOS ids unless it ignores EOS.
    pub fn new(rng: ChaCha8Rng, prompt_set: Arc<[u32]>, stop_ids: Arc<[u32]>) -> Self {
        Self { rng, prompt_set, output_counts: HashMap::new(), num_generated: 0, min_tokens_ban: stop_ids }
    }

    /// The sorted unique prompt tokens, or an empty set when no penalty needs them.
    pub fn prompt_set(params: &SamplingParams, prompt: &[u32]) -> Arc<[u32]> {
        if params.repetition_penalty == 1.0 {
            return Arc::from([]);
        }
        let mut set = prompt.to_vec();
        set.sort_unstable();
        set.dedup();
        set.into()
    }

    pub fn num_generated(&self) -> usize {
        self.num_generated
    }

    /// Records a token that was generated outside `sample_batch` (e.g. restored state).
    pub fn record(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
        self.num_generated += 1;
    }

    /// Masks the stop ids (`min_tokens` not reached yet), unless they are all the row allows
    /// (a grammar that can only end): a row is never left without a candidate.
    fn ban_stop_ids(&self, row: &mut [f32]) {
        let banned = |t: usize| self.min_tokens_ban.iter().any(|&b| b as usize == t);
        let other = row.iter().enumerate().any(|(t, v)| *v > f32::NEG_INFINITY && !banned(t));
        if !other {
            return;
        }
        for &t in self.min_tokens_ban.iter() {
            if let Some(v) = row.get_mut(t as usize) {
                *v = f32::NEG_INFINITY;
            }
        }
    }

    /// vLLM's order: repetition penalty on prompt ∪ output, then frequency and presence on output.
    fn apply_penalties(&self, params: &SamplingParams, row: &mut [f32]) {
        let rp = params.repetition_penalty;
        if rp != 1.0 {
            let penalize = |v: &mut f32| *v = if *v > 0.0 { *v / rp } else { *v * rp };
            for &t in self.prompt_set.iter() {
                if let Some(v) = row.get_mut(t as usize) {
                    penalize(v);
                }
            }
            for &t in self.output_counts.keys() {
                if self.prompt_set.binary_search(&t).is_err()
                    && let Some(v) = row.get_mut(t as usize)
                {
                    penalize(v);
                }
            }
        }
        if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            for (&t, &count) in &self.output_counts {
                if let Some(v) = row.get_mut(t as usize) {
                    *v -= params.frequency_penalty * count as f32 + params.presence_penalty;
                }
            }
        }
    }

    /// Picks this row's token; `row` is clobbered (it ends up holding probabilities). The
    /// guide's mask comes first (logprobs are those of the masked distribution, as vLLM's), then
    /// the logit bias, the `min_tokens` ban, penalties, temperature and truncation.
    fn sample_row(
        &mut self,
        params: &SamplingParams,
        guide: Option<&mut Guide>,
        row: &mut [f32],
        scratch: &mut Vec<u32>,
    ) -> Option<TokenChoice> {
        if let Some(guide) = guide {
            guide.mask(row);
        }
        let raw = params.logprobs.map(|n| (row.to_vec(), filter::log_sum_exp(row), n));
        for (&t, &bias) in &params.logit_bias {
            if let Some(v) = row.get_mut(t as usize) {
                *v += bias;
            }
        }
        if self.num_generated < params.min_tokens {
            self.ban_stop_ids(row);
        }
        if params.has_penalties() {
            self.apply_penalties(params, row);
        }
        let token = if params.is_greedy() {
            filter::argmax(row)?
        } else {
            let inv_t = 1.0 / params.temperature;
            row.iter_mut().for_each(|v| *v *= inv_t);
            if !filter::softmax_in_place(row) {
                return None;
            }
            let trunc = Truncation { min_p: params.min_p, top_k: params.top_k_limit(), top_p: params.top_p };
            let u: f64 = self.rng.random();
            filter::sample_truncated(row, trunc, u, scratch)?
        };
        self.record(token);
        let logprobs = raw.map(|(raw, lse, n)| PositionLogprobs::of_row(&raw, lse, token, n));
        Some(TokenChoice { token, logprobs })
    }
}

/// One row of a batch: the request's parameters and the sequence's state (and its grammar's,
/// for a constrained request).
#[derive(Debug)]
pub struct SampleRow<'a> {
    pub params: &'a SamplingParams,
    pub state: &'a mut SequenceSampler,
    pub guide: Option<&'a mut Guide>,
}

/// Samples one token per row of `logits` (`rows.len() x vocab`, row-major), in parallel.
/// The buffer is used as scratch. Each row's state records its token.
pub fn sample_batch(
    logits: &mut [f32],
    vocab: usize,
    rows: &mut [SampleRow<'_>],
) -> Result<Vec<TokenChoice>, SamplerError> {
    if vocab == 0 || logits.len() != rows.len() * vocab {
        return Err(SamplerError::Shape { len: logits.len(), rows: rows.len(), vocab });
    }
    logits
        .par_chunks_mut(vocab)
        .zip(rows.par_iter_mut())
        .enumerate()
        .map_init(Vec::new, |scratch, (i, (row, r))| {
            let guide = r.guide.as_deref_mut();
            r.state.sample_row(r.params, guide, row, scratch).ok_or(SamplerError::NoCandidate { row: i })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(params: &SamplingParams, seed: u64, prompt: &[u32], stop: &[u32]) -> SequenceSampler {
        SequenceSampler::new(seeded_rng(seed, 0), SequenceSampler::prompt_set(params, prompt), stop.into())
    }

    fn sample_one(params: &SamplingParams, st: &mut SequenceSampler, logits: &[f32]) -> TokenChoice {
        let mut buf = logits.to_vec();
        let mut rows = [SampleRow { params, state: st, guide: None }];
        let mut out = sample_batch(&mut buf, logits.len(), &mut rows).unwrap_or_default();
        out.pop().unwrap_or(TokenChoice { token: u32::MAX, logprobs: None })
    }

    #[test]
    fn greedy_takes_argmax_and_consumes_no_randomness() {
        let p = SamplingParams::greedy(8);
        let mut st = state(&p, 1, &[], &[]);
        let before = st.rng.clone();
        assert_eq!(sample_one(&p, &mut st, &[0.1, 2.0, 1.9]).token, 1);
        assert_eq!(st.rng, before);
        assert_eq!(st.num_generated(), 1);
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        let p = SamplingParams::greedy(1);
        let mut st = state(&p, 0, &[], &[]);
        let mut rows = [SampleRow { params: &p, state: &mut st, guide: None }];
        assert!(matches!(sample_batch(&mut [0.0; 5], 3, &mut rows), Err(SamplerError::Shape { .. })));
        let mut masked = [f32::NEG_INFINITY; 3];
        assert_eq!(sample_batch(&mut masked, 3, &mut rows), Err(SamplerError::NoCandidate { row: 0 }));
    }

    #[test]
    fn min_tokens_bans_stop_ids_until_reached() {
        let p = SamplingParams { min_tokens: 2, ..SamplingParams::greedy(8) };
        let mut st = state(&p, 0, &[], &[0]);
        let logits = [5.0, 1.0, 0.0];
        assert_eq!(sample_one(&p, &mut st, &logits).token, 1);
        assert_eq!(sample_one(&p, &mut st, &logits).token, 1);
        assert_eq!(sample_one(&p, &mut st, &logits).token, 0);
    }

    #[test]
    fn min_tokens_never_bans_the_only_candidates_and_bias_moves_the_argmax() {
        let p = SamplingParams { min_tokens: 5, ..SamplingParams::greedy(8) };
        let mut st = state(&p, 0, &[], &[0]);
        // Only the stop id is left (a grammar that can only end): it is taken, not banned.
        assert_eq!(sample_one(&p, &mut st, &[1.0, f32::NEG_INFINITY, f32::NEG_INFINITY]).token, 0);
        let mut p = SamplingParams::greedy(8);
        p.logit_bias.insert(2, 100.0);
        p.logit_bias.insert(0, -100.0);
        let mut st = state(&p, 0, &[], &[]);
        assert_eq!(sample_one(&p, &mut st, &[50.0, 1.0, -20.0]).token, 2);
    }

    #[test]
    fn penalties_follow_vllm_formulas() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::greedy(8)
        };
        let mut st = state(&p, 0, &[0, 0, 1], &[]);
        st.record(2);
        st.record(2);
        let mut row = vec![4.0f32, -1.0, 3.0, 1.0];
        st.apply_penalties(&p, &mut row);
        // token 0: prompt, positive -> /2; token 1: prompt, negative -> *2;
        // token 2: output twice: 3/2 - 0.5*2 - 0.25; token 3 untouched.
        assert_eq!(row, vec![2.0, -2.0, 1.5 - 1.0 - 0.25, 1.0]);
    }

    #[test]
    fn frequency_penalty_breaks_repetition_in_greedy() {
        let p = SamplingParams { frequency_penalty: 2.0, ..SamplingParams::greedy(8) };
        let mut st = state(&p, 0, &[], &[]);
        let logits = [1.0, 0.5];
        assert_eq!(sample_one(&p, &mut st, &logits).token, 0);
        assert_eq!(sample_one(&p, &mut st, &logits).token, 1);
    }

    #[test]
    fn logprobs_are_raw_log_softmax() {
        let p = SamplingParams {
            logprobs: Some(2),
            temperature: 0.0,
            repetition_penalty: 5.0,
            ..SamplingParams::default()
        };
        let mut st = state(&p, 0, &[2], &[]);
        let logits = [1.0f32, 2.0, 3.0];
        let out = sample_one(&p, &mut st, &logits);
        // Repetition penalty moves greedy off token 2, but logprobs stay the model's.
        assert_eq!(out.token, 1);
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln() as f32;
        let lp = out.logprobs.unwrap_or(PositionLogprobs {
            sampled: Logprob { token: 9, logprob: 0.0 },
            rank: 0,
            top: vec![],
        });
        assert_eq!(lp.sampled.token, 1);
        assert_eq!(lp.rank, 2);
        assert!((lp.sampled.logprob - (2.0 - lse)).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|l| l.token).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn same_seed_same_tokens_regardless_of_batch_neighbours() {
        let p = SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(7), ..SamplingParams::default() };
        let other = SamplingParams { temperature: 1.3, top_k: 5, ..SamplingParams::default() };
        let vocab = 64;
        let logits: Vec<f32> = (0..vocab).map(|i| ((i * 37 % 17) as f32) * 0.3).collect();
        let mut alone = state(&p, 7, &[], &[]);
        let solo: Vec<u32> = (0..20).map(|_| sample_one(&p, &mut alone, &logits).token).collect();

        let mut mine = state(&p, 7, &[], &[]);
        let mut others: Vec<SequenceSampler> = (0..5).map(|i| state(&other, 100 + i, &[], &[])).collect();
        let mut batched = Vec::new();
        for step in 0..20 {
            // The target row sits at a different place in the batch every step.
            let pos = step % 6;
            let mut rows: Vec<SampleRow<'_>> =
                others.iter_mut().map(|s| SampleRow { params: &other, state: s, guide: None }).collect();
            rows.insert(pos, SampleRow { params: &p, state: &mut mine, guide: None });
            let mut buf: Vec<f32> = (0..rows.len()).flat_map(|_| logits.iter().copied()).collect();
            let out = sample_batch(&mut buf, vocab, &mut rows).unwrap_or_default();
            batched.push(out.get(pos).map_or(u32::MAX, |s| s.token));
        }
        assert_eq!(solo, batched);
        // And a different sample index gives a different stream.
        let mut second = SequenceSampler::new(seeded_rng(7, 1), Arc::from([]), Arc::from([]));
        let other_stream: Vec<u32> = (0..20).map(|_| sample_one(&p, &mut second, &logits).token).collect();
        assert_ne!(solo, other_stream);
    }

    #[test]
    fn temperature_sampling_matches_the_distribution() {
        let p = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let mut st = state(&p, 3, &[], &[]);
        let probs = [0.5f32, 0.3, 0.2];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut counts = [0usize; 3];
        let draws = 20_000;
        for _ in 0..draws {
            counts[sample_one(&p, &mut st, &logits).token as usize] += 1;
        }
        for (c, p) in counts.iter().zip(probs) {
            let freq = *c as f32 / draws as f32;
            // 5 standard deviations of a binomial frequency at this sample size.
            assert!((freq - p).abs() < 5.0 * (p * (1.0 - p) / draws as f32).sqrt(), "{counts:?}");
        }
    }

    #[test]
    fn top_k_one_is_greedy_even_when_hot() {
        let p = SamplingParams { temperature: 5.0, top_k: 1, ..SamplingParams::default() };
        let mut st = state(&p, 11, &[], &[]);
        for _ in 0..50 {
            assert_eq!(sample_one(&p, &mut st, &[0.0, 0.2, 0.1]).token, 1);
        }
    }
}
