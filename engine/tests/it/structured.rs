//! Structured outputs on the real SmolLM2 (the Q4_1 GGUF): a JSON schema's output parses and
//! validates (each token's mask prepared beside the forward pass), a choice is one of the
//! choices, a regex matches, a bad schema is refused at admission, `logit_bias` bans and forces
//! tokens, `max_tokens` mid-grammar is `length` with the start of a valid document (and
//! `Grammars::text_state` tells whole outputs, their starts and strays apart), parallel samples each follow the grammar, and
//! greedy constrained outputs survive preemption unchanged.

use engine::structured::{Grammars, TextState};
use engine::{
    ChatMessage, Completion, Constraint, Engine, EngineConfig, FinishReason, KvCacheSize, PreemptionMode,
    Prompt, RequestError, SamplingParams,
};
use serde_json::{Value, json};

fn engine(blocks: usize, mode: PreemptionMode) -> Engine {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(blocks),
        log_interval: std::time::Duration::ZERO,
        preemption_mode: mode,
        swap_space_bytes: 64 << 20,
        ..EngineConfig::default()
    };
    Engine::new(&gguf, config).unwrap_or_else(|e| panic!("{e}"))
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::new("user", text)])
}

fn run(engine: &mut Engine, prompts: Vec<Prompt>, params: &SamplingParams) -> Vec<Vec<Completion>> {
    let outs = engine.generate(prompts, params).unwrap_or_else(|e| panic!("{e}"));
    assert!(engine.kv_is_idle());
    outs.into_iter().map(|o| o.unwrap_or_else(|e| panic!("{e}")).completions).collect()
}

fn guided(constraint: Constraint, max_tokens: usize) -> SamplingParams {
    SamplingParams { constraint: Some(constraint), ..SamplingParams::greedy(max_tokens) }
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "Tokyo", "Lima"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "city", "tags"],
        "additionalProperties": false
    })
}

/// The schema's rules, checked by hand on a parsed document.
fn check_person(v: &Value) {
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 4, "{v}");
    assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 20), "{v}");
    assert!(o["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)), "{v}");
    assert!(["Paris", "Tokyo", "Lima"].contains(&o["city"].as_str().unwrap_or("")), "{v}");
    let tags = o["tags"].as_array().unwrap_or_else(|| panic!("tags: {v}"));
    assert!((1..=3).contains(&tags.len()), "{v}");
    assert!(tags.iter().all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 10)), "{v}");
}

#[test]
fn a_json_schema_output_parses_and_validates() {
    let mut engine = engine(64, PreemptionMode::Recompute);
    let params = guided(Constraint::JsonSchema(person_schema()), 120);
    let outs = run(&mut engine, vec![chat("Describe a person as JSON.")], &params);
    let c = &outs[0][0];
    assert_eq!(c.finish_reason.as_ref().map(FinishReason::as_str), Some("stop"), "{c:?}");
    let v: Value = serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {:?}", c.text));
    check_person(&v);
    // Each token's mask was prepared beside the forward pass that computed its logits.
    let masks = engine.metrics().guided_masks;
    let tokens = c.token_ids.len() as u64;
    assert_eq!((masks.masks, masks.steps), (tokens, tokens), "{masks:?}");
    assert!(masks.compute_s > 0.0 && masks.wait_s >= 0.0, "{masks:?}");
    // Any JSON object, sampled hot, three samples each following the grammar on its own.
    let params = SamplingParams {
        n: 3,
        temperature: 1.0,
        top_p: 0.9,
        seed: Some(5),
        constraint: Some(Constraint::JsonObject),
        max_tokens: Some(200),
        ..SamplingParams::default()
    };
    for c in &run(&mut engine, vec![chat("Give me a JSON object.")], &params)[0] {
        if c.finish_reason != Some(FinishReason::Length) {
            let v: Value = serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {:?}", c.text));
            assert!(v.is_object(), "{v}");
        } else {
            assert!(c.text.starts_with('{'), "{:?}", c.text);
        }
    }
}

#[test]
fn choices_regexes_and_grammars_are_followed() {
    let mut engine = engine(64, PreemptionMode::Recompute);
    let choices = vec!["positive".to_owned(), "negative".to_owned(), "neutral".to_owned()];
    let params = guided(Constraint::Choice(choices.clone()), 10);
    let c = &run(&mut engine, vec![chat("Sentiment of 'I love this movie'?")], &params)[0][0];
    assert!(choices.contains(&c.text), "{:?}", c.text);
    assert_eq!(c.finish_reason.as_ref().map(FinishReason::as_str), Some("stop"));

    let params = guided(Constraint::Regex(r"[0-9]{3}-[0-9]{4}".into()), 20);
    let c = &run(&mut engine, vec![chat("Give me a phone number.")], &params)[0][0];
    let b = c.text.as_bytes();
    assert!(
        b.len() == 8 && b[3] == b'-' && b.iter().enumerate().all(|(i, x)| i == 3 || x.is_ascii_digit()),
        "{:?}",
        c.text
    );

    let lark = r#"start: "The answer is " ANSWER "."
ANSWER: /(yes|no)/"#;
    let params = guided(Constraint::Lark(lark.into()), 20);
    let c = &run(&mut engine, vec![chat("Is the sky blue?")], &params)[0][0];
    assert!(["The answer is yes.", "The answer is no."].contains(&c.text.as_str()), "{:?}", c.text);
}

