//! The shapes of the decode-variant sweep (v1 against v2, timed by the bandwidth section's
//! `sweep.rs`) split into the part `attn_kernels::cuda::choose_variant`'s constants were fitted
//! to and a held-out part they were not, and the scoring of the automatic choice on each part:
//! a rule judged only on the shapes it was tuned on would look better than it is.
//!
//! The fitted part is the grid the rule's constants (v1 up to two partitions,
//! `V1_BLOCKS_PER_MULTIPROCESSOR`) were chosen on, on an H200 (132 multiprocessors):
//! [`FIT_LAYOUTS`] × [`FIT_SEQS`] × [`FIT_CONTEXTS`], less what [`MAX_CACHE_BYTES`] leaves out.
//! The held-out part lies off that grid on every axis the rule reads: batches between the
//! fitted ones ([`HELDOUT_SEQS`]); contexts of one and of three partitions (the fitted contexts
//! all have an even number) and between the fitted ones ([`HELDOUT_CONTEXTS`]); head layouts
//! the fit never saw ([`HELDOUT_LAYOUTS`]) besides the fitted ones. The split is fixed by these
//! constants, so every run judges the same shapes.

use std::fmt;

use serde_json::Value;

/// A head layout: query heads, KV heads, head size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub name: &'static str,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
}

impl Layout {
    /// Key and value bytes of one token of a bf16 cache.
    pub fn token_bytes(&self) -> usize {
        self.kv_heads * self.head_size * 2 * 2
    }
}

const fn layout(name: &'static str, heads: usize, kv_heads: usize, head_size: usize) -> Layout {
    Layout { name, heads, kv_heads, head_size }
}

/// Llama-3-8B's, SmolLM2-135M's, Gemma 3 270M's and a multi-head (no GQA) layout: what the
/// constants were fitted on.
pub const FIT_LAYOUTS: [Layout; 4] = [
    layout("h32kv8d128", 32, 8, 128),
    layout("h9kv3d64", 9, 3, 64),
    layout("h4kv1d256", 4, 1, 256),
    layout("h32kv32d128", 32, 32, 128),
];
pub const FIT_SEQS: [usize; 6] = [1, 8, 32, 64, 128, 256];
pub const FIT_CONTEXTS: [usize; 4] = [1_024, 2_048, 4_096, 8_192];

/// Llama-3.2-1B's layout (head size 64 under a group of 4) and Qwen2.5-1.5B's (a group of 6,
/// which no fitted layout has).
pub const HELDOUT_LAYOUTS: [Layout; 2] = [layout("h32kv8d64", 32, 8, 64), layout("h12kv2d128", 12, 2, 128)];
pub const HELDOUT_SEQS: [usize; 5] = [4, 16, 48, 96, 192];
/// One partition (512), two (768), three (1 536) and six (3 072) of `PARTITION_SIZE` tokens.
pub const HELDOUT_CONTEXTS: [usize; 4] = [512, 768, 1_536, 3_072];

/// The most KV bytes one layout's cache may take, sized for the longest context of either
/// part (the multi-head layout's largest batches are left out).
pub const MAX_CACHE_BYTES: usize = 24 << 30;

/// Which part of the sweep a shape is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// On the grid the rule's constants were fitted to.
    Fitted,
    /// Off it: what judges the rule.
    HeldOut,
}

/// One decode batch of the sweep: `seqs` sequences of `context` tokens, one query token each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub layout: Layout,
    pub seqs: usize,
    pub context: usize,
    pub part: Part,
}

impl fmt::Display for Shape {
    /// The shape's figure key stem: `<layout>.s<seqs>.c<context>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.s{}.c{}", self.layout.name, self.seqs, self.context)
    }
}

/// The longest context of the sweep: what each layout's cache is sized for.
pub fn max_context() -> usize {
    FIT_CONTEXTS.into_iter().chain(HELDOUT_CONTEXTS).max().unwrap_or(0)
}

/// Whether `seqs` sequences of the longest context fit `layout`'s cache in [`MAX_CACHE_BYTES`].
pub fn fits(layout: &Layout, seqs: usize) -> bool {
    seqs * max_context() * layout.token_bytes() <= MAX_CACHE_BYTES
}

/// Every shape of the sweep, layout by layout, each layout's by batch then context (the order
/// the sweep allocates in): the fitted grid, and for every layout (fitted or not) the held-out
/// batches × the held-out contexts.
pub fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for layout in FIT_LAYOUTS.into_iter().chain(HELDOUT_LAYOUTS) {
        let fitted = FIT_LAYOUTS.contains(&layout);
        let mut grid: Vec<(usize, usize, Part)> = Vec::new();
        if fitted {
            grid.extend(FIT_SEQS.iter().flat_map(|&s| FIT_CONTEXTS.map(|c| (s, c, Part::Fitted))));
        }
        grid.extend(HELDOUT_SEQS.iter().flat_map(|&s| HELDOUT_CONTEXTS.map(|c| (s, c, Part::HeldOut))));
        grid.retain(|&(seqs, _, _)| fits(&layout, seqs));
        grid.sort_by_key(|&(seqs, context, _)| (seqs, context));
        out.extend(grid.into_iter().map(|(seqs, context, part)| Shape { layout, seqs, context, part }));
    }
    out
}

/// What the sweep measured on one shape: seconds per launch of each variant, and whether the
/// automatic choice ran v2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    pub part: Part,
    pub v1_s: f64,
    pub v2_s: f64,
    pub auto_is_v2: bool,
}

impl Timed {
    /// Whether the automatic choice ran the faster variant (v1 on a tie: it has no reduce).
    pub fn picked_faster(&self) -> bool {
        self.auto_is_v2 == (self.v2_s < self.v1_s)
    }

