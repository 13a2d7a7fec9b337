//! The decode-variant sweep of the bandwidth section: v1 and v2 timed over batch sizes,
//! context lengths and head layouts, the data the automatic variant choice is judged by.

use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::{AttentionConfig, AttentionVariant};
use attn_kernels::cuda::ops::AttnWorkspace;
use cudarc::driver::sys::CUdevice_attribute;
use gpu_check::figures::{Recorder, Res};
use kv_cache::cuda::DeviceLayerCache;
use kv_cache::{CacheGeometry, DType};

use crate::Ctx;
use crate::bench::DecodeOperands;

/// Head layouts `(name, query heads, KV heads, head size)`: Llama-3-8B's, SmolLM2-135M's,
/// Gemma 3 270M's and a multi-head (no GQA) one.
const LAYOUTS: [(&str, usize, usize, usize); 4] = [
    ("h32kv8d128", 32, 8, 128),
    ("h9kv3d64", 9, 3, 64),
    ("h4kv1d256", 4, 1, 256),
    ("h32kv32d128", 32, 32, 128),
];
const SEQS: [usize; 6] = [1, 8, 32, 64, 128, 256];
const CONTEXTS: [usize; 4] = [1_024, 2_048, 4_096, 8_192];
/// The most KV bytes one layout's cache may take (the multi-head layout's largest batches are
/// left out).
const MAX_CACHE_BYTES: usize = 24 << 30;

/// Times v1 and v2 for every layout × batch × context that fits [`MAX_CACHE_BYTES`]; records
/// `cuda.sweep.<layout>.s<seqs>.c<ctx>.v1_over_v2` (time ratio) and how often the automatic
/// choice picked the faster variant (`cuda.sweep.auto_picked_faster`, a fraction) and what
/// the wrong picks cost (`cuda.sweep.auto_worst_over_best`).
pub fn sweep(run: &Ctx, rec: &mut Recorder) -> Res<()> {
    let device = &run.device;
    let stream = device.stream().clone();
    let bs = 16usize;
    let sms = device.context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    rec.figure("cuda.sweep.multiprocessors", sms);
    let (mut right, mut total, mut worst) = (0usize, 0usize, 1.0f64);
    for (name, heads, kv_heads, head_size) in LAYOUTS {
        let token_bytes = kv_heads * head_size * 2 * 2;
        let seqs_fit = |s: usize| s * CONTEXTS[CONTEXTS.len() - 1] * token_bytes <= MAX_CACHE_BYTES;
        let max_seqs = SEQS.into_iter().filter(|&s| seqs_fit(s)).max().unwrap_or(1);
        let max_ctx = CONTEXTS[CONTEXTS.len() - 1];
        let num_blocks = max_seqs * max_ctx / bs;
        let geometry = CacheGeometry {
            num_blocks,
            num_kv_heads: kv_heads,
            head_size,
            block_size: bs,
            dtype: DType::BF16,
        };
        let cache = DeviceLayerCache::new(&stream, geometry)?;
        let scale = 1.0 / (head_size as f32).sqrt();
        let config = AttentionConfig { dtype: DType::BF16, head_size, block_size: bs };
        rec.figure(format!("cuda.sweep.{name}.qpk"), config.qpk_for_group(heads / kv_heads));
        for seqs in SEQS.into_iter().filter(|&s| seqs_fit(s)) {
            let query = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
            let mut out = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
            let mut ws = AttnWorkspace::new(&stream, seqs, heads, head_size, max_ctx)?;
            for context in CONTEXTS {
                let per_seq = context / bs;
                let table: Vec<u32> = (0..seqs)
                    .flat_map(|s| (0..per_seq).map(move |b| (s * max_ctx / bs + b) as u32))
                    .collect();
                let qsl: Vec<usize> = (0..=seqs).collect();
                let lens = vec![context; seqs];
                let meta = attn_kernels::PagedAttnMetadata {
                    query_start_loc: &qsl,
                    seq_lens: &lens,
                    block_tables: &table,
                    max_blocks_per_seq: per_seq,
                    seq_rows: None,
                };
                let dmeta = DeviceAttnMetadata::upload(&stream, &meta, bs, num_blocks)?;
                let mut operands =
                    DecodeOperands::new(&mut out, &query, &cache, &dmeta, (heads, scale), &mut ws);
                let (v1, _) = operands.time(run, Some(AttentionVariant::V1), 9)?;
                let (v2, _) = operands.time(run, Some(AttentionVariant::V2), 9)?;
                let (_, auto) = operands.time(run, None, 9)?;
                rec.figure(format!("cuda.sweep.{name}.s{seqs}.c{context}.v1_over_v2"), v1 / v2);
                let faster = if v1 <= v2 { AttentionVariant::V1 } else { AttentionVariant::V2 };
                total += 1;
                right += usize::from(auto == faster);
                let picked = if auto == AttentionVariant::V1 { v1 } else { v2 };
                worst = worst.max(picked / v1.min(v2));
            }
        }
    }
    rec.figure("cuda.sweep.cases", total);
    rec.figure("cuda.sweep.auto_picked_faster", right as f64 / total.max(1) as f64);
    rec.figure("cuda.sweep.auto_worst_over_best", worst);
    Ok(())
}
