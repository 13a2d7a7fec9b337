//! Exact-order tests: which block ids come out of the free queue, in which order freed blocks
//! go back, and which cached blocks eviction takes first (in the spirit of vLLM's
//! `test_prefix_caching.py`).

use block_alloc::{AllocStatus, BlockId, BlockTable, CopyOnWrite, PoolConfig, PrefixProbe, TokenId};

use crate::support::{cached_table, free_all, pool, tokens};

fn free_order(pool: &block_alloc::BlockPool) -> Vec<BlockId> {
    pool.free_blocks().collect()
}

/// Three full blocks of 16 (block `i` all `i`), then `tail`.
fn common_plus(tail: &[TokenId]) -> Vec<TokenId> {
    let mut t: Vec<TokenId> = (0..3).flat_map(|i| [i; 16]).collect();
    t.extend_from_slice(tail);
    t
}

#[test]
fn fresh_pool_hands_out_ascending_ids_and_free_returns_tail_first() {
    let mut p = pool(6, 4);
    assert_eq!(free_order(&p), [0, 1, 2, 3, 4, 5]);
    let mut t = p.new_table();
    assert_eq!(t.allocate_slots(&mut p, 10), Ok(None));
    assert_eq!(t.blocks(), [0, 1, 2]);
    assert_eq!(free_order(&p), [3, 4, 5]);
    t.free(&mut p).unwrap();
    assert_eq!(free_order(&p), [3, 4, 5, 2, 1, 0]);
    assert!(t.is_empty() && t.num_tokens() == 0);
    // Raw allocate/free follow the same queue.
    assert_eq!(p.allocate(), Ok(3));
    assert_eq!(p.allocate(), Ok(4));
    p.free(3).unwrap();
    assert_eq!(free_order(&p), [5, 2, 1, 0, 3]);
    p.free(4).unwrap();
    assert_eq!(p.num_free(), 6);
}

#[test]
fn prefill_hits_shared_prefix_and_eviction_follows_lru_order() {
    let mut p = pool(10, 16);

    // req0: 3 full common blocks + 7 unique tokens: a full miss.
    let req0 = common_plus(&[3; 7]);
    let mut t0 = p.new_table();
    assert_eq!(p.lookup_prefix(&req0, 0, &mut t0), Ok(0));
    t0.allocate_slots(&mut p, req0.len()).unwrap();
    assert_eq!(t0.blocks(), [0, 1, 2, 3]);
    p.cache_full_blocks(&mut t0, &req0, 0).unwrap();
    assert_eq!(p.num_cached_blocks(), 3);
    for b in 0..3 {
        assert_eq!(p.cached_tokens(b), Some(&[b; 16][..]));
    }
    assert!(!p.is_cached(3), "partial blocks are never cached");
    assert_eq!(t0.block_hashes().len(), 3);

    // req1: same 3 blocks + 5 other tokens: 48 tokens hit, blocks shared.
    let req1 = common_plus(&[4; 5]);
    let mut t1 = p.new_table();
    assert_eq!(p.lookup_prefix(&req1, 0, &mut t1), Ok(48));
    assert_eq!(t1.blocks(), [0, 1, 2]);
    assert_eq!(t1.block_hashes(), t0.block_hashes());
    assert_eq!(t1.allocate_slots(&mut p, 5), Ok(None));
    assert_eq!(t1.blocks(), [0, 1, 2, 4]);
    for b in 0..3 {
        assert_eq!(p.ref_count(b), Ok(2));
    }
    let s = p.prefix_stats();
    assert_eq!(
        (s.lookups, s.queried_tokens, s.hit_tokens, s.queried_blocks, s.hit_blocks),
        (2, 108, 48, 6, 3)
    );

    // Free req0 then req1, each tail-first; shared blocks go back only with their last holder.
    t0.free(&mut p).unwrap();
    assert_eq!(free_order(&p), [5, 6, 7, 8, 9, 3]);
    t1.free(&mut p).unwrap();
    assert_eq!(free_order(&p), [5, 6, 7, 8, 9, 3, 4, 2, 1, 0]);
    assert_eq!(p.num_cached_blocks(), 3, "freed blocks stay cached");

    // A request of 8 fresh blocks takes the uncached blocks first, then evicts block 2 (the
    // chain end of the cached prefix) before its parents.
    let mut t2 = p.new_table();
    let req2 = tokens(1000, 8 * 16);
    assert_eq!(p.lookup_prefix(&req2, 0, &mut t2), Ok(0));
    t2.allocate_slots(&mut p, req2.len()).unwrap();
    assert_eq!(t2.blocks(), [5, 6, 7, 8, 9, 3, 4, 2]);
    assert_eq!(free_order(&p), [1, 0]);
    assert!(!p.is_cached(2) && p.is_cached(1) && p.is_cached(0));

    // The common prefix now hits two blocks, pulling them out of the free queue.
    let mut t3 = p.new_table();
    assert_eq!(p.lookup_prefix(&req0, 0, &mut t3), Ok(32));
    assert_eq!(t3.blocks(), [0, 1]);
    assert_eq!(p.num_free(), 0);
    assert_eq!(p.can_allocate(1), AllocStatus::Later);
    t3.free(&mut p).unwrap();
    t2.free(&mut p).unwrap();
    assert_eq!(free_order(&p), [1, 0, 2, 4, 3, 9, 8, 7, 6, 5]);
}

