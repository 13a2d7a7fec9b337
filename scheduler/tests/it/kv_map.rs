//! `Scheduler::kv_map_into`: the block states agree with the tables it lists (owned = one
//! table entry, shared = more), prefix hits and forks show as shared, swapped tables sit in the
//! host pool, and finished requests leave only free and cached blocks.

use std::collections::HashMap;

use scheduler::{BlockState, KvMap, PreemptionMode, Request, RequestKey, SchedulerConfig};

use crate::fake::FakeEngine;

fn cfg(blocks: usize, host: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 16,
        max_model_len: 512,
        block_size: 4,
        num_device_blocks: blocks,
        num_host_blocks: host,
        watermark: 0.0,
        enable_prefix_caching: true,
        ..SchedulerConfig::default()
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| seed * 1000 + i).collect()
}

/// Every byte of both pools is what the listed tables imply (between steps nothing else holds
/// a block): a block in one table entry is owned, in several shared, in none free or cached.
fn assert_agrees_with_tables(map: &KvMap) {
    let mut refs: [HashMap<u32, u32>; 2] = [HashMap::new(), HashMap::new()];
    for t in &map.tables {
        assert_eq!(
            t.first_block + t.len,
            t.num_tokens.div_ceil(map.block_size),
            "table of {}:{} (group {})",
            t.request,
            t.seq,
            t.group
        );
        for &b in map.table_blocks(t) {
            *refs[usize::from(t.swapped)].entry(b).or_default() += 1;
        }
    }
    for (states, refs) in [(&map.device, &refs[0]), (&map.host, &refs[1])] {
        for (b, &code) in states.iter().enumerate() {
            let state = BlockState::from_code(code).expect("a known code");
            match refs.get(&(b as u32)) {
                None => {
                    assert!(matches!(state, BlockState::Free | BlockState::Cached), "block {b}: {state:?}")
                }
                Some(1) => assert_eq!(state, BlockState::Owned, "block {b}"),
                Some(_) => assert_eq!(state, BlockState::Shared, "block {b}"),
            }
        }
    }
    let used = map.device.len() - map.count_device(BlockState::Free) - map.count_device(BlockState::Cached);
    assert_eq!(map.counters.device_blocks_used, used);
    assert_eq!(map.counters.device_blocks_cached, map.count_device(BlockState::Cached));
    assert_eq!(map.counters.kv_usage, used as f64 / map.device.len() as f64);
}

#[test]
fn a_prefix_hit_shares_blocks_and_finishing_leaves_them_cached() {
    let mut e = FakeEngine::new(cfg(16, 0));
    let mut map = KvMap::default();
    e.add(Request::new(1, prompt(1, 9), 6)).unwrap();
    e.step();
    e.sched.kv_map_into(&mut map);
    assert_agrees_with_tables(&map);
    assert_eq!(map.tables.len(), 1);
    let first: Vec<u32> = map.table_blocks(&map.tables[0]).to_vec();
    assert_eq!(first.len(), 3, "9 tokens + the first sample in blocks of 4");
    assert_eq!(std::str::from_utf8(&map.device).unwrap().matches('o').count(), 3);
    assert_eq!((map.counters.num_running, map.counters.num_waiting), (1, 0));

    // Same prompt again: its two full blocks are a prefix hit on blocks request 1 holds.
    e.add(Request::new(2, prompt(1, 9), 6)).unwrap();
    e.sched.kv_map_into(&mut map);
    assert_eq!(map.counters.num_waiting, 1);
    e.step();
    e.sched.kv_map_into(&mut map);
    assert_agrees_with_tables(&map);
    assert_eq!(map.tables.len(), 2);
    let second = map.table_blocks(&map.tables[1]);
    assert_eq!(second[..2], first[..2], "the hit reuses the first request's full blocks");
    for &b in &first[..2] {
        assert_eq!(map.device[b as usize], BlockState::Shared.code());
    }
    assert_eq!(map.count_device(BlockState::Shared), 2);
    assert!(map.counters.prefix_hit_rate > 0.0 && map.counters.prefix_hit_tokens == 8);

    e.run_to_end(100);
    e.sched.kv_map_into(&mut map);
    assert_agrees_with_tables(&map);
    assert!(map.tables.is_empty() && map.blocks.is_empty());
    assert_eq!(map.counters.num_running, 0);
    assert_eq!(map.count_device(BlockState::Owned) + map.count_device(BlockState::Shared), 0);
    assert!(map.count_device(BlockState::Cached) >= 2, "the full blocks stay in the prefix cache");
    for &b in &first[..2] {
        assert_eq!(map.device[b as usize], BlockState::Cached.code());
    }
}

