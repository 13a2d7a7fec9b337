//! What the server's benches share: the default model's engine with random prompts on its own
//! thread, the server over it on 127.0.0.1, and where the figures go.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine::{Engine, EngineConfig, EngineHandle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use server::{AppState, ServerConfig};

/// Random prompts, each a list of token ids.
pub type Prompts = Vec<Vec<u32>>;

/// The default model under `config` on its own thread, and `count` random prompts of `len`
/// tokens (no EOS among them) drawn from `seed`.
pub fn engine_and_prompts(
    config: EngineConfig,
    count: usize,
    len: usize,
    seed: u64,
) -> Result<(EngineHandle, Prompts), Box<dyn Error>> {
    let engine = Engine::new(&model::testing::default_model_fetched()?, config)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (vocab, eos) = (engine.model_config().vocab_size, engine.eos_token_ids().to_vec());
    let prompts = (0..count).map(|_| engine::workload::random_prompt(&mut rng, len, vocab, &eos)).collect();
    Ok((EngineHandle::spawn(engine)?, prompts))
}

/// Serves `handle` on an ephemeral port of 127.0.0.1 until the runtime ends; its base URL.
pub async fn serve_loopback(handle: &EngineHandle) -> Result<String, Box<dyn Error>> {
    let config = ServerConfig::default();
    let state = Arc::new(AppState::new(handle.clone(), &config)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { server::serve(listener, state, &config, std::future::pending()).await });
    Ok(base)
}

/// Writes `<name>.json` (the figures) and `<name>.md` (the report's section) into
/// `$BENCH_FIGURES_DIR` (else `target/bench-report/figures-run`), and prints the figures.
pub fn write_figures(name: &str, figures: &serde_json::Value, md: &str) -> Result<(), Box<dyn Error>> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().unwrap_or(manifest);
    let dir = std::env::var_os("BENCH_FIGURES_DIR")
        .map_or_else(|| root.join("target/bench-report/figures-run"), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    let json = serde_json::to_string_pretty(figures)?;
    std::fs::write(dir.join(format!("{name}.json")), format!("{json}\n"))?;
    std::fs::write(dir.join(format!("{name}.md")), md)?;
    println!("{json}");
    Ok(())
}
