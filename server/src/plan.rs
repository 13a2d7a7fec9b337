//! `POST /v1/plan` and `GET /v1/plan`: the KV cache / VRAM calculator behind the web page's
//! calculator panel — the `sim` crate run exactly as `paged-llm plan` runs it (model shape,
//! memory budget, block size, a synthetic trace through the real scheduler and the contiguous
//! baselines), with every client-supplied size bounded so that one call stays short.
//!
//! `GET /v1/plan` lists the presets (`sim::ModelShape`, `sim::Hardware`, `sim::TraceShape`) and
//! the bounds; `POST /v1/plan` takes a JSON body of optional fields (a preset and overrides) and
//! answers the sizes (KV bytes per token, token slots, blocks), the static "sequences that fit"
//! (contiguous reservations of `max_model_len` vs paged blocks of the trace's mean length), each
//! system's simulated summary and the paged time series. A bad size is a 400 naming the field
//! (`PlanError`). One simulation runs at a time, on a blocking thread.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use engine::PreemptionMode;
use serde::{Deserialize, Serialize};
use sim::{CostModel, Hardware, ModelShape, SimSetup, Trace, TraceShape};

use crate::{ApiError, AppState, JsonBody};

/// The names of the model presets `sim` knows (`ModelShape::PRESETS`).
pub fn model_presets() -> Vec<&'static str> {
    ModelShape::PRESETS.iter().map(|m| m.name).collect()
}

/// The names of the accelerators `sim` knows (`Hardware::PRESETS`).
pub fn hardware_presets() -> Vec<&'static str> {
    Hardware::PRESETS.iter().map(|h| h.name).collect()
}

/// The names of the synthetic traces `sim` knows (`TraceShape::PRESETS`).
pub fn trace_presets() -> Vec<&'static str> {
    TraceShape::PRESETS.iter().map(|t| t.name).collect()
}

/// Bounds on what a client may ask for: together they keep one simulation well under a second
/// or two (its steps grow with the trace's tokens, its pool with the blocks).
pub const MAX_REQUESTS: usize = 2000;
pub const MAX_MODEL_LEN: usize = 32_768;
pub const MAX_BLOCKS: usize = 1 << 20;
pub const MAX_BLOCK_SIZE: usize = 256;
pub const MAX_NUM_SEQS: usize = 2048;
pub const MAX_BATCHED_TOKENS: usize = 65_536;
pub const MAX_DIM: usize = 4096;
pub const MAX_PARAMS: f64 = 1e13;
pub const MAX_MEMORY_GIB: f64 = 100_000.0;
pub const MAX_POINTS: usize = 500;

const GIB: f64 = (1u64 << 30) as f64;

/// The body of `POST /v1/plan`; every field optional (defaults are `paged-llm plan`'s).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// Model preset (`opt-13b`, `llama2-7b`, `smollm2-135m`); the shape fields override parts.
    pub model: Option<String>,
    pub layers: Option<usize>,
    pub kv_heads: Option<usize>,
    pub head_dim: Option<usize>,
    /// Parameter count (weights), e.g. 7e9.
    pub params: Option<f64>,
    /// Bytes per weight and KV element: 1, 2 or 4.
    pub dtype_bytes: Option<usize>,
    /// The KV cache's element type when it is not the weights', vLLM's names (`int8`, `fp8`,
    /// `bf16`…; `auto`: the engine's, bf16).
    pub kv_cache_dtype: Option<String>,
    /// Layers that attend over a sliding window, and its tokens (0 layers: none).
    pub sliding_layers: Option<usize>,
    pub sliding_window: Option<usize>,
    /// Accelerator preset for the cost model (`a100-40gb`, `h200`).
    pub hardware: Option<String>,
    /// The accelerator's memory in GiB (overrides the preset's).
    pub gpu_memory_gib: Option<f64>,
    /// KV cache memory in GiB (default: memory × utilization − weights).
    pub kv_memory_gib: Option<f64>,
    pub gpu_memory_utilization: Option<f64>,
    pub block_size: Option<usize>,
    /// `sharegpt` or `alpaca`.
    pub trace: Option<String>,
    pub num_requests: Option<usize>,
    /// Poisson arrivals per second; absent or null: all at once.
    pub rate: Option<f64>,
    pub seed: Option<u64>,
    pub max_model_len: Option<usize>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    /// `recompute` or `swap`.
    pub preemption: Option<String>,
    pub swap_gib: Option<f64>,
    pub watermark: Option<f64>,
    /// Points of the returned paged time series.
    pub points: Option<usize>,
}

