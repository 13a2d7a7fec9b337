//! Small helpers for running cargo and other processes from xtask, and for the folders they read
//! and write.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The workspace root (the parent of the `xtask` crate).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The cargo binary that invoked us (falls back to `cargo` on PATH).
pub fn cargo() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// Runs `cmd`, echoing it first; fails with the command line if it exits non-zero.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("$ {line}");
    let status = cmd.status().with_context(|| format!("could not start {line}"))?;
    if !status.success() {
        bail!("command failed ({status}): {line}");
    }
    Ok(())
}

/// `target/<name>`, a Python venv in which `import <imports>` works (idempotent: the venv is
/// made when missing, and `packages` are pip-installed when the import fails); returns it.
pub fn ensure_venv(name: &str, imports: &str, packages: &[&str]) -> anyhow::Result<PathBuf> {
    let venv = workspace_root().join("target").join(name);
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let ready = Command::new(&python)
        .args(["-c", &format!("import {imports}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(packages))?;
    }
    Ok(venv)
}

/// Empties `dir`, creating it when missing.
pub fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Every file below `dir`, recursively, leaving out the entries whose name `skip` refuses (a
/// refused folder is not entered).
pub fn files_under(dir: &Path, skip: &impl Fn(&str) -> bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        if skip(&entry.file_name().to_string_lossy()) {
            continue;
        }
        if entry.file_type()?.is_dir() {
            files.extend(files_under(&entry.path(), skip)?);
        } else {
            files.push(entry.path());
        }
    }
    Ok(files)
}
