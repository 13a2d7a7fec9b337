//! Request lifecycle: generation, streaming deltas, stop conditions, chat prompts, bad input
//! rejected per request with typed errors, aborts, and no leaked KV block afterwards.

use engine::{ChatMessage, FinalOutput, FinishReason, Prompt, RequestError, SamplingParams};

use crate::support::{Fixture, IM_END, VOCAB, forced, prompt_tokens, small_config};

fn run_to_end(engine: &mut engine::Engine) -> Vec<engine::RequestOutput> {
    let mut all = Vec::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        match engine.step() {
            Ok(outs) => all.extend(outs),
            Err(e) => panic!("step failed: {e}"),
        }
        steps += 1;
        assert!(steps < 10_000, "engine does not make progress");
    }
    all
}

fn finals(outputs: &[engine::RequestOutput]) -> std::collections::BTreeMap<String, FinalOutput> {
    let mut map = std::collections::BTreeMap::new();
    for o in outputs {
        map.entry(o.request_id.clone())
            .or_insert_with(|| FinalOutput::new(o.request_id.clone(), o.prompt_tokens))
            .absorb(o);
    }
    map
}

#[test]
fn generates_max_tokens_with_streamed_deltas() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let params = forced(20);
    engine.add_request("a", "hello world", params).unwrap_or_else(|e| panic!("{e}"));
    let outs = run_to_end(&mut engine);
    // One output per generated token; the last one finishes.
    assert_eq!(outs.len(), 20);
    assert!(outs[..19].iter().all(|o| !o.finished));
    assert!(outs[19].finished);
    let fin = finals(&outs);
    let c = &fin["a"].completions[0];
    assert_eq!(c.token_ids.len(), 20);
    assert_eq!(c.finish_reason, Some(FinishReason::Length));
    assert_eq!(c.text, engine.tokenizer().decode(&c.token_ids, true).unwrap_or_default());
    assert_eq!(outs[19].completion_tokens, 20);
    assert!(outs[19].timing.time_to_first_token.is_some());
    assert!(engine.kv_is_idle());
    let m = engine.metrics();
    assert_eq!((m.requests_finished, m.generation_tokens), (1, 20));
    assert_eq!(m.ttft.count, 1);
    // The prefill step samples the first token; each of the other 19 is a decode-only step,
    // whose sequence holds the prompt and the tokens so far.
    let (d, p) = (m.decode_steps, outs[19].prompt_tokens as u64);
    assert_eq!(d.steps, 19);
    assert_eq!(d.context_tokens, (1..20).map(|i| p + i).sum::<u64>());
    assert!(d.forward_s > 0.0 && d.total_s() >= d.forward_s + d.schedule_s);
}

