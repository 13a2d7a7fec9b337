//! Synthetic benchmark prompts, like vLLM's random dataset: what `xtask throughput`, the e2e
//! bench and the GPU check feed the engine.

use rand::Rng;

/// `len` random token ids in `[0, vocab)`, none of them an end-of-sequence id (so a prompt
/// never looks finished and `ignore_eos` runs see no stray EOS in their context).
pub fn random_prompt<R: Rng + ?Sized>(rng: &mut R, len: usize, vocab: usize, eos: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let t = rng.random_range(0..vocab as u32);
        if !eos.contains(&t) {
            out.push(t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    #[test]
    fn random_prompt_has_the_length_and_avoids_eos() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let p = super::random_prompt(&mut rng, 500, 8, &[0, 3]);
        assert_eq!(p.len(), 500);
        assert!(p.iter().all(|&t| t < 8 && t != 0 && t != 3));
    }
}
