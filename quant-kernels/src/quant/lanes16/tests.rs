//! `lanes16` against an f64 reference over the scalar dequantization, for every format it takes,
//! on poisoned layouts (NaN around the weights, the activations and the output's columns).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::ggml::dequantize;
use crate::quant::tests::{FORMATS, Poisoned, offsets, random_part};

/// The instruction sets this CPU runs that have kernels here (AVX2's `vpmaddwd` kernels, and
/// AVX-512's `vpdpwssd` ones where the CPU has VNNI); the tests run each.
fn isas() -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::available().filter(|&isa| runs_on(isa)).collect();
    if isas.is_empty() {
        eprintln!("lanes16: this CPU has no AVX2, the path does not exist here");
    }
    isas
}

/// What the path computes, in f64, `Σ (w − m)·x̃ + m·x` with `x̃` the rounded activations, and
/// the bound on its distance from `Σ w·x`: `Σ |w − m|·dx/2`.
fn expectation(ty: GgmlType, bytes: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> [Vec<f64>; 3] {
    let mut w = vec![0.0f32; n * k];
    dequantize(ty, bytes, &mut w);
    let off = offsets(ty, bytes, n * k);
    let [mut exact, mut rounded, mut bound] = [vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]];
    for t in 0..m {
        for g in 0..k / 32 {
            let (codes, dx, _) = quantize_group(&x[t * k + 32 * g..]);
            for r in 0..n {
                for (j, &code) in codes.iter().enumerate() {
                    let i = 32 * g + j;
                    let (wi, mi, xi) = (f64::from(w[r * k + i]), off[r * k + i], f64::from(x[t * k + i]));
                    exact[t * n + r] += wi * xi;
                    rounded[t * n + r] += (wi - mi) * f64::from(code) * f64::from(dx) + mi * xi;
                    bound[t * n + r] += (wi - mi).abs() * f64::from(dx) / 2.0;
                }
            }
        }
    }
    [exact, rounded, bound]
}

/// One call on a [`Poisoned`] layout, checked against both the rounded-activation sum (to f32
/// accuracy) and the exact one (within the rounding bound).
fn check(isa: Isa, ty: GgmlType, (m, n, k): (usize, usize, usize), accumulate: bool, rng: &mut ChaCha8Rng) {
    let mut p = Poisoned::new(ty, (m, n, k), accumulate, rng);
    let out = p.out();
    let acts = Acts16::quantize(isa, &p.x, m, k);
    assert!(matmul(isa, out, &acts, m, &p.part(), accumulate), "{ty:?}: refused");
    acts.recycle();
    let [exact, rounded, bound] = expectation(ty, &p.bytes, n, k, &p.x, m);
    let base = if accumulate { 0.5 } else { 0.0 };
    let what = format!("{isa:?} {ty:?} m={m} n={n} k={k} acc={accumulate}");
    for (t, r, got) in p.results(&what) {
        let i = t * n + r;
        let scale: f64 = bound[i] * 65534.0 + 1.0;
        let got = f64::from(got) - base;
        assert!((got - rounded[i]).abs() <= 1e-6 * scale, "{what}: ({t}, {r}) = {got}, want {}", rounded[i]);
        assert!(
            (got - exact[i]).abs() <= bound[i] * 1.0001 + 1e-6 * scale,
            "{what}: ({t}, {r}) = {got}, exact {}",
            exact[i]
        );
    }
}

#[test]
fn every_format_matches_the_f64_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for isa in isas() {
        for ty in FORMATS.into_iter().filter(|&ty| supports(ty)) {
            let widths: &[usize] = if ty.block().0 == 32 { &[32, 96, 640] } else { &[256, 768] };
            for &k in widths {
                // Tokens: a panel of one lane vector and a short one, one full, a full and a
                // short one, several cache blocks' worth at k = 640; rows: under one micro-tile,
                // whole blocks, a block and a tail.
                for (m, n) in [(9, 5), (16, 12), (32, 13), (45, 67), (300, 19)] {
                    check(isa, ty, (m, n, k), m % 2 == 1, &mut rng);
                }
            }
        }
    }
}

/// A short last panel after a call whose every activation was NaN: the stale lanes past its
/// tokens (computed, never written out) leave the outputs as fresh buffers would.
#[test]
fn stale_lanes_of_an_earlier_call_stay_out_of_the_outputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for isa in isas() {
        for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
            Acts16::quantize(isa, &vec![f32::NAN; 64 * 256], 64, 256).recycle();
            check(isa, ty, (9, 13, 256), false, &mut rng);
        }
    }
}

