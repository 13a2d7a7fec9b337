//! [`BlockState`] and [`BlockPool::block_states_into`]: one byte per block saying whether it is
//! free, cached-and-evictable, owned or shared — the per-block half of a live KV map.

use crate::BlockPool;

/// The state of one physical block, as one printable ASCII byte (so a state array is already a
/// compact string: `"..ccoos."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockState {
    /// Ref count 0 and not in the prefix cache: its content is garbage.
    Free = b'.',
    /// Ref count 0 but registered in the prefix cache: findable by a prefix hit until an
    /// allocation evicts it (least recently freed first).
    Cached = b'c',
    /// Held by exactly one holder (ref count 1).
    Owned = b'o',
    /// Held by more than one holder (ref count > 1): a prefix hit on a held block, or the
    /// prompt blocks of forked `n > 1` samples.
    Shared = b's',
}

impl BlockState {
    /// The byte this state is written as.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The state a byte written by [`BlockPool::block_states_into`] stands for.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            b'.' => Some(Self::Free),
            b'c' => Some(Self::Cached),
            b'o' => Some(Self::Owned),
            b's' => Some(Self::Shared),
            _ => None,
        }
    }

    /// The byte of a block with `ref_count` holders, `cached` telling whether the prefix cache
    /// holds it. Selects rather than branches, so the pool-wide loop over it vectorizes.
    #[inline]
    fn code_of(ref_count: u32, cached: bool) -> u8 {
        let free = if cached { Self::Cached.code() } else { Self::Free.code() };
        let held = if ref_count == 1 { Self::Owned.code() } else { Self::Shared.code() };
        if ref_count == 0 { free } else { held }
    }
}

impl BlockPool {
    /// Replaces `out` with one [`BlockState`] byte per block, block id order. O(blocks), reads
    /// only the ref counts and the prefix cache's per-block flags; allocates only if `out` is
    /// shorter than the pool (pass the same buffer again to allocate nothing).
    pub fn block_states_into(&self, out: &mut Vec<u8>) {
        out.clear();
        out.resize(self.ref_counts.len(), 0);
        // Over equal-length slices (no bounds checks), so the loop vectorizes.
        let code = BlockState::code_of;
        match &self.cache {
            Some(cache) => {
                for ((o, &rc), &cached) in out.iter_mut().zip(&self.ref_counts).zip(&cache.cached) {
                    *o = code(rc, cached);
                }
            }
            None => {
                for (o, &rc) in out.iter_mut().zip(&self.ref_counts) {
                    *o = code(rc, false);
                }
            }
        }
    }

    /// The state of block `b` (`None` for unknown ids).
    pub fn block_state(&self, b: crate::BlockId) -> Option<BlockState> {
        let rc = *self.ref_counts.get(b as usize)?;
        BlockState::from_code(BlockState::code_of(rc, self.is_cached(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PoolConfig, swap_in, swap_out};

    fn states(p: &BlockPool) -> String {
        let mut out = Vec::new();
        p.block_states_into(&mut out);
        assert_eq!(out.len(), p.num_blocks());
        for (b, &code) in out.iter().enumerate() {
            assert_eq!(BlockState::from_code(code), p.block_state(b as u32), "block {b}");
        }
        String::from_utf8(out).unwrap()
    }

    fn pool(blocks: usize) -> BlockPool {
        BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(blocks, 2) }).unwrap()
    }

    #[test]
    fn codes_round_trip_and_are_printable() {
        for s in [BlockState::Free, BlockState::Cached, BlockState::Owned, BlockState::Shared] {
            assert_eq!(BlockState::from_code(s.code()), Some(s));
            assert!(s.code().is_ascii_graphic());
        }
        assert_eq!(BlockState::from_code(b'x'), None);
    }

    #[test]
    fn free_cached_owned_shared_and_swapped_blocks_give_exactly_their_bytes() {
        let mut device = pool(10);
        let mut host = BlockPool::new(PoolConfig::host(4, 2)).unwrap();
        assert_eq!(states(&device), "..........");

        // a: 2 full blocks (0, 1), registered, then freed -> cached.
        let a_tokens = [1, 2, 3, 4];
        let mut a = device.new_table();
        a.allocate_slots(&mut device, 4).unwrap();
        device.cache_full_blocks(&mut a, &a_tokens, 0).unwrap();
        // b: 3 blocks (2, 3, 4), owned.
        let mut b = device.new_table();
        b.allocate_slots(&mut device, 5).unwrap();
        // c: block 5, forked into d -> shared.
        let mut c = device.new_table();
        c.allocate_slots(&mut device, 2).unwrap();
        let d = c.fork(&mut device).unwrap();
        // e: block 6, swapped out to the host (device block becomes free, host block owned).
        let mut e = device.new_table();
        e.allocate_slots(&mut device, 1).unwrap();
        assert_eq!(states(&device), "oooooso...");
        a.free(&mut device).unwrap();
        let plan = swap_out(&mut device, &mut host, &mut [&mut e]).unwrap();
        assert_eq!(plan, [(6, 0)]);
        assert_eq!(states(&device), "ccooos....");
        assert_eq!(states(&host), "o...");

        // A prefix hit on the cached blocks takes them back (owned), a second one shares them.
        let mut hit = device.new_table();
        assert_eq!(device.lookup_prefix(&a_tokens, 0, &mut hit), Ok(4));
        assert_eq!(states(&device), "ooooos....");
        let mut hit2 = device.new_table();
        assert_eq!(device.lookup_prefix(&a_tokens, 0, &mut hit2), Ok(4));
        assert_eq!(states(&device), "ssooos....");

        // Swap back in, then finish everything: registered blocks stay cached, the rest free.
        let plan = swap_in(&mut host, &mut device, &mut [&mut e]).unwrap();
        assert_eq!(plan, [(0, 7)], "the free queue's head: 6 went back behind 7, 8, 9");
        assert_eq!(states(&host), "....");
        assert_eq!(states(&device), "ssooos.o..");
        for mut t in [hit, hit2, b, c, d, e] {
            t.free(&mut device).unwrap();
        }
        assert_eq!(states(&device), "cc........");
        device.assert_consistent();
    }

    #[test]
    fn a_pool_without_prefix_caching_never_reports_cached() {
        let mut p =
            BlockPool::new(PoolConfig { enable_prefix_caching: false, ..PoolConfig::new(3, 2) }).unwrap();
        let mut t = p.new_table();
        t.allocate_slots(&mut p, 4).unwrap();
        p.cache_full_blocks(&mut t, &[1, 2, 3, 4], 0).unwrap();
        t.free(&mut p).unwrap();
        assert_eq!(states(&p), "...");
    }
}
