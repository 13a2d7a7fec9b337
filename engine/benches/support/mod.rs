//! What the engine's bench programs share: where the workspace and the figures folder are, and
//! the figures table their reports open with.

// Each bench program compiles this module on its own and uses only a part of it.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The workspace root.
pub fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The folder a run's figures go to (`BENCH_FIGURES_DIR`, by default the report's run folder),
/// created if missing.
pub fn figures_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::var_os("BENCH_FIGURES_DIR")
        .map_or_else(|| root().join("target/bench-report/figures-run"), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A Markdown table of a flat JSON object of figures, one row each.
pub fn figures_table(md: &mut String, figures: &serde_json::Value) {
    md.push_str("| figure | value |\n|---|---:|\n");
    for (k, v) in figures.as_object().into_iter().flatten() {
        // Writing to a String cannot fail.
        let _ = writeln!(md, "| `{k}` | {:.3} |", v.as_f64().unwrap_or(f64::NAN));
    }
}
