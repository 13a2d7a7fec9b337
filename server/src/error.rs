//! `ApiError`: every failure a client can see, in OpenAI's JSON shape
//! (`{"error": {"message", "type", "param", "code"}}`) with its HTTP status.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::RequestError;
use serde::Serialize;

/// A refused or failed API call.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// 400: a parameter outside its domain, a malformed body, a prompt that cannot be served.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param }
    }

    /// 500: the server failed, not the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into(), param: None }
    }

    pub fn model_not_found(asked: &str, served: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("the model {asked:?} does not exist; this server serves {served:?}"),
            param: Some("model"),
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid API key (send `Authorization: Bearer <key>`)".into(),
            param: None,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

/// Seconds a client told 429 (the waiting queue is full) should wait before retrying.
pub const RETRY_AFTER_SECS: u64 = 1;

/// vLLM's words for a request longer than the model (what LiteLLM and other clients map to a
/// context-window error). The sum is taken wide: both sizes come from the client.
fn context_overflow(prompt_len: usize, max_tokens: usize, max_model_len: usize) -> String {
    let total = prompt_len as u128 + max_tokens as u128;
    format!(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {total} tokens ({prompt_len} in the messages, {max_tokens} in the completion). Please \
         reduce the length of the messages or completion."
    )
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        if let RequestError::TooLong { prompt_len, max_tokens, max_model_len, .. } = e {
            return Self::bad_request(
                context_overflow(prompt_len, max_tokens, max_model_len),
                Some("max_tokens"),
            );
        }
        let (status, param) = match &e {
            RequestError::QueueFull { .. } => (StatusCode::TOO_MANY_REQUESTS, None),
            RequestError::EngineStopped => (StatusCode::SERVICE_UNAVAILABLE, None),
            RequestError::TooLong { .. } | RequestError::ExceedsKvCache { .. } => {
                (StatusCode::BAD_REQUEST, Some("max_tokens"))
            }
            RequestError::EmptyPrompt(_)
            | RequestError::TokenOutOfVocab { .. }
            | RequestError::Prompt { .. } => (StatusCode::BAD_REQUEST, Some("prompt")),
            RequestError::NoChatTemplate(_) => (StatusCode::BAD_REQUEST, Some("messages")),
            RequestError::LogitBiasOutOfVocab { .. } => (StatusCode::BAD_REQUEST, Some("logit_bias")),
            RequestError::Constraint { .. } => (StatusCode::BAD_REQUEST, Some("response_format")),
            RequestError::Pooling { .. } => (StatusCode::BAD_REQUEST, Some("dimensions")),
            RequestError::Lora { source: engine::LoraError::NotFound(_), .. } => {
                (StatusCode::NOT_FOUND, Some("model"))
            }
            RequestError::Lora { .. } => (StatusCode::BAD_REQUEST, Some("model")),
            _ => (StatusCode::BAD_REQUEST, None),
        };
        Self { status, message: e.to_string(), param }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        // A body over the limit is a 413 to axum; clients of this API get every malformed body
        // as a 400 with the reason.
        Self::bad_request(format!("invalid request body: {}", e.body_text()), None)
    }
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: u16,
}

impl ApiError {
    fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind(),
                param: self.param,
                code: self.status.as_u16(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        with_retry_after((self.status, Json(self.body())).into_response())
    }
}

/// An error response with `Retry-After` when it is a 429 (the waiting queue is full), in
/// whichever API's shape its body is.
pub fn with_retry_after(mut response: Response) -> Response {
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
}

/// An error as one SSE event's JSON (a stream that already sent its 200 reports this way).
pub fn error_event_json(message: &str) -> String {
    let error = ErrorDetail { message, kind: "server_error", param: None, code: 500 };
    // Strings and numbers only: serializing cannot fail.
    serde_json::to_string(&ErrorBody { error }).unwrap_or_default()
}

/// A handler's typed answer as a JSON 200, or its error in OpenAI's shape.
pub fn json_or_error<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_overflow_reads_as_vllm_words_it() {
        let e = ApiError::from(RequestError::TooLong {
            id: "x".into(),
            prompt_len: 500,
            max_tokens: usize::MAX,
            max_model_len: 512,
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let total = 500u128 + usize::MAX as u128;
        assert_eq!(
            e.message,
            format!(
                "This model's maximum context length is 512 tokens. However, you requested {total} tokens \
                 (500 in the messages, {} in the completion). Please reduce the length of the messages or \
                 completion.",
                usize::MAX
            )
        );
    }
}
