//! `x·Wᵀ` for a few tokens over a weight's quantized parts: decode is bound by reading the
//! weights, so each row is dequantized group by group in registers and multiplied into every
//! token (four at a time) before the next group is read; nothing is written back but the dot
//! products.

use rayon::prelude::*;

use super::int16::{self, X16};
#[cfg(target_arch = "x86_64")]
use super::q4_1_wide;
use super::{Activations, GgmlType, Out, PartRef, RowTask};
use crate::Isa;
use crate::linear::dot;

/// Rows per rayon task: about eight tasks per thread for work stealing to balance, at least
/// ~16 KB of weights each so task overhead stays small, and then a task count that is a
/// multiple of the threads with the rows split evenly: SmolLM2's 576-row o_proj made 13 tasks
/// (one thread ran seven while the other waited); 14 made 576×576 Q4_1 decode 7–12 % faster
/// on two threads.
/// A kernel that works on blocks of rows (`align`) gets whole blocks.
fn rows_per_task(rows: usize, row_bytes: usize, align: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let by_balance = rows.div_ceil(threads * 8);
    let by_size = (16 * 1024 / row_bytes.max(1)).max(1);
    let tasks = rows.div_ceil(by_balance.max(by_size).max(1)).next_multiple_of(threads);
    rows.div_ceil(tasks).max(1).next_multiple_of(align)
}

