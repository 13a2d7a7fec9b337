//! `POST /v1/embeddings` (OpenAI's shape, vLLM's extras): each input becomes one pooling
//! request through the same engine, scheduler and admission as a completion (prefill only, its
//! blocks freed when the prompt is done), pooled as the server's `--pooler-config` says;
//! `dimensions` cuts the vector before it is normalised. The answer waits for every input; a
//! client that disconnects drops the streams, and the engine aborts the requests.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use engine::{OutputStream, PoolingParams, RequestOptions, SamplingParams};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::error::ApiError;
use crate::openai::PromptInput;

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// A string, a list of strings, a list of token ids, or a list of such lists.
    pub input: PromptInput,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// Keep the first this many values of each vector (then normalised, when it is).
    #[serde(default)]
    pub dimensions: Option<i64>,
    /// OpenAI's end-user tag: accepted, not used.
    #[serde(default, rename = "user")]
    _user: Option<String>,
    /// vLLM's: whether the vector is L2-normalised (the pooler config's choice when unset).
    #[serde(default)]
    pub normalize: Option<bool>,
    /// vLLM's: the call's id (else `X-Request-Id`, else a random one).
    #[serde(default)]
    pub request_id: Option<String>,
    /// vLLM's scheduling priority (under `--scheduling-policy priority`).
    #[serde(default)]
    pub priority: Option<i64>,
}

/// How the vectors are written: JSON numbers, or the little-endian f32 bytes in base64 (what
/// openai-python asks for unless told otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

#[derive(Debug, Serialize)]
struct EmbeddingResponse {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    data: Vec<EmbeddingData>,
    usage: EmbeddingUsage,
}

#[derive(Debug, Serialize)]
struct EmbeddingData {
    object: &'static str,
    index: usize,
    embedding: EmbeddingValue,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum EmbeddingValue {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
struct EmbeddingUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: crate::JsonBody<EmbeddingRequest>,
) -> Response {
    let req = body.0;
    let base = match crate::request_id::request_id(&headers, req.request_id.as_deref()) {
        Ok(base) => base,
        Err(e) => return e.into_response(),
    };
    let response = match state.model_adapter(req.model.as_deref()) {
        Ok(lora) => respond(state, req, lora, &base).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    };
    crate::request_id::with_request_id(response, &base)
}

/// The call's pooling: the server's pooler config with the request's `dimensions` and
/// `normalize` on top.
fn pooling_of(state: &AppState, req: &EmbeddingRequest) -> Result<PoolingParams, ApiError> {
    let mut pooling = state.pooler_config;
    if let Some(d) = req.dimensions {
        let d = usize::try_from(d).ok().filter(|&d| d > 0).ok_or_else(|| {
            ApiError::bad_request("dimensions must be a positive integer", Some("dimensions"))
        })?;
        pooling.dimensions = Some(d);
    }
    if let Some(normalize) = req.normalize {
        pooling.normalize = normalize;
    }
    Ok(pooling)
}

async fn respond(
    state: Arc<AppState>,
    req: EmbeddingRequest,
    lora: Option<engine::LoraRequest>,
    base: &str,
) -> Result<Response, ApiError> {
    let pooling = pooling_of(&state, &req)?;
    let mut options =
        RequestOptions { lora: lora.clone(), ..RequestOptions::default() }.with_pooling(pooling);
    if let Some(priority) = req.priority {
        options = options.with_priority(priority);
    }
    let format = req.encoding_format;
    let prompts = req.input.into_prompts_of("input")?;
    let id = format!("embd-{base}");
    let submitting = Arc::clone(&state);
    let call_id = id.clone();
    // Tokenizing runs on a blocking thread, never on a tokio worker.
    let streams = tokio::task::spawn_blocking(move || {
        let call = submitting.handle.next_request_id();
        let mut streams: Vec<OutputStream> = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.into_iter().enumerate() {
            // On an error, dropping `streams` aborts the requests already submitted.
            let request = format!("{call_id}-{call}-{i}");
            streams.push(submitting.handle.submit(
                request,
                prompt,
                SamplingParams::greedy(1),
                options.clone(),
            )?);
        }
        Ok::<_, engine::RequestError>(streams)
    })
    .await
    .map_err(|e| ApiError::internal(format!("submission failed: {e}")))??;
    let mut data = Vec::with_capacity(streams.len());
    let mut prompt_tokens = 0usize;
    for (index, mut stream) in streams.into_iter().enumerate() {
        let mut embedding = None;
        while let Some(item) = stream.next().await {
            let out = item.map_err(crate::generate::stream_error)?;
            state.metrics.observe(&out, crate::metrics::Api::Embeddings);
            if out.finished {
                prompt_tokens = prompt_tokens.saturating_add(out.prompt_tokens);
                embedding = out.embedding;
            }
        }
        let vector =
            embedding.ok_or_else(|| ApiError::internal("a pooling request ended without its embedding"))?;
        data.push(EmbeddingData { object: "embedding", index, embedding: encode(vector, format) });
    }
    let body = EmbeddingResponse {
        id,
        object: "list",
        created: crate::unix_now(),
        model: lora.map_or_else(|| state.handle.model_name().to_owned(), |l| l.name),
        data,
        usage: EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens },
    };
    Ok(Json(body).into_response())
}

fn encode(vector: Vec<f32>, format: EncodingFormat) -> EmbeddingValue {
    match format {
        EncodingFormat::Float => EmbeddingValue::Float(vector),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
            EmbeddingValue::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use engine::Prompt;

    use super::*;

    #[test]
    fn every_input_shape_parses_and_an_empty_list_is_refused() {
        let parse =
            |s: &str| serde_json::from_str::<EmbeddingRequest>(s).map(|r| r.input.into_prompts_of("input"));
        assert_eq!(parse(r#"{"input": "a"}"#).unwrap().unwrap(), vec![Prompt::Text("a".into())]);
        assert_eq!(parse(r#"{"input": ["a", "b"]}"#).unwrap().unwrap().len(), 2);
        assert_eq!(parse(r#"{"input": [1, 2, 3]}"#).unwrap().unwrap(), vec![Prompt::Tokens(vec![1, 2, 3])]);
        assert_eq!(parse(r#"{"input": [[1], [2, 3]]}"#).unwrap().unwrap().len(), 2);
        assert!(parse(r#"{"input": []}"#).unwrap().is_err());
        assert!(parse(r#"{"input": "a", "temperature": 1}"#).is_err(), "unknown fields are refused");
    }

    #[test]
    fn base64_is_the_little_endian_f32_bytes() {
        let EmbeddingValue::Base64(s) = encode(vec![1.0, -2.5], EncodingFormat::Base64) else { panic!() };
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        let back: Vec<f32> =
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(back, vec![1.0, -2.5]);
    }
}
