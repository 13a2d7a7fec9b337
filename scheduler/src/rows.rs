//! Persistent block-table rows: every scheduled sequence's block table lives in a row of the
//! step output's `block_tables` arena, and the row survives from one step to the next, so a
//! decode writes only the block it appended (once per `block_size` tokens) instead of copying
//! its whole table every step — vLLM V1's persistent-batch block table, on the host.
//!
//! Rows are CSR-style ranges with slack for growth. The arena belongs to the output the caller
//! hands `schedule_into`; the scheduler trusts it only when it is the very arena it wrote last
//! (an owner id and a write counter are stamped into the output), otherwise every row is placed
//! afresh. A sequence whose table changes other than by appending (freed, swapped, forked into,
//! copy-on-write) has its row dropped, so a trusted row always matches its table's prefix.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use block_alloc::BlockId;

/// Arena garbage (dead rows, slack of moved rows) tolerated beyond twice the live rows before
/// the arena is rebuilt; keeps small runs from ever compacting.
const COMPACT_SLACK: usize = 4096;
/// Spare entries a freshly placed row gets beyond half its length.
const MIN_ROW_SLACK: usize = 8;

/// Distinct owner ids, so an output written by one scheduler is never trusted by another.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// Where one sequence's table sits in the arena; valid while `epoch` is the book's epoch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Row {
    start: usize,
    len: usize,
    cap: usize,
    epoch: u64,
}

/// Stamp an output carries: which scheduler wrote its arena, and at which write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArenaTag {
    owner: u64,
    write: u64,
}

/// The scheduler's bookkeeping of the arena it writes into.
#[derive(Debug)]
pub(crate) struct RowBook {
    owner: u64,
    writes: u64,
    /// Rows from an older epoch are stale (the arena was cleared since).
    epoch: u64,
    /// Capacity of the rows synced in the current step (the live part of the arena).
    live: usize,
}

impl RowBook {
    pub fn new() -> Self {
        Self { owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed), writes: 0, epoch: 1, live: 0 }
    }

    /// Starts a step's writes into `arena`: keeps it if it is what this book wrote last and
    /// garbage does not dominate it; otherwise clears it (every row is placed again).
    pub fn begin(&mut self, arena: &mut Vec<BlockId>, tag: &mut Option<ArenaTag>) {
        let trusted = *tag == Some(ArenaTag { owner: self.owner, write: self.writes });
        if !trusted || arena.len() > 2 * self.live + COMPACT_SLACK {
            self.epoch += 1;
            arena.clear();
        }
        self.writes += 1;
        *tag = Some(ArenaTag { owner: self.owner, write: self.writes });
        self.live = 0;
    }

    /// Brings `row` up to date with `blocks` (a table that only grew since the row was last
    /// synced, unless `rewrite`) and returns its range in `arena`. Call once per sequence and step.
    #[inline(always)]
    pub fn sync(
        &mut self,
        row: &mut Row,
        blocks: &[BlockId],
        rewrite: bool,
        arena: &mut Vec<BlockId>,
    ) -> Range<usize> {
        if rewrite || row.epoch != self.epoch || row.len > blocks.len() || blocks.len() > row.cap {
            self.place(row, blocks, arena);
        } else if blocks.len() > row.len {
            let (from, to) = (row.start + row.len, row.start + blocks.len());
            arena[from..to].copy_from_slice(&blocks[row.len..]);
            row.len = blocks.len();
        }
        debug_assert_eq!(&arena[row.start..row.start + row.len], blocks, "stale block-table row");
        self.live += row.cap;
        row.start..row.start + row.len
    }

    /// Puts a fresh copy of `blocks`, with room to grow, at the end of the arena.
    #[cold]
    fn place(&self, row: &mut Row, blocks: &[BlockId], arena: &mut Vec<BlockId>) {
        let cap = blocks.len() + blocks.len() / 2 + MIN_ROW_SLACK;
        let start = arena.len();
        arena.extend_from_slice(blocks);
        arena.resize(start + cap, 0);
        *row = Row { start, len: blocks.len(), cap, epoch: self.epoch };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_in_place_then_moves_and_distrusts_foreign_arenas() {
        let mut book = RowBook::new();
        let (mut arena, mut tag) = (Vec::new(), None);
        let mut row = Row::default();
        book.begin(&mut arena, &mut tag);
        let mut blocks: Vec<BlockId> = vec![5, 6];
        let r = book.sync(&mut row, &blocks, false, &mut arena);
        assert_eq!(&arena[r], &[5, 6]);
        let first_start = row.start;

        // Growth within the slack writes only the new entry, in place.
        book.begin(&mut arena, &mut tag);
        blocks.push(7);
        let r = book.sync(&mut row, &blocks, false, &mut arena);
        assert_eq!((r.start, &arena[r.clone()]), (first_start, &[5, 6, 7][..]));

        // Past the slack the row moves to the end.
        book.begin(&mut arena, &mut tag);
        blocks.extend(8..30);
        let r = book.sync(&mut row, &blocks, false, &mut arena);
        assert_ne!(r.start, first_start);
        assert_eq!(&arena[r], blocks.as_slice());

        // A rewrite (copy-on-write of the last block) replaces the row's content.
        book.begin(&mut arena, &mut tag);
        *blocks.last_mut().unwrap() = 99;
        let r = book.sync(&mut row, &blocks, true, &mut arena);
        assert_eq!(&arena[r], blocks.as_slice());

        // An arena this book did not write last (a fresh or older output) is rebuilt.
        let mut other = vec![1; 64];
        let mut other_tag = tag;
        book.begin(&mut arena, &mut tag);
        book.begin(&mut other, &mut other_tag);
        assert!(other.is_empty());
        let r = book.sync(&mut row, &blocks, false, &mut other);
        assert_eq!(&other[r], blocks.as_slice());
        // ...and the first arena is no longer trusted either.
        book.begin(&mut arena, &mut tag);
        assert!(arena.is_empty());
    }

    #[test]
    fn garbage_is_compacted() {
        let mut book = RowBook::new();
        let (mut arena, mut tag) = (Vec::new(), None);
        let blocks: Vec<BlockId> = (0..100).collect();
        for _ in 0..200 {
            // A new row every step (as if sequences kept finishing and arriving).
            book.begin(&mut arena, &mut tag);
            let mut row = Row::default();
            book.sync(&mut row, &blocks, false, &mut arena);
            assert!(arena.len() <= 2 * 158 + COMPACT_SLACK + 158);
        }
    }
}
