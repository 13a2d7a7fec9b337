//! Prefix-cache events: every change of the set of cached block hashes, in order, as vLLM's
//! `BlockStored` / `BlockRemoved` / `AllBlocksCleared` carry it to prefix-aware routers.
//!
//! A subscriber that applies a pool's events in order holds exactly
//! [`BlockPool::cached_block_hashes`]: a hash is stored when it enters the index and removed
//! when it leaves (eviction by allocation, or a reset), never otherwise.

use std::collections::HashMap;

use crate::hash::{BlockHash, index_key};
use crate::{BlockId, BlockPool, TokenId};

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
        self.stored_external(hash, parent, tokens);
    }

    fn stored_external(
        &mut self,
        hash: ExternalBlockHash,
        parent: Option<ExternalBlockHash>,
        tokens: &[TokenId],
    ) {
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
        self.removed_external(external_block_hash(hash));
    }

    fn removed_external(&mut self, hash: ExternalBlockHash) {
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

/// What a pool without a prefix cache (a host swap pool) holds by hash: the registered blocks
/// that swaps moved into it, until their slots are taken again (as a device cache's freed
/// blocks stay until evicted). Events follow the set of hashes: a hash that two blocks hold is
/// stored with the first and removed with the last.
#[derive(Debug)]
pub(crate) struct Resident {
    hashes: Vec<Option<ExternalBlockHash>>,
    holders: HashMap<ExternalBlockHash, u32>,
    log: EventLog,
}

impl Resident {
    fn new(num_blocks: usize) -> Self {
        Self { hashes: vec![None; num_blocks], holders: HashMap::new(), log: EventLog::default() }
    }

    /// `b` now holds the block hashed `hash` (chain parent `parent`) with `tokens`.
    pub(crate) fn hold(
        &mut self,
        b: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[TokenId],
    ) {
        let h = external_block_hash(hash);
        if self.hashes[b as usize] == Some(h) {
            // A second table of the group sharing the block: already held.
            return;
        }
        self.forget(b);
        self.hashes[b as usize] = Some(h);
        let n = self.holders.entry(h).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.log.stored(hash, parent, tokens);
        }
    }

    /// `b`'s slot is being reused: its content is gone.
    pub(crate) fn forget(&mut self, b: BlockId) {
        let Some(h) = self.hashes[b as usize].take() else { return };
        if let Some(n) = self.holders.get_mut(&h) {
            *n -= 1;
            if *n == 0 {
                self.holders.remove(&h);
                self.log.removed_external(h);
            }
        }
    }
}

impl BlockPool {
    /// Starts recording [`CacheEvent`]s. Take them with
    /// [`take_cache_events`](Self::take_cache_events), say once a step. A pool without prefix
    /// caching (a host swap pool) records what swaps move into it by hash instead.
    pub fn enable_cache_events(&mut self) {
        match &mut self.cache {
            Some(cache) => drop(cache.events.get_or_insert_with(EventLog::default)),
            None => drop(self.resident.get_or_insert_with(|| Resident::new(self.ref_counts.len()))),
        }
    }

    fn event_log(&mut self) -> Option<&mut EventLog> {
        match (&mut self.cache, &mut self.resident) {
            (Some(cache), _) => cache.events.as_mut(),
            (None, Some(resident)) => Some(&mut resident.log),
            (None, None) => None,
        }
    }

    /// Number of events recorded and not yet taken (a mark for
    /// [`label_cache_events`](Self::label_cache_events)).
    pub fn num_pending_cache_events(&mut self) -> usize {
        self.event_log().map_or(0, |log| log.events.len())
    }

    /// Sets `lora_id` on the `Stored` events recorded since `mark` (the caller offered blocks
    /// of an adapter's sequence). Later registrations never extend a labelled event.
    pub fn label_cache_events(&mut self, mark: usize, lora_id: u32) {
        let Some(log) = self.event_log() else { return };
        for event in log.events.iter_mut().skip(mark) {
            if let CacheEvent::Stored { lora_id: l, .. } = event {
                *l = Some(lora_id);
            }
        }
    }

