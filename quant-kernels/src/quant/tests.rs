//! The quantized kernels against an f64 reference of dequantize-then-matmul, for every format,
//! on every path this CPU runs (the portable one everywhere), with NaN around every buffer so
//! a read or write outside its bounds shows.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::ggml::dequantize;

/// Every quantized format: the integer-code ones, then f16 and bf16.
pub(super) const FORMATS: [GgmlType; 10] = {
    let mut all = [GgmlType::F16; 10];
    let mut i = 0;
    while i < INTEGER_CODE_FORMATS.len() {
        all[i] = INTEGER_CODE_FORMATS[i];
        i += 1;
    }
    all[9] = GgmlType::BF16;
    all
};

/// `rows × cols` random values of `ty`: random quant bytes under sane f16 scales.
pub(super) fn random_part(ty: GgmlType, rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let (per_block, block_bytes) = ty.block();
    let mut bytes = vec![0u8; rows * cols / per_block * block_bytes];
    rng.fill(&mut bytes[..]);
    let f16_at = |b: &mut [u8], at: usize, lo: f32, hi: f32, rng: &mut ChaCha8Rng| {
        b[at..at + 2].copy_from_slice(&f16::from_f32(rng.random_range(lo..hi)).to_le_bytes())
    };
    for b in bytes.chunks_exact_mut(block_bytes) {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => f16_at(b, 0, 0.001, 0.05, rng),
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                f16_at(b, 0, 0.001, 0.05, rng);
                f16_at(b, 2, -0.4, 0.0, rng);
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                f16_at(b, 0, 0.0001, 0.005, rng);
                f16_at(b, 2, 0.0001, 0.005, rng);
            }
            GgmlType::Q6_K => f16_at(b, 208, 0.0001, 0.002, rng),
            GgmlType::F16 => f16_at(b, 0, -1.0, 1.0, rng),
            GgmlType::BF16 => b.copy_from_slice(&bf16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes()),
            GgmlType::F32 => b.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes()),
        }
    }
    bytes
}

/// `x[m, k] · Wᵀ` in f64 over the scalar dequantization, and Σ|x||w| per entry (the scale
/// of the rounding error an f32 kernel may make).
fn reference(ty: GgmlType, bytes: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> (Vec<f64>, Vec<f64>) {
    let mut w = vec![0.0f32; n * k];
    dequantize(ty, bytes, &mut w);
    let mut want = vec![0.0; m * n];
    let mut scale = vec![0.0; m * n];
    for t in 0..m {
        for r in 0..n {
            for kk in 0..k {
                let p = f64::from(x[t * k + kk]) * f64::from(w[r * k + kk]);
                want[t * n + r] += p;
                scale[t * n + r] += p.abs();
            }
        }
    }
    (want, scale)
}

/// The kernels a call of `m` tokens can take: decode, or both prefill routes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    Decode,
    /// Decode on the integer kernels over int16 activations (`int16`).
    DecodeInt16,
    Gemm,
    TokenLanes,
    /// The prefill route past `token_lanes`' range, in slabs of 16 rows (so a weight of more
    /// rows is split, the last slab short).
    Slabs,
}

/// Every kernel (route) on every path, for one shape.
fn check(isa: Isa, ty: GgmlType, m: usize, n: usize, k: usize, accumulate: bool, rng: &mut ChaCha8Rng) {
    if m <= DECODE_MAX_M {
        check_route(Route::Decode, isa, Poisoned::new(ty, (m, n, k), accumulate, rng));
        if int16::supports(ty) {
            check_route(Route::DecodeInt16, isa, Poisoned::new(ty, (m, n, k), accumulate, rng));
        }
    } else {
        check_route(Route::Gemm, isa, Poisoned::new(ty, (m, n, k), accumulate, rng));
        check_route(Route::TokenLanes, isa, Poisoned::new(ty, (m, n, k), accumulate, rng));
        check_route(Route::Slabs, isa, Poisoned::new(ty, (m, n, k), accumulate, rng));
    }
}

/// Each value's offset `m` (`value = d·code + m`, the code centred for the centred formats),
/// read independently of the kernel: the offset formats' blocks dequantized with every code
/// byte zeroed (the value of code 0 is the offset); zero for the centred formats.
pub(super) fn offsets(ty: GgmlType, bytes: &[u8], values: usize) -> Vec<f64> {
    // Where each offset format's code bytes (and fifth bits) lie in its block.
    let codes = match ty {
        GgmlType::Q4_1 => 4..20,
        GgmlType::Q5_1 => 4..24,
        GgmlType::Q4_K => 16..144,
        GgmlType::Q5_K => 16..176,
        _ => return vec![0.0; values],
    };
    let mut zeroed = bytes.to_vec();
    for block in zeroed.chunks_exact_mut(ty.block().1) {
        block[codes.clone()].fill(0);
    }
    let mut m = vec![0.0f32; values];
    dequantize(ty, &zeroed, &mut m);
    m.into_iter().map(f64::from).collect()
}

