//! The yardsticks of the benches: the wrapping sum of a buffer of words, as fast as loads go
//! (AVX2 where the CPU has it), so that a kernel bound by reading memory can be put over what
//! reading the same bytes alone costs, in the same samples; and the peak multiply-add rate of
//! the integer dot instructions ([`peak_macs_per_sec`]), what a compute-bound integer matmul is
//! put over.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

/// The integer dot products of the matmul paths (int16 and int8 activations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dot {
    /// i16 × i16 pairs into i32: `vpdpwssd` (AVX-512 VNNI), else `vpmaddwd` + `vpaddd` (AVX2).
    Int16,
    /// u8 × i8 quads into i32: `vpdpbusd` (AVX-512 VNNI), else `vpmaddubsw` + `vpmaddwd` +
    /// `vpaddd` (AVX2).
    Int8,
}

/// Multiply-adds per second of a register-only loop of this CPU's widest `dot` instruction,
/// `iters` rounds of independent accumulator chains on every thread of the rayon pool at once:
/// the roofline of a compute-bound integer matmul (no loads, no stores, no reductions). 0 on a
/// CPU without AVX2.
pub fn peak_macs_per_sec(dot: Dot, iters: usize) -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let start = Instant::now();
    let macs: u64 = (0..threads).into_par_iter().map(|_| dot_loop(dot, iters)).sum();
    macs as f64 / start.elapsed().as_secs_f64()
}

/// One thread's loop: returns the multiply-adds it did.
fn dot_loop(dot: Dot, iters: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if quant_kernels::avx512_vnni() {
            // SAFETY: AVX-512 F, BW and VNNI were detected.
            return unsafe { vnni_loop(dot, iters) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected.
            return unsafe { avx2_loop(dot, iters) };
        }
    }
    let _ = (dot, iters);
    0
}

/// Independent accumulators per thread: enough to cover a dot instruction's latency (about 5
/// cycles) at its throughput (up to 2 a cycle).
const CHAINS: usize = 12;

// The loops' instructions are written in `asm!`: as intrinsics over loop-invariant operands,
// LLVM hoists the products out of the loop (one `vpmaddwd` before it, then `vpaddd`s), and the
// "peak" is then a rate of additions.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn vnni_loop(dot: Dot, iters: usize) -> u64 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_epi32(black_box(0x0102_0304));
    let b = _mm512_set1_epi32(black_box(0x0101_0101));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iters {
        for x in &mut acc {
            // SAFETY: register operands only, on a CPU with AVX-512 VNNI (this function's features).
            unsafe {
                match dot {
                    Dot::Int16 => std::arch::asm!(
                        "vpdpwssd {x}, {a}, {b}",
                        x = inout(zmm_reg) *x, a = in(zmm_reg) a, b = in(zmm_reg) b,
                        options(pure, nomem, nostack, preserves_flags),
                    ),
                    Dot::Int8 => std::arch::asm!(
                        "vpdpbusd {x}, {a}, {b}",
                        x = inout(zmm_reg) *x, a = in(zmm_reg) a, b = in(zmm_reg) b,
                        options(pure, nomem, nostack, preserves_flags),
                    ),
                }
            }
        }
    }
    black_box(acc);
    // A zmm holds 32 i16 pairs' products (int16) or 64 u8 × i8 (int8) per instruction.
    (iters * CHAINS) as u64 * if dot == Dot::Int16 { 32 } else { 64 }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2_loop(dot: Dot, iters: usize) -> u64 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_epi32(black_box(0x0102_0304));
    let b = _mm256_set1_epi32(black_box(0x0101_0101));
    let ones = _mm256_set1_epi16(black_box(1));
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..iters {
        for x in &mut acc {
            // SAFETY: register operands only, on a CPU with AVX2 (this function's feature).
            unsafe {
                match dot {
                    Dot::Int16 => std::arch::asm!(
                        "vpmaddwd {t}, {a}, {b}",
                        "vpaddd {x}, {x}, {t}",
                        x = inout(ymm_reg) *x, a = in(ymm_reg) a, b = in(ymm_reg) b, t = out(ymm_reg) _,
                        options(pure, nomem, nostack, preserves_flags),
                    ),
                    Dot::Int8 => std::arch::asm!(
                        "vpmaddubsw {t}, {a}, {b}",
                        "vpmaddwd {t}, {t}, {ones}",
                        "vpaddd {x}, {x}, {t}",
                        x = inout(ymm_reg) *x, a = in(ymm_reg) a, b = in(ymm_reg) b,
                        ones = in(ymm_reg) ones, t = out(ymm_reg) _,
                        options(pure, nomem, nostack, preserves_flags),
                    ),
                }
            }
        }
    }
    black_box(acc);
    (iters * CHAINS) as u64 * if dot == Dot::Int16 { 16 } else { 32 }
}

/// The wrapping sum of `words`, read once.
pub fn read_only_sum(words: &[u32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { read_only_sum_avx2(words) };
    }
    words.iter().fold(0, |a, &v| a.wrapping_add(v))
}

/// [`read_only_sum`] over the current rayon pool (eight chunks a thread, so that a thread that
/// falls behind is caught up by the others).
pub fn par_read_only_sum(words: &[u32]) -> u32 {
    let chunk = (words.len() / rayon::current_num_threads().max(1) / 8).max(1024);
    words.par_chunks(chunk).map(read_only_sum).reduce(|| 0, u32::wrapping_add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn read_only_sum_avx2(words: &[u32]) -> u32 {
    use std::arch::x86_64::*;
    // Four accumulators: four loads in flight a cycle, not one chain of adds.
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut blocks = words.chunks_exact(32);
    for b in &mut blocks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: each block holds 32 words: four loads of eight.
            *a = _mm256_add_epi32(*a, unsafe { _mm256_loadu_si256(b.as_ptr().add(8 * i) as *const __m256i) });
        }
    }
    let mut lanes = [0u32; 8];
    let sum = _mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3]));
    // SAFETY: eight u32 lanes into eight u32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum) };
    lanes.iter().chain(blocks.remainder()).fold(0, |a, &v| a.wrapping_add(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sums_are_the_wrapping_sum_of_every_word() {
        let words: Vec<u32> = (0..100_003u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let want = words.iter().fold(0u32, |a, &v| a.wrapping_add(v));
        assert_eq!(read_only_sum(&words), want);
        assert_eq!(par_read_only_sum(&words), want);
        assert_eq!(read_only_sum(&words[..31]), words[..31].iter().fold(0u32, |a, &v| a.wrapping_add(v)));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_peak_loops_count_their_multiply_adds() {
        if !is_x86_feature_detected!("avx2") {
            return assert_eq!(dot_loop(Dot::Int16, 10), 0);
        }
        let per = |dot| dot_loop(dot, 1000) / (1000 * CHAINS as u64);
        let wide = quant_kernels::avx512_vnni();
        assert_eq!(per(Dot::Int16), if wide { 32 } else { 16 });
        assert_eq!(per(Dot::Int8), if wide { 64 } else { 32 });
        assert!(peak_macs_per_sec(Dot::Int16, 1000) > 0.0);
    }
}
