//! Command-line flags: the engine's knobs (vLLM's names, shared by `paged-llm run`,
//! `throughput` and `serve`) and the server's own.

use std::path::PathBuf;

use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use engine::config::{DECODE_ACTIVATIONS, KV_DTYPE, PREEMPTION_MODE, QUANTIZATION, SCHEDULING_POLICY};
use engine::spec::SpeculativeConfig;
use engine::{
    ActivationPrecision, Choices, DType, Device, EngineConfig, KvCacheSize, KvEventsConfig, LoraConfig,
    Policy, PreemptionMode, Quantization, ShutdownMode,
};

/// Engine knobs shared by `run`, `throughput` and `serve` (vLLM's names).
#[derive(Debug, Clone, Args)]
pub struct EngineKnobs {
    /// Model: a Hugging Face folder, a GGUF file, or a name `paged-llm fetch-model` knows
    /// (smollm2, gemma3-270m; fetched if missing); default: SmolLM2-135M-Instruct's Q4_1 GGUF
    /// in the models folder (fetched if missing), weights kept quantized.
    #[arg(help_heading = "ModelConfig", long)]
    pub model: Option<PathBuf>,
    /// Quantize float weights at load (a GGUF's own quantized tensors are kept as they are).
    #[arg(help_heading = "ModelConfig", long, value_parser = choice(&QUANTIZATION))]
    pub quantization: Option<Quantization>,
    /// Activations of the CPU's matmuls over quantized weights: f32 (what the f32 dequantization
    /// computes), int16 (integer kernels for decode and batches over every integer-code format,
    /// Q4_0 to Q6_K; logits within the goldens' tolerance), int8
    /// (llama.cpp's rounding, one 8-bit scale per 32 values; integer kernels for decode and
    /// batches alike on every CPU, a token's products the same bits whatever its batch; opt-in),
    /// or auto: int16 on AVX2 and AVX-512 CPUs, f32 otherwise (and for f16/bf16 weights).
    #[arg(help_heading = "ModelConfig", long, value_parser = choice(&DECODE_ACTIVATIONS), default_value = "auto")]
    pub decode_activations: ActivationPrecision,
    /// Tokens per KV block (8, 16 or 32).
    #[arg(help_heading = "CacheConfig", long, default_value_t = 16)]
    pub block_size: usize,
    /// Longest prompt + output (default: the model's max_position_embeddings).
    #[arg(help_heading = "ModelConfig", long)]
    pub max_model_len: Option<usize>,
    #[arg(help_heading = "SchedulerConfig", long, default_value_t = 256)]
    pub max_num_seqs: usize,
    #[arg(help_heading = "SchedulerConfig", long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Turn automatic prefix caching off.
    #[arg(help_heading = "CacheConfig", long)]
    pub no_prefix_caching: bool,
    #[arg(help_heading = "SchedulerConfig", long, value_parser = choice(&PREEMPTION_MODE), default_value = "recompute")]
    pub preemption_mode: PreemptionMode,
    /// Host swap space in GiB (used with --preemption-mode swap).
    #[arg(help_heading = "CacheConfig", long, default_value_t = 1.0)]
    pub swap_space: f64,
    /// Device KV cache budget in GiB (ignored with --num-kv-blocks).
    #[arg(help_heading = "CacheConfig", long, default_value_t = 2.0)]
    pub kv_cache_gib: f64,
    /// Exact number of KV blocks.
    #[arg(help_heading = "CacheConfig", long)]
    pub num_kv_blocks: Option<usize>,
    /// KV cache element type, vLLM's names (auto: bf16, on CUDA also the weights' and
    /// activations' type; f32 on the CPU for results bit-comparable with an f32 reference; int8
    /// on the CPU for about twice the tokens in the same memory; fp8 = fp8_e4m3, CUDA's).
    #[arg(help_heading = "CacheConfig", long, alias = "kv-dtype", value_parser = choice(&KV_DTYPE))]
    pub kv_cache_dtype: Option<DType>,
    /// Where the model runs: cpu, cuda (GPU 0) or cuda:N. CUDA needs a build with the `cuda`
    /// feature (`cargo xtask` makes one when asked) and the NVIDIA driver.
    #[arg(help_heading = "DeviceConfig", long, default_value = "cpu")]
    pub device: Device,
    /// Fraction of GPU memory for weights, activations and the KV cache (CUDA; vLLM's knob).
    #[arg(help_heading = "CacheConfig", long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Seed for requests without their own.
    #[arg(help_heading = "ModelConfig", long, default_value_t = 0)]
    pub seed: u64,
    /// Speculative decoding, vLLM's JSON: '{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_min": 2, "prompt_lookup_max": 5}' or '{"method": "suffix"}' (with vLLM's
    /// suffix_decoding_* settings). Lossless: the same tokens, fewer steps where answers copy
    /// from their prompt or repeat earlier answers.
    #[arg(help_heading = "SpeculativeConfig", long, value_parser = speculative_config)]
    pub speculative_config: Option<SpeculativeConfig>,
    /// Serve LoRA adapters over the base model (CPU device): a request's `model` names one.
    #[arg(help_heading = "LoRAConfig", long)]
    pub enable_lora: bool,
    /// Most distinct adapters in one step (a request of another adapter waits).
    #[arg(help_heading = "LoRAConfig", long, default_value_t = 1)]
    pub max_loras: usize,
    /// Largest adapter rank accepted.
    #[arg(help_heading = "LoRAConfig", long, default_value_t = 16)]
    pub max_lora_rank: usize,
    /// Most adapters kept in memory (default: --max-loras); an idle one past it is dropped and
    /// read from its folder again when next asked for.
    #[arg(help_heading = "LoRAConfig", long)]
    pub max_cpu_loras: Option<usize>,
    /// KV cache events for prefix-aware routers, vLLM's JSON: '{"enable_kv_cache_events": true,
    /// "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
    /// "topic": "kv-events"}' (a port of 0 binds any free port; the log names it).
    #[arg(help_heading = "VllmConfig", long, value_parser = kv_events_config)]
    pub kv_events_config: Option<KvEventsConfig>,
}

