//! Running helper processes (pip, llama.cpp's Python) with their command line echoed.

use std::process::Command;

use anyhow::{Context, bail};

/// Runs `cmd`, echoing it first; fails with the command line if it exits non-zero.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("$ {line}");
    let status = cmd.status().with_context(|| format!("could not start {line}"))?;
    if !status.success() {
        bail!("command failed ({status}): {line}");
    }
    Ok(())
}
