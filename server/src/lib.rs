//! `server`: an OpenAI-compatible HTTP server over the engine (axum on tokio).
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions` (JSON or SSE streams): `generate.rs`,
//!   request bodies and their checks in `openai.rs`, the output constraints' fields
//!   (`response_format`, `guided_*`, `logit_bias`…) in `structured.rs`, response shapes in
//!   `respond.rs`, tool calling (`tool_choice`, the calls parsed out of the text) in `tools.rs`.
//! - `POST /v1/responses`, `GET /v1/responses/{id}` (OpenAI's Responses API over the chat path,
//!   its stored responses bounded in memory): `responses/`.
//! - `POST /v1/messages` (Anthropic's Messages API over the chat path, its errors in
//!   Anthropic's shape, the key also from `x-api-key`): `anthropic/`.
//! - `GET /v1/models` (the base model and its LoRA adapters), `GET /health`, `POST /tokenize`,
//!   `POST /detokenize`: `info.rs`; `POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`:
//!   `lora.rs`.
//! - `GET /metrics` (Prometheus text, vLLM V1's names): `metrics.rs`.
//! - Fields beyond the typed ones (unknown: logged once and ignored; known but unimplemented:
//!   a 400): `fields.rs`.
//! - `GET /v1/kv_map`, `GET /v1/kv_map/stream` (SSE): the live KV block map, taken between
//!   engine steps only when asked; its JSON encoding is documented in `kv_map.rs`.
//! - `GET /v1/plan`, `POST /v1/plan`: the KV cache / VRAM calculator (the `sim` crate, as
//!   `paged-llm plan` runs it, sizes bounded): `plan.rs`.
//! - `GET /`, `/style.css` and the page's ES modules (`/app.js`, `/chat.js`, `/kv_map.js`,
//!   `/calculator.js`, `/shared.js`): the web page (chat, live KV map, calculator), embedded in
//!   the binary, outside `/v1` (no API key): `web.rs`, files in `server/web/`.
//! - Errors in OpenAI's JSON shape with their status (400, 401, 404, 429 with `Retry-After`):
//!   `error.rs`.
//! - Optional CORS (`--allowed-origins`), `X-Request-Id` honoured and echoed, SSE keep-alive
//!   comments at a configurable period.
//!
//! Invariants: no handler blocks a tokio worker — the engine runs on its own thread
//! ([`engine::EngineHandle`]), submissions never wait for a step and outputs arrive through
//! async streams; a response body owns its requests' streams, so a client that goes away
//! aborts its requests. `--api-key` guards the `/v1` routes (Bearer or `x-api-key`).

mod anthropic;
pub mod cli;
mod embeddings;
mod error;
mod fields;
mod folded;
mod generate;
mod info;
pub mod kv_map;
mod lora;
mod metrics;
mod openai;
pub mod plan;
mod reasoning;
mod request_id;
mod respond;
mod responses;
mod routing;
mod structured;
mod tools;
pub mod web;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use engine::{EngineHandle, ShutdownMode};

pub use error::ApiError;
pub use metrics::Metrics;
pub use reasoning::ReasoningParser;
pub use routing::request_prompt;
pub use structured::StructuredOutputsConfig;
pub use tools::ToolCallParser;

/// How the server behaves, beside the engine's own settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// When set, `/v1` routes need `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Largest request body accepted (a larger one is a 400).
    pub max_body_bytes: usize,
    /// What happens to in-flight requests on SIGINT/SIGTERM.
    pub shutdown: ShutdownMode,
    /// Default period of `GET /v1/kv_map/stream` (a client's `?interval_ms=` overrides it;
    /// either is clamped to 50 ms..10 s).
    pub kv_map_interval: std::time::Duration,
    /// Origins a browser may call the API from (CORS); `None` sends no CORS headers, `["*"]`
    /// allows any.
    pub allowed_origins: Option<Vec<String>>,
    /// Period of the SSE keep-alive comment on a quiet stream; `None` sends none.
    pub sse_keep_alive: Option<std::time::Duration>,
    /// How chat output is read for tool calls when the request has tools.
    pub tool_call_parser: ToolCallParser,
    /// How `/v1/embeddings` pools (a request's `dimensions` and `normalize` on top).
    pub pooler_config: engine::PoolingParams,
    /// Splits chat answers' reasoning into `reasoning_content` (none: all is content).
    pub reasoning_parser: Option<ReasoningParser>,
    /// `--structured-outputs-config`: whether a constraint covers the reasoning too.
    pub structured_outputs: StructuredOutputsConfig,
    /// Serves `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`): a client may then make the server read a folder.
    pub allow_runtime_lora_updating: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: 4 << 20,
            shutdown: ShutdownMode::Drain,
            kv_map_interval: std::time::Duration::from_millis(250),
            allowed_origins: None,
            sse_keep_alive: Some(std::time::Duration::from_secs(15)),
            tool_call_parser: ToolCallParser::Auto,
            pooler_config: engine::PoolingParams::default(),
            reasoning_parser: None,
            structured_outputs: StructuredOutputsConfig::default(),
            allow_runtime_lora_updating: false,
        }
    }
}

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    pub handle: EngineHandle,
    pub metrics: Metrics,
    api_key: Option<String>,
    kv_map_interval: std::time::Duration,
    sse_keep_alive: Option<std::time::Duration>,
    tool_call_parser: ToolCallParser,
    pooler_config: engine::PoolingParams,
    reasoning_parser: Option<ReasoningParser>,
    structured_outputs: StructuredOutputsConfig,
    allow_runtime_lora_updating: bool,
    /// One calculator simulation at a time (`plan.rs`).
    plan_slot: Arc<tokio::sync::Semaphore>,
    /// `/v1/responses`' stored responses.
    responses: responses::store::Store,
}

