//! Bad input: every misuse returns a typed error and leaves the pool exactly as it was
//! (ref counts, free-queue order, cache contents and counters).

use block_alloc::{AllocError, BlockPool, BlockTable, PoolConfig, swap_out};

use crate::support::{cached_table, pool, snapshot, tokens};

/// A pool with some cached, some shared, some free blocks, and the tables holding them.
fn busy_pool() -> (BlockPool, BlockTable, BlockTable) {
    let mut p = pool(8, 4);
    let prompt = tokens(0, 10);
    let a = cached_table(&mut p, &prompt, 0); // [0, 1, 2]
    let b = a.fork(&mut p).unwrap();
    let mut c = p.new_table();
    c.allocate_slots(&mut p, 4).unwrap(); // [3]
    c.free(&mut p).unwrap();
    (p, a, b)
}

#[test]
fn config_errors() {
    let zero = BlockPool::new(PoolConfig::new(4, 0));
    assert_eq!(zero.err(), Some(AllocError::ZeroBlockSize));
    assert_eq!(BlockTable::new(0).err(), Some(AllocError::ZeroBlockSize));
    for w in [-0.1, 1.0, f64::NAN] {
        let cfg = PoolConfig { watermark: w, ..PoolConfig::new(4, 4) };
        assert!(matches!(BlockPool::new(cfg), Err(AllocError::InvalidWatermark(_))));
    }
    let huge = BlockPool::new(PoolConfig::new(u32::MAX as usize, 1));
    assert!(matches!(huge, Err(AllocError::TooManyBlocks { .. })));
    assert!(BlockPool::new(PoolConfig::new(0, 4)).is_ok(), "an empty swap pool is allowed");
}

#[test]
fn double_free_and_unknown_blocks() {
    let (mut p, mut a, mut b) = busy_pool();
    let before = snapshot(&p);
    assert_eq!(p.free(3), Err(AllocError::DoubleFree(3)));
    assert_eq!(p.free(8), Err(AllocError::UnknownBlock(8)));
    assert_eq!(p.ref_count(99), Err(AllocError::UnknownBlock(99)));
    assert_eq!(snapshot(&p), before);

    // Freeing a table one of whose blocks was freed behind its back: the releases done before
    // finding the bad block are rolled back, queue order included.
    b.free(&mut p).unwrap();
    p.free(1).unwrap(); // a's block 1 now has ref count 0
    let before = snapshot(&p);
    assert_eq!(a.free(&mut p), Err(AllocError::DoubleFree(1)));
    assert_eq!(snapshot(&p), before);
    assert_eq!(a.blocks(), [0, 1, 2], "the table is unchanged too");
    // ... and forking it fails the same way, with its increments undone.
    assert_eq!(a.fork(&mut p).err(), Some(AllocError::NotAllocated(1)));
    assert_eq!(snapshot(&p), before);
}

#[test]
fn append_past_capacity_changes_nothing() {
    let (mut p, mut a, mut b) = busy_pool();
    let before = snapshot(&p);
    // Five blocks are free; a's last block is shared (CoW) so 2 + 6 = 8 blocks needed.
    assert_eq!(a.num_blocks_to_allocate(&p, 2 + 5 * 4), 6);
    assert_eq!(a.allocate_slots(&mut p, 2 + 6 * 4), Err(AllocError::OutOfBlocks { needed: 7, free: 5 }));
    assert_eq!(
        a.allocate_slots(&mut p, usize::MAX),
        Err(AllocError::OutOfBlocks { needed: usize::MAX, free: 5 })
    );
    assert_eq!(snapshot(&p), before);
    assert_eq!((a.num_tokens(), a.blocks().len()), (10, 3));
    // Exactly the capacity works, evicting nothing that is held.
    assert!(a.allocate_slots(&mut p, 2 + 4 * 4).unwrap().is_some());
    assert_eq!(p.num_free(), 0);
    assert_eq!(p.allocate(), Err(AllocError::OutOfBlocks { needed: 1, free: 0 }));
    a.free(&mut p).unwrap();
    b.free(&mut p).unwrap();
    assert_eq!(p.num_free(), 8);
}

#[test]
fn wrong_pool_and_block_size_mismatch() {
    let (mut p, mut a, mut b) = busy_pool();
    let mut other = pool(8, 4);
    let mut other_bs = pool(8, 2);
    let before = (snapshot(&p), snapshot(&other));
    assert_eq!(a.allocate_slots(&mut other, 1), Err(AllocError::WrongPool));
    assert_eq!(a.fork(&mut other).err(), Some(AllocError::WrongPool));
    assert_eq!(a.free(&mut other), Err(AllocError::WrongPool));
    assert_eq!(other.cache_full_blocks(&mut a, &tokens(0, 10), 0), Err(AllocError::WrongPool));
    assert_eq!(a.allocate_slots(&mut other_bs, 1), Err(AllocError::BlockSizeMismatch { table: 4, pool: 2 }));
    let mut fresh = p.new_table();
    assert_eq!(
        other_bs.lookup_prefix(&[1, 2], 0, &mut fresh),
        Err(AllocError::BlockSizeMismatch { table: 4, pool: 2 })
    );
    assert_eq!(p.lookup_prefix(&[1, 2], 0, &mut a), Err(AllocError::TableNotEmpty(3)));
    assert_eq!((snapshot(&p), snapshot(&other)), before);
    a.free(&mut p).unwrap();
    b.free(&mut p).unwrap();
}

#[test]
fn failed_swap_changes_neither_pool() {
    let (mut p, mut a, mut b) = busy_pool();
    let mut host = BlockPool::new(PoolConfig::host(2, 4)).unwrap();
    let before = (snapshot(&p), snapshot(&host));
    let err = swap_out(&mut p, &mut host, &mut [&mut a, &mut b]);
    assert_eq!(err, Err(AllocError::OutOfBlocks { needed: 3, free: 2 }));
    let mut small = BlockPool::new(PoolConfig::host(8, 2)).unwrap();
    assert!(matches!(swap_out(&mut p, &mut small, &mut [&mut a]), Err(AllocError::BlockSizeMismatch { .. })));
    assert_eq!(snapshot(&p), before.0);
    // A block held by more group tables than its ref count says (freed behind their back).
    let mut big_host = BlockPool::new(PoolConfig::host(8, 4)).unwrap();
    p.free(1).unwrap();
    let before_big = (snapshot(&p), snapshot(&big_host));
    assert_eq!(swap_out(&mut p, &mut big_host, &mut [&mut a, &mut b]), Err(AllocError::RefCountMismatch(1)));
    assert_eq!((snapshot(&p), snapshot(&big_host)), before_big);
    // A block with ref count 0 that a table still lists.
    b.free(&mut p).unwrap(); // drops block 1 to 0 while `a` still lists it
    let before_big = (snapshot(&p), snapshot(&big_host));
    assert_eq!(swap_out(&mut p, &mut big_host, &mut [&mut a]), Err(AllocError::NotAllocated(1)));
    assert_eq!((snapshot(&p), snapshot(&big_host)), before_big);
    assert_eq!(snapshot(&host), before.1);
}
