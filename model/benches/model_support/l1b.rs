//! The `model` bench at a real size: Llama-3.2-1B's shapes (`cargo xtask make-model`, Q4_0,
//! random weights) in the forward pass alone, put over this CPU's rooflines measured in the
//! same run: a 512-token prefill and a 16-sequence decode step over the peak multiply-add rate
//! of the activation path that ran (int16: `vpdpwssd`; int8: `vpdpbusd`; f32: the GEMM's), and
//! batch-1 decode over the read-only sum; and the 16-sequence step's time phase by phase.
//! `L1B_ACTIVATIONS=int16|int8|f32` measures that path instead of this CPU's default.

use attn_kernels::yardstick::{Dot, peak_macs_per_sec};
use kv_cache::DType;
use model::forward::timed::{Phase, StepProfile};
use model::{ActivationPrecision, Model, Workspace};
use quant_kernels::Isa;
use quant_kernels::quant::INTEGER_CODE_FORMATS;

use super::harness::{build_batch, cache_of};
use super::{interleaved_seqs, median, median_secs, share_first_prompt};

const CONTEXT: usize = 512;
const BLOCK: usize = 16;
/// Sequences of the batched decode step.
const BATCH: usize = 16;

/// The rooflines the figures are put over.
pub struct Rooflines {
    /// f32 GEMM, FLOP/s.
    pub gemm_flops: f64,
    /// Read-only sum, bytes/s.
    pub read: f64,
}

