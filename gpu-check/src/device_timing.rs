//! Timing on the device, shared by the binaries: a call's mean time by CUDA events, and the
//! device-to-device copy bandwidth that the bandwidth figures are put over.

use attn_kernels::cuda::{CudaDevice, CudaError};

use crate::figures::Res;

/// Mean seconds per call of `f` over `iters` calls, timed with CUDA events after 3 warm-ups.
pub fn time_it(device: &CudaDevice, iters: usize, mut f: impl FnMut() -> Result<(), CudaError>) -> Res<f64> {
    for _ in 0..3 {
        f()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (device.context().new_event(flags)?, device.context().new_event(flags)?);
    a.record(device.stream())?;
    for _ in 0..iters {
        f()?;
    }
    b.record(device.stream())?;
    b.synchronize()?;
    Ok(f64::from(a.elapsed_ms(&b)?) / 1e3 / iters as f64)
}

/// Bytes a device-to-device copy of 1 GiB moves a second, read and written (20 copies): the
/// bandwidth ceiling.
pub fn copy_bytes_per_sec(device: &CudaDevice) -> Res<f64> {
    let stream = device.stream().clone();
    let n = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(n)?;
    let mut dst = stream.alloc_zeros::<u8>(n)?;
    let copy_s = time_it(device, 20, || Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * n as f64 / copy_s)
}
