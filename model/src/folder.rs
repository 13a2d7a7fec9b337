//! An ordinary Hugging Face model folder: config, generation config, tokenizer and chat
//! template (the weights are loaded separately by [`crate::Llama::load`]).

use std::path::{Path, PathBuf};

use crate::chat::ChatTemplate;
use crate::config::LlamaConfig;
use crate::error::Result;
use crate::generation::GenerationConfig;
use crate::tokenizer::Tokenizer;

/// Everything in a model folder except the weights.
#[derive(Debug)]
pub struct ModelFolder {
    pub dir: PathBuf,
    pub config: LlamaConfig,
    pub generation: GenerationConfig,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
}

impl ModelFolder {
    /// Reads `config.json`, `tokenizer.json`, and (when present) `generation_config.json`
    /// and `tokenizer_config.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let gen_path = dir.join("generation_config.json");
        let mut generation = if gen_path.exists() {
            GenerationConfig::from_file(&gen_path)?
        } else {
            GenerationConfig::default()
        };
        if generation.eos_token_ids.is_empty() {
            generation.eos_token_ids = config.eos_token_ids.clone();
        }
        if generation.bos_token_id.is_none() {
            generation.bos_token_id = config.bos_token_id;
        }
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let tc_path = dir.join("tokenizer_config.json");
        let chat_template =
            if tc_path.exists() { ChatTemplate::from_tokenizer_config(&tc_path)? } else { None };
        Ok(Self { dir: dir.to_path_buf(), config, generation, tokenizer, chat_template })
    }
}
