//! Block-table rows and deltas: the worker keeps one persistent, padded block table (a row per
//! running sequence, `model::runner::BlockTables`), and each step the scheduler sends only what
//! changed — vLLM V1's persistent-batch block table.
//!
//! The scheduler hands out the rows: a sequence gets one when it is first scheduled and keeps it
//! while its group runs; preemption and the group's end give it back. Each sequence remembers how
//! many of its block ids the worker's row already holds (`sent`): a decode that stays in its last
//! block sends nothing, one that opens a block sends that one id, and any change other than an
//! append (freed, swapped, forked into, copy-on-write, prefix lookup) resets `sent` to 0, so the
//! whole row is sent again. A row given back needs no message: its next owner starts at 0.
//! Entries past a sequence's blocks are never read (attention stops at its length), so a row is
//! never cleared.
//!
//! The scheduler assigns the rows, rather than the worker keeping a map from sequence ids as
//! vLLM's input batch does, because a row index in the step plan lets the worker update its table
//! and hand it to the kernels without a lookup per sequence.

/// A sequence with no row.
pub(crate) const NO_ROW: u32 = u32::MAX;

/// One sequence's place in the worker's table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowState {
    /// Its row, or `NO_ROW`.
    pub row: u32,
    /// Leading block ids of its table the worker's row holds.
    pub sent: usize,
}

impl Default for RowState {
    fn default() -> Self {
        Self { row: NO_ROW, sent: 0 }
    }
}

/// The rows handed out, with a free list: a row given back is the next one handed out, so the
/// rows in use stay within the most that were ever running at once.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    free: Vec<u32>,
    next: u32,
    /// Rows in use.
    live: usize,
}

impl Rows {
    /// A row for a sequence that has none.
    pub fn take(&mut self) -> u32 {
        self.live += 1;
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// Gives a sequence's row back (no-op without one).
    pub fn give_back(&mut self, state: &mut RowState) {
        if state.row != NO_ROW {
            self.free.push(state.row);
            self.live -= 1;
        }
        *state = RowState::default();
    }

    /// Rows in use (for tests: every row comes back when the scheduler is idle).
    pub fn live(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_reused_and_counted() {
        let mut rows = Rows::default();
        let mut a = RowState { row: rows.take(), sent: 3 };
        let mut b = RowState { row: rows.take(), sent: 1 };
        assert_eq!((a.row, b.row, rows.live()), (0, 1, 2));
        rows.give_back(&mut a);
        assert_eq!((a.row, a.sent, rows.live()), (NO_ROW, 0, 1));
        rows.give_back(&mut a); // twice is harmless
        assert_eq!(rows.live(), 1);
        assert_eq!(rows.take(), 0);
        rows.give_back(&mut b);
        assert_eq!(rows.take(), 1);
    }
}
