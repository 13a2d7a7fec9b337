//! The int8 path: every kernel this CPU runs against an f64 expectation over the rounded
//! activations, on poisoned layouts; the same bits on every path and at every token count;
//! the rounding rule; and its place in `Weight::matmul_as` (fallbacks, special values).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::ggml::dequantize;
use crate::quant::tests::{Poisoned, offsets, random_part, special_groups, two_tokens_times};
use crate::quant::{ActivationPrecision, INTEGER_CODE_FORMATS, Part};

/// The rounding rule, stated apart from the kernels: per group of 32, `dx = max|x|/127` and
/// `a = round(x·(127/max|x|))`, ties to even; NaN for a group with a NaN or an infinity, zero
/// for one whose values are all under 1e-30. Returns each value's `a·dx` and `dx`.
fn rounded(x: &[f32]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(x.len());
    for group in x.chunks_exact(32) {
        let amax = group.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let finite = group.iter().all(|v| v.is_finite());
        for &v in group {
            out.push(if !finite {
                (f64::NAN, f64::NAN)
            } else if amax < 1e-30 {
                (0.0, 0.0)
            } else {
                let a = (v * (127.0 / amax)).round_ties_even();
                assert!(a.abs() <= 127.0);
                let dx = f64::from(amax / 127.0);
                (f64::from(a) * dx, dx)
            });
        }
    }
    out
}

/// Per output: `Σ w·ã` in f64 (the dequantized weights times the rounded activations), the
/// bound on an f32 evaluation's distance from it (`(2·steps + 11)·2⁻²⁴` of the magnitudes of
/// its terms: each product's scale, each accumulator's FMAs, the sums and the dequantization
/// all round once), and the bound from the rounding itself, `Σ |w|·dx/2`.
fn expectation(ty: GgmlType, bytes: &[u8], (m, n, k): (usize, usize, usize), x: &[f32]) -> [Vec<f64>; 3] {
    let mut w = vec![0.0f32; n * k];
    dequantize(ty, bytes, &mut w);
    let off = offsets(ty, bytes, n * k);
    let xr = rounded(&x[..m * k]);
    let roundings = (2 * k.div_ceil(32 * STEP) + 11) as f64 / f64::from(1u32 << 24);
    let [mut want, mut tight, mut loose] = [vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]];
    for t in 0..m {
        for r in 0..n {
            let (mut sum, mut size, mut step) = (0.0, 0.0, 0.0);
            for i in 0..k {
                let (wi, mi) = (f64::from(w[r * k + i]), off[r * k + i]);
                let (xi, dx) = xr[t * k + i];
                sum += wi * xi;
                size += (wi.abs() + (wi - mi).abs() + mi.abs()) * xi.abs();
                step += wi.abs() * dx / 2.0;
            }
            (want[t * n + r], tight[t * n + r], loose[t * n + r]) = (sum, size * roundings, step);
        }
    }
    [want, tight, loose]
}

/// Shapes for format `ty`: row widths (for the 32-value formats: one group, a short step, a
/// step and one group, two steps and one group) and token counts.
fn widths(ty: GgmlType) -> &'static [usize] {
    if ty.block().0 == 32 { &[32, 96, 288, 544] } else { &[256, 768] }
}

/// `matmul_parts` on a [`Poisoned`] layout made from `seed` on `isa`'s kernels: the outputs
/// (token, row, value), once the padding around them is checked.
fn run_poisoned(
    isa: Isa,
    ty: GgmlType,
    dims: (usize, usize, usize),
    accumulate: bool,
    seed: u64,
) -> Poisoned {
    let mut p = Poisoned::new(ty, dims, accumulate, &mut ChaCha8Rng::seed_from_u64(seed));
    let out = p.out();
    let xq = X8::quantize(isa, &p.x, p.m, p.k);
    matmul_parts(isa, &xq, p.m, &[(p.part(), out)], accumulate);
    p
}

#[test]
fn every_path_matches_the_f64_expectation_and_the_portable_bits() {
    let mut seed = 0;
    for ty in INTEGER_CODE_FORMATS {
        for &k in widths(ty) {
            for (m, n) in [(1, 9), (3, 7), (8, 33), (17, 5)] {
                seed += 1;
                let accumulate = m % 2 == 1;
                let portable = run_poisoned(Isa::Portable, ty, (m, n, k), accumulate, seed);
                let what = format!("{ty:?} m={m} n={n} k={k} acc={accumulate}");
                let want = portable.results(&what);
                let [exact, tight, _] = expectation(ty, &portable.bytes, (m, n, k), &portable.x);
                let base = if accumulate { 0.5 } else { 0.0 };
                for &(t, r, got) in &want {
                    let i = t * n + r;
                    // Adding to the base rounds once more.
                    let bound = tight[i] + (base + exact[i].abs()) / f64::from(1u32 << 23) + 1e-30;
                    let got = f64::from(got) - base;
                    assert!((got - exact[i]).abs() <= bound, "{what}: ({t}, {r}) = {got}, want {}", exact[i]);
                }
                for isa in Isa::available().filter(|&isa| isa != Isa::Portable) {
                    let got = run_poisoned(isa, ty, (m, n, k), accumulate, seed).results(&what);
                    for (&(t, r, g), &(_, _, w)) in got.iter().zip(&want) {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{isa:?} {what}: ({t}, {r}) = {g}, portable {w}"
                        );
                    }
                }
            }
        }
    }
}

