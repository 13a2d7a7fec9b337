//! The small routes: `GET /v1/models`, `GET /health`, `POST /tokenize`, `POST /detokenize`
//! (vLLM's shapes) and `GET /metrics`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::Prompt;
use serde::{Deserialize, Serialize};

use crate::error::json_or_error;
use crate::openai::ChatMessageInput;
use crate::{ApiError, AppState, JsonBody};

/// `GET /v1/models`: OpenAI's model list, with vLLM's `root`, `parent` and `max_model_len`: the
/// base model, then each LoRA adapter (its `parent` the base, its `root` its folder).
#[derive(Debug, Serialize)]
pub struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

#[derive(Debug, Serialize)]
struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: String,
    parent: Option<String>,
    max_model_len: usize,
}

pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let h = &state.handle;
    let card = |id: &str, root: String, parent: Option<String>| ModelCard {
        id: id.to_owned(),
        object: "model",
        created: crate::unix_now(),
        owned_by: "paged-engine",
        root,
        parent,
        max_model_len: h.max_model_len(),
    };
    let base = h.model_name();
    let mut data = vec![card(base, base.to_owned(), None)];
    for lora in h.loras().list() {
        data.push(card(&lora.name, lora.path.display().to_string(), Some(base.to_owned())));
    }
    Json(ModelList { object: "list", data }).into_response()
}

pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// `POST /tokenize`: a prompt (`add_special_tokens`, default true) or chat messages
/// (rendered with the model's template, with `chat_template_kwargs` as its extra variables).
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageInput>>,
    add_special_tokens: Option<bool>,
    chat_template_kwargs: Option<std::collections::BTreeMap<String, engine::TemplateValue>>,
}

/// vLLM's `/tokenize` answer.
#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    count: usize,
    max_model_len: usize,
    tokens: Vec<u32>,
}

/// vLLM's `/detokenize` answer.
#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    prompt: String,
}

pub async fn tokenize(State(state): State<Arc<AppState>>, body: JsonBody<TokenizeRequest>) -> Response {
    let req = body.0;
    if let Err(e) = state.check_model(req.model.as_deref()) {
        return e.into_response();
    }
    // Rendering and tokenizing a large body takes a while: off the async workers.
    let run = move || -> Result<TokenizeResponse, ApiError> {
        let h = &state.handle;
        let tokens = match (&req.prompt, &req.messages) {
            (Some(text), None) if req.add_special_tokens.unwrap_or(true) => {
                h.tokenize(Prompt::Text(text.clone()))?
            }
            (Some(text), None) => h
                .tokenizer()
                .encode(text, true, false)
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))?,
            (None, Some(messages)) => {
                let messages = crate::openai::chat_messages(messages)?;
                h.tokenize(match req.chat_template_kwargs {
                    None => Prompt::Chat(messages),
                    Some(kwargs) => {
                        Prompt::Conversation(engine::Conversation { messages, kwargs, ..Default::default() })
                    }
                })?
            }
            _ => {
                return Err(ApiError::bad_request("give exactly one of prompt and messages", Some("prompt")));
            }
        };
        Ok(TokenizeResponse { count: tokens.len(), max_model_len: h.max_model_len(), tokens })
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(result) => json_or_error(result),
        Err(e) => ApiError::internal(format!("tokenize failed: {e}")).into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn detokenize(State(state): State<Arc<AppState>>, body: JsonBody<DetokenizeRequest>) -> Response {
    let req = body.0;
    if let Err(e) = state.check_model(req.model.as_deref()) {
        return e.into_response();
    }
    let run = move || -> Result<DetokenizeResponse, ApiError> {
        let tokenizer = state.handle.tokenizer();
        if let Some(&bad) = req.tokens.iter().find(|&&t| t as usize >= tokenizer.vocab_size()) {
            return Err(ApiError::bad_request(
                format!("token id {bad} is outside the vocabulary"),
                Some("tokens"),
            ));
        }
        let text =
            tokenizer.decode(&req.tokens, false).map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        Ok(DetokenizeResponse { prompt: text })
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(result) => json_or_error(result),
        Err(e) => ApiError::internal(format!("detokenize failed: {e}")).into_response(),
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let loras = state.handle.loras();
    let listed = loras.config().map(|c| (c.max_loras, loras.list()));
    let text = state.metrics.render_with_loras(
        &state.handle.live_metrics(),
        listed.as_ref().map(|(max, l)| (*max, l.as_slice())),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
