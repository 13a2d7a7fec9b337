//! Pooling requests (embeddings): what a client asks for ([`PoolingParams`], with vLLM's
//! `PoolerConfig` names) and each request's pool over its prompt's final-norm hidden states
//! ([`PoolState`]), filled chunk by chunk as the scheduler prefills the prompt.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// How a prompt's hidden states become one vector (vLLM's `pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PoolingType {
    /// The last prompt token's state: what a causal decoder has read the whole prompt into.
    #[default]
    Last,
    /// The mean over every prompt token's state.
    Mean,
}

impl std::str::FromStr for PoolingType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "LAST" => Ok(Self::Last),
            "MEAN" => Ok(Self::Mean),
            other => Err(format!("pooling_type {other:?}: LAST or MEAN")),
        }
    }
}

/// What a pooling request computes: the pooling, then (matryoshka-style) the first
/// `dimensions` values, then the L2 normalisation — the order vLLM's embedding head applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolingParams {
    pub pooling_type: PoolingType,
    pub normalize: bool,
    /// Keep only the first this many values (at most the model's hidden size).
    pub dimensions: Option<usize>,
}

impl Default for PoolingParams {
    fn default() -> Self {
        Self { pooling_type: PoolingType::Last, normalize: true, dimensions: None }
    }
}

impl PoolingParams {
    /// The parameters checked against a model of `hidden` dimensions.
    pub fn check(&self, hidden: usize) -> Result<(), String> {
        match self.dimensions {
            Some(0) => Err("dimensions must be at least 1".to_owned()),
            Some(d) if d > hidden => {
                Err(format!("dimensions {d} is more than the model's embedding size ({hidden})"))
            }
            _ => Ok(()),
        }
    }
}

/// One request's pool: the sum (mean pooling) or the last state of its prompt's rows so far.
#[derive(Debug)]
pub(crate) struct PoolState {
    pub params: PoolingParams,
    prompt_len: usize,
    /// The running sum (mean) or the last row (last), in f64 so that long prompts sum exactly
    /// enough.
    acc: Vec<f64>,
    /// The next prompt position not yet pooled: a position computed again (preemption by
    /// recompute) is never added twice.
    next: usize,
}

impl PoolState {
    pub fn new(params: PoolingParams, prompt_len: usize, hidden: usize) -> Self {
        Self { params, prompt_len, acc: vec![0.0; hidden], next: 0 }
    }

    /// The positions of a chunk computing `tokens` whose states this pool takes next: for mean
    /// pooling every prompt position from the next one not yet pooled, for last pooling the
    /// prompt's last position once. Empty when the chunk holds none (or leaves a gap, which
    /// [`PoolState::complete`] then never reaches).
    pub fn wanted(&self, tokens: Range<usize>) -> Range<usize> {
        let end = tokens.end.min(self.prompt_len);
        let from = match self.params.pooling_type {
            PoolingType::Mean => self.next.max(tokens.start),
            PoolingType::Last => (self.prompt_len.saturating_sub(1)).max(self.next),
        };
        let gap = self.params.pooling_type == PoolingType::Mean && tokens.start > self.next;
        let from = from.max(tokens.start);
        if gap || from >= end { 0..0 } else { from..end }
    }

