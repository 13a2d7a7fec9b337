//! Prefix-cache events: every change of the set of cached block hashes, in order, as vLLM's
//! `BlockStored` / `BlockRemoved` / `AllBlocksCleared` carry it to prefix-aware routers.
//!
//! A subscriber that applies a pool's events in order holds exactly
//! [`BlockPool::cached_block_hashes`]: a hash is stored when it enters the index and removed
//! when it leaves (eviction by allocation, or a reset), never otherwise.

use crate::hash::{BlockHash, index_key};
use crate::{BlockPool, TokenId};

/// A block hash as published: the low 64 bits of the chained 128-bit hash, which is also the
/// prefix index's key (so it names at most one cached block of a pool).
pub type ExternalBlockHash = u64;

/// The external form of a chained block hash.
#[inline]
pub fn external_block_hash(h: BlockHash) -> ExternalBlockHash {
    index_key(h)
}

/// One change of a pool's prefix cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Blocks that entered the cache, consecutive in one sequence: `block_hashes[i]`'s parent is
    /// `block_hashes[i - 1]`, the first one's is `parent_block_hash` (`None`: the sequence's
    /// first block). `token_ids` holds `block_size` ids per block, in order.
    Stored {
        block_hashes: Vec<ExternalBlockHash>,
        parent_block_hash: Option<ExternalBlockHash>,
        token_ids: Vec<TokenId>,
        /// The LoRA adapter the blocks were computed under (set by the caller, see
        /// [`BlockPool::label_cache_events`]).
        lora_id: Option<u32>,
    },
    /// Blocks that left the cache (their slots are being reused).
    Removed { block_hashes: Vec<ExternalBlockHash> },
    /// Every block left the cache at once.
    Cleared,
}

/// The pending events of a pool, merged as they come: a registration that continues the last
/// `Stored` run extends it, consecutive evictions share one `Removed`.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: Vec<CacheEvent>,
}

impl EventLog {
    pub(crate) fn stored(&mut self, hash: BlockHash, parent: Option<BlockHash>, tokens: &[TokenId]) {
        let hash = external_block_hash(hash);
        let parent = parent.map(external_block_hash);
        if let Some(CacheEvent::Stored { block_hashes, token_ids, lora_id: None, .. }) =
            self.events.last_mut()
            && parent.is_some()
            && block_hashes.last().copied() == parent
        {
            block_hashes.push(hash);
            token_ids.extend_from_slice(tokens);
            return;
        }
        self.events.push(CacheEvent::Stored {
            block_hashes: vec![hash],
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            lora_id: None,
        });
    }

    pub(crate) fn removed(&mut self, hash: BlockHash) {
        let hash = external_block_hash(hash);
        if let Some(CacheEvent::Removed { block_hashes }) = self.events.last_mut() {
            block_hashes.push(hash);
        } else {
            self.events.push(CacheEvent::Removed { block_hashes: vec![hash] });
        }
    }

    pub(crate) fn cleared(&mut self) {
        self.events.push(CacheEvent::Cleared);
    }
}

impl BlockPool {
    /// Starts recording [`CacheEvent`]s (no-op without prefix caching: nothing is ever
    /// cached). Take them with [`take_cache_events`](Self::take_cache_events), say once a step.
    pub fn enable_cache_events(&mut self) {
        if let Some(cache) = &mut self.cache {
            cache.events.get_or_insert_with(EventLog::default);
        }
    }

    /// Number of events recorded and not yet taken (a mark for
    /// [`label_cache_events`](Self::label_cache_events)).
    pub fn num_pending_cache_events(&self) -> usize {
        self.cache.as_ref().and_then(|c| c.events.as_ref()).map_or(0, |log| log.events.len())
    }

    /// Sets `lora_id` on the `Stored` events recorded since `mark` (the caller offered blocks
    /// of an adapter's sequence). Later registrations never extend a labelled event.
    pub fn label_cache_events(&mut self, mark: usize, lora_id: u32) {
        let Some(log) = self.cache.as_mut().and_then(|c| c.events.as_mut()) else { return };
        for event in log.events.iter_mut().skip(mark) {
            if let CacheEvent::Stored { lora_id: l, .. } = event {
                *l = Some(lora_id);
            }
        }
    }

