//! The body of Anthropic's `POST /v1/messages` and its translation into a chat request:
//! `system` into a leading system message, content blocks into chat turns (`tool_use` blocks
//! into the assistant turn's `tool_calls`, `tool_result` blocks into `tool` messages, text
//! joined), `tools` (`input_schema`) and `tool_choice` (`auto`, `any`, `tool`, `none`) into the
//! chat shapes, `stop_sequences` into `stop`. The chat request then goes through the chat
//! endpoint's checks and job.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::fields::null_default;
use crate::openai::{ChatRequest, SAMPLING_EXTRAS};

/// `POST /v1/messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: Option<String>,
    /// Required, as Anthropic requires it.
    pub max_tokens: Option<i64>,
    pub messages: Vec<Value>,
    /// A string or a list of text blocks.
    pub system: Option<Value>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    /// `{"name", "description", "input_schema"}`.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    #[serde(default, deserialize_with = "null_default")]
    pub stream: bool,
    /// `{"user_id": …}`: accepted, unused.
    #[allow(dead_code)]
    pub metadata: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl MessagesRequest {
    /// The fields outside the typed ones: vLLM's sampling extras (handed on), `thinking` (see
    /// [`Self::thinking`]), `service_tier`; anything else is a 400 naming it.
    pub fn check_extra(&self) -> Result<(), ApiError> {
        for (name, value) in &self.extra {
            let fine = value.is_null()
                || SAMPLING_EXTRAS.contains(&name.as_str())
                || match name.as_str() {
                    "thinking" => true,
                    "service_tier" => value == "auto" || value == "standard_only",
                    _ => false,
                };
            if !fine {
                return Err(ApiError::bad_request(
                    format!("{name} is not supported on /v1/messages (got {value})"),
                    None,
                ));
            }
        }
        Ok(())
    }

    /// Whether the answer's reasoning is asked for as `thinking` blocks: `{"type": "enabled",
    /// "budget_tokens": N}` with N at least 1024 and below `max_tokens` (Anthropic's rules; the
    /// budget is not enforced: the model reasons until it closes its span), or `disabled`.
    pub fn thinking(&self) -> Result<bool, ApiError> {
        let bad = |m: String| Err(ApiError::bad_request(m, Some("thinking")));
        let Some(t) = self.extra.get("thinking").filter(|v| !v.is_null()) else { return Ok(false) };
        match t["type"].as_str() {
            Some("disabled") => Ok(false),
            Some("enabled") => match t["budget_tokens"].as_i64() {
                None => bad("thinking.budget_tokens is required (an integer)".into()),
                Some(b) if b < 1024 => bad(format!("thinking.budget_tokens must be at least 1024 (got {b})")),
                Some(b) if self.max_tokens.is_some_and(|m| b >= m) => {
                    bad(format!("thinking.budget_tokens ({b}) must be less than max_tokens"))
                }
                Some(_) => Ok(true),
            },
            _ => bad(format!("thinking type must be enabled or disabled (got {t})")),
        }
    }

    /// The chat request this body asks for.
    pub fn chat_request(&self) -> Result<ChatRequest, ApiError> {
        let Some(max_tokens) = self.max_tokens else {
            return Err(ApiError::bad_request("max_tokens is required", Some("max_tokens")));
        };
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = &self.system {
            messages.push(json!({"role": "system", "content": text_of(system, "system")?}));
        }
        if self.messages.is_empty() {
            return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
        }
        for m in &self.messages {
            turns(m, &mut messages)?;
        }
        let mut chat = Map::new();
        chat.insert("messages".into(), Value::Array(messages));
        chat.insert("max_tokens".into(), json!(max_tokens));
        let mut set = |name: &str, value: Option<Value>| {
            if let Some(v) = value {
                chat.insert(name.into(), v);
            }
        };
        set("temperature", self.temperature.map(Value::from));
        set("top_p", self.top_p.map(Value::from));
        set("top_k", self.top_k.map(Value::from));
        set("stop", self.stop_sequences.as_ref().map(|s| json!(s)));
        set("tools", self.tools.as_deref().map(chat_tools).transpose()?);
        for name in SAMPLING_EXTRAS.iter().filter(|n| **n != "top_k") {
            set(name, self.extra.get(*name).cloned());
        }
        if let Some(choice) = &self.tool_choice {
            let (choice, parallel) = chat_tool_choice(choice)?;
            set("tool_choice", Some(choice));
            set("parallel_tool_calls", parallel.map(Value::from));
        }
        serde_json::from_value(Value::Object(chat))
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}"), None))
    }
}

/// One Anthropic message as chat turns appended to `out`: its text; an assistant's `tool_use`
/// blocks as `tool_calls`; a user's `tool_result` blocks as `tool` messages ahead of its text.
fn turns(m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let bad = |s: String| ApiError::bad_request(s, Some("messages"));
    let role = match m["role"].as_str() {
        Some(r @ ("user" | "assistant")) => r,
        other => return Err(bad(format!("message role {other:?} is not user or assistant"))),
    };
    let blocks = match &m["content"] {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => return Err(bad("a message needs content (a string or a list of blocks)".into())),
    };
    let (mut text, mut calls) = (String::new(), Vec::new());
    for b in &blocks {
        match (b["type"].as_str(), role) {
            (Some("text"), _) => text.push_str(b["text"].as_str().unwrap_or_default()),
            (Some("tool_use"), "assistant") => {
                let (Some(id), Some(name)) = (b["id"].as_str(), b["name"].as_str()) else {
                    return Err(bad("a tool_use block needs id and name".into()));
                };
                let arguments = b.get("input").map_or_else(|| "{}".to_owned(), Value::to_string);
                calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                );
            }
            // Earlier turns' thinking is left out, as reasoning models' templates leave it.
            (Some("thinking" | "redacted_thinking"), "assistant") => {}
            (Some("tool_result"), "user") => {
                let Some(id) = b["tool_use_id"].as_str() else {
                    return Err(bad("a tool_result block needs tool_use_id".into()));
                };
                let content = match &b["content"] {
                    Value::Null => String::new(),
                    c => text_of(c, "messages")?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content, "name": tool_name(out, id)}));
            }
            (kind, _) => {
                return Err(bad(format!("content block {kind:?} is not supported in a {role} message")));
            }
        }
    }
    if !calls.is_empty() {
        out.push(json!({"role": "assistant", "content": text, "tool_calls": calls}));
    } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(json!({"role": role, "content": text}));
    }
    Ok(())
}

