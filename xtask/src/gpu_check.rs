//! `cargo xtask gpu-check --bundle`: build, here, the self-contained GPU check into
//! `target/gpu-bundle` and print the exact device `run` command that carries that folder:
//! - `gpu_check` (crate `gpu-check`): every kernel against the CPU reference, bandwidth figures;
//! - `gpu_model_check` (crate `gpu-check`): the CUDA forward of a tiny random Llama against the CPU
//!   forward, then `cuda.e2e_output_tok_s` on a random Llama-3.2-1B-shaped model;
//! - `cubins/`: every kernel precompiled for the device's architecture;
//! - `run.sh`: finds libcublas (PyTorch's `nvidia` wheels) with python3, puts it on
//!   `LD_LIBRARY_PATH`, points the cubin cache at `cubins/`, runs both binaries.
//!
//! The device machine has a driver but no Rust toolchain and an NVRTC too old for our headers, so
//! the bundle ships cubins (loaded by the binaries' cubin cache, keyed by source hash + arch) and
//! the binaries link no CUDA library (cudarc loads libcuda and libcublas at run time).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, files_under, fresh_dir, run as run_cmd, workspace_root};
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

/// The binaries of crate `gpu-check` the bundle carries.
const BINARIES: [&str; 2] = ["gpu_check", "gpu_model_check"];

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
    let script = bundle.join("run.sh");
    std::fs::write(&script, RUN_SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
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
    println!("bundle: {} ({:.1} MiB)", bundle.display(), size as f64 / (1 << 20) as f64);
    println!(
        "device run (one call; writes $OUT/gpu_check.json and $OUT/gpu_model_check.json; at most 8 min on an H200):"
    );
    println!("  run(command = \"{RUN_COMMAND}\", carry = [\"target/gpu-bundle\"], timeout_s = 540)");
    Ok(())
}

/// The device `run` command (relative to the repository root the device tool starts in).
pub const RUN_COMMAND: &str = "sh target/gpu-bundle/run.sh";

/// What `run.sh` does on the device machine (no Rust there; python3 with PyTorch's CUDA wheels).
pub const RUN_SCRIPT: &str = r#"#!/bin/sh
# The GPU run: kernels against the CPU reference, then the model forward and the e2e figure.
here=$(cd "$(dirname "$0")" && pwd)
# libcublas (and libnvrtc) come from the `nvidia` wheels PyTorch installs; find their lib folders.
libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = set()
for r in roots:
    for pat in ("libcublas.so*", "libcublasLt.so*", "libnvrtc.so*"):
        for f in glob.glob(os.path.join(r, "**", pat), recursive=True):
            dirs.add(os.path.dirname(f))
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ATTN_KERNELS_CUBIN_DIR="$here/cubins"
echo "run.sh: cuBLAS/NVRTC from: ${libs:-<not found>}" >&2
status=0
timeout 270 "$here/gpu_check" --cubins "$here/cubins" || status=1
timeout 200 "$here/gpu_model_check" || status=1
exit $status
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_script_sets_up_libraries_and_runs_both_checks() {
        assert!(RUN_SCRIPT.starts_with("#!/bin/sh\n"));
        assert!(RUN_SCRIPT.contains("LD_LIBRARY_PATH"));
        assert!(RUN_SCRIPT.contains("ATTN_KERNELS_CUBIN_DIR"));
        assert!(RUN_SCRIPT.contains("/gpu_check\""));
        assert!(RUN_SCRIPT.contains("/gpu_model_check\""));
        assert!(RUN_COMMAND.ends_with("run.sh"));
        // The binaries' time limits together stay inside the 8 minutes the run may take.
        let limits: u32 = RUN_SCRIPT
            .split("timeout ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u32>().ok())
            .sum();
        assert!(limits > 0 && limits <= 8 * 60, "{limits} s");
    }
}
