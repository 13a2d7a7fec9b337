//! The per-row sampling arithmetic: softmax, argmax, min-p / top-k / top-p truncation and
//! the inverse-CDF draw. Plain functions over one vocabulary row so they can be tested
//! against a tiny obviously-correct version.

use std::cmp::Ordering;

/// Which truncations apply to one row (after temperature).
#[derive(Debug, Clone, Copy)]
pub struct Truncation {
    pub min_p: f32,
    pub top_k: Option<usize>,
    pub top_p: f32,
}

impl Truncation {
    fn is_noop(&self) -> bool {
        self.min_p <= 0.0 && self.top_k.is_none() && self.top_p >= 1.0
    }
}

/// Index of the largest finite value (lowest index on ties); `None` if every value is -inf/NaN.
/// Two branch-free passes the compiler vectorises (the max, then its first position): greedy
/// decoding runs this over the whole vocabulary for every sequence every step.
pub fn argmax(row: &[f32]) -> Option<u32> {
    // NaN loses every comparison, so `max` skips it; -inf is the identity.
    let best = max_of(row);
    if best == f32::NEG_INFINITY {
        return None;
    }
    row.iter().position(|&v| v == best).and_then(|i| u32::try_from(i).ok())
}

/// `log(sum(exp(row)))` ignoring NaN; `-inf` when nothing is finite.
pub fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = row.iter().filter(|v| !v.is_nan()).map(|&v| f64::from((v - max).exp())).sum();
    max + sum.ln() as f32
}

/// Turns logits into probabilities in place (NaN counts as impossible). Returns `false` when
/// no token has a finite logit.
pub fn softmax_in_place(row: &mut [f32]) -> bool {
    // NaN becomes −∞, whose exponential is exactly 0 (and which `max` skips).
    row.iter_mut().filter(|v| v.is_nan()).for_each(|v| *v = f32::NEG_INFINITY);
    let max = max_of(row);
    if max == f32::NEG_INFINITY {
        return false;
    }
    // Vectorized exponentials (a large vocabulary's row is 262 144 of them per token).
    let inv = 1.0 / attn_kernels::cpu::act::exp_sub_sum(row, max);
    row.iter_mut().for_each(|v| *v *= inv);
    true
}

/// The largest value, NaN skipped (`-inf` for none), in 16 lanes so that it vectorizes.
fn max_of(row: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = row.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    tail.iter().fold(lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max), |m, &v| m.max(v))
}

/// The `n` largest values as `(index, value)`, largest first, lowest index on ties.
pub fn top_n(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() || (best.len() == n && best.last().is_some_and(|&(_, w)| v <= w)) {
            continue;
        }
        let pos = best.partition_point(|&(_, w)| w >= v);
        best.insert(pos, (i as u32, v));
        best.truncate(n);
    }
    best
}

/// Descending by probability, then ascending by index: a total order, so the
/// truncated set is the same whatever the selection algorithm does with ties.
fn by_prob_desc(probs: &[f32]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b))
}

/// Draws a token from normalized `probs` with the uniform `u` in [0, 1), after min-p,
/// top-k and then top-p truncation (vLLM v1 order). `scratch` keeps its allocation
/// between rows.
pub fn sample_truncated(probs: &[f32], trunc: Truncation, u: f64, scratch: &mut Vec<u32>) -> Option<u32> {
    if trunc.is_noop() {
        return draw_dense(probs, u);
    }
    let max = probs.iter().copied().fold(0.0f32, f32::max);
    let floor = if trunc.min_p > 0.0 { trunc.min_p * max } else { 0.0 };
    scratch.clear();
    scratch.extend((0..probs.len() as u32).filter(|&i| {
        let p = probs[i as usize];
        p > 0.0 && p >= floor
    }));
    let cmp = by_prob_desc(probs);
    if let Some(k) = trunc.top_k
        && k < scratch.len()
    {
        scratch.select_nth_unstable_by(k - 1, &cmp);
        scratch.truncate(k);
    }
    if trunc.top_p < 1.0 {
        keep_nucleus(probs, scratch, trunc.top_p, &cmp);
    }
    draw(scratch.iter().map(|&i| (i, probs[i as usize])), u)
}

