//! Loading kernels on a GPU: compile (or fetch from the cubin cache) the program a kernel lives
//! in for the device's own compute capability, load it as a module, and hand out functions.
//!
//! Cubins, not PTX: PTX from a newer NVRTC than the driver cannot be JIT-compiled by the driver,
//! while a cubin for the device's exact `sm_XY` loads on any driver of the same major version.
//! A cached cubin that still fails to load is compiled again with this machine's NVRTC
//! ([`CubinCache::load_or_recompile`]), the reason logged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::cubin_cache::{CubinCache, default_dir};
use super::device::CudaDevice;
use super::error::CudaError;
use super::kernels::Program;
use super::{lock, nvrtc};

/// The `sm_XY` architecture name of a compute capability.
pub fn arch_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// Kernels of one device: compiled on first use, cached, loaded once.
#[derive(Debug)]
pub struct CudaKernels {
    device: Arc<CudaDevice>,
    arch: String,
    cubins: CubinCache,
    header_dir: PathBuf,
    max_shared_optin: usize,
    multiprocessors: usize,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl CudaKernels {
    /// Kernels for `device`, caching cubins in [`default_dir`].
    pub fn new(device: Arc<CudaDevice>) -> Result<Self, CudaError> {
        Self::with_cache_dir(device, default_dir())
    }

    /// Kernels for `device`, caching cubins in `dir` (memory only when `None`).
    pub fn with_cache_dir(device: Arc<CudaDevice>, dir: Option<PathBuf>) -> Result<Self, CudaError> {
        let (major, minor) = device.context().compute_capability()?;
        let max_shared_optin = device
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let multiprocessors =
            device.context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let header_dir = dir.clone().unwrap_or_else(std::env::temp_dir).join("nvrtc-headers");
        Ok(CudaKernels {
            device,
            arch: arch_name(major, minor),
            cubins: CubinCache::new(dir),
            header_dir,
            max_shared_optin: usize::try_from(max_shared_optin).unwrap_or(48 * 1024),
            multiprocessors: usize::try_from(multiprocessors).unwrap_or(1).max(1),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
    /// The most dynamic shared memory one thread block may use on this device.
    pub fn max_shared_bytes(&self) -> usize {
        self.max_shared_optin
    }

    /// Streaming multiprocessors of the device (what a launch's grid has to fill).
    pub fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// Kernel `entry` of `program`, compiling and loading the program on first use. Functions
    /// are set up to accept the device's full opt-in dynamic shared memory.
    pub fn function(&self, program: &Program, entry: &str) -> Result<CudaFunction, CudaError> {
        self.function_lazy(&program.name, entry, || program.clone())
    }

    /// Like [`CudaKernels::function`], but builds the program (a long source string) only when
    /// the function is not loaded yet; `program_name` must be the name `make` gives it.
    pub fn function_lazy(
        &self,
        program_name: &str,
        entry: &str,
        make: impl FnOnce() -> Program,
    ) -> Result<CudaFunction, CudaError> {
        let fkey = format!("{program_name}::{entry}");
        if let Some(f) = lock(&self.functions).get(&fkey) {
            return Ok(f.clone());
        }
        let program = make();
        if !program.entries.iter().any(|e| e.name == entry) {
            return Err(CudaError::MissingKernel(entry.to_owned()));
        }
        let module = self.module(&program)?;
        let f = module.load_function(entry).map_err(|_| CudaError::MissingKernel(entry.to_owned()))?;
        // Dynamic shared memory may use the device's opt-in maximum minus the kernel's static
        // shared memory (asking for more is an invalid value).
        let optin = i32::try_from(self.max_shared_optin).unwrap_or(i32::MAX);
        let static_shared = f.shared_size_bytes()?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            optin.saturating_sub(static_shared),
        )?;
        lock(&self.functions).insert(fkey, f.clone());
        Ok(f)
    }

    fn module(&self, program: &Program) -> Result<Arc<CudaModule>, CudaError> {
        if let Some(m) = lock(&self.modules).get(&program.name) {
            return Ok(m.clone());
        }
        let module = self.cubins.load_or_recompile(
            program,
            &self.arch,
            || nvrtc::compile(program, &self.arch, &self.header_dir, false).map(|c| c.cubin),
            |cubin| Ok(self.device.context().load_module(Ptx::from_binary(cubin.to_vec()))?),
        )?;
        lock(&self.modules).insert(program.name.clone(), module.clone());
        Ok(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(arch_name(9, 0), "sm_90");
        assert_eq!(arch_name(8, 6), "sm_86");
    }
}
