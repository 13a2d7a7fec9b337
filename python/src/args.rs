//! What Python passes in, as JSON: `LLM(model, **engine_args)`'s keyword arguments onto an
//! `EngineConfig` (the names of the engine flags, which are vLLM's where vLLM has the knob; an
//! unknown one is a `TypeError` naming it), a `SamplingParams`' fields over the engine's
//! defaults, a prompt (text, token ids or a conversation) and how a request is submitted.

use std::path::PathBuf;
use std::time::Duration;

use engine::config::{DECODE_ACTIVATIONS, KV_DTYPE, PREEMPTION_MODE, QUANTIZATION, SCHEDULING_POLICY};
use engine::spec::SpeculativeConfig;
use engine::{
    Choices, Conversation, Device, EngineConfig, KvCacheSize, KvEventsConfig, Prompt, SamplingParams,
    ValidSamplingParams,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Deserialize;

use crate::errors;

const GIB: f64 = (1u64 << 30) as f64;

/// The engine arguments `LLM` and `AsyncLLM` take; `None` (or leaving one out) keeps
/// `EngineConfig::default()`'s value, except that no metrics line is logged.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineArgs {
    block_size: Option<usize>,
    max_model_len: Option<usize>,
    max_num_seqs: Option<usize>,
    max_num_batched_tokens: Option<usize>,
    enable_prefix_caching: Option<bool>,
    /// `recompute` or `swap`.
    preemption_mode: Option<String>,
    /// `fcfs` or `priority`.
    scheduling_policy: Option<String>,
    /// Host swap space in GiB.
    swap_space: Option<f64>,
    /// Device KV cache budget in GiB (ignored with `num_kv_blocks`).
    kv_cache_gib: Option<f64>,
    num_kv_blocks: Option<usize>,
    /// vLLM's names: `auto` (bf16), `bf16`, `f16`, `f32`, `int8` (CPU), `fp8`/`fp8_e4m3`/`fp8_e5m2`.
    kv_cache_dtype: Option<String>,
    /// The former name of `kv_cache_dtype`.
    kv_dtype: Option<String>,
    /// `cpu`, `cuda` or `cuda:N`.
    device: Option<String>,
    gpu_memory_utilization: Option<f64>,
    seed: Option<u64>,
    max_waiting: Option<usize>,
    served_model_name: Option<String>,
    /// `q8_0` or `q4_0`.
    quantization: Option<String>,
    /// `f32` or `int16`.
    decode_activations: Option<String>,
    /// A Jinja chat template file replacing the model's own.
    chat_template: Option<PathBuf>,
    /// Seconds between the engine's metrics log lines (0, the default here: none).
    log_stats_interval: Option<f64>,
    /// vLLM's `speculative_config` dict (`{"method": "ngram", "num_speculative_tokens": 4}`,
    /// `{"method": "suffix"}`).
    speculative_config: Option<serde_json::Value>,
    /// LoRA adapters (`generate(..., lora_request=LoRARequest(...))`), with vLLM's limits.
    enable_lora: Option<bool>,
    max_loras: Option<usize>,
    max_lora_rank: Option<usize>,
    max_cpu_loras: Option<usize>,
    /// vLLM's `kv_events_config` dict (`{"enable_kv_cache_events": True, "endpoint": ...}`).
    kv_events_config: Option<serde_json::Value>,
}

/// What a JSON object's error is about: serde names no field when a value is wrong, so the
/// first field that `fails` alone (`kind "name"`), else `kind` itself.
fn failing_field(
    kind: &str,
    fields: &serde_json::Value,
    fails: impl Fn(&serde_json::Value) -> bool,
) -> String {
    let mut named = fields.as_object().into_iter().flatten();
    let found = named.find(|(name, value)| fails(&serde_json::json!({ name.as_str(): value })));
    found.map_or_else(|| kind.to_owned(), |(name, _)| format!("{kind} {name:?}"))
}

/// What `value` names among `choices` (`None` when no value was given).
fn pick<T: Copy>(choices: &Choices<T>, value: Option<String>) -> PyResult<Option<T>> {
    let Some(value) = value else { return Ok(None) };
    let names = || choices.names().collect::<Vec<_>>();
    choices.parse(&value).map(Some).ok_or_else(|| errors::choice(choices.arg, &value, &names()))
}

/// A non-negative, finite number of seconds or GiB.
fn amount(what: &str, value: f64) -> PyResult<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(PyValueError::new_err(format!("{what} must be a finite number >= 0, got {value}")))
    }
}

