//! Rebuilds a Hugging Face `tokenizer.json` from a GGUF's vocabulary: byte-level BPE
//! (`tokenizer.ggml.model = gpt2`) with its merges and the pre-tokenizer llama.cpp names in
//! `tokenizer.ggml.pre`, or SentencePiece-style (`llama`: tokens with scores, byte tokens,
//! `spm.rs`); control / unknown / user-defined tokens become added tokens either way.

use serde_json::{Value, json};

use super::reader::{GgufFile, GgufValue};
use super::spm;
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// `tokenizer.ggml.model`: which tokenizer llama.cpp runs over the vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabModel {
    /// `gpt2`: byte-level BPE with merges.
    Gpt2,
    /// `llama`: SentencePiece-style, tokens with scores and `<0xNN>` byte tokens.
    Llama,
}

/// The GGUF vocabulary and the special ids the other files need.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    pub model: VocabModel,
    pub tokens: Vec<String>,
    pub token_types: Vec<i64>,
    /// `gpt2` only (empty for `llama`).
    pub merges: Vec<String>,
    /// `llama` only (empty for `gpt2`): a token's priority when merging.
    pub scores: Vec<f32>,
    pub pre: String,
    /// `llama` only: a `▁` goes before the text and after every special token.
    pub add_space_prefix: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub unk_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    pub chat_template: Option<String>,
}

fn string_array(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    let arr = g
        .get(key)
        .and_then(GgufValue::as_array)
        .ok_or_else(|| ModelError::gguf(&g.path, format!("missing array metadata `{key}`")))?;
    arr.iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ModelError::gguf(&g.path, format!("`{key}` is not an array of strings")))
}