/// Keeps the smallest most-likely prefix of `cand` whose mass reaches `top_p` of the
/// candidates' mass. Sorts only a growing window of the best candidates, since the
/// nucleus is usually a few dozen tokens out of tens of thousands.
fn keep_nucleus(probs: &[f32], cand: &mut Vec<u32>, top_p: f32, cmp: &impl Fn(&u32, &u32) -> Ordering) {
    let total: f64 = cand.iter().map(|&i| f64::from(probs[i as usize])).sum();
    let target = f64::from(top_p) * total;
    let mut window = cand.len().min(64);
    loop {
        if window < cand.len() {
            cand.select_nth_unstable_by(window - 1, cmp);
        }
        cand[..window].sort_unstable_by(cmp);
        let mut cum = 0.0f64;
        for (j, &i) in cand[..window].iter().enumerate() {
            cum += f64::from(probs[i as usize]);
            if cum >= target {
                cand.truncate(j + 1);
                return;
            }
        }
        if window == cand.len() {
            return;
        }
        window = (window * 4).min(cand.len());
    }
}

/// Inverse-CDF draw over `(token, weight)` pairs (weights need not sum to one).
fn draw(items: impl Iterator<Item = (u32, f32)> + Clone, u: f64) -> Option<u32> {
    let total: f64 = items.clone().map(|(_, p)| f64::from(p)).sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut cum = 0.0f64;
    let mut last = None;
    for (i, p) in items {
        if p <= 0.0 {
            continue;
        }
        cum += f64::from(p);
        last = Some(i);
        if cum > target {
            return Some(i);
        }
    }
    // Rounding left `target` just above the final sum: the last possible token.
    last
}

/// [`draw`] over a whole row: chunk sums in vectorized f32 lanes find the chunk that holds the
/// draw, and only that chunk is walked value by value (a large vocabulary's row is 262 144
/// values; the sequential f64 sums took two passes over all of them). A NaN weight is never
/// drawn and adds nothing.
fn draw_dense(probs: &[f32], u: f64) -> Option<u32> {
    const CHUNK: usize = 256;
    let sums: Vec<f64> = probs.chunks(CHUNK).map(|c| f64::from(positive_sum(c))).collect();
    let total: f64 = sums.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut cum = 0.0f64;
    for (c, (&sum, chunk)) in sums.iter().zip(probs.chunks(CHUNK)).enumerate() {
        if cum + sum <= target {
            cum += sum;
            continue;
        }
        for (j, &p) in chunk.iter().enumerate() {
            if p > 0.0 {
                cum += f64::from(p);
                if cum > target {
                    return u32::try_from(c * CHUNK + j).ok();
                }
            }
        }
        // The chunk's values, added one by one, stayed under its lane-wise sum: go on.
    }
    // Rounding left `target` just above the final sum: the last possible token.
    probs.iter().rposition(|&p| p > 0.0).and_then(|i| u32::try_from(i).ok())
}

