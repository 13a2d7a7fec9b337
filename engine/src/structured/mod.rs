//! Structured outputs: a request's [`Constraint`] (a JSON schema, any JSON object, a regular
//! expression, a list of choices or a Lark grammar) compiled by `llguidance` into a per-sample
//! [`Guide`], whose token mask is laid over the logits before any sampling rule.
//!
//! A constraint after a [`ReasoningSpan`] is one grammar: the span as a lazy lexeme ending at
//! its closing tag, then the answer's grammar as a nested one, so the reasoning is free text and
//! a closing tag split across tokens (or sharing a token with the answer) is read as text.
//!
//! - `vocab.rs` — the model's vocabulary as llguidance's token trie.
//! - `compile.rs` — [`Grammars`]: the parser factory with its limits set explicitly, and the
//!   compilation of a constraint (bounded in size, fuel and lexer states; a failure is a
//!   [`ConstraintError`] naming the problem). It runs on the submitting thread, never the
//!   engine's. [`Grammars::text_state`]: whether a text is a whole allowed output, the start of
//!   one, or neither (what a client checks of an output cut short).
//! - `guide.rs` — [`Guide`]: one sample's matcher: the mask for its next token, advanced by
//!   each sampled token, forked for each of a request's `n` samples.
//! - `overlap.rs` — each step's masks computed while its forward pass runs, as jobs of the
//!   forward's own rayon pool (the engine picks the guides, and feeds them the sampled tokens
//!   in parallel after). Sampling applies the masks (and computes any that is missing).
//!   [`MaskTimes`]: the masks' time and the time steps spent on guides outside their forward
//!   pass (engine metrics).
//!
//! Invariants: a guided sample only ever samples a token its grammar allows; the end-of-sequence
//! ids are allowed only where the grammar may end; when the grammar can take nothing more, the
//! sample finishes (`FinishReason::GrammarEnd`).

mod compile;
mod guide;
mod overlap;
mod vocab;

use serde::{Deserialize, Serialize};

pub use compile::{Grammars, MAX_CONSTRAINT_BYTES, TextState};
pub use guide::Guide;
pub(crate) use guide::{Advance, advance};
pub use overlap::MaskTimes;
pub(crate) use overlap::while_running;

/// What a request's output must match (OpenAI's `response_format`, vLLM's `guided_*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON document valid under this JSON Schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression in full.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A context-free grammar in llguidance's Lark syntax.
    Lark(String),
    /// `answer` after a reasoning span the grammar leaves free (vLLM's reasoning parsers with
    /// structured outputs: only what follows the reasoning is constrained).
    AfterReasoning { reasoning: ReasoningSpan, answer: Box<Constraint> },
}

/// The reasoning span a model may write ahead of its constrained answer: any text from `start`
/// to the first `end`, then (after optional whitespace) the answer. The end of sequence stays
/// banned inside the span, as everywhere before a whole answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasoningSpan {
    pub start: String,
    pub end: String,
    /// The answer reasons from its first token (the chat template opened the span, as
    /// DeepSeek-R1's; a `start` the model writes itself is reasoning text). Otherwise only an
    /// answer that opens with `start` reasons (Qwen3's, where thinking can be switched off).
    pub opened: bool,
}

impl Constraint {
    /// The constraint's kind, as a request names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonObject => "json_object",
            Self::JsonSchema(_) => "json_schema",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Lark(_) => "grammar",
            Self::AfterReasoning { answer, .. } => answer.kind(),
        }
    }
}

/// Why a constraint cannot guide a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The constraint itself: it does not compile, or it exceeds a limit.
    #[error("invalid {kind}: {reason}")]
    Invalid { kind: &'static str, reason: String },
    /// This model's vocabulary cannot be constrained (no end-of-sequence id, unreadable
    /// tokenizer).
    #[error("structured outputs are unavailable for this model: {0}")]
    Unavailable(String),
}