/// Why a plan was refused: each names the request field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown {field} {value:?} (one of: {known})")]
    Unknown { field: &'static str, value: String, known: String },
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange { field: &'static str, value: String, min: String, max: String },
    #[error("dtype_bytes must be 1, 2 or 4, got {0}")]
    DtypeBytes(usize),
    #[error("the model's KV bytes per token overflow")]
    KvBytesOverflow,
    #[error("{model} weights ({weights_gb:.1} GB) do not fit {memory_gb:.1} GB at utilization {utilization}")]
    WeightsDoNotFit { model: String, weights_gb: f64, memory_gb: f64, utilization: f64 },
    #[error("KV memory holds {tokens} tokens: not even one block of {block_size}")]
    NoBlock { tokens: usize, block_size: usize },
    #[error(
        "KV memory holds {blocks} blocks of {block_size}; the calculator simulates at most {max} (raise block_size or lower the memory)"
    )]
    TooManyBlocks { blocks: usize, block_size: usize, max: usize },
    #[error("max_num_batched_tokens ({batched}) must be at least max_model_len ({max_model_len})")]
    BatchBelowModelLen { batched: usize, max_model_len: usize },
    #[error("simulation failed: {0}")]
    Sim(String),
}

impl PlanError {
    /// The request field at fault.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::Unknown { field, .. } | Self::OutOfRange { field, .. } => Some(field),
            Self::DtypeBytes(_) | Self::KvBytesOverflow => Some("dtype_bytes"),
            Self::WeightsDoNotFit { .. } => Some("gpu_memory_gib"),
            Self::NoBlock { .. } | Self::TooManyBlocks { .. } => Some("block_size"),
            Self::BatchBelowModelLen { .. } => Some("max_num_batched_tokens"),
            Self::Sim(_) => None,
        }
    }
}

impl From<PlanError> for ApiError {
    fn from(e: PlanError) -> Self {
        ApiError::bad_request(e.to_string(), e.param())
    }
}

/// `value` if it lies in `min..=max` (a NaN never does), else the error naming `field`.
fn in_range<T: PartialOrd + ToString>(field: &'static str, value: T, min: T, max: T) -> Result<T, PlanError> {
    if value >= min && value <= max {
        Ok(value)
    } else {
        Err(PlanError::OutOfRange {
            field,
            value: value.to_string(),
            min: min.to_string(),
            max: max.to_string(),
        })
    }
}

fn int_in(field: &'static str, value: usize, min: usize, max: usize) -> Result<usize, PlanError> {
    in_range(field, value, min, max)
}

/// As [`int_in`]; with finite bounds, infinities and NaN are out of range.
fn float_in(field: &'static str, value: f64, min: f64, max: f64) -> Result<f64, PlanError> {
    in_range(field, value, min, max)
}

fn unknown(field: &'static str, value: &str, known: &[&str]) -> PlanError {
    PlanError::Unknown { field, value: value.to_owned(), known: known.join(", ") }
}

/// A validated plan: everything `sim` needs, sizes checked.
#[derive(Debug, Clone)]
pub struct Plan {
    pub model: ModelShape,
    pub hardware: Hardware,
    pub kv_bytes_per_token: usize,
    pub setup: SimSetup,
    pub trace_name: &'static str,
    pub trace: Trace,
    pub rate: f64,
    pub points: usize,
}

