//! NVRTC compilation of a [`Program`] to a cubin for one GPU architecture, keeping the
//! compiler log (ptxas `-v` statistics), and parsing that log into per-kernel resource usage.
//!
//! Uses `cudarc::nvrtc::result` (the low-level API) because the high-level `compile_ptx` drops
//! the log on success, and the log is what the compile check reads.

use std::ffi::CString;
use std::path::Path;

use cudarc::nvrtc::{result, sys};

use super::error::CudaError;
use super::kernels::Program;

/// The output of one successful compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The cubin (an ELF image for exactly the requested architecture).
    pub cubin: Vec<u8>,
    /// The compiler log (ptxas statistics when `verbose`).
    pub log: String,
}

/// Whether `libnvrtc` can be loaded (never panics, unlike the first NVRTC call without it).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// Compiles `program` for `arch` (e.g. `sm_90`) to a cubin.
///
/// `header_dir`: where NVRTC (≥ 13.3) unpacks its bundled `cuda_fp16.h`/`cuda_bf16.h`.
/// `verbose`: ask ptxas for per-kernel register/shared-memory/spill statistics.
pub fn compile(
    program: &Program,
    arch: &str,
    header_dir: &Path,
    verbose: bool,
) -> Result<Compiled, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NvrtcMissing);
    }
    let c_string = |s: &[u8]| CString::new(s).map_err(|_| CudaError::SourceHasNul(program.name.clone()));
    let (src, name) =
        (c_string(program.source.as_bytes())?, c_string(format!("{}.cu", program.name).as_bytes())?);
    let headers = if bundled_headers_supported() {
        format!("--use-bundled-headers={}", header_dir.display())
    } else {
        // NVRTC before 13.3 has no bundled fp16/bf16 headers: use the toolkit's, if installed.
        format!("--include-path={}", toolkit_include_dir().display())
    };
    let mut options = vec![format!("--gpu-architecture={arch}"), headers, "-std=c++17".to_owned()];
    if verbose {
        options.push("--ptxas-options=-v".to_owned());
    }
    let nvrtc = |e: result::NvrtcError| CudaError::Nvrtc {
        program: program.name.clone(),
        code: format!("{:?}", e.0),
    };
    let prog = result::create_program(&src, Some(&name)).map_err(nvrtc)?;
    // SAFETY: `prog` was just created and is destroyed exactly once below; `src`/`name` outlive it.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let log = unsafe { result::get_program_log(prog) }.map(|l| c_chars_to_string(&l)).unwrap_or_default();
    let outcome = match compiled {
        Ok(()) => unsafe { get_cubin(prog) }.map_err(nvrtc).map(|cubin| Compiled { cubin, log }),
        Err(e) if e.0 == sys::nvrtcResult::NVRTC_ERROR_COMPILATION => {
            Err(CudaError::Compile { program: program.name.clone(), arch: arch.to_owned(), log })
        }
        Err(e) => Err(CudaError::Nvrtc { program: program.name.clone(), code: format!("{:?}: {log}", e.0) }),
    };
    // SAFETY: created above, not destroyed yet.
    let _ = unsafe { result::destroy_program(prog) };
    outcome
}

/// Whether this libnvrtc can unpack its own fp16/bf16 headers (`--use-bundled-headers`, 13.3+).
fn bundled_headers_supported() -> bool {
    version().is_some_and(|v| v >= (13, 3))
}

/// The loaded libnvrtc's (major, minor) version; `None` when it cannot say.
pub fn version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; the library was checked to be present.
    let ok = unsafe { sys::nvrtcVersion(&mut major, &mut minor) } == sys::nvrtcResult::NVRTC_SUCCESS;
    ok.then_some((major, minor))
}

/// `$CUDA_HOME/include`, else `/usr/local/cuda/include`.
fn toolkit_include_dir() -> std::path::PathBuf {
    std::env::var_os("CUDA_HOME")
        .map(|h| std::path::PathBuf::from(h).join("include"))
        .unwrap_or_else(|| std::path::PathBuf::from("/usr/local/cuda/include"))
}

/// # Safety
/// `prog` must be a live, successfully compiled NVRTC program.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: per the function contract.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result()?;
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds `size` bytes as NVRTC asked.
    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }.result()?;
    Ok(buf)
}

fn c_chars_to_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Resource usage of one kernel, from ptxas's `-v` log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub name: String,
    pub registers: u32,
    /// Static shared memory in bytes (dynamic shared memory is sized at launch).
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

impl KernelStats {
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// Parses ptxas `-v` output: a "Compiling entry function 'NAME'" or "Function properties for
/// NAME" line opens a kernel; the "stack frame … spill stores … spill loads" and "Used N
/// registers … bytes smem" lines fill it in.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelStats> {
    let mut out: Vec<KernelStats> = Vec::new();
    let mut current: Option<usize> = None;
    for line in log.lines() {
        let line = line.trim();
        let opened = line
            .split_once("Compiling entry function '")
            .and_then(|(_, rest)| rest.split_once('\''))
            .map(|(n, _)| n)
            .or_else(|| line.split_once("Function properties for ").map(|(_, n)| n.trim()));
        if let Some(name) = opened {
            current = Some(out.iter().position(|k| k.name == name).unwrap_or_else(|| {
                out.push(KernelStats { name: name.to_owned(), ..KernelStats::default() });
                out.len() - 1
            }));
            continue;
        }
        let Some(k) = current.and_then(|i| out.get_mut(i)) else { continue };
        if line.contains("stack frame") {
            k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used ") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

/// The integer right before `marker` in `line` ("…, 12 bytes spill stores, …" → 12).
fn number_before(line: &str, marker: &str) -> Option<u32> {
    let (head, _) = line.split_once(marker)?;
    head.trim_end().rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'paged_attention_v1_bf16_h128_b16_g4' for 'sm_90'
ptxas info    : Function properties for paged_attention_v1_bf16_h128_b16_g4
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'paged_attention_v2_reduce' for 'sm_90'
ptxas info    : Function properties for paged_attention_v2_reduce
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, 16 bytes smem, 400 bytes cmem[0]
";

    #[test]
    fn parses_registers_shared_memory_and_spills() {
        let stats = parse_ptxas_log(LOG);
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[0].name, "paged_attention_v1_bf16_h128_b16_g4");
        assert_eq!((stats[0].registers, stats[0].shared_bytes), (64, 0));
        assert!(!stats[0].spills());
        assert_eq!(stats[1].registers, 255);
        assert_eq!(stats[1].shared_bytes, 16);
        assert_eq!(
            (stats[1].stack_bytes, stats[1].spill_store_bytes, stats[1].spill_load_bytes),
            (24, 8, 12)
        );
        assert!(stats[1].spills());
    }
}
