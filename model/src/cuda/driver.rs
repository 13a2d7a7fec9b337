//! A host-side driver of chunked prefill and decode over a paged cache, without a scheduler:
//! it hands out blocks in order, builds each step's flat [`ModelInput`] from per-sequence chunk
//! sizes, and appends sampled tokens. The GPU check runs the CPU and the CUDA forward through
//! the same steps and compares their logits (`LogitTolerance`).

use crate::input::InputBuffers;

/// One sequence: its known tokens, how many of them the cache holds, its blocks.
#[derive(Debug, Clone)]
struct Seq {
    tokens: Vec<u32>,
    cached: usize,
    blocks: Vec<u32>,
}

/// The batch of one step: its buffers ([`InputBuffers::input`] borrows them) and the sequence
/// each sampled row belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepBatch {
    pub buffers: InputBuffers,
    pub sampled_seqs: Vec<usize>,
}

impl std::ops::Deref for StepBatch {
    type Target = InputBuffers;
    fn deref(&self) -> &InputBuffers {
        &self.buffers
    }
}

/// Sequences sharing one cache of `block_size`-token blocks, handed out in the order the
/// sequences grow (so interleaved sequences own interleaved blocks).
#[derive(Debug, Clone)]
pub struct StepDriver {
    block_size: usize,
    seqs: Vec<Seq>,
    next_block: u32,
}

impl StepDriver {
    pub fn new(prompts: Vec<Vec<u32>>, block_size: usize) -> Self {
        let seqs = prompts.into_iter().map(|tokens| Seq { tokens, cached: 0, blocks: Vec::new() }).collect();
        StepDriver { block_size: block_size.max(1), seqs, next_block: 0 }
    }

    /// Blocks handed out so far (the cache needs at least this many).
    pub fn blocks_used(&self) -> usize {
        self.next_block as usize
    }

    /// Tokens of sequence `s` the driver knows (prompt and appended).
    pub fn tokens(&self, s: usize) -> &[u32] {
        self.seqs.get(s).map_or(&[], |q| &q.tokens)
    }

    /// A step with up to `chunks[s]` not yet cached tokens of every sequence `s` (0 skips it);
    /// a sequence whose known tokens are all covered by the step is sampled.
    pub fn step(&mut self, chunks: &[usize]) -> StepBatch {
        let bs = self.block_size;
        let mut b = InputBuffers { query_start_loc: vec![0], ..InputBuffers::default() };
        let mut sampled_seqs = Vec::new();
        let mut rows: Vec<Vec<u32>> = Vec::new();
        for (s, seq) in self.seqs.iter_mut().enumerate() {
            let n = chunks.get(s).copied().unwrap_or(0).min(seq.tokens.len() - seq.cached);
            if n == 0 {
                continue;
            }
            let end = seq.cached + n;
            while seq.blocks.len() * bs < end {
                seq.blocks.push(self.next_block);
                self.next_block += 1;
            }
            for i in seq.cached..end {
                b.token_ids.push(seq.tokens[i]);
                b.positions.push(i as u32);
                b.slot_mapping.push((seq.blocks[i / bs] as usize * bs + i % bs) as i64);
            }
            seq.cached = end;
            b.query_start_loc.push(b.token_ids.len());
            b.seq_lens.push(end);
            rows.push(seq.blocks.clone());
            if end == seq.tokens.len() {
                b.sample_indices.push(b.token_ids.len() - 1);
                sampled_seqs.push(s);
            }
        }
        b.max_blocks_per_seq = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
        for r in &rows {
            b.block_tables.extend_from_slice(r);
            b.block_tables.resize(b.block_tables.len() + b.max_blocks_per_seq - r.len(), 0);
        }
        StepBatch { buffers: b, sampled_seqs }
    }

    /// Appends a sampled token to sequence `s`.
    pub fn append(&mut self, s: usize, token: u32) {
        if let Some(q) = self.seqs.get_mut(s) {
            q.tokens.push(token);
        }
    }
}

/// Index of the largest value (the greedy token of a row of logits).
pub fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_batch_and_sample_finished_prompts() {
        let mut d = StepDriver::new(vec![vec![1; 20], vec![2; 5]], 8);
        let b = d.step(&[12, 5]);
        assert_eq!(b.query_start_loc, vec![0, 12, 17]);
        assert_eq!(b.seq_lens, vec![12, 5]);
        assert_eq!(b.sample_indices, vec![16]);
        assert_eq!(b.sampled_seqs, vec![1]);
        assert_eq!(b.max_blocks_per_seq, 2);
        assert_eq!(b.block_tables, vec![0, 1, 2, 0]);
        assert_eq!(b.slot_mapping[8], 8);
        assert_eq!(b.slot_mapping[12], 16);
        d.append(1, 9);
        let b = d.step(&[100, 1]);
        assert_eq!(b.token_ids.len(), 9);
        assert_eq!(b.positions[..2], [12, 13]);
        assert_eq!(b.token_ids[8], 9);
        assert_eq!(b.seq_lens, vec![20, 6]);
        assert_eq!(b.sample_indices, vec![7, 8]);
        assert_eq!(d.blocks_used(), 4);
        assert_eq!(d.tokens(1).len(), 6);
    }

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[0.0, 3.0, -1.0, 3.0]), 1);
        assert_eq!(argmax(&[-2.0, -1.0]), 1);
    }
}