fn kv_events_config(json: &str) -> Result<KvEventsConfig, String> {
    KvEventsConfig::from_json(json).map_err(|e| e.to_string())
}

fn speculative_config(json: &str) -> Result<SpeculativeConfig, String> {
    SpeculativeConfig::from_json(json).map_err(|e| e.to_string())
}

/// A flag whose value is one of the engine's names for an argument's choices (the table the
/// Python package parses with too).
fn choice<T: Copy + Send + Sync + 'static>(choices: &'static Choices<T>) -> impl TypedValueParser<Value = T> {
    // The names parser has already refused anything else, so the lookup finds every name.
    PossibleValuesParser::new(choices.names()).try_map(|name| choices.parse(&name).ok_or("not a choice"))
}

const GIB: f64 = (1u64 << 30) as f64;

impl EngineKnobs {
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            enable_prefix_caching: !self.no_prefix_caching,
            preemption_mode: self.preemption_mode,
            swap_space_bytes: (self.swap_space * GIB) as usize,
            kv_cache: match self.num_kv_blocks {
                Some(n) => KvCacheSize::Blocks(n),
                None => KvCacheSize::Bytes((self.kv_cache_gib * GIB) as usize),
            },
            kv_dtype: self.kv_cache_dtype.unwrap_or(DType::BF16),
            device: self.device,
            gpu_memory_utilization: self.gpu_memory_utilization,
            seed: self.seed,
            quantization: self.quantization,
            decode_activations: self.decode_activations,
            speculative_config: self.speculative_config.clone(),
            lora: self.enable_lora.then_some(LoraConfig {
                max_loras: self.max_loras,
                max_lora_rank: self.max_lora_rank,
                max_cpu_loras: self.max_cpu_loras,
            }),
            kv_events: self.kv_events_config.clone(),
            ..EngineConfig::default()
        }
    }
}

