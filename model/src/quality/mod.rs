//! Faithfulness measured as the field measures it (llama.cpp's `llama-perplexity`): perplexity
//! over a text in windows, and, against a reference run saved to a file, the KL divergence of
//! every scored position's next-token distribution, how often the most likely token is the
//! same, and the RMS of the change in the probability of the text's own next token.
//!
//! - `windows.rs` — [`WindowPlan`]: which tokens each window holds and which of its rows are
//!   scored (the second half, as llama-perplexity scores them); [`Scorer`]: one window through
//!   the model's forward pass into the log-probabilities of its scored rows.
//! - `evaluate.rs` — [`evaluate`]: a run over every window, its rows counted, saved to a
//!   reference file and compared with one as asked; [`pydoc_topics`], the default text
//!   (CPython's reference-manual topics, from this machine's python3).
//! - `stats.rs` — [`RowComparison`] of one row against the reference's, and [`Tally`]: the
//!   perplexity with its ±, and the KL statistics over every row.
//! - `file.rs` — the reference file ([`ReferenceWriter`], [`ReferenceReader`]): the windows'
//!   tokens and, per scored row, the log-probability of the text's next token and the
//!   reference's [`TOP_K`] most likely tokens with theirs.
//! - `evaluated.rs` — [`EvaluatedReader`]: another implementation's rows over a reference's
//!   windows (llama.cpp's, from the script beside the peer bench), only what a comparison needs.
//!
//! The KL divergence from a top-k reference groups the rest of the vocabulary into one outcome:
//! a lower bound of the full divergence (grouping outcomes never increases it), tight when the
//! top k hold nearly all the mass.

mod evaluate;
mod evaluated;
mod file;
mod stats;
mod windows;

pub use evaluate::{Corpus, Evaluation, evaluate, pydoc_topics};
pub use evaluated::{EvaluatedReader, EvaluatedRow, compare_evaluated, evaluated_header};
pub use file::{ReferenceHeader, ReferenceReader, ReferenceWriter, TOP_K};
pub use stats::{QualityReport, RowComparison, Tally, argmax, top_k};
pub use windows::{Scorer, WindowPlan};

/// Why a quality measurement cannot run.
#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    #[error("the text has {tokens} tokens, fewer than one window of {ctx}")]
    TextTooShort { tokens: usize, ctx: usize },
    #[error("bad window plan: {0}")]
    BadPlan(String),
    #[error("{path}: {reason}")]
    BadReference { path: String, reason: String },
    #[error("the reference does not match this run: {0}")]
    Mismatch(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Model(#[from] crate::ModelError),
}
