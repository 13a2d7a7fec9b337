//! The prompt of a completion or chat request, parsed as its endpoint parses it: what a
//! prefix-aware router in front of several servers tokenizes ([`engine::PromptTokenizer`])
//! and compares with the blocks each replica's KV events say it holds.

use engine::Prompt;
use serde::Deserialize;

use crate::openai::{ChatRequest, PromptInput};

/// The engine prompt of a `POST` to `path` with JSON `body` (a completion's first prompt when it
/// has several), or `None` for other routes and bodies the endpoint would refuse.
pub fn request_prompt(path: &str, body: &[u8]) -> Option<Prompt> {
    #[derive(Deserialize)]
    struct Completion {
        prompt: PromptInput,
    }
    let path = path.split('?').next().unwrap_or(path);
    match path {
        "/v1/completions" => {
            let request: Completion = serde_json::from_slice(body).ok()?;
            request.prompt.into_prompts().ok()?.into_iter().next()
        }
        "/v1/chat/completions" => serde_json::from_slice::<ChatRequest>(body).ok()?.prompt().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_chats_give_their_endpoints_prompts_and_others_none() {
        let text = request_prompt("/v1/completions", br#"{"prompt": ["a", "b"], "max_tokens": 3}"#);
        assert!(matches!(text, Some(Prompt::Text(t)) if t == "a"));
        let ids = request_prompt("/v1/completions?x=1", br#"{"prompt": [1, 2, 3]}"#);
        assert!(matches!(ids, Some(Prompt::Tokens(t)) if t == [1, 2, 3]));
        let chat =
            request_prompt("/v1/chat/completions", br#"{"messages": [{"role": "user", "content": "hi"}]}"#);
        assert!(matches!(chat, Some(Prompt::Chat(m)) if m.len() == 1));
        assert!(request_prompt("/v1/chat/completions", br#"{"messages": []}"#).is_none());
        assert!(request_prompt("/v1/embeddings", br#"{"input": "hi"}"#).is_none());
        assert!(request_prompt("/v1/completions", b"not json").is_none());
    }
}
