//! The model runner: the model, its KV cache, its scratch and the engine's one block table on
//! one device, behind what a step needs (block moves, table deltas, forward, the model's
//! config), so the engine's step loop never branches on where it runs and never reaches below
//! `model`.
//!
//! - CPU: the host [`crate::Model`] (weights in their storage formats), a host [`KvCache`], a
//!   [`Workspace`].
//! - CUDA (`cuda` feature): [`crate::cuda::CudaModel`] and a [`kv_cache::cuda::CudaKvCache`],
//!   sized like vLLM: after the weights are uploaded, one profiling forward of
//!   `max_num_batched_tokens` dummy tokens, then
//!   `num_blocks = (total × gpu_memory_utilization − used) / bytes_per_block`
//!   ([`kv_cache::cuda::blocks_for_memory`]).
//!
//! The block table ([`BlockTables`]) is persistent: the scheduler names each sequence's row and
//! sends only the ids the row lacks (`write_table_row`), and `forward` hands the table to the
//! attention kernels as it is.

mod block_table;
#[cfg(feature = "cuda")]
mod cuda;

use attn_kernels::backend::{Cpu, KernelBackend};
use kv_cache::KvCache;
pub use kv_cache::{BlockShape, CacheConfig, DType, Device};

pub use block_table::BlockTables;

use crate::ModelConfig;
use crate::decoder::Model;
use crate::error::{ModelError, Result};
use crate::forward::cpu::Workspace;
use crate::input::{GroupInput, ModelInput};

/// How big the device KV cache is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheSize {
    /// Exactly this many blocks.
    Blocks(usize),
    /// As many blocks as fit in this many bytes. On CUDA the budget comes from the device
    /// instead, like vLLM: `total × gpu_memory_utilization − used after a profiling forward`.
    Bytes(usize),
}

/// What the runner is built for: the device, the cache's size and layout, and the largest step.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerConfig {
    pub device: Device,
    pub kv_cache: KvCacheSize,
    /// Element type of the KV cache (on CUDA also of the weights and activations).
    pub kv_dtype: DType,
    pub block_size: usize,
    pub max_model_len: usize,
    /// Host swap space (0 when preemption never swaps).
    pub swap_bytes: usize,
    /// The largest step: tokens and sequences (CUDA sizes its buffers and profiles with them).
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    /// CUDA only, with [`KvCacheSize::Bytes`].
    pub gpu_memory_utilization: f64,
}

/// One step's batch as planned: the flat tokens and the attention metadata; the block table is
/// the runner's own.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    pub token_ids: &'a [u32],
    pub positions: &'a [u32],
    pub slot_mapping: &'a [i64],
    /// The slots of KV cache groups 1.. (`Runner::kv_group_windows`), as `slot_mapping`.
    pub group_slot_mapping: &'a [Vec<i64>],
    pub query_start_loc: &'a [usize],
    pub seq_lens: &'a [usize],
    /// Each sequence's row of the block table.
    pub seq_rows: &'a [u32],
    pub sample_indices: &'a [usize],
    /// The rows whose final-norm hidden states the step returns ([`Runner::pooled`]).
    pub pool_indices: &'a [usize],
    /// The rows that run under LoRA adapters (the CPU device only).
    pub lora: Option<&'a crate::LoraBatch>,
}

/// The model and its cache on the CPU.
#[derive(Debug)]
struct CpuRunner {
    model: Model,
    cache: KvCache,
    workspace: Workspace,
}

/// The device half of the runner. One per engine, built once and never moved in the step
/// loop, so the CPU variant stays inline (no pointer chase on the hot path).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum OnDevice {
    Cpu(CpuRunner),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaRunner>),
}

/// The model, its KV cache and the block tables (one per KV cache group) on one device.
#[derive(Debug)]
pub struct Runner {
    on: OnDevice,
    /// One per KV cache group, group 0 first.
    tables: Vec<BlockTables>,
    /// Per KV cache group, its sliding window.
    group_windows: Vec<Option<usize>>,
    cache_config: CacheConfig,
    /// The greedy tokens of the last `forward_greedy` on the CPU.
    greedy: Vec<u32>,
    /// The logits of a step computed in several passes (`forward`).
    passes: Vec<f32>,
    /// Most logit rows one pass computes, below what the device holds (`limit_logit_rows`).
    row_limit: Option<usize>,
}

