//! [`CudaDevice`]: one GPU, its CUDA context and the one stream every cache copy and kernel of
//! this process runs on; [`driver_present`] says whether libcuda loads at all.
//!
//! Opening never panics without a GPU: `cudarc`'s loader panics when libcuda is absent, so
//! [`CudaDevice::open`] checks `is_culib_present` first and returns a typed error.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, PinnedHostSlice};

use super::error::CudaError;

/// Whether the CUDA driver library can be loaded (false on machines without an NVIDIA driver).
pub fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen the driver library by its candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One GPU: its context and the stream every cache copy and kernel of this process runs on.
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`; [`CudaError::DriverMissing`] without a driver, a driver error
    /// (e.g. `CUDA_ERROR_NO_DEVICE`) without a GPU.
    pub fn open(ordinal: usize) -> Result<Arc<Self>, CudaError> {
        if !driver_present() {
            return Err(CudaError::DriverMissing);
        }
        let ctx = CudaContext::new(ordinal)?;
        // cudarc tracks every slice's uses with events once a context has a non-default stream
        // (event waits and records around each launch argument: hundreds of driver calls per
        // layer). This process puts every allocation, copy, launch and free on the one stream
        // below, so stream order already orders them; turn the tracking off before any slice
        // exists.
        // SAFETY: no slice is ever used on another stream (`CudaDevice` hands out only this one,
        // and nothing here calls `new_stream` or `default_stream` again).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        Ok(Arc::new(CudaDevice { ctx, stream }))
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The stream every copy and launch of this process goes on (what `kv_cache::cuda` takes).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn name(&self) -> Result<String, CudaError> {
        Ok(self.ctx.name()?)
    }
    /// `(major, minor)` compute capability, e.g. `(9, 0)` for an H100/H200.
    pub fn compute_capability(&self) -> Result<(i32, i32), CudaError> {
        Ok(self.ctx.compute_capability()?)
    }
    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }
    /// `len` page-locked host values (a copy from the device at the bus's speed, no staging
    /// through a driver buffer), cached (not write-combined: the host reads them).
    pub fn alloc_pinned<T: PlainValue>(&self, len: usize) -> Result<PinnedHostSlice<T>, CudaError> {
        // SAFETY: flags 0 ask for plain cached page-locked memory; its bytes start undefined,
        // which `PlainValue` types (every bit pattern a value) may hold.
        Ok(unsafe { self.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }?)
    }
    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }
}

/// A number every bit pattern of which is a value (so uninitialized pinned memory holds one).
pub trait PlainValue: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + private::Sealed {}
impl PlainValue for f32 {}
impl PlainValue for u32 {}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u32 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_gpu_is_an_error_not_a_panic() {
        // This test machine may or may not have a driver; either way open() must not panic.
        match CudaDevice::open(0) {
            Ok(dev) => assert!(dev.compute_capability().is_ok()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn a_missing_driver_says_so() {
        // The engine's one error on a machine without a driver (README, engine tests) reads this.
        assert!(CudaError::DriverMissing.to_string().contains("no CUDA driver"));
    }
}
