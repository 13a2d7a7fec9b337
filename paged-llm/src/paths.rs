//! Where the program keeps what it downloads and makes: the models folder and a cache folder,
//! each from an environment variable or the user's cache directory.

use std::path::PathBuf;

/// Where `fetch-model` puts models, `make-model` its files, and `--model NAME` looks:
/// `PAGED_LLM_MODELS_DIR`, else `models` in [`cache_dir`]. (`cargo xtask` points it at the
/// checkout's `target/models`.)
pub fn models_dir() -> PathBuf {
    std::env::var_os("PAGED_LLM_MODELS_DIR").map_or_else(|| cache_dir().join("models"), PathBuf::from)
}

/// Downloads and corpora (the perplexity text): `PAGED_LLM_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/paged-llm`, else `~/.cache/paged-llm`, else `.paged-llm` here.
pub fn cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("PAGED_LLM_CACHE_DIR") {
        return dir;
    }
    match (var("XDG_CACHE_HOME"), var("HOME")) {
        (Some(xdg), _) => xdg.join("paged-llm"),
        (None, Some(home)) => home.join(".cache/paged-llm"),
        (None, None) => PathBuf::from(".paged-llm"),
    }
}