/// Request id, prompt, parameters, and the error expected.
type BadCase = (&'static str, Prompt, SamplingParams, fn(&RequestError) -> bool);

#[test]
fn bad_input_is_rejected_per_request_and_the_engine_keeps_serving() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let ok = forced(8);
    engine.add_request("good", prompt_tokens(1, 10), ok.clone()).unwrap_or_else(|e| panic!("{e}"));
    let cases: Vec<BadCase> = vec![
        ("empty-text", Prompt::Text(String::new()), ok.clone(), |e| {
            matches!(e, RequestError::EmptyPrompt(_))
        }),
        ("empty-ids", Prompt::Tokens(vec![]), ok.clone(), |e| matches!(e, RequestError::EmptyPrompt(_))),
        ("too-long", Prompt::Tokens(prompt_tokens(2, 500)), SamplingParams::greedy(13), |e| {
            matches!(e, RequestError::TooLong { prompt_len: 500, max_tokens: 13, max_model_len: 512, .. })
        }),
        (
            "prompt-over-len",
            Prompt::Tokens(prompt_tokens(2, 600)),
            SamplingParams { max_tokens: None, ..ok.clone() },
            |e| matches!(e, RequestError::TooLong { .. }),
        ),
        (
            "oov",
            Prompt::Tokens(vec![1, VOCAB as u32, 2]),
            ok.clone(),
            |e| matches!(e, RequestError::TokenOutOfVocab { token, .. } if *token == VOCAB as u32),
        ),
        ("neg-temp", Prompt::Text("x".into()), SamplingParams { temperature: -1.0, ..ok.clone() }, |e| {
            matches!(e, RequestError::InvalidParams { .. })
        }),
        ("nan-temp", Prompt::Text("x".into()), SamplingParams { temperature: f32::NAN, ..ok.clone() }, |e| {
            matches!(e, RequestError::InvalidParams { .. })
        }),
        ("top-p", Prompt::Text("x".into()), SamplingParams { top_p: 0.0, ..ok.clone() }, |e| {
            matches!(e, RequestError::InvalidParams { .. })
        }),
        ("top-k", Prompt::Text("x".into()), SamplingParams { top_k: -5, ..ok.clone() }, |e| {
            matches!(e, RequestError::InvalidParams { .. })
        }),
        ("n0", Prompt::Text("x".into()), SamplingParams { n: 0, ..ok.clone() }, |e| {
            matches!(e, RequestError::InvalidParams { .. })
        }),
        ("n-huge", Prompt::Text("x".into()), SamplingParams { n: 100_000, ..ok.clone() }, |e| {
            matches!(e, RequestError::InvalidParams { .. })
        }),
        ("good", Prompt::Text("x".into()), ok.clone(), |e| matches!(e, RequestError::DuplicateId(_))),
        // Prompt of 3000 tokens cannot fit a 64-block pool even with a larger max len: see below.
    ];
    for (id, prompt, params, expected) in cases {
        match engine.add_request(id, prompt, params) {
            Err(e) => assert!(expected(&e), "{id}: unexpected error {e:?}"),
            Ok(_) => panic!("{id}: accepted"),
        }
    }
    assert!(matches!(engine.abort("nobody"), Err(RequestError::UnknownRequest(_))));
    let outs = run_to_end(&mut engine);
    let fin = finals(&outs);
    assert_eq!(fin.len(), 1);
    assert_eq!(fin["good"].completions[0].token_ids.len(), 8);
    assert!(engine.kv_is_idle());
    assert_eq!(engine.metrics().requests_rejected, 12);
    // The finished id is free again.
    assert!(engine.add_request("good", "again", ok).is_ok());
    run_to_end(&mut engine);
    assert!(engine.kv_is_idle());
}

#[test]
fn prompt_larger_than_the_pool_is_rejected() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(4));
    let e = engine.add_request("big", prompt_tokens(3, 100), SamplingParams::greedy(4));
    assert!(matches!(e, Err(RequestError::ExceedsKvCache { pool_blocks: 4, .. })), "{e:?}");
    assert!(engine.kv_is_idle());
}

#[test]
fn abort_frees_blocks_and_reports_once() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let params = forced(100);
    for i in 0..4 {
        engine
            .add_request(format!("r{i}"), prompt_tokens(i, 40), params.clone())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Abort one while waiting, others while running.
    assert!(engine.abort("r3").is_ok());
    let mut outs = Vec::new();
    for _ in 0..5 {
        outs.extend(engine.step().unwrap_or_else(|e| panic!("{e}")));
    }
    assert!(engine.num_kv_blocks_used() > 0);
    assert!(engine.abort("r0").is_ok());
    assert!(matches!(engine.abort("r0"), Err(RequestError::UnknownRequest(_))));
    outs.extend(run_to_end(&mut engine));
    let aborted: Vec<&engine::RequestOutput> = outs
        .iter()
        .filter(|o| o.outputs.iter().any(|c| c.finish_reason == Some(FinishReason::Abort)))
        .collect();
    let mut ids: Vec<&str> = aborted.iter().map(|o| o.request_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["r0", "r3"]);
    assert!(aborted.iter().all(|o| o.finished));
    let fin = finals(&outs);
    assert_eq!(fin["r1"].completions[0].token_ids.len(), 100);
    assert!(fin["r3"].completions[0].token_ids.is_empty());
    assert!(engine.kv_is_idle());
    assert_eq!(engine.metrics().requests_aborted, 2);
}

