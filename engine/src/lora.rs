//! The LoRA adapters an engine serves (vLLM's `--enable-lora`): a registry of named adapters,
//! each loaded from its PEFT folder or llama.cpp LoRA GGUF off the engine thread, at most
//! `max_cpu_loras` of them in memory (the least recently used idle one is dropped and read again
//! when next asked for),
//! and what a request names (`LoraRequest`). A request holds its adapter for its whole life, so
//! an adapter in use is never dropped: unloading one takes its name away at once (new requests
//! naming it are refused) while the requests already admitted finish under it, its memory
//! going with the last of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use model::{LoraAdapter, ModelConfig};
use parking_lot::Mutex;

/// LoRA serving limits (vLLM's `--max-loras`, `--max-lora-rank`, `--max-cpu-loras`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraConfig {
    /// Most distinct adapters in one step.
    pub max_loras: usize,
    /// Largest rank an adapter may have.
    pub max_lora_rank: usize,
    /// Most adapters kept in memory; `None`: `max_loras`.
    pub max_cpu_loras: Option<usize>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self { max_loras: 1, max_lora_rank: 16, max_cpu_loras: None }
    }
}

impl LoraConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.max_loras == 0 {
            return Err("max_loras must be at least 1".into());
        }
        if self.max_lora_rank == 0 {
            return Err("max_lora_rank must be at least 1".into());
        }
        if self.max_cpu_loras.is_some_and(|m| m < self.max_loras) {
            return Err("max_cpu_loras must be at least max_loras".into());
        }
        Ok(())
    }

    fn memory_slots(&self) -> usize {
        self.max_cpu_loras.unwrap_or(self.max_loras)
    }
}

/// The adapter a request runs under (vLLM's `LoRARequest`): a registered name, or a name and
/// the folder to load it from when it is not registered yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraRequest {
    pub name: String,
    pub path: Option<PathBuf>,
}

impl LoraRequest {
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into(), path: None }
    }

    pub fn at(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self { name: name.into(), path: Some(path.into()) }
    }
}

/// Why an adapter could not be registered, found or dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoraError {
    #[error("LoRA is not enabled on this engine (start it with --enable-lora)")]
    NotEnabled,
    #[error("LoRA adapters run on the CPU device; this engine runs on CUDA")]
    NotOnThisDevice,
    #[error("no LoRA adapter named {0:?}")]
    NotFound(String),
    #[error("a LoRA adapter named {0:?} is already loaded")]
    AlreadyLoaded(String),
    #[error("LoRA adapter {name:?} has rank {rank}, above max_lora_rank {max}")]
    RankTooLarge { name: String, rank: usize, max: usize },
    #[error("LoRA adapter name {0:?} is the base model's name or empty")]
    BadName(String),
    #[error("{0}")]
    Load(String),
}

/// One adapter the engine knows: its numeric id (vLLM's `lora_int_id`: what the prefix cache
/// keys on), its folder, and its weights while in memory.
#[derive(Debug)]
struct Entry {
    id: u32,
    path: PathBuf,
    loaded: Option<Arc<LoraAdapter>>,
    last_used: u64,
    usage: Arc<Usage>,
}

/// How many requests of an adapter wait for their first step and how many run (vLLM's
/// `lora_requests_info`), kept by the requests' [`LoraHold`]s.
#[derive(Debug, Default)]
struct Usage {
    waiting: AtomicUsize,
    running: AtomicUsize,
}

/// A request's hold on its adapter: the weights, and its place in the adapter's counts until
/// it is dropped with the request.
#[derive(Debug)]
pub(crate) struct LoraHold {
    pub adapter: Arc<LoraAdapter>,
    usage: Arc<Usage>,
    running: bool,
}

impl LoraHold {
    fn new(adapter: Arc<LoraAdapter>, usage: Arc<Usage>) -> Self {
        usage.waiting.fetch_add(1, Ordering::Relaxed);
        Self { adapter, usage, running: false }
    }

