//! An ordinary Hugging Face model folder, or a GGUF file standing for one: config, generation
//! config, tokenizer and chat template (the weights are loaded separately by
//! [`crate::Model::load`]).

use std::path::{Path, PathBuf};

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::decoder::Model;
use crate::error::{ModelError, Result};
use crate::generation::GenerationConfig;
use crate::gguf::{self, GgufFile, GgufVocab};
use crate::load_progress::{OnLoad, unwatched};
use crate::tokenizer::Tokenizer;
use crate::weights::SafetensorsFiles;

/// Everything in a model folder except the weights.
#[derive(Debug)]
pub struct ModelFolder {
    /// The folder, or the GGUF file.
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub generation: GenerationConfig,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
}

impl ModelFolder {
    /// Reads `config.json`, `tokenizer.json`, and (when present) `generation_config.json`
    /// and `tokenizer_config.json`.
    ///
    /// A file (rather than a folder) is read as a GGUF: the same four from its metadata.
    pub fn open(dir: &Path) -> Result<Self> {
        if dir.is_file() {
            return Self::from_gguf(&GgufFile::open(dir)?);
        }
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
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

    /// Replaces the chat template with the Jinja file at `path` (vLLM's `--chat-template`), over
    /// the model's special tokens; a file that cannot be read or compiled is an error naming it.
    pub fn override_chat_template(&mut self, path: &Path) -> Result<()> {
        let source = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let template = match &self.chat_template {
            Some(t) => t.with_source(&source),
            None => {
                let token =
                    |id: Option<u32>| id.and_then(|id| self.tokenizer.id_to_token(id)).unwrap_or_default();
                let eos = token(self.generation.eos_token_ids.first().copied());
                ChatTemplate::new(&source, &token(self.generation.bos_token_id), &eos)
            }
        };
        self.chat_template = Some(template.map_err(|e| ModelError::config(path, e.to_string()))?);
        Ok(())
    }

    /// [`Self::open`] and the weights ([`Model::load`]), with each file read once: a GGUF is
    /// opened ([`GgufFile::open_for_weights`]) and its metadata (vocabulary, config) parsed a
    /// single time.
    pub fn open_with_weights(path: &Path) -> Result<(Self, Model)> {
        Self::open_with_weights_reporting(path, &mut unwatched)
    }

    /// [`Self::open_with_weights`], its progress reported to `on`: the checkpoint's bytes as
    /// they are read into memory, then the tensors as the model is built from them.
    pub fn open_with_weights_reporting(path: &Path, on: OnLoad<'_>) -> Result<(Self, Model)> {
        if path.is_file() {
            let g = GgufFile::open_for_weights(path, on)?;
            let folder = Self::from_gguf(&g)?;
            let model = Model::from_gguf_with_config(&g, folder.config.clone(), on)?;
            return Ok((folder, model));
        }
        let folder = Self::open(path)?;
        let files = SafetensorsFiles::open_dir(path)?;
        files.fault_in(on);
        let model = Model::from_safetensors(folder.config.clone(), &files, on)?;
        Ok((folder, model))
    }

    /// The config, tokenizer (rebuilt from `tokenizer.ggml.*`: `gguf/vocab.rs`) and chat template
    /// (`tokenizer.chat_template`) of a GGUF, as its HF conversion would have them.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = &g.path;
        let vocab = GgufVocab::from_gguf(g)?;
        let meta = gguf::GgufModelMeta::read(g, &vocab)?;
        let config = meta.model_config(path)?;
        let generation = GenerationConfig {
            bos_token_id: config.bos_token_id,
            eos_token_ids: config.eos_token_ids.clone(),
            ..GenerationConfig::default()
        };
        let tokenizer = vocab.tokenizer(path)?;
        let chat_template =
            ChatTemplate::from_tokenizer_config_value(&vocab.tokenizer_config_json(meta.n_ctx), path)?;
        Ok(Self { dir: path.clone(), config, generation, tokenizer, chat_template })
    }
}
