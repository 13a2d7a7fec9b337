//! `BlockTables`: the one block table of the engine — persistent, padded, a row per running
//! sequence, updated in place by the scheduler's deltas and handed to the attention kernels as
//! it is (`PagedAttnMetadata` with `seq_rows`).

use std::ops::Range;

use attn_kernels::PagedAttnMetadata;

use crate::error::{ModelError, Result};

/// Rows of `stride` block ids. Row `r` holds the block table of the sequence the scheduler gave
/// row `r`; entries past its blocks are stale (never read: attention stops at the sequence's
/// length). Rows are added as the scheduler hands out higher ones and never shrink.
#[derive(Debug, Clone)]
pub struct BlockTables {
    entries: Vec<u32>,
    stride: usize,
    /// Rows written since the last `take_changed` (empty: none).
    changed: Range<usize>,
}

impl BlockTables {
    /// An empty table whose rows hold `stride` blocks (the longest sequence's table:
    /// `ceil(max_model_len / block_size)`).
    pub fn new(stride: usize) -> Self {
        Self { entries: Vec::new(), stride: stride.max(1), changed: 0..0 }
    }

    pub fn num_rows(&self) -> usize {
        self.entries.len() / self.stride
    }

    /// Row `row`'s entries (all `stride` of them).
    pub fn row(&self, row: usize) -> Option<&[u32]> {
        self.entries.get(row * self.stride..(row + 1) * self.stride)
    }

    /// Writes `ids` into row `row` from entry `from` on (a scheduler delta); adds rows as needed.
    pub fn write(&mut self, row: u32, from: usize, ids: &[u32]) -> Result<()> {
        let row = row as usize;
        let end = from.checked_add(ids.len()).filter(|&e| e <= self.stride).ok_or_else(|| {
            ModelError::InvalidInput(format!(
                "block-table row {row}: entries {from}..+{} exceed the row of {} blocks",
                ids.len(),
                self.stride
            ))
        })?;
        let row_end = row
            .checked_add(1)
            .and_then(|r| r.checked_mul(self.stride))
            .ok_or_else(|| ModelError::InvalidInput(format!("block-table row {row} is out of range")))?;
        if self.entries.len() < row_end {
            self.entries.resize(row_end, 0);
        }
        if !ids.is_empty() {
            self.entries[row * self.stride + from..row * self.stride + end].copy_from_slice(ids);
            self.changed = if self.changed.is_empty() {
                row..row + 1
            } else {
                self.changed.start.min(row)..self.changed.end.max(row + 1)
            };
        }
        Ok(())
    }

    /// Every row's entries, row after row.
    pub fn entries(&self) -> &[u32] {
        &self.entries
    }

    /// The rows written since the last call (a device keeping its own copy uploads those).
    pub fn take_changed(&mut self) -> Range<usize> {
        std::mem::replace(&mut self.changed, 0..0)
    }

    /// The attention metadata of a batch whose sequence `s` reads row `seq_rows[s]`.
    pub fn metadata<'a>(
        &'a self,
        query_start_loc: &'a [usize],
        seq_lens: &'a [usize],
        seq_rows: &'a [u32],
    ) -> PagedAttnMetadata<'a> {
        PagedAttnMetadata {
            query_start_loc,
            seq_lens,
            block_tables: &self.entries,
            max_blocks_per_seq: self.stride,
            seq_rows: Some(seq_rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_update_rows_in_place_and_report_what_changed() -> Result<()> {
        let mut t = BlockTables::new(4);
        t.write(2, 0, &[7, 8])?;
        assert_eq!((t.num_rows(), t.row(2)), (3, Some(&[7, 8, 0, 0][..])));
        assert_eq!(t.take_changed(), 2..3);
        assert_eq!(t.take_changed(), 0..0);
        // An append writes only the new entry; a rewrite from 0 replaces the row's head.
        t.write(2, 2, &[9])?;
        t.write(0, 0, &[1])?;
        assert_eq!(t.row(2), Some(&[7, 8, 9, 0][..]));
        assert_eq!(t.take_changed(), 0..3);
        t.write(2, 0, &[5])?;
        assert_eq!(t.row(2), Some(&[5, 8, 9, 0][..]));
        // Nothing to write changes nothing.
        t.take_changed();
        t.write(1, 3, &[])?;
        assert_eq!(t.take_changed(), 0..0);
        // Past the row's end, or a row whose offset overflows: a typed error.
        assert!(t.write(0, 3, &[1, 2]).is_err());
        assert!(t.write(0, usize::MAX, &[1]).is_err());
        let meta = t.metadata(&[0, 1], &[40], &[2]);
        assert_eq!((meta.row(0), meta.max_blocks_per_seq), (2, 4));
        Ok(())
    }
}
