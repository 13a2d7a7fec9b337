//! [`DeviceIndices`]: indices a kernel reads on the device (token ids, positions, gathered
//! rows), each checked on the host against the bound it indexes before it goes up, so a launch
//! that reads them knows every one is in range.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use super::error::CudaError;

/// Indices on the device, every one below [`DeviceIndices::bound`].
#[derive(Debug)]
pub struct DeviceIndices<T> {
    buf: CudaSlice<T>,
    len: usize,
    bound: usize,
}

impl<T> DeviceIndices<T>
where
    T: DeviceRepr + ValidAsZeroBits + Copy + std::fmt::Debug,
    usize: TryFrom<T>,
{
    /// Room for `capacity` indices (at least one: cudarc cannot allocate zero-length buffers).
    pub fn new(stream: &Arc<CudaStream>, capacity: usize) -> Result<Self, CudaError> {
        Ok(Self { buf: stream.alloc_zeros(capacity.max(1))?, len: 0, bound: 0 })
    }

    /// Checks that every index of `host` is below `bound` and fits, then uploads it.
    pub fn fill(&mut self, stream: &Arc<CudaStream>, host: &[T], bound: usize) -> Result<(), CudaError> {
        if host.len() > self.buf.len() {
            return Err(CudaError::InvalidArgument(format!(
                "{} indices exceed the buffer's {}",
                host.len(),
                self.buf.len()
            )));
        }
        if let Some(bad) = host.iter().find(|&&i| usize::try_from(i).map_or(true, |i| i >= bound)) {
            return Err(CudaError::InvalidArgument(format!("index {bad:?} is not below {bound}")));
        }
        if !host.is_empty() {
            stream.memcpy_htod(host, &mut self.buf.slice_mut(..host.len()))?;
        }
        (self.len, self.bound) = (host.len(), bound);
        Ok(())
    }

    /// How many indices the last [`fill`](Self::fill) uploaded.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every index is below this.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// The device buffer, for a launch that reads the first [`len`](Self::len) indices.
    pub(crate) fn buffer(&self) -> &CudaSlice<T> {
        &self.buf
    }
}
