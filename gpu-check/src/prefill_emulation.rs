//! A CPU model of the tiled prefill kernel (`paged_prefill_body` in `attn-kernels`' `attention.cu`;
//! tests only): the same tiles ([`PrefillPlan`]), head chunks, key tiles of [`PREFILL_KEYS`] keys
//! up to the tile's last position, keys past the sequence zeroed and never read, the same masks
//! and the same online softmax (running max, rescale by `exp(m_old − m_new)`, sum), in f32. It
//! checks the tiling and the algorithm against the f64 reference without a GPU; the device run
//! checks the kernel itself (`gpu_check`, variant `Tiled`).

use attn_kernels::cuda::kernels::PREFILL_KEYS;
use attn_kernels::cuda::ops::PrefillPlan;

use crate::attn_cases::AttnCase;

/// The rows the tiled kernel writes (every query token of the sequences of more than one token,
/// every head), computed as the kernel does; the other rows stay NaN.
pub fn tiled_prefill(case: &AttnCase, plan: &PrefillPlan) -> Vec<f32> {
    let g = *case.cache.geometry();
    let (d, bs, kvh) = (g.head_size, g.block_size, g.num_kv_heads);
    let group = case.num_heads / kvh;
    let qsl: Vec<i32> = case.metadata.query_start_loc.iter().map(|&v| v as i32).collect();
    let lens: Vec<i32> = case.metadata.seq_lens.iter().map(|&v| v as i32).collect();
    let mut out = vec![f32::NAN; case.query.len()];
    let slot = |s: usize, key: usize| case.metadata.slot(s, key, bs);
    for tile in plan.tiles(&qsl, &lens).chunks_exact(2) {
        let (s, tok0) = (tile[0] as usize, tile[1] as usize);
        let (q_begin, qlen, seq_len) = (qsl[s] as usize, (qsl[s + 1] - qsl[s]) as usize, lens[s] as usize);
        let first_pos = seq_len - qlen;
        let ntok = plan.tile_tokens.min(qlen - tok0);
        let kend = seq_len.min(first_pos + tok0 + ntok);
        for kv_head in 0..kvh {
            for chunk in 0..plan.head_chunks {
                let head0 = kv_head * group + chunk * plan.tile_heads;
                let heads = plan.tile_heads.min(kv_head * group + group - head0);
                // Per row: (token index, head, running max, running sum, accumulator).
                let mut rows: Vec<(usize, usize, f32, f32, Vec<f32>)> = (0..plan.rows)
                    .map(|r| (r / plan.tile_heads, r % plan.tile_heads))
                    .filter(|&(rt, rh)| rt < ntok && rh < heads)
                    .map(|(rt, rh)| (rt, head0 + rh, f32::NEG_INFINITY, 0.0, vec![0.0; d]))
                    .collect();
                for kt0 in (0..kend).step_by(PREFILL_KEYS) {
                    let load = |value: bool| -> Vec<Vec<f32>> {
                        (kt0..kt0 + PREFILL_KEYS)
                            .map(|key| {
                                if key >= seq_len {
                                    return vec![0.0; d];
                                }
                                let v = if value {
                                    case.cache.read_value(slot(s, key), kv_head)
                                } else {
                                    case.cache.read_key(slot(s, key), kv_head)
                                };
                                v.unwrap_or_else(|_| vec![f32::NAN; d])
                            })
                            .collect()
                    };
                    let (k_tile, v_tile) = (load(false), load(true));
                    let nk = PREFILL_KEYS.min(kend - kt0);
                    for (rt, head, m_run, l_run, acc) in rows.iter_mut() {
                        let pos = first_pos + tok0 + *rt;
                        let q = &case.query[((q_begin + tok0 + *rt) * case.num_heads + *head) * d..][..d];
                        let scores: Vec<f32> = (0..PREFILL_KEYS)
                            .map(|c| {
                                let key = kt0 + c;
                                if key <= pos && key < seq_len {
                                    q.iter().zip(&k_tile[c]).map(|(a, b)| a * case.scores.scale * b).sum()
                                } else {
                                    f32::NEG_INFINITY
                                }
                            })
                            .collect();
                        let m_new = scores.iter().copied().fold(*m_run, f32::max);
                        let seen = m_new != f32::NEG_INFINITY;
                        let alpha = if seen { (*m_run - m_new).exp() } else { 1.0 };
                        let p: Vec<f32> = scores
                            .iter()
                            .map(|&x| if seen && x != f32::NEG_INFINITY { (x - m_new).exp() } else { 0.0 })
                            .collect();
                        *l_run = *l_run * alpha + p.iter().sum::<f32>();
                        *m_run = m_new;
                        for (i, a) in acc.iter_mut().enumerate() {
                            *a = (0..nk).fold(*a * alpha, |a, c| a + p[c] * v_tile[c][i]);
                        }
                    }
                }
                for (rt, head, _, l_run, acc) in rows {
                    let o = &mut out[((q_begin + tok0 + rt) * case.num_heads + head) * d..][..d];
                    for (o, a) in o.iter_mut().zip(acc) {
                        *o = a / l_run;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use kv_cache::{CacheGeometry, DType};

    use super::*;
    use crate::attn_cases::{attention_tolerance, batches, max_rel_error};

    /// The tiled algorithm, tile plan included, meets the GPU check's tolerance on its prefill
    /// rows (GQA 1–8 and a group past one tile's rows, every block size, heads of 64 and of 256
    /// with their 16-row tiles), writes every prefill row and nothing else.
    #[test]
    fn the_tiled_prefill_algorithm_matches_the_reference() -> Result<(), attn_kernels::AttnError> {
        let mut seed = 0;
        for (head, group, kv) in [(64, 1, 2), (64, 3, 2), (256, 4, 1), (64, 8, 1), (80, 40, 1)] {
            for bs in [8, 16, 32] {
                for (name, chunks) in batches().into_iter().filter(|(n, _)| *n != "decode") {
                    seed += 1;
                    let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(bs)).sum();
                    let geometry = CacheGeometry {
                        num_blocks: 2 * needed + 3,
                        num_kv_heads: kv,
                        head_size: head,
                        block_size: bs,
                        dtype: DType::BF16,
                    };
                    let case = AttnCase::random(geometry, kv * group, &chunks, seed)?;
                    let want = case.reference()?;
                    let plan = PrefillPlan::new(head, group);
                    let got = tiled_prefill(&case, &plan);
                    let row = case.num_heads * head;
                    let (mut g, mut w) = (Vec::new(), Vec::new());
                    for (s, &(q, _)) in chunks.iter().enumerate() {
                        let rows = case.metadata.query_start_loc[s] * row
                            ..case.metadata.query_start_loc[s + 1] * row;
                        if q > 1 {
                            g.extend_from_slice(&got[rows.clone()]);
                            w.extend_from_slice(&want[rows]);
                        } else {
                            assert!(got[rows].iter().all(|v| v.is_nan()), "{name}: a decode row was written");
                        }
                    }
                    let err = max_rel_error(&g, &w);
                    let what = format!("{name} h{head} group {group} b{bs}");
                    assert!(err <= attention_tolerance(DType::BF16), "{what}: {err:.2e}");
                    assert!(!g.is_empty(), "{what}");
                }
            }
        }
        Ok(())
    }
}
