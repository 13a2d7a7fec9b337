//! RMSNorm over the rows of a batch: `Σ x²` in f64, the rows compiled for AVX-512 / AVX2
//! (picked at run time) and plain, the same arithmetic in the same order in each.

use rayon::prelude::*;

use super::TOKENS_PER_TASK;
use crate::Isa;

/// `out[t] = x[t] / rms(x[t]) * (offset + weight)` for every row of width `weight.len()`
/// (`offset` 0 for most models, 1 for Gemma's `1 + w`).
pub fn rms_norm(out: &mut [f32], x: &[f32], weight: &[f32], offset: f32, eps: f64) {
    let h = weight.len();
    let isa = Isa::detected();
    out.par_chunks_mut(h * TOKENS_PER_TASK).zip(x.par_chunks(h * TOKENS_PER_TASK)).for_each(|(o, xi)| {
        match isa {
            // SAFETY: the AVX-512 tier (AVX-512F) was detected at run time.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { rms_norm_rows_avx512(o, xi, weight, offset, eps) },
            // SAFETY: the AVX2 tier was detected at run time.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { rms_norm_rows_avx2(o, xi, weight, offset, eps) },
            _ => rms_norm_rows(o, xi, weight, offset, eps),
        }
    });
}

/// [`rms_norm`] over a task's rows. `Σ x²` runs in f64 in eight interleaved partial sums,
/// which vectorize (one running sum does not: it was ~70 % of the op's time).
#[inline(always)]
fn rms_norm_rows(out: &mut [f32], x: &[f32], weight: &[f32], offset: f32, eps: f64) {
    let h = weight.len();
    for (orow, xrow) in out.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
        let mut acc = [0.0f64; 8];
        let chunks = xrow.chunks_exact(8);
        let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += f64::from(v) * f64::from(v);
            }
        }
        let ss = acc.iter().sum::<f64>() + tail;
        let inv = (1.0 / (ss / h as f64 + eps).sqrt()) as f32;
        for ((ov, &xv), &wv) in orow.iter_mut().zip(xrow).zip(weight) {
            *ov = xv * inv * (offset + wv);
        }
    }
}

/// [`rms_norm_rows`] compiled for AVX-512 (the crate's baseline target is SSE2); the same
/// arithmetic in the same order as every other build of it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rms_norm_rows_avx512(out: &mut [f32], x: &[f32], weight: &[f32], offset: f32, eps: f64) {
    rms_norm_rows(out, x, weight, offset, eps);
}

/// [`rms_norm_rows`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rms_norm_rows_avx2(out: &mut [f32], x: &[f32], weight: &[f32], offset: f32, eps: f64) {
    rms_norm_rows(out, x, weight, offset, eps);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalises() {
        let x = [3.0f32, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&mut out, &x, &[1.0, 2.0], 0.0, 0.0);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
        // Widths with and without a tail past the eight partial sums, more rows than a task.
        for h in [1, 7, 8, 13, 576] {
            let rows = 40;
            let x: Vec<f32> = (0..rows * h).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let w: Vec<f32> = (0..h).map(|i| 0.5 + (i % 5) as f32 / 4.0).collect();
            let mut out = vec![f32::NAN; rows * h];
            rms_norm(&mut out, &x, &w, 0.0, 1e-5);
            let mut gemma = vec![f32::NAN; rows * h];
            let shifted: Vec<f32> = w.iter().map(|v| v - 1.0).collect();
            rms_norm(&mut gemma, &x, &shifted, 1.0, 1e-5);
            for (t, row) in x.chunks_exact(h).enumerate() {
                let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / h as f64;
                let inv = 1.0 / (ms + 1e-5).sqrt();
                for i in 0..h {
                    let want = f64::from(row[i]) * inv * f64::from(w[i]);
                    let got = f64::from(out[t * h + i]);
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "h={h} ({t},{i}): {got} vs {want}"
                    );
                    let offset = f64::from(gemma[t * h + i]);
                    assert!((offset - want).abs() <= 1e-6 * want.abs().max(1.0), "1 + w: {offset} vs {want}");
                }
            }
        }
    }
}
