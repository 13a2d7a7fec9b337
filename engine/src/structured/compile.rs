//! [`Grammars`]: llguidance's parser factory over the model's vocabulary, with every limit set
//! explicitly, and the compilation of one [`Constraint`] into a fresh [`Guide`]. Hostile input
//! is bounded three ways: its size ([`MAX_CONSTRAINT_BYTES`]), the grammar's size and the lexer's
//! fuel and states (`ParserLimits`), and the first mask, computed here under the same limits so
//! that a grammar too costly to step is refused before it reaches the engine.

use std::time::Instant;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};

use super::guide::Guide;
use super::vocab::token_env;
use super::{Constraint, ConstraintError, ReasoningSpan};

/// Largest constraint text accepted (a schema as JSON, a regex, a grammar, all choices).
pub const MAX_CONSTRAINT_BYTES: usize = 256 * 1024;

/// Most choices of a `choice` constraint.
const MAX_CHOICES: usize = 4096;

/// The limits every compiled grammar runs under (llguidance's defaults, tightened where a
/// server must answer many clients: fewer lexer states, a smaller grammar, terse errors).
fn parser_limits() -> ParserLimits {
    ParserLimits {
        // Earley items of one row; a grammar ambiguous past this fails its step.
        max_items_in_row: 2_000,
        // Building the lexer's initial regexes (~50k per ms).
        initial_lexer_fuel: 1_000_000,
        // Lexer work of one token mask (~14k per ms).
        step_lexer_fuel: 200_000,
        // Earley items created for one token mask (~20k per ms).
        step_max_items: 50_000,
        // Lexer states (1-2 kB each): bounds a grammar's memory.
        max_lexer_states: 100_000,
        // Symbols in the grammar's productions.
        max_grammar_size: 200_000,
        precompute_large_lexemes: true,
        // Errors name the problem without echoing the grammar and the tokens back.
        verbose_errors: false,
    }
}

/// How guided JSON is written: one space after `,` and `:` (as Python's `json.dumps`), no other
/// whitespace, so a model cannot wander off into blank lines before the document closes.
fn json_options() -> serde_json::Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// Where a text stands under a constraint ([`Grammars::text_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextState {
    /// A whole output the constraint allows (it may allow more after it).
    Complete,
    /// The start of an allowed output, not yet a whole one.
    Prefix,
    /// No allowed output starts with it.
    Invalid,
}