#[test]
fn groups_round_to_nearest_and_non_finite_ones_poison() {
    let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 8.0).collect();
    let (codes, dx, sum) = quantize_group(&x);
    assert_eq!(dx, 1.9375 / 32767.0);
    assert_eq!(
        (codes[0], codes[16], codes[31]),
        (-32767, (0.0625f32 * (32767.0 / 1.9375)).round() as i16, 32767)
    );
    assert_eq!(sum, 0.0);
    x[3] = f32::INFINITY;
    assert!(quantize_group(&x).1.is_nan());
    x[3] = f32::NAN;
    assert!(quantize_group(&x).1.is_nan());
    let (codes, dx, _) = quantize_group(&[1e-31; 32]);
    assert_eq!((codes, dx), ([0; 32], 0.0));
}

#[test]
fn the_simd_rounding_is_the_rule_s() {
    for isa in isas() {
        simd_rounding_is_the_rule_s(isa);
    }
}

fn simd_rounding_is_the_rule_s(isa: Isa) {
    let (m, k) = (35, 96);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-3.0..3.0)).collect();
    x[40] = f32::NAN;
    x[k + 70] = f32::NEG_INFINITY;
    x[2 * k..2 * k + 32].fill(1e-31);
    x[3 * k + 32..3 * k + 64].fill(0.0);
    let acts = Acts16::quantize(isa, &x, m, k);
    for t in 0..m {
        let (words, dx, _) = acts.panel(t / TM);
        let i = t % TM;
        for g in 0..k / 32 {
            let (codes, want_dx, _) = quantize_group(&x[t * k + 32 * g..]);
            let got_dx = dx[g * TM + i];
            assert!(
                got_dx == want_dx || (got_dx.is_nan() && want_dx.is_nan()),
                "{isa:?} token {t} group {g}: {got_dx} vs {want_dx}"
            );
            for (j, &c) in codes.iter().enumerate() {
                let word = words[((16 * g + j / 2) * TM + i) * 2 + j % 2];
                assert_eq!(word, c, "{isa:?} token {t} group {g} value {j}");
            }
        }
    }
}

/// Through `Weight::matmul_as`: a fused weight's parts each fill their own columns with what the
/// part alone computes (the activations rounded once for both), and an f32 part sends the call
/// to the float kernels.
#[test]
fn a_fused_weight_s_parts_fill_their_columns() {
    for isa in isas() {
        fused_parts_fill_their_columns(isa);
    }
}

fn fused_parts_fill_their_columns(isa: Isa) {
    use crate::quant::{ActivationPrecision, Part, Storage, Weight};
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (m, k) = (crate::quant::DECODE_MAX_M + 21, 256);
    let specs = [(GgmlType::Q5_0, 7), (GgmlType::Q6_K, 5), (GgmlType::Q4_K, 13)];
    let bytes: Vec<Vec<u8>> = specs.iter().map(|&(ty, rows)| random_part(ty, rows, k, &mut rng)).collect();
    let part = |i: usize| Part::new(specs[i].0, specs[i].1, k, Storage::Owned(bytes[i].clone())).unwrap();
    let fused = Weight::from_parts(k, (0..specs.len()).map(part).collect());
    let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let n = fused.rows();
    let mut got = vec![f32::NAN; m * n];
    fused.matmul_as(isa, ActivationPrecision::Int16, &mut got, &x, m, false);
    let mut col = 0;
    for i in 0..specs.len() {
        let alone = Weight::from_parts(k, vec![part(i)]);
        let rows = alone.rows();
        let mut want = vec![0.0; m * rows];
        alone.matmul_as(isa, ActivationPrecision::Int16, &mut want, &x, m, false);
        for t in 0..m {
            assert_eq!(
                got[t * n + col..t * n + col + rows],
                want[t * rows..(t + 1) * rows],
                "{isa:?} part {i}, token {t}"
            );
        }
        col += rows;
    }
    // With an f32 part the whole call takes the f32 kernels: exactly `matmul`'s result.
    let f32_part = Part::new(GgmlType::F32, 2, k, Storage::F32(x[..2 * k].to_vec())).unwrap();
    let mixed = Weight::from_parts(k, vec![part(0), f32_part]);
    let (mut a, mut b) = (vec![0.0; m * 9], vec![0.0; m * 9]);
    mixed.matmul_as(isa, ActivationPrecision::Int16, &mut a, &x, m, false);
    mixed.matmul_as(isa, ActivationPrecision::F32, &mut b, &x, m, false);
    assert_eq!(a, b);
}
