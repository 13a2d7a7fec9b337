//! The simulator's stand-in for a model: a roofline cost per step from the model's shape and the
//! accelerator's bandwidth and compute, and the KV bytes per token that size the pool.
//!
//! A step reads every weight once and the KV of every context token, and does `2 * params`
//! FLOPs per batched token; it takes the longer of the two plus a fixed launch overhead.

/// The parts of a model's shape that set its KV footprint and step cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub name: &'static str,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Parameter count (weights read per step, FLOPs per token).
    pub num_params: f64,
    /// Bytes per weight, and per KV element unless `kv_dtype` says otherwise.
    pub dtype_bytes: usize,
    /// The KV cache's element type (vLLM's `kv_cache_dtype`), when it is not the weights'
    /// (int8 adds its scales' bytes per token and head).
    pub kv_dtype: Option<kv_cache::DType>,
    /// Layers that attend over a sliding window of `sliding_window` tokens (0: none).
    pub sliding_layers: usize,
    pub sliding_window: usize,
}

impl ModelShape {
    /// OPT-13B in fp16, the paper's ShareGPT/Alpaca model (40 layers, 40 heads of 128).
    pub const OPT_13B: ModelShape = ModelShape {
        name: "opt-13b",
        num_layers: 40,
        num_kv_heads: 40,
        head_dim: 128,
        num_params: 13e9,
        dtype_bytes: 2,
        kv_dtype: None,
        sliding_layers: 0,
        sliding_window: 0,
    };
    /// Llama-2-7B in fp16 (32 layers, 32 KV heads of 128).
    pub const LLAMA2_7B: ModelShape = ModelShape {
        name: "llama2-7b",
        num_layers: 32,
        num_kv_heads: 32,
        head_dim: 128,
        num_params: 6.74e9,
        dtype_bytes: 2,
        kv_dtype: None,
        sliding_layers: 0,
        sliding_window: 0,
    };
    /// SmolLM2-135M in fp16 (30 layers, 3 KV heads of 64), the project's real model.
    pub const SMOLLM2_135M: ModelShape = ModelShape {
        name: "smollm2-135m",
        num_layers: 30,
        num_kv_heads: 3,
        head_dim: 64,
        num_params: 1.35e8,
        dtype_bytes: 2,
        kv_dtype: None,
        sliding_layers: 0,
        sliding_window: 0,
    };

    /// Gemma 3 270M in bf16 (18 layers, 1 KV head of 256; five of every six layers attend over
    /// a 512-token window).
    pub const GEMMA3_270M: ModelShape = ModelShape {
        name: "gemma3-270m",
        num_layers: 18,
        num_kv_heads: 1,
        head_dim: 256,
        num_params: 2.68e8,
        dtype_bytes: 2,
        kv_dtype: None,
        sliding_layers: 15,
        sliding_window: 512,
    };
    /// Mistral 7B v0.1 in bf16 (32 layers, 8 KV heads of 128, every layer over a 4 096-token
    /// window).
    pub const MISTRAL_7B: ModelShape = ModelShape {
        name: "mistral-7b-v0.1",
        num_layers: 32,
        num_kv_heads: 8,
        head_dim: 128,
        num_params: 7.24e9,
        dtype_bytes: 2,
        kv_dtype: None,
        sliding_layers: 32,
        sliding_window: 4096,
    };

    /// Every named shape (`by_name`'s, `cargo xtask plan --model`'s and the web calculator's).
    pub const PRESETS: [ModelShape; 5] =
        [Self::OPT_13B, Self::LLAMA2_7B, Self::SMOLLM2_135M, Self::GEMMA3_270M, Self::MISTRAL_7B];

    pub fn by_name(name: &str) -> Option<ModelShape> {
        Self::PRESETS.into_iter().find(|m| m.name == name)
    }

