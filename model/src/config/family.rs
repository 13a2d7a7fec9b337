//! Which family a config.json describes ([`detect`]), and that family's [`Architecture`] and
//! per-layer attention ([`LayerAttention`]) from the config's fields, with the defaults
//! `transformers` gives each family.

use std::path::Path;

use super::RawConfig;
use crate::arch::{Activation, Architecture, Family, LayerAttention, RopeKind};
use crate::error::{ModelError, Result};

/// The family of a config.json: its `architectures` (the first this engine knows) and
/// `model_type`, which must agree; anything else is [`ModelError::UnsupportedArchitecture`].
pub(super) fn detect(value: &serde_json::Value, path: &Path) -> Result<Family> {
    let archs: Vec<&str> = value
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    let model_type = value.get("model_type").and_then(|m| m.as_str());
    let unsupported = |found: &str| ModelError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        found: found.to_owned(),
    };
    // The class names the model best in an error, so it is looked up first.
    let by_class = match archs.first() {
        Some(first) => {
            Some(archs.iter().find_map(|a| Family::from_hf_class(a)).ok_or_else(|| unsupported(first))?)
        }
        None => None,
    };
    let by_type = match model_type {
        Some(t) => Some(Family::from_model_type(t).ok_or_else(|| unsupported(t))?),
        None => None,
    };
    match (by_class, by_type) {
        (Some(c), Some(t)) if c != t => Err(ModelError::config(
            path,
            format!("architectures says {} but model_type says {:?}", c.hf_class(), model_type.unwrap_or("")),
        )),
        (Some(f), _) | (None, Some(f)) => Ok(f),
        (None, None) => Err(ModelError::config(path, "neither `architectures` nor `model_type` is set")),
    }
}

/// The gate activation named by `hidden_act` (or Gemma's `hidden_activation`).
fn activation(raw: &RawConfig, family: Family, path: &Path) -> Result<Activation> {
    let name = raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref());
    match name {
        None if family == Family::Gemma3 => Ok(Activation::GeluTanh),
        None | Some("silu" | "swish") => Ok(Activation::Silu),
        Some("gelu_pytorch_tanh" | "gelu_new") => Ok(Activation::GeluTanh),
        Some(other) => Err(ModelError::config(
            path,
            format!("activation {other:?} is not supported (silu, gelu_pytorch_tanh)"),
        )),
    }
}

pub(super) fn architecture(
    family: Family,
    raw: &RawConfig,
    head_dim: usize,
    path: &Path,
) -> Result<Architecture> {
    let bad = |reason: String| Err(ModelError::config(path, reason));
    if raw.mlp_bias {
        return bad("mlp_bias is not supported".into());
    }
    if raw.attn_logit_softcapping.is_some() {
        return bad("attn_logit_softcapping is not supported".into());
    }
    if raw.partial_rotary_factor.is_some_and(|f| f != 1.0) {
        return bad("partial_rotary_factor other than 1 is not supported".into());
    }
    let mut arch = Architecture::llama(head_dim, raw.attention_bias);
    arch.family = family;
    arch.activation = activation(raw, family, path)?;
    arch.final_logit_softcap = match raw.final_logit_softcapping {
        None => None,
        Some(c) if c.is_finite() && c > 0.0 => Some(c as f32),
        Some(c) => return bad(format!("final_logit_softcapping {c} must be positive")),
    };
    match family {
        Family::Llama | Family::Mistral | Family::Phi3 => {}
        // Qwen2's Q/K/V always carry biases, its output projection never does.
        Family::Qwen2 => (arch.qkv_bias, arch.o_bias) = (true, false),
        Family::Qwen3 => arch.qk_norm = true,
        Family::Gemma3 => {
            arch.norm_weight_offset = 1.0;
            arch.qk_norm = true;
            arch.sandwich_norms = true;
            arch.embedding_scale = Some((raw.hidden_size as f32).sqrt());
            let scalar = raw.query_pre_attn_scalar.unwrap_or(head_dim as f64);
            if !(scalar.is_finite() && scalar > 0.0) {
                return bad(format!("query_pre_attn_scalar {scalar} must be positive"));
            }
            arch.attention_scale = (1.0 / scalar.sqrt()) as f32;
        }
    }
    Ok(arch)
}

