//! PEFT's LoRA format: `adapter_config.json` beside `adapter_model.safetensors`, every tensor
//! named `base_model.model.model.layers.<l>.<self_attn|mlp>.<module>.lora_<A|B>.weight` and
//! checked against the base model's shapes before anything is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use super::{LoraAdapter, LoraPair, TARGET_MODULES};
use crate::arch::{LayerMatrix, RopeStyle};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::SafetensorsFiles;

/// The adapter's configuration file, inside the adapter folder.
pub(crate) const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights, inside the adapter folder.
pub(crate) const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// The fields of PEFT's `LoraConfig` that change what the weights compute.
#[derive(Debug, Deserialize)]
struct PeftConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    target_modules: Option<serde_json::Value>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    lora_bias: bool,
    /// Fields whose non-null value changes what an adapter computes in ways we do not serve.
    #[serde(default)]
    layer_replication: Option<serde_json::Value>,
    #[serde(default)]
    target_parameters: Option<serde_json::Value>,
    #[serde(default)]
    trainable_token_indices: Option<serde_json::Value>,
    #[serde(default)]
    alora_invocation_tokens: Option<serde_json::Value>,
    #[serde(default)]
    rank_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, serde_json::Value>,
}

fn bad(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Lora { path: path.to_path_buf(), reason: reason.into() }
}

impl PeftConfig {
    fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let config: Self = serde_json::from_str(&text).map_err(|e| bad(path, format!("malformed: {e}")))?;
        if let Some(t) = config.peft_type.as_deref().filter(|t| *t != "LORA") {
            return Err(bad(path, format!("peft_type {t:?} is not LORA")));
        }
        if config.r == 0 {
            return Err(bad(path, "r must be at least 1"));
        }
        if !(config.lora_alpha.is_finite()) {
            return Err(bad(path, "lora_alpha must be a finite number"));
        }
        let unsupported = [
            (config.use_dora, "use_dora"),
            (config.bias.as_deref().is_some_and(|b| b != "none"), "bias other than \"none\""),
            (config.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()), "modules_to_save"),
            (!config.rank_pattern.is_empty(), "rank_pattern"),
            (!config.alpha_pattern.is_empty(), "alpha_pattern"),
            (config.lora_bias, "lora_bias"),
            (config.layer_replication.as_ref().is_some_and(|v| !v.is_null()), "layer_replication"),
            (config.target_parameters.as_ref().is_some_and(|v| !v.is_null()), "target_parameters"),
            (
                config.trainable_token_indices.as_ref().is_some_and(|v| !v.is_null()),
                "trainable_token_indices",
            ),
            (
                config.alora_invocation_tokens.as_ref().is_some_and(|v| !v.is_null()),
                "alora_invocation_tokens",
            ),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(on, _)| *on) {
            return Err(bad(path, format!("{what} is not supported")));
        }
        Ok(config)
    }

    /// PEFT's scaling: `alpha / r`, or `alpha / √r` with rsLoRA.
    fn scale(&self) -> f32 {
        let r = self.r as f64;
        (if self.use_rslora { self.lora_alpha / r.sqrt() } else { self.lora_alpha / r }) as f32
    }

    /// The module names `target_modules` lists, when it is a list (a regex string names none).
    fn listed_modules(&self) -> Option<BTreeSet<String>> {
        let list = self.target_modules.as_ref()?.as_array()?;
        Some(list.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
    }
}

/// PEFT's name of tensor `ab` ("A" or "B") of module `module` (an index in `TARGET_MODULES`)
/// of layer `layer`.
pub(crate) fn tensor_name(layer: usize, module: usize, ab: &str) -> String {
    let block = if module < 4 { "self_attn" } else { "mlp" };
    format!("base_model.model.model.layers.{layer}.{block}.{}.lora_{ab}.weight", TARGET_MODULES[module].0)
}

/// One tensor name parsed: layer, module index in `TARGET_MODULES`, and whether it is `A`.
fn parse_name(name: &str) -> Option<(usize, usize, bool)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (block, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let is_a = match rest {
        "lora_A.weight" => true,
        "lora_B.weight" => false,
        _ => return None,
    };
    let index = TARGET_MODULES.iter().position(|(m, ..)| *m == module)?;
    let expected_block = if index < 4 { "self_attn" } else { "mlp" };
    (block == expected_block).then_some((layer, index, is_a))
}

