//! Ordered queues of request groups (waiting, running, swapped), keyed by policy.
//!
//! A key is `(priority, arrival)`; under FCFS the priority part is always 0, so the order is
//! arrival order. Lower keys are served first and preempted last. Queues stay sorted so the
//! head is the next to serve and the tail the first to preempt.

use std::collections::VecDeque;

/// Serving order of a request group: lower first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QueueKey {
    pub priority: i64,
    pub arrival: u64,
}

/// A queue entry: the group's key and its slot in the scheduler's slab.
pub(crate) type Entry = (QueueKey, usize);

/// A sorted queue: head = next to serve, tail = first to preempt.
pub(crate) type Queue = VecDeque<Entry>;

/// Inserts keeping `queue` sorted by key; appends in O(1) when the key is the largest (the usual
/// case: new arrivals).
pub(crate) fn insert_sorted(queue: &mut Queue, entry: Entry) {
    if queue.back().is_none_or(|last| last.0 <= entry.0) {
        queue.push_back(entry);
    } else {
        let at = queue.partition_point(|e| e.0 <= entry.0);
        queue.insert(at, entry);
    }
}

/// Removes the entry of slab slot `slot`, if present.
pub(crate) fn remove_slot(queue: &mut Queue, slot: usize) -> bool {
    match queue.iter().position(|e| e.1 == slot) {
        Some(i) => {
            queue.remove(i);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(priority: i64, arrival: u64) -> QueueKey {
        QueueKey { priority, arrival }
    }

    #[test]
    fn stays_sorted_and_removes_by_slot() {
        let mut q = Queue::new();
        insert_sorted(&mut q, (key(0, 3), 3));
        insert_sorted(&mut q, (key(0, 5), 5));
        insert_sorted(&mut q, (key(0, 1), 1));
        insert_sorted(&mut q, (key(-1, 9), 9));
        let slots: Vec<usize> = q.iter().map(|e| e.1).collect();
        assert_eq!(slots, vec![9, 1, 3, 5]);
        assert!(remove_slot(&mut q, 3));
        assert!(!remove_slot(&mut q, 3));
        assert_eq!(q.len(), 3);
    }
}
