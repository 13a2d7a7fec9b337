//! `cargo xtask gpu-check --bundle`: build, here, the self-contained GPU check (the `gpu_check`
//! binary of `attn-kernels`, `--features cuda`) plus every kernel precompiled to sm_90 cubins
//! into `target/gpu-bundle`, and print the exact device `run` command that carries that folder.
//!
//! The device machine has a driver but no Rust toolchain and an NVRTC too old for our headers, so
//! the bundle ships cubins (loaded by the binary's cubin cache, keyed by source hash + arch) and
//! the binary links no CUDA library (cudarc loads libcuda at run time).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, run as run_cmd, workspace_root};
use crate::cuda_check::{ensure_nvrtc, library_path_with};

/// Most the device tool carries (64 MiB in all); leave room for the working tree.
const BUNDLE_LIMIT_BYTES: u64 = 60 << 20;

#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// Build the bundle (the only mode: the GPU run itself happens through the device tool).
    #[arg(long)]
    pub bundle: bool,
    /// Architecture to precompile for (the H200 is sm_90).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
}

/// Where the bundle goes (ignored by git, carried to the device).
pub fn bundle_dir() -> PathBuf {
    workspace_root().join("target").join("gpu-bundle")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

pub fn run(args: &GpuCheckArgs) -> anyhow::Result<()> {
    if !args.bundle {
        bail!("the GPU check runs on the device machine; use `cargo xtask gpu-check --bundle` to prepare it");
    }
    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "attn-kernels",
        "--features",
        "cuda",
        "--bin",
        "gpu_check",
    ]))?;
    let built = target_dir().join("release").join("gpu_check");
    let bundle = bundle_dir();
    if bundle.exists() {
        std::fs::remove_dir_all(&bundle).with_context(|| format!("clearing {}", bundle.display()))?;
    }
    std::fs::create_dir_all(&bundle)?;
    let exe = bundle.join("gpu_check");
    std::fs::copy(&built, &exe).with_context(|| format!("copying {}", built.display()))?;
    // Debug line tables are not needed on the device; strip them when the tool exists.
    let _ = Command::new("strip").arg(&exe).status();
    let lib = ensure_nvrtc()?;
    run_cmd(
        Command::new(&exe)
            .arg("--precompile")
            .arg(bundle.join("cubins"))
            .args(["--arch", &args.arch])
            .env("LD_LIBRARY_PATH", library_path_with(&lib)),
    )
    .context("precompiling the kernels")?;
    let size = dir_size(&bundle);
    if size > BUNDLE_LIMIT_BYTES {
        bail!("bundle is {} MiB, over the {} MiB carry budget", size >> 20, BUNDLE_LIMIT_BYTES >> 20);
    }
    println!("bundle: {} ({:.1} MiB)", bundle.display(), size as f64 / (1 << 20) as f64);
    println!("device run (one call; writes $OUT/gpu_check.json; ~2-4 min on an H200):");
    println!(
        "  run(command = \"target/gpu-bundle/gpu_check\", carry = [\"target/gpu-bundle\"], timeout_s = 480)"
    );
    Ok(())
}
