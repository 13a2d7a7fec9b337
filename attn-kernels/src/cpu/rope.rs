//! Rotary position embedding applied in place to the heads of one token, in the two pair
//! orders: Hugging Face's rotate-half and llama.cpp's interleaved pairs. The frequencies
//! (`cos`, `sin` per pair) are the caller's (`model`'s `Rope`, with its scaling).

/// HF "rotate half" RoPE applied in place to every head of one token:
/// `(x_i, x_{i+d/2}) ← (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin)`.
#[inline]
pub fn rope_rotate_half(heads: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in heads.chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x0, x1) = (a[i], b[i]);
            a[i] = x0 * cos[i] - x1 * sin[i];
            b[i] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

/// llama.cpp-order RoPE (Q/K rows of a GGUF, `model`'s `RopeStyle::Interleaved`) applied in
/// place to every head of one token: `(x_2i, x_2i+1) ← (x_2i·cos − x_2i+1·sin, x_2i+1·cos +
/// x_2i·sin)`, with the frequencies of pair `i` as in [`rope_rotate_half`].
#[inline]
pub fn rope_interleaved(heads: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    for head in heads.chunks_exact_mut(head_dim) {
        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos[i] - x1 * sin[i];
            pair[1] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two pair orders are the same rotation: interleaved pairs `(2i, 2i+1)` of a head hold
    /// what rotate-half's `(i, i + d/2)` hold, and come out equal bit for bit.
    #[test]
    fn interleaved_pairs_rotate_as_rotate_half_does() {
        let (heads, d) = (3, 8);
        let x: Vec<f32> = (0..heads * d).map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0).collect();
        let cos: Vec<f32> = (0..d / 2).map(|i| (0.3 * i as f32).cos()).collect();
        let sin: Vec<f32> = (0..d / 2).map(|i| (0.3 * i as f32).sin()).collect();
        // Each head in llama.cpp's order: value i and value i + d/2 side by side.
        let mut pairs: Vec<f32> =
            x.chunks_exact(d).flat_map(|h| (0..d / 2).flat_map(move |i| [h[i], h[i + d / 2]])).collect();
        let mut half = x.clone();
        rope_rotate_half(&mut half, d, &cos, &sin);
        rope_interleaved(&mut pairs, d, &cos, &sin);
        for (h, (a, b)) in half.chunks_exact(d).zip(pairs.chunks_exact(d)).enumerate() {
            for i in 0..d / 2 {
                assert_eq!((a[i], a[i + d / 2]), (b[2 * i], b[2 * i + 1]), "head {h} pair {i}");
            }
        }
        // A rotation keeps each pair's length.
        let (x0, x1) = (x[1], x[1 + d / 2]);
        let (y0, y1) = (half[1], half[1 + d / 2]);
        assert!(((x0 * x0 + x1 * x1) - (y0 * y0 + y1 * y1)).abs() < 1e-4);
    }
}
