//! Compiled cubins, cached in memory and on disk, keyed by the program source, the target
//! architecture and the compile options, so a process compiles a program once and a machine
//! compiles it once across processes (and a prepared bundle can ship the files).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::error::CudaError;
use super::kernels::Program;
use super::lock;
use crate::file::write_atomically;

/// Bump when the NVRTC options change, so old cubins are not reused.
pub const OPTIONS_VERSION: &str = "nvrtc-opts-1";

/// Environment variable naming the on-disk cache folder.
pub const CACHE_DIR_ENV: &str = "ATTN_KERNELS_CUBIN_DIR";

/// The cache key of `program` compiled for `arch`: a hex SHA-256 prefix.
pub fn cache_key(program: &Program, arch: &str) -> String {
    let mut h = Sha256::new();
    h.update(OPTIONS_VERSION.as_bytes());
    h.update([0]);
    h.update(arch.as_bytes());
    h.update([0]);
    h.update(program.source.as_bytes());
    h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// File name of a cached cubin inside the cache folder.
pub fn file_name(program: &Program, arch: &str) -> String {
    format!("{}-{arch}-{}.cubin", program.name, cache_key(program, arch))
}

/// The default on-disk folder: `$ATTN_KERNELS_CUBIN_DIR`, else
/// `$XDG_CACHE_HOME/paged-llm-kernels`, else `~/.cache/paged-llm-kernels`; `None` when none of
/// them is set.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(CACHE_DIR_ENV) {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("paged-llm-kernels"))
}

/// In-memory map in front of an optional folder of `.cubin` files.
#[derive(Debug, Default)]
pub struct CubinCache {
    dir: Option<PathBuf>,
    mem: Mutex<HashMap<String, Arc<Vec<u8>>>>,
}

impl CubinCache {
    pub fn new(dir: Option<PathBuf>) -> Self {
        CubinCache { dir, mem: Mutex::new(HashMap::new()) }
    }

    /// The cubin of `program` for `arch`: from memory, else from disk, else from `compile`
    /// (whose result is stored in both). A disk read or write failure only costs a compile.
    pub fn get_or_compile(
        &self,
        program: &Program,
        arch: &str,
        compile: impl FnOnce() -> Result<Vec<u8>, CudaError>,
    ) -> Result<Arc<Vec<u8>>, CudaError> {
        let key = file_name(program, arch);
        if let Some(hit) = lock(&self.mem).get(&key) {
            return Ok(hit.clone());
        }
        let path = self.dir.as_ref().map(|d| d.join(&key));
        let cubin = match path.as_ref().and_then(|p| std::fs::read(p).ok()).filter(|b| !b.is_empty()) {
            Some(bytes) => bytes,
            None => {
                let bytes = compile()?;
                if let Some(p) = &path
                    && let Err(e) = write_atomically(p, &bytes)
                {
                    // The crate has no logging dependency; a failed write is worth one line.
                    eprintln!("attn-kernels: could not store cubin {}: {e}", p.display());
                }
                bytes
            }
        };
        let cubin = Arc::new(cubin);
        lock(&self.mem).insert(key, cubin.clone());
        Ok(cubin)
    }

    /// The cubin of `program` for `arch`, loaded by `load`. A cached cubin that fails to load
    /// (one built by an NVRTC newer than this machine's driver, a corrupt file) is compiled
    /// again with `compile` (this machine's NVRTC), logged with the reason, replaced in memory
    /// and on disk, and loaded once more; a fresh compile that fails to load is an error.
    pub fn load_or_recompile<T>(
        &self,
        program: &Program,
        arch: &str,
        compile: impl Fn() -> Result<Vec<u8>, CudaError>,
        load: impl Fn(&[u8]) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let compiled_now = std::cell::Cell::new(false);
        let cubin = self.get_or_compile(program, arch, || {
            compiled_now.set(true);
            compile()
        })?;
        let first = match load(&cubin) {
            Ok(loaded) => return Ok(loaded),
            Err(e) if compiled_now.get() => return Err(e),
            Err(e) => e,
        };
        let key = file_name(program, arch);
        eprintln!(
            "kernels: the cached cubin {key} did not load ({first}); compiling {} for {arch} with this machine's NVRTC",
            program.name
        );
        let fresh = Arc::new(compile()?);
        lock(&self.mem).insert(key.clone(), fresh.clone());
        if let Some(dir) = &self.dir
            && let Err(e) = write_atomically(&dir.join(&key), &fresh)
        {
            eprintln!("kernels: could not replace cubin {key}: {e}");
        }
        load(&fresh)
    }

