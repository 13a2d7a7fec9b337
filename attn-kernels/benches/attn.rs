//! Criterion benches of the CPU attention kernels (group `attn`), plus the figures and the
//! block-size trade-off fragment they feed into `cargo xtask bench`.
//!
//! Decode case: 32 sequences × context 4 096, 32 query heads / 8 KV heads, head size 128.
//! - `decode_f32_ms` (block size 16), `decode_bs8_paged_ms`, `decode_bs32_paged_ms`: physical
//!   blocks shuffled across the pool, throughput = K+V bytes read. These are timed as pairs:
//!   every sample runs the kernel over the shuffled block table *and* over an identity table on
//!   the same allocation (consecutive blocks: one contiguous cache), in alternating order, and
//!   criterion reports the paged half. The ratio `attn.paged_over_contiguous_bs{8,16}` is the
//!   median of the per-sample ratios: both halves see the same memory, pages and machine load,
//!   which separate measurement windows over separate GiB allocations did not;
//! - `decode_f32_read_ms`, `decode_bf16_read_ms` and `decode_int8_read_ms`: paged decode (block
//!   size 16) paired the same way with a read-only sum (`attn_kernels::yardstick`) over as many
//!   bytes as the kernel reads (int8: codes and scales), each in its own allocation.
//!   `attn.decode_read_fraction` (f32), `attn.decode_read_fraction_bf16` and
//!   `attn.decode_read_fraction_int8` are the medians of the per-sample ratios of the kernel's
//!   bytes per second over the sum's: how far the kernel is from reading memory alone;
//! - `prefill_8x512_ms`: varlen prefill of 8 chunks × 512 tokens (f32 cache);
//! - `prefill_4k_bf16_ms`: one 4 096-token prompt on a bf16 cache (the CPU default), and
//!   `prefill_4k_bf16_avx2_ms` the same on the AVX2 kernels.
//!
//! Written to `$BENCH_FIGURES_DIR`: the paged-over-contiguous ratios, `attn.prefill_gflops`,
//! `attn.prefill_gflops_4k` and `attn.prefill_gflops_4k_avx2`
//! (causal FLOPs / median time, timed by the same criterion samples through `iter_custom`),
//! internal-fragmentation waste per block size on a ShareGPT-like length trace, and
//! `attn_block_size.md` (the trade-off table).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use attn_kernels::yardstick::par_read_only_sum;
use attn_kernels::{AttnOptions, Isa, PagedAttnMetadata, paged_attention, reshape_and_cache};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use half::bf16;
use kv_cache::{CacheElem, CacheGeometry, DType, LayerCache};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

const NUM_SEQS: usize = 32;
const CONTEXT: usize = 4096;
const NUM_HEADS: usize = 32;
const NUM_KV_HEADS: usize = 8;
const HEAD_SIZE: usize = 128;

/// Per-iteration times of the samples criterion took, by bench name (for the derived figures).
type Samples = RefCell<BTreeMap<&'static str, Vec<f64>>>;

fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// Deterministic values in [-1, 1) without a per-element RNG call (fills a GiB quickly).
fn pattern(i: usize, salt: usize) -> f32 {
    let h = (i ^ salt.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B) ^ (i >> 13);
    (h % 2048) as f32 / 1024.0 - 1.0
}

fn fill<T: CacheElem>(cache: &mut LayerCache) {
    if let Some((k, v)) = cache.typed_mut::<T>() {
        k.par_iter_mut().enumerate().for_each(|(i, e)| *e = T::from_f32(pattern(i, 1)));
        v.par_iter_mut().enumerate().for_each(|(i, e)| *e = T::from_f32(pattern(i, 2)));
    }
}

/// int8: codes over the whole range, each token's scales `1/127` (values in [-1, 1]).
fn fill_int8(cache: &mut LayerCache) {
    if let kv_cache::CacheSlicesMut::Int8 { key, value, key_scale, value_scale } = cache.slices_mut() {
        key.par_iter_mut().enumerate().for_each(|(i, e)| *e = (pattern(i, 1) * 127.0) as i8);
        value.par_iter_mut().enumerate().for_each(|(i, e)| *e = (pattern(i, 2) * 127.0) as i8);
        key_scale.fill(bf16::from_f32(1.0 / 127.0));
        value_scale.fill(bf16::from_f32(1.0 / 127.0));
    }
}

/// A decode batch: cache, a shuffled (paged) and an identity (contiguous) block table over it,
/// one query row per sequence.
struct DecodeCase {
    cache: LayerCache,
    shuffled: Vec<u32>,
    identity: Vec<u32>,
    max_blocks: usize,
    query: Vec<f32>,
    qsl: Vec<usize>,
    lens: Vec<usize>,
}