    /// K and V of one token across all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.num_layers * self.num_kv_heads * self.kv_bytes_per_head()
    }

    /// Bytes of one token's key and value in one kv head.
    pub fn kv_bytes_per_head(&self) -> usize {
        self.kv_dtype.map_or(2 * self.head_dim * self.dtype_bytes, |d| d.kv_bytes_per_head(self.head_dim))
    }

    pub fn weight_bytes(&self) -> f64 {
        self.num_params * self.dtype_bytes as f64
    }

    /// Token slots that `kv_budget_bytes` of KV memory holds.
    pub fn kv_token_slots(&self, kv_budget_bytes: f64) -> usize {
        (kv_budget_bytes / self.kv_bytes_per_token() as f64).max(0.0) as usize
    }

    /// Token slots of the memory left on `hardware` at `utilization` once the weights are in
    /// (vLLM's `gpu_memory_utilization` budget); `None` when the weights do not fit.
    pub fn kv_tokens_on(&self, hardware: &Hardware, utilization: f64) -> Option<usize> {
        let budget = hardware.memory_bytes * utilization - self.weight_bytes();
        (budget > 0.0).then(|| self.kv_token_slots(budget))
    }
}

/// An accelerator for the roofline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hardware {
    pub name: &'static str,
    /// Bytes per second achieved on streaming reads.
    pub mem_bandwidth: f64,
    /// FLOP per second achieved on large GEMMs.
    pub flops: f64,
    /// Fixed cost of one step (launches, sampling, scheduling), seconds.
    pub step_overhead_s: f64,
    pub memory_bytes: f64,
}

impl Hardware {
    /// A100-40GB at realistic efficiencies (80 % of 1.555 TB/s, 60 % of 312 TFLOP/s).
    pub const A100_40GB: Hardware = Hardware {
        name: "a100-40gb",
        mem_bandwidth: 1.555e12 * 0.8,
        flops: 312e12 * 0.6,
        step_overhead_s: 2e-3,
        memory_bytes: 40e9,
    };
    /// H200 at the same efficiencies (4.8 TB/s, 989 TFLOP/s dense bf16).
    pub const H200: Hardware = Hardware {
        name: "h200",
        mem_bandwidth: 4.8e12 * 0.8,
        flops: 989e12 * 0.6,
        step_overhead_s: 1e-3,
        memory_bytes: 141e9,
    };

    /// Every named accelerator.
    pub const PRESETS: [Hardware; 2] = [Self::A100_40GB, Self::H200];

    pub fn by_name(name: &str) -> Option<Hardware> {
        Self::PRESETS.into_iter().find(|h| h.name == name)
    }
}

/// Step time of a model on an accelerator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub model: ModelShape,
    pub hardware: Hardware,
}

impl CostModel {
    pub fn new(model: ModelShape, hardware: Hardware) -> Self {
        Self { model, hardware }
    }

    /// Seconds for one step computing `batched_tokens` tokens whose attention reads
    /// `context_tokens` KV entries in total.
    pub fn step_time_s(&self, batched_tokens: usize, context_tokens: usize) -> f64 {
        if batched_tokens == 0 {
            return 0.0;
        }
        let bytes =
            self.model.weight_bytes() + context_tokens as f64 * self.model.kv_bytes_per_token() as f64;
        let memory_s = bytes / self.hardware.mem_bandwidth;
        let compute_s = 2.0 * self.model.num_params * batched_tokens as f64 / self.hardware.flops;
        self.hardware.step_overhead_s + memory_s.max(compute_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opt13b_kv_footprint_matches_the_paper() {
        // 800 KB per token; 12.3 GB of KV memory is the paper's ~15.7K token slots.
        assert_eq!(ModelShape::OPT_13B.kv_bytes_per_token(), 819_200);
        // int8: a byte per element, 2-byte scales: a key's per 32 dims, a value's per head.
        let int8 = ModelShape { kv_dtype: Some(kv_cache::DType::Int8), ..ModelShape::OPT_13B };
        assert_eq!(int8.kv_bytes_per_token(), 40 * 40 * (128 + 8 + 128 + 2));
        assert_eq!(ModelShape::OPT_13B.kv_token_slots(12.86e9), 15_698);
    }

    #[test]
    fn step_time_grows_with_work_and_is_memory_bound_for_decodes() {
        let c = CostModel::new(ModelShape::OPT_13B, Hardware::A100_40GB);
        let one = c.step_time_s(1, 100);
        let many = c.step_time_s(64, 64 * 400);
        let prefill = c.step_time_s(2048, 2048);
        assert!(one > 0.02 && one < 0.03, "{one}");
        assert!(many > one && prefill > many);
        assert_eq!(c.step_time_s(0, 0), 0.0);
    }
}
