//! Bench program of group `web`: `web.kv_map_snapshot_us`, the time to take one KV-map snapshot
//! (`Scheduler::kv_map_into`, what the engine thread does between two steps when the web page
//! asks) of a 100 000-block pool in a serving-like state: ~19 000 blocks cached by finished
//! requests, 300 running requests (three groups sharing a 512-token system prompt, 50 of them
//! also hitting a finished request's cached prompt, every fifth with `n = 2` samples) holding
//! ~40 000 blocks owned or shared, a 4 096-block swap pool, the rest free.
//!
//! Median of 2 001 snapshots into one reused `KvMap` (the steady state: no allocation), each
//! timed on the benchmark thread's CPU clock like the other host benches (the development
//! machines are shared). Writes `$BENCH_FIGURES_DIR/web.json`.

mod support;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use scheduler::{
    BlockState, KvMap, Request, SampledToken, Scheduler, SchedulerConfig, SchedulerOutput, StepResult,
};

const BLOCKS: usize = 100_000;
const RUNS: usize = 2_001;

fn thread_cpu_now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Drives the scheduler without a model: every sample is token 7.
struct Driver {
    sched: Scheduler,
    out: SchedulerOutput,
    result: StepResult,
    samples: Vec<SampledToken>,
}

impl Driver {
    fn step(&mut self) {
        support::step_with_token_7(&mut self.sched, &mut self.out, &mut self.samples, &mut self.result);
    }
}

fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| seed.wrapping_mul(100_003).wrapping_add(i)).collect()
}

fn realistic() -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 1 << 20,
        max_num_seqs: 512,
        max_model_len: 1 << 16,
        block_size: 16,
        num_device_blocks: BLOCKS,
        num_host_blocks: 4_096,
        watermark: 0.0,
        enable_prefix_caching: true,
        ..SchedulerConfig::default()
    };
    let mut d = Driver {
        sched: Scheduler::new(cfg).expect("config"),
        out: SchedulerOutput::default(),
        result: StepResult::default(),
        samples: Vec::new(),
    };
    // Finished requests: their 2 048-token prompts stay in the prefix cache.
    let finished: Vec<Vec<u32>> = (0..150).map(|i| tokens(1_000 + i, 2_048)).collect();
    for (i, p) in finished.iter().enumerate() {
        d.sched.add_request(Request::new(i as u64, p.clone(), 1)).expect("request");
    }
    while d.sched.has_unfinished() {
        d.step();
    }
    // Running requests: a shared system prompt per group, then their own text.
    let systems: Vec<Vec<u32>> = (0..3).map(|g| tokens(9_000 + g, 512)).collect();
    for i in 0..300u32 {
        let mut prompt = if i < 50 {
            finished[i as usize][..1_024].to_vec() // a hit on a finished request's blocks
        } else {
            systems[i as usize % 3].clone()
        };
        prompt.extend(tokens(20_000 + i, 2_048 - prompt.len()));
        let n = if i % 5 == 0 { 2 } else { 1 };
        d.sched.add_request(Request::new(1_000 + u64::from(i), prompt, 1 << 12).with_n(n)).expect("request");
    }
    for _ in 0..20 {
        d.step();
    }
    assert_eq!(d.sched.num_running(), 300);
    d.sched
}

fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn main() -> std::io::Result<()> {
    let sched = realistic();
    let mut map = KvMap::default();
    sched.kv_map_into(&mut map); // sizes the buffers once
    let states = [BlockState::Free, BlockState::Cached, BlockState::Owned, BlockState::Shared];
    let counts: Vec<usize> = states.iter().map(|&s| map.count_device(s)).collect();
    println!(
        "pool: {BLOCKS} blocks — free {}, cached {}, owned {}, shared {}; {} tables, {} table entries",
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        map.tables.len(),
        map.blocks.len()
    );
    assert!(counts.iter().all(|&c| c > 0), "every state is present");

    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = thread_cpu_now();
            sched.kv_map_into(black_box(&mut map));
            black_box(&map);
            thread_cpu_now().saturating_sub(start)
        })
        .collect();
    times.sort();
    let median_us = times[RUNS / 2].as_secs_f64() * 1e6;
    let p90_us = times[RUNS * 9 / 10].as_secs_f64() * 1e6;
    println!("web.kv_map_snapshot_us = {median_us:.1} (median of {RUNS}; p90 {p90_us:.1})");

    let dir = std::env::var_os("BENCH_FIGURES_DIR")
        .map_or_else(|| root().join("target/bench-report/figures-run"), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("web.json"), format!("{{\n  \"web.kv_map_snapshot_us\": {median_us:.2}\n}}\n"))
}
