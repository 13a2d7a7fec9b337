//! Chat templates (`chat_template` in `tokenizer_config.json`), rendered with `minijinja`
//! the way `transformers`' `apply_chat_template` does: `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, a `raise_exception` function, and Python's string, list and dict
//! methods (`minijinja_contrib::pycompat`) that many templates call.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// Special tokens in `tokenizer_config.json` are either a string or an `AddedToken` object.
fn token_string(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(obj) => obj.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_owned(),
        None => String::new(),
    }
}

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        // HF templates are Jinja as Python runs it: `.strip()`, `.startswith()`, `.items()`, …
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        Ok(Self { env, bos_token: bos_token.to_owned(), eos_token: eos_token.to_owned() })
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

    /// Renders the messages into a prompt string.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| ModelError::ChatTemplate(e.to_string()))
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
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
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
