//! `cargo xtask gpu-check --bundle`: build, here, the self-contained GPU run into
//! `target/gpu-bundle` and print the exact device `run` commands that carry that folder:
//! - `gpu_run` (crate `gpu-check`): starts every section of the run in its own process, logs
//!   to `$OUT/<program>.log`, figures to `$OUT/figures.json` as they come, and prints a summary;
//! - `gpu_check`, `gpu_model_check` (crate `gpu-check`): the sections (kernels against the CPU
//!   reference and bandwidth; the CUDA forward against the CPU's, the engine's greedy tokens,
//!   the e2e figure), one per process with `--only NAME`;
//! - `cubins/`: every kernel precompiled for the device's architecture;
//! - `setup.sh` (sourced): prints the GPU and driver, finds libcuda (the usual driver folders
//!   too), cuBLAS and NVRTC (PyTorch's `nvidia` wheels, with python3), probes one cubin and
//!   compiles them all with the device's NVRTC when it does not load;
//! - `run.sh`: setup, then `gpu_run`; `sanitize.sh`: setup, then `gpu_run --sanitize`
//!   (compute-sanitizer memcheck and racecheck on the smallest cases), for a later run.
//!
//! The device machine has a driver but no Rust toolchain and an NVRTC too old for our headers, so
//! the bundle ships cubins (loaded by the binaries' cubin cache, keyed by source hash + arch) and
//! the binaries link no CUDA library (cudarc loads libcuda and libcublas at run time). The
//! bundle is refused when a binary needs a GLIBC newer than the device image's (Debian 12).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, files_under, fresh_dir, run as run_cmd, workspace_root};
use crate::cuda_check::{ensure_nvrtc, library_path_with};
use crate::glibc;

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

/// The binaries of crate `gpu-check` the bundle carries.
const BINARIES: [&str; 3] = ["gpu_run", "gpu_check", "gpu_model_check"];

/// The device image's C library (Debian 12): no bundled binary may need a newer GLIBC.
const DEVICE_GLIBC: (u32, u32) = (2, 36);

/// The scripts, by file name.
const SCRIPTS: [(&str, &str); 3] = [
    ("setup.sh", include_str!("gpu_check/setup.sh")),
    ("run.sh", include_str!("gpu_check/run.sh")),
    ("sanitize.sh", include_str!("gpu_check/sanitize.sh")),
];

/// `run.sh` in all (its `timeout_s`), and the sanitizer script's: `gpu_check::sections`'
/// `RUN_TIMEOUT_S` and `SANITIZE_TIMEOUT_S` (xtask does not depend on gpu-check; a test of
/// gpu-check holds the two in step).
pub const RUN_TIMEOUT_S: u64 = 360;
pub const SANITIZE_TIMEOUT_S: u64 = 480;
// Two runs and a machine start fit in the 15 minutes a session may hold the device.
const _: () = assert!(2 * RUN_TIMEOUT_S + 120 <= 15 * 60);

/// The tiny family checkpoints of `model/tests/data/families` (HF folders; their GGUFs and
/// transformers' logits stay behind), which `gpu_model_check` runs through the CUDA forward.
fn copy_family_checkpoints(dest: &Path) -> anyhow::Result<()> {
    let source = workspace_root().join("model/tests/data/families");
    for family in std::fs::read_dir(&source).with_context(|| format!("reading {}", source.display()))? {
        let family = family?.path();
        if !family.is_dir() {
            continue;
        }
        let to = dest.join(family.file_name().context("a family folder's name")?);
        std::fs::create_dir_all(&to)?;
        for file in std::fs::read_dir(&family)? {
            let file = file?.path();
            let name = file.file_name().context("a file name")?.to_string_lossy().into_owned();
            if name.ends_with(".json") && name != "expected.json" || name.ends_with(".safetensors") {
                std::fs::copy(&file, to.join(&name))
                    .with_context(|| format!("copying {}", file.display()))?;
            }
        }
    }
    Ok(())
}