impl DecodeCase {
    fn new(dtype: DType, block_size: usize) -> Self {
        let max_blocks = CONTEXT / block_size;
        let num_blocks = NUM_SEQS * max_blocks;
        let geometry =
            CacheGeometry { num_blocks, num_kv_heads: NUM_KV_HEADS, head_size: HEAD_SIZE, block_size, dtype };
        let mut cache = LayerCache::new(geometry).expect("bench cache");
        match dtype {
            DType::F32 => fill::<f32>(&mut cache),
            DType::F16 => fill::<half::f16>(&mut cache),
            DType::BF16 => fill::<bf16>(&mut cache),
            DType::Int8 => fill_int8(&mut cache),
            other => panic!("the attention bench fills float caches, not {other}"),
        }
        let identity: Vec<u32> = (0..num_blocks as u32).collect();
        let mut shuffled = identity.clone();
        shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(7));
        let query = (0..NUM_SEQS * NUM_HEADS * HEAD_SIZE).map(|i| pattern(i, 3)).collect();
        DecodeCase {
            cache,
            shuffled,
            identity,
            max_blocks,
            query,
            qsl: (0..=NUM_SEQS).collect(),
            lens: vec![CONTEXT; NUM_SEQS],
        }
    }

    fn bytes_read(&self) -> u64 {
        (NUM_SEQS * CONTEXT * NUM_KV_HEADS * self.cache.dtype().kv_bytes_per_head(HEAD_SIZE)) as u64
    }

    fn run(&self, out: &mut [f32], paged: bool) {
        let meta = PagedAttnMetadata {
            query_start_loc: &self.qsl,
            seq_lens: &self.lens,
            block_tables: if paged { &self.shuffled } else { &self.identity },
            max_blocks_per_seq: self.max_blocks,
            seq_rows: None,
        };
        paged_attention(
            &AttnOptions::default(),
            out,
            &self.query,
            &self.cache,
            &meta,
            NUM_HEADS,
            1.0 / (HEAD_SIZE as f32).sqrt(),
        )
        .expect("decode");
    }
}

fn timed(samples: &Samples, name: &'static str, iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = start.elapsed();
    samples.borrow_mut().entry(name).or_default().push(elapsed.as_secs_f64() / iters as f64);
    elapsed
}

/// The `attn` group for a bandwidth case: flat sampling, throughput = `bytes` per iteration.
fn attn_group(c: &mut Criterion, bytes: u64) -> BenchmarkGroup<'_, WallTime> {
    let mut g = c.benchmark_group("attn");
    g.sample_size(if quick() { 10 } else { 20 });
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(bytes));
    g
}

/// Paged decode at block size 16 on a `dtype` cache, paired with a read-only sum over as many
/// bytes in alternating order (see the module doc): each sample records the kernel's mean time
/// and the ratio of its read rate over the sum's.
fn bench_decode_read_pair(
    c: &mut Criterion,
    samples: &Samples,
    name: &'static str,
    ratio: &'static str,
    dtype: DType,
) {
    let case = DecodeCase::new(dtype, 16);
    let words: Vec<u32> = (0..case.bytes_read() as usize / 4).into_par_iter().map(|i| i as u32).collect();
    let mut out = vec![0.0f32; NUM_SEQS * NUM_HEADS * HEAD_SIZE];
    let mut g = attn_group(c, case.bytes_read());
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let (mut kernel, mut sum) = (Duration::ZERO, Duration::ZERO);
            for i in 0..iters {
                for kernel_half in [i % 2 == 0, i % 2 == 1] {
                    let start = Instant::now();
                    if kernel_half {
                        case.run(&mut out, true);
                    } else {
                        std::hint::black_box(par_read_only_sum(&words));
                    }
                    *(if kernel_half { &mut kernel } else { &mut sum }) += start.elapsed();
                }
            }
            let mut s = samples.borrow_mut();
            s.entry(name).or_default().push(kernel.as_secs_f64() / iters as f64);
            // Same bytes on both sides: the read rates' ratio is the times' inverse ratio.
            s.entry(ratio).or_default().push(sum.as_secs_f64() / kernel.as_secs_f64());
            kernel
        })
    });
    g.finish();
}

/// Names of one paged/contiguous pair's samples.
struct PairNames {
    /// The criterion id (its time is the paged half).
    paged: &'static str,
    contig: &'static str,
    ratio: &'static str,
}

