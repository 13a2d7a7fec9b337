//! Attention metadata on the device: the checked host metadata as the `i32` arrays the kernels
//! read, and the device's copy of the block table, which persists between steps and is updated
//! by the rows that changed (the host table is the engine's persistent one, so a decode step
//! uploads a few rows, not every table).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::error::CudaError;
use crate::PagedAttnMetadata;

/// Batch metadata on the device, uploaded from the host [`PagedAttnMetadata`] after checking it.
#[derive(Debug)]
pub struct DeviceAttnMetadata {
    pub(crate) query_start_loc: CudaSlice<i32>,
    pub(crate) seq_lens: CudaSlice<i32>,
    pub(crate) seq_rows: CudaSlice<i32>,
    /// The block table's entries (block ids below the cache's block count, which is at most
    /// `i32::MAX`: the kernels read them as `int`).
    pub(crate) block_tables: CudaSlice<u32>,
    /// Entries of the table uploaded so far, and its stride.
    table_len: usize,
    pub(crate) max_blocks_per_seq: usize,
    /// The checked batch these buffers hold (its counts are what a launch is sized by).
    pub(crate) host: HostAttnMetadata,
}

/// Host side of [`DeviceAttnMetadata`]: the checked batch as the `i32` arrays the kernels read
/// (the block table itself is uploaded as it is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAttnMetadata {
    pub query_start_loc: Vec<i32>,
    pub seq_lens: Vec<i32>,
    /// Each sequence's row of the table (`s` itself for a dense table).
    pub seq_rows: Vec<i32>,
    pub num_tokens: usize,
    pub max_context: usize,
    pub is_decode: bool,
}

impl HostAttnMetadata {
    /// Checks `meta` against a cache of `num_blocks` blocks of `block_size` tokens with the
    /// CPU kernels' host-side checks (`query_start_loc`, the rows, each table covering its
    /// context, every block id a kernel will read in range; entries past a sequence's blocks are
    /// never read, so they may hold anything), and converts it to the kernels' `i32` arrays.
    pub fn check(
        meta: &PagedAttnMetadata<'_>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, CudaError> {
        if i32::try_from(num_blocks).is_err() {
            return Err(CudaError::InvalidArgument(format!(
                "{num_blocks} blocks exceed the kernels' i32 block ids"
            )));
        }
        crate::meta::check_query_start_loc(meta)
            .and_then(|()| crate::meta::check_tables(meta, block_size, num_blocks))
            .map_err(|e| CudaError::InvalidArgument(e.to_string()))?;
        let num_seqs = meta.num_seqs();
        let with_query = (0..num_seqs).filter(|&s| meta.query_len(s) > 0);
        Ok(HostAttnMetadata {
            query_start_loc: to_i32(meta.query_start_loc.iter().copied())?,
            seq_lens: to_i32(meta.seq_lens.iter().copied())?,
            seq_rows: to_i32((0..num_seqs).map(|s| meta.row(s)))?,
            num_tokens: meta.num_tokens(),
            max_context: with_query.map(|s| meta.seq_lens[s]).max().unwrap_or(0),
            is_decode: num_seqs > 0 && (0..num_seqs).all(|s| meta.query_len(s) == 1),
        })
    }
}

fn to_i32(values: impl Iterator<Item = usize>) -> Result<Vec<i32>, CudaError> {
    values
        .map(|v| i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("{v} exceeds i32"))))
        .collect()
}

/// Copies `host` into `dev` when it fits, else replaces `dev` by a buffer of `host`'s size, so a
/// step allocates only when it outgrows every earlier one (an empty `host` leaves `dev` as it is).
pub(crate) fn upload_into<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    host: &[T],
    dev: &mut CudaSlice<T>,
) -> Result<(), CudaError> {
    if host.is_empty() {
        return Ok(());
    }
    if dev.len() >= host.len() {
        stream.memcpy_htod(host, &mut dev.slice_mut(..host.len()))?;
    } else {
        *dev = stream.clone_htod(host)?;
    }
    Ok(())
}