impl AppState {
    pub fn new(handle: EngineHandle, config: &ServerConfig) -> Result<Self, prometheus::Error> {
        let metrics = Metrics::new(handle.model_name(), handle.max_model_len())?;
        Ok(Self {
            handle,
            metrics,
            api_key: config.api_key.clone(),
            kv_map_interval: config.kv_map_interval,
            sse_keep_alive: config.sse_keep_alive,
            tool_call_parser: config.tool_call_parser,
            pooler_config: config.pooler_config,
            reasoning_parser: config.reasoning_parser,
            structured_outputs: config.structured_outputs,
            allow_runtime_lora_updating: config.allow_runtime_lora_updating,
            plan_slot: Arc::new(tokio::sync::Semaphore::new(1)),
            responses: responses::store::Store::default(),
        })
    }

    /// A request naming another model is a 404 (naming none takes the served one).
    fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        self.model_adapter(asked).map(|_| ())
    }

    /// What a request's `model` names: the base model (`None`, also when it names none), or
    /// one of the LoRA adapters registered (`--lora-modules`, `/v1/load_lora_adapter`); any
    /// other name is a 404.
    fn model_adapter(&self, asked: Option<&str>) -> Result<Option<engine::LoraRequest>, ApiError> {
        match asked {
            None => Ok(None),
            Some(m) if m == self.handle.model_name() => Ok(None),
            Some(m) if self.handle.loras().contains(m) => Ok(Some(engine::LoraRequest::named(m))),
            Some(m) => Err(ApiError::model_not_found(m, self.handle.model_name())),
        }
    }
}

/// A JSON body whose rejections (malformed, wrong types, too large) are OpenAI-shaped 400s.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    axum::Json<T>: FromRequest<S, Rejection = axum::extract::rejection::JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = axum::Json::<T>::from_request(req, state).await?;
        Ok(Self(value))
    }
}

/// Every route, with the body limit, (when configured) the API-key check on `/v1` and CORS.
pub fn router(state: Arc<AppState>, config: &ServerConfig) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(generate::generate::<openai::CompletionRequest>))
        .route("/v1/chat/completions", post(generate::generate::<openai::ChatRequest>))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route(anthropic::PATH, post(anthropic::messages))
        .route("/v1/models", get(info::models))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
        .route("/v1/kv_map", get(kv_map::kv_map))
        .route("/v1/kv_map/stream", get(kv_map::kv_map_stream))
        .route("/v1/plan", get(plan::presets).post(plan::plan))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    let app = web::routes(Router::new().merge(v1))
        .route("/health", get(info::health))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/metrics", get(info::metrics))
        .layer(DefaultBodyLimit::max(config.max_body_bytes));
    let app = match cors(config.allowed_origins.as_deref()) {
        Some(layer) => app.layer(layer),
        None => app,
    };
    app.with_state(state)
}

/// The CORS layer for `origins` (`*` allows any origin); none without the flag. A browser's
/// preflight is answered before the API-key check, as a preflight carries no credentials.
fn cors(origins: Option<&[String]>) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    let origins = origins?;
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| axum::http::HeaderValue::from_str(o).ok()))
    };
    Some(CorsLayer::new().allow_origin(allow).allow_methods(Any).allow_headers(Any).expose_headers(Any))
}

/// The key from `Authorization: Bearer <key>` or (Anthropic's clients) `x-api-key: <key>`;
/// a missing or wrong one is a 401 in the shape of the route's API.
async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let header = |name| req.headers().get(name).and_then(|v: &axum::http::HeaderValue| v.to_str().ok());
        let bearer = header(AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer "));
        if bearer != Some(key.as_str()) && header("x-api-key") != Some(key.as_str()) {
            return if req.uri().path() == anthropic::PATH {
                anthropic::error_response(&ApiError::unauthorized())
            } else {
                ApiError::unauthorized().into_response()
            };
        }
    }
    next.run(req).await
}

/// Serves until `shutdown` resolves: then stops accepting, lets in-flight responses finish
/// (`ShutdownMode::Drain`) or aborts their requests (`Abort`, each stream ends with an `abort`
/// finish), and stops the engine thread.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone(), config);
    let handle = state.handle.clone();
    let mode = config.shutdown;
    let signal = async move {
        shutdown.await;
        tracing::info!(target: "server", "shutting down ({mode:?})");
        if mode == ShutdownMode::Abort {
            // Joining the engine thread blocks: keep it off the async workers.
            let h = handle.clone();
            let _ = tokio::task::spawn_blocking(move || h.shutdown(ShutdownMode::Abort)).await;
        }
    };
    axum::serve(listener, app).with_graceful_shutdown(signal).await?;
    let h = state.handle.clone();
    let _ = tokio::task::spawn_blocking(move || h.shutdown(ShutdownMode::Drain)).await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Starts the engine thread, binds `host:port` and serves until SIGINT/SIGTERM, on a tokio
/// runtime of its own (what `paged-llm serve` runs).
pub fn run_until_signal(
    engine: engine::Engine,
    args: &cli::ServeArgs,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = args.server_config();
    for module in &args.lora_modules {
        engine
            .loras()
            .load(&module.name, &module.path)
            .map_err(|e| format!("--lora-modules {}={}: {e}", module.name, module.path.display()))?;
    }
    let handle = EngineHandle::spawn(engine)?;
    let state = Arc::new(AppState::new(handle, &config)?);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
        let addr = listener.local_addr()?;
        tracing::info!(target: "server", "serving {} on http://{addr}", state.handle.model_name());
        eprintln!("server: listening on http://{addr} (model {:?})", state.handle.model_name());
        serve(listener, state, &config, shutdown_signal()).await
    })?;
    Ok(())
}
