//! `/v1/completions` with `echo` (the prompt before each choice: its text, and with `logprobs`
//! its tokens and their logprobs, the first `null`, in OpenAI's legacy shape; `max_tokens: 0`
//! as lm-evaluation-harness sends it), vLLM's `prompt_logprobs`, and `best_of` (the `n` of
//! highest cumulative logprob out of `best_of` candidates); the fields refused with a 400.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::{TestServer, smollm2_server};

/// The legacy logprobs object of a choice: tokens, their logprobs, and offsets agreeing with the
/// tokens' texts; the prompt's first token (when echoed) has `null` logprob and alternatives.
fn check_legacy_logprobs(choice: &Value, echoed_tokens: usize) -> Vec<Option<f64>> {
    let lp = &choice["logprobs"];
    let tokens: Vec<&str> =
        lp["tokens"].as_array().expect("tokens").iter().map(|t| t.as_str().expect("str")).collect();
    let logprobs: Vec<Option<f64>> =
        lp["token_logprobs"].as_array().expect("logprobs").iter().map(Value::as_f64).collect();
    let top = lp["top_logprobs"].as_array().expect("top");
    let offsets: Vec<u64> =
        lp["text_offset"].as_array().expect("offsets").iter().map(|o| o.as_u64().expect("u64")).collect();
    assert_eq!((logprobs.len(), top.len(), offsets.len()), (tokens.len(), tokens.len(), tokens.len()));
    let mut offset = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(offsets[i], offset, "offset of token {i}");
        offset += t.chars().count() as u64;
        if echoed_tokens > 0 && i == 0 {
            assert!(logprobs[0].is_none() && top[0].is_null(), "{lp}");
        } else {
            let v = logprobs[i].unwrap_or_else(|| panic!("token {i} has no logprob: {lp}"));
            assert!(v <= 0.0 && top[i].is_object(), "{lp}");
        }
    }
    logprobs
}