/// The sum of the positive values, in 16 lanes so that it vectorizes.
fn positive_sum(values: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [0.0f32; L];
    let chunks = values.chunks_exact(L);
    let tail: f32 = chunks.remainder().iter().map(|&v| if v > 0.0 { v } else { 0.0 }).sum();
    for c in chunks {
        for (s, &v) in lanes.iter_mut().zip(c) {
            *s += if v > 0.0 { v } else { 0.0 };
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Obviously-correct truncation: sort everything, then apply the rules literally.
    fn naive_kept(probs: &[f32], t: Truncation) -> Vec<u32> {
        let max = probs.iter().copied().fold(0.0f32, f32::max);
        let mut idx: Vec<u32> = (0..probs.len() as u32)
            .filter(|&i| probs[i as usize] > 0.0 && probs[i as usize] >= t.min_p * max)
            .collect();
        idx.sort_by(by_prob_desc(probs));
        if let Some(k) = t.top_k {
            idx.truncate(k);
        }
        if t.top_p < 1.0 {
            let total: f64 = idx.iter().map(|&i| f64::from(probs[i as usize])).sum();
            let mut cum = 0.0;
            let mut keep = idx.len();
            for (j, &i) in idx.iter().enumerate() {
                cum += f64::from(probs[i as usize]);
                if cum >= f64::from(t.top_p) * total {
                    keep = j + 1;
                    break;
                }
            }
            idx.truncate(keep);
        }
        idx.sort_unstable();
        idx
    }

    fn kept_set(probs: &[f32], t: Truncation) -> Vec<u32> {
        let mut scratch = Vec::new();
        // u just below 1 picks the last candidate; collect the candidate set instead.
        let _ = sample_truncated(probs, t, 0.5, &mut scratch);
        if t.is_noop() {
            return (0..probs.len() as u32).filter(|&i| probs[i as usize] > 0.0).collect();
        }
        scratch.sort_unstable();
        scratch
    }

    #[test]
    fn argmax_skips_nan_and_prefers_lowest_index() {
        assert_eq!(argmax(&[1.0, f32::NAN, 3.0, 3.0]), Some(2));
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN]), None);
        assert_eq!(argmax(&[-5.0]), Some(0));
    }

    #[test]
    fn softmax_and_log_sum_exp_agree() {
        let mut row = vec![1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        let lse = log_sum_exp(&row);
        let expected = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln() as f32;
        assert!((lse - expected).abs() < 1e-5);
        assert!(softmax_in_place(&mut row));
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((row[2] - (3.0 - expected).exp()).abs() < 1e-6);
        assert_eq!(row[3], 0.0);
        assert!(!softmax_in_place(&mut [f32::NEG_INFINITY, f32::NAN]));
    }

    /// A vocabulary-sized row through the vectorized exponentials: every probability within
    /// f32 accuracy of an f64 softmax, NaN and −∞ (and values far below the largest) exactly 0.
    #[test]
    fn a_long_row_matches_an_f64_softmax() {
        let mut row: Vec<f32> = (0..4099).map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0).collect();
        row[5] = f32::NAN;
        row[4000] = f32::NEG_INFINITY;
        row[77] = -200.0;
        let finite = |v: f32| !v.is_nan() && v > -100.0;
        let max =
            row.iter().copied().filter(|&v| finite(v)).fold(f64::NEG_INFINITY, |m, v| m.max(f64::from(v)));
        let total: f64 = row.iter().filter(|&&v| finite(v)).map(|&v| (f64::from(v) - max).exp()).sum();
        let want: Vec<f64> =
            row.iter().map(|&v| if finite(v) { (f64::from(v) - max).exp() / total } else { 0.0 }).collect();
        assert!(softmax_in_place(&mut row));
        for (i, (&got, &want)) in row.iter().zip(&want).enumerate() {
            assert!((f64::from(got) - want).abs() <= 1e-6 * want + 1e-12, "{i}: {got} vs {want}");
        }
        assert_eq!((row[5], row[4000], row[77]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn top_n_orders_largest_first() {
        assert_eq!(top_n(&[0.1, 0.5, 0.3, 0.5], 3), vec![(1, 0.5), (3, 0.5), (2, 0.3)]);
        assert!(top_n(&[1.0], 0).is_empty());
        assert_eq!(top_n(&[1.0, 2.0], 5).len(), 2);
    }

    #[test]
    fn draw_follows_the_cdf() {
        let probs = [0.1f32, 0.0, 0.6, 0.3];
        let t = Truncation { min_p: 0.0, top_k: None, top_p: 1.0 };
        let mut s = Vec::new();
        assert_eq!(sample_truncated(&probs, t, 0.05, &mut s), Some(0));
        assert_eq!(sample_truncated(&probs, t, 0.5, &mut s), Some(2));
        assert_eq!(sample_truncated(&probs, t, 0.95, &mut s), Some(3));
        assert_eq!(sample_truncated(&probs, t, 0.999_999_999, &mut s), Some(3));
        assert_eq!(sample_truncated(&[0.0, 0.0], t, 0.5, &mut s), None);
    }

    /// The chunked draw picks what the plain inverse-CDF walk picks, but where the target lies
    /// within rounding of a boundary between two tokens.
    #[test]
    fn the_chunked_draw_walks_the_same_cdf() {
        let mut probs: Vec<f32> = (0..3001).map(|i| ((i * 7919) % 613) as f32).collect();
        probs[10] = 0.0;
        probs[2999] = f32::NAN;
        let plain = |u: f64| {
            draw(probs.iter().copied().enumerate().filter(|p| !p.1.is_nan()).map(|(i, p)| (i as u32, p)), u)
        };
        let total: f64 = probs.iter().filter(|p| !p.is_nan()).map(|&p| f64::from(p)).sum();
        for step in 0..2000 {
            let u = f64::from(step) / 2000.0;
            let (got, want) = (draw_dense(&probs, u).unwrap(), plain(u).unwrap());
            if got != want {
                // Only a boundary within rounding may differ.
                let below: f64 = probs[..want.min(got) as usize + 1]
                    .iter()
                    .filter(|p| !p.is_nan())
                    .map(|&p| f64::from(p))
                    .sum();
                assert!((below - u * total).abs() <= 1e-6 * total, "u = {u}: {got} vs {want}");
            }
        }
        assert_eq!(draw_dense(&[0.0, 0.0], 0.5), None);
        assert_eq!(draw_dense(&[0.0, 2.0, 0.0], 0.999_999_999), Some(1));
    }

    #[test]
    fn truncations_keep_the_expected_tokens() {
        let probs = [0.05f32, 0.4, 0.3, 0.2, 0.05];
        let t = |min_p, top_k, top_p| Truncation { min_p, top_k, top_p };
        assert_eq!(kept_set(&probs, t(0.0, Some(2), 1.0)), vec![1, 2]);
        assert_eq!(kept_set(&probs, t(0.0, None, 0.7)), vec![1, 2]);
        assert_eq!(kept_set(&probs, t(0.0, None, 0.71)), vec![1, 2, 3]);
        assert_eq!(kept_set(&probs, t(0.5, None, 1.0)), vec![1, 2, 3]);
        assert_eq!(kept_set(&probs, t(0.0, None, 1e-6)), vec![1]);
    }

    proptest! {
        #[test]
        fn argmax_matches_a_plain_scan(
            row in prop::collection::vec(
                prop_oneof![8 => -5.0f32..5.0, 1 => Just(f32::NAN), 1 => Just(f32::NEG_INFINITY), 1 => Just(2.5f32)],
                0..100,
            ),
        ) {
            let mut best: Option<(usize, f32)> = None;
            for (i, &v) in row.iter().enumerate() {
                if !v.is_nan() && v != f32::NEG_INFINITY && best.is_none_or(|(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            prop_assert_eq!(argmax(&row), best.map(|(i, _)| i as u32));
        }

        #[test]
        fn truncation_matches_naive(
            raw in prop::collection::vec(0.0f32..1.0, 1..300),
            min_p in prop_oneof![Just(0.0f32), 0.0f32..1.0],
            top_k in prop_oneof![Just(None), (1usize..50).prop_map(Some)],
            top_p in prop_oneof![Just(1.0f32), 0.01f32..1.0],
        ) {
            let total: f32 = raw.iter().sum();
            prop_assume!(total > 0.0);
            let probs: Vec<f32> = raw.iter().map(|p| p / total).collect();
            let t = Truncation { min_p, top_k, top_p };
            prop_assert_eq!(kept_set(&probs, t), naive_kept(&probs, t));
        }

        #[test]
        fn sampled_token_is_always_a_kept_one(
            raw in prop::collection::vec(0.0f32..1.0, 1..200),
            top_k in prop_oneof![Just(None), (1usize..20).prop_map(Some)],
            top_p in 0.05f32..=1.0,
            u in 0.0f64..1.0,
        ) {
            let total: f32 = raw.iter().sum();
            prop_assume!(total > 0.0);
            let probs: Vec<f32> = raw.iter().map(|p| p / total).collect();
            let t = Truncation { min_p: 0.0, top_k, top_p };
            let mut s = Vec::new();
            let tok = sample_truncated(&probs, t, u, &mut s);
            let kept = naive_kept(&probs, t);
            prop_assert!(tok.is_some_and(|tok| kept.contains(&tok)));
        }
    }
}
