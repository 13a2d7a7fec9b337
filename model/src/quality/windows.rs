//! [`WindowPlan`]: a text's tokens cut into windows of `ctx` tokens every `stride` tokens, each
//! window's first token replaced by BOS where the model's tokenizer adds one, and the rows scored
//! (row `j` predicts token `j + 1`; from the middle of the window on, as llama-perplexity does, so
//! that every scored token sees at least half a window of context). [`Scorer`]: one window
//! through the model's forward pass (a paged KV cache of the run's dtype, one sequence) into the
//! natural-log probabilities of its scored rows.

use std::ops::Range;

use kv_cache::{CacheConfig, DType, KvCache};
use rayon::prelude::*;

use super::QualityError;
use crate::input::ModelInput;
use crate::{Model, Workspace};

/// Which tokens each window holds and which rows of it are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPlan {
    pub ctx: usize,
    pub stride: usize,
    pub windows: usize,
}

impl WindowPlan {
    /// Windows of `ctx` tokens every `stride` (default: `ctx`, no overlap) over `num_tokens`,
    /// at most `chunks` of them.
    pub fn new(
        num_tokens: usize,
        ctx: usize,
        stride: Option<usize>,
        chunks: Option<usize>,
    ) -> Result<Self, QualityError> {
        if ctx < 4 {
            return Err(QualityError::BadPlan(format!(
                "a window of {ctx} tokens scores nothing (at least 4)"
            )));
        }
        let stride = stride.unwrap_or(ctx);
        if stride == 0 || stride > ctx {
            return Err(QualityError::BadPlan(format!("stride {stride} must be within 1..={ctx}")));
        }
        if num_tokens < ctx {
            return Err(QualityError::TextTooShort { tokens: num_tokens, ctx });
        }
        let all = (num_tokens - ctx) / stride + 1;
        let windows = chunks.map_or(all, |c| c.min(all));
        if windows == 0 {
            return Err(QualityError::BadPlan("--chunks 0 scores nothing".into()));
        }
        Ok(Self { ctx, stride, windows })
    }

    /// Window `i`'s tokens in the text.
    pub fn window(&self, i: usize) -> Range<usize> {
        i * self.stride..i * self.stride + self.ctx
    }

    /// The first scored row of a window: the middle, or later when windows overlap by more than
    /// half (so that a token is scored once).
    pub fn first_scored(&self) -> usize {
        (self.ctx / 2).max(self.ctx - self.stride)
    }

    /// Scored rows a window: `first_scored() .. ctx - 1` (the last row predicts past the window).
    pub fn scored_rows(&self) -> usize {
        self.ctx - 1 - self.first_scored()
    }

    /// Tokens of all windows, window after window (the first of each replaced by `bos`).
    pub fn window_tokens(&self, text: &[u32], bos: Option<u32>) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.windows * self.ctx);
        for w in 0..self.windows {
            let start = out.len();
            out.extend_from_slice(&text[self.window(w)]);
            if let Some(b) = bos {
                out[start] = b;
            }
        }
        out
    }
}

/// Runs windows through a model; owns the KV cache and the activation buffers they reuse.
#[derive(Debug)]
pub struct Scorer<'m> {
    model: &'m Model,
    cache: KvCache,
    ws: Workspace,
    block_table: Vec<u32>,
    block_size: usize,
    positions: Vec<u32>,
    slots: Vec<i64>,
    rows: Vec<usize>,
}

impl<'m> Scorer<'m> {
    /// A scorer of windows of up to `ctx` tokens with a KV cache of `dtype`.
    pub fn new(model: &'m Model, ctx: usize, dtype: DType) -> Result<Self, QualityError> {
        let block_size = 16;
        let blocks = ctx.div_ceil(block_size);
        let cache = KvCache::new(CacheConfig::new(model.config.block_shape(block_size, dtype), blocks, 0))
            .map_err(|e| QualityError::BadPlan(format!("KV cache of {ctx} tokens: {e}")))?;
        Ok(Self {
            model,
            cache,
            ws: Workspace::default(),
            block_table: (0..blocks as u32).collect(),
            block_size,
            positions: Vec::new(),
            slots: Vec::new(),
            rows: Vec::new(),
        })
    }

    /// The log-probabilities of rows `rows` of `window` (one prefill of the whole window),
    /// `[rows.len(), vocab]` into `out`.
    pub fn log_probs(
        &mut self,
        window: &[u32],
        rows: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), QualityError> {
        let n = window.len();
        if n > self.block_table.len() * self.block_size || rows.end > n {
            return Err(QualityError::BadPlan(format!("window of {n} tokens, rows {rows:?}")));
        }
        self.positions.clear();
        self.positions.extend(0..n as u32);
        self.slots.clear();
        self.slots.extend((0..n as i64).map(|p| {
            i64::from(self.block_table[p as usize / self.block_size]) * self.block_size as i64
                + p % self.block_size as i64
        }));
        self.rows.clear();
        self.rows.extend(rows);
        let qsl = [0, n];
        let lens = [n];
        let input = ModelInput {
            token_ids: window,
            positions: &self.positions,
            slot_mapping: &self.slots,
            attn: attn_kernels::PagedAttnMetadata {
                query_start_loc: &qsl,
                seq_lens: &lens,
                block_tables: &self.block_table,
                max_blocks_per_seq: self.block_table.len(),
                seq_rows: None,
            },
            changed_rows: 0..1,
            sample_indices: &self.rows,
            pool_indices: &[],
            other_groups: &[],
            lora: None,
        };
        let logits = self.model.forward(&input, &mut self.cache, &mut self.ws)?;
        let vocab = self.model.config.vocab_size;
        out.clear();
        out.extend_from_slice(logits);
        out.par_chunks_mut(vocab).for_each(log_softmax_in_place);
        Ok(())
    }
}

/// `row - logsumexp(row)`, the sum in f64.
fn log_softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    for v in row {
        *v = (f64::from(*v) - lse) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_score_their_second_half_once() {
        let plan = WindowPlan::new(1000, 512, None, None).unwrap();
        assert_eq!((plan.windows, plan.first_scored(), plan.scored_rows()), (1, 256, 255));
        let plan = WindowPlan::new(2100, 512, Some(128), Some(3)).unwrap();
        assert_eq!((plan.windows, plan.first_scored(), plan.scored_rows()), (3, 384, 127));
        assert_eq!(plan.window(2), 256..768);
        let toks: Vec<u32> = (0..2100).collect();
        let w = plan.window_tokens(&toks, Some(7));
        assert_eq!((w.len(), w[0], w[1], w[512], w[513]), (3 * 512, 7, 1, 7, 129));
        assert!(matches!(
            WindowPlan::new(100, 512, None, None),
            Err(QualityError::TextTooShort { tokens: 100, ctx: 512 })
        ));
        assert!(WindowPlan::new(1000, 512, Some(0), None).is_err());
        assert!(WindowPlan::new(1000, 512, Some(513), None).is_err());
        assert!(WindowPlan::new(1000, 2, None, None).is_err());
    }

    #[test]
    fn log_softmax_rows_sum_to_one() {
        let mut row = vec![1.0f32, 2.0, 3.0, -50.0];
        log_softmax_in_place(&mut row);
        let total: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((row[2] - row[1] - 1.0).abs() < 1e-6);
    }
}
