//! A call's base id: the client's `X-Request-Id` (or the body's `request_id`), checked, or a
//! random one; echoed in the response's `X-Request-Id`.

use axum::http::HeaderMap;
use axum::response::Response;

use crate::error::ApiError;

/// Longest `X-Request-Id` (or body `request_id`) taken.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The call's base id: the `X-Request-Id` header, else the body's `request_id`, else 32 random
/// hex digits (unique across restarts, unlike a counter). A given id must be visible ASCII of at
/// most 128 characters, as it is echoed in a header.
pub(crate) fn request_id(headers: &HeaderMap, body: Option<&str>) -> Result<String, ApiError> {
    let bad = |what: &str, param| {
        ApiError::bad_request(
            format!("{what} must be 1 to {MAX_REQUEST_ID_LEN} visible ASCII characters"),
            Some(param),
        )
    };
    let given = match headers.get(X_REQUEST_ID) {
        Some(v) => Some((v.to_str().map_err(|_| bad("X-Request-Id", "X-Request-Id"))?, "X-Request-Id")),
        None => body.map(|b| (b, "request_id")),
    };
    match given {
        Some((id, param)) => {
            if id.is_empty() || id.len() > MAX_REQUEST_ID_LEN || !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(param, param));
            }
            Ok(id.to_owned())
        }
        None => Ok(format!("{:032x}", rand::random::<u128>())),
    }
}

const X_REQUEST_ID: &str = "x-request-id";

/// The response with the call's base id in its `X-Request-Id` header.
pub(crate) fn with_request_id(mut response: Response, base: &str) -> Response {
    if let Ok(v) = axum::http::HeaderValue::from_str(base) {
        response.headers_mut().insert(X_REQUEST_ID, v);
    }
    response
}