    /// Moves the recorded events, oldest first, to the end of `out`.
    pub fn take_cache_events(&mut self, out: &mut Vec<CacheEvent>) {
        if let Some(log) = self.cache.as_mut().and_then(|c| c.events.as_mut()) {
            out.append(&mut log.events);
        }
    }

    /// Every hash in the prefix index, in no particular order: the set a subscriber rebuilds.
    pub fn cached_block_hashes(&self) -> Vec<ExternalBlockHash> {
        self.cache.as_ref().map_or_else(Vec::new, |c| c.index_keys().collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::PoolConfig;

    /// Applies events to a set, as a subscriber does.
    fn apply(set: &mut HashSet<u64>, events: &[CacheEvent]) {
        for e in events {
            match e {
                CacheEvent::Stored { block_hashes, token_ids, .. } => {
                    assert_eq!(token_ids.len(), block_hashes.len() * 2);
                    for h in block_hashes {
                        assert!(set.insert(*h), "stored twice: {h}");
                    }
                }
                CacheEvent::Removed { block_hashes } => {
                    for h in block_hashes {
                        assert!(set.remove(h), "removed but never stored: {h}");
                    }
                }
                CacheEvent::Cleared => set.clear(),
            }
        }
    }

    #[test]
    fn a_subscriber_rebuilds_the_index_through_stores_evictions_and_a_reset() {
        let mut p = BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(6, 2) }).unwrap();
        p.enable_cache_events();
        let mut seen = HashSet::new();
        let mut events = Vec::new();
        for round in 0..5u32 {
            let tokens: Vec<u32> = (0..6).map(|i| i + 3 * round).collect();
            let mut t = p.new_table();
            let hit = p.lookup_prefix(&tokens[..5], 0, &mut t).unwrap();
            t.allocate_slots(&mut p, 6 - hit).unwrap();
            let mark = p.num_pending_cache_events();
            p.cache_full_blocks(&mut t, &tokens, 0).unwrap();
            if round == 3 {
                p.label_cache_events(mark, 7);
            }
            t.free(&mut p).unwrap();
            p.take_cache_events(&mut events);
            apply(&mut seen, &events);
            let mut want = p.cached_block_hashes();
            want.sort_unstable();
            let mut got: Vec<u64> = seen.iter().copied().collect();
            got.sort_unstable();
            assert_eq!(got, want, "round {round}");
            events.clear();
        }
        assert!(p.reset_prefix_cache());
        p.take_cache_events(&mut events);
        assert_eq!(events, [CacheEvent::Cleared]);
    }

    #[test]
    fn one_sequences_new_blocks_make_one_chained_event() {
        let mut p = BlockPool::new(PoolConfig::new(8, 2)).unwrap();
        p.enable_cache_events();
        let mut t = p.new_table();
        t.allocate_slots(&mut p, 6).unwrap();
        p.cache_full_blocks(&mut t, &[1, 2, 3, 4, 5, 6], 0).unwrap();
        let hashes: Vec<u64> = t.block_hashes().iter().map(|&h| external_block_hash(h)).collect();
        let mut events = Vec::new();
        p.take_cache_events(&mut events);
        assert_eq!(
            events,
            [CacheEvent::Stored {
                block_hashes: hashes.clone(),
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4, 5, 6],
                lora_id: None
            }]
        );
        t.allocate_slots(&mut p, 2).unwrap();
        p.cache_full_blocks(&mut t, &[1, 2, 3, 4, 5, 6, 7, 8], 0).unwrap();
        events.clear();
        p.take_cache_events(&mut events);
        let CacheEvent::Stored { parent_block_hash, token_ids, .. } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!((*parent_block_hash, token_ids.as_slice()), (Some(hashes[2]), &[7, 8][..]));
        t.free(&mut p).unwrap();
    }

    #[test]
    fn without_prefix_caching_nothing_is_recorded() {
        let mut p = BlockPool::new(PoolConfig::host(4, 2)).unwrap();
        p.enable_cache_events();
        let mut t = p.new_table();
        t.allocate_slots(&mut p, 4).unwrap();
        p.cache_full_blocks(&mut t, &[1, 2, 3, 4], 0).unwrap();
        assert_eq!(p.num_pending_cache_events(), 0);
        assert!(p.cached_block_hashes().is_empty());
        t.free(&mut p).unwrap();
    }
}