/// Bytes of one KV cache block of a model of `config` on `device`, as [`Runner::new`] lays the
/// cache out ([`kv_block_shape`]).
pub fn kv_bytes_per_block(config: &ModelConfig, device: Device, block_size: usize, dtype: DType) -> usize {
    kv_block_shape(config, device, block_size, dtype).bytes_per_block()
}

/// The KV cache block of a model of `config` on `device`: the CPU keeps one block table per
/// attention kind and frees what leaves a window, so its cache holds the hybrid layout's layer
/// slots; CUDA serves no context past a window, so one group of every layer serves it.
fn kv_block_shape(config: &ModelConfig, device: Device, block_size: usize, dtype: DType) -> BlockShape {
    let mut shape = config.block_shape(block_size, dtype);
    if device.is_cpu() {
        shape.num_layers = config.hybrid_kv_layout().num_slots();
    }
    shape
}

impl Runner {
    /// Puts `model` on `config.device` with a KV cache sized by `config`.
    pub fn new(mut model: Model, config: &RunnerConfig) -> Result<Self> {
        let shape = kv_block_shape(&model.config, config.device, config.block_size, config.kv_dtype);
        shape.validate()?;
        if config.device.is_cpu() {
            model.use_hybrid_kv_layout();
        }
        let group_windows = model.kv_layout().group_windows().to_vec();
        let (on, cache_config) = match config.device {
            Device::Cpu => {
                if config.kv_dtype.is_fp8() {
                    return Err(ModelError::Device(format!(
                        "kv_cache_dtype {} on cpu: fp8 caches are CUDA's; the CPU's 8-bit KV cache is int8",
                        config.kv_dtype
                    )));
                }
                let cache_config = match config.kv_cache {
                    KvCacheSize::Bytes(b) => {
                        CacheConfig::from_memory_budget(shape, b, config.swap_bytes, config.max_model_len)?
                    }
                    KvCacheSize::Blocks(n) => {
                        CacheConfig::new(shape, n, config.swap_bytes / shape.bytes_per_block())
                    }
                };
                let cache = KvCache::new(cache_config)?;
                (OnDevice::Cpu(CpuRunner { model, cache, workspace: Workspace::default() }), cache_config)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda { ordinal } => {
                let (runner, cache_config) = cuda::CudaRunner::new(model, shape, config, ordinal)?;
                (OnDevice::Cuda(Box::new(runner)), cache_config)
            }
            other => return Err(needs_the_cuda_feature(other)),
        };
        let stride = config.max_model_len.div_ceil(config.block_size);
        let tables = group_windows.iter().map(|_| BlockTables::new(stride)).collect();
        Ok(Self {
            on,
            tables,
            group_windows,
            cache_config,
            greedy: Vec::new(),
            passes: Vec::new(),
            row_limit: None,
        })
    }

    pub fn model_config(&self) -> &ModelConfig {
        match &self.on {
            OnDevice::Cpu(c) => &c.model.config,
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(c) => c.model.config(),
        }
    }

    /// Bytes of weights a decode step reads: on the CPU every matrix once in its stored format;
    /// on CUDA the device copies of the weights.
    pub fn weight_bytes_per_step(&self) -> usize {
        match &self.on {
            OnDevice::Cpu(c) => c.model.weight_bytes_per_step(),
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(c) => c.model.weight_bytes(),
        }
    }

    /// The KV cache's final configuration (its block counts feed the scheduler).
    pub fn cache_config(&self) -> &CacheConfig {
        &self.cache_config
    }

    /// The KV cache groups the scheduler must keep tables for: per group, its sliding window.
    pub fn kv_group_windows(&self) -> &[Option<usize>] {
        &self.group_windows
    }

    /// Applies one sequence's block-table delta: entries `from ..` of row `row` become `ids`,
    /// which hold each group's entries in turn (equal lengths).
    pub fn write_table_row(&mut self, row: u32, from: usize, ids: &[u32]) -> Result<()> {
        if let [table] = self.tables.as_mut_slice() {
            return table.write(row, from, ids);
        }
        let groups = self.tables.len();
        if !ids.len().is_multiple_of(groups) {
            return Err(ModelError::InvalidInput(format!(
                "a block-table delta of {} ids for {groups} KV cache groups",
                ids.len()
            )));
        }
        let per_group = ids.len() / groups;
        for (table, ids) in self.tables.iter_mut().zip(ids.chunks_exact(per_group.max(1))) {
            table.write(row, from, ids)?;
        }
        Ok(())
    }

    /// A step's swap-outs, swap-ins and copy-on-write copies, in that order.
    pub fn move_blocks(
        &mut self,
        swap_out: &[(u32, u32)],
        swap_in: &[(u32, u32)],
        copies: &[(u32, u32)],
    ) -> Result<()> {
        match &mut self.on {
            OnDevice::Cpu(c) => Ok(Cpu.move_blocks(&mut c.cache, swap_out, swap_in, copies)?),
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(c) => {
                let kernels = &**c.model.kernels();
                kernels.move_blocks(&mut c.cache, swap_out, swap_in, copies).map_err(cuda::cuda_err)
            }
        }
    }

    /// Most rows of logits one forward pass computes: the CPU any number; a CUDA model's buffers
    /// hold `max_num_seqs` rows.
    pub fn max_logit_rows(&self) -> Option<usize> {
        let device: Option<usize> = match &self.on {
            OnDevice::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(c) => Some(c.model.limits().max_samples.max(1)),
        };
        match (device, self.row_limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        }
    }

    /// Caps the rows of logits one pass computes below the device's own limit (at least 1), so
    /// that a machine without that limit can run the passes `forward` then takes.
    pub fn limit_logit_rows(&mut self, rows: usize) {
        self.row_limit = Some(rows.max(1));
    }

    /// One forward step over the runner's block table; logits `[sample_indices.len(), vocab]`
    /// (f32, host memory). More rows than one pass computes (a request's prompt logprobs) take
    /// several passes over the same step, each with the next rows: a pass writes the same keys
    /// and values into the same slots, so the cache and every row's logits are as one pass's.
    pub fn forward(&mut self, step: &StepInput<'_>) -> Result<&[f32]> {
        match self.max_logit_rows() {
            Some(limit) if step.sample_indices.len() > limit => {
                let mut all = std::mem::take(&mut self.passes);
                all.clear();
                for rows in step.sample_indices.chunks(limit) {
                    match self.forward_pass(&StepInput { sample_indices: rows, ..*step }) {
                        Ok(logits) => all.extend_from_slice(logits),
                        Err(e) => {
                            self.passes = all;
                            return Err(e);
                        }
                    }
                }
                self.passes = all;
                Ok(&self.passes)
            }
            _ => self.forward_pass(step),
        }
    }

    /// One pass of the forward over the step, logits of its sampled rows.
    fn forward_pass(&mut self, step: &StepInput<'_>) -> Result<&[f32]> {
        if !step.pool_indices.is_empty() && !self.on.is_cpu() {
            return Err(pooling_is_the_cpus());
        }
        let changed_rows = take_changed(&mut self.tables);
        let others = other_groups(&self.tables, step)?;
        let input = model_input(&self.tables[0], step, changed_rows, &others);
        match &mut self.on {
            OnDevice::Cpu(c) => c.model.forward(&input, &mut c.cache, &mut c.workspace),
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(c) => c.forward(&input),
        }
    }

    /// The final-norm hidden states of the last forward's pooled rows, `[pool_indices.len(),
    /// hidden]` (CPU: the workspace's; a forward with pooled rows on another device fails).
    pub fn pooled(&self, rows: usize) -> &[f32] {
        match &self.on {
            OnDevice::Cpu(c) => c.workspace.pooled(rows * c.model.config.hidden_size),
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(_) => &[],
        }
    }

    /// One forward step sampled greedily: the greedy token of each sampled row (`u32::MAX` where
    /// a row has none), so a device copies back one id per row instead of its logits. `argmax`
    /// is the sampler's own rule, applied to the host logits on the CPU; the CUDA kernel
    /// (`argmax_rows_f32`) implements the same rule: the first largest value, NaN never wins,
    /// none above -inf gives none.
    pub fn forward_greedy(
        &mut self,
        step: &StepInput<'_>,
        argmax: fn(&[f32]) -> Option<u32>,
    ) -> Result<&[u32]> {
        if !step.pool_indices.is_empty() && !self.on.is_cpu() {
            return Err(pooling_is_the_cpus());
        }
        let changed_rows = take_changed(&mut self.tables);
        let others = other_groups(&self.tables, step)?;
        let input = model_input(&self.tables[0], step, changed_rows, &others);
        match &mut self.on {
            OnDevice::Cpu(c) => {
                let logits = c.model.forward(&input, &mut c.cache, &mut c.workspace)?;
                let vocab = c.model.config.vocab_size.max(1);
                self.greedy.clear();
                self.greedy.extend(logits.chunks_exact(vocab).map(|row| argmax(row).unwrap_or(u32::MAX)));
                Ok(&self.greedy)
            }
            #[cfg(feature = "cuda")]
            OnDevice::Cuda(c) => c.forward_greedy(&input),
        }
    }
}

impl OnDevice {
    fn is_cpu(&self) -> bool {
        matches!(self, Self::Cpu(_))
    }
}

/// What a pooled row asks of a device that computes none.
fn pooling_is_the_cpus() -> ModelError {
    ModelError::Device("pooling (embeddings) runs on the CPU device; CUDA computes no pooled rows".into())
}

/// The rows of group 0 written since the last step (a device uploads only those); the other
/// groups' tables are read on the host.
fn take_changed(tables: &mut [BlockTables]) -> std::ops::Range<usize> {
    let changed = tables.first_mut().map_or(0..0, BlockTables::take_changed);
    for t in tables.iter_mut().skip(1) {
        t.take_changed();
    }
    changed
}

/// KV cache groups 1..'s slots and tables for a step (none for a model of one group).
fn other_groups<'a>(tables: &'a [BlockTables], step: &StepInput<'a>) -> Result<Vec<GroupInput<'a>>> {
    let rest = tables.get(1..).unwrap_or(&[]);
    if rest.len() != step.group_slot_mapping.len() {
        return Err(ModelError::InvalidInput(format!(
            "the step has slots for {} KV cache groups, the runner {}",
            step.group_slot_mapping.len() + 1,
            rest.len() + 1
        )));
    }
    Ok(rest
        .iter()
        .zip(step.group_slot_mapping)
        .map(|(t, slots)| GroupInput { slot_mapping: slots, block_tables: t.entries() })
        .collect())
}

/// A step's model input over the runner's tables.
fn model_input<'a>(
    tables: &'a BlockTables,
    step: &StepInput<'a>,
    changed_rows: std::ops::Range<usize>,
    others: &'a [GroupInput<'a>],
) -> ModelInput<'a> {
    ModelInput {
        token_ids: step.token_ids,
        positions: step.positions,
        slot_mapping: step.slot_mapping,
        attn: tables.metadata(step.query_start_loc, step.seq_lens, step.seq_rows),
        changed_rows,
        sample_indices: step.sample_indices,
        pool_indices: step.pool_indices,
        other_groups: others,
        lora: step.lora,
    }
}

/// What opening `device` says in a build without the `cuda` feature.
fn needs_the_cuda_feature(device: Device) -> ModelError {
    ModelError::Device(format!(
        "device {device} needs a build with the `cuda` feature (cargo build --features engine/cuda)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test build turns the `cuda` feature on (one build for the CPU and CUDA host tests),
    /// so the refusal of a build without it is checked through its message here.
    #[test]
    fn a_build_without_cuda_names_the_feature_and_how_to_turn_it_on() {
        let message = needs_the_cuda_feature(Device::Cuda { ordinal: 1 }).to_string();
        assert!(message.contains("cuda:1") && message.contains("`cuda` feature"), "{message}");
        assert!(message.contains("--features engine/cuda"), "{message}");
    }
}