pub fn run(args: &GpuCheckArgs) -> anyhow::Result<()> {
    if !args.bundle {
        bail!("the GPU check runs on the device machine; use `cargo xtask gpu-check --bundle` to prepare it");
    }
    let mut build = cargo();
    build.args(["build", "--release", "-p", "gpu-check", "--features", "gpu-check/cuda"]);
    run_cmd(build.args(BINARIES.iter().flat_map(|name| ["--bin", name])))?;
    // Where the bundle goes (ignored by git, carried to the device).
    let bundle = workspace_root().join("target").join("gpu-bundle");
    fresh_dir(&bundle)?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from);
    let release = target.unwrap_or_else(|| workspace_root().join("target")).join("release");
    for name in BINARIES {
        let built = release.join(name);
        let exe = bundle.join(name);
        std::fs::copy(&built, &exe).with_context(|| format!("copying {}", built.display()))?;
        // Debug line tables are not needed on the device; strip them when the tool exists.
        let _ = Command::new("strip").arg(&exe).status();
    }
    for (name, text) in SCRIPTS {
        let script = bundle.join(name);
        std::fs::write(&script, text).with_context(|| format!("writing {}", script.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    copy_family_checkpoints(&bundle.join("families"))?;
    let binaries: Vec<PathBuf> = BINARIES.iter().map(|b| bundle.join(b)).collect();
    glibc::check_at_most(&binaries.iter().map(PathBuf::as_path).collect::<Vec<_>>(), DEVICE_GLIBC)?;
    let exe = bundle.join("gpu_check");
    let lib = ensure_nvrtc()?;
    run_cmd(
        Command::new(&exe)
            .arg("--precompile")
            .arg(bundle.join("cubins"))
            .args(["--arch", &args.arch])
            .env("LD_LIBRARY_PATH", library_path_with(&lib)),
    )
    .context("precompiling the kernels")?;
    let files = files_under(&bundle, &|_| false)?;
    let size: u64 = files.iter().filter_map(|f| f.symlink_metadata().ok()).map(|m| m.len()).sum();
    if size > BUNDLE_LIMIT_BYTES {
        bail!("bundle is {} MiB, over the {} MiB carry budget", size >> 20, BUNDLE_LIMIT_BYTES >> 20);
    }
    println!(
        "bundle: {} ({:.1} MiB; binaries need GLIBC <= {}.{})",
        bundle.display(),
        size as f64 / (1 << 20) as f64,
        DEVICE_GLIBC.0,
        DEVICE_GLIBC.1
    );
    println!(
        "device run (one call; $OUT gets setup.log, gpu_check.log, gpu_model_check.log, figures.json, summary.txt; \
         the summary is printed; under {} min on an H200, leaving room for a second run in 15 min):",
        RUN_TIMEOUT_S / 60
    );
    println!(
        "  run(command = \"{RUN_COMMAND}\", carry = [\"target/gpu-bundle\"], timeout_s = {RUN_TIMEOUT_S})"
    );
    println!("then give_back, unless running again at once. For a later run, the sanitizers:");
    println!(
        "  run(command = \"{SANITIZE_COMMAND}\", carry = [\"target/gpu-bundle\"], timeout_s = {SANITIZE_TIMEOUT_S})"
    );
    Ok(())
}

/// The device `run` command (relative to the repository root the device tool starts in).
pub const RUN_COMMAND: &str = "sh target/gpu-bundle/run.sh";

/// The optional sanitizer run's command.
pub const SANITIZE_COMMAND: &str = "sh target/gpu-bundle/sanitize.sh";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_set_up_libraries_probe_cubins_and_start_the_runner() {
        let script = |name: &str| SCRIPTS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).unwrap_or("");
        let setup = script("setup.sh");
        for needle in [
            "nvidia-smi",
            "/usr/local/nvidia/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "LD_LIBRARY_PATH",
            "ATTN_KERNELS_CUBIN_DIR",
            "--probe",
            "--precompile",
            "COMPUTE_SANITIZER",
        ] {
            assert!(setup.contains(needle), "setup.sh lacks {needle}");
        }
        for name in ["run.sh", "sanitize.sh"] {
            let text = script(name);
            assert!(text.starts_with("#!/bin/sh\n"), "{name}");
            assert!(text.contains(". \"$here/setup.sh\"") && text.contains("/gpu_run\""), "{name}");
        }
        assert!(script("run.sh").contains("--started-at"));
        assert!(script("sanitize.sh").contains("--sanitize"));
        assert!(RUN_COMMAND.ends_with("run.sh") && SANITIZE_COMMAND.ends_with("sanitize.sh"));
    }
}