/// Each layer's rotary table and window: `layer_types` where the config lists them, else the
/// family's rule (Gemma 3: every `sliding_window_pattern`-th layer global, the rest local;
/// Qwen: layers from `max_window_layers` on windowed when `use_sliding_window`; Mistral and
/// Phi-3: every layer windowed when `sliding_window` is set).
pub(super) fn layer_attention(family: Family, raw: &RawConfig, path: &Path) -> Result<Vec<LayerAttention>> {
    let n = raw.num_hidden_layers;
    let window = match raw.sliding_window {
        Some(0) => return Err(ModelError::config(path, "sliding_window must be positive")),
        w => w,
    };
    let local = |windowed: bool| -> Result<LayerAttention> {
        if !windowed {
            return Ok(LayerAttention::FULL);
        }
        let w = window.ok_or_else(|| ModelError::config(path, "sliding layers need `sliding_window`"))?;
        let rope = if family == Family::Gemma3 { RopeKind::Local } else { RopeKind::Global };
        Ok(LayerAttention { rope, sliding_window: Some(w) })
    };
    if let Some(types) = &raw.layer_types {
        if types.len() != n {
            return Err(ModelError::config(
                path,
                format!("layer_types lists {} layers, not {n}", types.len()),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(LayerAttention::FULL),
                "sliding_attention" => local(true),
                other => Err(ModelError::config(path, format!("layer type {other:?} is not supported"))),
            })
            .collect();
    }
    (0..n)
        .map(|l| match family {
            Family::Llama => Ok(LayerAttention::FULL),
            Family::Mistral | Family::Phi3 => local(window.is_some()),
            Family::Qwen2 | Family::Qwen3 => {
                local(raw.use_sliding_window && window.is_some() && l >= raw.max_window_layers.unwrap_or(0))
            }
            Family::Gemma3 => {
                let pattern = raw.sliding_window_pattern.unwrap_or(6).max(1);
                local(!(l + 1).is_multiple_of(pattern))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use crate::arch::{Activation, Family, LayerAttention, RopeKind};
    use crate::config::ModelConfig;
    use crate::error::ModelError;

    fn config(class: &str, model_type: &str, extra: serde_json::Value) -> crate::error::Result<ModelConfig> {
        let mut v = json!({
            "architectures": [class], "model_type": model_type,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "head_dim": 32,
            "rms_norm_eps": 1e-6, "rope_theta": 1e6
        });
        if let (Some(obj), Some(more)) = (v.as_object_mut(), extra.as_object()) {
            obj.extend(more.clone());
        }
        ModelConfig::from_json(&v.to_string(), Path::new("m/config.json"))
    }

    #[test]
    fn gemma3_has_its_norms_scales_and_every_sixth_layer_global() {
        let c = config(
            "Gemma3ForCausalLM",
            "gemma3_text",
            json!({"sliding_window": 512, "query_pre_attn_scalar": 256}),
        )
        .unwrap();
        let a = c.arch;
        assert_eq!(a.family, Family::Gemma3);
        assert_eq!((a.norm_weight_offset, a.qk_norm, a.sandwich_norms), (1.0, true, true));
        assert_eq!(a.activation, Activation::GeluTanh);
        assert_eq!(a.embedding_scale, Some(8.0));
        assert_eq!(a.attention_scale, 1.0 / 16.0);
        let local = LayerAttention { rope: RopeKind::Local, sliding_window: Some(512) };
        assert_eq!(c.layer_attention, [vec![local; 5], vec![LayerAttention::FULL]].concat());
        assert_eq!(c.max_full_attention_context(), 512);
    }

    #[test]
    fn layer_types_override_the_family_rule_and_must_list_every_layer() {
        let types = json!([
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention"
        ]);
        let c =
            config("Gemma3ForCausalLM", "gemma3_text", json!({"sliding_window": 16, "layer_types": types}))
                .unwrap();
        let windows: Vec<_> = c.layer_attention.iter().map(|l| l.sliding_window).collect();
        assert_eq!(windows, [Some(16), None, Some(16), None, Some(16), None]);
        let err =
            config("MistralForCausalLM", "mistral", json!({"layer_types": ["full_attention"]})).unwrap_err();
        assert!(err.to_string().contains("layer_types lists 1 layers, not 6"), "{err}");
    }

    #[test]
    fn qwen_and_mistral_windows_follow_transformers() {
        let c = config("Qwen2ForCausalLM", "qwen2", json!({"sliding_window": 32, "max_window_layers": 4}))
            .unwrap();
        assert!(c.layer_attention.iter().all(|l| *l == LayerAttention::FULL), "use_sliding_window is off");
        assert_eq!((c.arch.qkv_bias, c.arch.o_bias), (true, false));
        let c = config(
            "Qwen2ForCausalLM",
            "qwen2",
            json!({"sliding_window": 32, "max_window_layers": 4, "use_sliding_window": true}),
        )
        .unwrap();
        let windows: Vec<_> = c.layer_attention.iter().map(|l| l.sliding_window).collect();
        assert_eq!(windows, [None, None, None, None, Some(32), Some(32)]);
        let c = config("MistralForCausalLM", "mistral", json!({"sliding_window": 4096})).unwrap();
        assert!(
            c.layer_attention.iter().all(|l| l.sliding_window == Some(4096) && l.rope == RopeKind::Global)
        );
        let c = config("Qwen3ForCausalLM", "qwen3", json!({})).unwrap();
        assert!(c.arch.qk_norm && !c.arch.qkv_bias);
    }

    #[test]
    fn unknown_or_contradictory_architectures_are_refused_by_name() {
        let err = config("GPTNeoXForCausalLM", "gpt_neox", json!({})).unwrap_err();
        assert!(
            matches!(&err, ModelError::UnsupportedArchitecture { found, .. } if found == "GPTNeoXForCausalLM"),
            "{err}"
        );
        let err = config("LlamaForCausalLM", "qwen2", json!({})).unwrap_err();
        assert!(err.to_string().contains("architectures says LlamaForCausalLM"), "{err}");
        let err =
            config("Gemma3ForCausalLM", "gemma3_text", json!({"attn_logit_softcapping": 50.0})).unwrap_err();
        assert!(err.to_string().contains("attn_logit_softcapping"), "{err}");
    }
}