    /// Stores an already compiled cubin on disk (what the GPU bundle does ahead of time).
    pub fn store(&self, program: &Program, arch: &str, cubin: &[u8]) -> Result<PathBuf, CudaError> {
        let Some(dir) = &self.dir else {
            return Err(CudaError::InvalidArgument("the cubin cache has no folder".into()));
        };
        let path = dir.join(file_name(program, arch));
        write_atomically(&path, cubin)
            .map_err(|source| CudaError::CacheIo { path: path.display().to_string(), source })?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernels::Entry;

    /// A scratch folder removed on drop (the crate has no tempfile dependency).
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("attn-kernels-cubin-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn program(src: &str) -> Program {
        Program {
            name: "p".into(),
            source: src.into(),
            entries: vec![Entry { name: "k".into(), attention: false }],
        }
    }

    #[test]
    fn key_depends_on_source_and_arch() {
        let a = program("a");
        assert_ne!(cache_key(&a, "sm_90"), cache_key(&a, "sm_80"));
        assert_ne!(cache_key(&a, "sm_90"), cache_key(&program("b"), "sm_90"));
        assert_eq!(cache_key(&a, "sm_90"), cache_key(&program("a"), "sm_90"));
    }

    #[test]
    fn compiles_once_then_hits_memory_and_disk() -> Result<(), CudaError> {
        let dir = TempDir::new("hits");
        let p = program("x");
        let calls = std::cell::Cell::new(0);
        let compile = || {
            calls.set(calls.get() + 1);
            Ok(vec![1u8, 2, 3])
        };
        let cache = CubinCache::new(Some(dir.0.clone()));
        assert_eq!(*cache.get_or_compile(&p, "sm_90", compile)?, vec![1, 2, 3]);
        assert_eq!(*cache.get_or_compile(&p, "sm_90", compile)?, vec![1, 2, 3]);
        assert_eq!(calls.get(), 1);
        // A fresh process (new memory map) reads the file instead of compiling.
        let again = CubinCache::new(Some(dir.0.clone()));
        assert_eq!(*again.get_or_compile(&p, "sm_90", compile)?, vec![1, 2, 3]);
        assert_eq!(calls.get(), 1);
        // Another architecture is another entry.
        again.get_or_compile(&p, "sm_80", compile)?;
        assert_eq!(calls.get(), 2);
        Ok(())
    }

    #[test]
    fn a_cached_cubin_that_does_not_load_is_compiled_again_and_replaced() -> Result<(), CudaError> {
        let dir = TempDir::new("corrupt");
        let p = program("z");
        let good = b"\x7fELF good cubin".to_vec();
        // A loader that accepts only ELF images, as the driver rejects a corrupt file.
        let load = |b: &[u8]| {
            if b.starts_with(b"\x7fELF") {
                Ok(b.len())
            } else {
                Err(CudaError::InvalidArgument("CUDA_ERROR_INVALID_IMAGE".into()))
            }
        };
        let calls = std::cell::Cell::new(0);
        let compile = || {
            calls.set(calls.get() + 1);
            Ok(good.clone())
        };
        let cache = CubinCache::new(Some(dir.0.clone()));
        let path = cache.store(&p, "sm_90", b"corrupt bytes")?;
        assert_eq!(cache.load_or_recompile(&p, "sm_90", compile, load)?, good.len());
        assert_eq!(calls.get(), 1);
        // The file on disk is the fresh cubin now, and memory serves the next call.
        assert_eq!(std::fs::read(&path).ok(), Some(good.clone()));
        assert_eq!(cache.load_or_recompile(&p, "sm_90", compile, load)?, good.len());
        assert_eq!(calls.get(), 1);
        // A cubin this machine just compiled that still does not load is an error, not a loop.
        let bad = CubinCache::new(None);
        let r = bad.load_or_recompile(&program("w"), "sm_90", || Ok(b"junk".to_vec()), load);
        assert!(matches!(r, Err(CudaError::InvalidArgument(_))));
        Ok(())
    }

    #[test]
    fn compile_errors_are_not_cached() {
        let cache = CubinCache::new(None);
        let p = program("y");
        let r = cache.get_or_compile(&p, "sm_90", || Err(CudaError::NvrtcMissing));
        assert!(matches!(r, Err(CudaError::NvrtcMissing)));
        let ok = cache.get_or_compile(&p, "sm_90", || Ok(vec![7]));
        assert!(matches!(ok.as_deref(), Ok(v) if v == &vec![7u8]));
    }
}
