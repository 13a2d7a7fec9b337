//! The read-only yardstick of the benches: the wrapping sum of a buffer of words, as fast as
//! loads go (AVX2 where the CPU has it), so that a kernel bound by reading memory can be put
//! over what reading the same bytes alone costs, in the same samples.

use rayon::prelude::*;

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
}