#[test]
fn stop_token_ids_and_eos_end_a_sequence() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    // Learn what greedy produces, then stop on its third token.
    let probe = forced(6);
    let res =
        engine.generate(vec![Prompt::Tokens(prompt_tokens(9, 12))], &probe).unwrap_or_else(|e| panic!("{e}"));
    let tokens = res[0].as_ref().map(|r| r.completions[0].token_ids.clone()).unwrap_or_default();
    assert_eq!(tokens.len(), 6);
    let first_at = |t: u32| tokens.iter().position(|&x| x == t).unwrap_or(usize::MAX);
    let stop = tokens[2];
    let params = SamplingParams { stop_token_ids: vec![stop], ..forced(6) };
    let res = engine
        .generate(vec![Prompt::Tokens(prompt_tokens(9, 12))], &params)
        .unwrap_or_else(|e| panic!("{e}"));
    let c = res[0].as_ref().map(|r| r.completions[0].clone()).unwrap_or_default();
    assert_eq!(c.finish_reason, Some(FinishReason::StopToken(stop)));
    assert_eq!(c.token_ids, tokens[..=first_at(stop)].to_vec());
    // The stop token's text is not part of the output.
    let text_before = engine.tokenizer().decode(&tokens[..first_at(stop)], true).unwrap_or_default();
    assert_eq!(c.text, text_before);
    // min_tokens keeps it going past the stop token.
    let params = SamplingParams { min_tokens: 6, ..params };
    let res = engine
        .generate(vec![Prompt::Tokens(prompt_tokens(9, 12))], &params)
        .unwrap_or_else(|e| panic!("{e}"));
    let c = res[0].as_ref().map(|r| r.completions[0].clone()).unwrap_or_default();
    assert_eq!(c.token_ids.len(), 6);
    assert!(!c.token_ids[..5].contains(&stop));
    assert!(engine.kv_is_idle());
    assert_eq!(engine.eos_token_ids(), &[IM_END, crate::support::ENDOFTEXT]);
}

#[test]
fn stop_strings_cut_the_text_and_stream_consistently() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let probe = SamplingParams { skip_special_tokens: false, ..forced(24) };
    let res =
        engine.generate(vec![Prompt::Tokens(prompt_tokens(5, 12))], &probe).unwrap_or_else(|e| panic!("{e}"));
    let text = res[0].as_ref().map(|r| r.completions[0].text.clone()).unwrap_or_default();
    // A stop string taken from the middle of the greedy text (two characters).
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "{text:?}");
    let stop: String = chars[5..7].iter().collect();
    let expected_text = &text[..text.find(&stop).unwrap_or(0)];
    let params = SamplingParams { stop: vec![stop.clone()], ..probe };
    engine.add_request("s", prompt_tokens(5, 12), params).unwrap_or_else(|e| panic!("{e}"));
    let outs = run_to_end(&mut engine);
    let fin = finals(&outs);
    let c = &fin["s"].completions[0];
    assert_eq!(c.finish_reason, Some(FinishReason::StopString(stop)));
    assert_eq!(c.text, expected_text);
    assert!(engine.kv_is_idle());
}

#[test]
fn chat_prompts_use_the_template() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let messages = vec![ChatMessage::new("user", "hi")];
    let ids = engine.tokenize("c", Prompt::Chat(messages.clone())).unwrap_or_default();
    assert_eq!(ids.first(), Some(&crate::support::IM_START));
    let text = engine.tokenizer().decode(&ids, false).unwrap_or_default();
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    let res = engine
        .generate(vec![Prompt::Chat(messages)], &SamplingParams::greedy(4))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(res[0].as_ref().map(|r| r.prompt_tokens).unwrap_or(0), ids.len());
}

#[test]
fn logprobs_are_reported_per_token() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let params = SamplingParams { logprobs: Some(3), ..forced(5) };
    let res = engine.generate(vec![Prompt::Text("abc".into())], &params).unwrap_or_else(|e| panic!("{e}"));
    let c = res[0].as_ref().map(|r| r.completions[0].clone()).unwrap_or_default();
    let lps = c.logprobs.unwrap_or_default();
    assert_eq!(lps.len(), 5);
    for (lp, &t) in lps.iter().zip(&c.token_ids) {
        assert_eq!(lp.sampled.token, t);
        assert_eq!(lp.top.len(), 3);
        // Greedy: the sampled token is the most likely one.
        assert_eq!(lp.top[0].token, t);
        assert!(lp.sampled.logprob <= 0.0);
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
}
