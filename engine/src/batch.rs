//! Turns the scheduler's step plan into the model's flat input (query offsets, context
//! lengths, padded block tables, rows to sample), reusing its buffers every step.

use model::ModelInput;
use scheduler::SchedulerOutput;

use crate::error::EngineError;

/// Per-step buffers derived from a `SchedulerOutput`.
#[derive(Debug, Default)]
pub(crate) struct BatchBuffers {
    query_start_loc: Vec<usize>,
    seq_lens: Vec<usize>,
    block_tables: Vec<u32>,
    max_blocks_per_seq: usize,
    sample_indices: Vec<usize>,
    /// Tokens of this step that are prompt (or recomputed) tokens, for throughput metrics.
    pub prefill_tokens: usize,
}

impl BatchBuffers {
    /// Fills the buffers for `plan`; checks that the sequences' flat ranges tile the batch.
    pub fn build(&mut self, plan: &SchedulerOutput) -> Result<(), EngineError> {
        self.query_start_loc.clear();
        self.seq_lens.clear();
        self.block_tables.clear();
        self.sample_indices.clear();
        self.prefill_tokens = 0;
        self.query_start_loc.push(0);
        self.max_blocks_per_seq = plan.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0);
        for s in &plan.seqs {
            if s.flat.start != *self.query_start_loc.last().unwrap_or(&0) || s.flat.len() != s.tokens.len() {
                return Err(EngineError::Internal("scheduled chunks do not tile the flat batch"));
            }
            self.query_start_loc.push(s.flat.end);
            self.seq_lens.push(s.tokens.end);
            let table = plan.block_table(s);
            self.block_tables.extend_from_slice(table);
            self.block_tables.resize(self.block_tables.len() + self.max_blocks_per_seq - table.len(), 0);
            if s.num_samples > 0 {
                self.sample_indices.push(s.flat.end - 1);
            }
            if s.is_prefill() {
                self.prefill_tokens += s.tokens.len();
            }
        }
        if self.query_start_loc.last() != Some(&plan.token_ids.len()) {
            return Err(EngineError::Internal("scheduled chunks do not cover the flat batch"));
        }
        Ok(())
    }

    pub fn input<'a>(&'a self, plan: &'a SchedulerOutput) -> ModelInput<'a> {
        ModelInput {
            token_ids: &plan.token_ids,
            positions: &plan.positions,
            slot_mapping: &plan.slot_mapping,
            query_start_loc: &self.query_start_loc,
            seq_lens: &self.seq_lens,
            block_tables: &self.block_tables,
            max_blocks_per_seq: self.max_blocks_per_seq,
            sample_indices: &self.sample_indices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler::ScheduledSeq;

    #[test]
    fn builds_offsets_padded_tables_and_sample_rows() {
        let seq =
            |i: u32, tokens: std::ops::Range<usize>, flat: std::ops::Range<usize>, bt, k| ScheduledSeq {
                seq_id: scheduler::SeqId { request: u64::from(i), index: 0 },
                tokens,
                flat,
                block_table: bt,
                num_samples: k,
            };
        let mut plan = SchedulerOutput::default();
        // A prefill chunk that does not sample, a decode, a prompt end with n = 2.
        plan.seqs =
            vec![seq(0, 0..4, 0..4, 0..1, 0), seq(1, 20..21, 4..5, 1..3, 1), seq(2, 0..3, 5..8, 3..4, 2)];
        plan.token_ids = vec![1; 8];
        plan.positions = vec![0; 8];
        plan.slot_mapping = vec![0; 8];
        plan.set_block_tables(vec![7, 3, 4, 9]);
        let mut b = BatchBuffers::default();
        assert!(b.build(&plan).is_ok());
        let input = b.input(&plan);
        assert_eq!(input.query_start_loc, &[0, 4, 5, 8]);
        assert_eq!(input.seq_lens, &[4, 21, 3]);
        assert_eq!(input.max_blocks_per_seq, 2);
        assert_eq!(input.block_tables, &[7, 0, 3, 4, 9, 0]);
        assert_eq!(input.sample_indices, &[4, 7]);
        assert_eq!(b.prefill_tokens, 7);

        let mut broken = plan.clone();
        broken.token_ids.push(1);
        assert!(b.build(&broken).is_err());
    }
}
