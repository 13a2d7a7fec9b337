//! The CUDA kernel sources and the one table of template instantiations that both the runtime
//! loader and `cargo xtask cuda-check` compile.
//!
//! The `.cu` files define templates plus instantiation macros; a [`Program`] is the shared
//! header, the source files and the macro calls of one configuration, so the runtime compiles
//! only what a model needs (one cache dtype, head size, block size) while the check compiles
//! every configuration the code can ask for.

use std::fmt::Write as _;

use kv_cache::DType;

use crate::meta::{
    CUDA_CACHE_DTYPES, SUPPORTED_BLOCK_SIZES as BLOCK_SIZES, SUPPORTED_HEAD_SIZES as HEAD_SIZES,
};

/// Every kernel source file (`.cu` or header) as `(file, code)`, in the order programs
/// concatenate them.
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("attention_prefill.cu", include_str!("kernels/attention_prefill.cu")),
    ("cache.cu", include_str!("kernels/cache.cu")),
    ("model.cu", include_str!("kernels/model.cu")),
];

/// Tokens per partition of the v2 (split-context) decode kernel; must match `attention.cu`.
pub const PARTITION_SIZE: usize = 512;
/// Threads per tiled prefill thread block; must match `PF_NUM_THREADS` in `attention_prefill.cu`.
pub const PREFILL_THREADS: u32 = 128;
/// Keys per key tile of the tiled prefill kernel; must match `PF_KEYS` in `attention_prefill.cu`.
pub const PREFILL_KEYS: usize = 32;
/// Threads per attention thread block; must match `PA_NUM_THREADS` in `attention.cu`.
pub const ATTENTION_THREADS: u32 = 128;
/// Warps per attention thread block.
pub const ATTENTION_WARPS: usize = 4;
/// Query heads per thread block the kernels come in (largest first).
const QPK_CHOICES: [usize; 4] = [8, 4, 2, 1];
/// Per-thread P·V accumulators allowed (`V_ITERS * QPK`), so that no instantiation spills.
const MAX_VALUE_ACCUMULATORS: usize = 20;

/// CUDA type and short name of a cache/activation dtype.
pub const fn cuda_type(dtype: DType) -> (&'static str, &'static str) {
    match dtype {
        DType::F32 => ("f32", "float"),
        DType::F16 => ("f16", "__half"),
        DType::BF16 => ("bf16", "__nv_bfloat16"),
        DType::Int8 => ("int8", "int8_t"),
        DType::Fp8E4M3 => ("fp8_e4m3", "__nv_fp8_e4m3"),
        DType::Fp8E5M2 => ("fp8_e5m2", "__nv_fp8_e5m2"),
    }
}

/// Which attention kernel variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttentionVariant {
    /// The whole context in one thread block.
    V1,
    /// 512-token partitions merged by the reduce kernel.
    V2,
    /// Varlen batches: the tiled prefill kernel over the sequences of more than one query token,
    /// the decode kernel (v1 or v2, chosen for the decode tokens alone) over the others.
    Tiled,
}

/// The shape parameters an attention program is specialised for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttentionConfig {
    pub dtype: DType,
    pub head_size: usize,
    pub block_size: usize,
}

impl AttentionConfig {
    /// Whether kernels exist for this configuration.
    pub fn is_supported(&self) -> bool {
        CUDA_CACHE_DTYPES.contains(&self.dtype)
            && HEAD_SIZES.contains(&self.head_size)
            && BLOCK_SIZES.contains(&self.block_size)
    }

    /// Query heads per thread block this configuration is instantiated for: every choice whose
    /// P·V accumulators stay within the register budget.
    pub fn qpk_options(&self) -> Vec<usize> {
        let x = self.dtype.x();
        let chunks_per_row = self.block_size / x;
        let chunks_per_warp = self.head_size / ATTENTION_WARPS * chunks_per_row;
        let v_iters = chunks_per_warp.div_ceil(32);
        QPK_CHOICES.into_iter().filter(|q| v_iters * q <= MAX_VALUE_ACCUMULATORS).collect()
    }

    /// Query heads per thread block for a GQA group of `group` query heads per KV head: the
    /// largest instantiated choice that divides the group (1 always does).
    pub fn qpk_for_group(&self, group: usize) -> usize {
        self.qpk_options().into_iter().find(|q| group.is_multiple_of(*q)).unwrap_or(1)
    }

