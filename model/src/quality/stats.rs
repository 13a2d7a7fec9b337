//! The statistics of a quality run, as llama-perplexity reports them: the perplexity with its ±
//! (from the standard error of the mean negative log-likelihood), and against a reference the
//! KL divergence per row (mean ±, 99th percentile, maximum), the share of rows whose most
//! likely token is the reference's ("same top token"), the RMS of Δp (the change in the
//! probability of the text's own next token) and the ratio of the perplexities.

/// One row (a scored position) against the reference's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowComparison {
    /// KL(reference ‖ this) in nats, over the reference's top k and the rest as one outcome.
    pub kld: f64,
    /// Whether this row's most likely token is the reference's.
    pub same_top: bool,
    /// p(next token) here minus the reference's.
    pub delta_p: f64,
}

impl RowComparison {
    /// Compares `row` (this run's log-probabilities over the whole vocabulary) with the
    /// reference's top tokens `reference` (most likely first, natural-log probabilities) and its
    /// log-probability `reference_next` of the text's next token `next`.
    pub fn new(row: &[f32], reference: &[(u32, f32)], reference_next: f32, next: u32) -> Self {
        let at_reference_tops = reference.iter().map(|&(t, _)| row[t as usize]);
        Self::from_parts(at_reference_tops, argmax(row), row[next as usize], reference, reference_next)
    }

    /// [`RowComparison::new`] from what a row needs of this run: its log-probabilities of the
    /// reference's top tokens (in their order), its most likely token and its log-probability of
    /// the text's next token (what an evaluated-rows file holds).
    pub fn from_parts(
        at_reference_tops: impl IntoIterator<Item = f32>,
        top: u32,
        next: f32,
        reference: &[(u32, f32)],
        reference_next: f32,
    ) -> Self {
        let (mut kld, mut p_top, mut q_top) = (0.0f64, 0.0f64, 0.0f64);
        for (&(_, lp), lq) in reference.iter().zip(at_reference_tops) {
            let (lp, lq) = (f64::from(lp), f64::from(lq));
            let p = lp.exp();
            kld += p * (lp - lq);
            p_top += p;
            q_top += lq.exp();
        }
        // The rest of the vocabulary as one outcome (clamped: rounding may leave it a hair below 0).
        let (p_rest, q_rest) = ((1.0 - p_top).max(0.0), (1.0 - q_top).max(f64::MIN_POSITIVE));
        if p_rest > 0.0 {
            kld += p_rest * (p_rest.ln() - q_rest.ln());
        }
        Self {
            kld: kld.max(0.0),
            same_top: reference.first().map(|&(t, _)| t) == Some(top),
            delta_p: f64::from(next).exp() - f64::from(reference_next).exp(),
        }
    }
}

/// The most likely token of a row (the lowest id of a tie).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The `k` most likely tokens of `row`, most likely first (ties: the lower id first).
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    let by_value = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_value);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_value);
    idx.into_iter().map(|t| (t, row[t as usize])).collect()
}

/// The running sums of a quality run.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// −log p(next token) of every scored row, this run's and (with a reference) the reference's.
    nll: Vec<f64>,
    reference_nll: Vec<f64>,
    kld: Vec<f64>,
    same_top: usize,
    delta_p_squares: f64,
}

/// What a quality run reports.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct QualityReport {
    pub rows: usize,
    pub ppl: f64,
    /// One standard error of `ppl`.
    pub ppl_err: f64,
    /// With a reference: its perplexity, this one's over it, the KL statistics.
    pub reference_ppl: Option<f64>,
    pub ppl_ratio: Option<f64>,
    pub kld_mean: Option<f64>,
    pub kld_err: Option<f64>,
    pub kld_p99: Option<f64>,
    pub kld_max: Option<f64>,
    /// Share of rows (0..1) whose most likely token is the reference's.
    pub top1_agree: Option<f64>,
    pub rms_delta_p: Option<f64>,
}

impl Tally {
    /// A row of this run: the log-probability of the text's next token.
    pub fn add(&mut self, next_log_prob: f32) {
        self.nll.push(-f64::from(next_log_prob));
    }

    /// A row compared with the reference's (after [`Tally::add`] of the same row).
    pub fn add_comparison(&mut self, c: RowComparison, reference_next: f32) {
        self.reference_nll.push(-f64::from(reference_next));
        self.kld.push(c.kld);
        self.same_top += usize::from(c.same_top);
        self.delta_p_squares += c.delta_p * c.delta_p;
    }

    /// The perplexity so far (what the per-window progress prints).
    pub fn ppl(&self) -> f64 {
        mean_and_err(&self.nll).0.exp()
    }