/// The server's flags, beside the engine's.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default).
    #[arg(help_heading = "Frontend", long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(help_heading = "Frontend", long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on the `/v1` routes.
    #[arg(help_heading = "Frontend", long)]
    pub api_key: Option<String>,
    /// The model's name in the API (default: the model folder's name).
    #[arg(help_heading = "ModelConfig", long)]
    pub served_model_name: Option<String>,
    /// Most requests waiting to be scheduled; past it, requests get 429.
    #[arg(help_heading = "SchedulerConfig", long, default_value_t = 4096)]
    pub max_waiting: usize,
    /// Largest request body in MiB (a larger one gets 400).
    #[arg(help_heading = "Frontend", long, default_value_t = 4)]
    pub max_body_mib: usize,
    /// On SIGINT/SIGTERM, abort in-flight requests instead of letting them finish.
    #[arg(help_heading = "Frontend", long)]
    pub abort_on_shutdown: bool,
    /// Default period of `GET /v1/kv_map/stream` in milliseconds (clamped to 50..=10000).
    #[arg(help_heading = "Frontend", long, default_value_t = 250)]
    pub kv_map_interval_ms: u64,
    /// Origins a browser may call the API from (CORS): a comma-separated list of origins
    /// (`https://app.example`), or `*` for any. Without it no CORS headers are sent.
    #[arg(help_heading = "Frontend", long, value_delimiter = ',', value_parser = parse_origin)]
    pub allowed_origins: Option<Vec<String>>,
    /// Seconds between the keep-alive comments of an SSE stream that has nothing to send
    /// (0: none).
    #[arg(help_heading = "Frontend", long, default_value_t = 15)]
    pub sse_keep_alive_secs: u64,
    /// A Jinja chat template file to use instead of the model's own.
    #[arg(help_heading = "Frontend", long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// How chat output is read for tool calls: auto (whichever format the model's template
    /// makes it write), hermes (`<tool_call>`), llama3_json or mistral (`[TOOL_CALLS]`).
    #[arg(help_heading = "Frontend", long, value_enum, default_value = "auto")]
    pub tool_call_parser: crate::ToolCallParser,
    /// Sends a chat answer's `<think>…</think>` reasoning as `reasoning_content` (vLLM's
    /// parsers): qwen3 (an answer that opens with `<think>`), deepseek_r1 (the answer reasons
    /// from its start until `</think>`). Unset: all of it is content.
    #[arg(help_heading = "Frontend", long, value_enum)]
    pub reasoning_parser: Option<crate::ReasoningParser>,
    /// Structured outputs as vLLM's JSON (`{"backend": "auto"|"guidance",
    /// "enable_in_reasoning": false}`): with a reasoning parser, a request's constraint covers
    /// only the answer after the reasoning unless `enable_in_reasoning` is true.
    #[arg(help_heading = "StructuredOutputsConfig", long, value_name = "JSON", value_parser = crate::StructuredOutputsConfig::from_json)]
    pub structured_outputs_config: Option<crate::StructuredOutputsConfig>,
    /// How `/v1/embeddings` pools a prompt's final hidden states, as vLLM's JSON
    /// (`{"pooling_type": "LAST"|"MEAN", "normalize": true}`); unset: the last token's state,
    /// normalised.
    #[arg(help_heading = "ModelConfig", long, value_name = "JSON", value_parser = pooler_config)]
    pub pooler_config: Option<engine::PoolingParams>,
    /// Which waiting request runs first: fcfs, or priority (a request's `priority`, lower
    /// first; a request with a priority is refused under fcfs).
    #[arg(help_heading = "SchedulerConfig", long, value_parser = choice(&SCHEDULING_POLICY), default_value = "fcfs")]
    pub scheduling_policy: Policy,
    /// LoRA adapters served from the start, each `name=path` (a PEFT folder or a llama.cpp LoRA GGUF file) or vLLM's JSON
    /// `{"name": …, "path": …}`; needs --enable-lora.
    #[arg(help_heading = "Frontend", long, num_args = 1.., value_name = "NAME=PATH", value_parser = lora_module)]
    pub lora_modules: Vec<LoraModule>,
    /// Serve `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (a client may then make the
    /// server read an adapter folder of its choosing).
    #[arg(
        help_heading = "Frontend",
        long,
        env = "PAGED_LLM_ALLOW_RUNTIME_LORA_UPDATING",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub allow_runtime_lora_updating: bool,
    #[command(flatten)]
    pub knobs: EngineKnobs,
}