impl GgufVocab {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = match g.require_str("tokenizer.ggml.model")? {
            "gpt2" => VocabModel::Gpt2,
            "llama" => VocabModel::Llama,
            other => {
                return Err(ModelError::gguf(
                    &g.path,
                    format!("tokenizer model {other:?} is not supported (supported: gpt2, llama)"),
                ));
            }
        };
        let tokens = string_array(g, "tokenizer.ggml.tokens")?;
        let token_types = match g.get("tokenizer.ggml.token_type").and_then(GgufValue::as_array) {
            Some(arr) => arr.iter().map(|v| v.as_f64().map(|f| f as i64).unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        if token_types.len() != tokens.len() {
            return Err(ModelError::gguf(&g.path, "token_type and tokens have different lengths"));
        }
        let spm = model == VocabModel::Llama;
        let (merges, scores) = if spm {
            // Scores are optional in llama.cpp too: all 0 then, merges in id order.
            let scores = match g.get("tokenizer.ggml.scores").and_then(GgufValue::as_array) {
                Some(arr) => arr.iter().map(|v| v.as_f64().map(|f| f as f32).unwrap_or(0.0)).collect(),
                None => vec![0.0; tokens.len()],
            };
            if scores.len() != tokens.len() {
                return Err(ModelError::gguf(&g.path, "scores and tokens have different lengths"));
            }
            (Vec::new(), scores)
        } else {
            (string_array(g, "tokenizer.ggml.merges")?, Vec::new())
        };
        let id = |key: &str| g.get(key).and_then(GgufValue::as_u64).map(|v| v as u32);
        let flag = |key: &str, default: bool| g.get(key).and_then(GgufValue::as_bool).unwrap_or(default);
        // llama.cpp's defaults for an SPM vocabulary that does not name them: <unk> 0, <s> 1,
        // </s> 2, BOS added, space prefix added.
        let spm_default = |v: u32| spm.then_some(v);
        Ok(Self {
            model,
            pre: g.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default").to_owned(),
            tokens,
            token_types,
            merges,
            scores,
            add_space_prefix: spm && flag("tokenizer.ggml.add_space_prefix", true),
            bos_token_id: id("tokenizer.ggml.bos_token_id").or(spm_default(1)),
            eos_token_id: id("tokenizer.ggml.eos_token_id").or(spm_default(2)),
            unk_token_id: id("tokenizer.ggml.unknown_token_id").or(spm_default(0)),
            pad_token_id: id("tokenizer.ggml.padding_token_id"),
            add_bos_token: flag("tokenizer.ggml.add_bos_token", spm),
            add_eos_token: flag("tokenizer.ggml.add_eos_token", false),
            chat_template: g.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_owned),
        })
    }

    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize)).map(String::as_str)
    }

    /// The pre-tokenizer llama.cpp applies for `tokenizer.ggml.pre`, in HF form.
    fn pre_tokenizer(&self) -> Result<Value> {
        let byte_level =
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        match self.pre.as_str() {
            // GPT-2's regex.
            "default" | "gpt2" => Ok(byte_level),
            // Every digit its own piece, then GPT-2's regex (StarCoder / SmolLM).
            "smollm" | "starcoder" | "refact" => Ok(json!({
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level]
            })),
            other => Err(ModelError::Tokenize(format!(
                "GGUF pre-tokenizer {other:?} is not supported (supported: default, gpt2, smollm, starcoder, refact)"
            ))),
        }
    }

    /// The tokenizer, built from [`Self::tokenizer_json`]; `path` names the GGUF in errors.
    pub fn tokenizer(&self, path: &std::path::Path) -> Result<Tokenizer> {
        let bad = |reason: String| ModelError::Tokenizer { path: path.to_path_buf(), reason };
        let json = self.tokenizer_json().map_err(|e| bad(e.to_string()))?;
        let bytes = serde_json::to_vec(&json).map_err(|e| bad(e.to_string()))?;
        Tokenizer::from_bytes(&bytes, path)
    }

    /// The `tokenizer.json` document.
    pub fn tokenizer_json(&self) -> Result<Value> {
        let vocab: serde_json::Map<String, Value> =
            self.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
        // llama.cpp splits these out of the text before its tokenizer runs: user-defined ones
        // always, control and unknown ones when it parses special tokens (`tokenizers`' special
        // added tokens, which `Tokenizer::encode` leaves in the text when not parsing).
        let added: Vec<Value> = self
            .tokens
            .iter()
            .zip(&self.token_types)
            .enumerate()
            .filter(|(_, (_, ty))| {
                matches!(**ty, TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN | TOKEN_TYPE_USER_DEFINED)
            })
            .map(|(id, (content, ty))| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": *ty != TOKEN_TYPE_USER_DEFINED})
            })
            .collect();
        let post_processor = self.post_processor();
        if self.model == VocabModel::Llama {
            let merges = spm::merges_from_scores(&self.tokens, &self.scores);
            return Ok(json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": added,
                "normalizer": spm::normalizer(self.add_space_prefix),
                "pre_tokenizer": null,
                "post_processor": post_processor,
                "decoder": spm::decoder(),
                "model": spm::model(vocab, merges, self.token(self.unk_token_id)),
            }));
        }
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": self.pre_tokenizer()?,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": self.merges,
            }
        }))
    }

    /// ByteLevel offsets fix-up, plus BOS/EOS when the GGUF says they are added.
    fn post_processor(&self) -> Value {
        let bos = self.token(self.bos_token_id).filter(|_| self.add_bos_token);
        let eos = self.token(self.eos_token_id).filter(|_| self.add_eos_token);
        if bos.is_none() && eos.is_none() {
            if self.model == VocabModel::Llama {
                return Value::Null;
            }
            return json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
        }
        let mut special = serde_json::Map::new();
        for (tok, id) in [(bos, self.bos_token_id), (eos, self.eos_token_id)] {
            if let Some(t) = tok {
                special.insert(t.to_owned(), json!({"id": t, "ids": [id], "tokens": [t]}));
            }
        }
        let template = |seqs: &[(&str, u32)]| -> Vec<Value> {
            let mut out = Vec::new();
            for &(seq, type_id) in seqs {
                if let Some(b) = bos {
                    out.push(json!({"SpecialToken": {"id": b, "type_id": type_id}}));
                }
                out.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
                if let Some(e) = eos {
                    out.push(json!({"SpecialToken": {"id": e, "type_id": type_id}}));
                }
            }
            out
        };
        let single = template(&[("A", 0)]);
        let pair = template(&[("A", 0), ("B", 1)]);
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special})
    }

    /// The `tokenizer_config.json` document (special tokens and the chat template).
    pub fn tokenizer_config_json(&self, model_max_length: u64) -> Value {
        json!({
            "add_bos_token": self.add_bos_token,
            "add_eos_token": self.add_eos_token,
            "bos_token": self.token(self.bos_token_id),
            "eos_token": self.token(self.eos_token_id),
            "unk_token": self.token(self.unk_token_id),
            "pad_token": self.token(self.pad_token_id),
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": false,
            "model_max_length": model_max_length,
            // The generic class: it takes `tokenizer.json` as it is (a named SentencePiece class
            // would apply its own prefix-space settings on top).
            "tokenizer_class": match self.model {
                VocabModel::Gpt2 => "GPT2Tokenizer",
                VocabModel::Llama => "PreTrainedTokenizerFast",
            },
        })
    }
}
