//! Running the commands users time (`run`, `throughput`, `plan`, and later `serve`) at release
//! speed, whatever profile `cargo xtask` itself was built with.
//!
//! `cargo xtask` builds xtask in the dev profile (shared with `cargo test`), which keeps debug
//! assertions and overflow checks in the engine's hot loops: a third of the release speed.
//! These commands therefore build xtask with `cargo build --release` (and with
//! `--features cuda` when `--device cuda` asks for a backend this build lacks) and replace
//! this process with that binary (`exec`, same arguments), so nothing of the dev build stays
//! in between. The first such run compiles the release build once (a few minutes).

use std::path::PathBuf;

use anyhow::{Context, bail};
use engine::Device;

/// Set in the child's environment: a re-launched xtask never re-launches again.
const RELAUNCHED_ENV: &str = "XTASK_RELAUNCHED";

/// What this build lacks for a command that is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Build {
    /// Built with debug assertions (the dev profile).
    debug_assertions: bool,
    /// Built with the `cuda` feature.
    cuda: bool,
}

impl Build {
    const THIS: Self = Self { debug_assertions: cfg!(debug_assertions), cuda: cfg!(feature = "cuda") };

    /// The `cargo` arguments that build the binary to re-launch, or `None` when this build will do.
    fn relaunch_args(self, device: Device) -> Option<Vec<&'static str>> {
        let want_cuda = !device.is_cpu() && !self.cuda;
        if !self.debug_assertions && !want_cuda {
            return None;
        }
        let mut args = vec!["build", "--quiet", "--release", "--package", "xtask", "--bin", "xtask"];
        if want_cuda || self.cuda {
            args.extend(["--features", "cuda"]);
        }
        Some(args)
    }
}

/// Re-runs this very command line from a release build (with CUDA support when `device` needs
/// it), replacing this process; returns when this process is already that build.
pub fn ensure_release_build(device: Device) -> anyhow::Result<()> {
    if std::env::var_os(RELAUNCHED_ENV).is_some() {
        if Build::THIS.debug_assertions {
            eprintln!("xtask: warning: re-launched but still a debug-assertion build; timings will be slow");
        }
        return Ok(());
    }
    let Some(cargo_args) = Build::THIS.relaunch_args(device) else { return Ok(()) };
    eprintln!(
        "xtask: running at release speed: cargo {} (the first time compiles the release profile)",
        cargo_args.join(" ")
    );
    let exe = build_release(&cargo_args)?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(std::env::args_os().skip(1)).env(RELAUNCHED_ENV, "1");
    exec(cmd, &exe)
}

/// Runs the build and returns the path of the `xtask` executable it produced (from cargo's
/// JSON messages, so a custom target directory is followed).
fn build_release(cargo_args: &[&str]) -> anyhow::Result<PathBuf> {
    let out = crate::cmd::cargo()
        .args(cargo_args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("building the release xtask")?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", cargo_args.join(" "), out.status);
    }
    executable_from_messages(&String::from_utf8_lossy(&out.stdout))
        .context("cargo reported no xtask executable")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_cpu_build_runs_in_place() {
        let release = Build { debug_assertions: false, cuda: false };
        assert_eq!(release.relaunch_args(Device::Cpu), None);
        let release_cuda = Build { debug_assertions: false, cuda: true };
        assert_eq!(release_cuda.relaunch_args(Device::Cuda { ordinal: 0 }), None);
    }

    #[test]
    fn a_dev_build_relaunches_in_release_keeping_its_features() {
        let dev = Build { debug_assertions: true, cuda: false };
        let args = dev.relaunch_args(Device::Cpu).unwrap();
        assert!(args.contains(&"--release") && !args.contains(&"cuda"), "{args:?}");
        let dev_cuda = Build { debug_assertions: true, cuda: true };
        assert!(dev_cuda.relaunch_args(Device::Cpu).unwrap().contains(&"cuda"));
    }

    #[test]
    fn the_executable_comes_from_the_last_artifact_message() {
        let stdout = concat!(
            "{\"reason\":\"compiler-artifact\",\"executable\":null}\n",
            "not json\n",
            "{\"reason\":\"compiler-artifact\",\"executable\":\"/t/release/xtask\"}\n",
            "{\"reason\":\"build-finished\",\"success\":true}\n",
        );
        assert_eq!(executable_from_messages(stdout), Some(PathBuf::from("/t/release/xtask")));
        assert_eq!(executable_from_messages(""), None);
    }

    #[test]
    fn cuda_without_the_feature_relaunches_with_it() {
        let release = Build { debug_assertions: false, cuda: false };
        let args = release.relaunch_args(Device::Cuda { ordinal: 0 }).unwrap();
        assert!(args.contains(&"--release") && args.contains(&"cuda"), "{args:?}");
    }
}
