//! Starting the engine from the shared engine flags (the default model fetched when none is
//! named, a model name resolved) and reading JSONL inputs.

use std::path::Path;

use anyhow::Context;
use engine::{Engine, EngineConfig};
use model::LoadProgress;
use serde::de::DeserializeOwned;
use server::cli::EngineKnobs;

use crate::progress::{Progress, Unit};

/// Starting an engine from the shared engine flags: the default model fetched when none is
/// named, `--model smollm2` or `gemma3-270m` fetched when missing.
pub trait StartEngine {
    /// Loads the engine with `config`; unless `quiet`, logs to stderr (at `info` unless
    /// `RUST_LOG` says otherwise).
    fn start_engine_with(&self, quiet: bool, config: EngineConfig) -> anyhow::Result<Engine>;

    /// [`StartEngine::start_engine_with`] the knobs' own config.
    fn start_engine(&self, quiet: bool) -> anyhow::Result<Engine>;
}

impl StartEngine for EngineKnobs {
    fn start_engine(&self, quiet: bool) -> anyhow::Result<Engine> {
        self.start_engine_with(quiet, self.config())
    }

    fn start_engine_with(&self, quiet: bool, config: EngineConfig) -> anyhow::Result<Engine> {
        if !quiet {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
        }
        let dir = match &self.model {
            Some(arg) => crate::fetch_model::resolve_model(arg)?,
            None => crate::fetch_model::default_model()?,
        };
        let started = std::time::Instant::now();
        let engine = if quiet {
            Engine::new(&dir, config)
        } else {
            let mut bars = LoadBars::new(&dir);
            let engine = Engine::new_reporting(&dir, config, &mut |step| bars.show(step));
            // A failed load's bars stay where it stopped: finishing would print them at 100 %.
            if engine.is_ok() {
                bars.finish();
            }
            engine
        }
        .with_context(|| format!("loading {}", dir.display()))?;
        if !quiet {
            let c = engine.model_config();
            eprintln!(
                "paged-llm: loaded {} in {:.1} s: {} layers, hidden {}, {:.0} MiB of weights read per step, {} KV blocks",
                dir.display(),
                started.elapsed().as_secs_f64(),
                c.num_hidden_layers,
                c.hidden_size,
                engine.weight_bytes_per_step() as f64 / (1u64 << 20) as f64,
                engine.num_kv_blocks()
            );
        }
        Ok(engine)
    }
}

/// A model's load as two bars: the checkpoint's bytes read, then the tensors built from them.
struct LoadBars {
    name: String,
    bytes: Option<Progress>,
    tensors: Option<Progress>,
}

impl LoadBars {
    fn new(dir: &Path) -> Self {
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        Self { name, bytes: None, tensors: None }
    }

    fn show(&mut self, step: LoadProgress) {
        match step {
            LoadProgress::Bytes { done, total } => {
                let name = &self.name;
                let new = || Progress::new(total, &format!("reading {name}"), Unit::Bytes);
                self.bytes.get_or_insert_with(new).set_position(done);
            }
            LoadProgress::Tensors { done, total } => {
                if let Some(bytes) = self.bytes.take() {
                    bytes.finish();
                }
                let unit = Unit::Items("tensors");
                let tensors =
                    self.tensors.get_or_insert_with(|| Progress::new(total as u64, "loading", unit));
                tensors.set_position(done as u64);
            }
        }
    }

    fn finish(self) {
        self.bytes.into_iter().chain(self.tensors).for_each(Progress::finish);
    }
}

/// The non-blank lines of a JSONL file, each parsed as a `T` (`what` names a line that does
/// not parse) and turned into a `U` by `each`, which is given its `path:line` for messages.
pub fn read_jsonl<T: DeserializeOwned, U>(
    path: &Path,
    what: &str,
    mut each: impl FnMut(&str, T) -> anyhow::Result<U>,
) -> anyhow::Result<Vec<U>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    lines
        .map(|(i, line)| {
            let at = format!("{}:{}", path.display(), i + 1);
            let value = serde_json::from_str(line).with_context(|| format!("{at}: {what}"))?;
            each(&at, value)
        })
        .collect()
}
