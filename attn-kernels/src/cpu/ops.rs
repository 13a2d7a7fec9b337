//! [`CpuOps`]: the host's [`LayerOps`] (and, through [`Cpu`], its kernel backend): the kernels
//! of [`super`], the matmuls of `quant-kernels` over every weight format, and the paged attention
//! of [`Cpu`], with the instruction set and activation precision of a model. Every op checks its
//! buffers' lengths first and fans out over rayon.

use quant_kernels::quant::{ActivationPrecision, Weight};
use rayon::prelude::*;

use super::act::{Activation, gated_act};
use super::norm::{rms_norm, rms_norm_gather, rms_norm_in_place};
use super::rope::{rope_interleaved, rope_rotate_half};
use crate::backend::{Cpu, WrapsKernels};
use crate::layer_ops::{LayerOps, LinearShape, RmsNorm, RopePairs, RotaryShape};
use crate::{AttnError, Isa};

/// Elements per rayon task of the element-wise ops (adds, soft-capping).
const ELEMENTS_PER_TASK: usize = 4096;

/// The host's ops: the instruction set its kernels take and how matmuls take activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOps {
    pub isa: Isa,
    pub precision: ActivationPrecision,
}

impl CpuOps {
    /// The ops on this CPU's best instruction set, with matmul activations at `precision`.
    pub fn new(precision: ActivationPrecision) -> Self {
        Self { isa: Isa::detected(), precision }
    }

    /// Splits the rows of a fused projection `[rows, Σ widths]` into one buffer per part (its
    /// rows `[rows, width]`), adding the fused bias when there is one.
    pub fn split_columns(
        &self,
        parts: [&mut [f32]; 3],
        fused: &[f32],
        bias: Option<&[f32]>,
        rows: usize,
    ) -> Result<(), AttnError> {
        let widths = [0, 1, 2].map(|i| parts[i].len().checked_div(rows).unwrap_or(0));
        let width: usize = widths.iter().sum();
        check("fused projection", rows * width, fused.len())?;
        for (part, w) in parts.iter().zip(widths) {
            check("projection part", rows * w, part.len())?;
        }
        if let Some(b) = bias {
            check("fused bias", width, b.len())?;
        }
        if rows == 0 || width == 0 {
            return Ok(());
        }
        let [q, k, v] = parts;
        q.par_chunks_mut(widths[0].max(1))
            .zip(k.par_chunks_mut(widths[1].max(1)))
            .zip(v.par_chunks_mut(widths[2].max(1)))
            .zip(fused.par_chunks(width))
            .with_min_len(8)
            .for_each(|(((qr, kr), vr), src)| {
                let (qs, rest) = src.split_at(qr.len());
                let (ks, vs) = rest.split_at(kr.len());
                qr.copy_from_slice(qs);
                kr.copy_from_slice(ks);
                vr.copy_from_slice(vs);
                if let Some(bias) = bias {
                    let (qb, rest) = bias.split_at(qr.len());
                    let (kb, vb) = rest.split_at(kr.len());
                    add_row(qr, qb);
                    add_row(kr, kb);
                    add_row(vr, vb);
                }
            });
        Ok(())
    }

    fn matmul(&self, out: &mut [f32], x: &[f32], w: &Weight, s: LinearShape) -> Result<(), AttnError> {
        check("weight rows", s.out_dim, w.rows())?;
        check("weight columns", s.in_dim, w.cols())?;
        let out = prefix("linear output", out, s.rows * s.out_dim)?;
        let x = prefix_ref("linear input", x, s.rows * s.in_dim)?;
        w.matmul_as(self.isa, self.precision, out, x, s.rows, s.accumulate);
        Ok(())
    }
}

/// `got` must be `expected` (a buffer's length, or a weight's dimension).
fn check(what: &'static str, expected: usize, got: usize) -> Result<(), AttnError> {
    if got == expected { Ok(()) } else { Err(AttnError::ShapeMismatch { what, expected, got }) }
}

/// The first `len` elements of `buf`, or an error naming it when it is shorter.
fn prefix<'a>(what: &'static str, buf: &'a mut [f32], len: usize) -> Result<&'a mut [f32], AttnError> {
    let got = buf.len();
    buf.get_mut(..len).ok_or(AttnError::ShapeMismatch { what, expected: len, got })
}

fn prefix_ref<'a>(what: &'static str, buf: &'a [f32], len: usize) -> Result<&'a [f32], AttnError> {
    buf.get(..len).ok_or(AttnError::ShapeMismatch { what, expected: len, got: buf.len() })
}

fn add_row(out: &mut [f32], add: &[f32]) {
    out.iter_mut().zip(add).for_each(|(o, a)| *o += a);
}

/// This step's rotation on the host: `cos`/`sin` of every token's position, `head_dim / 2`
/// values a token, in the step's token order.
#[derive(Debug, Clone, Copy)]
pub struct CosSin<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub pairs: RopePairs,
}

