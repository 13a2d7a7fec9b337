//! vLLM's dynamic LoRA endpoints: `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`)
//! and `POST /v1/unload_lora_adapter` (`{"lora_name"}`), behind the API key and, as vLLM's
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, only when the server was started with
//! `--allow-runtime-lora-updating`: a request names a folder on the server's disk. Loading reads
//! and checks the adapter on a blocking thread; the answers are vLLM's plain-text successes and
//! OpenAI-shaped errors.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use engine::LoraError;
use serde::Deserialize;

use crate::{ApiError, AppState, JsonBody};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadRequest {
    lora_name: String,
    lora_path: PathBuf,
    /// vLLM's: replace an adapter of the same name in place.
    #[serde(default)]
    load_inplace: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnloadRequest {
    lora_name: String,
    /// vLLM's; the name alone identifies an adapter here.
    #[serde(default)]
    #[allow(dead_code)]
    lora_int_id: Option<u64>,
}

/// The status and message of a registry refusal.
pub(crate) fn api_error(e: &LoraError) -> ApiError {
    let status = match e {
        LoraError::NotFound(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError { status, message: e.to_string(), param: Some("lora_name") }
}

fn allowed(state: &AppState) -> Result<(), ApiError> {
    if state.allow_runtime_lora_updating {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::NOT_FOUND,
        message: "runtime LoRA updating is off: start the server with --allow-runtime-lora-updating \
                  (or PAGED_LLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
            .into(),
        param: None,
    })
}

pub(crate) async fn load(State(state): State<Arc<AppState>>, body: JsonBody<LoadRequest>) -> Response {
    let LoadRequest { lora_name, lora_path, load_inplace } = body.0;
    if let Err(e) = allowed(&state) {
        return e.into_response();
    }
    let handle = state.handle.clone();
    let name = lora_name.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let loras = handle.loras();
        if load_inplace && loras.contains(&name) {
            // Requests under the old weights finish with them.
            loras.unload(&name)?;
        }
        loras.load(&name, &lora_path)
    })
    .await;
    match loaded {
        Ok(Ok(_)) => format!("Success: LoRA adapter '{lora_name}' added successfully.").into_response(),
        Ok(Err(e)) => api_error(&e).into_response(),
        Err(e) => ApiError::internal(format!("loading the adapter failed: {e}")).into_response(),
    }
}

pub(crate) async fn unload(State(state): State<Arc<AppState>>, body: JsonBody<UnloadRequest>) -> Response {
    if let Err(e) = allowed(&state) {
        return e.into_response();
    }
    let name = body.0.lora_name;
    match state.handle.loras().unload(&name) {
        Ok(_) => format!("Success: LoRA adapter '{name}' removed successfully.").into_response(),
        Err(e) => api_error(&e).into_response(),
    }
}