    /// Entry point name of the attention kernel for `qpk` query heads per block. One kernel runs
    /// both variants: v1 with `partition_size == 0`, v2 with [`PARTITION_SIZE`].
    pub fn attention_entry(&self, qpk: usize) -> String {
        let (tn, _) = cuda_type(self.dtype);
        format!("paged_attention_{tn}_h{}_b{}_g{qpk}", self.head_size, self.block_size)
    }

    /// Entry point name of the tiled prefill kernel (one per configuration: the GQA group is a
    /// runtime parameter).
    pub fn prefill_entry(&self) -> String {
        let (tn, _) = cuda_type(self.dtype);
        format!("paged_prefill_{tn}_h{}_b{}", self.head_size, self.block_size)
    }

    /// Entry point name of `reshape_and_cache` for this cache dtype.
    pub fn reshape_and_cache_entry(&self) -> String {
        format!("reshape_and_cache_{}", cuda_type(self.dtype).0)
    }

    /// The program: shared header, attention and cache sources, and this configuration's
    /// instantiations.
    pub fn program(&self) -> Program {
        let (tn, ty) = cuda_type(self.dtype);
        let (h, b) = (self.head_size, self.block_size);
        let mut source = concat_sources(&["common.cuh", "attention.cu", "attention_prefill.cu", "cache.cu"]);
        let mut entries = Vec::new();
        for qpk in self.qpk_options() {
            let _ = writeln!(source, "PAGED_ATTENTION({tn}, {ty}, {h}, {b}, {qpk})");
            entries.push(Entry { name: self.attention_entry(qpk), attention: true });
        }
        let _ = writeln!(source, "PAGED_PREFILL({tn}, {ty}, {h}, {b})");
        entries.push(Entry { name: self.prefill_entry(), attention: true });
        let _ = writeln!(source, "RESHAPE_AND_CACHE({tn}, {ty})");
        entries.push(Entry { name: self.reshape_and_cache_entry(), attention: false });
        entries.push(Entry { name: REDUCE_ENTRY.to_owned(), attention: true });
        entries.push(Entry { name: COPY_BLOCKS_ENTRY.to_owned(), attention: false });
        Program { name: self.program_name(), source, entries }
    }

    /// Name of [`AttentionConfig::program`] (cheap: no source is built).
    pub fn program_name(&self) -> String {
        format!("attention_{}_h{}_b{}", cuda_type(self.dtype).0, self.head_size, self.block_size)
    }
}

/// The v2 reduce kernel (dtype independent; present in every attention program).
pub const REDUCE_ENTRY: &str = "paged_attention_v2_reduce";
/// The block copy kernel (dtype independent; present in every attention program).
pub const COPY_BLOCKS_ENTRY: &str = "copy_blocks";

/// Activation dtypes the model kernels are instantiated for.
pub const MODEL_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The model kernels of every activation dtype.
pub const MODEL_KERNEL_NAMES: [&str; 11] = [
    "embedding",
    "rms_norm",
    "rotary",
    "silu_mul",
    "gelu_tanh_mul",
    "add",
    "add_bias_f32out",
    "add_into_f32",
    "rms_norm_heads_f32",
    "rms_norm_f32in",
    "embedding_f32out",
];

/// The device's greedy sampler (one instance: logits are f32), and its threads per block.
pub const ARGMAX_ENTRY: &str = "argmax_rows_f32";
pub const ARGMAX_THREADS: u32 = 256;
/// Logit soft-capping (one instance: logits are f32).
pub const SOFTCAP_ENTRY: &str = "softcap_f32";

/// Name of a model kernel (one of [`MODEL_KERNEL_NAMES`]) for a dtype.
pub fn model_entry(kernel: &str, dtype: DType) -> String {
    format!("{kernel}_{}", cuda_type(dtype).0)
}

/// Name of the cast kernel from `src` to `dst`.
pub fn cast_entry(src: DType, dst: DType) -> String {
    format!("cast_{}_to_{}", cuda_type(src).0, cuda_type(dst).0)
}

