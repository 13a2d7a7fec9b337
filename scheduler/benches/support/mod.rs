//! What the scheduler benches share: one model-free step (every scheduled sample is token 7).

use scheduler::{SampledToken, Scheduler, SchedulerOutput, StepResult};

/// Schedules a step into `out`, samples token 7 for every sample it asks for, and feeds the
/// samples back (`samples` and `result` are reused buffers).
pub fn step_with_token_7(
    sched: &mut Scheduler,
    out: &mut SchedulerOutput,
    samples: &mut Vec<SampledToken>,
    result: &mut StepResult,
) {
    sched.schedule_into(out).expect("schedule");
    samples.clear();
    for s in &out.seqs {
        for _ in 0..s.num_samples {
            samples.push(SampledToken { seq_id: s.seq_id, token: 7, stop: false });
        }
    }
    sched.update_into(samples, result).expect("update");
}