    /// Adds the states of positions `first ..` (one row each, the model's hidden size wide),
    /// as [`PoolState::wanted`] named them.
    pub fn add<'a>(
        &mut self,
        first: usize,
        rows: impl Iterator<Item = &'a [f32]>,
    ) -> Result<(), &'static str> {
        let mean = self.params.pooling_type == PoolingType::Mean;
        if mean && first != self.next {
            return Err("pooled rows out of order");
        }
        for row in rows {
            if row.len() != self.acc.len() {
                return Err("a pooled row of the wrong width");
            }
            if mean {
                self.acc.iter_mut().zip(row).for_each(|(a, &x)| *a += f64::from(x));
                self.next += 1;
            } else {
                self.acc.iter_mut().zip(row).for_each(|(a, &x)| *a = f64::from(x));
                self.next = self.prompt_len;
            }
        }
        Ok(())
    }

    /// Whether every position the pooling needs has been added.
    pub fn complete(&self) -> bool {
        self.next >= self.prompt_len
    }

    /// The embedding: pooled, cut to `dimensions`, normalised.
    pub fn embedding(&self) -> Vec<f32> {
        let count = match self.params.pooling_type {
            PoolingType::Mean => self.prompt_len.max(1) as f64,
            PoolingType::Last => 1.0,
        };
        let keep = self.params.dimensions.unwrap_or(self.acc.len()).min(self.acc.len());
        let mut v: Vec<f64> = self.acc[..keep].iter().map(|a| a / count).collect();
        if self.params.normalize {
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            // As torch's `F.normalize`: the norm is floored at 1e-12.
            let norm = norm.max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v.into_iter().map(|x| x as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pooling_type: PoolingType) -> PoolingParams {
        PoolingParams { pooling_type, normalize: false, dimensions: None }
    }

    fn rows(values: &[f32]) -> Vec<Vec<f32>> {
        values.iter().map(|&v| vec![v, 2.0 * v]).collect()
    }

    #[test]
    fn a_mean_pool_takes_each_position_once_across_chunks_and_recomputes() {
        let mut pool = PoolState::new(params(PoolingType::Mean), 5, 2);
        let states = rows(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(pool.wanted(0..3), 0..3);
        pool.add(0, states[0..3].iter().map(Vec::as_slice)).unwrap();
        // Preempted and recomputed from 0: only the positions not yet pooled are taken.
        assert_eq!(pool.wanted(0..4), 3..4);
        pool.add(3, states[3..4].iter().map(Vec::as_slice)).unwrap();
        assert!(!pool.complete());
        // A chunk reaching past the prompt's end: its prompt positions only.
        assert_eq!(pool.wanted(4..6), 4..5);
        pool.add(4, states[4..5].iter().map(Vec::as_slice)).unwrap();
        assert!(pool.complete());
        // The decode after the prompt holds none.
        assert_eq!(pool.wanted(5..6), 0..0);
        assert_eq!(pool.embedding(), vec![3.0, 6.0]);
    }

    #[test]
    fn a_mean_pool_refuses_a_gap_and_rows_out_of_order() {
        let mut pool = PoolState::new(params(PoolingType::Mean), 8, 2);
        assert_eq!(pool.wanted(2..5), 0..0, "positions 0 and 1 were never computed");
        assert!(pool.add(1, rows(&[1.0]).iter().map(Vec::as_slice)).is_err());
        assert!(pool.add(0, [[1.0f32].as_slice()].into_iter()).is_err(), "a row of the wrong width");
    }

    #[test]
    fn a_last_pool_takes_only_the_prompts_last_position() {
        let mut pool = PoolState::new(params(PoolingType::Last), 5, 2);
        assert_eq!(pool.wanted(0..3), 0..0);
        assert_eq!(pool.wanted(3..5), 4..5);
        // A full prefix-cache hit leaves a one-token chunk: the last position.
        assert_eq!(pool.wanted(4..5), 4..5);
        pool.add(4, rows(&[7.0]).iter().map(Vec::as_slice)).unwrap();
        assert!(pool.complete());
        assert_eq!(pool.wanted(4..5), 0..0);
        assert_eq!(pool.embedding(), vec![7.0, 14.0]);
    }

    #[test]
    fn dimensions_cut_before_the_norm() {
        let cut = PoolingParams { pooling_type: PoolingType::Last, normalize: true, dimensions: Some(2) };
        let mut pool = PoolState::new(cut, 1, 3);
        pool.add(0, [[3.0f32, 4.0, 100.0].as_slice()].into_iter()).unwrap();
        assert_eq!(pool.embedding(), vec![0.6, 0.8]);
        assert!(cut.check(3).is_ok() && cut.check(1).is_err());
        assert!(PoolingParams { dimensions: Some(0), ..cut }.check(3).is_err());
    }

    #[test]
    fn pooling_types_parse_as_vllm_names_them() {
        assert_eq!("MEAN".parse::<PoolingType>(), Ok(PoolingType::Mean));
        assert_eq!("last".parse::<PoolingType>(), Ok(PoolingType::Last));
        assert!("CLS".parse::<PoolingType>().is_err());
        let p: PoolingParams = serde_json::from_str(r#"{"pooling_type": "MEAN"}"#).unwrap();
        assert_eq!(p, PoolingParams { pooling_type: PoolingType::Mean, ..PoolingParams::default() });
    }
}