/// A kernel call's buffers on a poisoned layout: the part's bytes between 0xFF runs (an f16 NaN
/// in any scale read outside them), `x` with a NaN tail, and the output as columns 2..2+n of
/// rows `n + 5` wide whose other columns are NaN and must stay so.
pub(super) struct Poisoned {
    pub ty: GgmlType,
    /// The part's bytes as they are.
    pub bytes: Vec<u8>,
    padded: Vec<u8>,
    pub x: Vec<f32>,
    dst: Vec<f32>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub accumulate: bool,
}

impl Poisoned {
    const PAD: usize = 64;
    const COL0: usize = 2;

    /// A random `n × k` part of `ty`, `m` random tokens, and the output holding 0.5 (to be
    /// added to, with `accumulate`) or NaN (to be overwritten).
    pub(super) fn new(
        ty: GgmlType,
        (m, n, k): (usize, usize, usize),
        accumulate: bool,
        rng: &mut ChaCha8Rng,
    ) -> Self {
        let bytes = random_part(ty, n, k, rng);
        let mut padded = vec![0xffu8; bytes.len() + 2 * Self::PAD];
        padded[Self::PAD..Self::PAD + bytes.len()].copy_from_slice(&bytes);
        let mut x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        x.extend([f32::NAN; 37]);
        let ldd = n + 5;
        let mut dst = vec![f32::NAN; m * ldd];
        for row in dst.chunks_exact_mut(ldd) {
            row[Self::COL0..Self::COL0 + n].fill(if accumulate { 0.5 } else { f32::NAN });
        }
        Self { ty, bytes, padded, x, dst, m, n, k, accumulate }
    }

    /// Where the kernel writes (no borrow is kept: take it before [`Self::part`]).
    pub(super) fn out(&mut self) -> Out {
        Out { ptr: OutPtr(self.dst.as_mut_ptr()).offset(Self::COL0), ldd: self.n + 5 }
    }

    pub(super) fn part(&self) -> PartRef<'_> {
        let bytes = &self.padded[Self::PAD..Self::PAD + self.bytes.len()];
        PartRef { ty: self.ty, rows: self.n, cols: self.k, bytes }
    }

    /// Each output entry as `(token, row, value)`, once every padding column is checked to be
    /// untouched.
    pub(super) fn results(&self, what: &str) -> Vec<(usize, usize, f32)> {
        let ldd = self.n + 5;
        let mut entries = Vec::new();
        for (t, row) in self.dst.chunks_exact(ldd).enumerate() {
            for (c, &got) in row.iter().enumerate() {
                if (Self::COL0..Self::COL0 + self.n).contains(&c) {
                    entries.push((t, c - Self::COL0, got));
                } else {
                    assert!(got.is_nan(), "{what}: padding column {c} of token {t} written");
                }
            }
        }
        entries
    }
}