impl DeviceAttnMetadata {
    /// Checks `meta` against a cache of `num_blocks` blocks of `block_size` tokens and uploads
    /// it, block table included, into new buffers (cudarc cannot allocate zero-length buffers
    /// portably, so an empty array keeps one zero).
    pub fn upload(
        stream: &Arc<CudaStream>,
        meta: &PagedAttnMetadata<'_>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, CudaError> {
        let mut dev = DeviceAttnMetadata {
            query_start_loc: stream.alloc_zeros(1)?,
            seq_lens: stream.alloc_zeros(1)?,
            seq_rows: stream.alloc_zeros(1)?,
            block_tables: stream.alloc_zeros(1)?,
            table_len: 0,
            max_blocks_per_seq: 0,
            host: HostAttnMetadata::default(),
        };
        dev.reupload(stream, meta, 0..0, block_size, num_blocks)?;
        Ok(dev)
    }

    /// Like [`DeviceAttnMetadata::upload`], into these buffers (grown only when too small). Of
    /// the block table only `changed_rows` are uploaded, unless its shape changed since the last
    /// upload (then all of it is).
    pub fn reupload(
        &mut self,
        stream: &Arc<CudaStream>,
        meta: &PagedAttnMetadata<'_>,
        changed_rows: Range<usize>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<(), CudaError> {
        let host = HostAttnMetadata::check(meta, block_size, num_blocks)?;
        upload_into(stream, &host.query_start_loc, &mut self.query_start_loc)?;
        upload_into(stream, &host.seq_lens, &mut self.seq_lens)?;
        upload_into(stream, &host.seq_rows, &mut self.seq_rows)?;
        let (stride, len) = (meta.max_blocks_per_seq, meta.block_tables.len());
        if stride != self.max_blocks_per_seq || len != self.table_len || self.block_tables.len() < len {
            upload_into(stream, meta.block_tables, &mut self.block_tables)?;
        } else {
            let end = changed_rows.end.saturating_mul(stride).min(len);
            let start = changed_rows.start.saturating_mul(stride).min(end);
            if start < end {
                stream.memcpy_htod(
                    &meta.block_tables[start..end],
                    &mut self.block_tables.slice_mut(start..end),
                )?;
            }
        }
        self.table_len = len;
        self.max_blocks_per_seq = stride;
        self.host = host;
        Ok(())
    }

    pub fn num_tokens(&self) -> usize {
        self.host.num_tokens
    }
    /// Longest context any query token attends to.
    pub fn max_context(&self) -> usize {
        self.host.max_context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_metadata_checks_and_flags_decode_batches() {
        let decode = PagedAttnMetadata {
            query_start_loc: &[0, 1, 2],
            seq_lens: &[5, 17],
            block_tables: &[3, 0, 1, 2],
            max_blocks_per_seq: 2,
            seq_rows: None,
        };
        let h = HostAttnMetadata::check(&decode, 16, 4);
        assert!(h.as_ref().is_ok_and(|h| h.is_decode && h.max_context == 17 && h.seq_rows == [0, 1]));
        // Padding past a sequence's blocks may be anything (u32::MAX is what the GPU check and
        // many callers use): it is never read, so it is never an error.
        let padded = PagedAttnMetadata { block_tables: &[3, u32::MAX, 1, 2], ..decode };
        assert!(HostAttnMetadata::check(&padded, 16, 4).is_ok());
        // Rows of a persistent table: sequence 0 reads row 2, sequence 1 row 0.
        let persistent = PagedAttnMetadata {
            block_tables: &[1, 2, u32::MAX, u32::MAX, 3, 9],
            seq_rows: Some(&[2, 0]),
            ..decode
        };
        assert!(HostAttnMetadata::check(&persistent, 16, 4).is_ok_and(|h| h.seq_rows == [2, 0]));
        assert!(
            HostAttnMetadata::check(&PagedAttnMetadata { seq_rows: Some(&[3, 0]), ..persistent }, 16, 4)
                .is_err()
        );
        let prefill = PagedAttnMetadata { query_start_loc: &[0, 5, 6], ..decode };
        assert!(HostAttnMetadata::check(&prefill, 16, 4).is_ok_and(|h| !h.is_decode && h.num_tokens == 6));
        // Block 3 is out of range in a 3-block cache; a context longer than its table; more
        // query tokens than context.
        assert!(HostAttnMetadata::check(&decode, 16, 3).is_err());
        assert!(HostAttnMetadata::check(&decode, 8, 4).is_err());
        let long_query = PagedAttnMetadata { query_start_loc: &[0, 6, 7], ..decode };
        assert!(HostAttnMetadata::check(&long_query, 16, 4).is_err());
    }
}
