//! The architecture description: what tells one decoder family from another, as data that the
//! one forward (`forward.rs`), the f64 reference and the CUDA emulation read, so that a family
//! is a description and a loader, never another copy of the layer loop.

/// How the rows of each Q/K head are ordered, which decides the rotary pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// HF order ("neox"): dimension `i` pairs with `i + d/2` ("rotate half").
    RotateHalf,
    /// Adjacent pairs: `2i` pairs with `2i + 1`. llama.cpp's GGUF stores Llama's Q/K rows
    /// permuted into this order; Q and K are permuted alike, so `q·k` and the attention are
    /// those of the HF model, and keeping the file's order spares a re-ordered copy of the
    /// quantized rows.
    Interleaved,
}

/// The gate of the gated MLP: `act(gate) · up` (the kernels' own enum).
pub use attn_kernels::cpu::act::Activation;

/// A fieldless enum and `ALL`, its variants in declaration order, so that each variant is named
/// once (a variant added to the enum is in `ALL` too).
macro_rules! enum_with_all {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            pub const ALL: [$name; [$($name::$variant),*].len()] = [$($name::$variant),*];
        }
    };
}

enum_with_all! {
    /// The decoder families this engine loads (Hugging Face `architectures` / GGUF
    /// `general.architecture`).
    pub enum Family {
        Llama,
        Mistral,
        Qwen2,
        Qwen3,
        Gemma3,
        Phi3,
    }
}

impl Family {
    /// The Hugging Face class name (`architectures[0]` of its config.json).
    pub fn hf_class(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Gemma3 => "Gemma3ForCausalLM",
            Family::Phi3 => "Phi3ForCausalLM",
        }
    }

    /// The `model_type` values of its config.json.
    pub fn model_types(self) -> &'static [&'static str] {
        match self {
            Family::Llama => &["llama"],
            Family::Mistral => &["mistral"],
            Family::Qwen2 => &["qwen2"],
            Family::Qwen3 => &["qwen3"],
            Family::Gemma3 => &["gemma3_text", "gemma3"],
            Family::Phi3 => &["phi3"],
        }
    }

    /// llama.cpp's `general.architecture` (Mistral's GGUFs say `llama`).
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Family::Llama | Family::Mistral => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
            Family::Phi3 => "phi3",
        }
    }

    pub fn from_hf_class(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.hf_class() == name)
    }

    pub fn from_model_type(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_types().contains(&name))
    }

    pub fn from_gguf_arch(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.gguf_arch() == name)
    }

    /// Q/K/V are one `qkv_proj` tensor and gate/up one `gate_up_proj` in its HF checkpoints.
    pub fn fused_hf_projections(self) -> bool {
        self == Family::Phi3
    }
}

/// Which rotary table a layer rotates Q and K with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeKind {
    /// `rope_theta` with the config's `rope_scaling`.
    Global,
    /// Gemma 3's local (sliding-window) layers: `rope_local_base_freq`, unscaled.
    Local,
}

impl RopeKind {
    pub const COUNT: usize = 2;
}

/// How one layer attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerAttention {
    pub rope: RopeKind,
    /// A query at position `p` sees the keys in `(p − window, p]`; `None`: every earlier key.
    pub sliding_window: Option<usize>,
}

impl LayerAttention {
    pub const FULL: LayerAttention = LayerAttention { rope: RopeKind::Global, sliding_window: None };
}

/// One decoder family's differences from the plain pre-norm transformer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Architecture {
    pub family: Family,
    /// RMSNorm multiplies by `norm_weight_offset + w` (0 for most; 1 for Gemma's `1 + w`).
    pub norm_weight_offset: f32,
    pub activation: Activation,
    /// Q, K and V projections have biases (Qwen2, Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// The output projection has a bias (Llama with `attention_bias`).
    pub o_bias: bool,
    /// Each Q and K head is RMS-normed before the rotation (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The attention and MLP outputs are RMS-normed before they join the residual stream
    /// (Gemma 2/3's post-attention and post-feedforward norms).
    pub sandwich_norms: bool,
    pub rope_style: RopeStyle,
    /// The embedding rows are multiplied by this (Gemma: `sqrt(hidden_size)`).
    pub embedding_scale: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2).
    pub final_logit_softcap: Option<f32>,
    /// The attention scores' scale (`1 / sqrt(head_dim)` unless the family says otherwise).
    pub attention_scale: f32,
}

impl Architecture {
    /// Llama (and SmolLM2) as Hugging Face stores it.
    pub fn llama(head_dim: usize, attention_bias: bool) -> Self {
        Self {
            family: Family::Llama,
            norm_weight_offset: 0.0,
            activation: Activation::Silu,
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            qk_norm: false,
            sandwich_norms: false,
            rope_style: RopeStyle::RotateHalf,
            embedding_scale: None,
            final_logit_softcap: None,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
        }
    }

    /// The family's name, for messages.
    pub fn name(&self) -> &'static str {
        self.family.hf_class()
    }

    /// The norms of one decoder layer this architecture has, in [`LayerNorm`] order.
    pub fn layer_norms(&self) -> impl Iterator<Item = LayerNorm> + '_ {
        LayerNorm::ALL.into_iter().filter(|n| match n {
            LayerNorm::InputLayernorm | LayerNorm::PreFeedforwardLayernorm => true,
            LayerNorm::QNorm | LayerNorm::KNorm => self.qk_norm,
            LayerNorm::PostAttentionLayernorm | LayerNorm::PostFeedforwardLayernorm => self.sandwich_norms,
        })
    }
}

enum_with_all! {
    /// The RMSNorms a decoder layer can have.
    pub enum LayerNorm {
        /// Before the attention (HF `input_layernorm`).
        InputLayernorm,
        /// Per head of Q, before the rotation (HF `self_attn.q_norm`).
        QNorm,
        /// Per head of K, before the rotation (HF `self_attn.k_norm`).
        KNorm,
        /// On the attention output, before the residual add (Gemma's `post_attention_layernorm`).
        PostAttentionLayernorm,
        /// Before the MLP (Gemma's `pre_feedforward_layernorm`; Llama, without sandwich norms,
        /// calls it `post_attention_layernorm`).
        PreFeedforwardLayernorm,
        /// On the MLP output, before the residual add (Gemma's `post_feedforward_layernorm`).
        PostFeedforwardLayernorm,
    }
}

enum_with_all! {
    /// The matrices of a decoder layer, each `[out, in]` row-major.
    pub enum LayerMatrix {
        /// Rows: Q (`heads·d`), then K, then V (`kv_heads·d` each).
        Qkv,
        O,
        /// Rows: gate (`intermediate`), then up (`intermediate`).
        GateUp,
        Down,
    }
}
