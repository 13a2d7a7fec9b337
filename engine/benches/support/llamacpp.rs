//! llama.cpp beside the engine's benches (`peer`, `quality`): the python of
//! `target/venv-llamacpp` (llama-cpp-python built for this CPU), which `cargo xtask
//! llamacpp-python` makes when needed (`xtask/src/llamacpp.rs` owns that build).

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `target/venv-llamacpp`'s python, through `cargo xtask llamacpp-python` (which builds it for
/// this CPU first when needed: minutes).
pub fn llamacpp_python() -> Result<PathBuf, Box<dyn Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(super::root())
        .args(["xtask", "llamacpp-python"])
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("cargo xtask llamacpp-python failed ({})", out.status).into());
    }
    let path = String::from_utf8(out.stdout)?;
    let python = PathBuf::from(path.lines().last().unwrap_or_default().trim());
    if !python.exists() {
        return Err(
            format!("cargo xtask llamacpp-python printed {}, which is not there", python.display()).into()
        );
    }
    Ok(python)
}

/// Whether llama.cpp runs `gguf` with its extra CPU buffer types (AMX, repacked layouts), which
/// crash on some machines that advertise AMX: `peer_llamacpp.py`'s probe, in a process of its own.
pub fn extra_buffers_work(python: &Path, gguf: &Path, threads: usize) -> Result<bool, Box<dyn Error>> {
    let script = super::root().join("engine/benches/peer_llamacpp.py");
    let probe =
        Command::new(python).arg(&script).arg(gguf).arg("--probe").arg(threads.to_string()).output()?;
    Ok(probe.status.success())
}

/// The CMake options the llama.cpp of `python`'s venv was built with (the last line of the stamp
/// `cargo xtask llamacpp-python` leaves in the venv), for the reports.
pub fn build_options(python: &Path) -> String {
    let stamp = python.parent().and_then(Path::parent).map(|venv| venv.join("built-for-cpu.txt"));
    let text = stamp.and_then(|s| std::fs::read_to_string(s).ok()).unwrap_or_default();
    text.lines().last().filter(|l| l.starts_with("-D")).unwrap_or("unknown options").to_owned()
}