/// One `--lora-modules` entry (vLLM's JSON form may carry more fields, such as
/// `base_model_name`: they are ignored).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct LoraModule {
    pub name: String,
    pub path: PathBuf,
}

/// `name=path`, or vLLM's JSON form.
fn lora_module(s: &str) -> Result<LoraModule, String> {
    let module = if s.trim_start().starts_with('{') {
        serde_json::from_str::<LoraModule>(s).ok()
    } else {
        s.split_once('=').map(|(name, path)| LoraModule { name: name.into(), path: path.into() })
    };
    module
        .filter(|m| !m.name.is_empty() && !m.path.as_os_str().is_empty())
        .ok_or_else(|| format!("{s:?} is not name=path or {{\"name\": …, \"path\": …}}"))
}

/// `--pooler-config`: vLLM's JSON (its `dimensions` is a request's field, not the server's).
fn pooler_config(json: &str) -> Result<engine::PoolingParams, String> {
    let p: engine::PoolingParams = serde_json::from_str(json).map_err(|e| format!("--pooler-config: {e}"))?;
    if p.dimensions.is_some() {
        return Err("--pooler-config: dimensions is set per request".into());
    }
    Ok(p)
}

/// One `--allowed-origins` entry: `*` or a value a header can carry.
fn parse_origin(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s == "*" || (!s.is_empty() && axum::http::HeaderValue::from_str(s).is_ok()) {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not an origin (like https://app.example) or *"))
    }
}

impl ServeArgs {
    /// The engine's settings: the knobs plus the server's queue bound, model name, chat
    /// template and scheduling policy.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            max_waiting: self.max_waiting,
            served_model_name: self.served_model_name.clone(),
            chat_template: self.chat_template.clone(),
            policy: self.scheduling_policy,
            ..self.knobs.config()
        }
    }

    pub fn server_config(&self) -> crate::ServerConfig {
        crate::ServerConfig {
            api_key: self.api_key.clone(),
            max_body_bytes: self.max_body_mib.saturating_mul(1 << 20),
            shutdown: if self.abort_on_shutdown { ShutdownMode::Abort } else { ShutdownMode::Drain },
            kv_map_interval: std::time::Duration::from_millis(self.kv_map_interval_ms),
            allowed_origins: self.allowed_origins.clone(),
            sse_keep_alive: (self.sse_keep_alive_secs > 0)
                .then(|| std::time::Duration::from_secs(self.sse_keep_alive_secs)),
            tool_call_parser: self.tool_call_parser,
            pooler_config: self.pooler_config.unwrap_or_default(),
            reasoning_parser: self.reasoning_parser,
            structured_outputs: self.structured_outputs_config.unwrap_or_default(),
            allow_runtime_lora_updating: self.allow_runtime_lora_updating,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        knobs: EngineKnobs,
    }

    fn knobs(args: &[&str]) -> EngineKnobs {
        use clap::Parser;
        let cli = Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()));
        cli.unwrap_or_else(|e| panic!("{e}")).knobs
    }

    #[test]
    fn device_flag_picks_the_device_and_its_default_cache_dtype() {
        let cpu = knobs(&[]).config();
        assert_eq!((cpu.device, cpu.kv_dtype), (Device::Cpu, DType::BF16));
        let cuda = knobs(&["--device", "cuda", "--gpu-memory-utilization", "0.8"]).config();
        assert_eq!((cuda.device, cuda.kv_dtype), (Device::Cuda { ordinal: 0 }, DType::BF16));
        assert_eq!(cuda.gpu_memory_utilization, 0.8);
        let f16 = knobs(&["--device", "cuda:1", "--kv-dtype", "f16"]).config();
        assert_eq!((f16.device, f16.kv_dtype), (Device::Cuda { ordinal: 1 }, DType::F16));
        let cli = <Cli as clap::Parser>::try_parse_from(["run", "--device", "tpu"]);
        assert!(cli.is_err());
        // vLLM's flag and names: int8, fp8 = e4m3, auto = bf16.
        for (name, dtype) in [
            ("int8", DType::Int8),
            ("fp8", DType::Fp8E4M3),
            ("fp8_e5m2", DType::Fp8E5M2),
            ("auto", DType::BF16),
        ] {
            assert_eq!(knobs(&["--kv-cache-dtype", name]).config().kv_dtype, dtype);
        }
    }

    #[test]
    fn choice_flags_take_the_engine_names() {
        let c =
            knobs(&["--quantization", "q4_0", "--decode-activations", "int16", "--preemption-mode", "swap"])
                .config();
        assert_eq!(c.quantization, Some(Quantization::Q4_0));
        assert_eq!(c.decode_activations, ActivationPrecision::Int16);
        assert_eq!(c.preemption_mode, PreemptionMode::Swap);
        let d = knobs(&[]).config();
        assert_eq!(d.quantization, None);
        assert_eq!(d.decode_activations, ActivationPrecision::Auto);
        assert_eq!(d.preemption_mode, PreemptionMode::Recompute);
        let cli = <Cli as clap::Parser>::try_parse_from(["run", "--kv-dtype", "BF16"]);
        assert!(cli.is_err(), "names are matched exactly");
    }

    #[test]
    fn speculative_config_takes_vllm_json_and_refuses_bad_json_at_start() {
        let json = r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}"#;
        let c = knobs(&["--speculative-config", json]).config();
        assert_eq!(c.speculative_config.map(|s| s.num_speculative_tokens), Some(3));
        assert_eq!(knobs(&[]).config().speculative_config, None);
        let bad =
            <Cli as clap::Parser>::try_parse_from(["run", "--speculative-config", r#"{"method": "x"}"#]);
        assert!(bad.is_err_and(|e| e.to_string().contains("speculative config")));
    }

    #[test]
    fn server_flags_reach_both_configs() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Serve {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let parse =
            |args: &[&str]| Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()));
        let s = parse(&[
            "--allowed-origins",
            "http://a.test,http://b.test",
            "--sse-keep-alive-secs",
            "0",
            "--chat-template",
            "t.jinja",
            "--tool-call-parser",
            "llama3_json",
            "--scheduling-policy",
            "priority",
        ])
        .unwrap_or_else(|e| panic!("{e}"))
        .serve;
        let server = s.server_config();
        assert_eq!(
            server.allowed_origins,
            Some(vec!["http://a.test".to_owned(), "http://b.test".to_owned()])
        );
        assert_eq!(server.sse_keep_alive, None);
        assert_eq!(server.tool_call_parser, crate::ToolCallParser::Llama3Json);
        let engine = s.engine_config();
        assert_eq!(engine.chat_template, Some(PathBuf::from("t.jinja")));
        assert_eq!(engine.policy, Policy::Priority);
        let defaults = parse(&[]).unwrap_or_else(|e| panic!("{e}")).serve;
        let server = defaults.server_config();
        assert_eq!(
            (server.allowed_origins, server.sse_keep_alive),
            (None, Some(std::time::Duration::from_secs(15)))
        );
        assert_eq!(defaults.engine_config().policy, Policy::Fcfs);
        assert!(parse(&["--tool-call-parser", "pythonic"]).is_err());
        assert!(parse(&["--allowed-origins", "bad\norigin"]).is_err());
    }

    #[test]
    fn lora_flags_reach_the_engine_config_and_modules_parse_both_forms() {
        assert_eq!(knobs(&[]).config().lora, None);
        let c =
            knobs(&["--enable-lora", "--max-loras", "4", "--max-lora-rank", "32", "--max-cpu-loras", "8"])
                .config();
        assert_eq!(c.lora, Some(LoraConfig { max_loras: 4, max_lora_rank: 32, max_cpu_loras: Some(8) }));
        let module = |name: &str, path: &str| LoraModule { name: name.into(), path: path.into() };
        assert_eq!(lora_module("sql=/a/sql"), Ok(module("sql", "/a/sql")));
        assert_eq!(
            lora_module(r#"{"name": "chat", "path": "/a/chat", "base_model_name": "m"}"#),
            Ok(module("chat", "/a/chat"))
        );
        for bad in ["sql", "=/a", "sql=", r#"{"name": "x"}"#, "{"] {
            assert!(lora_module(bad).is_err(), "{bad}");
        }
    }
}