/// One kernel call on a [`Poisoned`] layout.
fn check_route(route: Route, isa: Isa, mut p: Poisoned) {
    let (ty, m, n, k, accumulate) = (p.ty, p.m, p.n, p.k, p.accumulate);
    let out = p.out();
    let (part, x) = (p.part(), &p.x);
    match route {
        Route::Decode => decode::matmul(isa, None, out, x, m, &part, accumulate),
        Route::DecodeInt16 if isa != Isa::Portable => {
            let xq = int16::X16::quantize(x, m, k);
            decode::matmul(isa, Some(&xq), out, x, m, &part, accumulate)
        }
        Route::DecodeInt16 => decode::matmul(isa, None, out, x, m, &part, accumulate),
        Route::Gemm => panel::via_gemm(isa, out, x, m, &part, accumulate),
        Route::Slabs => panel::slabs_of(16 * 4 * k, isa, out, x, m, &[part], accumulate),
        Route::TokenLanes => {
            if !panel::via_token_lanes(isa, out, x, m, &part, accumulate) {
                return; // no AVX-512 on this machine: the route does not exist here
            }
        }
    }
    let (want, scale) = reference(ty, &p.bytes, n, k, x, m);
    // The integer kernels (SIMD only) compute, up to f32 sums, W times the activations they
    // rounded, and the rounding moves each product by at most half a step: check both.
    let integer = route == Route::DecodeInt16 && isa != Isa::Portable;
    let (rounded_want, rounding) =
        if integer { int16_expectation(ty, &p.bytes, n, k, x, m) } else { (vec![], vec![]) };
    let base = if accumulate { 0.5 } else { 0.0 };
    let what = format!("{route:?} {isa:?} {ty:?} m={m} n={n} k={k} acc={accumulate}");
    for (t, r, got) in p.results(&what) {
        let (w, s) = (want[t * n + r] + base, scale[t * n + r]);
        if integer {
            let (rw, bound) = (rounded_want[t * n + r] + base, rounding[t * n + r]);
            assert!(
                (f64::from(got) - rw).abs() <= 1e-5 * s + 1e-6,
                "{what}: ({t}, {r}) = {got}, want {rw} on the rounded activations"
            );
            assert!(
                (f64::from(got) - w).abs() <= bound * 1.0001 + 1e-5 * s + 1e-6,
                "{what}: ({t}, {r}) = {got}, want {w}: more than the rounding bound {bound}"
            );
            continue;
        }
        assert!(
            (f64::from(got) - w).abs() <= 1e-5 * s + 1e-6,
            "{what}: ({t}, {r}) = {got}, want {w} (scale {s})"
        );
    }
}

/// What the int16 path computes, in f64: `d·Σ code·x̃ + offset·Σx` per group with `x̃` the
/// activations it rounded, and the bound on its distance from the f32 result,
/// `Σ |d·code|·dx/2` (each rounded activation is within half a step `dx/2`).
fn int16_expectation(
    ty: GgmlType,
    bytes: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
) -> (Vec<f64>, Vec<f64>) {
    let xq = int16::X16::quantize(x, m, k);
    let mut w = vec![0.0f32; n * k];
    dequantize(ty, bytes, &mut w);
    let (per_block, block_bytes) = ty.block();
    let (mut want, mut bound) = (vec![0.0; m * n], vec![0.0; m * n]);
    for t in 0..m {
        for r in 0..n {
            for g in 0..k / 32 {
                let block = &bytes[(r * k + 32 * g) / per_block * block_bytes..][..block_bytes];
                let f16_at = |at: usize| f64::from(f16::from_le_bytes([block[at], block[at + 1]]).to_f32());
                // The group's offset, which the kernels take through the exact sum of x (Q4_0's
                // and Q5_0's codes are centred instead: `d·(q − centre)` is the whole value).
                let offset = match ty {
                    GgmlType::Q4_1 | GgmlType::Q5_1 => f16_at(2),
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        let (_, min) = crate::ggml::scale_min_k4(g % 8, &block[4..16]);
                        -f16_at(2) * f64::from(min)
                    }
                    _ => 0.0,
                };
                let half_step = f64::from(xq.dx[t * xq.pairs() * 2 + g]) / 2.0;
                for i in 32 * g..32 * g + 32 {
                    let scaled_code = f64::from(w[r * k + i]) - offset;
                    want[t * n + r] += scaled_code * xq.value(t, i) + offset * f64::from(x[t * k + i]);
                    bound[t * n + r] += scaled_code.abs() * half_step;
                }
            }
        }
    }
    (want, bound)
}

#[test]
fn every_format_matches_the_f64_reference_on_every_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for isa in Isa::available() {
        for ty in FORMATS {
            let per_block = ty.block().0;
            // Short and long rows, in whole blocks; for f16/bf16 also a width no SIMD group
            // divides (the AVX2 path hands those to the portable loop).
            // 96 = three groups of 32: the int16 path's odd last group (paired with zeros).
            // For Q4_1 on AVX-512 (four groups per block, pairs of blocks): 160 = a lone
            // block and a short one, 224 = a lone block and three groups, 384 = a pair and a
            // lone block, 576 = SmolLM2's width, two pairs and two groups.
            let mut widths = vec![per_block.max(32), 2 * per_block.max(256)];
            if per_block == 32 {
                widths.extend([96, 160, 224, 384, 576]);
            }
            if per_block == 1 {
                widths.push(40);
            }
            for k in widths {
                for (m, n) in [
                    (1, 1),
                    (1, 67),
                    (2, 7),
                    (2, 33),
                    (3, 9),
                    (3, 48),
                    (4, 16),
                    (5, 3),
                    (5, 32),
                    (6, 9),
                    (6, 32),
                    (7, 5),
                    (7, 16),
                    (8, 67),
                    (9, 5),
                    (70, 67),
                ] {
                    check(isa, ty, m, n, k, m % 2 == 1, &mut rng);
                }
            }
        }
    }
}