    /// Moves the recorded events, oldest first, to the end of `out`.
    pub fn take_cache_events(&mut self, out: &mut Vec<CacheEvent>) {
        if let Some(log) = self.event_log() {
            out.append(&mut log.events);
        }
    }

    /// Every hash the pool holds, in no particular order: the set a subscriber rebuilds (the
    /// prefix index; for a pool without one, what swaps moved in, once events are enabled).
    pub fn cached_block_hashes(&self) -> Vec<ExternalBlockHash> {
        match (&self.cache, &self.resident) {
            (Some(cache), _) => cache.index_keys().collect(),
            (None, Some(resident)) => resident.holders.keys().copied().collect(),
            (None, None) => Vec::new(),
        }
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
    fn a_host_pool_records_the_registered_blocks_swaps_move_in_until_their_slots_are_reused() {
        let mut device = BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(8, 2) }).unwrap();
        let mut host = BlockPool::new(PoolConfig::host(3, 2)).unwrap();
        host.enable_cache_events();
        let mut t = device.new_table();
        t.allocate_slots(&mut device, 5).unwrap();
        device.cache_full_blocks(&mut t, &[1, 2, 3, 4, 5], 0).unwrap();
        let hashes: Vec<u64> = t.block_hashes().iter().map(|&h| external_block_hash(h)).collect();
        // Nothing lands by allocation alone.
        assert_eq!(host.num_pending_cache_events(), 0);
        crate::swap_out(&mut device, &mut host, &mut [&mut t]).unwrap();
        let mut events = Vec::new();
        host.take_cache_events(&mut events);
        // Two full registered blocks (the third holds one token): one chained run.
        let want = CacheEvent::Stored {
            block_hashes: hashes.clone(),
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            lora_id: None,
        };
        assert_eq!(events, [want]);
        let mut held = host.cached_block_hashes();
        held.sort_unstable();
        let mut want_held = hashes.clone();
        want_held.sort_unstable();
        assert_eq!(held, want_held);
        crate::swap_in(&mut host, &mut device, &mut [&mut t]).unwrap();
        // Freed host blocks keep their content until reused: reuse removes them.
        let taken: Vec<_> = (0..3).map(|_| host.allocate().unwrap()).collect();
        events.clear();
        host.take_cache_events(&mut events);
        assert_eq!(events.len(), 1, "{events:?}");
        let CacheEvent::Removed { block_hashes } = &events[0] else { panic!("{events:?}") };
        let mut removed = block_hashes.clone();
        removed.sort_unstable();
        assert_eq!(removed, want_held);
        assert!(host.cached_block_hashes().is_empty());
        for b in taken {
            host.free(b).unwrap();
        }
        t.free(&mut device).unwrap();
    }

    #[test]
    fn tables_sharing_blocks_swap_out_as_one_stored_run() {
        let mut device = BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(8, 2) }).unwrap();
        let mut host = BlockPool::new(PoolConfig::host(4, 2)).unwrap();
        host.enable_cache_events();
        let mut a = device.new_table();
        a.allocate_slots(&mut device, 4).unwrap();
        device.cache_full_blocks(&mut a, &[1, 2, 3, 4], 0).unwrap();
        let mut b = a.fork(&mut device).unwrap();
        device.cache_full_blocks(&mut b, &[1, 2, 3, 4], 0).unwrap();
        let hashes: Vec<u64> = a.block_hashes().iter().map(|&h| external_block_hash(h)).collect();
        crate::swap_out(&mut device, &mut host, &mut [&mut a, &mut b]).unwrap();
        let mut events = Vec::new();
        host.take_cache_events(&mut events);
        let want = CacheEvent::Stored {
            block_hashes: hashes,
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            lora_id: None,
        };
        assert_eq!(events, [want]);
        crate::swap_in(&mut host, &mut device, &mut [&mut a, &mut b]).unwrap();
        a.free(&mut device).unwrap();
        b.free(&mut device).unwrap();
    }
}
