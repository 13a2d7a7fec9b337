//! Clippy inside the test build: `cargo xtask test` compiles the workspace's own crates with
//! clippy's driver, as `cargo clippy` does (`RUSTC_WORKSPACE_WRAPPER`), but in the build that the
//! tests run from rather than in a check build of its own, so the dependencies compile once.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::bail;

/// Makes every cargo command this process starts from now on compile the workspace's crates
/// with clippy's driver, its lints denied as `cargo clippy -- -D warnings` denies them; the
/// dependencies are compiled by rustc as always (cargo gives the wrapper to workspace members
/// only). Every build of the test run must see the same setting, or cargo rebuilds the
/// workspace's crates: hence the process environment, set before any thread is started.
///
/// # Safety
/// No other thread of this process may be running (`std::env::set_var`).
pub unsafe fn lint_every_workspace_build() -> anyhow::Result<()> {
    let driver = clippy_driver()?;
    // SAFETY: the caller guarantees that this process has no other thread.
    unsafe {
        std::env::set_var("RUSTC_WORKSPACE_WRAPPER", &driver);
        // How `cargo clippy` hands its arguments after `--` to the driver.
        std::env::set_var("CLIPPY_ARGS", "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__");
    }
    eprintln!("clippy: the workspace's crates are compiled by {}", driver.display());
    Ok(())
}

/// The toolchain's `clippy-driver`: beside the cargo that runs us (rustup's toolchain folder),
/// else on `PATH`.
fn clippy_driver() -> anyhow::Result<PathBuf> {
    let beside_cargo =
        std::env::var_os("CARGO").map(|cargo| PathBuf::from(cargo).with_file_name("clippy-driver"));
    let driver = beside_cargo.filter(|d| d.exists()).unwrap_or_else(|| PathBuf::from("clippy-driver"));
    let runs = Command::new(&driver).arg("--version").stdout(Stdio::null()).status();
    if !runs.is_ok_and(|s| s.success()) {
        bail!("clippy's driver ({}) does not run: `rustup component add clippy`", driver.display());
    }
    Ok(driver)
}