/// The model kernels' program: every activation dtype and every cast between two of them.
pub fn model_program() -> Program {
    let mut source = concat_sources(&["common.cuh", "model.cu"]);
    let mut entries = Vec::new();
    for dtype in MODEL_DTYPES {
        let (tn, ty) = cuda_type(dtype);
        let _ = writeln!(source, "MODEL_KERNELS({tn}, {ty})");
        for k in MODEL_KERNEL_NAMES {
            entries.push(Entry { name: model_entry(k, dtype), attention: false });
        }
        for dst in MODEL_DTYPES.into_iter().filter(|d| *d != dtype) {
            let (dn, dty) = cuda_type(dst);
            let _ = writeln!(source, "CAST_KERNEL({tn}, {ty}, {dn}, {dty})");
            entries.push(Entry { name: cast_entry(dtype, dst), attention: false });
        }
    }
    entries.push(Entry { name: ARGMAX_ENTRY.to_owned(), attention: false });
    entries.push(Entry { name: SOFTCAP_ENTRY.to_owned(), attention: false });
    Program { name: "model".to_owned(), source, entries }
}

/// Every configuration the attention kernels are instantiated for (every head and block size
/// the CPU kernels implement), by dtype, then head size, then block size.
pub fn attention_configs() -> impl Iterator<Item = AttentionConfig> {
    CUDA_CACHE_DTYPES.into_iter().flat_map(|dtype| {
        HEAD_SIZES.into_iter().flat_map(move |head_size| {
            BLOCK_SIZES.into_iter().map(move |block_size| AttentionConfig { dtype, head_size, block_size })
        })
    })
}

/// Every program the code can ask for: all attention configurations, then the model kernels.
pub fn all_programs() -> Vec<Program> {
    attention_configs().map(|c| c.program()).chain([model_program()]).collect()
}

/// One NVRTC compilation unit and the entry points it defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Short name (also the NVRTC program name, shown in compiler messages).
    pub name: String,
    /// The complete CUDA source.
    pub source: String,
    /// The `extern "C"` kernels it defines.
    pub entries: Vec<Entry>,
}

/// One `extern "C"` kernel of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Attention kernels must not spill registers (cuda-check fails if they do).
    pub attention: bool,
}

fn concat_sources(files: &[&str]) -> String {
    let mut out = String::new();
    for f in files {
        if let Some((file, code)) = KERNEL_SOURCES.iter().find(|(file, _)| file == f) {
            let _ = writeln!(out, "// ---- {file} ----");
            // The header is concatenated, not included: drop its include guard.
            out.push_str(&code.replace("#pragma once", ""));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_has_a_qpk_dividing_every_group() {
        for p in all_programs() {
            assert!(!p.entries.is_empty(), "{}", p.name);
        }
        for c in attention_configs() {
            assert!(c.qpk_options().contains(&1));
            for group in 1..=16 {
                assert_eq!(group % c.qpk_for_group(group), 0);
            }
        }
    }

    #[test]
    fn program_defines_the_entries_it_lists() {
        let c = AttentionConfig { dtype: DType::BF16, head_size: 128, block_size: 16 };
        let p = c.program();
        assert_eq!(c.qpk_for_group(4), 4);
        assert!(p.source.contains("PAGED_ATTENTION(bf16, __nv_bfloat16, 128, 16, 4)"));
        assert!(p.entries.iter().any(|e| e.name == "paged_attention_bf16_h128_b16_g4"));
        assert!(p.entries.iter().any(|e| e.name == "paged_attention_bf16_h128_b16_g8"));
        assert!(p.entries.iter().any(|e| e.name == "reshape_and_cache_bf16"));
        assert!(p.source.contains("PAGED_PREFILL(bf16, __nv_bfloat16, 128, 16)"));
        assert!(p.entries.iter().any(|e| e.name == "paged_prefill_bf16_h128_b16" && e.attention));
        assert!(!p.source.contains("#pragma once"));
    }

    #[test]
    fn large_heads_with_wide_rows_limit_the_group_per_block() {
        let c = AttentionConfig { dtype: DType::BF16, head_size: 256, block_size: 32 };
        // 64 rows per warp * 4 chunks per row = 8 chunks per lane: at most 2 heads per block.
        assert_eq!(c.qpk_options(), vec![2, 1]);
        assert_eq!(c.qpk_for_group(8), 2);
        assert!(!AttentionConfig { dtype: DType::F32, head_size: 128, block_size: 16 }.is_supported());
        let c = AttentionConfig { dtype: DType::BF16, head_size: 128, block_size: 16 };
        assert_eq!(c.qpk_options(), vec![8, 4, 2, 1]);
    }
}
