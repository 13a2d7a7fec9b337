//! Chat templates (`chat_template` in `tokenizer_config.json`), rendered with `minijinja`
//! exactly as `transformers`' `apply_chat_template` renders them with Jinja2: `trim_blocks` and
//! `lstrip_blocks` on, the template's one trailing newline dropped (Jinja2's
//! `keep_trailing_newline=False`), loop controls, Python's string, list and dict methods
//! (`minijinja_contrib::pycompat`), transformers' `tojson` (Python's `json.dumps`, see
//! [`pyjson`]), `raise_exception` (a typed [`ModelError::ChatTemplateRaised`]) and
//! `strftime_now`, and the variables `messages`, `tools`, `documents`, `add_generation_prompt`,
//! the special tokens and any extra keyword arguments ([`Conversation::kwargs`]).
//! `model/tests/data/chat_templates/` holds real templates and transformers' renderings of them.

mod pyjson;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// A JSON value whose objects keep their keys in order. Templates print tool schemas and call
/// arguments with `tojson`, and Python dicts keep insertion order, so a map that sorted its keys
/// would change the prompt. (`minijinja::Value` with its `preserve_order` feature; it
/// deserializes from any JSON.)
pub type TemplateValue = minijinja::Value;

/// One chat message, shaped like OpenAI's and transformers' message dicts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// `None` is JSON `null`: an assistant turn that only calls tools.
    #[serde(default)]
    pub content: Option<String>,
    /// The assistant's tool calls; absent (not `null`) in the template when `None`, as templates
    /// test `'tool_calls' in message` and `message.tool_calls is defined`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function's name (some templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A plain text message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// An assistant message that calls tools (content `null`).
    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        Self {
            role: "assistant".into(),
            content: None,
            tool_calls: Some(calls),
            tool_call_id: None,
            name: None,
        }
    }

    /// A tool's result, answering the call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self { tool_call_id: Some(call_id.into()), ..Self::new("tool", content) }
    }
}

/// `{"id": …, "type": "function", "function": {"name": …, "arguments": …}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_owned()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON object (transformers' convention) or a string of JSON (OpenAI's wire format): the
    /// template receives it as given, so `tojson` prints an object or a quoted string.
    pub arguments: TemplateValue,
}

/// Everything `apply_chat_template` takes besides `add_generation_prompt`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// Tool schemas (`{"type": "function", "function": {...}}`); `None` is Python's `None`.
    #[serde(default)]
    pub tools: Option<Vec<TemplateValue>>,
    /// Retrieval documents (`{"title": …, "text": …}`) for templates that take them.
    #[serde(default)]
    pub documents: Option<Vec<TemplateValue>>,
    /// Extra template variables, as transformers' `**kwargs`: `date_string`, `enable_thinking`, ….
    #[serde(default)]
    pub kwargs: BTreeMap<String, TemplateValue>,
}

impl From<Vec<ChatMessage>> for Conversation {
    fn from(messages: Vec<ChatMessage>) -> Self {
        Self { messages, ..Self::default() }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// Special tokens in `tokenizer_config.json` are either a string or an `AddedToken` object.
fn token_string(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(obj) => obj.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_owned(),
        None => String::new(),
    }
}

/// What `raise_exception(msg)` fails with, attached to minijinja's error so that [`render_error`]
/// can tell a template's deliberate refusal from a failure inside the template.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn render_error(e: minijinja::Error) -> ModelError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(Raised(msg)) = err.downcast_ref::<Raised>() {
            return ModelError::ChatTemplateRaised(msg.clone());
        }
        source = err.source();
    }
    ModelError::ChatTemplate(format!("{e:#}"))
}

/// `strftime_now(format)`: the local time (Python's `datetime.now()`), or the fixed clock.
fn strftime(now: chrono::NaiveDateTime, format: &str) -> std::result::Result<String, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    // chrono's Display fails (and `to_string` would panic) on a directive it does not know.
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    Ok(now.format_with_items(items.into_iter()).to_string())
}

