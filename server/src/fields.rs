//! Request fields beyond the typed ones, as vLLM treats them: a field the server does not know
//! is ignored and logged once per name for the whole process; a field vLLM or OpenAI define
//! that this server does not implement is a 400 naming it (unless it asks for what the server
//! does anyway, `"use_beam_search": false` say); and `null` read as "not set" for fields that
//! are not `Option`s.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::respond::Endpoint;

/// Field names logged as ignored so far; past this many distinct names nothing more is
/// remembered (a client inventing names cannot grow the set without bound).
const MAX_LOGGED_NAMES: usize = 1024;

/// A field whose `null` means its default (`"stream": null` is "not set" to OpenAI's API).
pub fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// What a known but unimplemented field may hold without asking for anything this server
/// does not do (beside `null`, which every one may hold).
#[derive(Debug, Clone, Copy)]
enum NoOp {
    /// Only `null`.
    Nothing,
    /// This JSON value (numbers compared as numbers).
    Value(&'static str),
    /// `add_special_tokens`: chat prompts come from the template, which writes its own special
    /// tokens (`false`); text prompts get the tokenizer's (`true`).
    SpecialTokens,
}

/// The fields that OpenAI's API or vLLM's define and this server does not implement.
const UNIMPLEMENTED: &[(&str, NoOp)] = &[
    ("use_beam_search", NoOp::Value("false")),
    ("continue_final_message", NoOp::Value("false")),
    ("return_tokens_as_token_ids", NoOp::Value("false")),
    ("return_token_ids", NoOp::Value("false")),
    ("length_penalty", NoOp::Value("1")),
    ("add_generation_prompt", NoOp::Value("true")),
    ("spaces_between_special_tokens", NoOp::Value("true")),
    ("include_reasoning", NoOp::Value("true")),
    ("add_special_tokens", NoOp::SpecialTokens),
    ("modalities", NoOp::Value(r#"["text"]"#)),
    ("truncate_prompt_tokens", NoOp::Nothing),
    ("allowed_token_ids", NoOp::Nothing),
    ("bad_words", NoOp::Nothing),
    ("logits_processors", NoOp::Nothing),
    ("structural_tag", NoOp::Nothing),
    ("guided_decoding_backend", NoOp::Nothing),
    ("guided_whitespace_pattern", NoOp::Nothing),
    ("kv_transfer_params", NoOp::Nothing),
    ("vllm_xargs", NoOp::Nothing),
    ("mm_processor_kwargs", NoOp::Nothing),
    ("chat_template", NoOp::Nothing),
    ("reasoning_effort", NoOp::Nothing),
    ("audio", NoOp::Nothing),
    ("prediction", NoOp::Nothing),
    ("functions", NoOp::Nothing),
    ("function_call", NoOp::Nothing),
    ("web_search_options", NoOp::Nothing),
    ("verbosity", NoOp::Nothing),
];

impl NoOp {
    fn allows(self, value: &Value, endpoint: Endpoint) -> bool {
        let noop = match self {
            Self::Nothing => return value.is_null(),
            Self::Value(json) => serde_json::from_str(json).unwrap_or(Value::Null),
            Self::SpecialTokens => Value::Bool(endpoint == Endpoint::Completions),
        };
        value.is_null() || same_value(&noop, value)
    }
}

/// Checks the fields no typed field took: a known but unimplemented one is a 400 unless it
/// holds its no-op value (or `null`); an unknown one is logged (once per name) and ignored.
pub fn check_extra(extra: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    for (name, value) in extra {
        match UNIMPLEMENTED.iter().find(|(n, _)| n == name) {
            Some(&(param, noop)) => {
                if !noop.allows(value, endpoint) {
                    return Err(ApiError::bad_request(
                        format!("{param} is not supported by this server (the request sets {value})"),
                        Some(param),
                    ));
                }
            }
            None => {
                log_ignored_once(name);
            }
        }
    }
    Ok(())
}

/// JSON equality with `1` and `1.0` the same number.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn logged() -> &'static Mutex<HashSet<String>> {
    static LOGGED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    LOGGED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Logs `name` as ignored the first time any request brings it; true when it logged.
pub fn log_ignored_once(name: &str) -> bool {
    let mut names = logged().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if names.contains(name) || names.len() >= MAX_LOGGED_NAMES {
        return false;
    }
    names.insert(name.to_owned());
    drop(names);
    tracing::warn!(target: "server", "the request field {name:?} is not known to this server and is ignored");
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unimplemented_fields_are_refused_unless_they_ask_for_nothing() {
        let check = |v: Value, endpoint| {
            let map = v.as_object().cloned().unwrap_or_default();
            check_extra(&map, endpoint).err().and_then(|e| e.param)
        };
        assert_eq!(check(json!({"use_beam_search": true}), Endpoint::Chat), Some("use_beam_search"));
        assert_eq!(check(json!({"length_penalty": 2}), Endpoint::Chat), Some("length_penalty"));
        assert_eq!(check(json!({"chat_template": "{{ x }}"}), Endpoint::Chat), Some("chat_template"));
        assert_eq!(check(json!({"add_special_tokens": true}), Endpoint::Chat), Some("add_special_tokens"));
        for ok in [
            json!({"use_beam_search": false, "length_penalty": 1, "add_generation_prompt": true}),
            json!({"bad_words": null, "modalities": ["text"], "a_field_nobody_defined": 3}),
        ] {
            assert_eq!(check(ok.clone(), Endpoint::Chat), None, "{ok}");
        }
        assert_eq!(check(json!({"add_special_tokens": true}), Endpoint::Completions), None);
    }

    #[test]
    fn every_no_op_value_is_json() {
        for (name, noop) in UNIMPLEMENTED {
            if let NoOp::Value(json) = noop {
                assert!(serde_json::from_str::<Value>(json).is_ok(), "{name}: {json}");
            }
        }
    }

    #[test]
    fn an_unknown_name_is_logged_once() {
        assert!(log_ignored_once("fields_rs_test_only_name"));
        assert!(!log_ignored_once("fields_rs_test_only_name"));
    }
}