/// llama.cpp's row order of Q and K within each head (pairs interleaved), applied to `B`'s rows
/// where the base model was read from a GGUF in that order (`RopeStyle::Interleaved`).
pub(super) fn interleave_rows(b: &[f32], rank: usize, head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0; b.len()];
    for (head, rows) in b.chunks_exact(head_dim * rank).enumerate() {
        for i in 0..half {
            for j in 0..2 {
                let (to, from) = (2 * i + j, j * half + i);
                let dst = (head * head_dim + to) * rank;
                out[dst..dst + rank].copy_from_slice(&rows[from * rank..(from + 1) * rank]);
            }
        }
    }
    out
}

impl LoraAdapter {
    /// Loads the PEFT adapter in folder `dir` for a base model of `config`. Every tensor must
    /// name a layer and projection the base has, with `A` `[r, in]` and `B` `[out, r]`; an
    /// error names the file and tensor.
    pub fn load_peft(name: impl Into<String>, dir: &Path, config: &ModelConfig) -> Result<Self> {
        let config_path = dir.join(ADAPTER_CONFIG);
        let peft = PeftConfig::read(&config_path)?;
        let weights_path = dir.join(ADAPTER_WEIGHTS);
        if !weights_path.is_file() {
            return Err(ModelError::Io {
                path: weights_path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no adapter weights (safetensors)"),
            });
        }
        let files = SafetensorsFiles::open_files(std::slice::from_ref(&weights_path), weights_path.clone())?;
        let mut found: BTreeMap<(usize, usize), [bool; 2]> = BTreeMap::new();
        for tensor in files.names() {
            let parsed = parse_name(tensor).filter(|&(l, ..)| l < config.num_hidden_layers);
            let Some((layer, module, is_a)) = parsed else {
                return Err(bad(
                    &weights_path,
                    format!("tensor `{tensor}` names no LoRA pair of this base model"),
                ));
            };
            found.entry((layer, module)).or_default()[usize::from(!is_a)] = true;
        }
        if found.is_empty() {
            return Err(bad(&weights_path, "no LoRA tensors"));
        }
        let listed = peft.listed_modules();
        let mut adapter = Self::empty(name, config.num_hidden_layers);
        let scale = peft.scale();
        for (&(layer, module), &[has_a, has_b]) in &found {
            let (module_name, matrix, part) = TARGET_MODULES[module];
            let tensor = |ab| tensor_name(layer, module, ab);
            if !(has_a && has_b) {
                let missing = tensor(if has_a { "B" } else { "A" });
                return Err(ModelError::MissingTensor { path: weights_path, tensor: missing });
            }
            if listed.as_ref().is_some_and(|l| !l.contains(module_name)) {
                return Err(bad(
                    &config_path,
                    format!("`{module_name}` has weights but is not in target_modules"),
                ));
            }
            let (in_dim, out_dim) = super::part_dims(config, matrix, part);
            let r = peft.r;
            let a = files.load_f32(&tensor("A"), &[r, in_dim])?;
            let mut b = files.load_f32(&tensor("B"), &[out_dim, r])?;
            if config.arch.rope_style == RopeStyle::Interleaved && matrix == LayerMatrix::Qkv && part < 2 {
                b = interleave_rows(&b, r, config.head_dim);
            }
            adapter.set(layer, matrix, part, LoraPair { rank: r, in_dim, out_dim, a, b, scale });
        }
        Ok(adapter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_into_layer_module_and_half() {
        let name = "base_model.model.model.layers.3.self_attn.k_proj.lora_B.weight";
        assert_eq!(parse_name(name), Some((3, 1, false)));
        assert_eq!(
            parse_name("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"),
            Some((0, 6, true))
        );
        for wrong in [
            "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.bias",
            "base_model.model.model.layers.x.self_attn.q_proj.lora_A.weight",
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",
        ] {
            assert_eq!(parse_name(wrong), None, "{wrong}");
        }
    }

    #[test]
    fn written_names_parse_back() {
        for module in 0..TARGET_MODULES.len() {
            assert_eq!(parse_name(&tensor_name(3, module, "A")), Some((3, module, true)));
            assert_eq!(parse_name(&tensor_name(0, module, "B")), Some((0, module, false)));
        }
    }

    #[test]
    fn interleaving_puts_each_rotation_pair_side_by_side() {
        // One head of 4 rows (rank 1): HF order [x0, x1, y0, y1] becomes [x0, y0, x1, y1].
        assert_eq!(interleave_rows(&[0.0, 1.0, 2.0, 3.0], 1, 4), vec![0.0, 2.0, 1.0, 3.0]);
    }
}