/// The function an earlier assistant turn called under `id`.
fn tool_name(turns: &[Value], id: &str) -> Option<String> {
    turns
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .find(|c| c["id"] == id)
        .and_then(|c| c["function"]["name"].as_str().map(str::to_owned))
}

/// A string, or text blocks joined; another block is a 400 naming `field`.
fn text_of(v: &Value, field: &'static str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match (b["type"].as_str(), b["text"].as_str()) {
                (Some("text"), Some(t)) => Ok(t.to_owned()),
                (kind, _) => Err(ApiError::bad_request(
                    format!("content block {kind:?} is not supported (this model reads text only)"),
                    Some(field),
                )),
            })
            .collect(),
        _ => Err(ApiError::bad_request(
            format!("{field} must be a string or a list of text blocks"),
            Some(field),
        )),
    }
}

/// Anthropic tools (`name`, `description`, `input_schema`) as chat function tools.
fn chat_tools(tools: &[Value]) -> Result<Value, ApiError> {
    let out = tools
        .iter()
        .map(|t| {
            if t.get("type").is_some_and(|k| k != "custom") {
                return Err(ApiError::bad_request(
                    format!("tool type {} is not supported (client tools with input_schema only)", t["type"]),
                    Some("tools"),
                ));
            }
            let name = t["name"].as_str().ok_or_else(|| ApiError::bad_request("every tool needs name", Some("tools")))?;
            let params = t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}));
            Ok(json!({"type": "function", "function": {"name": name, "description": t["description"], "parameters": params}}))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::Array(out))
}

/// `tool_choice` as chat's, and the parallel-calls flag it implies.
fn chat_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = choice["disable_parallel_tool_use"].as_bool().map(|d| !d);
    let chat = match choice["type"].as_str() {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice["name"].as_str() {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => return Err(ApiError::bad_request("a tool tool_choice needs name", Some("tool_choice"))),
        },
        _ => {
            return Err(ApiError::bad_request(
                "tool_choice type must be auto, any, tool or none",
                Some("tool_choice"),
            ));
        }
    };
    Ok((chat, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn blocks_become_chat_turns() {
        let r = request(
            json!({"max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["\n"],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "Thanks."}]}]}),
        );
        let chat = r.chat_request().unwrap_or_else(|e| panic!("{e:?}"));
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let call = &chat.messages[2].tool_calls.as_ref().map(|c| c[0].clone());
        assert_eq!(call.as_ref().map(|c| c.function.arguments.as_str()), Some(Some(r#"{"city":"Paris"}"#)));
        assert_eq!(chat.messages[3].name.as_deref(), Some("get_weather"));
        assert_eq!(chat.parallel_tool_calls, Some(false));
        assert_eq!(chat.max_completion_tokens.or(chat.sampling.max_tokens), Some(9));
    }

    #[test]
    fn what_is_missing_or_unsupported_is_a_400() {
        assert_eq!(
            request(json!({"messages": [{"role": "user", "content": "x"}]}))
                .chat_request()
                .err()
                .map(|e| e.param),
            Some(Some("max_tokens"))
        );
        for messages in [
            json!([]),
            json!([{"role": "system", "content": "x"}]),
            json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
        ] {
            let e = request(json!({"max_tokens": 5, "messages": messages})).chat_request().err();
            assert_eq!(e.map(|e| e.param), Some(Some("messages")), "{messages}");
        }
        let thinking = |max_tokens: i64, t: Value| {
            let r = request(json!({"max_tokens": max_tokens, "messages": [], "thinking": t}));
            r.check_extra().and_then(|()| r.thinking()).map_err(|e| (e.param, e.message))
        };
        assert_eq!(thinking(2048, json!({"type": "enabled", "budget_tokens": 1024})), Ok(true));
        assert_eq!(thinking(5, json!({"type": "disabled"})), Ok(false));
        for (max_tokens, bad) in [
            (2048, json!({"type": "enabled", "budget_tokens": 100})),
            (1024, json!({"type": "enabled", "budget_tokens": 1024})),
            (2048, json!({"type": "enabled"})),
            (2048, json!({"type": "adaptive"})),
        ] {
            let e = thinking(max_tokens, bad.clone());
            assert!(
                e.as_ref().is_err_and(|(p, m)| *p == Some("thinking") && m.contains("thinking")),
                "{bad}: {e:?}"
            );
        }
        // An earlier turn's thinking is dropped, not refused.
        let r = request(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "y"}]}]}));
        let chat = r.chat_request().unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(chat.messages.len(), 2);
        let e = request(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "w"}]})).chat_request();
        assert_eq!(e.err().map(|e| e.param), Some(Some("tools")));
    }
}
