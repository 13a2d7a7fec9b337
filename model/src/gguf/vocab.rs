//! Rebuilds a Hugging Face `tokenizer.json` from a GGUF's vocabulary: byte-level BPE
//! (`tokenizer.ggml.model = gpt2`) with its merges, the pre-tokenizer llama.cpp names in
//! `tokenizer.ggml.pre`, and control / user-defined tokens as added tokens.

use serde_json::{Value, json};

use super::reader::{GgufFile, GgufValue};
use crate::error::{ModelError, Result};

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The GGUF vocabulary and the special ids the other files need.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    pub tokens: Vec<String>,
    pub token_types: Vec<i64>,
    pub merges: Vec<String>,
    pub pre: String,
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
        let model = g.require_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(ModelError::gguf(
                &g.path,
                format!("tokenizer model {model:?} is not supported (only byte-level BPE, `gpt2`)"),
            ));
        }
        let tokens = string_array(g, "tokenizer.ggml.tokens")?;
        let token_types = match g.get("tokenizer.ggml.token_type").and_then(GgufValue::as_array) {
            Some(arr) => arr.iter().map(|v| v.as_f64().map(|f| f as i64).unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        if token_types.len() != tokens.len() {
            return Err(ModelError::gguf(&g.path, "token_type and tokens have different lengths"));
        }
        let merges = string_array(g, "tokenizer.ggml.merges")?;
        let id = |key: &str| g.get(key).and_then(GgufValue::as_u64).map(|v| v as u32);
        let flag = |key: &str, default: bool| g.get(key).and_then(GgufValue::as_bool).unwrap_or(default);
        Ok(Self {
            pre: g.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default").to_owned(),
            tokens,
            token_types,
            merges,
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_id: id("tokenizer.ggml.eos_token_id"),
            unk_token_id: id("tokenizer.ggml.unknown_token_id"),
            pad_token_id: id("tokenizer.ggml.padding_token_id"),
            add_bos_token: flag("tokenizer.ggml.add_bos_token", false),
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

    /// The `tokenizer.json` document.
    pub fn tokenizer_json(&self) -> Result<Value> {
        let vocab: serde_json::Map<String, Value> =
            self.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
        let added: Vec<Value> = self
            .tokens
            .iter()
            .zip(&self.token_types)
            .enumerate()
            .filter(|(_, (_, ty))| matches!(**ty, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .map(|(id, (content, ty))| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": *ty == TOKEN_TYPE_CONTROL})
            })
            .collect();
        let post_processor = self.post_processor();
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
            "tokenizer_class": "GPT2Tokenizer",
        })
    }
}
