//! The flat batch one forward step consumes: every scheduled token of every sequence
//! (prefill chunks and decodes mixed), laid out the way the attention kernels read it.

use std::ops::Range;

use attn_kernels::PagedAttnMetadata;

use crate::lora::LoraBatch;

/// One step's input. Sequence `s` owns flat tokens `attn.query_start_loc[s] ..
/// attn.query_start_loc[s+1]`.
#[derive(Debug, Clone)]
pub struct ModelInput<'a> {
    /// `[num_tokens]` token ids.
    pub token_ids: &'a [u32],
    /// `[num_tokens]` absolute positions (for RoPE).
    pub positions: &'a [u32],
    /// `[num_tokens]` cache slot of each token; negative = padding, not written.
    pub slot_mapping: &'a [i64],
    /// Query offsets, context lengths and block tables, handed to the attention kernels as
    /// they are (the engine's persistent table with a row per running sequence, or a dense
    /// `[num_seqs, max_blocks_per_seq]` table).
    pub attn: PagedAttnMetadata<'a>,
    /// Rows of `attn.block_tables` written since the previous step: a device that keeps its own
    /// copy of the table uploads these (everything, for a table built for one call).
    pub changed_rows: Range<usize>,
    /// Flat token indices whose logits are wanted (usually the last token of each sequence
    /// that samples this step), in output order.
    pub sample_indices: &'a [usize],
    /// Flat token indices whose final-norm hidden states are wanted (pooling: embeddings), in
    /// output order; no logits are computed for them.
    pub pool_indices: &'a [usize],
    /// KV cache groups 1.. (`crate::KvLayout`; group 0's are `slot_mapping` and `attn`): the
    /// same sequences and rows, each group with its own slots and block table.
    pub other_groups: &'a [GroupInput<'a>],
    /// The rows that run under LoRA adapters (`None`: the base model only).
    pub lora: Option<&'a LoraBatch>,
}

/// One more KV cache group's view of a step.
#[derive(Debug, Clone, Copy)]
pub struct GroupInput<'a> {
    /// `[num_tokens]`, as `ModelInput::slot_mapping`.
    pub slot_mapping: &'a [i64],
    /// Rows of `attn.max_blocks_per_seq` entries, read through `attn.seq_rows`.
    pub block_tables: &'a [u32],
}

impl<'a> ModelInput<'a> {
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// KV cache group `g`'s slots and attention metadata (`None` past the last group).
    #[inline]
    pub fn group(&self, g: usize) -> Option<(&'a [i64], PagedAttnMetadata<'a>)> {
        if g == 0 {
            return Some((self.slot_mapping, self.attn));
        }
        let other = self.other_groups.get(g - 1)?;
        Some((other.slot_mapping, PagedAttnMetadata { block_tables: other.block_tables, ..self.attn }))
    }

    /// The checks every device runs before using a batch: lengths agree, token ids are in the
    /// vocabulary, sample rows are in the batch, and the query offsets cover every token. A
    /// device adds its own (cache shape on the CPU, buffer limits on CUDA); the kernels check
    /// the attention metadata against the cache. The message is the device error's text.
    pub fn check(&self, vocab_size: usize) -> Result<(), String> {
        let n = self.num_tokens();
        if let Some(g) = self.other_groups.iter().position(|g| g.slot_mapping.len() != n) {
            return Err(format!(
                "{n} tokens but {} slots in KV cache group {}",
                self.other_groups[g].slot_mapping.len(),
                g + 1
            ));
        }
        if self.positions.len() != n || self.slot_mapping.len() != n {
            return Err(format!(
                "{n} tokens but {} positions and {} slots",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if let Some(&t) = self.token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(format!("token id {t} is outside the vocabulary ({vocab_size})"));
        }
        if let Some(&i) = self.sample_indices.iter().find(|&&i| i >= n) {
            return Err(format!("sample index {i} is outside the batch of {n} tokens"));
        }
        if let Some(&i) = self.pool_indices.iter().find(|&&i| i >= n) {
            return Err(format!("pooled index {i} is outside the batch of {n} tokens"));
        }
        if let Some(end) = self.lora.map(LoraBatch::token_end).filter(|&end| end > n) {
            return Err(format!("a LoRA row {} is outside the batch of {n} tokens", end - 1));
        }
        if self.attn.query_start_loc.last().copied() != Some(n) {
            return Err(format!("query_start_loc must end at the number of tokens ({n})"));
        }
        Ok(())
    }
}

/// Owned buffers behind a [`ModelInput`] with a dense block table (sequence `s` reads row `s`):
/// a batch built for one call (tests, benches, the GPU check's step driver, the CUDA profiling
/// batch), where the engine's runner instead keeps a persistent table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputBuffers {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub slot_mapping: Vec<i64>,
    pub query_start_loc: Vec<usize>,
    pub seq_lens: Vec<usize>,
    /// `[num_seqs, max_blocks_per_seq]`.
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
    pub sample_indices: Vec<usize>,
}

impl InputBuffers {
    /// The input these buffers hold (every row counts as changed: the table is new).
    pub fn input(&self) -> ModelInput<'_> {
        ModelInput {
            token_ids: &self.token_ids,
            positions: &self.positions,
            slot_mapping: &self.slot_mapping,
            attn: PagedAttnMetadata {
                query_start_loc: &self.query_start_loc,
                seq_lens: &self.seq_lens,
                block_tables: &self.block_tables,
                max_blocks_per_seq: self.max_blocks_per_seq,
                seq_rows: None,
            },
            changed_rows: 0..self.seq_lens.len(),
            sample_indices: &self.sample_indices,
            pool_indices: &[],
            other_groups: &[],
            lora: None,
        }
    }
}
