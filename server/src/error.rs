//! `ApiError`: every failure a client can see, in OpenAI's JSON shape
//! (`{"error": {"message", "type", "param", "code"}}`) with its HTTP status.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
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

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
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
        (self.status, Json(self.body())).into_response()
    }
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