#[test]
fn smollm2_echo_with_logprobs_returns_the_prompt_tokens_and_their_logprobs() {
    let prompt = "The capital of France is Paris. The capital of Italy is";
    smollm2_server().run_then_idle(async |srv| {
        // What lm-evaluation-harness sends for a loglikelihood: the prompt and one token more.
        let body = json!({"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0});
        let v = srv.post_ok("/v1/completions", &body).await;
        let choice = &v["choices"][0];
        let text = choice["text"].as_str().expect("text");
        assert!(text.starts_with(prompt) && text.len() > prompt.len(), "{text:?}");
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().expect("usage") as usize;
        let logprobs = check_legacy_logprobs(choice, prompt_tokens);
        assert_eq!(logprobs.len(), prompt_tokens + 1);
        let tokens: Vec<&str> = choice["logprobs"]["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(tokens[..prompt_tokens].concat(), prompt, "the prompt's tokens spell the prompt");
        assert_eq!(tokens.concat(), text);
        assert_eq!(v["usage"]["completion_tokens"], 1);

        // `max_tokens: 0`: the prompt alone, the same logprobs; and vLLM's `prompt_logprobs`.
        let body =
            json!({"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 0, "prompt_logprobs": 2});
        let v = srv.post_ok("/v1/completions", &body).await;
        let only = &v["choices"][0];
        assert_eq!(only["text"], prompt);
        assert_eq!(check_legacy_logprobs(only, prompt_tokens), logprobs[..prompt_tokens]);
        assert_eq!(v["usage"]["completion_tokens"], 0);
        let vllm = only["prompt_logprobs"].as_array().expect("prompt_logprobs");
        assert_eq!(vllm.len(), prompt_tokens);
        assert!(vllm[0].is_null());
        for (i, position) in vllm.iter().enumerate().skip(1) {
            let entries = position.as_object().expect("an object per position");
            assert!((2..=3).contains(&entries.len()), "{position}");
            // The prompt token's own entry is the echoed logprob.
            let own =
                entries.values().find(|e| e["logprob"].as_f64() == logprobs[i]).expect("the prompt token");
            assert!(own["rank"].as_u64().is_some_and(|r| r >= 1) && own["decoded_token"].is_string());
        }
    });
}

#[test]
fn echo_streams_the_prompt_first_and_without_logprobs_returns_its_text() {
    TestServer::default().run_then_idle(async |srv| {
        let base = json!({"prompt": "hello there", "echo": true, "logprobs": 2, "max_tokens": 4,
                          "temperature": 0, "ignore_eos": true});
        let whole = srv.post_ok("/v1/completions", &base).await;
        let choice = &whole["choices"][0];
        let prompt_tokens = whole["usage"]["prompt_tokens"].as_u64().expect("usage") as usize;
        assert_eq!(check_legacy_logprobs(choice, prompt_tokens).len(), prompt_tokens + 4);
        assert!(choice["text"].as_str().is_some_and(|t| t.starts_with("hello there")));

        let mut body = base.clone();
        body["stream"] = json!(true);
        let chunks = srv.stream_chunks("/v1/completions", &body).await;
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(text, choice["text"].as_str().unwrap_or_default());
        assert!(chunks[0]["choices"][0]["text"].as_str().is_some_and(|t| t.starts_with("hello there")));
        let first = &chunks[0]["choices"][0]["logprobs"];
        assert!(first["token_logprobs"][0].is_null(), "the first chunk echoes the prompt: {first}");
        let streamed: Vec<Value> = chunks
            .iter()
            .flat_map(|c| {
                c["choices"][0]["logprobs"]["token_logprobs"].as_array().cloned().unwrap_or_default()
            })
            .collect();
        assert_eq!(streamed, choice["logprobs"]["token_logprobs"].as_array().cloned().unwrap_or_default());

        let plain = srv
            .post_ok("/v1/completions", &json!({"prompt": [5, 6, 7], "echo": true, "max_tokens": 0}))
            .await;
        let decoded = srv.engine(crate::support::small_config()).tokenizer().decode(&[5, 6, 7], false);
        assert_eq!(plain["choices"][0]["text"], decoded.unwrap_or_default());
        assert!(plain["choices"][0]["logprobs"].is_null());
    });
}

#[test]
fn best_of_returns_the_candidates_of_highest_cumulative_logprob() {
    TestServer::default().run_then_idle(async |srv| {
        let sum = |c: &Value| -> f64 {
            c["logprobs"]["token_logprobs"].as_array().expect("logprobs").iter().filter_map(Value::as_f64).sum()
        };
        // The same seed gives the same candidates: all four with n = 4, the best two with best_of.
        let base = json!({"prompt": "abc", "max_tokens": 6, "temperature": 1.5, "seed": 11, "ignore_eos": true,
                          "logprobs": 0, "n": 4});
        let all = srv.post_ok("/v1/completions", &base).await;
        let mut candidates: Vec<(f64, String)> = all["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| (sum(c), c["text"].as_str().unwrap_or_default().to_owned()))
            .collect();
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut body = base.clone();
        body["n"] = json!(2);
        body["best_of"] = json!(4);
        let best = srv.post_ok("/v1/completions", &body).await;
        let choices = best["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 2);
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i);
            assert_eq!(c["text"], candidates[i].1.as_str(), "choice {i} is the {i}-th best candidate");
            assert!((sum(c) - candidates[i].0).abs() < 1e-4);
        }
        // Usage counts every candidate's tokens.
        assert_eq!(best["usage"]["completion_tokens"], 4 * 6);
        // Without `logprobs` the candidates are ranked all the same, and no logprobs are shown.
        body.as_object_mut().map(|o| o.remove("logprobs"));
        let hidden = srv.post_ok("/v1/completions", &body).await;
        assert_eq!(hidden["choices"][0]["text"], candidates[0].1.as_str());
        assert!(hidden["choices"][0]["logprobs"].is_null());
    });
}

#[test]
fn what_cannot_be_done_is_a_400_naming_its_field() {
    TestServer::default().run_then_idle(async |srv| {
        for (path, body, param) in [
            ("/v1/completions", json!({"prompt": "x", "best_of": 1, "n": 2}), "best_of"),
            ("/v1/completions", json!({"prompt": "x", "best_of": 3, "stream": true}), "best_of"),
            ("/v1/completions", json!({"prompt": "x", "suffix": "y"}), "suffix"),
            (
                "/v1/completions",
                json!({"prompt": "x", "prompt_logprobs": 1, "stream": true}),
                "prompt_logprobs",
            ),
            ("/v1/completions", json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "x"}], "echo": true}),
                "echo",
            ),
        ] {
            let (status, v) = srv.post_json(path, &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
        }
        // Chat takes vLLM's `prompt_logprobs` too: the prompt's, beside the choices.
        let body =
            json!({"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 0, "max_tokens": 2});
        let v = srv.post_ok("/v1/chat/completions", &body).await;
        let lps = v["prompt_logprobs"].as_array().expect("prompt_logprobs");
        assert_eq!(lps.len() as u64, v["usage"]["prompt_tokens"].as_u64().unwrap_or(0));
        assert!(lps[0].is_null() && lps[1].as_object().is_some_and(|o| o.len() == 1), "{v}");
    });
}
