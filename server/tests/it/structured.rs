//! Structured outputs over HTTP: on the real SmolLM2 (Q4_1 GGUF), a `json_schema`
//! `response_format` answer parses and validates (whole and streamed; a sampled one cut by
//! `max_tokens` is the start of a valid document), a `json_object` answer is a 200 holding an
//! object or, cut short, the start of one, `guided_choice` answers
//! one of the choices, `guided_regex` matches, `logit_bias` forces a token; on the tiny model,
//! every bad constraint or bias is a 400 naming its field, and the engine stays idle.

use axum::http::StatusCode;
use engine::Constraint;
use engine::structured::{Grammars, TextState};
use serde_json::{Value, json};

use crate::support::{TestServer, runtime, smollm2_server as smollm2};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "population": {"type": "integer", "minimum": 0},
            "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 2}
        },
        "required": ["city", "population", "landmarks"],
        "additionalProperties": false
    })
}

fn check_city(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(o.len(), 3, "{v}");
    assert!(o["city"].as_str().is_some_and(|s| s.chars().count() <= 30), "{v}");
    assert!(o["population"].as_u64().is_some(), "{v}");
    let landmarks = o["landmarks"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert!(landmarks.len() <= 2 && landmarks.iter().all(Value::is_string), "{v}");
}

/// The grammar compiler over the served model's vocabulary: what an output cut short by
/// `max_tokens` is checked with (the start of an allowed document, not just its first byte).
fn smollm2_grammars() -> Grammars {
    let folder = model::ModelFolder::open(&model::testing::smollm2_gguf()).unwrap_or_else(|e| panic!("{e}"));
    Grammars::new(&folder.tokenizer, folder.config.vocab_size, &folder.generation.eos_token_ids)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[test]
fn guided_answers_of_the_real_model_follow_their_constraints() {
    let rt = runtime();
    let server = smollm2();
    let grammars = smollm2_grammars();
    rt.block_on(async {
        let format = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema(), "strict": true}});
        let body = json!({"messages": user("Describe Paris as JSON."), "max_tokens": 100, "temperature": 0, "response_format": format});
        let v = server.post_ok("/v1/chat/completions", &body).await;
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        check_city(v["choices"][0]["message"]["content"].as_str().unwrap_or(""));

        // Streamed, sampled: the deltas reassemble into a valid document.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["temperature"] = json!(0.7);
        streamed["seed"] = json!(3);
        let mut text = String::new();
        let mut finish = Value::Null;
        for chunk in server.stream_chunks("/v1/chat/completions", &streamed).await {
            text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            if !chunk["choices"][0]["finish_reason"].is_null() {
                finish = chunk["choices"][0]["finish_reason"].clone();
            }
        }
        let city = Constraint::JsonSchema(schema());
        if finish == "stop" {
            check_city(&text);
        } else {
            assert_eq!(finish, "length", "{text:?}");
            assert_eq!(grammars.text_state(&city, &text), Ok(TextState::Prefix), "{text:?}");
        }

        let choices = ["yes", "no", "maybe"];
        let body = json!({"prompt": "Is water wet? Answer:", "max_tokens": 5, "guided_choice": choices});
        let v = server.post_ok("/v1/completions", &body).await;
        assert!(choices.contains(&v["choices"][0]["text"].as_str().unwrap_or("")), "{v}");

        let body = json!({"messages": user("A date please."), "max_tokens": 20, "temperature": 0,
            "guided_regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"});
        let v = server.post_ok("/v1/chat/completions", &body).await;
        let date = v["choices"][0]["message"]["content"].as_str().unwrap_or("").as_bytes().to_vec();
        assert!(date.len() == 10 && &date[..2] == b"20" && date[4] == b'-' && date[7] == b'-', "{v}");

        let body = json!({"messages": user("Answer in JSON."), "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_object"}});
        let v = server.post_ok("/v1/chat/completions", &body).await;
        let content = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
        if v["choices"][0]["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<Value>(content).is_ok_and(|d| d.is_object()), "{v}");
        } else {
            assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
            assert_eq!(grammars.text_state(&Constraint::JsonObject, content), Ok(TextState::Prefix), "{v}");
        }

        // +100 on one token: every sampled token is it, even hot.
        let (_, tok) =
            server.post_json("/tokenize", &json!({"prompt": "banana", "add_special_tokens": false})).await;
        let id = tok["tokens"][0].as_u64().unwrap_or_else(|| panic!("{tok}"));
        let body = json!({"prompt": "Fruit:", "max_tokens": 3, "temperature": 1.0, "ignore_eos": true,
            "logit_bias": {id.to_string(): 100}});
        let v = server.post_ok("/v1/completions", &body).await;
        let (_, one) = server.post_json("/detokenize", &json!({"tokens": [id, id, id]})).await;
        assert_eq!(v["choices"][0]["text"], one["prompt"], "{v}");
        server.wait_idle().await;
    });
}

#[test]
fn bad_constraints_and_biases_are_400s_naming_their_field() {
    let rt = runtime();
    let server = TestServer::default();
    rt.block_on(async {
        let chat = |extra: Value| {
            let mut body = json!({"messages": user("hi"), "max_tokens": 4});
            if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
                b.extend(e.clone());
            }
            body
        };
        for (extra, param, words) in [
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
                "response_format",
                "json_schema",
            ),
            (json!({"guided_json": {"type": "object", "properties": 7}}), "guided_json", "json_schema"),
            (json!({"guided_regex": "(open"}), "guided_regex", "regex"),
            (json!({"guided_choice": []}), "guided_choice", "empty"),
            (json!({"guided_grammar": "start: nothing_here"}), "guided_grammar", "grammar"),
            (json!({"grammar": "root ::= \"a\""}), "grammar", "grammar"),
            (json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice", "at most one"),
            (json!({"response_format": {"type": "xml"}}), "response_format", "xml"),
            (json!({"logit_bias": {"999999": 1}}), "logit_bias", "vocabulary"),
            (json!({"logit_bias": {"5": 150}}), "logit_bias", "[-100, 100]"),
            (json!({"logit_bias": {"five": 1}}), "logit_bias", "token id"),
        ] {
            let (status, v) = server.post_json("/v1/chat/completions", &chat(extra.clone())).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {v}");
            assert_eq!(v["error"]["param"], param, "{extra}: {v}");
            let message = v["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains(words), "{extra}: {message}");
        }
        // The tiny model guided: still valid output, whatever its weights.
        let v = server.post_ok("/v1/completions", &json!({"prompt": "x", "max_tokens": 8, "guided_choice": ["ab", "cd"]})).await;
        assert!(["ab", "cd"].contains(&v["choices"][0]["text"].as_str().unwrap_or("")), "{v}");
        server.wait_idle().await;
    });
}