impl LayerOps for CpuOps {
    type Gemm = [f32];
    type Matrix<'a> = &'a Weight;
    type Vector<'a> = &'a [f32];
    type Ids = [u32];
    type Indices = [usize];
    type Rotation<'a> = CosSin<'a>;

    fn embed(
        &self,
        out: &mut [f32],
        table: &Weight,
        ids: &[u32],
        rows: usize,
        scale: f32,
    ) -> Result<(), AttnError> {
        let h = table.cols();
        let out = prefix("embedding output", out, rows * h)?;
        let ids = ids.get(..rows).ok_or(AttnError::ShapeMismatch {
            what: "token ids",
            expected: rows,
            got: ids.len(),
        })?;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= table.rows()) {
            return Err(AttnError::IndexOutOfRange {
                what: "token id",
                index: bad as usize,
                len: table.rows(),
            });
        }
        if h == 0 {
            return Ok(());
        }
        out.par_chunks_mut(h).zip(ids.par_iter()).for_each(|(row, &tok)| {
            table.row_to_f32(tok as usize, row);
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        });
        Ok(())
    }

    fn rms_norm(
        &self,
        out: &mut [f32],
        x: &[f32],
        weight: &[f32],
        gather: Option<&[usize]>,
        rows: usize,
        norm: RmsNorm,
    ) -> Result<(), AttnError> {
        let h = norm.width;
        check("norm weight", h, weight.len())?;
        let out = prefix("norm output", out, rows * h)?;
        match gather {
            None => rms_norm(out, prefix_ref("norm input", x, rows * h)?, weight, norm.offset, norm.eps),
            Some(picked) => {
                check("gathered rows", rows, picked.len())?;
                let in_rows = x.len() / h.max(1);
                if let Some(&bad) = picked.iter().find(|&&r| r >= in_rows) {
                    return Err(AttnError::IndexOutOfRange {
                        what: "gathered row",
                        index: bad,
                        len: in_rows,
                    });
                }
                rms_norm_gather(out, x, picked, weight, norm.offset, norm.eps);
            }
        }
        Ok(())
    }

    fn rms_norm_in_place(
        &self,
        x: &mut [f32],
        weight: &[f32],
        rows: usize,
        norm: RmsNorm,
    ) -> Result<(), AttnError> {
        check("norm weight", norm.width, weight.len())?;
        rms_norm_in_place(prefix("normed rows", x, rows * norm.width)?, weight, norm.offset, norm.eps);
        Ok(())
    }

    fn linear(
        &self,
        out: &mut [f32],
        x: &[f32],
        weight: &Weight,
        shape: LinearShape,
    ) -> Result<(), AttnError> {
        self.matmul(out, x, weight, shape)
    }

    fn linear_to_gemm(
        &self,
        out: &mut [f32],
        x: &[f32],
        weight: &Weight,
        shape: LinearShape,
    ) -> Result<(), AttnError> {
        self.matmul(out, x, weight, shape)
    }

    fn add_bias(&self, out: &mut [f32], bias: &[f32], rows: usize, width: usize) -> Result<(), AttnError> {
        check("bias", width, bias.len())?;
        if width == 0 {
            return Ok(());
        }
        prefix("biased rows", out, rows * width)?.par_chunks_mut(width).for_each(|row| add_row(row, bias));
        Ok(())
    }

    fn rotary(
        &self,
        q: &mut [f32],
        k: &mut [f32],
        rotation: CosSin<'_>,
        s: RotaryShape,
    ) -> Result<(), AttnError> {
        let (d, half) = (s.head_dim, s.head_dim / 2);
        if d == 0 || !d.is_multiple_of(2) {
            return Err(AttnError::OddHeadSize(d));
        }
        let (q_w, k_w) = (s.heads * d, s.kv_heads * d);
        let q = prefix("rotated queries", q, s.tokens * q_w)?;
        let k = prefix("rotated keys", k, s.tokens * k_w)?;
        let cos = prefix_ref("rotation cos", rotation.cos, s.tokens * half)?;
        let sin = prefix_ref("rotation sin", rotation.sin, s.tokens * half)?;
        if q_w == 0 || k_w == 0 {
            return Ok(());
        }
        let pairs = match rotation.pairs {
            RopePairs::RotateHalf => rope_rotate_half,
            RopePairs::Interleaved => rope_interleaved,
        };
        q.par_chunks_mut(q_w)
            .zip(k.par_chunks_mut(k_w))
            .zip(cos.par_chunks(half).zip(sin.par_chunks(half)))
            .with_min_len(8)
            .for_each(|((qr, kr), (cr, sr))| {
                pairs(qr, d, cr, sr);
                pairs(kr, d, cr, sr);
            });
        Ok(())
    }

    fn gated_act(
        &self,
        out: &mut [f32],
        gate_up: &[f32],
        rows: usize,
        inter: usize,
        act: Activation,
    ) -> Result<(), AttnError> {
        let out = prefix("activation output", out, rows * inter)?;
        gated_act(out, prefix_ref("gate/up rows", gate_up, rows * 2 * inter)?, inter, act);
        Ok(())
    }

    fn add(&self, out: &mut [f32], x: &[f32], len: usize) -> Result<(), AttnError> {
        let out = prefix("sum", out, len)?;
        let x = prefix_ref("addend", x, len)?;
        out.par_chunks_mut(ELEMENTS_PER_TASK)
            .zip(x.par_chunks(ELEMENTS_PER_TASK))
            .for_each(|(o, x)| add_row(o, x));
        Ok(())
    }

    fn softcap(&self, x: &mut [f32], cap: f32, len: usize) -> Result<(), AttnError> {
        prefix("soft-capped values", x, len)?
            .par_chunks_mut(ELEMENTS_PER_TASK)
            .for_each(|c| c.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh()));
        Ok(())
    }
}