#[test]
fn a_fused_weight_of_mixed_formats_fills_each_part_s_columns() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let k = 256;
    let specs = [(GgmlType::Q4_1, 5), (GgmlType::Q8_0, 3), (GgmlType::F32, 2), (GgmlType::Q6_K, 4)];
    let parts: Vec<Part> = specs
        .iter()
        .map(|&(ty, rows)| {
            let bytes = random_part(ty, rows, k, &mut rng);
            let data = if ty == GgmlType::F32 {
                Storage::F32(
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
                )
            } else {
                Storage::Owned(bytes)
            };
            Part::new(ty, rows, k, data).unwrap()
        })
        .collect();
    let w = Weight::from_parts(k, parts);
    assert_eq!((w.rows(), w.cols()), (14, k));
    let dense = w.to_f32();
    for isa in Isa::available() {
        for m in [1, 3, 12] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut dst = vec![f32::NAN; m * 14];
            w.matmul_with(isa, &mut dst, &x, m, false);
            assert_dense_product(&dense, k, &x, &dst, 0.0, &format!("{isa:?} m={m}"));
        }
    }
}

/// `dst` (`[m, n]`, each entry `base` plus its product) against the f64 product of `x`
/// (`[m, k]`) and the dense weight rows (`[n, k]`), within f32 rounding of Σ|x·w|.
fn assert_dense_product(dense: &[f32], k: usize, x: &[f32], dst: &[f32], base: f32, what: &str) {
    let n = dense.len() / k;
    for (t, (xt, out)) in x.chunks_exact(k).zip(dst.chunks_exact(n)).enumerate() {
        for (r, (row, &got)) in dense.chunks_exact(k).zip(out).enumerate() {
            let want: f64 = row.iter().zip(xt).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
            let scale: f64 = row.iter().zip(xt).map(|(&a, &b)| f64::from(a * b).abs()).sum();
            let got = f64::from(got) - f64::from(base);
            assert!((got - want).abs() <= 1e-5 * scale + 1e-6, "{what} ({t},{r}): {got} vs {want}");
        }
    }
}

/// Past `panel::slabs_min_m` tokens a weight of quantized parts goes through `panel::slabs`:
/// each part's columns filled, also when a slab ends inside a part and the next spans two.
#[test]
fn a_fused_quantized_weight_of_many_tokens_goes_through_slabs() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let (k, m) = (256, panel::slabs_min_m(Isa::detected()) + 3);
    let specs = [(GgmlType::Q4_1, 5), (GgmlType::Q8_0, 3), (GgmlType::Q6_K, 4), (GgmlType::F16, 2)];
    let parts: Vec<Part> = specs
        .iter()
        .map(|&(ty, rows)| {
            Part::new(ty, rows, k, Storage::Owned(random_part(ty, rows, k, &mut rng))).unwrap()
        })
        .collect();
    let w = Weight::from_parts(k, parts);
    let dense = w.to_f32();
    let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    for isa in Isa::available() {
        for slab_rows in [None, Some(1), Some(3)] {
            let mut dst = vec![0.25f32; m * 14];
            match slab_rows {
                None => w.matmul_with(isa, &mut dst, &x, m, true),
                Some(rows) => {
                    let refs: Vec<PartRef<'_>> = w.part_refs().collect();
                    let out = Out { ptr: OutPtr(dst.as_mut_ptr()), ldd: 14 };
                    panel::slabs_of(rows * 4 * k, isa, out, &x, m, &refs, true);
                }
            }
            assert_dense_product(&dense, k, &x, &dst, 0.25, &format!("{isa:?} slabs of {slab_rows:?} rows"));
        }
    }
}

#[test]
fn rows_dequantize_as_the_scalar_reference_on_every_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in FORMATS {
        let k = 512;
        let bytes = random_part(ty, 2, k, &mut rng);
        let mut want = vec![0.0f32; 2 * k];
        dequantize(ty, &bytes, &mut want);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; k];
            isa.dequantize_row(ty, &bytes[bytes.len() / 2..], &mut got);
            for (g, w) in got.iter().zip(&want[k..]) {
                // FMA (one rounding) against the reference's multiply-then-add (two).
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-3), "{isa:?} {ty:?}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn parts_refuse_storage_of_the_wrong_size() {
    assert!(Part::new(GgmlType::Q4_1, 2, 64, Storage::Owned(vec![0; 80])).is_ok());
    assert!(Part::new(GgmlType::Q4_1, 2, 64, Storage::Owned(vec![0; 79])).is_err());
    assert!(Part::new(GgmlType::Q4_1, 2, 48, Storage::Owned(vec![0; 60])).is_err());
    assert!(Part::new(GgmlType::Q4_K, usize::MAX, 256, Storage::Owned(vec![])).is_err());
}

