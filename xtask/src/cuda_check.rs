//! `cargo xtask cuda-check`: compile every CUDA kernel instantiation for sm_80 and sm_90 with
//! NVRTC on a machine without a GPU, and fail on a compile error or a register spill in an
//! attention kernel (prints each kernel's registers and shared memory); then run the host-side
//! unit tests of the `cuda` modules, which only build with the feature.
//!
//! NVRTC comes from its PyPI wheel (installed once into `target/nvrtc` with pip). The compile
//! itself runs in the `cuda_check` binary of `attn-kernels` (built with `--features cuda`),
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

#[derive(Debug, Args)]
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

/// Installs the NVRTC wheel into `target/nvrtc` unless it is already there; returns the
/// wheel's library folder (what goes on `LD_LIBRARY_PATH`).
pub fn ensure_nvrtc() -> anyhow::Result<PathBuf> {
    let dir = nvrtc_dir();
    let lib = dir.join("nvidia").join("cu13").join("lib");
    if lib.join("libnvrtc.so.13").is_file() {
        return Ok(lib);
    }
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
    let old = std::env::var_os("LD_LIBRARY_PATH");
    let paths = std::iter::once(lib.to_path_buf()).chain(old.iter().flat_map(std::env::split_paths));
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
        // math, the rotary table, the check drivers' cases and tolerances) only build with the
        // feature: test them here (no GPU needed).
        run_cmd(cargo().args([
            "test",
            "-p",
            "kv-cache",
            "-p",
            "attn-kernels",
            "-p",
            "model",
            "--features",
            "model/cuda",
            "--lib",
            "--",
            "cuda::",
        ]))
        .context("host-side tests of the CUDA modules failed")?;
        run_cmd(cargo().args(["test", "-p", "gpu-check", "--features", "cuda", "--lib"]))
            .context("host-side tests of the GPU check failed")?;
    }
    Ok(())
}