    pub fn report(&self) -> QualityReport {
        let (nll, nll_err) = mean_and_err(&self.nll);
        let ppl = nll.exp();
        let compared = !self.kld.is_empty();
        let (kld_mean, kld_err) = mean_and_err(&self.kld);
        let reference_ppl = mean_and_err(&self.reference_nll).0.exp();
        let n = self.kld.len() as f64;
        QualityReport {
            rows: self.nll.len(),
            ppl,
            ppl_err: ppl * nll_err,
            reference_ppl: compared.then_some(reference_ppl),
            ppl_ratio: compared.then(|| ppl / reference_ppl),
            kld_mean: compared.then_some(kld_mean),
            kld_err: compared.then_some(kld_err),
            kld_p99: compared.then(|| quantile(&self.kld, 0.99)),
            kld_max: compared.then(|| self.kld.iter().copied().fold(0.0, f64::max)),
            top1_agree: compared.then(|| self.same_top as f64 / n),
            rms_delta_p: compared.then(|| (self.delta_p_squares / n).sqrt()),
        }
    }
}

/// The mean and its standard error (0 with fewer than two values).
fn mean_and_err(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// The `q` quantile by the nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_probs(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&v| v.ln() as f32).collect()
    }

    #[test]
    fn identical_distributions_diverge_by_nothing() {
        let row = log_probs(&[0.5, 0.25, 0.125, 0.0625, 0.0625]);
        for k in [1, 2, 5] {
            let c = RowComparison::new(&row, &top_k(&row, k), row[1], 1);
            assert!(c.kld.abs() < 1e-7, "top {k}: {}", c.kld);
            assert!(c.same_top && c.delta_p.abs() < 1e-7);
        }
    }

    #[test]
    fn known_pairs_give_their_closed_form() {
        // Two outcomes: KL(p‖q) = p ln(p/q) + (1−p) ln((1−p)/(1−q)).
        let (p, q) = (0.8f64, 0.6f64);
        let want = p * (p / q).ln() + (1.0 - p) * ((1.0 - p) / (1.0 - q)).ln();
        let (pr, qr) = (log_probs(&[p, 1.0 - p]), log_probs(&[q, 1.0 - q]));
        let full = RowComparison::new(&qr, &top_k(&pr, 2), pr[0], 0);
        assert!((full.kld - want).abs() < 1e-6, "{} vs {want}", full.kld);
        // The top one alone: the other outcome is "the rest", the same partition.
        let grouped = RowComparison::new(&qr, &top_k(&pr, 1), pr[0], 0);
        assert!((grouped.kld - want).abs() < 1e-6);
        assert!((full.delta_p - (q - p)).abs() < 1e-6);
        // Uniform over 4 against one putting 0.7 on the first: KL = ln 4 + Σ ¼ ln(¼ / q_i).
        let u = log_probs(&[0.25; 4]);
        let skew = [0.7, 0.1, 0.1, 0.1];
        let want: f64 = skew.iter().map(|qi: &f64| 0.25 * (0.25 / qi).ln()).sum();
        let c = RowComparison::new(&log_probs(&skew), &top_k(&u, 4), u[2], 2);
        assert!((c.kld - want).abs() < 1e-6, "{} vs {want}", c.kld);
        // Grouping the tail into one outcome can only lower the divergence.
        let tail = RowComparison::new(
            &log_probs(&[0.4, 0.5, 0.05, 0.05]),
            &top_k(&log_probs(&[0.4, 0.3, 0.2, 0.1]), 2),
            0.0,
            0,
        );
        let all = RowComparison::new(
            &log_probs(&[0.4, 0.5, 0.05, 0.05]),
            &top_k(&log_probs(&[0.4, 0.3, 0.2, 0.1]), 4),
            0.0,
            0,
        );
        assert!(tail.kld <= all.kld + 1e-12 && tail.kld > 0.0);
        assert!(!tail.same_top);
    }

    #[test]
    fn the_tally_reports_perplexity_and_agreement() {
        let mut t = Tally::default();
        for lp in [0.5f64, 0.25] {
            t.add(lp.ln() as f32);
        }
        let r = t.report();
        assert!((r.ppl - (2.0f64 * 4.0).sqrt()).abs() < 1e-5, "{}", r.ppl);
        assert_eq!((r.rows, r.kld_mean), (2, None));
        let row = log_probs(&[0.5, 0.5]);
        t.add_comparison(RowComparison::new(&row, &top_k(&row, 2), row[0], 0), 0.5f32.ln());
        t.add_comparison(
            RowComparison::new(&row, &top_k(&log_probs(&[0.1, 0.9]), 2), 0.9f32.ln(), 1),
            0.9f32.ln(),
        );
        let r = t.report();
        assert_eq!(r.top1_agree, Some(0.5));
        assert!(r.kld_max.unwrap() > 0.3 && r.kld_mean.unwrap() > 0.1);
    }

    #[test]
    fn top_k_is_sorted_and_breaks_ties_by_id() {
        assert_eq!(top_k(&[0.0, 3.0, 3.0, 1.0], 3), vec![(1, 3.0), (2, 3.0), (3, 1.0)]);
        assert_eq!(top_k(&[2.0, 1.0], 5).len(), 2);
    }
}