    /// The request was scheduled for the first time.
    pub fn set_running(&mut self) {
        if !std::mem::replace(&mut self.running, true) {
            self.usage.waiting.fetch_sub(1, Ordering::Relaxed);
            self.usage.running.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for LoraHold {
    fn drop(&mut self) {
        let counter = if self.running { &self.usage.running } else { &self.usage.waiting };
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What `/v1/models` and `list` show of an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraInfo {
    pub name: String,
    pub id: u32,
    pub path: PathBuf,
    pub loaded: bool,
    /// Requests under it not yet scheduled, and scheduled ones.
    pub waiting: usize,
    pub running: usize,
}

/// An adapter resolved for one request: its id and the request's hold on it.
#[derive(Debug)]
pub(crate) struct ActiveLora {
    pub id: u32,
    pub hold: LoraHold,
}

/// The registry, shared by the engine and its handles (`Send + Sync`): `Engine::loras`,
/// `EngineHandle::loras`.
#[derive(Debug)]
pub struct LoraRegistry {
    config: Option<LoraConfig>,
    /// Whether the device runs adapters (the CPU does).
    on_device: bool,
    model_config: ModelConfig,
    base_name: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    next_id: u32,
    clock: u64,
}

impl LoraRegistry {
    pub(crate) fn new(
        config: Option<LoraConfig>,
        on_device: bool,
        model_config: ModelConfig,
        base_name: String,
    ) -> Self {
        Self {
            config,
            on_device,
            model_config,
            base_name,
            state: Mutex::new(State { next_id: 1, ..State::default() }),
        }
    }

    pub fn config(&self) -> Option<LoraConfig> {
        self.config
    }

    fn enabled(&self) -> Result<LoraConfig, LoraError> {
        let config = self.config.ok_or(LoraError::NotEnabled)?;
        if !self.on_device {
            return Err(LoraError::NotOnThisDevice);
        }
        Ok(config)
    }

    /// Reads the adapter at `path` and checks it against the base model and the rank limit
    /// (no lock held: a large adapter does not stall other submissions).
    fn read(&self, name: &str, path: &Path, config: LoraConfig) -> Result<Arc<LoraAdapter>, LoraError> {
        let adapter =
            LoraAdapter::load(name, path, &self.model_config).map_err(|e| LoraError::Load(e.to_string()))?;
        if adapter.rank > config.max_lora_rank {
            let (name, rank, max) = (name.to_owned(), adapter.rank, config.max_lora_rank);
            return Err(LoraError::RankTooLarge { name, rank, max });
        }
        Ok(Arc::new(adapter))
    }

    /// Registers and loads adapter `name` from `path` (vLLM's `/v1/load_lora_adapter`).
    pub fn load(&self, name: &str, path: &Path) -> Result<LoraInfo, LoraError> {
        let config = self.enabled()?;
        if name.is_empty() || name == self.base_name {
            return Err(LoraError::BadName(name.to_owned()));
        }
        if self.state.lock().entries.contains_key(name) {
            return Err(LoraError::AlreadyLoaded(name.to_owned()));
        }
        let adapter = self.read(name, path, config)?;
        let mut state = self.state.lock();
        if state.entries.contains_key(name) {
            return Err(LoraError::AlreadyLoaded(name.to_owned()));
        }
        let id = state.next_id;
        state.next_id += 1;
        state.clock += 1;
        let usage = Arc::default();
        let entry = Entry { id, path: path.to_owned(), loaded: Some(adapter), last_used: state.clock, usage };
        state.entries.insert(name.to_owned(), entry);
        state.evict_idle(config.memory_slots());
        Ok(LoraInfo {
            name: name.to_owned(),
            id,
            path: path.to_owned(),
            loaded: true,
            waiting: 0,
            running: 0,
        })
    }

    /// Forgets adapter `name` (vLLM's `/v1/unload_lora_adapter`): later requests naming it are
    /// refused; requests already admitted finish under it. Returns how many still hold it.
    pub fn unload(&self, name: &str) -> Result<usize, LoraError> {
        self.enabled()?;
        let entry =
            self.state.lock().entries.remove(name).ok_or_else(|| LoraError::NotFound(name.to_owned()))?;
        Ok(entry.loaded.map_or(0, |a| Arc::strong_count(&a) - 1))
    }

    /// Whether an adapter of this name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.state.lock().entries.contains_key(name)
    }

    /// Every registered adapter, by name.
    pub fn list(&self) -> Vec<LoraInfo> {
        let state = self.state.lock();
        state
            .entries
            .iter()
            .map(|(name, e)| LoraInfo {
                name: name.clone(),
                id: e.id,
                path: e.path.clone(),
                loaded: e.loaded.is_some(),
                waiting: e.usage.waiting.load(Ordering::Relaxed),
                running: e.usage.running.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The adapter a request names: registered (read again from its folder if it was dropped
    /// from memory), or registered now from the request's folder. A registered name is served
    /// from the folder it was registered with, whatever folder the request names.
    pub(crate) fn resolve(&self, request: &LoraRequest) -> Result<ActiveLora, LoraError> {
        let config = self.enabled()?;
        let path = {
            let mut state = self.state.lock();
            state.clock += 1;
            let clock = state.clock;
            match state.entries.get_mut(&request.name) {
                Some(entry) => {
                    entry.last_used = clock;
                    if let Some(adapter) = &entry.loaded {
                        let hold = LoraHold::new(Arc::clone(adapter), Arc::clone(&entry.usage));
                        return Ok(ActiveLora { id: entry.id, hold });
                    }
                    entry.path.clone()
                }
                None => match &request.path {
                    Some(path) => {
                        drop(state);
                        let info = self.load(&request.name, path)?;
                        return self.resolve(&LoraRequest::named(info.name));
                    }
                    None => return Err(LoraError::NotFound(request.name.clone())),
                },
            }
        };
        let adapter = self.read(&request.name, &path, config)?;
        let mut state = self.state.lock();
        let entry =
            state.entries.get_mut(&request.name).ok_or_else(|| LoraError::NotFound(request.name.clone()))?;
        let hold = LoraHold::new(Arc::clone(entry.loaded.get_or_insert(adapter)), Arc::clone(&entry.usage));
        let id = entry.id;
        state.evict_idle(config.memory_slots());
        Ok(ActiveLora { id, hold })
    }
}

impl State {
    /// Drops the least recently used idle adapters' weights until at most `slots` are in memory
    /// (adapters that requests hold stay).
    fn evict_idle(&mut self, slots: usize) {
        loop {
            let loaded = self.entries.values().filter(|e| e.loaded.is_some()).count();
            if loaded <= slots {
                return;
            }
            let idle = self
                .entries
                .values_mut()
                .filter(|e| e.loaded.as_ref().is_some_and(|a| Arc::strong_count(a) == 1))
                .min_by_key(|e| e.last_used);
            match idle {
                Some(entry) => entry.loaded = None,
                None => return,
            }
        }
    }
}