/// The compiler of constraints for one model (`Send + Sync`: shared by every submitting thread).
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab_size", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Grammars {
    /// The factory over `tokenizer`'s vocabulary padded to `model_vocab` ids, ending sequences
    /// with `eos_ids`.
    pub fn new(
        tokenizer: &model::Tokenizer,
        model_vocab: usize,
        eos_ids: &[u32],
    ) -> Result<Self, ConstraintError> {
        let env = token_env(tokenizer, model_vocab, eos_ids)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Unavailable(format!("grammar engine: {e}")))?;
        factory.quiet();
        *factory.limits_mut() = parser_limits();
        Ok(Self { factory })
    }

    /// Compiles `constraint` into the guide of a request's first sample (fork it for the others).
    pub(crate) fn compile(&self, constraint: &Constraint) -> Result<Guide, ConstraintError> {
        let start = Instant::now();
        let matcher = self.matcher(constraint)?;
        tracing::debug!(target: "engine", "compiled a {} constraint in {:?}", constraint.kind(), start.elapsed());
        Ok(Guide::new(matcher, self.factory.tok_env().tok_trie().eos_token_set()))
    }

    /// A fresh matcher of `constraint`, its first mask computed under the step limits (a grammar
    /// too costly to step is refused here).
    fn matcher(&self, constraint: &Constraint) -> Result<Matcher, ConstraintError> {
        let kind = constraint.kind();
        let invalid = |reason: String| ConstraintError::Invalid { kind, reason };
        let grammar = grammar_of(constraint).map_err(invalid)?;
        let parser = self.factory.create_parser(grammar).map_err(|e| invalid(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        matcher.compute_mask().map_err(|e| invalid(e.to_string()))?;
        Ok(matcher)
    }

    /// Checks that `constraint` compiles (what a front end calls to answer 400 early).
    pub fn check(&self, constraint: &Constraint) -> Result<(), ConstraintError> {
        self.compile(constraint).map(drop)
    }

    /// Where `text` stands under `constraint`: a whole output it allows, the start of one (an
    /// output cut short by `max_tokens` must be), or neither. The text is read through the
    /// model's tokenizer; the grammar reads bytes, so any split of the same text answers alike.
    pub fn text_state(&self, constraint: &Constraint, text: &str) -> Result<TextState, ConstraintError> {
        let mut matcher = self.matcher(constraint)?;
        let tokens = self.factory.tok_env().tokenize_bytes(text.as_bytes());
        let invalid = |reason: String| ConstraintError::Invalid { kind: constraint.kind(), reason };
        if matcher.validate_tokens(&tokens).map_err(|e| invalid(e.to_string()))? < tokens.len() {
            return Ok(TextState::Invalid);
        }
        matcher.consume_tokens(&tokens).map_err(|e| invalid(e.to_string()))?;
        let complete = matcher.is_accepting().map_err(|e| invalid(e.to_string()))?;
        Ok(if complete { TextState::Complete } else { TextState::Prefix })
    }
}

/// The name the answer's grammar goes by under a reasoning span.
const ANSWER_GRAMMAR: &str = "answer_after_reasoning";

/// The grammar of `answer` after `reasoning`: the span is one lazy lexeme ending at the first
/// closing tag (any text before it, the tag itself included), optional whitespace after it,
/// then the answer's grammar nested by name.
fn after_reasoning(reasoning: &ReasoningSpan, answer: &Constraint) -> Result<TopLevelGrammar, String> {
    if matches!(answer, Constraint::AfterReasoning { .. }) {
        return Err("a reasoning span around another".into());
    }
    if reasoning.start.is_empty() || reasoning.end.is_empty() {
        return Err("a reasoning span's tags are empty".into());
    }
    // Lark string literals are JSON strings.
    let literal = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let (start, end) = (literal(&reasoning.start), literal(&reasoning.end));
    let head = if reasoning.opened { "span".to_owned() } else { format!("({start} span)?") };
    let lark = format!(
        "start: {head} @{ANSWER_GRAMMAR}\n\
         span: thought AFTER_THOUGHT?\n\
         thought[suffix={end}]: /(?s:.*)/\n\
         AFTER_THOUGHT: /[ \\t\\r\\n]+/\n"
    );
    let mut top = TopLevelGrammar::from_lark(lark);
    let mut inner = grammar_of(answer)?;
    let [grammar] = inner.grammars.as_mut_slice() else {
        return Err("the answer's grammar is not one grammar".into());
    };
    grammar.name = Some(ANSWER_GRAMMAR.into());
    top.grammars.append(&mut inner.grammars);
    Ok(top)
}

/// The llguidance grammar of a constraint, or why there is none.
fn grammar_of(constraint: &Constraint) -> Result<TopLevelGrammar, String> {
    let too_big = |n: usize| format!("{n} bytes is more than the {MAX_CONSTRAINT_BYTES} accepted");
    let bounded =
        |text: &str| if text.len() > MAX_CONSTRAINT_BYTES { Err(too_big(text.len())) } else { Ok(()) };
    Ok(match constraint {
        Constraint::JsonObject => {
            let mut schema = serde_json::json!({"type": "object"});
            schema["x-guidance"] = json_options();
            TopLevelGrammar::from_json_schema(schema)
        }
        Constraint::JsonSchema(schema) => {
            let len = serde_json::to_string(schema).map_err(|e| e.to_string())?.len();
            if len > MAX_CONSTRAINT_BYTES {
                return Err(too_big(len));
            }
            let mut schema = schema.clone();
            match &mut schema {
                serde_json::Value::Object(map) => {
                    map.entry("x-guidance").or_insert_with(json_options);
                }
                serde_json::Value::Bool(_) => {}
                _ => return Err("a JSON schema must be an object or a boolean".into()),
            }
            TopLevelGrammar::from_json_schema(schema)
        }
        Constraint::Regex(rx) => {
            bounded(rx)?;
            TopLevelGrammar::from_regex(rx)
        }
        Constraint::Choice(choices) => {
            if choices.is_empty() {
                return Err("the list of choices is empty".into());
            }
            if choices.len() > MAX_CHOICES {
                return Err(format!("{} choices is more than the {MAX_CHOICES} accepted", choices.len()));
            }
            if choices.iter().any(String::is_empty) {
                return Err("a choice is the empty string".into());
            }
            // Lark string literals are JSON strings.
            let alternatives: Vec<String> =
                choices.iter().map(|c| serde_json::to_string(c).unwrap_or_default()).collect();
            let lark = format!("start: {}", alternatives.join(" | "));
            bounded(&lark)?;
            TopLevelGrammar::from_lark(lark)
        }
        Constraint::Lark(lark) => {
            bounded(lark)?;
            if lark.trim().is_empty() {
                return Err("the grammar is empty".into());
            }
            TopLevelGrammar::from_lark(lark.clone())
        }
        Constraint::AfterReasoning { reasoning, answer } => after_reasoning(reasoning, answer)?,
    })
}