/// f32 decode at block size `bs`, paged and contiguous interleaved over one allocation (see the
/// module doc). Each sample records both halves' mean times and their ratio.
fn bench_decode_pair(c: &mut Criterion, samples: &Samples, names: PairNames, bs: usize) {
    let case = DecodeCase::new(DType::F32, bs);
    let mut out = vec![0.0f32; NUM_SEQS * NUM_HEADS * HEAD_SIZE];
    let mut g = attn_group(c, case.bytes_read());
    g.bench_function(names.paged, |b| {
        b.iter_custom(|iters| {
            let (mut paged, mut contig) = (Duration::ZERO, Duration::ZERO);
            for i in 0..iters {
                // Alternate which half goes first, so neither always inherits the other's
                // cache and prefetcher state.
                for paged_half in [i % 2 == 0, i % 2 == 1] {
                    let start = Instant::now();
                    case.run(&mut out, paged_half);
                    *(if paged_half { &mut paged } else { &mut contig }) += start.elapsed();
                }
            }
            let mut s = samples.borrow_mut();
            let per_iter = |d: Duration| d.as_secs_f64() / iters as f64;
            s.entry(names.paged).or_default().push(per_iter(paged));
            s.entry(names.contig).or_default().push(per_iter(contig));
            s.entry(names.ratio).or_default().push(paged.as_secs_f64() / contig.as_secs_f64());
            paged
        })
    });
    g.finish();
}

/// A causal prefill case: `seqs` prompts of `len` tokens in one call, on `isa` (`None`: the
/// best this CPU has, as the engine runs).
#[derive(Clone, Copy)]
struct PrefillCase {
    name: &'static str,
    seqs: usize,
    len: usize,
    dtype: DType,
    isa: Option<Isa>,
}

/// Varlen prefill, 8 × 512 tokens, f32 cache (`attn.prefill_gflops`).
const PREFILL_8X512: PrefillCase =
    PrefillCase { name: "prefill_8x512_ms", seqs: 8, len: 512, dtype: DType::F32, isa: None };
/// One 4 096-token prompt on the CPU's default bf16 cache (`attn.prefill_gflops_4k`).
const PREFILL_4K: PrefillCase =
    PrefillCase { name: "prefill_4k_bf16_ms", seqs: 1, len: 4096, dtype: DType::BF16, isa: None };
/// [`PREFILL_4K`] on the AVX2 kernels (forced on an AVX-512 CPU: the path AVX2-only machines
/// run; `attn.prefill_gflops_4k_avx2`).
const PREFILL_4K_AVX2: PrefillCase = PrefillCase {
    name: "prefill_4k_bf16_avx2_ms",
    seqs: 1,
    len: 4096,
    dtype: DType::BF16,
    isa: Some(Isa::Avx2),
};

/// FLOPs of causal prefill: every (query, visible key) pair costs `2·d` for q·k and `2·d` for p·v.
fn prefill_flops(case: PrefillCase) -> f64 {
    let pairs_per_seq = (case.len * (case.len + 1) / 2) as f64;
    case.seqs as f64 * NUM_HEADS as f64 * pairs_per_seq * 4.0 * HEAD_SIZE as f64
}

