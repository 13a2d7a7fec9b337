//! What one CUDA step may hold (its activation buffers are allocated once for the largest batch,
//! so a step never allocates them) and the host-side check of a batch against those limits and
//! the model, done before anything is uploaded.

use super::error::CudaModelError;
use crate::config::ModelConfig;
use crate::input::ModelInput;

/// The largest step the device buffers are sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Tokens in one step (the scheduler's `max_num_batched_tokens`).
    pub max_tokens: usize,
    /// Rows of logits in one step (at most one per sequence: `max_num_seqs`).
    pub max_samples: usize,
    /// Longest context (positions in the rotary table, partitions of the split attention).
    pub max_model_len: usize,
}

/// Checks `input` as every device does ([`ModelInput::check`]), then against `limits`
/// (tokens, sample rows, positions).
pub fn check_batch(
    input: &ModelInput<'_>,
    limits: &BatchLimits,
    config: &ModelConfig,
) -> Result<(), CudaModelError> {
    let (n, samples) = (input.num_tokens(), input.sample_indices.len());
    let bad = |m: String| Err(CudaModelError::InvalidInput(m));
    input.check(config.vocab_size).map_err(CudaModelError::InvalidInput)?;
    if !input.other_groups.is_empty() {
        // The CUDA runner keeps every layer in one group (it serves no context past a window).
        return bad(format!("{} KV cache groups, CUDA serves one", input.other_groups.len() + 1));
    }
    if input.lora.is_some_and(|l| !l.is_empty()) {
        return bad("LoRA adapters run on the CPU device; CUDA serves the base model only".into());
    }
    if n > limits.max_tokens {
        return bad(format!("{n} tokens in one step, the device buffers hold {}", limits.max_tokens));
    }
    if samples > limits.max_samples {
        return bad(format!(
            "{samples} sampled rows in one step, the device buffers hold {}",
            limits.max_samples
        ));
    }
    if let Some(&p) = input.positions.iter().find(|&&p| p as usize >= limits.max_model_len) {
        return bad(format!("position {p} is beyond the rotary table ({} positions)", limits.max_model_len));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::test_config;

    #[test]
    fn batches_beyond_the_limits_or_the_model_are_rejected() {
        let limits = BatchLimits { max_tokens: 3, max_samples: 1, max_model_len: 8 };
        let c = test_config();
        let attn = attn_kernels::PagedAttnMetadata {
            query_start_loc: &[0, 3],
            seq_lens: &[3],
            block_tables: &[0],
            max_blocks_per_seq: 1,
            seq_rows: None,
        };
        let ok = ModelInput {
            token_ids: &[1, 2, 3],
            positions: &[0, 1, 2],
            slot_mapping: &[0, 1, 2],
            attn,
            changed_rows: 0..1,
            sample_indices: &[2],
            pool_indices: &[],
            other_groups: &[],
            lora: None,
        };
        assert!(check_batch(&ok, &limits, &c).is_ok());
        let cases = [
            ModelInput {
                token_ids: &[1, 2, 3, 4],
                positions: &[0, 1, 2, 3],
                slot_mapping: &[0, 1, 2, 3],
                attn: attn_kernels::PagedAttnMetadata { query_start_loc: &[0, 4], ..attn },
                ..ok.clone()
            },
            ModelInput { positions: &[0, 1], ..ok.clone() },
            ModelInput { token_ids: &[1, 2, 10], ..ok.clone() },
            ModelInput { positions: &[0, 1, 8], ..ok.clone() },
            ModelInput { sample_indices: &[1, 2], ..ok.clone() },
            ModelInput { sample_indices: &[3], ..ok.clone() },
            ModelInput {
                attn: attn_kernels::PagedAttnMetadata { query_start_loc: &[0, 2], ..attn },
                ..ok.clone()
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            assert!(check_batch(case, &limits, &c).is_err(), "case {i}");
        }
    }
}
