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
    pub(crate) num_seqs: usize,
    pub(crate) num_tokens: usize,
    pub(crate) max_context: usize,
    pub(crate) is_decode: bool,
}

/// Host side of [`DeviceAttnMetadata`]: the checked batch as the `i32` arrays the kernels read
/// (the block table itself is uploaded as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAttnMetadata {
    pub query_start_loc: Vec<i32>,
    pub seq_lens: Vec<i32>,
    /// Each sequence's row of the table (`s` itself for a dense table).
    pub seq_rows: Vec<i32>,
    pub num_seqs: usize,
    pub num_tokens: usize,
    pub max_context: usize,
    pub is_decode: bool,
}

impl HostAttnMetadata {
    /// Checks `meta` against a cache of `num_blocks` blocks of `block_size` tokens: the rows
    /// exist, each sequence's table covers its context, and every block id a kernel will read is
    /// in range. Entries past a sequence's blocks are never read, so they may hold anything.
    pub fn check(
        meta: &PagedAttnMetadata<'_>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, CudaError> {
        let num_seqs = meta.seq_lens.len();
        let bad = |m: String| Err(CudaError::InvalidArgument(m));
        if i32::try_from(num_blocks).is_err() {
            return bad(format!("{num_blocks} blocks exceed the kernels' i32 block ids"));
        }
        if meta.query_start_loc.len() != num_seqs + 1 || meta.query_start_loc.first() != Some(&0) {
            return bad(format!("query_start_loc must be {} prefix sums starting at 0", num_seqs + 1));
        }
        crate::meta::check_rows(meta).map_err(|e| CudaError::InvalidArgument(e.to_string()))?;
        let to_i32 =
            |v: usize| i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("{v} exceeds i32")));
        let mut max_context = 0;
        let mut is_decode = true;
        for s in 0..num_seqs {
            let (a, b) = (meta.query_start_loc[s], meta.query_start_loc[s + 1]);
            if b < a {
                return bad(format!("query_start_loc decreases after sequence {s}"));
            }
            let (q, seq_len) = (b - a, meta.seq_lens[s]);
            if q > seq_len {
                return bad(format!("sequence {s}: {q} query tokens but a context of {seq_len}"));
            }
            is_decode &= q == 1;
            if q == 0 {
                continue;
            }
            let needed = seq_len.div_ceil(block_size);
            if needed > meta.max_blocks_per_seq {
                return bad(format!(
                    "sequence {s}: {seq_len} tokens need {needed} blocks, the table has {}",
                    meta.max_blocks_per_seq
                ));
            }
            let row = &meta.block_table(s)[..needed];
            if let Some(b) = row.iter().find(|&&b| b as usize >= num_blocks) {
                return bad(format!("sequence {s}: block {b} out of range ({num_blocks} blocks)"));
            }
            max_context = max_context.max(seq_len);
        }
        Ok(HostAttnMetadata {
            query_start_loc: meta.query_start_loc.iter().map(|&v| to_i32(v)).collect::<Result<_, _>>()?,
            seq_lens: meta.seq_lens.iter().map(|&v| to_i32(v)).collect::<Result<_, _>>()?,
            seq_rows: (0..num_seqs).map(|s| to_i32(meta.row(s))).collect::<Result<_, _>>()?,
            num_seqs,
            num_tokens: meta.num_tokens(),
            max_context,
            is_decode: is_decode && num_seqs > 0,
        })
    }
}

/// `host` as a device buffer; cudarc cannot allocate zero-length buffers portably, so an empty
/// array keeps one element.
pub(crate) fn upload_new<T: cudarc::driver::DeviceRepr + Default + Copy>(
    stream: &Arc<CudaStream>,
    host: &[T],
) -> Result<CudaSlice<T>, CudaError> {
    Ok(if host.is_empty() { stream.clone_htod(&[T::default()][..])? } else { stream.clone_htod(host)? })
}

/// Copies `host` into `dev` when it fits, else replaces `dev` by a buffer of `host`'s size, so a
/// step allocates only when it outgrows every earlier one.
pub(crate) fn upload_into<T: cudarc::driver::DeviceRepr + Default + Copy>(
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
    /// it, block table included.
    pub fn upload(
        stream: &Arc<CudaStream>,
        meta: &PagedAttnMetadata<'_>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, CudaError> {
        let host = HostAttnMetadata::check(meta, block_size, num_blocks)?;
        Ok(DeviceAttnMetadata {
            query_start_loc: upload_new(stream, &host.query_start_loc)?,
            seq_lens: upload_new(stream, &host.seq_lens)?,
            seq_rows: upload_new(stream, &host.seq_rows)?,
            block_tables: upload_new(stream, meta.block_tables)?,
            table_len: meta.block_tables.len(),
            max_blocks_per_seq: meta.max_blocks_per_seq,
            num_seqs: host.num_seqs,
            num_tokens: host.num_tokens,
            max_context: host.max_context,
            is_decode: host.is_decode,
        })
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
        self.num_seqs = host.num_seqs;
        self.num_tokens = host.num_tokens;
        self.max_context = host.max_context;
        self.is_decode = host.is_decode;
        Ok(())
    }

    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    pub fn num_seqs(&self) -> usize {
        self.num_seqs
    }
    /// Longest context any query token attends to.
    pub fn max_context(&self) -> usize {
        self.max_context
    }
    /// Every sequence has exactly one query token.
    pub fn is_decode(&self) -> bool {
        self.is_decode
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
