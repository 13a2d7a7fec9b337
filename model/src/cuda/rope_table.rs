//! The rotary table the CUDA `rotary` kernel reads: per position, the cos of the `head_dim / 2`
//! frequencies then their sin (f32), built on the host from [`Rope`] so every RoPE scaling the
//! CPU path knows is on the GPU too.

use crate::rope::Rope;

/// `[positions, head_dim]` f32: row `p` = `cos(p·f_i)` for every frequency, then `sin(p·f_i)`.
pub fn cos_sin_table(rope: &Rope, positions: usize) -> Vec<f32> {
    let half = rope.half_dim();
    let mut table = vec![0.0f32; positions * 2 * half];
    for (p, row) in table.chunks_exact_mut(2 * half).enumerate() {
        let (cos, sin) = row.split_at_mut(half);
        rope.fill(p as u32, cos, sin);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::test_config;

    #[test]
    fn rows_match_the_cpu_cos_sin() {
        let rope = Rope::new(&test_config(), crate::arch::RopeKind::Global, 4096);
        let table = cos_sin_table(&rope, 40);
        let half = rope.half_dim();
        assert_eq!(table.len(), 40 * 2 * half);
        let (mut c, mut s) = (vec![0.0; half], vec![0.0; half]);
        rope.fill(37, &mut c, &mut s);
        assert_eq!(&table[37 * 2 * half..][..half], &c[..]);
        assert_eq!(&table[37 * 2 * half + half..][..half], &s[..]);
        assert_eq!(table[0], 1.0);
    }
}
