//! [`evaluate`]: a run over a plan's windows — each window through the forward pass, every
//! scored row counted into a [`Tally`], written to a reference file and compared with a
//! reference's row where the caller asks — and [`pydoc_topics`], the default text.

use std::path::Path;

use kv_cache::DType;

use super::{
    QualityError, ReferenceReader, ReferenceWriter, RowComparison, Scorer, Tally, WindowPlan, top_k,
};
use crate::Model;

/// Called after each window with its index and the tally so far.
pub type Progress<'a> = &'a mut dyn FnMut(usize, &Tally);

/// What [`evaluate`] does with each row besides counting the perplexity.
#[derive(Default)]
pub struct Evaluation<'a> {
    /// Write every row's top tokens here (the writer made over the same plan and tokens).
    pub save: Option<&'a mut ReferenceWriter>,
    /// Compare every row with this reference's (its rows read in order).
    pub reference: Option<&'a mut ReferenceReader>,
    /// Called after each window.
    pub progress: Option<Progress<'a>>,
}

impl std::fmt::Debug for Evaluation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluation")
            .field("save", &self.save.is_some())
            .field("reference", &self.reference.is_some())
            .finish()
    }
}

/// Runs `model` over the windows of `tokens` (laid out by `plan`, window after window) with a KV
/// cache of `dtype`.
pub fn evaluate(
    model: &Model,
    plan: &WindowPlan,
    tokens: &[u32],
    dtype: DType,
    mut ev: Evaluation<'_>,
) -> Result<Tally, QualityError> {
    if tokens.len() != plan.windows * plan.ctx {
        return Err(QualityError::BadPlan(format!(
            "{} tokens for {} windows of {}",
            tokens.len(),
            plan.windows,
            plan.ctx
        )));
    }
    let vocab = model.config.vocab_size;
    let first = plan.first_scored();
    let k = super::TOP_K.min(vocab);
    let mut scorer = Scorer::new(model, plan.ctx, dtype)?;
    let (mut tally, mut rows, mut top) = (Tally::default(), Vec::new(), Vec::new());
    for (w, window) in tokens.chunks_exact(plan.ctx).enumerate() {
        scorer.log_probs(window, first..plan.ctx - 1, &mut rows)?;
        for (j, row) in rows.chunks_exact(vocab).enumerate() {
            let next = window[first + j + 1];
            tally.add(row[next as usize]);
            if let Some(out) = ev.save.as_deref_mut() {
                out.write_row(row[next as usize], &top_k(row, k))?;
            }
            if let Some(r) = ev.reference.as_deref_mut() {
                let reference_next = r.read_row(&mut top)?;
                tally.add_comparison(RowComparison::new(row, &top, reference_next, next), reference_next);
            }
        }
        if let Some(progress) = ev.progress.as_deref_mut() {
            progress(w, &tally);
        }
    }
    Ok(tally)
}

/// A text and a line saying where it came from.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub text: String,
    pub about: String,
}

/// CPython's reference-manual topics (`pydoc_data.topics`, under the Python Software Foundation
/// License), every topic in name order joined by a blank line, as this machine's `python3` has
/// them; cached in `cache_dir` by Python version.
pub fn pydoc_topics(cache_dir: &Path) -> Result<Corpus, QualityError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| QualityError::Io { path: path.clone(), source }
    };
    let python = |script: &str| std::process::Command::new("python3").args(["-c", script]).output();
    let version = python("import sys; print(sys.version.split()[0])").map_err(io(Path::new("python3")))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    if version.is_empty() {
        return Err(QualityError::BadPlan("the default text needs python3 (or give a text file)".into()));
    }
    let cache = cache_dir.join(format!("pydoc-topics-{version}.txt"));
    if !cache.exists() {
        let out = python("import sys, pydoc_data.topics as t\nsys.stdout.write('\\n\\n'.join(t.topics[k] for k in sorted(t.topics)))")
            .map_err(io(Path::new("python3")))?;
        if !out.status.success() {
            return Err(QualityError::BadPlan(format!(
                "python3 could not print pydoc_data's topics: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        std::fs::create_dir_all(cache_dir).map_err(io(cache_dir))?;
        // Whole or not at all: a run stopped half-way leaves no half text behind.
        let partial = cache.with_extension("partial");
        std::fs::write(&partial, &out.stdout).map_err(io(&partial))?;
        std::fs::rename(&partial, &cache).map_err(io(&cache))?;
    }
    let text = std::fs::read_to_string(&cache).map_err(io(&cache))?;
    Ok(Corpus { text, about: format!("CPython {version} reference-manual topics (pydoc_data, PSF license)") })
}
