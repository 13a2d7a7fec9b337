//! The body of `POST /v1/responses` and its translation into a chat request: input items into
//! chat messages (`function_call` items into an assistant turn's `tool_calls`,
//! `function_call_output` into `tool` messages), `instructions` into a leading system message,
//! function tools and `tool_choice` into the chat shapes, `text.format` into
//! `response_format`, `max_output_tokens` into `max_completion_tokens`. The chat request then
//! goes through the chat endpoint's checks and job, so both endpoints validate alike.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::fields::null_default;
use crate::openai::{ChatRequest, SAMPLING_EXTRAS};

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string (one user message) or a list of input items.
    pub input: Value,
    /// A system message ahead of the input; not carried to a later `previous_response_id`.
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Function tools: `{"type": "function", "name", "description", "parameters", "strict"}`.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "name": …}`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", …}}`.
    pub text: Option<Value>,
    #[serde(default, deserialize_with = "null_default")]
    pub stream: bool,
    /// Whether the response is kept for `previous_response_id` and `GET` (default true).
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub metadata: Option<Map<String, Value>>,
    pub user: Option<String>,
    /// vLLM's request id field (an `X-Request-Id` header wins over it).
    pub request_id: Option<String>,
    /// Every other field: vLLM's sampling extras pass on to the chat request, a few of OpenAI's
    /// are accepted where they ask for nothing this server does not do, the rest are a 400.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// OpenAI's fields that are accepted when they hold these values (or `null`): what this
/// server does anyway, or a hint it may ignore.
fn accepted(name: &str, value: &Value) -> bool {
    match name {
        "truncation" => value == "disabled",
        "include" => value.as_array().is_some_and(Vec::is_empty),
        "background" => value == false,
        "service_tier" => value == "auto" || value == "default",
        "top_logprobs" => value == 0,
        "prompt_cache_key" | "safety_identifier" | "stream_options" => true,
        _ => false,
    }
}

impl ResponsesRequest {
    /// The fields outside the typed ones checked: a 400 names the first that asks for what
    /// this endpoint does not do.
    pub fn check_extra(&self) -> Result<(), ApiError> {
        for (name, value) in &self.extra {
            if value.is_null() || SAMPLING_EXTRAS.contains(&name.as_str()) || accepted(name, value) {
                continue;
            }
            // The name is known only at run time: the message carries it.
            return Err(ApiError::bad_request(
                format!("{name} is not supported on /v1/responses (got {value})"),
                None,
            ));
        }
        Ok(())
    }

    /// This call's own input as chat messages (instructions aside), checked; `earlier` is the
    /// conversation it continues (where a result's call may have been made).
    pub fn input_messages(&self, earlier: &[Value]) -> Result<Vec<Value>, ApiError> {
        match &self.input {
            Value::String(text) => Ok(vec![json!({"role": "user", "content": text})]),
            Value::Array(items) if !items.is_empty() => items_to_messages(items, earlier),
            _ => Err(ApiError::bad_request(
                "input must be a string or a non-empty list of items",
                Some("input"),
            )),
        }
    }

    /// The chat request for `conversation` (earlier turns and this call's input), with the
    /// instructions ahead of it and every sampling, tool and format field translated.
    pub fn chat_request(&self, conversation: &[Value]) -> Result<ChatRequest, ApiError> {
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        if let Some(instructions) = &self.instructions {
            messages.push(json!({"role": "system", "content": instructions}));
        }
        messages.extend_from_slice(conversation);
        let mut chat = Map::new();
        chat.insert("messages".into(), Value::Array(messages));
        let mut set = |name: &str, value: Option<Value>| {
            if let Some(v) = value {
                chat.insert(name.into(), v);
            }
        };
        set("max_completion_tokens", self.max_output_tokens.map(Value::from));
        set("temperature", self.temperature.map(Value::from));
        set("top_p", self.top_p.map(Value::from));
        set("parallel_tool_calls", self.parallel_tool_calls.map(Value::from));
        set("tools", self.tools.as_deref().map(chat_tools).transpose()?);
        set("tool_choice", self.tool_choice.as_ref().map(chat_tool_choice).transpose()?);
        set("response_format", self.text.as_ref().map(response_format).transpose()?.flatten());
        for name in SAMPLING_EXTRAS {
            set(name, self.extra.get(*name).cloned());
        }
        serde_json::from_value(Value::Object(chat))
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}"), None))
    }
}

/// Input items as chat messages: messages (text parts joined), consecutive `function_call`
/// items as one assistant turn's `tool_calls` (joining the assistant message just before
/// them), `function_call_output` as `tool` messages naming their call's function (made here
/// or in `earlier`); `reasoning` items are dropped (a client passing a whole earlier output
/// back sends them).
fn items_to_messages(items: &[Value], earlier: &[Value]) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m, Some("input"));
    let mut messages: Vec<Value> = Vec::new();
    // Each call id's function name, for the tool message answering it.
    let mut names: Vec<(String, String)> = earlier
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| Some((c["id"].as_str()?.to_owned(), c["function"]["name"].as_str()?.to_owned())))
        .collect();
    for item in items {
        let kind = item["type"].as_str().unwrap_or(if item.get("role").is_some() { "message" } else { "" });
        match kind {
            "message" => {
                let role = match item["role"].as_str() {
                    Some("developer") => "system",
                    Some(r @ ("user" | "system" | "assistant")) => r,
                    other => {
                        return Err(bad(format!(
                            "message role {other:?} is not user, system, developer or assistant"
                        )));
                    }
                };
                messages.push(json!({"role": role, "content": text_of(&item["content"])?}));
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (item["call_id"].as_str(), item["name"].as_str()) else {
                    return Err(bad("a function_call item needs call_id and name".into()));
                };
                let arguments = item["arguments"].as_str().unwrap_or("{}");
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                names.push((call_id.to_owned(), name.to_owned()));
                match messages.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let Some(call_id) = item["call_id"].as_str() else {
                    return Err(bad("a function_call_output item needs call_id".into()));
                };
                let name = names.iter().find(|(id, _)| id == call_id).map(|(_, n)| n.clone());
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    parts @ Value::Array(_) => text_of(parts)?,
                    _ => return Err(bad("a function_call_output item needs output".into())),
                };
                messages
                    .push(json!({"role": "tool", "tool_call_id": call_id, "name": name, "content": output}));
            }
            "reasoning" => {}
            other => {
                return Err(bad(format!(
                    "input item type {other:?} is not supported (message, function_call, function_call_output)"
                )));
            }
        }
    }
    if messages.is_empty() {
        return Err(bad("input holds no message".into()));
    }
    Ok(messages)
}