/// Attention and the cache's block moves are [`Cpu`]'s.
impl WrapsKernels for CpuOps {
    type Kernels = Cpu;
    fn kernels(&self) -> &Cpu {
        &Cpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> CpuOps {
        CpuOps::new(ActivationPrecision::F32)
    }

    #[test]
    fn element_ops_compute_their_formulas() -> Result<(), AttnError> {
        let mut out = vec![1.0f32, 2.0, 3.0, 4.0];
        ops().add_bias(&mut out, &[0.5, -1.0], 2, 2)?;
        assert_eq!(out, [1.5, 1.0, 3.5, 3.0]);
        ops().add(&mut out, &[1.0, 1.0, 1.0, 1.0, 9.0], 4)?;
        assert_eq!(out, [2.5, 2.0, 4.5, 4.0]);
        ops().softcap(&mut out, 2.0, 3)?;
        assert_eq!(out[..3], [2.0 * (1.25f32).tanh(), 2.0 * (1.0f32).tanh(), 2.0 * (2.25f32).tanh()]);
        assert_eq!(out[3], 4.0, "past len untouched");
        let table = Weight::from_f32(3, 2, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let mut hidden = vec![0.0f32; 4];
        ops().embed(&mut hidden, &table, &[2, 0], 2, 0.5)?;
        assert_eq!(hidden, [2.0, 2.5, 0.0, 0.5]);
        Ok(())
    }

    #[test]
    fn a_fused_projection_splits_into_its_parts_with_its_bias() -> Result<(), AttnError> {
        let fused: Vec<f32> = (0..2 * 6).map(|i| i as f32).collect();
        let (mut q, mut k, mut v) = (vec![0.0f32; 2 * 3], vec![0.0f32; 2 * 2], vec![0.0f32; 2]);
        let bias = [0.0, 0.0, 0.0, 10.0, 10.0, 100.0];
        ops().split_columns([&mut q, &mut k, &mut v], &fused, Some(&bias), 2)?;
        assert_eq!(q, [0.0, 1.0, 2.0, 6.0, 7.0, 8.0]);
        assert_eq!(k, [13.0, 14.0, 19.0, 20.0]);
        assert_eq!(v, [105.0, 111.0]);
        Ok(())
    }

    #[test]
    fn short_buffers_and_bad_indices_are_errors_before_any_write() {
        let table = Weight::from_f32(3, 2, vec![0.0; 6]);
        let mut hidden = vec![7.0f32; 4];
        let bad_id = ops().embed(&mut hidden, &table, &[1, 3], 2, 1.0);
        assert!(matches!(bad_id, Err(AttnError::IndexOutOfRange { index: 3, len: 3, .. })), "{bad_id:?}");
        assert_eq!(hidden, [7.0; 4]);
        let short = ops().embed(&mut hidden, &table, &[1, 2, 0], 3, 1.0);
        assert!(matches!(short, Err(AttnError::ShapeMismatch { .. })), "{short:?}");
        let norm = RmsNorm { width: 2, offset: 0.0, eps: 1e-6 };
        let mut out = vec![0.0f32; 2];
        let gathered = ops().rms_norm(&mut out, &hidden, &[1.0, 1.0], Some(&[2]), 1, norm);
        assert!(matches!(gathered, Err(AttnError::IndexOutOfRange { index: 2, len: 2, .. })), "{gathered:?}");
        let w = Weight::from_f32(2, 2, vec![1.0, 0.0, 0.0, 1.0]);
        let shape = LinearShape { rows: 3, out_dim: 2, in_dim: 2, accumulate: false };
        assert!(ops().linear(&mut out, &hidden, &w, shape).is_err());
        let odd = RotaryShape { tokens: 1, heads: 1, kv_heads: 1, head_dim: 3 };
        let rotation = CosSin { cos: &[1.0], sin: &[0.0], pairs: RopePairs::RotateHalf };
        assert_eq!(ops().rotary(&mut [0.0; 3], &mut [0.0; 3], rotation, odd), Err(AttnError::OddHeadSize(3)));
    }
}
