//! The bandwidth section: device-to-device copy (the ceiling) and paged decode attention over
//! 64 × 4 096 tokens, paged and contiguous tables, v1 / v2 / the automatic choice.

use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::AttentionVariant;
use attn_kernels::cuda::ops::{self, AttnWorkspace};
use cudarc::driver::CudaSlice;
use gpu_check::attn_cases::decode_figures;
use gpu_check::device_timing::{copy_bytes_per_sec, time_it};
use gpu_check::figures::{Recorder, Res};
use kv_cache::cuda::DeviceLayerCache;
use kv_cache::{CacheGeometry, DType};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::Ctx;

/// One decode launch's operands, timed by [`DecodeOperands::time`].
pub struct DecodeOperands<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub query: &'a CudaSlice<f32>,
    pub cache: &'a DeviceLayerCache,
    pub meta: &'a DeviceAttnMetadata,
    pub heads: usize,
    pub scale: f32,
    pub workspace: &'a mut AttnWorkspace,
}

impl<'a> DecodeOperands<'a> {
    /// The operands of one launch over `meta`'s batch, `heads` query heads scaled by `scale`.
    pub fn new(
        out: &'a mut CudaSlice<f32>,
        query: &'a CudaSlice<f32>,
        cache: &'a DeviceLayerCache,
        meta: &'a DeviceAttnMetadata,
        (heads, scale): (usize, f32),
        workspace: &'a mut AttnWorkspace,
    ) -> Self {
        DecodeOperands { out, query, cache, meta, heads, scale, workspace }
    }

    /// Mean seconds per call of `variant` (the automatic choice for `None`) over `iters` calls,
    /// and the variant that ran.
    pub fn time(
        &mut self,
        run: &Ctx,
        variant: Option<AttentionVariant>,
        iters: usize,
    ) -> Res<(f64, AttentionVariant)> {
        let mut ran = AttentionVariant::V1;
        let t = time_it(&run.device, iters, || {
            ran = ops::paged_attention_with(
                &run.kernels,
                &mut *self.out,
                self.query,
                self.cache,
                self.meta,
                self.heads,
                self.scale.into(),
                &mut *self.workspace,
                variant,
            )?;
            Ok(())
        })?;
        Ok((t, ran))
    }
}

pub fn bench(run: &Ctx, rec: &mut Recorder) -> Res<()> {
    let device = &run.device;
    let stream = device.stream().clone();
    // Device-to-device copy of 1 GiB: the bandwidth ceiling (bytes read + written).
    let copy_bps = copy_bytes_per_sec(device)?;
    rec.figure("cuda.copy_tb_s", copy_bps / 1e12);

    // Paged decode: 64 sequences x 4096 tokens, 32 query / 8 KV heads, head 128, bf16, block 16.
    let (seqs, ctx, heads, kv_heads, head_size, bs) =
        (64usize, 4096usize, 32usize, 8usize, 128usize, 16usize);
    let blocks_per_seq = ctx / bs;
    let geometry = CacheGeometry {
        num_blocks: seqs * blocks_per_seq,
        num_kv_heads: kv_heads,
        head_size,
        block_size: bs,
        dtype: DType::BF16,
    };
    let cache = DeviceLayerCache::new(&stream, geometry)?;
    let mut shuffled: Vec<u32> = (0..geometry.num_blocks as u32).collect();
    shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(1));
    let contiguous: Vec<u32> = (0..geometry.num_blocks as u32).collect();
    let qsl: Vec<usize> = (0..=seqs).collect();
    let lens = vec![ctx; seqs];
    let query = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
    let mut out = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
    let mut ws = AttnWorkspace::new(&stream, seqs, heads, head_size, ctx)?;
    let kv_bytes = (seqs * ctx * kv_heads * head_size * 2 * 2) as f64;
    let scale = 1.0 / (head_size as f32).sqrt();
    let mut times = Vec::new();
    for (table_name, table) in [("paged", &shuffled), ("contiguous", &contiguous)] {
        let meta = attn_kernels::PagedAttnMetadata {
            query_start_loc: &qsl,
            seq_lens: &lens,
            block_tables: table,
            max_blocks_per_seq: blocks_per_seq,
            seq_rows: None,
        };
        let dmeta = DeviceAttnMetadata::upload(&stream, &meta, bs, geometry.num_blocks)?;
        let mut operands = DecodeOperands::new(&mut out, &query, &cache, &dmeta, (heads, scale), &mut ws);
        for variant in [None, Some(AttentionVariant::V1), Some(AttentionVariant::V2)] {
            let (t, ran) = operands.time(run, variant, 20)?;
            let label = variant.map_or("auto".to_owned(), |v| format!("{v:?}").to_lowercase());
            rec.figure(format!("cuda.decode_{table_name}_{label}_us"), t * 1e6);
            if variant.is_none() {
                rec.figure(
                    format!("cuda.decode_{table_name}_auto_is_v2"),
                    u8::from(ran == AttentionVariant::V2),
                );
            }
            times.push(((table_name, label), t));
        }
    }
    let get = |t: &str, l: &str| times.iter().find(|((a, b), _)| *a == t && b == l).map_or(f64::NAN, |x| x.1);
    let auto = decode_figures(kv_bytes, get("paged", "auto"), get("contiguous", "auto"), copy_bps);
    rec.figure("cuda.decode_bw_fraction", auto.bw_fraction);
    rec.figure("cuda.decode_kv_tb_s", auto.kv_bytes_per_s / 1e12);
    rec.figure("cuda.paged_over_contiguous", auto.paged_over_contiguous);
    for l in ["v1", "v2"] {
        let f = decode_figures(kv_bytes, get("paged", l), get("contiguous", l), copy_bps);
        rec.figure(format!("cuda.decode_{l}_bw_fraction"), f.bw_fraction);
    }
    crate::sweep::sweep(run, rec)?;
    // The benchmark ran to its end (its figures are the result).
    rec.pass(1);
    Ok(())
}