/// (part, rows) of every rayon task of a call, part by part ([`rows_per_task`] rows each, in
/// whole blocks of `align(part)` rows).
pub(super) fn row_tasks(
    parts: &[(PartRef<'_>, Out)],
    align: impl Fn(usize) -> usize,
) -> Vec<(usize, std::ops::Range<usize>)> {
    parts
        .iter()
        .enumerate()
        .flat_map(|(i, (p, _))| {
            let per_task = rows_per_task(p.rows, p.row_bytes(), align(i));
            (0..p.rows.div_ceil(per_task)).map(move |t| (i, t * per_task..((t + 1) * per_task).min(p.rows)))
        })
        .collect()
}

/// Most tokens one pass over a row serves: the AVX-512 int16 kernel's five, the others' four.
fn tokens_per_pass(isa: Isa, kernel: Kernel) -> usize {
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Int16 && isa == Isa::Avx512 && crate::isa::avx512_vnni() {
        return int16::AVX512_TOKENS_PER_PASS;
    }
    let _ = (isa, kernel);
    4
}

/// See the module doc: `out[t, r] (+)= x[t] · row r` for `t < m`, every row of `part`.
/// `xq`: the activations in int16 when the caller chose the integer kernels ([`int16`]),
/// which formats it [`int16::supports`] take. (One part: the kernel tests' entry; weights
/// call [`matmul_parts`].)
#[cfg(test)]
pub(super) fn matmul(
    isa: Isa,
    xq: Option<&X16>,
    out: Out,
    x: &[f32],
    m: usize,
    part: &PartRef<'_>,
    accumulate: bool,
) {
    matmul_parts(isa, xq, x, m, &[(*part, out)], accumulate);
}

/// [`matmul`] over every part of a fused weight (each with its own output columns) in one
/// parallel region: the activations are prepared once for all of them (group sums, the
/// lane order of [`q4_1_wide`]), and the tasks of a small part (Q/K/V's K and V) share the
/// threads with the others' instead of each part being a fork and join of its own.
pub(super) fn matmul_parts(
    isa: Isa,
    xq: Option<&X16>,
    x: &[f32],
    m: usize,
    parts: &[(PartRef<'_>, Out)],
    accumulate: bool,
) {
    let Some(k) = parts.first().map(|(p, _)| p.cols) else { return };
    assert!(x.len() >= m * k, "decode::matmul: short activations");
    let simd = isa != Isa::Portable && k.is_multiple_of(32);
    let kernels: Vec<Kernel> =
        parts.iter().map(|(p, _)| Kernel::choose(isa, simd, xq.is_some(), p.ty)).collect();
    let group_sums: Vec<f32> = if kernels.contains(&Kernel::Groups) {
        x[..m * k].chunks_exact(32).map(|c| c.iter().sum()).collect()
    } else {
        Vec::new()
    };
    #[cfg(target_arch = "x86_64")]
    let permuted = kernels.contains(&Kernel::Q4_1Wide).then(|| q4_1_wide::Permuted::new(x, m, k));
    let acts = Activations { x, group_sums: &group_sums };
    // Sixteen rows in the lanes for the int16 kernel on AVX-512 VNNI, from two tokens on (one
    // token reads its rows as fast in `rows512`): only then are the lanes' activations made and
    // the tasks cut into whole blocks.
    #[cfg(target_arch = "x86_64")]
    let in_lanes =
        |i: usize| m >= 2 && kernels[i] == Kernel::Int16 && isa == Isa::Avx512 && crate::isa::avx512_vnni();
    #[cfg(not(target_arch = "x86_64"))]
    let in_lanes = |_: usize| false;
    #[cfg(target_arch = "x86_64")]
    let lane_acts =
        (0..parts.len()).any(in_lanes).then(|| int16::LaneActs::new(xq.expect("int16 kernels"), m));
    let align = |i: usize| if in_lanes(i) { int16::LANE_ROWS } else { 1 };
    row_tasks(parts, align).into_par_iter().for_each(|(i, rows)| {
        let (part, out) = (&parts[i].0, parts[i].1);
        // As few passes as the kernel's limit allows, of as even a size as they can be.
        let most = if in_lanes(i) { int16::LANE_TOKENS_PER_PASS } else { tokens_per_pass(isa, kernels[i]) };
        let per_pass = crate::linear::tokens_per_even_pass(m, most);
        for t0 in (0..m).step_by(per_pass) {
            let mr = (m - t0).min(per_pass);
            let task = RowTask { part, rows: rows.clone(), t0, mr, out, accumulate };
            match kernels[i] {
                // SAFETY (every arm): the kernel's CPU features were detected for `isa` (and
                // VNNI for the wide int16 kernel); the rows are this task's, tokens t0..t0+mr
                // lie in x (asserted) and in xq / the permuted copy made from it; whole
                // groups of 32 per row for every SIMD kernel (`simd`).
                #[cfg(target_arch = "x86_64")]
                Kernel::Int16 => unsafe {
                    let xq = xq.expect("int16 kernels are chosen only with int16 activations");
                    if isa == Isa::Avx512 && crate::isa::avx512_vnni() {
                        int16::dot_rows_avx512(task, xq, lane_acts.as_ref().filter(|_| in_lanes(i)))
                    } else {
                        int16::dot_rows_avx2(task, xq)
                    }
                },
                #[cfg(target_arch = "x86_64")]
                Kernel::Q4_1Wide => unsafe {
                    let xp = permuted.as_ref().expect("made when a part takes it");
                    q4_1_wide::dot_rows_dyn(task, xp)
                },
                #[cfg(target_arch = "x86_64")]
                Kernel::Groups if isa == Isa::Avx2 => unsafe { super::avx2::dot_rows_dyn(task, acts) },
                #[cfg(target_arch = "x86_64")]
                Kernel::Groups => unsafe { super::avx512::dot_rows_dyn(task, acts) },
                _ => portable_rows(task, x),
            }
        }
    });
}

/// Which decode kernel a part takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// Integer codes times int16 activations ([`int16`]).
    Int16,
    /// Q4_1 on AVX-512 with four groups across the lanes ([`q4_1_wide`]).
    Q4_1Wide,
    /// The ISA's per-group kernel (`avx2` / `avx512` `dot_rows`).
    Groups,
    /// Scalar dequantization, then f32 dot products.
    Portable,
}

impl Kernel {
    fn choose(isa: Isa, simd: bool, int16_acts: bool, ty: GgmlType) -> Kernel {
        if !simd {
            Kernel::Portable
        } else if int16_acts && int16::supports(ty) {
            Kernel::Int16
        } else if isa == Isa::Avx512 && ty == GgmlType::Q4_1 {
            Kernel::Q4_1Wide
        } else {
            Kernel::Groups
        }
    }
}

/// The portable path: each row dequantized by the scalar reference, then f32 dot products.
fn portable_rows(task: RowTask<'_>, x: &[f32]) {
    let RowTask { part, rows, t0, mr, out, accumulate } = task;
    let k = part.cols;
    let mut row = vec![0.0f32; k];
    for r in rows {
        Isa::Portable.dequantize_row(part.ty, part.row(r), &mut row);
        for t in t0..t0 + mr {
            // SAFETY: (t, r) is this task's entry (t < m, r in its rows).
            unsafe { out.put(t, r, dot(&row, &x[t * k..(t + 1) * k]), accumulate) };
        }
    }
}
