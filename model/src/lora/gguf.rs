//! llama.cpp's LoRA GGUF (`general.type = adapter`, `adapter.type = lora`, written by its
//! `convert_lora_to_gguf.py`): tensors `blk.<l>.<attn_q|attn_k|attn_v|attn_output|ffn_gate|
//! ffn_up|ffn_down>.weight.lora_<a|b>` (`A` `[r, in]`, `B` `[out, r]` in row-major order, any
//! ggml type the reader dequantizes) and the scale llama.cpp applies, `adapter.lora.alpha / r`
//! (`1` where alpha is 0). Q and K's `B` rows are in the order llama.cpp's converter writes for
//! the architecture (permuted for Llama), turned into the base model's.

use std::collections::BTreeMap;
use std::path::Path;

use super::{LoraAdapter, LoraPair, TARGET_MODULES};
use crate::arch::{Family, LayerMatrix, RopeStyle};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::gguf::convert::unpermute_qk;

/// llama.cpp's tensor names of [`TARGET_MODULES`], in its order.
const GGUF_MODULES: [&str; 7] =
    ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

fn bad(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Lora { path: path.to_path_buf(), reason: reason.into() }
}

/// `blk.<layer>.<module>.weight.lora_<a|b>` as (layer, index into [`TARGET_MODULES`], is A).
fn parse_name(name: &str) -> Option<(usize, usize, bool)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, half) = rest.split_once(".weight.lora_")?;
    let is_a = match half {
        "a" => true,
        "b" => false,
        _ => return None,
    };
    let index = GGUF_MODULES.iter().position(|m| *m == module)?;
    Some((layer.parse().ok()?, index, is_a))
}

/// Whether llama.cpp's converter writes Q and K rows permuted (pairs interleaved) for a model of
/// `family`: its Llama converter does, the others keep the checkpoint's order.
fn rows_interleaved(family: Family) -> bool {
    family.gguf_arch() == "llama"
}

impl LoraAdapter {
    /// Loads llama.cpp's LoRA GGUF at `path` for a base model of `config`: the file must be an
    /// adapter of the base's architecture, and every tensor a pair of a layer and projection the
    /// base has, with matching shapes; an error names the file and tensor.
    pub fn load_gguf(name: impl Into<String>, path: &Path, config: &ModelConfig) -> Result<Self> {
        let g = GgufFile::open(path)?;
        let kind =
            (g.get("general.type").and_then(|v| v.as_str()), g.get("adapter.type").and_then(|v| v.as_str()));
        if kind != (Some("adapter"), Some("lora")) {
            return Err(bad(path, "not a LoRA adapter (general.type adapter, adapter.type lora)"));
        }
        let arch = g.require_str("general.architecture")?;
        if arch != config.arch.family.gguf_arch() {
            let base = config.arch.family.gguf_arch();
            return Err(bad(path, format!("an adapter of a {arch} model, the base is {base}")));
        }
        let alpha = g.get("adapter.lora.alpha").and_then(|v| v.as_f64()).unwrap_or(0.0) as f32;
        let mut pairs: BTreeMap<(usize, usize), [Option<usize>; 2]> = BTreeMap::new();
        for (i, t) in g.tensors.iter().enumerate() {
            let parsed = parse_name(&t.name).filter(|&(l, ..)| l < config.num_hidden_layers);
            let Some((layer, module, is_a)) = parsed else {
                return Err(bad(path, format!("tensor `{}` names no LoRA pair of this base model", t.name)));
            };
            pairs.entry((layer, module)).or_default()[usize::from(!is_a)] = Some(i);
        }
        if pairs.is_empty() {
            return Err(bad(path, "no LoRA tensors"));
        }
        let turn_rows =
            rows_interleaved(config.arch.family) != (config.arch.rope_style == RopeStyle::Interleaved);
        let mut adapter = Self::empty(name, config.num_hidden_layers);
        for (&(layer, module), &[a, b]) in &pairs {
            let tensor = |half: &str| format!("blk.{layer}.{}.weight.lora_{half}", GGUF_MODULES[module]);
            let (Some(a), Some(b)) = (a, b) else {
                let missing = tensor(if a.is_some() { "b" } else { "a" });
                return Err(ModelError::MissingTensor { path: path.to_path_buf(), tensor: missing });
            };
            let (_, matrix, part) = TARGET_MODULES[module];
            let (in_dim, out_dim) = super::part_dims(config, matrix, part);
            let (a, b) = (&g.tensors[a], &g.tensors[b]);
            let rank = a.shape().first().copied().unwrap_or(0);
            for (t, want) in [(a, [rank, in_dim]), (b, [out_dim, rank])] {
                if rank == 0 || t.shape() != want {
                    let got = t.shape();
                    return Err(bad(
                        path,
                        format!("tensor `{}` has shape {got:?}, this base needs {want:?}", t.name),
                    ));
                }
            }
            let mut b_rows = g.tensor_f32(b);
            if turn_rows && matrix == LayerMatrix::Qkv && part < 2 {
                let heads = out_dim / config.head_dim;
                b_rows = if rows_interleaved(config.arch.family) {
                    unpermute_qk(&b_rows, heads, rank)
                } else {
                    super::peft::interleave_rows(&b_rows, rank, config.head_dim)
                };
            }
            let scale = if alpha == 0.0 { 1.0 } else { alpha / rank as f32 };
            adapter.set(
                layer,
                matrix,
                part,
                LoraPair { rank, in_dim, out_dim, a: g.tensor_f32(a), b: b_rows, scale },
            );
        }
        Ok(adapter)
    }

    /// Loads the adapter at `path`: llama.cpp's LoRA GGUF when `path` is a file, PEFT's format
    /// when it is a folder.
    pub fn load(name: impl Into<String>, path: &Path, config: &ModelConfig) -> Result<Self> {
        if path.is_file() { Self::load_gguf(name, path, config) } else { Self::load_peft(name, path, config) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_into_layer_module_and_half() {
        assert_eq!(parse_name("blk.3.attn_k.weight.lora_a"), Some((3, 1, true)));
        assert_eq!(parse_name("blk.0.ffn_down.weight.lora_b"), Some((0, 6, false)));
        for bad in [
            "blk.0.attn_norm.weight.lora_a",
            "token_embd.weight.lora_a",
            "blk.x.attn_q.weight.lora_a",
            "blk.1.attn_q.weight",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }
}
