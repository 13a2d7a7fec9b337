//! Criterion benchmarks of the allocator's hot paths, group `block_alloc`: figures
//! `alloc_free_ns`, `alloc_evict_free_ns`, `append_token_ns`, `fork_1k_blocks_us`,
//! `prefix_lookup_4k_tokens_us`.
//!
//! Every pool is a realistic device pool (65 536 blocks of 16 tokens, prefix caching on) so
//! metadata and the hash index are as large as in serving, not cache-resident toys.
//!
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), in nanoseconds: on
//! the shared 2-core machine, wall time mostly measured how often other processes preempted
//! us (3x swings with the load), while CPU time is what the allocator costs. On an idle
//! machine the two agree.

use std::hint::black_box;
use std::time::Duration;

use block_alloc::{BlockPool, BlockTable, PoolConfig, TokenId};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, criterion_group, criterion_main};

/// Criterion measurement: CPU time of the calling thread.
struct ThreadCpuTime;

fn thread_cpu_now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Wall-time formatting (ns, µs, ...) fits CPU time too.
static NANOS: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu_now()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        NANOS.formatter()
    }
}

type Crit = Criterion<ThreadCpuTime>;

const NUM_BLOCKS: usize = 65_536;
const BLOCK_SIZE: usize = 16;

fn device_pool() -> BlockPool {
    match BlockPool::new(PoolConfig::new(NUM_BLOCKS, BLOCK_SIZE)) {
        Ok(p) => p,
        Err(e) => panic!("bench pool: {e}"),
    }
}

/// Deterministic pseudo-random tokens (a different stream per `seed`).
fn prompt(seed: u64, len: usize) -> Vec<TokenId> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 49_152) as TokenId
        })
        .collect()
}

/// A table holding `tokens`, its full blocks registered in the prefix cache.
fn cached_table(pool: &mut BlockPool, tokens: &[TokenId]) -> BlockTable {
    let mut t = pool.new_table();
    t.allocate_slots(pool, tokens.len()).expect("pool has room");
    pool.cache_full_blocks(&mut t, tokens, 0).expect("same pool");
    t
}

fn alloc_free(c: &mut Crit) {
    let mut pool = device_pool();
    // Half the pool held (cached), the other half free and uncached: allocation pops the free
    // queue's head, free pushes the block back at its tail; no eviction (that is
    // `alloc_evict_free_ns`). Once the pair has cycled through the free half, this is also what
    // a pool whose free blocks were all evicted costs.
    let mut held = cached_table(&mut pool, &prompt(1, NUM_BLOCKS / 2 * BLOCK_SIZE));
    c.benchmark_group("block_alloc").bench_function("alloc_free_ns", |b| {
        b.iter(|| {
            let x = pool.allocate().expect("free blocks");
            pool.free(black_box(x)).expect("allocated");
        })
    });
    held.free(&mut pool).expect("free");
}

fn alloc_evict_free(c: &mut Crit) {
    let mut pool = device_pool();
    // Half the pool held, and every free block cached, as in steady-state serving with the
    // prefix cache warm: each allocation evicts the LRU cached block (its hash leaves the
    // index). A freed block comes back uncached, so the free half is cached again (untimed)
    // whenever the evictable blocks run out.
    let mut held = cached_table(&mut pool, &prompt(1, NUM_BLOCKS / 2 * BLOCK_SIZE));
    let free_half = NUM_BLOCKS - NUM_BLOCKS / 2;
    let mut refills = 2u64;
    let mut recache = |pool: &mut BlockPool| {
        refills += 1;
        let mut t = cached_table(pool, &prompt(refills, free_half * BLOCK_SIZE));
        t.free(pool).expect("free");
        assert_eq!(pool.num_cached_blocks(), NUM_BLOCKS);
    };
    recache(&mut pool);
    let mut evictable = free_half;
    c.benchmark_group("block_alloc").bench_function("alloc_evict_free_ns", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                if evictable == 0 {
                    recache(&mut pool);
                    evictable = free_half;
                }
                let batch = left.min(evictable as u64);
                let start = thread_cpu_now();
                for _ in 0..batch {
                    let x = pool.allocate().expect("free blocks");
                    pool.free(black_box(x)).expect("allocated");
                }
                total += thread_cpu_now().saturating_sub(start);
                evictable -= batch as usize;
                left -= batch;
            }
            total
        })
    });
    held.free(&mut pool).expect("free");
}

fn append_token(c: &mut Crit) {
    let mut pool = device_pool();
    let mut table = pool.new_table();
    c.benchmark_group("block_alloc").bench_function("append_token_ns", |b| {
        b.iter(|| {
            let cow = table.allocate_slots(&mut pool, black_box(1)).expect("room");
            black_box(cow);
            // A 4 096-token sequence finishes and a new one starts: the free is amortized in.
            if table.num_tokens() == 4096 {
                table.free(&mut pool).expect("free");
            }
        })
    });
    table.free(&mut pool).expect("free");
}

fn fork_1k(c: &mut Crit) {
    let mut pool = device_pool();
    let mut table = cached_table(&mut pool, &prompt(3, 1000 * BLOCK_SIZE));
    assert_eq!(table.blocks().len(), 1000);
    c.benchmark_group("block_alloc").bench_function("fork_1k_blocks_us", |b| {
        b.iter(|| {
            let mut fork = table.fork(&mut pool).expect("fork");
            fork.free(&mut pool).expect("free");
        })
    });
    table.free(&mut pool).expect("free");
}

fn prefix_lookup(c: &mut Crit) {
    let mut pool = device_pool();
    // A full index: 255 other cached prompts of 256 blocks, then the one we look up. All
    // freed, so every hit also pulls its block out of the free queue.
    let others: Vec<BlockTable> = (0..255).map(|s| cached_table(&mut pool, &prompt(100 + s, 4096))).collect();
    let tokens = prompt(7, 4096);
    let mut t = cached_table(&mut pool, &tokens);
    for mut o in others.into_iter().chain([std::mem::replace(&mut t, pool.new_table())]) {
        o.free(&mut pool).expect("free");
    }
    assert_eq!(pool.num_cached_blocks(), NUM_BLOCKS);
    let mut table = pool.new_table();
    c.benchmark_group("block_alloc").bench_function("prefix_lookup_4k_tokens_us", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = thread_cpu_now();
                let hit = pool.lookup_prefix(black_box(&tokens), 0, &mut table).expect("empty table");
                total += thread_cpu_now().saturating_sub(start);
                assert_eq!(hit, 4096);
                table.free(&mut pool).expect("free");
            }
            total
        })
    });
}

criterion_group! {
    name = block_alloc;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = alloc_free, alloc_evict_free, append_token, fork_1k, prefix_lookup
}
criterion_main!(block_alloc);