/// The engine configuration of a JSON object of engine arguments.
pub fn engine_config(json: &str) -> PyResult<EngineConfig> {
    let fields: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| errors::json("engine arguments", &e, PyValueError::new_err))?;
    let args = EngineArgs::deserialize(&fields).map_err(|e| {
        let what = failing_field("engine argument", &fields, |alone| EngineArgs::deserialize(alone).is_err());
        errors::json(&what, &e, PyValueError::new_err)
    })?;
    let d = EngineConfig { log_interval: Duration::ZERO, ..EngineConfig::default() };
    let kv_cache = match (args.num_kv_blocks, args.kv_cache_gib) {
        (Some(blocks), _) => KvCacheSize::Blocks(blocks),
        (None, Some(gib)) => KvCacheSize::Bytes((amount("kv_cache_gib", gib)? * GIB) as usize),
        (None, None) => d.kv_cache,
    };
    let device = match args.device {
        Some(s) => s.parse::<Device>().map_err(PyValueError::new_err)?,
        None => d.device,
    };
    Ok(EngineConfig {
        block_size: args.block_size.unwrap_or(d.block_size),
        max_model_len: args.max_model_len.or(d.max_model_len),
        max_num_seqs: args.max_num_seqs.unwrap_or(d.max_num_seqs),
        max_num_batched_tokens: args.max_num_batched_tokens.unwrap_or(d.max_num_batched_tokens),
        enable_prefix_caching: args.enable_prefix_caching.unwrap_or(d.enable_prefix_caching),
        preemption_mode: pick(&PREEMPTION_MODE, args.preemption_mode)?.unwrap_or(d.preemption_mode),
        policy: pick(&SCHEDULING_POLICY, args.scheduling_policy)?.unwrap_or(d.policy),
        swap_space_bytes: match args.swap_space {
            Some(gib) => (amount("swap_space", gib)? * GIB) as usize,
            None => d.swap_space_bytes,
        },
        kv_cache,
        kv_dtype: pick(&KV_DTYPE, args.kv_cache_dtype.or(args.kv_dtype))?.unwrap_or(d.kv_dtype),
        device,
        gpu_memory_utilization: args.gpu_memory_utilization.unwrap_or(d.gpu_memory_utilization),
        seed: args.seed.unwrap_or(d.seed),
        max_waiting: args.max_waiting.unwrap_or(d.max_waiting),
        served_model_name: args.served_model_name,
        quantization: pick(&QUANTIZATION, args.quantization)?.or(d.quantization),
        decode_activations: pick(&DECODE_ACTIVATIONS, args.decode_activations)?
            .unwrap_or(d.decode_activations),
        chat_template: args.chat_template,
        speculative_config: match args.speculative_config {
            Some(v) => Some(
                SpeculativeConfig::from_json(&v.to_string())
                    .map_err(|e| PyValueError::new_err(e.to_string()))?,
            ),
            None => None,
        },
        lora: args.enable_lora.unwrap_or(false).then(|| {
            let l = engine::LoraConfig::default();
            engine::LoraConfig {
                max_loras: args.max_loras.unwrap_or(l.max_loras),
                max_lora_rank: args.max_lora_rank.unwrap_or(l.max_lora_rank),
                max_cpu_loras: args.max_cpu_loras.or(l.max_cpu_loras),
            }
        }),
        kv_events: match args.kv_events_config {
            Some(v) => Some(
                KvEventsConfig::from_json(&v.to_string())
                    .map_err(|e| PyValueError::new_err(e.to_string()))?,
            ),
            None => None,
        },
        log_interval: match args.log_stats_interval {
            Some(s) => Duration::from_secs_f64(amount("log_stats_interval", s)?),
            None => d.log_interval,
        },
        ..d
    })
}

/// A `SamplingParams`' fields (JSON) over `defaults`, validated (the one check they get; the
/// engine takes them as they are); `None` is `defaults` themselves.
pub fn sampling_params(json: Option<&str>, defaults: &SamplingParams) -> PyResult<ValidSamplingParams> {
    let Some(json) = json else { return defaults.clone().validate().map_err(errors::sampling) };
    let fields: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| errors::json("sampling parameters", &e, errors::InvalidRequestError::new_err))?;
    let params = SamplingParams::from_json_over(defaults, &fields).map_err(|e| {
        let what = failing_field("sampling parameter", &fields, |alone| {
            SamplingParams::from_json_over(defaults, alone).is_err()
        });
        errors::json(&what, &e, errors::InvalidRequestError::new_err)
    })?;
    params.validate().map_err(errors::sampling)
}

/// How `AsyncLLM` submits one request beside its prompt and sampling parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitOptions {
    /// `None`: one is made up.
    pub request_id: Option<String>,
    /// `cumulative`, `delta` or `final_only`.
    pub output_kind: String,
    /// Under the `priority` scheduling policy, lower runs first.
    pub priority: i64,
    /// Shares prefix-cache entries only with requests of the same salt.
    pub cache_salt: Option<String>,
    /// The LoRA adapter (`LoRARequest`'s name and folder).
    #[serde(default)]
    pub lora: Option<LoraArg>,
}

/// A `LoRARequest` as the Python side sends it: the adapter's name and its folder.
#[derive(Debug, Clone, Deserialize)]
pub struct LoraArg {
    pub name: String,
    pub path: PathBuf,
}

impl LoraArg {
    /// The adapter of a request (JSON, `None`: the base model).
    pub fn parse(json: Option<&str>) -> PyResult<Option<engine::LoraRequest>> {
        let Some(json) = json else { return Ok(None) };
        let arg: Self = serde_json::from_str(json)
            .map_err(|e| errors::json("lora_request", &e, PyValueError::new_err))?;
        Ok(Some(arg.into()))
    }
}

impl From<LoraArg> for engine::LoraRequest {
    fn from(arg: LoraArg) -> Self {
        engine::LoraRequest::at(arg.name, arg.path)
    }
}

impl SubmitOptions {
    pub fn parse(json: &str) -> PyResult<Self> {
        serde_json::from_str(json).map_err(|e| errors::json("submit options", &e, PyValueError::new_err))
    }
}

/// A prompt as the Python side sends it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PromptArg {
    Text(String),
    TokenIds(Vec<u32>),
    /// Chat messages with the template's other inputs (tools, documents, kwargs).
    Conversation(Conversation),
}

impl PromptArg {
    pub fn parse(json: &str) -> PyResult<Self> {
        serde_json::from_str(json)
            .map_err(|e| errors::json("prompt", &e, errors::InvalidRequestError::new_err))
    }

    /// The text a request output reports as its prompt: the text given, none for token ids.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Text(s) => Some(s),
            Self::TokenIds(_) | Self::Conversation(_) => None,
        }
    }

    pub fn into_prompt(self) -> Prompt {
        match self {
            Self::Text(s) => Prompt::Text(s),
            Self::TokenIds(ids) => Prompt::Tokens(ids),
            Self::Conversation(c) => Prompt::Conversation(c),
        }
    }
}
