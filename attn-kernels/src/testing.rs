//! Owned batch metadata for the kernels' tests, benches and the GPU check: the vectors a test
//! batch is built into, lent to a kernel as a [`PagedAttnMetadata`].

use crate::PagedAttnMetadata;

/// The owned form of [`PagedAttnMetadata`]: same fields, same meaning.
#[derive(Debug, Clone, Default)]
pub struct OwnedMetadata {
    pub query_start_loc: Vec<usize>,
    pub seq_lens: Vec<usize>,
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
    pub seq_rows: Option<Vec<u32>>,
}

impl OwnedMetadata {
    /// The metadata as the kernels take it.
    pub fn as_meta(&self) -> PagedAttnMetadata<'_> {
        PagedAttnMetadata {
            query_start_loc: &self.query_start_loc,
            seq_lens: &self.seq_lens,
            block_tables: &self.block_tables,
            max_blocks_per_seq: self.max_blocks_per_seq,
            seq_rows: self.seq_rows.as_deref(),
        }
    }

    /// The slot of token `pos` of sequence `s`, through the row it reads.
    pub fn slot(&self, s: usize, pos: usize, block_size: usize) -> usize {
        let row = self.as_meta().row(s) * self.max_blocks_per_seq;
        self.block_tables[row + pos / block_size] as usize * block_size + pos % block_size
    }
}

/// `query_start_loc` of sequences with these query lengths: their prefix sums, from 0.
pub fn query_start_loc(query_lens: impl IntoIterator<Item = usize>) -> Vec<usize> {
    let mut starts = vec![0];
    for q in query_lens {
        starts.push(starts.last().copied().unwrap_or(0) + q);
    }
    starts
}
