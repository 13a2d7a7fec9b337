//! llama.cpp beside the engine: `target/venv-llamacpp`, a venv with llama-cpp-python built from
//! source for this CPU ([`cmake_args`]), remade when the target folder outlives the machine it
//! was built on or the options change, and llama.cpp's own GGUF writer (the `gguf` package). The `peer` and `quality`
//! benches run llama.cpp from it (through `cargo xtask llamacpp-python`, which prints its
//! python), and `cargo xtask make-model` quantizes with its quantizer.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::bail;

use crate::cmd::{run, workspace_root};

/// The llama-cpp-python release the peer figures are measured against: pinned, so that runs
/// of different sessions compare with the same llama.cpp (an unpinned install picked up
/// 0.3.36, whose AMX path crashes on these VMs; see the probe in `peer_llamacpp.py`).
pub const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// llama.cpp's GGUF writer for Python, the release of llama.cpp's tree that writes what
/// [`LLAMA_CPP_PYTHON`]'s llama.cpp reads.
const GGUF_PY: &str = "gguf==0.17.1";

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

/// The CMake options llama.cpp is built with: the CPU's ([`cpu_cmake_args`]) and only the
/// libraries the bindings load (llama and ggml): not the multimodal `mtmd` (`LLAVA_BUILD`, loaded
/// only by the vision chat handlers) nor llama.cpp's `common` utilities, which llama-cpp-python
/// switches on with a forced cache entry although the bindings never load them; they cost more
/// to compile than llama and ggml together. A project include run at llama.cpp's `project()`
/// shadows that entry in llama.cpp's scope (`CMAKE_PROJECT_<name>_INCLUDE`).
pub fn cmake_args() -> anyhow::Result<String> {
    let include = workspace_root().join("target/llamacpp/libraries-only.cmake");
    let text = concat!(
        "# Written by `cargo xtask`: llama.cpp's libraries without its `common` utilities.\n",
        "set(LLAMA_BUILD_COMMON OFF)\n",
    );
    std::fs::create_dir_all(include.parent().expect("a file in a folder"))?;
    if std::fs::read_to_string(&include).ok().as_deref() != Some(text) {
        std::fs::write(&include, text)?;
    }
    let cpu = cpu_cmake_args();
    Ok(format!("{cpu} -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE={}", include.display()))
}

/// The CPU's CMake options: `GGML_NATIVE` (every feature of this CPU), except
/// on a CPU with AMX, whose path in this llama.cpp crashes on these VMs (SIGSEGV in
/// `ggml_backend_amx_mul_mat`) and, once it crashes, leaves llama.cpp without its extra buffer
/// types altogether: there every other feature this CPU has is named instead, AMX left off, so
/// that the repacked weight layouts stay on.
fn cpu_cmake_args() -> String {
    cmake_args_for(&cpu_flags())
}

/// [`cpu_cmake_args`] for a CPU of these feature flags.
fn cmake_args_for(flags: &[String]) -> String {
    if !flags.iter().any(|f| f.starts_with("amx")) {
        return "-DGGML_NATIVE=ON".to_owned();
    }
    let features = [
        ("avx", "GGML_AVX"),
        ("avx2", "GGML_AVX2"),
        ("fma", "GGML_FMA"),
        ("f16c", "GGML_F16C"),
        ("bmi2", "GGML_BMI2"),
        ("avx512f", "GGML_AVX512"),
        ("avx512_vbmi", "GGML_AVX512_VBMI"),
        ("avx512_vnni", "GGML_AVX512_VNNI"),
        ("avx512_bf16", "GGML_AVX512_BF16"),
        ("avx_vnni", "GGML_AVX_VNNI"),
    ];
    let mut args = vec!["-DGGML_NATIVE=OFF".to_owned()];
    for (flag, option) in features {
        args.push(format!("-D{option}={}", if flags.iter().any(|f| f == flag) { "ON" } else { "OFF" }));
    }
    args.extend(["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"].map(|o| format!("-D{o}=OFF")));
    args.join(" ")
}

/// This CPU's feature flags (`/proc/cpuinfo`).
fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let line = info.lines().find(|l| l.starts_with("flags")).and_then(|l| l.split_once(':'));
    line.map(|(_, v)| v.split_whitespace().map(str::to_owned).collect()).unwrap_or_default()
}

/// Whether `python -c code` succeeds (quietly).
fn python_ok(python: &Path, code: &str) -> bool {
    Command::new(python).args(["-c", code]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// `target/venv-llamacpp`'s python, with llama-cpp-python built for this CPU and the `gguf`
/// package. The build compiles for the building machine's features, and the target folder
/// can outlive the machine (a VM moved to another CPU), so the build records the CPU it was made
/// for and is redone, bypassing pip's wheel cache, on any other.
pub fn python() -> anyhow::Result<PathBuf> {
    let venv = workspace_root().join("target/venv-llamacpp");
    let python = venv.join("bin/python");
    let stamp = venv.join("built-for-cpu.txt");
    let check = format!("import llama_cpp, numpy; assert llama_cpp.__version__ == '{LLAMA_CPP_PYTHON}'");
    let cmake = cmake_args()?;
    // The stamp: the CPU and the options, either of which changing calls for another build.
    let signature = format!("{}{cmake}\n", cpu_signature());
    let same_build = std::fs::read_to_string(&stamp).is_ok_and(|s| s == signature);
    if !(python.exists() && same_build && python_ok(&python, &check)) {
        eprintln!(
            "llamacpp: building llama-cpp-python ({cmake}) for this CPU into {}; minutes",
            venv.display()
        );
        if !python.exists() {
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-cache-dir", "--force-reinstall", "--no-binary"])
            .args(["llama-cpp-python", &format!("llama-cpp-python=={LLAMA_CPP_PYTHON}"), "numpy"])
            .env("CMAKE_ARGS", &cmake))?;
        if !python_ok(&python, &check) {
            bail!("llama-cpp-python {LLAMA_CPP_PYTHON} does not import after its install");
        }
        std::fs::write(&stamp, signature)?;
    }
    if !python_ok(&python, "import gguf") {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet", GGUF_PY]))?;
    }
    Ok(python)
}

/// `cargo xtask llamacpp-python`: makes the venv when needed and prints its python (what the
/// benches run llama.cpp with).
pub fn print_python() -> anyhow::Result<()> {
    println!("{}", python()?.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn amx_is_left_out_by_naming_every_other_feature() {
        let zen4 = cmake_args_for(&flags("avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16"));
        assert_eq!(zen4, "-DGGML_NATIVE=ON");
        let xeon = cmake_args_for(&flags(
            "avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8",
        ));
        assert!(xeon.starts_with("-DGGML_NATIVE=OFF"), "{xeon}");
        for on in ["GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"] {
            assert!(xeon.contains(&format!("-D{on}=ON")), "{on}: {xeon}");
        }
        for off in ["GGML_AVX512_VBMI", "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"] {
            assert!(xeon.contains(&format!("-D{off}=OFF")), "{off}: {xeon}");
        }
    }
}