impl PlanRequest {
    /// Checks every field and sizes the KV memory as `paged-llm plan` does.
    pub fn validate(&self) -> Result<Plan, PlanError> {
        let model_name = self.model.as_deref().unwrap_or("opt-13b");
        let mut model =
            ModelShape::by_name(model_name).ok_or_else(|| unknown("model", model_name, &model_presets()))?;
        if let Some(v) = self.layers {
            model.num_layers = int_in("layers", v, 1, MAX_DIM)?;
        }
        if let Some(v) = self.kv_heads {
            model.num_kv_heads = int_in("kv_heads", v, 1, MAX_DIM)?;
        }
        if let Some(v) = self.head_dim {
            model.head_dim = int_in("head_dim", v, 1, MAX_DIM)?;
        }
        if let Some(v) = self.params {
            model.num_params = float_in("params", v, 0.0, MAX_PARAMS)?;
        }
        if let Some(v) = self.dtype_bytes {
            if ![1, 2, 4].contains(&v) {
                return Err(PlanError::DtypeBytes(v));
            }
            model.dtype_bytes = v;
        }
        if let Some(name) = &self.kv_cache_dtype {
            let kinds = &engine::config::KV_DTYPE;
            model.kv_dtype = Some(
                kinds
                    .parse(name)
                    .ok_or_else(|| unknown("kv_cache_dtype", name, &kinds.names().collect::<Vec<_>>()))?,
            );
        }
        if let Some(v) = self.sliding_layers {
            model.sliding_layers = int_in("sliding_layers", v, 0, model.num_layers)?;
        }
        if let Some(v) = self.sliding_window {
            model.sliding_window = int_in("sliding_window", v, 1, MAX_MODEL_LEN)?;
        }
        model.sliding_layers = model.sliding_layers.min(model.num_layers);
        if self.layers.is_some()
            || self.sliding_layers.is_some()
            || self.sliding_window.is_some()
            || self.kv_heads.is_some()
            || self.head_dim.is_some()
            || self.params.is_some()
            || self.dtype_bytes.is_some()
        {
            model.name = "custom";
        }
        // `ModelShape::kv_bytes_per_token` multiplies unchecked: check the product first (8 bytes
        // an element bounds every dtype's key and value with their scales).
        let per_head = model
            .head_dim
            .checked_mul(8)
            .map(|_| model.kv_bytes_per_head())
            .ok_or(PlanError::KvBytesOverflow)?;
        let kv_bytes_per_token = [model.num_layers, model.num_kv_heads, per_head]
            .into_iter()
            .try_fold(1usize, usize::checked_mul)
            .ok_or(PlanError::KvBytesOverflow)?;

        let hw_name = self.hardware.as_deref().unwrap_or("a100-40gb");
        let mut hardware =
            Hardware::by_name(hw_name).ok_or_else(|| unknown("hardware", hw_name, &hardware_presets()))?;
        if let Some(gib) = self.gpu_memory_gib {
            hardware.memory_bytes = float_in("gpu_memory_gib", gib, 0.01, MAX_MEMORY_GIB)? * GIB;
        }
        let utilization =
            float_in("gpu_memory_utilization", self.gpu_memory_utilization.unwrap_or(0.9), 0.01, 1.0)?;
        let block_size = int_in("block_size", self.block_size.unwrap_or(16), 1, MAX_BLOCK_SIZE)?;
        let max_model_len = int_in("max_model_len", self.max_model_len.unwrap_or(2048), 2, MAX_MODEL_LEN)?;
        let max_num_seqs = int_in("max_num_seqs", self.max_num_seqs.unwrap_or(256), 1, MAX_NUM_SEQS)?;
        let batched = int_in(
            "max_num_batched_tokens",
            self.max_num_batched_tokens.unwrap_or(max_model_len.max(2048)),
            1,
            MAX_BATCHED_TOKENS,
        )?;
        if batched < max_model_len {
            return Err(PlanError::BatchBelowModelLen { batched, max_model_len });
        }
        let watermark = float_in("watermark", self.watermark.unwrap_or(0.01), 0.0, 0.5)?;

        let kv_tokens = match self.kv_memory_gib {
            Some(gib) => model.kv_token_slots(float_in("kv_memory_gib", gib, 0.0, MAX_MEMORY_GIB)? * GIB),
            None => model.kv_tokens_on(&hardware, utilization).ok_or_else(|| PlanError::WeightsDoNotFit {
                model: model.name.to_owned(),
                weights_gb: model.weight_bytes() / 1e9,
                memory_gb: hardware.memory_bytes / 1e9,
                utilization,
            })?,
        };
        if kv_tokens < block_size {
            return Err(PlanError::NoBlock { tokens: kv_tokens, block_size });
        }
        let blocks = kv_tokens / block_size;
        if blocks > MAX_BLOCKS {
            return Err(PlanError::TooManyBlocks { blocks, block_size, max: MAX_BLOCKS });
        }
        let preemption = match self.preemption.as_deref().unwrap_or("recompute") {
            "recompute" => PreemptionMode::Recompute,
            "swap" => PreemptionMode::Swap,
            other => return Err(unknown("preemption", other, &["recompute", "swap"])),
        };
        let swap_tokens = if preemption == PreemptionMode::Swap {
            let gib = float_in("swap_gib", self.swap_gib.unwrap_or(4.0), 0.0, MAX_MEMORY_GIB)?;
            let tokens = model.kv_token_slots(gib * GIB);
            if tokens / block_size > MAX_BLOCKS {
                return Err(PlanError::OutOfRange {
                    field: "swap_gib",
                    value: gib.to_string(),
                    min: "0".into(),
                    max: format!("{} blocks", MAX_BLOCKS),
                });
            }
            tokens
        } else {
            0
        };
        let setup = SimSetup {
            capacity_tokens: kv_tokens,
            block_size,
            max_model_len,
            max_num_seqs,
            max_num_batched_tokens: batched,
            watermark,
            preemption,
            swap_tokens,
            baseline_placement: sim::Placement::Buddy,
            kv_groups: sim::KvGroups::of(&model),
        };

        let trace_name = self.trace.as_deref().unwrap_or("sharegpt");
        let shape =
            TraceShape::by_name(trace_name).ok_or_else(|| unknown("trace", trace_name, &trace_presets()))?;
        let num_requests = int_in("num_requests", self.num_requests.unwrap_or(1000), 1, MAX_REQUESTS)?;
        let rate = match self.rate {
            None => f64::INFINITY,
            Some(r) => float_in("rate", r, 0.001, 1e6)?,
        };
        let points = int_in("points", self.points.unwrap_or(60), 1, MAX_POINTS)?;
        let trace = Trace::synthetic(shape, num_requests, rate, max_model_len, self.seed.unwrap_or(0));
        Ok(Plan { model, hardware, kv_bytes_per_token, setup, trace_name: shape.name, trace, rate, points })
    }
}