    /// The time of the variant the automatic choice ran over the faster one's (1 when right).
    pub fn picked_over_best(&self) -> f64 {
        let picked = if self.auto_is_v2 { self.v2_s } else { self.v1_s };
        picked / self.v1_s.min(self.v2_s)
    }
}

/// The automatic choice's record on some shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    pub cases: usize,
    /// The fraction of shapes where it ran the faster variant (0 when there are none).
    pub picked_faster: f64,
    /// Its worst pick's time over the faster variant's (1 when it is never wrong).
    pub worst_over_best: f64,
}

/// The score of the shapes in `part` (every shape for `None`).
pub fn score(timed: &[Timed], part: Option<Part>) -> Score {
    let mine: Vec<&Timed> = timed.iter().filter(|t| part.is_none_or(|p| t.part == p)).collect();
    let right = mine.iter().filter(|t| t.picked_faster()).count();
    let worst = mine.iter().map(|t| t.picked_over_best()).fold(1.0, f64::max);
    Score {
        cases: mine.len(),
        picked_faster: right as f64 / mine.len().max(1) as f64,
        worst_over_best: worst,
    }
}

/// The sweep's summary figures: the whole sweep under the names it has always had
/// (`cuda.sweep.cases`, `cuda.sweep.auto_picked_faster`, `cuda.sweep.auto_worst_over_best`),
/// then the fitted part (`cuda.sweep.fitted_…`) and the held-out part
/// (`cuda.sweep.heldout_…`), the rule's figure on shapes it was not fitted to.
pub fn figures(timed: &[Timed]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (prefix, part) in [("", None), ("fitted_", Some(Part::Fitted)), ("heldout_", Some(Part::HeldOut))] {
        let s = score(timed, part);
        out.push((format!("cuda.sweep.{prefix}cases"), s.cases.into()));
        out.push((format!("cuda.sweep.{prefix}auto_picked_faster"), s.picked_faster.into()));
        out.push((format!("cuda.sweep.{prefix}auto_worst_over_best"), s.worst_over_best.into()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fitted_part_is_the_grid_the_rule_was_fitted_to_and_the_held_out_part_lies_off_it() {
        let all = shapes();
        let fitted: Vec<&Shape> = all.iter().filter(|s| s.part == Part::Fitted).collect();
        let held: Vec<&Shape> = all.iter().filter(|s| s.part == Part::HeldOut).collect();
        // The 4 × 6 × 4 grid less the multi-head layout's 256-sequence batches.
        assert_eq!(fitted.len(), 92);
        assert!(fitted.iter().all(|s| FIT_LAYOUTS.contains(&s.layout)
            && FIT_SEQS.contains(&s.seqs)
            && FIT_CONTEXTS.contains(&s.context)));
        // Every held-out shape is off the fitted grid on its batch and its context, and some are
        // on layouts the fit never saw.
        assert!(!held.is_empty());
        assert!(held.iter().all(|s| !FIT_SEQS.contains(&s.seqs) && !FIT_CONTEXTS.contains(&s.context)));
        assert!(held.iter().any(|s| !FIT_LAYOUTS.contains(&s.layout)));
        assert!(fitted.iter().all(|s| !HELDOUT_LAYOUTS.contains(&s.layout)));
        // Every shape once, and the same list every time.
        let mut keys: Vec<String> = all.iter().map(ToString::to_string).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), all.len());
        assert_eq!(shapes(), all);
        assert!(all.iter().all(|s| fits(&s.layout, s.seqs)));
        assert_eq!(all[0].to_string(), "h32kv8d128.s1.c1024");
    }

    #[test]
    fn each_part_is_scored_on_its_own_shapes() {
        let t = |part, v1_s, v2_s, auto_is_v2| Timed { part, v1_s, v2_s, auto_is_v2 };
        let timed = [
            // Fitted: both right.
            t(Part::Fitted, 1.0, 2.0, false),
            t(Part::Fitted, 3.0, 1.5, true),
            // Held out: one right, one wrong by 2.5x (v2 ran, v1 was faster), one tie (v1 right).
            t(Part::HeldOut, 1.0, 1.2, false),
            t(Part::HeldOut, 2.0, 5.0, true),
            t(Part::HeldOut, 1.0, 1.0, false),
        ];
        let held = score(&timed, Some(Part::HeldOut));
        assert_eq!((held.cases, held.worst_over_best), (3, 2.5));
        assert!((held.picked_faster - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(
            score(&timed, Some(Part::Fitted)),
            Score { cases: 2, picked_faster: 1.0, worst_over_best: 1.0 }
        );
        let whole = score(&timed, None);
        assert_eq!((whole.cases, whole.picked_faster, whole.worst_over_best), (5, 0.8, 2.5));
        assert_eq!(
            score(&[], Some(Part::HeldOut)),
            Score { cases: 0, picked_faster: 0.0, worst_over_best: 1.0 }
        );

        let figures = figures(&timed);
        let get = |k: &str| figures.iter().find(|(n, _)| n == k).map(|x| x.1.clone());
        assert_eq!(get("cuda.sweep.cases"), Some(5.into()));
        assert_eq!(get("cuda.sweep.auto_worst_over_best"), Some(2.5.into()));
        assert_eq!(get("cuda.sweep.fitted_auto_picked_faster"), Some(1.0.into()));
        assert_eq!(get("cuda.sweep.heldout_cases"), Some(3.into()));
        assert_eq!(get("cuda.sweep.heldout_auto_worst_over_best"), Some(2.5.into()));
    }
}
