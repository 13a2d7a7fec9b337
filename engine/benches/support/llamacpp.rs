//! llama.cpp beside the engine's benches (`peer`, `quality`): `target/venv-llamacpp`, a venv
//! with llama-cpp-python built from source for this CPU (`GGML_NATIVE`), remade when the target
//! folder outlives the machine it was built on.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The llama-cpp-python release the peer figures are measured against: pinned, so that runs
/// of different sessions compare with the same llama.cpp (an unpinned install picked up
/// 0.3.36, whose AMX path crashes on these VMs; see the probe in `main`).
pub const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// What llama.cpp's native build depends on: the CPU's model and feature flags (Linux's
/// `/proc/cpuinfo`; empty elsewhere).
fn cpu_signature() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map_or("", |(_, v)| v.trim())
    };
    format!("{}\n{}\n", field("model name"), field("flags"))
}

/// `target/venv-llamacpp`'s python, with llama-cpp-python built for this CPU. `GGML_NATIVE`
/// compiles for the building machine's features, and the target folder can outlive the machine
/// (a VM moved to another CPU), so the build records the CPU it was made for and is redone,
/// bypassing pip's wheel cache, on any other.
pub fn llamacpp_python() -> Result<PathBuf, Box<dyn Error>> {
    let venv = super::root().join("target/venv-llamacpp");
    let python = venv.join("bin/python");
    let stamp = venv.join("built-for-cpu.txt");
    let check = format!("import llama_cpp, numpy; assert llama_cpp.__version__ == '{LLAMA_CPP_PYTHON}'");
    let ready = |py: &Path| Command::new(py).args(["-c", &check]).status().is_ok_and(|s| s.success());
    let same_cpu = std::fs::read_to_string(&stamp).is_ok_and(|s| s == cpu_signature());
    if python.exists() && same_cpu && ready(&python) {
        return Ok(python);
    }
    eprintln!(
        "peer: building llama-cpp-python (GGML_NATIVE=ON) for this CPU into {}; minutes",
        venv.display()
    );
    if !python.exists() && !Command::new("python3").args(["-m", "venv"]).arg(&venv).status()?.success() {
        return Err("python3 -m venv failed".into());
    }
    let ok = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-cache-dir",
            "--force-reinstall",
            "--no-binary",
            "llama-cpp-python",
            &format!("llama-cpp-python=={LLAMA_CPP_PYTHON}"),
            "numpy",
        ])
        .env("CMAKE_ARGS", "-DGGML_NATIVE=ON")
        .status()?
        .success();
    if !ok || !ready(&python) {
        return Err("installing llama-cpp-python failed".into());
    }
    std::fs::write(&stamp, cpu_signature())?;
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