/// A message's content as text: a string, or its text parts (`input_text`, `output_text`,
/// `text`) joined; any other part is a 400 (this model reads text only).
fn text_of(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_request(
                            format!("content part {kind:?} is not supported (this model reads text only)"),
                            Some("input"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => {
            Err(ApiError::bad_request("a message needs content (a string or a list of parts)", Some("input")))
        }
    }
}

/// Function tools in the chat shape (`{"type": "function", "function": {…}}`); another tool
/// type is a 400.
fn chat_tools(tools: &[Value]) -> Result<Value, ApiError> {
    let out = tools
        .iter()
        .map(|t| match t["type"].as_str() {
            Some("function") => {
                let mut f = t.as_object().cloned().unwrap_or_default();
                f.remove("type");
                Ok(json!({"type": "function", "function": f}))
            }
            other => Err(ApiError::bad_request(
                format!("tool type {other:?} is not supported (function tools only)"),
                Some("tools"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::Array(out))
}

/// `tool_choice` in the chat shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").is_some_and(|t| t == "function") => match o.get("name") {
            Some(Value::String(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
            _ => Err(ApiError::bad_request("a function tool_choice needs name", Some("tool_choice"))),
        },
        _ => Err(ApiError::bad_request(
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": …}",
            Some("tool_choice"),
        )),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let format = &text["format"];
    let bad = |m: &str| ApiError::bad_request(m.to_owned(), Some("text"));
    match format["type"].as_str() {
        None if format.is_null() => Ok(None),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = format.get("schema").ok_or_else(|| bad("text.format json_schema needs schema"))?;
            let name = format["name"].as_str().unwrap_or("response");
            let strict = format["strict"].as_bool().unwrap_or(false);
            Ok(Some(
                json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}),
            ))
        }
        _ => Err(bad("text.format type must be text, json_object or json_schema")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        serde_json::from_value(body).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn items_become_chat_turns_with_tool_calls_and_results() {
        let r = request(json!({"input": [
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
            {"type": "reasoning", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
        ], "instructions": "You help."}));
        let m = r.input_messages(&[]).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(
            (m[0]["role"].as_str(), m[1]["content"].as_str()),
            (Some("system"), Some("Weather in Paris?"))
        );
        assert_eq!(m[2]["tool_calls"].as_array().map(Vec::len), Some(2), "{m:?}");
        assert_eq!((m[3]["role"].as_str(), m[3]["name"].as_str()), (Some("tool"), Some("get_weather")));
        let chat = r.chat_request(&m).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(chat.messages.len(), 5);
        assert_eq!(chat.messages[0].role, "system");
    }

    #[test]
    fn tools_formats_and_limits_take_the_chat_shapes() {
        let r = request(json!({"input": "hi", "max_output_tokens": 9, "temperature": 0, "top_k": 3,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}}}));
        let chat =
            r.chat_request(&r.input_messages(&[]).unwrap_or_default()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(chat.max_completion_tokens, Some(9));
        assert_eq!(chat.sampling.top_k, Some(3));
        let tools = serde_json::to_value(&chat.tools).unwrap_or_default();
        assert_eq!(tools[0]["function"]["name"], "f");
        assert!(chat.sampling.constraints.response_format.is_some());
    }

    #[test]
    fn unsupported_fields_items_and_tools_are_400s_naming_them() {
        for (body, needle) in [
            (json!({"input": "x", "reasoning": {"effort": "high"}}), "reasoning"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (json!({"input": "x", "conversation": "c"}), "conversation"),
        ] {
            let e = request(body.clone()).check_extra().err().unwrap_or_else(|| panic!("{body} accepted"));
            assert!(e.message.contains(needle), "{}", e.message);
        }
        let accepted = json!({"input": "x", "truncation": "disabled", "include": [], "store": false,
            "service_tier": "auto", "top_k": 5, "prompt_cache_key": "k"});
        assert!(request(accepted).check_extra().is_ok());
        let bad_inputs = [
            json!([]),
            json!(3),
            json!([{"type": "input_image"}]),
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            json!([{"role": "tool", "content": "x"}]),
        ];
        for input in bad_inputs {
            let e = request(json!({"input": input})).input_messages(&[]).err();
            assert_eq!(e.map(|e| e.param), Some(Some("input")), "{input}");
        }
        let r = request(json!({"input": "x", "tools": [{"type": "web_search"}]}));
        assert_eq!(r.chat_request(&[]).err().map(|e| e.param), Some(Some("tools")));
    }
}
