//! `cargo xtask cuda-check`: compile every CUDA kernel instantiation for sm_80 and sm_90 with
//! NVRTC on a machine without a GPU, and fail on a compile error or a register spill in an
//! attention kernel (prints each kernel's registers and shared memory); then run the host-side
//! unit tests of the `cuda` modules, which only build with the feature.
//!
//! NVRTC comes from its PyPI wheel (installed once into `target/nvrtc` with pip). The compile
//! itself runs in the `cuda_check` binary of `kernels` (built with `--features cuda`),
//! started with `LD_LIBRARY_PATH` pointing at the wheel's libraries: the dynamic loader reads
//! that variable only at process start, so it must be set for a child process. This also keeps
//! xtask itself free of cudarc.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, run as run_cmd, workspace_root};

/// The NVRTC wheel: 13.3+ ships the fp16/bf16 headers (`--use-bundled-headers`).
pub const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.5.37";

#[derive(Debug, Args, Default)]
pub struct CudaCheckArgs {
    /// Architectures to compile for.
    #[arg(long, default_value = "sm_80,sm_90")]
    pub arch: String,
    /// Only programs whose name contains this (e.g. `bf16_h128`).
    #[arg(long)]
    pub filter: Option<String>,
}

/// Where the wheel is unpacked.
pub fn nvrtc_dir() -> PathBuf {
    workspace_root().join("target").join("nvrtc")
}

/// The wheel's library folder (what goes on `LD_LIBRARY_PATH`).
pub fn nvrtc_lib_dir() -> PathBuf {
    nvrtc_dir().join("nvidia").join("cu13").join("lib")
}

/// Installs the NVRTC wheel into `target/nvrtc` unless it is already there.
pub fn ensure_nvrtc() -> anyhow::Result<PathBuf> {
    let lib = nvrtc_lib_dir();
    if lib.join("libnvrtc.so.13").is_file() {
        return Ok(lib);
    }
    let dir = nvrtc_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    run_cmd(
        Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target"])
            .arg(&dir)
            .arg(NVRTC_WHEEL),
    )
    .context("installing NVRTC with pip (python3 -m pip must work)")?;
    if !lib.join("libnvrtc.so.13").is_file() {
        bail!("{NVRTC_WHEEL} installed but {} has no libnvrtc.so.13", lib.display());
    }
    Ok(lib)
}

/// `LD_LIBRARY_PATH` with `lib` in front.
pub fn library_path_with(lib: &Path) -> std::ffi::OsString {
    let mut paths = vec![lib.to_path_buf()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| lib.as_os_str().to_owned())
}

pub fn run(args: &CudaCheckArgs) -> anyhow::Result<()> {
    let lib = ensure_nvrtc()?;
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "-p", "gpu-check", "--features", "cuda", "--bin", "cuda_check", "--"])
        .args(["--arch", &args.arch])
        .arg("--headers")
        .arg(nvrtc_dir().join("headers"))
        .env("LD_LIBRARY_PATH", library_path_with(&lib));
    if let Some(f) = &args.filter {
        cmd.args(["--filter", f]);
    }
    run_cmd(&mut cmd).context("cuda-check failed (see the FAIL lines above)")?;
    if args.filter.is_none() {
        // The host-side pieces of the CUDA backend (sizing, shapes, batch checks, GEMM index
        // math, the rotary table, the check drivers) only build with the feature: test them here.
        run_cmd(cargo().args(HOST_TEST_ARGS)).context("host-side tests of the CUDA modules failed")?;
        run_cmd(cargo().args(GPU_CHECK_TEST_ARGS)).context("host-side tests of the GPU check failed")?;
    }
    Ok(())
}

/// `cargo test` arguments for the host side of the GPU check (random cases, tolerances).
pub const GPU_CHECK_TEST_ARGS: [&str; 6] = ["test", "-p", "gpu-check", "--features", "cuda", "--lib"];

/// `cargo test` arguments for the unit tests of every `cuda` module (no GPU needed).
pub const HOST_TEST_ARGS: [&str; 12] = [
    "test",
    "-p",
    "kv-cache",
    "-p",
    "kernels",
    "-p",
    "model",
    "--features",
    "model/cuda",
    "--lib",
    "--",
    "cuda::",
];