#[test]
fn hit_pulls_a_free_block_out_of_the_middle_of_the_queue() {
    let mut p = pool(8, 2);
    let prompt = tokens(0, 6);
    let mut t = cached_table(&mut p, &prompt, 0);
    t.free(&mut p).unwrap();
    assert_eq!(free_order(&p), [3, 4, 5, 6, 7, 2, 1, 0]);

    let probe = PrefixProbe { cached_tokens: 4, free_hit_blocks: 2 };
    assert_eq!(p.probe_prefix(&prompt[..5], 0), probe);
    assert_eq!(free_order(&p), [3, 4, 5, 6, 7, 2, 1, 0], "a probe takes nothing");
    let mut u = p.new_table();
    assert_eq!(p.lookup_prefix(&prompt[..4], 0, &mut u), Ok(4));
    assert_eq!(u.blocks(), [0, 1]);
    assert_eq!(free_order(&p), [3, 4, 5, 6, 7, 2]);
    u.free(&mut p).unwrap();
    // Freed again: they are now the most recently freed, tail-first.
    assert_eq!(free_order(&p), [3, 4, 5, 6, 7, 2, 1, 0]);
}

#[test]
fn least_recently_freed_sequence_is_evicted_first() {
    let mut p = pool(4, 2);
    let (a, b) = (tokens(10, 4), tokens(20, 4));
    let mut ta = cached_table(&mut p, &a, 0);
    let mut tb = cached_table(&mut p, &b, 0);
    tb.free(&mut p).unwrap(); // b freed first: its blocks are older
    ta.free(&mut p).unwrap();
    assert_eq!(free_order(&p), [3, 2, 1, 0]);

    let x = p.allocate().unwrap();
    assert_eq!(x, 3);
    // b's chain end is gone, so b hits nothing beyond its first block; a is intact.
    let mut probe = p.new_table();
    assert_eq!(p.lookup_prefix(&b, 0, &mut probe), Ok(2));
    probe.free(&mut p).unwrap();
    assert_eq!(p.lookup_prefix(&a, 0, &mut probe), Ok(4));
    probe.free(&mut p).unwrap();
    p.free(x).unwrap();
}

#[test]
fn salt_keeps_tenants_apart_and_hits_need_equal_tokens_and_parents() {
    let mut p = pool(16, 2);
    let prompt = [1, 2, 3, 4, 5, 6];
    let mut t = cached_table(&mut p, &prompt, 7);
    let mut q = p.new_table();
    assert_eq!(p.lookup_prefix(&prompt, 8, &mut q), Ok(0), "other salt");
    assert_eq!(p.lookup_prefix(&[1, 2, 3, 9, 5, 6], 7, &mut q), Ok(2), "stops at the first differing block");
    q.free(&mut p).unwrap();
    assert_eq!(p.lookup_prefix(&[9, 2, 3, 4, 5, 6], 7, &mut q), Ok(0), "same later blocks, other parent");
    assert_eq!(p.lookup_prefix(&prompt[..5], 7, &mut q), Ok(4), "only full blocks count");
    q.free(&mut p).unwrap();
    t.free(&mut p).unwrap();
}

#[test]
fn first_registration_wins_for_duplicate_content() {
    let mut p = pool(8, 2);
    let prompt = [5, 5, 6, 6];
    let mut a = cached_table(&mut p, &prompt, 0);
    let mut b = cached_table(&mut p, &prompt, 0);
    assert_eq!((a.blocks(), b.blocks()), (&[0, 1][..], &[2, 3][..]));
    assert!(p.is_cached(0) && p.is_cached(1) && !p.is_cached(2) && !p.is_cached(3));
    assert_eq!(b.block_hashes(), a.block_hashes());
    b.free(&mut p).unwrap();
    a.free(&mut p).unwrap();
    let mut q = p.new_table();
    assert_eq!(p.lookup_prefix(&prompt, 0, &mut q), Ok(4));
    assert_eq!(q.blocks(), [0, 1]);
    q.free(&mut p).unwrap();
}