/// A model's shape as the calculator reports it (a preset, or the model of a plan).
#[derive(Debug, Serialize)]
pub struct ModelJson {
    name: &'static str,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    params: f64,
    dtype_bytes: usize,
    /// The KV cache's type when it is not the weights' (`null`: the weights').
    kv_cache_dtype: Option<&'static str>,
    sliding_layers: usize,
    sliding_window: usize,
}

impl From<&ModelShape> for ModelJson {
    fn from(m: &ModelShape) -> Self {
        Self {
            name: m.name,
            layers: m.num_layers,
            kv_heads: m.num_kv_heads,
            head_dim: m.head_dim,
            params: m.num_params,
            dtype_bytes: m.dtype_bytes,
            kv_cache_dtype: m.kv_dtype.map(|d| d.name()),
            sliding_layers: m.sliding_layers,
            sliding_window: m.sliding_window,
        }
    }
}

/// `POST /v1/plan`'s answer: the setup, the static capacity and every system's simulation.
/// JSON has no NaN or infinity: a figure that is not finite is `null`.
#[derive(Debug, Serialize)]
pub struct PlanJson {
    model: ModelJson,
    hardware: &'static str,
    gpu_memory_gib: f64,
    weights_gib: f64,
    kv_bytes_per_token: usize,
    kv_memory_gib: f64,
    kv_tokens: usize,
    num_blocks: usize,
    block_size: usize,
    max_model_len: usize,
    trace: TraceJson,
    fit: FitJson,
    systems: [sim::SimReport; 4],
    concurrency_paged_over_oracle: Option<f64>,
    series: Vec<sim::StepSample>,
}

#[derive(Debug, Serialize)]
struct TraceJson {
    name: &'static str,
    requests: usize,
    mean_input: f64,
    mean_output: f64,
    rate: Option<f64>,
}

/// Sequences of each kind that fit the KV memory at once (paged ones as the engine lays out
/// the model's KV groups: a sliding-window group holds only its window).
#[derive(Debug, Serialize)]
struct FitJson {
    contiguous_max_len: usize,
    paged_mean_len: usize,
    paged_max_len: usize,
}