#[test]
fn max_tokens_mid_grammar_finishes_with_length() {
    let mut engine = engine(64, PreemptionMode::Recompute);
    let params = guided(Constraint::JsonSchema(person_schema()), 4);
    let c = &run(&mut engine, vec![chat("Describe a person as JSON.")], &params)[0][0];
    assert_eq!(c.finish_reason, Some(FinishReason::Length));
    assert_eq!(c.token_ids.len(), 4);
    let schema = Constraint::JsonSchema(person_schema());
    assert_eq!(grammars(&engine).text_state(&schema, &c.text), Ok(TextState::Prefix), "{:?}", c.text);
}

fn grammars(engine: &Engine) -> Grammars {
    Grammars::new(engine.tokenizer(), engine.model_config().vocab_size, engine.eos_token_ids())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What the server's tests check of outputs cut short: whole outputs, starts of one, and texts
/// no output starts with, each whichever way the tokenizer splits them.
#[test]
fn text_state_tells_whole_outputs_from_their_starts_and_from_strays() {
    let engine = engine(8, PreemptionMode::Recompute);
    let g = grammars(&engine);
    let schema = Constraint::JsonSchema(person_schema());
    let object = Constraint::JsonObject;
    for (constraint, text, want) in [
        (&object, "{\"a\": 1}", TextState::Complete),
        (&object, "{\"a\": [1, 2", TextState::Prefix),
        (&object, "", TextState::Prefix),
        (&object, "[1]", TextState::Invalid),
        (&object, "{\"a\" 1}", TextState::Invalid),
        (&object, "{\"a\": 1}}", TextState::Invalid),
        (&schema, "{\"name\": \"Ana", TextState::Prefix),
        (&schema, "{\"nickname\"", TextState::Invalid),
        (&Constraint::Choice(vec!["yes".into(), "no".into()]), "ye", TextState::Prefix),
        (&Constraint::Choice(vec!["yes".into(), "no".into()]), "no", TextState::Complete),
        (&Constraint::Choice(vec!["yes".into(), "no".into()]), "nope", TextState::Invalid),
    ] {
        assert_eq!(g.text_state(constraint, text), Ok(want), "{constraint:?} {text:?}");
    }
}

#[test]
fn constraints_that_do_not_compile_are_refused_at_admission() {
    let mut engine = engine(64, PreemptionMode::Recompute);
    for constraint in [
        Constraint::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}})),
        Constraint::JsonSchema(json!(42)),
        Constraint::Regex("(unclosed".into()),
        Constraint::Choice(vec![]),
        Constraint::Lark("start: undefined_rule".into()),
        Constraint::Lark("root ::= \"yes\"".into()),
        Constraint::Regex("a".repeat(engine::structured::MAX_CONSTRAINT_BYTES + 1)),
    ] {
        let params = guided(constraint.clone(), 8);
        match engine.add_request("bad", chat("hi"), params) {
            Err(RequestError::Constraint { source, .. }) => {
                assert!(source.to_string().starts_with("invalid "), "{constraint:?}: {source}");
            }
            other => panic!("{constraint:?} was not refused: {other:?}"),
        }
    }
    assert_eq!(engine.num_unfinished(), 0);
    assert!(engine.kv_is_idle());
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let mut engine = engine(64, PreemptionMode::Recompute);
    let plain = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let first = run(&mut engine, vec![chat("Say hello.")], &plain)[0][0].token_ids.clone();
    let banned = first[0];
    let mut params = plain.clone();
    params.logit_bias.insert(banned, -100.0);
    let got = run(&mut engine, vec![chat("Say hello.")], &params)[0][0].token_ids.clone();
    assert!(!got.contains(&banned), "{banned} in {got:?}");

    let forced = engine.tokenizer().token_to_id("banana").unwrap_or(1000);
    let mut params = SamplingParams { temperature: 0.8, seed: Some(1), ..plain.clone() };
    params.logit_bias.insert(forced, 100.0);
    let got = run(&mut engine, vec![chat("Say hello.")], &params)[0][0].token_ids.clone();
    assert!(got.iter().all(|&t| t == forced), "{got:?}");

    // Out of the vocabulary or out of range: refused, nothing kept.
    let mut params = plain.clone();
    params.logit_bias.insert(u32::MAX, 1.0);
    assert!(matches!(
        engine.add_request("oov", chat("x"), params),
        Err(RequestError::LogitBiasOutOfVocab { .. })
    ));
    let mut params = plain;
    params.logit_bias.insert(5, 101.0);
    assert!(matches!(
        engine.add_request("range", chat("x"), params),
        Err(RequestError::InvalidParams { .. })
    ));
    assert!(engine.kv_is_idle());
}

/// A pool too small for the batch preempts (recompute and swap); each greedy constrained output is
/// the one it is alone, and valid.
#[test]
fn greedy_constrained_outputs_survive_preemption() {
    let prompts: Vec<Prompt> = ["Alice", "Bob", "Carol", "Dave"]
        .iter()
        .map(|n| chat(&format!("Describe {n} as JSON with a name, an age, a city and tags.")))
        .collect();
    let params = guided(Constraint::JsonSchema(person_schema()), 90);
    let mut roomy = engine(128, PreemptionMode::Recompute);
    let alone: Vec<Vec<u32>> =
        prompts.iter().map(|p| run(&mut roomy, vec![p.clone()], &params)[0][0].token_ids.clone()).collect();
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let mut tight = engine(14, mode);
        let outs = run(&mut tight, prompts.clone(), &params);
        assert!(tight.metrics().gauges.num_preemptions > 0, "{mode:?}: the pool should force preemption");
        for (c, want) in outs.iter().map(|o| &o[0]).zip(&alone) {
            assert_eq!(&c.token_ids, want, "{mode:?}");
            if c.finish_reason != Some(FinishReason::Length) {
                check_person(&serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {:?}", c.text)));
            }
        }
    }
}
