//! `model` benchmarks (a plain program, `harness = false`): the f32 GEMM roofline, a memcpy
//! bandwidth and a read-only sum measured in the same run, then SmolLM2-135M prefill, batch-1
//! decode (the default, f32 and int16 activations) and batch-64 decode at context 512, on the engine's
//! bf16 cache, with the fractions of those rooflines they reach; and batch-1 decode over one
//! weight per integer-code format ([`formats`]) as a fraction of the read-only sum; then the same
//! at Llama-3.2-1B's shapes against the integer peak multiply-add rates ([`l1b`]).
//! Writes `$BENCH_FIGURES_DIR/model.json` and `model.md`; `BENCH_QUICK=1` takes fewer samples;
//! `MODEL_ONLY=l1b` runs the 1B section alone and prints it (writing nothing).

#[path = "model_support/formats.rs"]
mod formats;
#[path = "../tests/it/harness.rs"]
mod harness;
#[path = "model_support/l1b.rs"]
mod l1b;

use std::path::PathBuf;
use std::time::Instant;

use attn_kernels::yardstick::par_read_only_sum;
use harness::{Seq, build_batch, cache_of};
use kv_cache::DType;
use model::{ActivationPrecision, Model, Workspace};
use rayon::prelude::*;

const CONTEXT: usize = 512;
const BLOCK: usize = 16;
/// The cache dtype of every case: the engine's CPU default.
const KV_DTYPE: DType = DType::BF16;

fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// Median of `samples` timings (seconds) of `f`, after one warm-up call. The same statistic
/// for every figure alike (rooflines and workloads), so their ratios compare like with like.
fn median_secs(samples: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(&mut times)
}

/// The median of `times` (sorted in place).
fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// f32 GEMM 1024³ on all cores through `gemm-f32`: GFLOP/s.
fn gemm_gflops(samples: usize) -> f64 {
    let n = 1024;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut c = vec![0.0f32; n * n];
    let secs = median_secs(samples, || {
        // SAFETY: three n×n column-major buffers of the right size.
        unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                n,
                n,
                n,
                c.as_mut_ptr(),
                n as isize,
                1,
                false,
                a.as_ptr(),
                n as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm_common::Parallelism::Rayon(0),
            );
        }
    });
    2.0 * (n * n * n) as f64 / secs / 1e9
}

/// Memory traffic per second of a memcpy spread over all cores (512 MiB buffers): bytes read +
/// bytes written (STREAM's convention), comparable with the weight bytes a decode step reads.
fn memcpy_bytes_per_sec(samples: usize) -> f64 {
    let len = 128 << 20;
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    let chunk = len / rayon::current_num_threads().max(1) / 8;
    let secs = median_secs(samples, || {
        dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
    });
    std::hint::black_box(&dst);
    (2 * len * 4) as f64 / secs
}

/// Bytes read per second by a sum over a 512 MiB buffer on all cores (AVX2 loads, four
/// accumulators where the CPU has AVX2): the read-only roofline a decode step's weight and
/// K/V stream is bound by, beside memcpy's read + write traffic.
fn read_bytes_per_sec(samples: usize) -> f64 {
    let len = 128 << 20;
    let src: Vec<u32> = (0..len as u32).collect();
    let mut total = 0u32;
    let secs = median_secs(samples, || {
        total = total.wrapping_add(par_read_only_sum(&src));
    });
    std::hint::black_box(total);
    (len * 4) as f64 / secs
}

fn prompt(seed: u32, len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) % vocab as u32).max(17))
        .collect()
}

/// Attention FLOPs of one decode token at `context`: QKᵀ and PV over every head and layer.
fn attention_flops(model: &Model, context: usize) -> f64 {
    let c = &model.config;
    4.0 * (c.num_hidden_layers * c.num_attention_heads * c.head_dim * context) as f64
}