/// A weight of one part of `ty`, `n × k`, random.
fn weight(ty: GgmlType, n: usize, k: usize, rng: &mut ChaCha8Rng) -> Weight {
    let part = Part::new(ty, n, k, Storage::Owned(random_part(ty, n, k, rng))).unwrap();
    Weight::from_parts(k, vec![part])
}

/// `m` tokens of `k` activations of very different sizes (each group's scale from 10⁻³ to
/// 10³), so groups round on scales of their own.
fn activations(m: usize, k: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    for group in x.chunks_exact_mut(32) {
        let scale = 10f32.powf(rng.random_range(-3.0..3.0));
        group.iter_mut().for_each(|v| *v *= scale);
    }
    x
}

#[test]
fn a_token_s_outputs_are_the_same_bits_at_every_batch_size_and_on_every_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let n = 37;
    for ty in INTEGER_CODE_FORMATS {
        let k = if ty.block().0 == 32 { 288 } else { 512 };
        let w = weight(ty, n, k, &mut rng);
        let x = activations(100, k, &mut rng);
        let base: Vec<f32> = (0..100 * n).map(|_| rng.random_range(-1.0..1.0)).collect();
        for accumulate in [false, true] {
            // Each token alone on the portable path: what every call must reproduce.
            let mut alone = base.clone();
            for (t, dst) in alone.chunks_exact_mut(n).enumerate() {
                let xt = &x[t * k..(t + 1) * k];
                w.matmul_as(Isa::Portable, ActivationPrecision::Int8, dst, xt, 1, accumulate);
            }
            for isa in Isa::available() {
                for m in [1, 2, 7, 8, 12, 16, 33, 100] {
                    let mut dst = base[..m * n].to_vec();
                    w.matmul_as(isa, ActivationPrecision::Int8, &mut dst, &x[..m * k], m, accumulate);
                    for (i, (g, a)) in dst.iter().zip(&alone).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            a.to_bits(),
                            "{isa:?} {ty:?} m={m} acc={accumulate} ({}, {}): {g} vs {a} alone",
                            i / n,
                            i % n
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn int8_outputs_stay_within_the_rounding_of_the_f32_ones() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let (m, n) = (5, 19);
    for ty in INTEGER_CODE_FORMATS {
        let k = if ty.block().0 == 32 { 544 } else { 768 };
        let w = weight(ty, n, k, &mut rng);
        let x = activations(m, k, &mut rng);
        let bytes = w.parts()[0].bytes();
        let [_, tight, loose] = expectation(ty, bytes, (m, n, k), &x);
        for isa in Isa::available() {
            let (mut f32_out, mut int8_out) = (vec![0.0; m * n], vec![0.0; m * n]);
            w.matmul_as(isa, ActivationPrecision::F32, &mut f32_out, &x, m, false);
            w.matmul_as(isa, ActivationPrecision::Int8, &mut int8_out, &x, m, false);
            for (i, (g, f)) in int8_out.iter().zip(&f32_out).enumerate() {
                let bound = loose[i] * 1.0001 + 2.0 * tight[i] + 1e-5 * f64::from(f.abs()) + 1e-6;
                assert!(f64::from((g - f).abs()) <= bound, "{isa:?} {ty:?} {i}: {g} vs f32 {f}");
            }
            // The rounding moves the products (by 2⁻⁸ of each group's largest at most).
            assert_ne!(int8_out, f32_out, "{isa:?} {ty:?}: int8 ran the f32 kernels");
        }
    }
}

#[test]
fn activations_round_by_the_rule_on_every_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    let k = 352;
    let mut x = activations(3, k, &mut rng);
    // Ties: with max|x| = 127 the codes are the values, rounded to even.
    x[..32].iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 - 15.5);
    x[31] = 127.0;
    x[32 + 5] = f32::NAN;
    x[64 + 1] = f32::INFINITY;
    x[96..128].fill(0.0);
    x[128..160].iter_mut().for_each(|v| *v *= 1e-36);
    let want = rounded(&x);
    let portable = X8::quantize(Isa::Portable, &x, 3, k);
    for isa in Isa::available() {
        let xq = X8::quantize(isa, &x, 3, k);
        for t in 0..3 {
            for g in 0..k / 32 {
                let (s, j) = (g / STEP, g % STEP);
                let at = xq.at(t, s) + j;
                let codes = &xq.codes(t, s)[32 * j..][..32];
                let mut sum = 0;
                for (i, &c) in codes.iter().enumerate() {
                    let (value, dx) = want[t * k + 32 * g + i];
                    if dx.is_nan() {
                        assert!(xq.dx[at].is_nan() && c == 0, "{isa:?} token {t} group {g}: NaN lost");
                    } else {
                        assert_eq!(f64::from(c) * f64::from(xq.dx[at]), value, "{isa:?} ({t}, {g}, {i})");
                    }
                    sum += i32::from(c);
                }
                assert_eq!(xq.sums[at], sum);
                assert_eq!(xq.sx[at].to_bits(), (xq.dx[at] * sum as f32).to_bits());
            }
        }
        assert_eq!(xq.q, portable.q, "{isa:?}");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for (a, b) in [(&xq.dx, &portable.dx), (&xq.sx, &portable.sx), (&xq.dx16, &portable.dx16)] {
            assert_eq!(bits(a), bits(b), "{isa:?}");
        }
        assert_eq!((&xq.sums, &xq.sums16), (&portable.sums, &portable.sums16), "{isa:?}");
    }
    // The ties of group 0: −15.5 → −16, −14.5 → −14, …, 0.5 → 0, 1.5 → 2.
    let codes = &portable.codes(0, 0)[..4];
    assert_eq!(codes, [-16, -14, -14, -12]);
}

#[test]
fn nan_zero_and_tiny_groups_come_out_as_the_f32_kernels_make_them() {
    let mut rng = ChaCha8Rng::seed_from_u64(27);
    let (n, k) = (5, 256);
    for ty in INTEGER_CODE_FORMATS {
        let w = weight(ty, n, k, &mut rng);
        let x = special_groups(k, &mut rng);
        let [_, tight, loose] = expectation(ty, w.parts()[0].bytes(), (2, n, k), &x);
        for isa in Isa::available() {
            let [want, got] = [ActivationPrecision::F32, ActivationPrecision::Int8]
                .map(|precision| two_tokens_times(&w, isa, precision, &x));
            assert!(got[..n].iter().all(|v| v.is_nan()), "{isa:?} {ty:?}: NaN lost");
            for (i, (g, r)) in got.iter().zip(&want).enumerate().skip(n) {
                let bound = loose[i] * 1.0001 + 2.0 * tight[i] + 1e-5 * f64::from(r.abs()) + 1e-6;
                assert!(f64::from((g - r).abs()) <= bound, "{isa:?} {ty:?}: {g} vs {r}");
            }
        }
    }
}

/// A weight with an integer-code part, an f16 one and an f32 one: in decode each part runs its
/// own kernels (int8, f32 decode, `gemm`); a batch runs all of them as f32, as int16 does.
#[test]
fn weights_of_other_formats_fall_back_as_with_int16() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let k = 256;
    let mut part = |ty: GgmlType, rows: usize| {
        let bytes = random_part(ty, rows, k, &mut rng);
        let data = if ty == GgmlType::F32 {
            Storage::F32(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
        } else {
            Storage::Owned(bytes)
        };
        Part::new(ty, rows, k, data).unwrap()
    };
    let (q4k, f16, f32) = (part(GgmlType::Q4_K, 5), part(GgmlType::F16, 3), part(GgmlType::F32, 2));
    let alone = Weight::from_parts(k, vec![Part::new(GgmlType::Q4_K, 5, k, q4k.data.share()).unwrap()]);
    let mixed = Weight::from_parts(k, vec![q4k, f16, f32]);
    let x = activations(12, k, &mut rng);
    for isa in Isa::available() {
        for m in [3, 12] {
            let (mut int8, mut float, mut q4k_int8) =
                (vec![0.0; m * 10], vec![0.0; m * 10], vec![0.0; m * 5]);
            mixed.matmul_as(isa, ActivationPrecision::Int8, &mut int8, &x, m, false);
            mixed.matmul_as(isa, ActivationPrecision::F32, &mut float, &x, m, false);
            alone.matmul_as(isa, ActivationPrecision::Int8, &mut q4k_int8, &x, m, false);
            for t in 0..m {
                let (row, want) = (&int8[t * 10..][..10], &float[t * 10..][..10]);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&row[5..]), bits(&want[5..]), "{isa:?} m={m}: f16 and f32 parts as f32");
                if m <= DECODE_MAX_M {
                    assert_eq!(bits(&row[..5]), bits(&q4k_int8[t * 5..][..5]), "{isa:?} m={m}: Q4_K on int8");
                } else {
                    assert_eq!(bits(&row[..5]), bits(&want[..5]), "{isa:?} m={m}: a mixed batch is f32");
                }
            }
        }
    }
}

#[test]
fn int8_is_asked_for_never_chosen() {
    use ActivationPrecision::{Auto, Int8};
    for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
        for parts in [&[GgmlType::Q4_0][..], &[GgmlType::Q6_K, GgmlType::F16]] {
            assert_eq!(Int8.resolve(isa, parts.iter().copied()), Int8);
            assert_ne!(Auto.resolve(isa, parts.iter().copied()), Int8);
        }
    }
}
