//! Test fixtures: the tiny random Llama of `model::testing` in a temporary folder, an engine
//! over it, small configs and prompts, so engine tests run fast.

use engine::{Engine, EngineConfig};
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

    pub fn engine(&self, config: EngineConfig) -> Engine {
        match Engine::new(self.dir.path(), config) {
            Ok(e) => e,
            Err(e) => panic!("engine: {e}"),
        }
    }
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
