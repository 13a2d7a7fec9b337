//! Prompt → token ids as admission computes them ([`tokenize`]), and [`PromptTokenizer`]: the
//! same from a model's text side alone (tokenizer, chat template; no weights), for a router
//! that compares a request's blocks with what a replica's prefix cache holds.

use std::path::Path;

use model::{ChatTemplate, ModelFolder, Tokenizer};

use crate::error::{EngineError, RequestError};
use crate::request::Prompt;

/// Renders chat messages with `template` (generation prompt added).
pub(crate) fn render_chat(
    template: Option<&ChatTemplate>,
    id: &str,
    messages: &[model::ChatMessage],
) -> Result<String, RequestError> {
    let template = template.ok_or_else(|| RequestError::NoChatTemplate(id.to_owned()))?;
    template
        .render(messages, true)
        .map_err(|e| RequestError::Prompt { id: id.to_owned(), reason: e.to_string() })
}

/// Renders a conversation (messages plus tools, documents, template variables) with `template`
/// (generation prompt added).
pub(crate) fn render_conversation(
    template: Option<&ChatTemplate>,
    id: &str,
    chat: &model::Conversation,
) -> Result<String, RequestError> {
    let template = template.ok_or_else(|| RequestError::NoChatTemplate(id.to_owned()))?;
    template
        .render_conversation(chat, true)
        .map_err(|e| RequestError::Prompt { id: id.to_owned(), reason: e.to_string() })
}

/// Prompt to token ids: text with the tokenizer's special tokens (BOS) added, chat rendered
/// by the template (which writes its own special tokens), ids as given.
pub(crate) fn tokenize(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    id: &str,
    prompt: Prompt,
) -> Result<Vec<u32>, RequestError> {
    let encode = |text: &str, add_special: bool| {
        tokenizer
            .encode(text, true, add_special)
            .map_err(|e| RequestError::Prompt { id: id.to_owned(), reason: e.to_string() })
    };
    match prompt {
        Prompt::Tokens(ids) => Ok(ids),
        Prompt::Text(text) => encode(&text, true),
        Prompt::Chat(messages) => encode(&render_chat(template, id, &messages)?, false),
        Prompt::Conversation(chat) => encode(&render_conversation(template, id, &chat)?, false),
    }
}

/// A model's prompts to token ids exactly as the engine's admission makes them, without
/// loading its weights.
#[derive(Debug)]
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
}

impl PromptTokenizer {
    /// Reads the text side of an HF model folder or a GGUF file (as `Engine::new` does).
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        let folder = ModelFolder::open(path)?;
        Ok(Self { tokenizer: folder.tokenizer, chat_template: folder.chat_template })
    }

    /// The token ids a request with `prompt` is admitted with.
    pub fn tokenize(&self, prompt: Prompt) -> Result<Vec<u32>, RequestError> {
        tokenize(&self.tokenizer, self.chat_template.as_ref(), "tokenize", prompt)
    }
}