#[test]
fn incremental_caching_continues_the_chain_after_a_hit() {
    let mut p = pool(16, 2);
    let seq: Vec<TokenId> = tokens(0, 9);
    let mut t = p.new_table();
    t.allocate_slots(&mut p, 3).unwrap();
    p.cache_full_blocks(&mut t, &seq[..3], 0).unwrap();
    for n in 4..=9 {
        t.allocate_slots(&mut p, 1).unwrap();
        p.cache_full_blocks(&mut t, &seq[..n], 0).unwrap();
    }
    assert_eq!(p.num_cached_blocks(), 4);
    let mut q = p.new_table();
    assert_eq!(p.lookup_prefix(&seq, 0, &mut q), Ok(8));
    assert_eq!(q.blocks(), &t.blocks()[..4]);
    q.free(&mut p).unwrap();
    t.free(&mut p).unwrap();
}

#[test]
fn copy_on_write_only_for_a_shared_partly_filled_last_block() {
    let mut p = pool(8, 4);
    let mut parent = p.new_table();
    parent.allocate_slots(&mut p, 6).unwrap(); // [0, 1], block 1 half full
    let mut child = parent.fork(&mut p).unwrap();
    assert_eq!(child.blocks(), parent.blocks());
    assert_eq!(p.ref_count(1), Ok(2));
    assert!(child.needs_copy_on_write(&p));
    assert_eq!(child.num_blocks_to_allocate(&p, 1), 1);
    assert_eq!(child.allocate_slots(&mut p, 1), Ok(Some(CopyOnWrite { src: 1, dst: 2 })));
    assert_eq!(child.blocks(), [0, 2]);
    assert_eq!((p.ref_count(0), p.ref_count(1), p.ref_count(2)), (Ok(2), Ok(1), Ok(1)));
    // The parent is now the only holder of block 1: it writes in place.
    assert!(!parent.needs_copy_on_write(&p));
    assert_eq!(parent.allocate_slots(&mut p, 2), Ok(None));
    assert_eq!(parent.blocks(), [0, 1]);
    // Full shared blocks are never copied: appends go to a new block.
    let mut grandchild = parent.fork(&mut p).unwrap();
    assert_eq!(grandchild.allocate_slots(&mut p, 1), Ok(None));
    assert_eq!(grandchild.blocks(), [0, 1, 3]);
    free_all(&mut p, [parent, child, grandchild]);
}

#[test]
fn slots_map_tokens_through_the_table() {
    let mut p = pool(8, 4);
    let mut filler = p.new_table();
    filler.allocate_slots(&mut p, 4).unwrap(); // take block 0 so the table's blocks are not 0..
    let mut t = p.new_table();
    t.allocate_slots(&mut p, 6).unwrap();
    assert_eq!(t.blocks(), [1, 2]);
    assert_eq!(t.slot(0), Some(4));
    assert_eq!(t.slot(5), Some(9));
    assert_eq!(t.slot(6), None);
    let mut out = vec![99];
    t.slot_mapping(2..8, &mut out);
    assert_eq!(out, [99, 6, 7, 8, 9, -1, -1]);
    out.clear();
    t.slot_mapping(7..9, &mut out);
    assert_eq!(out, [-1, -1]);
    t.free(&mut p).unwrap();
    filler.free(&mut p).unwrap();
}

#[test]
fn can_allocate_honours_the_watermark() {
    let cfg = PoolConfig { watermark: 0.1, ..PoolConfig::new(20, 4) };
    let mut p = block_alloc::BlockPool::new(cfg).unwrap();
    assert_eq!(p.watermark_blocks(), 2);
    assert_eq!(p.can_allocate(18), AllocStatus::Now);
    assert_eq!(p.can_allocate(19), AllocStatus::Never);
    let mut t = p.new_table();
    t.allocate_slots(&mut p, 4 * 10).unwrap();
    assert_eq!(p.can_allocate(8), AllocStatus::Now);
    assert_eq!(p.can_allocate(9), AllocStatus::Later);
    assert!((p.usage() - 0.5).abs() < 1e-12);
    t.free(&mut p).unwrap();
    assert_eq!(p.can_allocate(0), AllocStatus::Now);
}

#[test]
fn reset_prefix_cache_only_when_nothing_is_used() {
    let mut p = pool(4, 2);
    let mut t = cached_table(&mut p, &[1, 2, 3, 4], 0);
    assert!(!p.reset_prefix_cache());
    assert_eq!(p.num_cached_blocks(), 2);
    t.free(&mut p).unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!(p.num_cached_blocks(), 0);
    assert_eq!(p.lookup_prefix(&[1, 2, 3, 4], 0, &mut t), Ok(0));
}

#[test]
fn caching_off_never_hits() {
    let mut p = block_alloc::BlockPool::new(PoolConfig::host(4, 2)).unwrap();
    let mut t = BlockTable::new(2).unwrap();
    t.allocate_slots(&mut p, 4).unwrap();
    p.cache_full_blocks(&mut t, &[1, 2, 3, 4], 0).unwrap();
    assert_eq!(p.num_cached_blocks(), 0);
    t.free(&mut p).unwrap();
    assert_eq!(p.lookup_prefix(&[1, 2, 3, 4], 0, &mut t), Ok(0));
    assert_eq!(p.prefix_stats().lookups, 0);
}
