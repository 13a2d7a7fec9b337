//! Swap plans: a group of forked tables moves between the device and the host pool with one
//! host block per shared device block, and ref counts right on both sides.

use block_alloc::{AllocStatus, BlockPool, PoolConfig, can_swap_in, can_swap_out, swap_in, swap_out};

use crate::support::{cached_table, free_all, pool, tokens};

#[test]
fn group_swap_out_and_in_keeps_sharing_and_ref_counts() {
    let mut dev = pool(8, 4);
    let mut host = BlockPool::new(PoolConfig::host(6, 4)).unwrap();
    let prompt = tokens(0, 9);
    let mut a = cached_table(&mut dev, &prompt, 0); // [0, 1, 2]
    let mut b = a.fork(&mut dev).unwrap();
    b.allocate_slots(&mut dev, 1).unwrap(); // CoW: b = [0, 1, 3]
    // Another request shares the cached prefix block 0 (outside the group).
    let mut other = dev.new_table();
    assert_eq!(dev.lookup_prefix(&prompt[..4], 0, &mut other), Ok(4));
    assert_eq!(dev.ref_count(0), Ok(3));

    assert_eq!(can_swap_out(&host, &[&a, &b]), AllocStatus::Now);
    let plan = swap_out(&mut dev, &mut host, &mut [&mut a, &mut b]).unwrap();
    assert_eq!(plan, [(0, 0), (1, 1), (2, 2), (3, 3)]);
    assert_eq!((a.blocks(), b.blocks()), (&[0, 1, 2][..], &[0, 1, 3][..]));
    let host_refs: Vec<u32> = (0..6).map(|h| host.ref_count(h).unwrap()).collect();
    assert_eq!(host_refs, [2, 2, 1, 1, 0, 0]);
    assert_eq!(dev.ref_count(0), Ok(1), "still held by `other`");
    // Tail-first per table: a's 2 (a's 1 and 0 are still held by b), then b's 3 and 1
    // (0 is still held by `other`).
    assert_eq!(dev.free_blocks().collect::<Vec<_>>(), [4, 5, 6, 7, 2, 3, 1]);
    assert!(dev.is_cached(1), "swapped-out content stays findable until evicted");
    // Host-side tables refuse the device pool.
    assert_eq!(a.allocate_slots(&mut dev, 1), Err(block_alloc::AllocError::WrongPool));

    // Fill the device so swap-in must wait.
    let mut hog = dev.new_table();
    hog.allocate_slots(&mut dev, 4 * 5).unwrap();
    assert_eq!(can_swap_in(&dev, &[&a, &b]), AllocStatus::Later);
    assert!(swap_in(&mut host, &mut dev, &mut [&mut a, &mut b]).is_err());
    hog.free(&mut dev).unwrap();
    assert_eq!(can_swap_in(&dev, &[&a, &b]), AllocStatus::Now);
    let plan = swap_in(&mut host, &mut dev, &mut [&mut a, &mut b]).unwrap();
    let dev_blocks: Vec<u32> = plan.iter().map(|&(_, d)| d).collect();
    assert_eq!(plan.iter().map(|&(h, _)| h).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(a.blocks(), &dev_blocks[..3]);
    assert_eq!(b.blocks(), [dev_blocks[0], dev_blocks[1], dev_blocks[3]]);
    assert_eq!(host.num_free(), 6);
    assert_eq!(dev.ref_count(dev_blocks[0]), Ok(2));
    // Re-registering after swap-in: the first block's content is already cached elsewhere
    // (block 0, held by `other`), so it stays unregistered; the rest are registered anew.
    dev.cache_full_blocks(&mut a, &prompt, 0).unwrap();
    assert!(dev.is_cached(0) && !dev.is_cached(dev_blocks[0]));
    assert!(dev.is_cached(dev_blocks[1]));
    free_all(&mut dev, [a, b, other]);
}

#[test]
fn swap_of_a_group_never_exceeding_host_capacity() {
    let mut dev = pool(4, 4);
    let host = BlockPool::new(PoolConfig::host(2, 4)).unwrap();
    let mut a = dev.new_table();
    a.allocate_slots(&mut dev, 12).unwrap();
    assert_eq!(can_swap_out(&host, &[&a]), AllocStatus::Never);
    a.free(&mut dev).unwrap();
}