fn main() {
    let samples = if quick() { 3 } else { 10 };
    // A 1024³ GEMM takes milliseconds: many samples, so one descheduled thread does not move the median.
    let gflops = gemm_gflops(samples * 10);
    let memcpy = memcpy_bytes_per_sec(samples);
    let read = read_bytes_per_sec(samples);
    eprintln!("gemm {gflops:.1} GFLOP/s, memcpy {:.2} GB/s, read {:.2} GB/s", memcpy / 1e9, read / 1e9);
    if std::env::var("MODEL_ONLY").is_ok_and(|v| v == "l1b") {
        // A kernel's edit-measure loop: the 1B section alone, printed, no figures written.
        let (figures, md) = l1b::measure(samples, &l1b::Rooflines { gemm_flops: gflops * 1e9, read });
        println!("{md}\n{figures:#}");
        return;
    }
    let by_format = formats::read_fractions(samples * 3);
    for (ty, f) in &by_format {
        eprintln!("decode {ty:?}: {f:.2} of the read-only sum");
    }

    // The default model as users run it: the Q4_1 GGUF with its weights left quantized
    // (`BENCH_MODEL` points elsewhere, e.g. at the f32 HF folder, for comparisons).
    let path =
        std::env::var_os("BENCH_MODEL").map(PathBuf::from).unwrap_or_else(model::testing::smollm2_gguf);
    let mut model = Model::load(&path).unwrap_or_else(|e| {
        panic!("cannot load SmolLM2 from {} ({e}); run `cargo xtask fetch-model`", path.display())
    });
    let formats = weight_formats(&model);
    let vocab = model.config.vocab_size;
    let mut ws = Workspace::default();

    // Prefill: one 512-token prompt in one step (into a fresh region of the cache each time).
    let per_seq = (CONTEXT + 64).div_ceil(BLOCK);
    let n_seqs = 64;
    // The engine's CPU default cache dtype: what users run.
    let mut cache = cache_of(&model.config, BLOCK, per_seq * n_seqs, KV_DTYPE);
    let mut seqs = interleaved_seqs(n_seqs, per_seq, CONTEXT, vocab);
    let prefill = build_batch(&seqs[..1], &[CONTEXT], BLOCK, false);
    let prefill_secs = median_secs(samples.min(5), || {
        model.forward(&prefill.input(), &mut cache, &mut ws).expect("prefill");
    });
    let prefill_tok_s = CONTEXT as f64 / prefill_secs;
    eprintln!("prefill {prefill_tok_s:.0} tok/s");

    // Every sequence gets its own physical copy of the prompt's KV (the copy kernel, not 64
    // prefills): same attention traffic as 64 distinct contexts.
    share_first_prompt(&mut cache, n_seqs, CONTEXT / BLOCK);
    for s in &mut seqs {
        s.cached = CONTEXT - 1;
    }

    // Decode at batch 1: the query token at position 511 attends to 512 tokens. A step reads
    // every weight once and the sequence's K and V: those bytes over memcpy's are the fraction.
    // Each activation precision of the decode matmuls in turn, sample by sample (round robin,
    // so the machine's drift falls on all alike); the default's is the headline figure.
    let decode1 = build_batch(&seqs[..1], &[1], BLOCK, false);
    let precisions = [ActivationPrecision::default(), ActivationPrecision::F32, ActivationPrecision::Int16];
    let mut times = vec![Vec::new(); precisions.len()];
    for round in 0..=samples * 3 {
        for (i, &p) in precisions.iter().enumerate() {
            model.activations = p;
            let t = Instant::now();
            model.forward(&decode1.input(), &mut cache, &mut ws).expect("decode b1");
            // Round 0 warms each up.
            if round > 0 {
                times[i].push(t.elapsed().as_secs_f64());
            }
        }
    }
    model.activations = ActivationPrecision::default();
    let b1_secs: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    let kv_bytes = model.config.num_hidden_layers
        * 2
        * model.config.num_key_value_heads
        * model.config.head_dim
        * CONTEXT
        * KV_DTYPE.size_in_bytes();
    let step_bytes = (model.weight_bytes_per_step() + kv_bytes) as f64;
    let decode_tok_s_b1 = 1.0 / b1_secs[0];
    let bw_fraction = step_bytes / b1_secs[0] / memcpy;
    eprintln!(
        "decode b1 {decode_tok_s_b1:.1} tok/s ({:.2} GB/s); f32 activations {:.1}, int16 {:.1} tok/s",
        step_bytes / b1_secs[0] / 1e9,
        1.0 / b1_secs[1],
        1.0 / b1_secs[2],
    );

    // Decode at batch 64, context 512 each.
    let chunks = vec![1; n_seqs];
    let decode64 = build_batch(&seqs, &chunks, BLOCK, false);
    let b64_secs = median_secs(samples, || {
        model.forward(&decode64.input(), &mut cache, &mut ws).expect("decode b64");
    });
    let decode_tok_s_b64 = n_seqs as f64 / b64_secs;
    let flops = model.matmul_flops(n_seqs, n_seqs) + n_seqs as f64 * attention_flops(&model, CONTEXT);
    let gemm_fraction = flops / b64_secs / (gflops * 1e9);
    eprintln!("decode b64 {decode_tok_s_b64:.0} tok/s, {:.1} GFLOP/s", flops / b64_secs / 1e9);

    let mut figures = serde_json::json!({
        "model.gemm_gflops": gflops,
        "model.memcpy_gb_s": memcpy / 1e9,
        "model.prefill_tok_s": prefill_tok_s,
        "model.decode_tok_s_b1": decode_tok_s_b1,
        "model.decode_b1_bw_fraction": bw_fraction,
        "model.read_gb_s": read / 1e9,
        "model.decode_b1_read_fraction": step_bytes / b1_secs[0] / read,
        "model.decode_tok_s_b1_f32": 1.0 / b1_secs[1],
        "model.decode_b1_bw_fraction_f32": step_bytes / b1_secs[1] / memcpy,
        "model.decode_tok_s_b1_int16": 1.0 / b1_secs[2],
        "model.decode_b1_bw_fraction_int16": step_bytes / b1_secs[2] / memcpy,
        "model.decode_tok_s_b64": decode_tok_s_b64,
        "model.decode_b64_gemm_fraction": gemm_fraction,
    });
    for (ty, f) in &by_format {
        figures[format!("model.decode_{}_read_fraction", format!("{ty:?}").to_lowercase())] = (*f).into();
    }
    let mut md = format!(
        "## model (SmolLM2-135M-Instruct, {formats}, {} threads)\n\n\
         | figure | value |\n|---|---|\n\
         | f32 GEMM 1024³ | {gflops:.1} GFLOP/s |\n| memcpy (bytes read + written /s, all cores) | {:.2} GB/s |\n| read-only sum (all cores) | {:.2} GB/s |\n\
         | prefill, one 512-token prompt | {prefill_tok_s:.0} tok/s |\n\
         | decode batch 1, context 512 | {decode_tok_s_b1:.1} tok/s ({:.0} MB of weights + {:.0} MB of {KV_DTYPE:?} K/V per token, {bw_fraction:.2} of memcpy, {:.2} of the read-only sum) |\n\
         | decode batch 1, f32 activations | {:.1} tok/s ({:.2} of memcpy) |\n\
         | decode batch 1, int16 activations | {:.1} tok/s ({:.2} of memcpy) |\n\
         | decode batch 64, context 512 | {decode_tok_s_b64:.0} tok/s ({gemm_fraction:.2} of the GEMM roofline, matmul + attention FLOPs) |\n",
        rayon::current_num_threads(),
        memcpy / 1e9,
        read / 1e9,
        model.weight_bytes_per_step() as f64 / 1e6,
        kv_bytes as f64 / 1e6,
        step_bytes / b1_secs[0] / read,
        1.0 / b1_secs[1],
        step_bytes / b1_secs[1] / memcpy,
        1.0 / b1_secs[2],
        step_bytes / b1_secs[2] / memcpy,
    );
    md += &format!(
        "\n### Batch-1 decode per format ({} MiB of weights of {} columns, default activations, \
         medians of per-round ratios to a read-only sum)\n\n\
         | format | of the read-only sum |\n|---|---|\n",
        formats::WEIGHT_BYTES >> 20,
        formats::COLS,
    );
    for (ty, f) in &by_format {
        md += &format!("| {ty:?} | {f:.2} |\n");
    }
    drop(cache);
    let (l1b_figures, l1b_md) = l1b::measure(samples, &l1b::Rooflines { gemm_flops: gflops * 1e9, read });
    if let (Some(all), Some(more)) = (figures.as_object_mut(), l1b_figures.as_object()) {
        all.extend(more.clone());
    }
    md += &l1b_md;
    match std::env::var_os("BENCH_FIGURES_DIR") {
        Some(out) => {
            let out = PathBuf::from(out);
            std::fs::write(out.join("model.json"), serde_json::to_string_pretty(&figures).expect("json"))
                .expect("write model.json");
            std::fs::write(out.join("model.md"), md).expect("write model.md");
        }
        None => println!("{}\n{md}", serde_json::to_string_pretty(&figures).expect("json")),
    }
}