#[test]
fn forked_samples_share_their_prompt_blocks() {
    let mut e = FakeEngine::new(cfg(32, 0));
    e.add(Request::new(7, prompt(7, 8), 6).with_n(3)).unwrap();
    e.step();
    e.step();
    let map = e.sched.kv_map();
    assert_agrees_with_tables(&map);
    assert_eq!(map.tables.len(), 3);
    assert!(map.tables.iter().all(|t| t.request == RequestKey(7) && !t.swapped));
    let prompt_blocks = &map.table_blocks(&map.tables[0])[..2];
    for &b in prompt_blocks {
        assert_eq!(map.device[b as usize], BlockState::Shared.code());
    }
}

#[test]
fn under_swap_pressure_every_step_agrees_and_swapped_tables_are_in_the_host_pool() {
    let mut e = FakeEngine::new(SchedulerConfig { preemption: PreemptionMode::Swap, ..cfg(24, 64) });
    for i in 0..12u64 {
        let len = 6 + (i as usize * 7) % 13;
        e.add(Request::new(i, prompt(i as u32, len), 12 + (i as usize * 5) % 17).with_n(1 + i as usize % 3))
            .unwrap();
    }
    let mut map = KvMap::default();
    let mut saw_swapped = false;
    for _ in 0..5_000 {
        if !e.step() {
            break;
        }
        e.sched.kv_map_into(&mut map);
        assert_agrees_with_tables(&map);
        assert_eq!(map.host.len(), 64);
        assert_eq!(map.counters.num_swapped, e.sched.num_swapped());
        assert_eq!(map.counters.num_preemptions, e.sched.stats().preemptions());
        if map.counters.num_swapped > 0 {
            saw_swapped = true;
            assert!(map.tables.iter().any(|t| t.swapped));
            assert!(map.counters.host_blocks_used > 0);
        }
    }
    assert!(saw_swapped, "the pool is small enough to swap");
    e.sched.kv_map_into(&mut map);
    assert!(map.tables.is_empty() && map.counters.host_blocks_used == 0);
    assert!(map.host.iter().all(|&c| c == BlockState::Free.code()));
}

/// A hybrid layout lists a table per group; the sliding group's starts past the blocks it
/// released, and the pool's states agree with the live entries only.
#[test]
fn a_sliding_group_lists_only_the_blocks_in_its_window() {
    let mut e = FakeEngine::new(SchedulerConfig { kv_groups: vec![Some(6), None], ..cfg(64, 0) });
    let mut map = KvMap::default();
    e.add(Request::new(1, prompt(1, 30), 4)).unwrap();
    e.step();
    e.step();
    e.sched.kv_map_into(&mut map);
    assert_eq!(map.group_windows, [Some(6), None]);
    let [sliding, full] = map.tables.as_slice() else { panic!("two tables: {:?}", map.tables) };
    assert_eq!((sliding.group, full.group, full.first_block), (0, 1, 0));
    // 31 tokens; the next query (at 31) sees 26..=31: blocks 0..6 of 4 tokens are out.
    assert_eq!((sliding.num_tokens, sliding.first_block, sliding.len), (31, 6, 2));
    assert_eq!(full.len, 8);
    assert_agrees_with_tables(&map);
    e.run_to_end(20);
}
