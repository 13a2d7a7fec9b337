//! Content hashes of full blocks and the hash map that indexes them.
//!
//! A block's hash chains its parent's hash, the request's salt and the block's token ids
//! through seeded 128-bit XXH3, so equal hashes mean "same prefix" with overwhelming
//! probability. The pool never trusts that alone: a hit also compares the stored token ids and
//! salt of the cached block with the query's, so different tokens can never hit.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::TokenId;

/// Chained content hash of a full block (parent hash, salt, token ids).
pub type BlockHash = u128;

/// The "parent hash" of a sequence's first block.
pub(crate) const ROOT_HASH: BlockHash = 0;

/// Computes chained block hashes with a per-pool random seed, so hash values (and thus
/// collisions) cannot be predicted from outside the process.
#[derive(Debug, Clone)]
pub(crate) struct ChainHasher {
    seed: u64,
}

impl ChainHasher {
    pub(crate) fn new() -> Self {
        Self { seed: std::hash::RandomState::new().hash_one(0x6b76_5f62_6c6f_636b_u64) }
    }

    /// Hash of a full block whose predecessor hashed to `parent`:
    /// `XXH3-128(parent ‖ XXH3-128(tokens) ‖ salt)`, both seeded per pool.
    ///
    /// The tokens are hashed in place and the 40-byte outer input is built from whole words:
    /// copying the tokens into one byte buffer first cost twice as much (a scalar copy loop,
    /// and 8-byte loads that missed store-to-load forwarding).
    #[inline]
    pub(crate) fn chain(&self, parent: BlockHash, salt: u64, tokens: &[TokenId]) -> BlockHash {
        let content = xxh3_128_with_seed(bytemuck::cast_slice(tokens), self.seed);
        let words = [parent as u64, (parent >> 64) as u64, content as u64, (content >> 64) as u64, salt];
        xxh3_128_with_seed(bytemuck::bytes_of(&words), self.seed)
    }
}

/// `Hasher` for keys that already are uniformly distributed hashes: folds them, no mixing.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for key types other than `u128`; fold 8 bytes at a time.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }
}

/// Key of the hash index: the low 64 bits of a [`BlockHash`]. Halving the key keeps index
/// entries at 16 bytes (fewer cache misses per probe); a hit still compares the full 128-bit
/// hash, salt and tokens stored with the block.
pub(crate) type IndexKey = u64;

#[inline]
pub(crate) fn index_key(h: BlockHash) -> IndexKey {
    h as u64
}

/// Index key → cached block map with the pass-through hasher.
pub(crate) type HashIndex<V> = HashMap<IndexKey, V, BuildHasherDefault<PassThroughHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_salt_and_every_token() {
        let h = ChainHasher::new();
        let base = h.chain(ROOT_HASH, 7, &[1, 2, 3, 4]);
        assert_eq!(base, h.chain(ROOT_HASH, 7, &[1, 2, 3, 4]));
        assert_ne!(base, h.chain(1, 7, &[1, 2, 3, 4]));
        assert_ne!(base, h.chain(ROOT_HASH, 8, &[1, 2, 3, 4]));
        for i in 0..4 {
            let mut t = [1, 2, 3, 4];
            t[i] += 1;
            assert_ne!(base, h.chain(ROOT_HASH, 7, &t));
        }
    }

    #[test]
    fn pass_through_keeps_the_key() {
        let mut a = PassThroughHasher::default();
        a.write_u64(0x1234);
        assert_eq!(a.finish(), 0x1234);
        assert_eq!(index_key(0x5_0000_0000_0000_0007), 7);
    }
}
