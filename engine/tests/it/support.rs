//! Test fixtures: the tiny random Llama of `model::testing` in a temporary folder, an engine
//! over it (in process or on its own thread), small configs, prompts and forced-length greedy
//! sampling, so engine tests run fast.

use engine::{Engine, EngineConfig, EngineHandle, SamplingParams};
pub use model::testing::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A tiny model folder plus an engine over it.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("tempdir: {e}"),
        };
        write_tiny_llama(dir.path(), 42);
        Self { dir }
    }

    /// A fixture and an engine over it.
    pub fn with_engine(config: EngineConfig) -> (Self, Engine) {
        let fx = Self::new();
        let engine = fx.engine(config);
        (fx, engine)
    }

    pub fn engine(&self, config: EngineConfig) -> Engine {
        match Engine::new(self.dir.path(), config) {
            Ok(e) => e,
            Err(e) => panic!("engine: {e}"),
        }
    }

    /// An engine over the fixture, on its own thread.
    pub fn spawn(&self, config: EngineConfig) -> EngineHandle {
        EngineHandle::spawn(self.engine(config)).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Greedy sampling of exactly `max_tokens` tokens: the end-of-sequence token does not stop it.
pub fn forced(max_tokens: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

/// A single-threaded tokio runtime with timers (a blocking call in an async test stalls it).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap_or_else(|e| panic!("{e}"))
}

/// A small-engine config: 16-token blocks, explicit block count, no logging.
pub fn small_config(num_blocks: usize) -> EngineConfig {
    EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(num_blocks),
        max_model_len: Some(512),
        max_num_batched_tokens: 512,
        swap_space_bytes: 64 << 20,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// Deterministic pseudo-random prompt of `len` byte tokens.
pub fn prompt_tokens(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(32..127)).collect()
}
