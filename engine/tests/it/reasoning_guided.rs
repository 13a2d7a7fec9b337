//! Structured outputs after a reasoning span (`Constraint::AfterReasoning`) on the real SmolLM2,
//! whose tokenizer splits `<think>` and `</think>` into several tokens: scripted texts show the
//! span free (any text, JSON-like junk included) and the answer after it constrained, with or
//! without whitespace, under both span kinds; a greedy run inside an opened span samples exactly
//! the unconstrained tokens (but never the end of sequence before an answer), and an answer that skips an optional span is constrained at once.

use engine::structured::{Grammars, TextState};
use engine::{
    ChatMessage, Constraint, ConstraintError, Engine, EngineConfig, KvCacheSize, Prompt, ReasoningSpan,
    SamplingParams,
};
use serde_json::json;

fn engine() -> Engine {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(64),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    Engine::new(&gguf, config).unwrap_or_else(|e| panic!("{e}"))
}

fn grammars(engine: &Engine) -> Grammars {
    Grammars::new(engine.tokenizer(), engine.model_config().vocab_size, engine.eos_token_ids())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `answer` after a `<think>…</think>` span: opened (DeepSeek-R1's) or optional (Qwen3's).
fn after_think(opened: bool, answer: Constraint) -> Constraint {
    let reasoning = ReasoningSpan { start: "<think>".into(), end: "</think>".into(), opened };
    Constraint::AfterReasoning { reasoning, answer: Box::new(answer) }
}

fn small_object() -> Constraint {
    Constraint::JsonSchema(json!({
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Lima"]}},
        "required": ["city"],
        "additionalProperties": false
    }))
}

#[test]
fn the_span_is_free_text_and_only_the_answer_after_it_is_constrained() {
    let engine = engine();
    let g = grammars(&engine);
    let opened = after_think(true, small_object());
    let optional = after_think(false, Constraint::Choice(vec!["yes".into(), "no".into()]));
    use TextState::{Complete, Invalid, Prefix};
    for (constraint, text, want) in [
        // Opened: reasoning from the first token, until the first closing tag.
        (&opened, "", Prefix),
        (&opened, "Let me think about {\"city\": 7", Prefix),
        (&opened, "Paris, surely.</think>\n\n{\"city\": \"Paris\"}", Complete),
        (&opened, "<think>A tag the model wrote itself.</think>{\"city\": \"Lima\"}", Complete),
        (&opened, "Hmm.</think> {\"city\": \"Pa", Prefix),
        (&opened, "Hmm.</think>\n\n{\"city\": \"Rome\"}", Invalid),
        (&opened, "Hmm.</think>\n\nParis", Invalid),
        (&opened, "Hmm.</think>{\"city\": \"Lima\"}</think>", Invalid),
        // Optional: only an answer that opens with `<think>` reasons.
        (&optional, "yes", Complete),
        (&optional, "<think>yes or no? maybe", Prefix),
        (&optional, "<think>yes or no? no.</think>\n\nno", Complete),
        (&optional, "<think>x</think>maybe", Invalid),
        (&optional, "maybe", Invalid),
        (&optional, "I think</think>no", Invalid),
    ] {
        assert_eq!(g.text_state(constraint, text), Ok(want), "{constraint:?} {text:?}");
    }
    // A span around a span, or one with no tags, is a constraint error, not a grammar.
    let nested = after_think(true, after_think(false, Constraint::JsonObject));
    let untagged = Constraint::AfterReasoning {
        reasoning: ReasoningSpan { start: String::new(), end: String::new(), opened: true },
        answer: Box::new(Constraint::JsonObject),
    };
    for bad in [nested, untagged] {
        assert!(
            matches!(g.check(&bad), Err(ConstraintError::Invalid { kind: "json_object", .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn an_opened_span_samples_what_an_unconstrained_run_samples() {
    let mut engine = engine();
    let eos = engine.eos_token_ids().to_vec();
    let prompt =
        || vec![Prompt::Chat(vec![ChatMessage::new("user", "Which city is the capital of France?")])];
    let mut run = |constraint: Option<Constraint>| {
        let params = SamplingParams { constraint, ..SamplingParams::greedy(12) };
        let out = engine.generate(prompt(), &params).unwrap_or_else(|e| panic!("{e}"));
        out.into_iter().next().and_then(Result::ok).map(|o| o.completions[0].clone()).expect("a completion")
    };
    let free = run(None);
    assert!(!free.text.contains("</think>"), "{:?}", free.text);
    let reasoning = run(Some(after_think(true, small_object())));
    // The same tokens, except that the span never ends the sequence (the end-of-sequence id
    // comes only after a whole answer): where the free run stopped, the reasoning goes on.
    let free_text = free.token_ids.iter().take_while(|t| !eos.contains(t)).count();
    assert!(free_text < free.token_ids.len(), "the free run stops early here: {:?}", free.text);
    assert_eq!(reasoning.token_ids[..free_text], free.token_ids[..free_text], "{:?}", reasoning.text);
    assert_eq!(reasoning.token_ids.len(), 12, "{:?}", reasoning.text);
    assert!(!reasoning.token_ids.iter().any(|t| eos.contains(t)));
    // Constrained from the first token, the same request answers in the schema at once.
    let answer = run(Some(small_object()));
    assert_ne!(answer.token_ids, free.token_ids);
    let doc: serde_json::Value =
        serde_json::from_str(&answer.text).unwrap_or_else(|e| panic!("{e}: {}", answer.text));
    assert!(["Paris", "Lima"].contains(&doc["city"].as_str().unwrap_or("")), "{doc}");
}

#[test]
fn an_answer_that_skips_an_optional_span_is_constrained_at_once() {
    let mut engine = engine();
    let choices = vec!["positive".to_owned(), "negative".to_owned()];
    let constraint = after_think(false, Constraint::Choice(choices.clone()));
    let params = SamplingParams { constraint: Some(constraint.clone()), ..SamplingParams::greedy(24) };
    let prompt = vec![Prompt::Chat(vec![ChatMessage::new("user", "Sentiment of 'I love this movie'?")])];
    let out = engine.generate(prompt, &params).unwrap_or_else(|e| panic!("{e}"));
    let c = &out[0].as_ref().unwrap_or_else(|e| panic!("{e}")).completions[0];
    assert!(choices.contains(&c.text), "{:?}", c.text);
    assert_eq!(grammars(&engine).text_state(&constraint, &c.text), Ok(TextState::Complete));
}