/// The storage formats of the model's matrices, e.g. "Q4_1 + Q8_0 weights".
fn weight_formats(model: &Model) -> String {
    let mut names: Vec<String> = model
        .layers
        .iter()
        .flat_map(|l| model::arch::LayerMatrix::ALL.map(|m| l.matrix(m)))
        .chain([model.lm_head()])
        .flat_map(|w| w.parts().iter().map(|p| format!("{:?}", p.format())))
        .collect();
    names.sort();
    names.dedup();
    format!("{} weights", names.join(" + "))
}

/// Physical block `b` of sequence `s` (blocks are interleaved across sequences).
fn seqs_block(b: usize, s: usize, n_seqs: usize) -> u32 {
    (b * n_seqs + s) as u32
}

/// `n_seqs` sequences of `len` random tokens (nothing cached yet), `per_seq` blocks each,
/// interleaved ([`seqs_block`]).
fn interleaved_seqs(n_seqs: usize, per_seq: usize, len: usize, vocab: usize) -> Vec<Seq> {
    (0..n_seqs)
        .map(|s| Seq {
            tokens: prompt(s as u32, len, vocab),
            cached: 0,
            blocks: (0..per_seq).map(|b| seqs_block(b, s, n_seqs)).collect(),
        })
        .collect()
}

/// Sequence 0's first `blocks` blocks of KV copied into every other sequence's own blocks.
fn share_first_prompt(cache: &mut kv_cache::KvCache, n_seqs: usize, blocks: usize) {
    let pairs: Vec<(u32, u32)> = (1..n_seqs)
        .flat_map(|s| (0..blocks).map(move |b| (seqs_block(b, 0, n_seqs), seqs_block(b, s, n_seqs))))
        .collect();
    attn_kernels::copy_blocks(cache, &pairs).expect("copy blocks");
}