impl ChatTemplate {
    /// Compiles `source`; an empty `bos_token` / `eos_token` is a token the tokenizer lacks
    /// (undefined in the template, as transformers leaves it).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::with_clock(source, bos_token, eos_token, None)
    }

    /// [`Self::new`] whose `strftime_now` reads `now` instead of the local clock (tests, and
    /// reproducible prompts).
    pub fn with_clock(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        now: Option<chrono::NaiveDateTime>,
    ) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        // Jinja2 as transformers configures it (`_compile_jinja_template`).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        // HF templates are Jinja as Python runs it: `.strip()`, `.startswith()`, `.items()`, …
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg.clone())
                .with_source(Raised(msg)))
        });
        env.add_function("strftime_now", move |format: String| {
            strftime(now.unwrap_or_else(|| chrono::Local::now().naive_local()), &format)
        });
        env.add_filter("tojson", pyjson::tojson);
        // Jinja2's tests, where minijinja's differ: there `none is iterable` (an empty loop) and
        // only lists are sequences; Python iterates strings, lists, dicts and its `Undefined`,
        // and anything with a length and indexing (strings, dicts too) is a sequence. Gemma 3
        // tells string content from a list of parts and refuses `null` content this way.
        env.add_test("iterable", |v: minijinja::Value| {
            use minijinja::value::ValueKind as K;
            !matches!(v.kind(), K::None | K::Bool | K::Number | K::Invalid)
                && (v.is_undefined() || v.try_iter().is_ok())
        });
        env.add_test("sequence", |v: minijinja::Value| {
            use minijinja::value::ValueKind as K;
            matches!(v.kind(), K::String | K::Seq | K::Map | K::Bytes)
        });
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let token = |t: &str| (!t.is_empty()).then(|| t.to_owned());
        Ok(Self { env, bos_token: token(bos_token), eos_token: token(eos_token) })
    }

    /// Another template over the same special tokens (a template given in place of the model's).
    pub fn with_source(&self, source: &str) -> Result<Self> {
        let token = |t: &Option<String>| t.clone().unwrap_or_default();
        Self::new(source, &token(&self.bos_token), &token(&self.eos_token))
    }

    /// Reads `chat_template` (plus bos/eos) from `tokenizer_config.json`; `Ok(None)` if absent.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::config(path, e.to_string()))?;
        Self::from_tokenizer_config_value(&v, path)
    }

    /// [`Self::from_tokenizer_config`] for a document already parsed; `path` names it in errors.
    pub fn from_tokenizer_config_value(v: &serde_json::Value, path: &Path) -> Result<Option<Self>> {
        let source = match v.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            // A list of named templates: use the one called "default".
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
                .ok_or_else(|| ModelError::config(path, "chat_template list has no \"default\" entry"))?,
            Some(_) => return Err(ModelError::config(path, "chat_template is not a string")),
        };
        Self::new(&source, &token_string(v.get("bos_token")), &token_string(v.get("eos_token")))
            .map(Some)
            .map_err(|e| ModelError::config(path, e.to_string()))
    }

    /// Renders the messages into a prompt string (no tools).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_parts(messages, None, None, &BTreeMap::new(), add_generation_prompt)
    }

    /// Renders a whole conversation: messages, tools, documents and extra variables.
    pub fn render_conversation(&self, chat: &Conversation, add_generation_prompt: bool) -> Result<String> {
        self.render_parts(
            &chat.messages,
            chat.tools.as_deref(),
            chat.documents.as_deref(),
            &chat.kwargs,
            add_generation_prompt,
        )
    }

    fn render_parts(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[TemplateValue]>,
        documents: Option<&[TemplateValue]>,
        kwargs: &BTreeMap<String, TemplateValue>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        // transformers: the tokenizer's special tokens and the caller's kwargs, then the named
        // arguments; `tools` and `documents` are always defined (`None` when not given).
        let mut vars: BTreeMap<&str, TemplateValue> = BTreeMap::new();
        if let Some(t) = &self.bos_token {
            vars.insert("bos_token", t.as_str().into());
        }
        if let Some(t) = &self.eos_token {
            vars.insert("eos_token", t.as_str().into());
        }
        for (k, v) in kwargs {
            vars.insert(k, v.clone());
        }
        vars.insert("messages", TemplateValue::from_serialize(messages));
        vars.insert("tools", tools.map_or(TemplateValue::from(()), TemplateValue::from_serialize));
        vars.insert("documents", documents.map_or(TemplateValue::from(()), TemplateValue::from_serialize));
        vars.insert("add_generation_prompt", add_generation_prompt.into());
        tmpl.render(vars).map_err(render_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_messages_and_generation_prompt() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}\
             {% if add_generation_prompt %}<assistant>{% endif %}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(t.render(&msgs, true).unwrap(), "<user>hi</s><assistant>");
        assert_eq!(t.render(&msgs, false).unwrap(), "<user>hi</s>");
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], false).unwrap_err();
        assert!(matches!(&err, ModelError::ChatTemplateRaised(m) if m == "no system role"), "{err:?}");
    }

    #[test]
    fn python_string_and_dict_methods_work_as_in_transformers() {
        // The shapes of Llama 3 / Qwen / Mistral templates: strip, startswith, items, split.
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.content.startswith('!') %}[cmd]{% endif %}\
             {{ m.role.upper() }}:{{ m.content.strip() }}|{% endfor %}\
             {% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}\
             {{ 'x,y'.split(',') | length }}",
            "",
            "",
        )
        .unwrap();
        let msgs = [ChatMessage::new("user", "  hi  "), ChatMessage::new("assistant", "!go")];
        assert_eq!(t.render(&msgs, false).unwrap(), "USER:hi|[cmd]ASSISTANT:!go|a=12");
    }
}
