//! The decode-variant sweep of the bandwidth section: v1 and v2 timed over batch sizes,
//! context lengths and head layouts, the data the automatic variant choice is judged by — on
//! the shapes its constants were fitted to and, apart, on held-out shapes they were not
//! (`gpu_check::variant_sweep` holds the shapes, the split and the scoring).

use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::{AttentionConfig, AttentionVariant};
use attn_kernels::cuda::ops::AttnWorkspace;
use cudarc::driver::sys::CUdevice_attribute;
use gpu_check::figures::{Recorder, Res};
use gpu_check::variant_sweep::{self, FIT_LAYOUTS, HELDOUT_LAYOUTS, Shape, Timed};
use kv_cache::cuda::DeviceLayerCache;
use kv_cache::{CacheGeometry, DType};

use crate::Ctx;
use crate::bench::DecodeOperands;

/// Times v1, v2 and the automatic choice on every shape of [`variant_sweep::shapes`]; records
/// `cuda.sweep.<layout>.s<seqs>.c<ctx>.v1_over_v2` (time ratio), and how often the automatic
/// choice picked the faster variant and what its wrong picks cost, over the whole sweep, its
/// fitted part and its held-out part ([`variant_sweep::figures`]).
pub fn sweep(run: &Ctx, rec: &mut Recorder) -> Res<()> {
    let device = &run.device;
    let stream = device.stream().clone();
    let bs = 16usize;
    let sms = device.context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    rec.figure("cuda.sweep.multiprocessors", sms);
    let shapes = variant_sweep::shapes();
    let mut timed = Vec::with_capacity(shapes.len());
    for layout in FIT_LAYOUTS.into_iter().chain(HELDOUT_LAYOUTS) {
        let mine: Vec<&Shape> = shapes.iter().filter(|s| s.layout == layout).collect();
        let (Some(max_seqs), Some(max_ctx)) =
            (mine.iter().map(|s| s.seqs).max(), mine.iter().map(|s| s.context).max())
        else {
            continue;
        };
        // Sequence s owns blocks [s·max_ctx/bs, (s+1)·max_ctx/bs).
        let num_blocks = max_seqs * max_ctx / bs;
        let geometry = CacheGeometry {
            num_blocks,
            num_kv_heads: layout.kv_heads,
            head_size: layout.head_size,
            block_size: bs,
            dtype: DType::BF16,
        };
        let cache = DeviceLayerCache::new(&stream, geometry)?;
        let (heads, head_size) = (layout.heads, layout.head_size);
        let scale = 1.0 / (head_size as f32).sqrt();
        let config = AttentionConfig { dtype: DType::BF16, head_size, block_size: bs };
        rec.figure(format!("cuda.sweep.{}.qpk", layout.name), config.qpk_for_group(heads / layout.kv_heads));
        // The shapes come by batch, then context: one query, output and workspace per batch.
        let mut batches: Vec<usize> = mine.iter().map(|s| s.seqs).collect();
        batches.dedup();
        for seqs in batches {
            let query = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
            let mut out = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
            let mut ws = AttnWorkspace::new(&stream, seqs, heads, head_size, max_ctx)?;
            for shape in mine.iter().filter(|s| s.seqs == seqs) {
                let per_seq = shape.context / bs;
                let table: Vec<u32> = (0..seqs)
                    .flat_map(|s| (0..per_seq).map(move |b| (s * max_ctx / bs + b) as u32))
                    .collect();
                let qsl: Vec<usize> = (0..=seqs).collect();
                let lens = vec![shape.context; seqs];
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
                let (v1_s, _) = operands.time(run, Some(AttentionVariant::V1), 9)?;
                let (v2_s, _) = operands.time(run, Some(AttentionVariant::V2), 9)?;
                let (_, auto) = operands.time(run, None, 9)?;
                rec.figure(format!("cuda.sweep.{shape}.v1_over_v2"), v1_s / v2_s);
                timed.push(Timed { part: shape.part, v1_s, v2_s, auto_is_v2: auto == AttentionVariant::V2 });
            }
        }
    }
    for (key, value) in variant_sweep::figures(&timed) {
        rec.figure(key, value);
    }
    Ok(())
}
