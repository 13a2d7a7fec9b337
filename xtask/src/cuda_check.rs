//! `cargo xtask cuda-check`: compile every CUDA kernel instantiation for sm_80 and sm_90 with
//! NVRTC on a machine without a GPU, and fail on a compile error or a register spill in an
//! attention kernel (prints each kernel's registers and shared memory); then run the host-side
//! unit tests of the `cuda` modules, which only build with the feature.
//!
//! A program compiled before with the same source, architecture, options and NVRTC is judged
//! from its compiler log kept in `target/cuda-check-logs` (a fresh clone compiles everything
//! once).
//!
//! NVRTC comes from its PyPI wheel (installed once into `target/nvrtc` with pip). The compile
//! itself runs in gpu-check's `cuda_check` binary (built with the `cuda` feature in the same
//! whole-workspace build as the host tests, whose dependencies `cargo test --workspace` reuses),
//! started with `LD_LIBRARY_PATH` pointing at the wheel's libraries: the dynamic loader reads
//! that variable only at process start, so it must be set for a child process. This also keeps
//! xtask itself free of cudarc.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, run as run_cmd, workspace_root};

/// `gpu-check/cuda` turns on the `cuda` feature of every crate below it (and builds the GPU
/// check's binaries): the CUDA clippy pass and the one test build (the CPU tests run the same
/// code either way; the CUDA paths load the driver only when a CUDA device is opened).
pub const CUDA_FEATURES: &str = "gpu-check/cuda";

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
    /// Leave out the host-side tests of the `cuda` modules (`cargo xtask test` runs them with
    /// the workspace's).
    #[arg(long)]
    pub no_host_tests: bool,
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
    let built = build_cuda_targets()?;
    let mut cmd = Command::new(built.executable("gpu-check", "bin", "cuda_check")?);
    cmd.args(["--arch", &args.arch])
        .arg("--headers")
        .arg(nvrtc_dir().join("headers"))
        .arg("--log-cache")
        .arg(workspace_root().join("target/cuda-check-logs"))
        .env("LD_LIBRARY_PATH", library_path_with(&lib));
    if let Some(f) = &args.filter {
        cmd.args(["--filter", f]);
    }
    run_cmd(&mut cmd).context("cuda-check failed (see the FAIL lines above)")?;
    if args.filter.is_none() && !args.no_host_tests {
        // The host-side pieces of the CUDA backend (sizing, shapes, batch checks, GEMM index
        // math, the rotary table, the check drivers' cases and tolerances) only build with the
        // feature: test them here (no GPU needed).
        for (package, filter) in HOST_TESTS {
            let mut test = Command::new(built.executable(package, "lib", &package.replace('-', "_"))?);
            test.current_dir(workspace_root().join(package)).args(filter);
            run_cmd(&mut test)
                .with_context(|| format!("host-side tests of {package}'s CUDA modules failed"))?;
        }
    }
    Ok(())
}

/// The library test programs built with the `cuda` feature that run on a machine without a GPU,
/// and the test-name filter each runs with.
const HOST_TESTS: [(&str, &[&str]); 4] =
    [("kv-cache", &["cuda::"]), ("attn-kernels", &["cuda::"]), ("model", &["cuda::"]), ("gpu-check", &[])];

/// Builds, with every crate's `cuda` feature, the library test programs and the GPU check's
/// binaries, in one `cargo test --no-run` over the whole workspace: selecting the whole workspace
/// makes cargo resolve the other crates' features exactly as for `cargo test --workspace`, so the
/// two builds share every dependency's artifacts (a `-p` selection leaves out the other
/// members' dev-dependencies, changes the features of dozens of crates and rebuilds them).
/// Selecting gpu-check's integration test `runner` is what makes cargo build its binaries.
fn build_cuda_targets() -> anyhow::Result<BuiltTargets> {
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--features", CUDA_FEATURES, "--lib", "--test", "runner", "--no-run"])
        .args(["--message-format", "json-render-diagnostics"])
        .stdout(std::process::Stdio::piped());
    eprintln!("$ {cmd:?}");
    let out = cmd.spawn().context("could not start cargo")?.wait_with_output()?;
    if !out.status.success() {
        bail!("building the CUDA-featured targets failed ({})", out.status);
    }
    BuiltTargets::from_messages(&String::from_utf8_lossy(&out.stdout))
}

/// The executables a cargo build reported: (package name, target kind, target name, path).
#[derive(Debug, Default)]
struct BuiltTargets(Vec<(String, String, String, PathBuf)>);

impl BuiltTargets {
    /// Reads cargo's JSON messages (one per line): every `compiler-artifact` with an executable.
    fn from_messages(messages: &str) -> anyhow::Result<Self> {
        let mut built = Self::default();
        for line in messages.lines().filter(|l| l.starts_with('{')) {
            let m: serde_json::Value = serde_json::from_str(line).context("cargo's JSON message")?;
            let (Some("compiler-artifact"), Some(exe)) = (m["reason"].as_str(), m["executable"].as_str())
            else {
                continue;
            };
            let package = m["manifest_path"]
                .as_str()
                .and_then(|p| Path::new(p).parent()?.file_name()?.to_str())
                .unwrap_or_default();
            let kind = m["target"]["kind"][0].as_str().unwrap_or_default();
            let name = m["target"]["name"].as_str().unwrap_or_default();
            built.0.push((package.to_owned(), kind.to_owned(), name.to_owned(), PathBuf::from(exe)));
        }
        Ok(built)
    }

    /// The executable of `package`'s target `name` of `kind` (`lib` for a library's tests).
    fn executable(&self, package: &str, kind: &str, name: &str) -> anyhow::Result<PathBuf> {
        self.0
            .iter()
            .find(|(p, k, n, _)| p == package && k == kind && n == name)
            .map(|t| t.3.clone())
            .with_context(|| format!("cargo built no {kind} target {name} of {package}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_are_found_by_package_kind_and_name() {
        let messages = r#"{"reason":"compiler-artifact","manifest_path":"/w/gpu-check/Cargo.toml","target":{"kind":["bin"],"name":"cuda_check"},"executable":"/w/target/debug/cuda_check"}
{"reason":"compiler-artifact","manifest_path":"/w/model/Cargo.toml","target":{"kind":["lib"],"name":"model"},"executable":null}
{"reason":"compiler-artifact","manifest_path":"/w/model/Cargo.toml","target":{"kind":["lib"],"name":"model"},"executable":"/w/target/debug/deps/model-0123"}
{"reason":"build-finished","success":true}"#;
        let built = BuiltTargets::from_messages(messages).unwrap();
        assert_eq!(
            built.executable("gpu-check", "bin", "cuda_check").unwrap(),
            Path::new("/w/target/debug/cuda_check")
        );
        assert_eq!(
            built.executable("model", "lib", "model").unwrap(),
            Path::new("/w/target/debug/deps/model-0123")
        );
        let missing = built.executable("kv-cache", "lib", "kv_cache").unwrap_err().to_string();
        assert!(missing.contains("kv_cache of kv-cache"), "{missing}");
    }
}
