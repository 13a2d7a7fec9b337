//! `generation_config.json`: the stop ids and sampling defaults a model ships with (the engine
//! applies the sampling ones to every field a request leaves unset, as vLLM does).

use std::path::Path;

use serde::Deserialize;

use crate::config::TokenIds;
use crate::error::{ModelError, Result};

/// Generation defaults; every field is optional in the file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
}

#[derive(Deserialize)]
struct Raw {
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    pad_token_id: Option<TokenIds>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let raw: Raw = serde_json::from_str(&text).map_err(|e| ModelError::config(path, e.to_string()))?;
        let first = |ids: Option<TokenIds>| ids.and_then(|i| i.to_vec().first().copied());
        Ok(Self {
            bos_token_id: first(raw.bos_token_id),
            eos_token_ids: raw.eos_token_id.map(|i| i.to_vec()).unwrap_or_default(),
            pad_token_id: first(raw.pad_token_id),
            temperature: raw.temperature,
            top_p: raw.top_p,
            top_k: raw.top_k,
            min_p: raw.min_p,
            repetition_penalty: raw.repetition_penalty,
            max_new_tokens: raw.max_new_tokens,
        })
    }
}
