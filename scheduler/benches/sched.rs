//! Criterion benchmarks (group `sched`): one `schedule()` + `update()` step with 256 and 1 024
//! running decodes whose contexts grow from 512 to 1 024 tokens (block 16), including building
//! the step's flat token / position / slot-mapping arrays, the attention metadata and the
//! block-table deltas (the output is handed back every step, as the engine does).
//!
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), as in `block-alloc`'s
//! benches: the development machines run several builds at once, and wall time then measures
//! the time slices lost to them rather than the scheduler. On an idle machine both agree.
//!
//! `cargo xtask bench` turns the ids `sched/step_us_N` into figures `sched.step_us_N` (µs).

mod support;

use std::time::Duration;

use criterion::Criterion;
use scheduler::{Request, SampledToken, Scheduler, SchedulerConfig, SchedulerOutput, StepResult};

const PROMPT: usize = 512;
/// Decode steps before the state is rebuilt (untimed), so contexts stay in 512..1024.
const STEPS_PER_STATE: usize = 512;

struct Bench {
    sched: Scheduler,
    out: SchedulerOutput,
    result: StepResult,
    samples: Vec<SampledToken>,
    steps: usize,
}

impl Bench {
    /// `running` requests, all prefilled and decoding.
    fn new(running: usize) -> Self {
        let cfg = SchedulerConfig {
            max_num_batched_tokens: running * PROMPT,
            max_num_seqs: running,
            max_model_len: 1 << 20,
            block_size: 16,
            num_device_blocks: running * (PROMPT + STEPS_PER_STATE + 16) / 16,
            watermark: 0.0,
            ..SchedulerConfig::default()
        };
        let mut sched = Scheduler::new(cfg).expect("config");
        for id in 0..running as u64 {
            let prompt = (0..PROMPT as u32).map(|t| t + id as u32 * 1000).collect();
            sched.add_request(Request::new(id, prompt, 1 << 30)).expect("request");
        }
        let mut bench = Self {
            sched,
            out: SchedulerOutput::default(),
            result: StepResult::default(),
            samples: Vec::new(),
            steps: 0,
        };
        bench.step(); // the prefill
        assert_eq!(bench.out.seqs.len(), running);
        bench.steps = 0;
        bench
    }

    fn step(&mut self) {
        support::step_with_token_7(&mut self.sched, &mut self.out, &mut self.samples, &mut self.result);
        self.steps += 1;
    }
}

/// CPU time consumed by the calling thread so far.
fn thread_cpu_now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn step_bench(c: &mut Criterion, name: &str, running: usize) {
    let mut bench = Bench::new(running);
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if bench.steps == STEPS_PER_STATE {
                    bench = Bench::new(running);
                }
                let start = thread_cpu_now();
                bench.step();
                total += thread_cpu_now().saturating_sub(start);
            }
            debug_assert_eq!(bench.out.seqs.len(), running);
            total
        });
    });
}

fn benches(c: &mut Criterion) {
    step_bench(c, "sched/step_us_256", 256);
    step_bench(c, "sched/step_us_1024", 1024);
}

criterion::criterion_group!(sched, benches);
criterion::criterion_main!(sched);
