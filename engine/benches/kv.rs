//! Benchmark group `kv`: what the hybrid KV cache saves on Gemma 3 270M (five sliding-window
//! layers for every full one), counted by the block allocator itself, not by a formula.
//!
//! The real model's geometry comes from its GGUF (layers, window, KV heads, head size); the
//! engine's layout of it (`kv_cache::KvLayout::hybrid`, through `ModelConfig::hybrid_kv_layout`) gives the groups and the layer tensors a
//! block spans, and `scheduler::SeqTables` over a `block_alloc::BlockPool` appends a sequence
//! the way a step does: release what left each window, then append the next prefill chunk.
//!
//! - `kv.gemma3_bytes_per_token_32k_over_full`: KV bytes held once one sequence holds 32 768
//!   tokens, over what a full cache of every layer holds for them.
//! - `kv.gemma3_max_seqs_32k_over_full`: in the memory of a full cache with room for four such
//!   sequences, how many 32 768-token sequences the hybrid layout fits, over the full one's.
//!
//! Writes `$BENCH_FIGURES_DIR/kv.json` and the fragment `kv.md`.

use std::error::Error;

use scheduler::SeqTables;
use scheduler::{BlockPool, PoolConfig};

mod support;

const TOKENS: usize = 32_768;
const BLOCK_SIZE: usize = 16;
/// The engine's default step budget: the largest prefill chunk.
const CHUNK: usize = 2_048;

/// One layout over a pool of `num_blocks` blocks.
struct Layout {
    windows: Vec<Option<usize>>,
    /// Layer tensors one block spans.
    slots: usize,
}

impl Layout {
    /// Appends sequences of `TOKENS` tokens chunk by chunk until the pool runs out; returns how
    /// many completed and the blocks in use once the first one completed.
    fn fill(&self, num_blocks: usize) -> Result<(usize, usize), Box<dyn Error>> {
        let mut pool =
            BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(num_blocks, BLOCK_SIZE) })?;
        let mut held = Vec::new();
        let mut first_used = 0;
        'sequences: loop {
            let mut tables = SeqTables::new(&pool, &self.windows);
            while tables.num_tokens() < TOKENS {
                tables.release_outside_window(&mut pool)?;
                let n = CHUNK.min(TOKENS - tables.num_tokens());
                if tables.blocks_to_append(&pool, n) > pool.num_free() {
                    tables.free(&mut pool)?;
                    break 'sequences;
                }
                tables.append_tokens(&mut pool, n, &mut |_| {})?;
            }
            tables.release_outside_window(&mut pool)?;
            if held.is_empty() {
                first_used = pool.num_used();
            }
            held.push(tables);
        }
        let completed = held.len();
        for mut t in held {
            t.free(&mut pool)?;
        }
        Ok((completed, first_used))
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let gguf = model::testing::gemma3_gguf_fetched()?;
    let config = model::ModelFolder::open(&gguf)?.config;
    let hybrid = config.hybrid_kv_layout();
    let layers = config.num_hidden_layers;
    let full = Layout { windows: vec![None], slots: layers };
    let mixed = Layout { windows: hybrid.group_windows().to_vec(), slots: hybrid.num_slots() };
    // Bytes are proportional to (blocks × layer tensors a block spans); the per-layer block size
    // (kv heads × head size × 2 × dtype × block) is the same in both layouts.
    let budget_pages = 4 * TOKENS.div_ceil(BLOCK_SIZE) * layers + layers; // four full sequences, and a little
    let (full_seqs, full_used) = full.fill(budget_pages / full.slots)?;
    let (mixed_seqs, mixed_used) = mixed.fill(budget_pages / mixed.slots)?;
    let bytes_ratio = (mixed_used * mixed.slots) as f64 / (full_used * full.slots) as f64;
    let seqs_ratio = mixed_seqs as f64 / full_seqs.max(1) as f64;

    let figures = serde_json::json!({
        "kv.gemma3_bytes_per_token_32k_over_full": bytes_ratio,
        "kv.gemma3_max_seqs_32k_over_full": seqs_ratio,
        "kv.gemma3_max_seqs_32k_hybrid": mixed_seqs,
        "kv.gemma3_max_seqs_32k_full": full_seqs,
    });
    let dir = support::figures_dir()?;
    std::fs::write(dir.join("kv.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    let windows: Vec<String> = mixed
        .windows
        .iter()
        .map(|w| w.map_or_else(|| "full".to_owned(), |w| format!("window {w}")))
        .collect();
    let md = format!(
        "## Hybrid KV cache (`kv`)\n\nGemma 3 270M ({layers} layers, KV groups: {}; {} layer tensors a block), \
         blocks of {BLOCK_SIZE}, prefill chunks of {CHUNK}, sequences of {TOKENS} tokens, counted by the \
         allocator.\n\n| layout | blocks held by one sequence | layer pages | sequences in the memory of four full ones |\n\
         |---|---:|---:|---:|\n| full | {full_used} | {} | {full_seqs} |\n| hybrid | {mixed_used} | {} | {mixed_seqs} |\n\n\
         Bytes per token, hybrid over full: {bytes_ratio:.3}; sequences that fit, hybrid over full: {seqs_ratio:.2}.\n",
        windows.join(", "),
        mixed.slots,
        full_used * full.slots,
        mixed_used * mixed.slots,
    );
    std::fs::write(dir.join("kv.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}
