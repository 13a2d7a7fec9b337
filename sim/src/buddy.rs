//! A binary buddy allocator over a linear space of token slots: the placement the PagedAttention
//! paper assumes for its Orca baselines ("We assume Orca uses the buddy allocation algorithm to
//! determine the memory address to store KV cache", §6.1).
//!
//! Every reservation is rounded up to a power of two (internal fragmentation) and carved from the
//! lowest-addressed free block of the smallest sufficient order, splitting larger ones; freed
//! blocks merge with their free buddy (external fragmentation remains when buddies are not both
//! free). A capacity that is not a power of two is covered by its binary decomposition: aligned
//! roots of decreasing size, largest first, none of which merges with another.

use std::collections::BTreeSet;

/// Buddy allocator over `[0, capacity)`.
#[derive(Debug, Clone)]
pub struct Buddy {
    /// `free[k]`: starts of the free blocks of `2^k` slots.
    free: Vec<BTreeSet<usize>>,
    /// `(start, order)` of each root, in address order.
    roots: Vec<(usize, u32)>,
    free_total: usize,
}

impl Buddy {
    pub fn new(capacity: usize) -> Self {
        let orders = (usize::BITS - capacity.leading_zeros()) as usize;
        let mut free = vec![BTreeSet::new(); orders.max(1)];
        let mut roots = Vec::new();
        let mut start = 0;
        for k in (0..orders as u32).rev() {
            if capacity & (1 << k) != 0 {
                // Larger roots come first, so every root starts at a multiple of its size.
                free[k as usize].insert(start);
                roots.push((start, k));
                start += 1 << k;
            }
        }
        Self { free, roots, free_total: capacity }
    }

    /// Slots a request of `len` actually takes: the next power of two.
    pub fn rounded(len: usize) -> usize {
        len.max(1).next_power_of_two()
    }

    /// Start of a block of `rounded(len)` slots, if one is free.
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        let k = Self::rounded(len).trailing_zeros() as usize;
        let j = (k..self.free.len()).find(|&j| !self.free[j].is_empty())?;
        let start = self.free[j].pop_first()?;
        // Split down to order k, keeping the lower half and freeing the upper halves.
        for order in (k..j).rev() {
            self.free[order].insert(start + (1 << order));
        }
        self.free_total -= 1 << k;
        Some(start)
    }

    /// Returns the block at `start` that `alloc(len)` gave, merging it with free buddies.
    pub fn free(&mut self, start: usize, len: usize) {
        let mut k = Self::rounded(len).trailing_zeros() as usize;
        self.free_total += 1 << k;
        let root_at = self.roots.partition_point(|&(s, _)| s <= start).saturating_sub(1);
        let (root_start, root_order) = self.roots.get(root_at).copied().unwrap_or((0, 0));
        let mut block = start;
        while k < root_order as usize {
            let buddy = root_start + ((block - root_start) ^ (1 << k));
            if !self.free[k].remove(&buddy) {
                break;
            }
            block = block.min(buddy);
            k += 1;
        }
        self.free[k].insert(block);
    }

    pub fn free_total(&self) -> usize {
        self.free_total
    }

    /// The largest free block (the largest request that can be placed now).
    pub fn largest_hole(&self) -> usize {
        self.free.iter().rposition(|set| !set.is_empty()).map_or(0, |k| 1 << k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_splits_and_merges() {
        let mut b = Buddy::new(64);
        let x = b.alloc(10).unwrap(); // takes 16
        let y = b.alloc(16).unwrap();
        let z = b.alloc(17).unwrap(); // takes 32
        assert_eq!((x, y, z), (0, 16, 32));
        assert_eq!(b.free_total(), 0);
        assert_eq!(b.alloc(1), None);
        b.free(x, 10);
        // 16 free, but a request of 17 needs a 32-slot block.
        assert_eq!((b.free_total(), b.largest_hole()), (16, 16));
        assert_eq!(b.alloc(17), None);
        b.free(y, 16);
        assert_eq!(b.largest_hole(), 32);
        b.free(z, 17);
        assert_eq!((b.free_total(), b.largest_hole()), (64, 64));
        assert_eq!(b.alloc(64), Some(0));
    }

    #[test]
    fn non_power_of_two_capacity_is_covered_by_aligned_roots() {
        // 15 696 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 16: seven 2048-slot reservations fit.
        let mut b = Buddy::new(15_696);
        assert_eq!(b.free_total(), 15_696);
        let starts: Vec<usize> = (0..7).map_while(|_| b.alloc(2048)).collect();
        assert_eq!(starts.len(), 7);
        assert_eq!(b.alloc(2048), None);
        assert_eq!(b.largest_hole(), 1024);
        for &s in &starts {
            b.free(s, 2048);
        }
        // Roots never merge with each other.
        assert_eq!((b.free_total(), b.largest_hole()), (15_696, 8192));
    }

    #[test]
    fn a_lone_buddy_keeps_its_parent_split() {
        let mut b = Buddy::new(32);
        let a = b.alloc(8).unwrap();
        let c = b.alloc(8).unwrap();
        let d = b.alloc(16).unwrap();
        b.free(a, 8);
        b.free(d, 16);
        // 24 slots free, but `c` pins the lower half: nothing of 32 fits.
        assert_eq!((b.free_total(), b.largest_hole()), (24, 16));
        b.free(c, 8);
        assert_eq!(b.largest_hole(), 32);
    }
}