impl Plan {
    /// Runs the comparison (`sim::compare`) and shapes the answer.
    pub fn run(&self) -> Result<PlanJson, PlanError> {
        let cost = CostModel::new(self.model, self.hardware);
        let result =
            sim::compare(&self.trace, &self.setup, &cost).map_err(|e| PlanError::Sim(e.to_string()))?;
        let setup = &self.setup;
        let usable = setup.usable_tokens();
        // Static capacity: contiguous systems reserve max_model_len per sequence; paged ones
        // take whole blocks of what a sequence of the trace's mean length holds.
        let mean_len = (self.trace.mean_input() + self.trace.mean_output()).ceil() as usize;
        let groups = setup.kv_groups;
        let fit = |len: usize| setup.num_blocks() / groups.blocks_per_sequence(len, setup.block_size).max(1);
        let (paged_fit, paged_max_fit) = (fit(mean_len), fit(setup.max_model_len));
        let contiguous_fit = usable / setup.max_model_len;
        let model = &self.model;
        Ok(PlanJson {
            model: ModelJson::from(model),
            hardware: self.hardware.name,
            gpu_memory_gib: self.hardware.memory_bytes / GIB,
            weights_gib: model.weight_bytes() / GIB,
            kv_bytes_per_token: self.kv_bytes_per_token,
            kv_memory_gib: usable as f64 * self.kv_bytes_per_token as f64 / GIB,
            kv_tokens: usable,
            num_blocks: setup.num_blocks(),
            block_size: setup.block_size,
            max_model_len: setup.max_model_len,
            trace: TraceJson {
                name: self.trace_name,
                requests: self.trace.len(),
                mean_input: self.trace.mean_input(),
                mean_output: self.trace.mean_output(),
                rate: finite(self.rate),
            },
            fit: FitJson {
                contiguous_max_len: contiguous_fit,
                paged_mean_len: paged_fit,
                paged_max_len: paged_max_fit,
            },
            concurrency_paged_over_oracle: finite(result.concurrency_paged_over_oracle()),
            series: result.paged.downsampled(self.points),
            systems: [result.paged, result.max, result.pow2, result.oracle],
        })
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// `GET /v1/plan`: presets and bounds for the calculator's form.
#[derive(Debug, Serialize)]
pub struct Presets {
    models: Vec<ModelJson>,
    hardware: Vec<HardwareJson>,
    traces: Vec<&'static str>,
    limits: Limits,
}

#[derive(Debug, Serialize)]
struct HardwareJson {
    name: &'static str,
    memory_gib: f64,
}

/// The largest value the calculator takes for each bounded field.
#[derive(Debug, Serialize)]
struct Limits {
    num_requests: usize,
    max_model_len: usize,
    blocks: usize,
    block_size: usize,
    max_num_seqs: usize,
    dim: usize,
}

pub async fn presets() -> Json<Presets> {
    Json(Presets {
        models: ModelShape::PRESETS.iter().map(ModelJson::from).collect(),
        hardware: Hardware::PRESETS
            .iter()
            .map(|h| HardwareJson { name: h.name, memory_gib: h.memory_bytes / GIB })
            .collect(),
        traces: trace_presets(),
        limits: Limits {
            num_requests: MAX_REQUESTS,
            max_model_len: MAX_MODEL_LEN,
            blocks: MAX_BLOCKS,
            block_size: MAX_BLOCK_SIZE,
            max_num_seqs: MAX_NUM_SEQS,
            dim: MAX_DIM,
        },
    })
}

/// `POST /v1/plan`: validates, then simulates on a blocking thread, one call at a time.
pub async fn plan(State(state): State<Arc<AppState>>, body: JsonBody<PlanRequest>) -> Response {
    let plan = match body.0.validate() {
        Ok(p) => p,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // One simulation at a time: a page's repeated clicks queue instead of taking every core.
    // The permit lives as long as the simulation, even if the client goes away meanwhile.
    let Ok(permit) = state.plan_slot.clone().acquire_owned().await else {
        return ApiError::bad_request("the calculator is shutting down", None).into_response();
    };
    let run = move || {
        let _permit = permit;
        plan.run()
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError {
            status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("simulation task failed: {e}"),
            param: None,
        }
        .into_response(),
    }
}