fn bench_prefill(c: &mut Criterion, samples: &Samples, case: PrefillCase) {
    let PrefillCase { name, seqs, len, dtype, isa } = case;
    let opts = AttnOptions { isa: isa.unwrap_or_else(Isa::detected), ..AttnOptions::default() };
    if !opts.isa.is_available() {
        eprintln!("attn: {name} skipped, this CPU lacks {:?}", opts.isa);
        return;
    }
    let bs = 16;
    let blocks_per_seq = len / bs;
    let geometry = CacheGeometry {
        num_blocks: seqs * blocks_per_seq,
        num_kv_heads: NUM_KV_HEADS,
        head_size: HEAD_SIZE,
        block_size: bs,
        dtype,
    };
    let mut cache = LayerCache::new(geometry).expect("prefill cache");
    let mut tables: Vec<u32> = (0..(seqs * blocks_per_seq) as u32).collect();
    tables.shuffle(&mut ChaCha8Rng::seed_from_u64(11));
    let tokens = seqs * len;
    let kv_row = NUM_KV_HEADS * HEAD_SIZE;
    let key: Vec<f32> = (0..tokens * kv_row).map(|i| pattern(i, 4)).collect();
    let value: Vec<f32> = (0..tokens * kv_row).map(|i| pattern(i, 5)).collect();
    let slots: Vec<i64> = (0..tokens)
        .map(|t| {
            let (s, i) = (t / len, t % len);
            (tables[s * blocks_per_seq + i / bs] as usize * bs + i % bs) as i64
        })
        .collect();
    reshape_and_cache(&key, &value, &slots, &mut cache).expect("write prefill kv");
    let query: Vec<f32> = (0..tokens * NUM_HEADS * HEAD_SIZE).map(|i| pattern(i, 6)).collect();
    let qsl: Vec<usize> = (0..=seqs).map(|s| s * len).collect();
    let lens = vec![len; seqs];
    let meta = PagedAttnMetadata {
        query_start_loc: &qsl,
        seq_lens: &lens,
        block_tables: &tables,
        max_blocks_per_seq: blocks_per_seq,
        seq_rows: None,
    };
    let mut out = vec![0.0f32; query.len()];
    let mut g = c.benchmark_group("attn");
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            timed(samples, name, iters, || {
                let scale = 1.0 / (HEAD_SIZE as f32).sqrt();
                paged_attention(&opts, &mut out, &query, &cache, &meta, NUM_HEADS, scale).expect("prefill")
            })
        })
    });
    g.finish();
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// ShareGPT-like trace: log-normal prompt (mean 161) and output (mean 338) lengths.
fn length_trace(n: usize) -> Vec<(usize, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(2023);
    let mut lognormal = |mean: f64, sigma: f64| {
        let mu = mean.ln() - sigma * sigma / 2.0;
        // Box-Muller.
        let (u1, u2): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        ((mu + sigma * z).exp().round() as usize).clamp(1, 8192)
    };
    (0..n).map(|_| (lognormal(161.0, 1.0), lognormal(338.0, 0.8))).collect()
}

/// (waste at completion, waste averaged over every decode step): unused slots ÷ allocated slots.
fn fragmentation(trace: &[(usize, usize)], bs: usize) -> (f64, f64) {
    let waste = |len: usize| len.div_ceil(bs) * bs - len;
    let (mut final_waste, mut final_alloc, mut step_waste, mut step_alloc) = (0usize, 0usize, 0usize, 0usize);
    for &(p, o) in trace {
        let total = p + o;
        final_waste += waste(total);
        final_alloc += total.div_ceil(bs) * bs;
        for len in p..=total {
            step_waste += waste(len);
            step_alloc += len.div_ceil(bs) * bs;
        }
    }
    (final_waste as f64 / final_alloc as f64, step_waste as f64 / step_alloc as f64)
}

