//! Naive reference kernels for tests and benches: gather K/V token by token through the block
//! table with the cache's own per-token accessors, softmax in `f64`. Obviously correct, slow.

use kv_cache::LayerCache;

use crate::meta::validate;
use crate::{AttnError, AttnScores, PagedAttnMetadata};

/// Same contract as [`crate::paged_attention`], computed the slow, obvious way.
pub fn paged_attention(
    out: &mut [f32],
    query: &[f32],
    cache: &LayerCache,
    meta: &PagedAttnMetadata<'_>,
    num_heads: usize,
    scores: impl Into<AttnScores>,
) -> Result<(), AttnError> {
    let scores = scores.into();
    validate(out.len(), query.len(), cache, meta, num_heads, scores)?;
    let (d, bs, kv_heads) = (cache.head_size(), cache.block_size(), cache.num_kv_heads());
    let group = num_heads / kv_heads;
    for s in 0..meta.num_seqs() {
        let seq_len = meta.seq_lens[s];
        let q_len = meta.query_len(s);
        if q_len == 0 {
            continue;
        }
        let table = meta.block_table(s);
        let slots: Vec<usize> = (0..seq_len).map(|i| table[i / bs] as usize * bs + i % bs).collect();
        for kv_head in 0..kv_heads {
            let keys: Vec<Vec<f32>> =
                slots.iter().map(|&slot| cache.read_key(slot, kv_head)).collect::<Result<_, _>>()?;
            let values: Vec<Vec<f32>> =
                slots.iter().map(|&slot| cache.read_value(slot, kv_head)).collect::<Result<_, _>>()?;
            for i in 0..q_len {
                let token = meta.query_start_loc[s] + i;
                let pos = seq_len - q_len + i;
                for head in kv_head * group..(kv_head + 1) * group {
                    let row = (token * num_heads + head) * d;
                    let q = &query[row..row + d];
                    let seen = scores.first_visible(pos)..=pos;
                    let o = attend(q, &keys[seen.clone()], &values[seen], scores.scale as f64);
                    for (dst, v) in out[row..row + d].iter_mut().zip(o) {
                        *dst = v as f32;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `softmax(scale * K q) V` for one query row, all in `f64`.
pub fn attend(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], scale: f64) -> Vec<f64> {
    let logits: Vec<f64> = keys
        .iter()
        .map(|k| scale * k.iter().zip(q).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>())
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut out = vec![0.0f64; q.len()];
    for (w, v) in weights.iter().zip(values) {
        for (o, &x) in out.iter_mut().zip(v) {
            *o += w / total * x as f64;
        }
    }
    out
}