/// Figures `model.peak_int16_gmacs`, `model.peak_int8_gmacs` and `model.l1b.*`, and the report's
/// section.
pub fn measure(samples: usize, roof: &Rooflines) -> (serde_json::Value, String) {
    // Long enough a loop (some 10⁹ instructions a thread) for the clock to settle.
    let peak16 = median_of(samples, || peak_macs_per_sec(Dot::Int16, 20_000_000));
    let peak8 = median_of(samples, || peak_macs_per_sec(Dot::Int8, 20_000_000));
    eprintln!("peak multiply-adds: int16 {:.0} G/s, int8 {:.0} G/s", peak16 / 1e9, peak8 / 1e9);

    let path = model::testing::made_model_fetched("llama-3.2-1b", "q4_0").unwrap_or_else(|e| panic!("{e}"));
    let mut model = Model::load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
    let activations = match std::env::var("L1B_ACTIVATIONS").as_deref() {
        Ok("int8") => ActivationPrecision::Int8,
        Ok("int16") => ActivationPrecision::Int16,
        Ok("f32") => ActivationPrecision::F32,
        _ => ActivationPrecision::default().resolve(Isa::detected(), INTEGER_CODE_FORMATS.into_iter()),
    };
    model.activations = activations;
    let (peak, peak_name) = match activations {
        ActivationPrecision::Int16 => (peak16, "int16 vpdpwssd peak"),
        ActivationPrecision::Int8 => (peak8, "int8 vpdpbusd peak"),
        _ => (roof.gemm_flops / 2.0, "f32 GEMM roofline"),
    };
    let vocab = model.config.vocab_size;
    let mut ws = Workspace::default();
    let per_seq = (CONTEXT + 16).div_ceil(BLOCK);
    let mut cache = cache_of(&model.config, BLOCK, per_seq * BATCH, DType::BF16);
    let mut seqs = interleaved_seqs(BATCH, per_seq, CONTEXT + 1, vocab);

    // Prefill: one 512-token prompt in one step; its matmuls' multiply-adds over the time.
    let prefill = build_batch(&seqs[..1], &[CONTEXT], BLOCK, false);
    let prefill_secs = median_secs(samples.min(5), || {
        model.forward(&prefill.input(), &mut cache, &mut ws).expect("prefill");
    });
    let prefill_macs = model.matmul_flops(CONTEXT, 1) / 2.0;
    // Every sequence's own copy of the prompt's KV (the copy kernel, not 16 prefills).
    share_first_prompt(&mut cache, BATCH, CONTEXT / BLOCK);
    for s in &mut seqs {
        s.cached = CONTEXT;
    }

    // Decode: 16 sequences at context 512, then one of them alone, in alternation.
    let b16 = build_batch(&seqs, &[1; BATCH], BLOCK, false);
    let b1 = build_batch(&seqs[..1], &[1], BLOCK, false);
    let (mut t16, mut t1) = (Vec::new(), Vec::new());
    for round in 0..=samples {
        for (batch, times) in [(&b16, &mut t16), (&b1, &mut t1)] {
            let t = std::time::Instant::now();
            model.forward(&batch.input(), &mut cache, &mut ws).expect("decode");
            if round > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
    }
    let (b16_secs, b1_secs) = (median(&mut t16), median(&mut t1));
    let breakdown =
        step_breakdown("16-sequence", &model, &b16.input(), &mut cache, &mut ws, samples, b16_secs)
            + &step_breakdown("batch-1", &model, &b1.input(), &mut cache, &mut ws, samples, b1_secs);
    let b16_macs = model.matmul_flops(BATCH, BATCH) / 2.0;
    let c = &model.config;
    let kv_bytes = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * (CONTEXT + 1) * 2;
    let step_bytes = (model.weight_bytes_per_step() + kv_bytes) as f64;

    let prefill_fraction = prefill_macs / prefill_secs / peak;
    let b16_fraction = b16_macs / b16_secs / peak;
    let b1_fraction = step_bytes / b1_secs / roof.read;
    let figures = serde_json::json!({
        "model.peak_int16_gmacs": peak16 / 1e9,
        "model.peak_int8_gmacs": peak8 / 1e9,
        "model.l1b.prefill_tok_s": CONTEXT as f64 / prefill_secs,
        "model.l1b.prefill_mac_fraction": prefill_fraction,
        "model.l1b.decode_b16_tok_s": BATCH as f64 / b16_secs,
        "model.l1b.decode_b16_mac_fraction": b16_fraction,
        "model.l1b.decode_b1_tok_s": 1.0 / b1_secs,
        "model.l1b.decode_b1_bw_fraction": b1_fraction,
    });
    let md = format!(
        "\n### Llama-3.2-1B's shapes (random weights, Q4_0 by llama.cpp's quantizer), {activations:?} activations, bf16 KV\n\n\
         Peak multiply-adds of a register-only loop on every thread: int16 {:.0} G/s, int8 {:.0} G/s; \
         the path that ran is put over its {peak_name} ({:.0} G/s). Matmul multiply-adds only \
         (attention, norms and the rest count as time, not work).\n\n\
         | case | tok/s | of the roofline |\n|---|---:|---:|\n\
         | prefill, one 512-token prompt | {:.1} | {prefill_fraction:.2} of the peak |\n\
         | decode, 16 sequences at context 512 | {:.1} | {b16_fraction:.2} of the peak |\n\
         | decode, batch 1 at context 512 | {:.1} | {b1_fraction:.2} of the read-only sum ({:.0} MB a step) |\n",
        peak16 / 1e9,
        peak8 / 1e9,
        peak / 1e9,
        CONTEXT as f64 / prefill_secs,
        BATCH as f64 / b16_secs,
        1.0 / b1_secs,
        step_bytes / 1e6,
    ) + &breakdown;
    (figures, md)
}

/// The report's breakdown of a decode step (`what`: which one): each phase of `samples` profiled
/// steps (every op timed) as a share of those steps' wall time, the rest being outside the ops
/// (entering the pool, between ops); `step_secs` is the untimed step's median, for scale.
fn step_breakdown(
    what: &str,
    model: &Model,
    input: &model::ModelInput<'_>,
    cache: &mut kv_cache::KvCache,
    ws: &mut Workspace,
    samples: usize,
    step_secs: f64,
) -> String {
    let mut profile = StepProfile::default();
    let rounds = samples.max(1);
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        model.forward_profiled(input, cache, ws, &mut profile).expect("profiled decode");
    }
    let per_step = |s: f64| s / rounds as f64;
    let wall = per_step(start.elapsed().as_secs_f64());
    let mut md = format!(
        "\nThe {what} decode step by phase ({rounds} steps with every op timed, mean {:.1} ms; \
         untimed, the step's median is {:.1} ms):\n\n| phase | ms | share |\n|---|---:|---:|\n",
        wall * 1e3,
        step_secs * 1e3
    );
    let mut row = |name: &str, secs: f64| {
        md += &format!("| {name} | {:.2} | {:.1} % |\n", secs * 1e3, 100.0 * secs / wall)
    };
    for phase in Phase::ALL {
        let secs = per_step(profile.secs(phase));
        if secs > 0.0 {
            row(phase.name(), secs);
        }
    }
    let matmuls: f64 = Phase::ALL.iter().filter(|p| p.is_matmul()).map(|&p| per_step(profile.secs(p))).sum();
    row("all matmuls", matmuls);
    row("outside the ops (entering the pool, between ops)", wall - per_step(profile.total()));
    md
}

fn median_of(samples: usize, mut f: impl FnMut() -> f64) -> f64 {
    let mut v: Vec<f64> = (0..samples.clamp(3, 5) | 1).map(|_| f()).collect();
    median(&mut v)
}
