//! The free queue: an intrusive doubly-linked list threaded through per-block links that are
//! preallocated with the pool. Pop-front, push-back and remove-from-the-middle are O(1) and
//! never allocate.
//!
//! Its order is also the eviction order of cached blocks: the head is the least recently
//! freed block, so allocation takes (and evicts) it first; a prefix hit on a free block
//! pulls that block out of the middle.

use crate::BlockId;

/// "No block": the end of the list, or the links of a block that is not in it.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

/// Doubly-linked list of block ids in `0..capacity`; each id is in it at most once.
/// Membership is tracked by the pool (a block is queued exactly when its ref count is 0),
/// so the list itself trusts its callers; debug builds check.
#[derive(Debug, Clone)]
pub(crate) struct FreeQueue {
    links: Vec<Link>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..capacity` in ascending order. `capacity < u32::MAX`.
    pub(crate) fn full(capacity: usize) -> Self {
        debug_assert!(capacity < NIL as usize);
        let n = capacity as u32;
        let links = (0..n)
            .map(|i| Link {
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
            })
            .collect();
        let (head, tail) = if n == 0 { (NIL, NIL) } else { (0, n - 1) };
        Self { links, head, tail, len: capacity }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Takes the least recently freed block.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<BlockId> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.remove(b);
        Some(b)
    }

    /// Appends `b` as the most recently freed block. `b` must not be queued.
    #[inline]
    pub(crate) fn push_back(&mut self, b: BlockId) {
        debug_assert!(!self.is_queued(b), "block {b} queued twice");
        let tail = self.tail;
        self.links[b as usize] = Link { prev: tail, next: NIL };
        if tail == NIL {
            self.head = b;
        } else {
            self.links[tail as usize].next = b;
        }
        self.tail = b;
        self.len += 1;
    }

    /// Unlinks `b` from wherever it is. `b` must be queued.
    #[inline]
    pub(crate) fn remove(&mut self, b: BlockId) {
        debug_assert!(self.is_queued(b), "block {b} is not queued");
        let Link { prev, next } = self.links[b as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[b as usize] = Link { prev: NIL, next: NIL };
        self.len -= 1;
    }

    /// Whether `b` is linked in (O(1); used by debug checks and tests).
    pub(crate) fn is_queued(&self, b: BlockId) -> bool {
        let l = self.links[b as usize];
        l.prev != NIL || l.next != NIL || self.head == b
    }

    /// Blocks from head (next to be allocated / evicted) to tail.
    pub(crate) fn iter(&self) -> FreeQueueIter<'_> {
        FreeQueueIter { queue: self, at: self.head }
    }
}

/// Iterator over the free queue from head (next to be allocated) to tail; see [`BlockPool::free_blocks`](crate::BlockPool::free_blocks).
#[derive(Debug, Clone)]
pub struct FreeQueueIter<'a> {
    queue: &'a FreeQueue,
    at: u32,
}

impl Iterator for FreeQueueIter<'_> {
    type Item = BlockId;

    fn next(&mut self) -> Option<BlockId> {
        if self.at == NIL {
            return None;
        }
        let b = self.at;
        self.at = self.queue.links[b as usize].next;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(q: &FreeQueue) -> Vec<BlockId> {
        q.iter().collect()
    }

    #[test]
    fn starts_full_in_ascending_order() {
        let q = FreeQueue::full(4);
        assert_eq!(order(&q), [0, 1, 2, 3]);
        assert_eq!(q.len(), 4);
        assert!(FreeQueue::full(0).iter().next().is_none());
    }

    #[test]
    fn pop_front_push_back_and_remove_keep_order() {
        let mut q = FreeQueue::full(5);
        assert_eq!(q.pop_front(), Some(0));
        assert_eq!(q.pop_front(), Some(1));
        q.remove(3); // middle
        assert_eq!(order(&q), [2, 4]);
        q.push_back(1);
        q.push_back(0);
        q.push_back(3);
        assert_eq!(order(&q), [2, 4, 1, 0, 3]);
        q.remove(2); // head
        q.remove(3); // tail
        assert_eq!(order(&q), [4, 1, 0]);
        assert_eq!(q.len(), 3);
        assert!(!q.is_queued(2) && !q.is_queued(3) && q.is_queued(4));
        assert_eq!(q.pop_front(), Some(4));
        assert_eq!(q.pop_front(), Some(1));
        assert_eq!(q.pop_front(), Some(0));
        assert_eq!(q.pop_front(), None);
        assert_eq!(q.len(), 0);
        q.push_back(2);
        assert_eq!(order(&q), [2]);
        assert!(q.is_queued(2));
    }
}