fn write_outputs(samples: &Samples) {
    let s = samples.borrow();
    let ms = |name: &str| s.get(name).map(|v| median(v) * 1e3);
    let mut figures = BTreeMap::new();
    for (case, figure) in [
        (PREFILL_8X512, "attn.prefill_gflops"),
        (PREFILL_4K, "attn.prefill_gflops_4k"),
        (PREFILL_4K_AVX2, "attn.prefill_gflops_4k_avx2"),
    ] {
        if let Some(t) = ms(case.name) {
            figures.insert(figure.to_owned(), prefill_flops(case) / (t * 1e-3) / 1e9);
        }
    }
    for (ratio, figure) in [
        ("read_fraction_f32", "attn.decode_read_fraction"),
        ("read_fraction_bf16", "attn.decode_read_fraction_bf16"),
        ("read_fraction_int8", "attn.decode_read_fraction_int8"),
    ] {
        if let Some(v) = s.get(ratio) {
            figures.insert(figure.to_owned(), median(v));
        }
    }
    let spread = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        format!(
            "median {:.3}, mean {mean:.3}, p90 {:.3} over {} samples",
            v[v.len() / 2],
            v[v.len() * 9 / 10],
            v.len()
        )
    };
    let trace = length_trace(10_000);
    let mean =
        |f: fn(&(usize, usize)) -> usize| trace.iter().map(f).sum::<usize>() as f64 / trace.len() as f64;
    let (mean_p, mean_o) = (mean(|t| t.0), mean(|t| t.1));
    let mut md = String::from(
        "### Attention: block-size trade-off (CPU decode kernel, 32 seqs × 4 096 ctx, 32/8 heads, head 128, f32)\n\n",
    );
    md.push_str(&format!(
        "Fragmentation on a ShareGPT-like trace of {} requests (log-normal lengths, mean prompt {mean_p:.0}, mean output {mean_o:.0}): \
         unused slots in the last block ÷ allocated slots, at completion and averaged over every decode step.\n\n",
        trace.len()
    ));
    md.push_str("Paged and contiguous decode interleaved over one allocation; the ratio is the median of the per-sample ratios.\n\n");
    md.push_str("| block size | decode, paged (ms) | decode, contiguous (ms) | paged ÷ contiguous | waste at completion | waste over decode |\n|---|---|---|---|---|---|\n");
    for bs in [8usize, 16, 32] {
        let paged = if bs == 16 {
            ms("decode_f32_ms")
        } else {
            ms(if bs == 8 { "decode_bs8_paged_ms" } else { "decode_bs32_paged_ms" })
        };
        let contig_name = match bs {
            8 => "decode_bs8_contig_ms",
            16 => "decode_bs16_contig_ms",
            _ => "decode_bs32_contig_ms",
        };
        let contig = ms(contig_name);
        // The contiguous halves are not criterion ids of their own: their medians go out here.
        if let Some(c) = contig {
            figures.insert(format!("attn.{contig_name}"), c);
        }
        let (w_final, w_steps) = fragmentation(&trace, bs);
        figures.insert(format!("attn.frag_waste_bs{bs}"), w_steps);
        let ratio = s.get(format!("ratio_bs{bs}").as_str()).map(|v| median(v));
        if let (Some(r), 8 | 16) = (ratio, bs) {
            figures.insert(format!("attn.paged_over_contiguous_bs{bs}"), r);
        }
        let f = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.1}"));
        let ratio = ratio.map_or("–".to_owned(), |r| format!("{r:.3}"));
        md.push_str(&format!(
            "| {bs} | {} | {} | {ratio} | {:.2} % | {:.2} % |\n",
            f(paged),
            f(contig),
            w_final * 100.0,
            w_steps * 100.0
        ));
    }
    for (ratio, dtype) in
        [("read_fraction_f32", "f32"), ("read_fraction_bf16", "bf16"), ("read_fraction_int8", "int8")]
    {
        if let Some(v) = s.get(ratio) {
            md.push_str(&format!(
                "\nDecode ({dtype} cache, block size 16, paged) over a read-only sum of as many bytes, paired per sample: {}.\n",
                spread(v)
            ));
        }
    }
    for case in [PREFILL_8X512, PREFILL_4K, PREFILL_4K_AVX2] {
        if let Some(t) = ms(case.name) {
            md.push_str(&format!(
                "\nCausal prefill, {} × {} tokens, {} cache (32/8 heads, head 128, tiled kernel, {}): {t:.1} ms, {:.1} GFLOP/s.\n",
                case.seqs,
                case.len,
                case.dtype,
                case.isa.map_or("best ISA".to_owned(), |i| format!("{i:?}")),
                prefill_flops(case) / (t * 1e-3) / 1e9
            ));
        }
    }
    println!("{md}");
    for (k, v) in &figures {
        println!("{k} = {v:.4}");
    }
    if let Ok(dir) = std::env::var("BENCH_FIGURES_DIR") {
        let dir = std::path::Path::new(&dir);
        let json = format!(
            "{{{}}}\n",
            figures.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect::<Vec<_>>().join(", ")
        );
        std::fs::write(dir.join("attn.json"), json).expect("write attn.json");
        std::fs::write(dir.join("attn_block_size.md"), md).expect("write attn_block_size.md");
    }
}

fn main() {
    let samples: Samples = RefCell::new(BTreeMap::new());
    let mut c = Criterion::default().configure_from_args();
    let pair = |paged, contig, ratio| PairNames { paged, contig, ratio };
    bench_decode_pair(&mut c, &samples, pair("decode_f32_ms", "decode_bs16_contig_ms", "ratio_bs16"), 16);
    bench_decode_read_pair(&mut c, &samples, "decode_f32_read_ms", "read_fraction_f32", DType::F32);
    bench_decode_read_pair(&mut c, &samples, "decode_bf16_read_ms", "read_fraction_bf16", DType::BF16);
    bench_decode_read_pair(&mut c, &samples, "decode_int8_read_ms", "read_fraction_int8", DType::Int8);
    bench_decode_pair(&mut c, &samples, pair("decode_bs8_paged_ms", "decode_bs8_contig_ms", "ratio_bs8"), 8);
    bench_decode_pair(
        &mut c,
        &samples,
        pair("decode_bs32_paged_ms", "decode_bs32_contig_ms", "ratio_bs32"),
        32,
    );
    bench_prefill(&mut c, &samples, PREFILL_8X512);
    bench_prefill(&mut c, &samples, PREFILL_4K);
    bench_prefill(&mut c, &samples, PREFILL_4K_AVX2);
    c.final_summary();
    write_outputs(&samples);
}