#[test]
fn float_weights_quantize_at_load_and_multiply_as_their_quantization() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (n, k) = (9, 96);
    let values: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let w = Weight::from_f32(n, k, values.clone());
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
        let q = w.quantized(ty).unwrap();
        assert_eq!((q.parts().len(), q.parts()[0].format()), (1, ty));
        let mut want = Vec::new();
        crate::ggml::quantize(ty, &values, &mut want).unwrap();
        assert_eq!(q.parts()[0].bytes(), &want[..], "row-by-row quantization is the reference's");
        let x: Vec<f32> = (0..3 * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let (ref_out, scale) = reference(ty, &want, n, k, &x, 3);
        let mut got = vec![0.0; 3 * n];
        q.matmul(&mut got, &x, 3, false);
        for ((g, r), s) in got.iter().zip(&ref_out).zip(&scale) {
            assert!((f64::from(*g) - r).abs() <= 1e-5 * s + 1e-6, "{ty:?}: {g} vs {r}");
        }
    }
    // Already-quantized parts are kept, and K-quants have no reference quantizer to go to.
    let q = w.quantized(GgmlType::Q8_0).unwrap();
    assert_eq!(q.quantized(GgmlType::Q4_0).unwrap().parts()[0].format(), GgmlType::Q8_0);
    assert!(w.quantized(GgmlType::Q4_K).is_err());
}

/// Two tokens of `k` activations whose groups the integer kernels treat apart: token 0 has a
/// NaN in group 1; token 1 has group 0 zero and group 2 tiny (1e-32), the rest random.
pub(super) fn special_groups(k: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..2 * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    x[40] = f32::NAN;
    x[k..k + 32].fill(0.0);
    x[k + 64..k + 96].iter_mut().for_each(|v| *v *= 1e-32);
    x
}

/// `w` times the two tokens `x` on `isa`, their activations taken in `precision`.
pub(super) fn two_tokens_times(w: &Weight, isa: Isa, precision: ActivationPrecision, x: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; 2 * w.rows()];
    w.matmul_as(isa, precision, &mut out, x, 2, false);
    out
}

#[cfg(target_arch = "x86_64")]
#[test]
fn integer_kernels_take_nan_zero_and_tiny_groups_as_the_f32_kernels_do() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (n, k) = (5, 256);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let bytes = random_part(ty, n, k, &mut rng);
        let part = Part::new(ty, n, k, Storage::Owned(bytes)).unwrap();
        let w = Weight::from_parts(k, vec![part]);
        let x = special_groups(k, &mut rng);
        for isa in Isa::available() {
            let [want, got] = [ActivationPrecision::F32, ActivationPrecision::Int16]
                .map(|precision| two_tokens_times(&w, isa, precision, &x));
            assert!(got[..n].iter().all(|v| v.is_nan()), "{isa:?} {ty:?}: NaN lost");
            for (g, r) in got[n..].iter().zip(&want[n..]) {
                assert!((g - r).abs() <= 1e-3 * r.abs().max(1.0), "{isa:?} {ty:?}: {g} vs {r}");
            }
        }
    }
}

#[test]
fn auto_takes_int16_only_where_decode_and_batches_both_have_integer_kernels() {
    use ActivationPrecision::{Auto, F32, Int16};
    use GgmlType::{BF16, F16, Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0};
    for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
        let integer = isa != Isa::Portable;
        assert_eq!(lanes16::runs_on(isa), integer, "{isa:?}");
        for (parts, int16) in [
            (&[Q4_1, Q8_0][..], integer),
            (&[Q5_0, Q4_0][..], integer),
            (&[Q5_0, Q6_K][..], integer),
            (&[Q4_K][..], integer),
            (&[Q4_K, F16][..], false),
            (&[BF16][..], false),
        ] {
            let want = if int16 { Int16 } else { F32 };
            assert_eq!(Auto.resolve(isa, parts.iter().copied()), want, "{isa:?} {parts:?}");
            for explicit in [F32, Int16] {
                assert_eq!(explicit.resolve(isa, parts.iter().copied()), explicit);
            }
        }
    }
}
