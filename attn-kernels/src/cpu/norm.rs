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
        for (orow, xrow) in o.chunks_exact_mut(h).zip(xi.chunks_exact(h)) {
            norm_row(isa, Row::Into(orow, xrow), weight, offset, eps);
        }
    });
}

/// [`rms_norm`] of the rows `rows` of `x`, gathered: row `r` of `out` is the norm of row
/// `rows[r]` (the sampled rows before the LM head). The caller checked every index.
pub fn rms_norm_gather(out: &mut [f32], x: &[f32], rows: &[usize], weight: &[f32], offset: f32, eps: f64) {
    let h = weight.len();
    let isa = Isa::detected();
    out.par_chunks_mut(h).zip(rows.par_iter()).with_min_len(TOKENS_PER_TASK).for_each(|(orow, &r)| {
        norm_row(isa, Row::Into(orow, &x[r * h..(r + 1) * h]), weight, offset, eps);
    });
}

/// [`rms_norm`] in place (every head of Q or K, one row each).
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], offset: f32, eps: f64) {
    let h = weight.len();
    let isa = Isa::detected();
    x.par_chunks_mut(h * TOKENS_PER_TASK).for_each(|xi| {
        for row in xi.chunks_exact_mut(h) {
            norm_row(isa, Row::InPlace(row), weight, offset, eps);
        }
    });
}

/// One row to norm: into another buffer, or in place.
enum Row<'a> {
    Into(&'a mut [f32], &'a [f32]),
    InPlace(&'a mut [f32]),
}

/// One row on `isa`'s build of [`norm_row_plain`].
#[inline(always)]
fn norm_row(isa: Isa, row: Row<'_>, weight: &[f32], offset: f32, eps: f64) {
    match isa {
        // SAFETY: the AVX-512 tier (AVX-512F) was detected at run time.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { norm_row_avx512(row, weight, offset, eps) },
        // SAFETY: the AVX2 tier was detected at run time.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { norm_row_avx2(row, weight, offset, eps) },
        _ => norm_row_plain(row, weight, offset, eps),
    }
}

/// One row of [`rms_norm`]. `Σ x²` runs in f64 in eight interleaved partial sums, which
/// vectorize (one running sum does not: it was ~70 % of the op's time); the row is read whole
/// before it is written, so in place computes what into another buffer does.
#[inline(always)]
fn norm_row_plain(row: Row<'_>, weight: &[f32], offset: f32, eps: f64) {
    let inv_rms = |xrow: &[f32]| {
        let mut acc = [0.0f64; 8];
        let chunks = xrow.chunks_exact(8);
        let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += f64::from(v) * f64::from(v);
            }
        }
        let ss = acc.iter().sum::<f64>() + tail;
        (1.0 / (ss / xrow.len() as f64 + eps).sqrt()) as f32
    };
    match row {
        Row::Into(orow, xrow) => {
            let inv = inv_rms(xrow);
            for ((ov, &xv), &wv) in orow.iter_mut().zip(xrow).zip(weight) {
                *ov = xv * inv * (offset + wv);
            }
        }
        Row::InPlace(xrow) => {
            let inv = inv_rms(xrow);
            for (xv, &wv) in xrow.iter_mut().zip(weight) {
                *xv = *xv * inv * (offset + wv);
            }
        }
    }
}

/// [`norm_row_plain`] compiled for AVX-512 (the crate's baseline target is SSE2); the same
/// arithmetic in the same order as every other build of it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn norm_row_avx512(row: Row<'_>, weight: &[f32], offset: f32, eps: f64) {
    norm_row_plain(row, weight, offset, eps);
}

/// [`norm_row_plain`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn norm_row_avx2(row: Row<'_>, weight: &[f32], offset: f32, eps: f64) {
    norm_row_plain(row, weight, offset, eps);
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

    /// In place and gathered compute what the plain norm does, bit for bit.
    #[test]
    fn in_place_and_gathered_rows_equal_the_plain_norm() {
        let (rows, h) = (37, 24);
        let x: Vec<f32> = (0..rows * h).map(|i| ((i * 53 % 97) as f32 - 48.0) / 5.0).collect();
        let w: Vec<f32> = (0..h).map(|i| 0.25 + (i % 7) as f32 / 3.0).collect();
        let mut plain = vec![f32::NAN; rows * h];
        rms_norm(&mut plain, &x, &w, 1.0, 1e-6);
        let mut in_place = x.clone();
        rms_norm_in_place(&mut in_place, &w, 1.0, 1e-6);
        assert_eq!(in_place, plain);
        let picked = [36usize, 0, 17, 17];
        let mut gathered = vec![f32::NAN; picked.len() * h];
        rms_norm_gather(&mut gathered, &x, &picked, &w, 1.0, 1e-6);
        for (r, &i) in picked.iter().enumerate() {
            assert_eq!(gathered[r * h..(r + 1) * h], plain[i * h..(i + 1) * h]);
        }
    }
}
