//! The in-memory store of `/v1/responses` (what `previous_response_id` and
//! `GET /v1/responses/{id}` read): each stored response's object and its conversation as chat
//! messages, bounded in count and in bytes, the oldest dropped first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

/// Most responses kept.
pub const MAX_RESPONSES: usize = 1024;
/// Most bytes kept (their JSON's length, objects and conversations together).
pub const MAX_BYTES: usize = 64 << 20;

/// One stored response.
#[derive(Debug)]
pub struct Stored {
    /// The response object as `GET` returns it.
    pub response: Value,
    /// Every turn up to and including this response's output, as chat messages (without the
    /// instructions, which a later call does not inherit).
    pub conversation: Vec<Value>,
    bytes: usize,
}

impl Stored {
    pub fn new(response: Value, conversation: Vec<Value>) -> Self {
        let bytes =
            response.to_string().len() + conversation.iter().map(|m| m.to_string().len()).sum::<usize>();
        Self { response, conversation, bytes }
    }
}

/// The bounded store.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    max_responses: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Arc<Stored>>,
    /// Ids oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

impl Default for Store {
    fn default() -> Self {
        Self::with_bounds(MAX_RESPONSES, MAX_BYTES)
    }
}

impl Store {
    pub fn with_bounds(max_responses: usize, max_bytes: usize) -> Self {
        Self { inner: Mutex::default(), max_responses, max_bytes }
    }

    /// The lock; a panic elsewhere while it was held leaves whole entries, so the data is used.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().by_id.get(id).cloned()
    }

    /// Keeps `stored` under `id` (replacing an entry of that id), then drops the oldest until
    /// both bounds hold; one larger than the byte bound alone is not kept.
    pub fn put(&self, id: String, stored: Stored) {
        if stored.bytes > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        if let Some(old) = inner.by_id.remove(&id) {
            inner.bytes -= old.bytes;
            inner.order.retain(|i| *i != id);
        }
        inner.bytes += stored.bytes;
        inner.by_id.insert(id.clone(), Arc::new(stored));
        inner.order.push_back(id);
        while inner.order.len() > self.max_responses || inner.bytes > self.max_bytes {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.by_id.remove(&oldest) {
                inner.bytes -= gone.bytes;
            }
        }
    }

    /// How many responses are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().order.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_oldest_go_first_under_either_bound() {
        let store = Store::with_bounds(3, 10_000);
        for i in 0..5 {
            store.put(
                format!("r{i}"),
                Stored::new(json!({"id": i}), vec![json!({"role": "user", "content": "x"})]),
            );
        }
        assert_eq!(store.len(), 3);
        assert!(store.get("r1").is_none() && store.get("r2").is_some() && store.get("r4").is_some());

        let one = Stored::new(json!({"text": "a".repeat(400)}), Vec::new()).bytes;
        let store = Store::with_bounds(100, 2 * one + one / 2);
        for i in 0..4 {
            store.put(format!("r{i}"), Stored::new(json!({"text": "a".repeat(400)}), Vec::new()));
        }
        assert_eq!(store.len(), 2);
        assert!(store.get("r2").is_some() && store.get("r3").is_some());
        // Larger than the whole bound: not kept, nothing else dropped.
        store.put("big".into(), Stored::new(json!({"text": "a".repeat(4000)}), Vec::new()));
        assert!(store.get("big").is_none());
        assert_eq!(store.len(), 2);
    }
}
