//! The `kv` bench's stepping of an engine's scheduler without the forward pass (its "twin"):
//! a [`Scheduler`] configured from a built [`Engine`], driven through the engine's step loop
//! with the forward and the sampler left out, and the counts the bench reports from it.
//!
//! `Engine::step` schedules, writes the plan's block-table deltas to the runner, runs the
//! forward pass, samples, and hands one token per planned sample to `Scheduler::update`. Only
//! the scheduler takes and frees blocks (admission above the watermark, chunks appended, window
//! releases, finishes, preemptions), so the twin, which schedules and updates alike, holds the
//! blocks the engine would; [`cross_check`] shows it on a request the engine serves for real.

use std::error::Error;

use engine::{Engine, Prompt, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use scheduler::{Request, RequestKey, SampledToken, Scheduler, SchedulerConfig, SchedulerOutput, SeqId};

/// Tokens each 32k request generates. A 32k prefill takes sixteen steps of the default token
/// budget, one request after another, so requests must outlive the admission of the last that
/// fits: with a few output tokens each would finish before the next one's prefill ended, and
/// the number running at once would count the token budget, not the memory.
pub const OUTPUT_TOKENS: usize = 1_024;
/// 32k requests submitted at once: more than either layout runs at once (the bench fails
/// otherwise), so that the steady state is reached with a request waiting for memory.
pub const REQUESTS: usize = 48;
/// The request each engine serves for real: three prefill chunks of the default budget (the
/// sliding groups release blocks from the second on) and a decode step.
pub const CHECK_PROMPT: usize = 4_600;
pub const CHECK_OUTPUT: usize = 2;
/// Most steps a run may take before the bench gives up (a run that never settles is a bug).
const STEP_LIMIT: usize = 20_000;
const SEED: u64 = 32_768;
/// The token every stepped sample draws (any id: the scheduler only appends it).
const FILLER: u32 = 1_000;

/// Where the layers keep their KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The engine's hybrid KV cache: a group per attention kind, sliding groups releasing what
    /// left their window.
    Hybrid,
    /// Every layer in one full-attention group.
    Full,
}

/// What one layout's 32k run counted.
#[derive(Debug)]
pub struct Run {
    pub layout: Layout,
    /// Per KV cache group, its sliding window.
    pub group_windows: Vec<Option<usize>>,
    /// Device blocks of the engine's cache, layer tensors one block spans, and its bytes.
    pub num_blocks: usize,
    pub slots: usize,
    pub bytes_per_block: usize,
    /// The first request's blocks: the most during its prefill, and at the steady state.
    pub prefill_peak_blocks: usize,
    pub first_steady_blocks: usize,
    /// Most requests running (prefilling or decoding) after any step.
    pub max_running: usize,
    /// At the steady state: blocks in use, tokens the running sequences hold.
    pub steady_used: usize,
    pub steady_tokens: usize,
    pub preemptions: u64,
    pub steps: usize,
}

impl Run {
    pub fn prefill_peak_bytes(&self) -> usize {
        self.prefill_peak_blocks * self.bytes_per_block
    }

    pub fn steady_bytes_per_token(&self) -> f64 {
        (self.steady_used * self.bytes_per_block) as f64 / self.steady_tokens.max(1) as f64
    }

    /// The groups as the report names them.
    pub fn group_names(&self) -> Vec<String> {
        self.group_windows
            .iter()
            .map(|w| w.map_or_else(|| "full".to_owned(), |w| format!("window {w}")))
            .collect()
    }
}

/// A scheduler configured as `Engine::from_parts` configures the engine's: the engine's
/// settings, its cache's block count, and the KV groups and swap blocks its KV map shows.
pub fn twin_of(engine: &Engine) -> Result<Scheduler, Box<dyn Error>> {
    let c = engine.config();
    let map = engine.kv_snapshot().map;
    if map.block_size != c.block_size || map.device.len() != engine.num_kv_blocks() {
        return Err("the engine's KV map disagrees with its configuration".into());
    }
    Ok(Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: c.max_num_batched_tokens,
        max_num_seqs: c.max_num_seqs,
        max_model_len: engine.max_model_len(),
        policy: c.policy,
        preemption: c.preemption_mode,
        block_size: c.block_size,
        num_device_blocks: engine.num_kv_blocks(),
        num_host_blocks: map.host.len(),
        watermark: c.watermark,
        enable_prefix_caching: c.enable_prefix_caching,
        kv_groups: map.group_windows,
        max_loras: None,
    })?)
}

/// One step of the engine's loop without the forward pass: the plan, then one token for every
/// sample it asks for (never a stop: the requests ignore EOS), as `Engine::step` updates.
fn step(
    s: &mut Scheduler,
    plan: &mut SchedulerOutput,
    samples: &mut Vec<SampledToken>,
) -> Result<(), Box<dyn Error>> {
    s.schedule_into(plan)?;
    if plan.is_empty() {
        return Ok(());
    }
    samples.clear();
    for seq in &plan.seqs {
        let sample = SampledToken { seq_id: seq.seq_id, token: FILLER, stop: false };
        samples.extend(std::iter::repeat_n(sample, seq.num_samples));
    }
    s.update(samples)?;
    Ok(())
}

/// A prompt of `len` random ids past the special and byte tokens: no two prompts share a
/// block, so the prefix cache gives nothing back.
fn prompt(rng: &mut ChaCha8Rng, len: usize, vocab: usize) -> Vec<u32> {
    let top = u32::try_from(vocab).unwrap_or(u32::MAX);
    (0..len).map(|_| rng.random_range(1_000..top)).collect()
}

/// Serves one request for real on `engine` (forward and sampling) and the same request on its
/// twin; both must hold the same number of blocks after every step. Returns those numbers.
pub fn cross_check(engine: &mut Engine) -> Result<Vec<usize>, Box<dyn Error>> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let tokens = prompt(&mut rng, CHECK_PROMPT, engine.model_config().vocab_size);
    let mut twin = twin_of(engine)?;
    let params = SamplingParams {
        max_tokens: Some(CHECK_OUTPUT),
        ignore_eos: true,
        ..engine.default_sampling_params().clone()
    };
    engine.add_request("kv-check", Prompt::Tokens(tokens.clone()), params)?;
    twin.add_request(Request::new(RequestKey(0), tokens, CHECK_OUTPUT))?;
    let mut real = Vec::new();
    while engine.has_unfinished() && real.len() < STEP_LIMIT {
        engine.step()?;
        real.push(engine.num_kv_blocks_used());
    }
    let (mut plan, mut samples, mut stepped) = (SchedulerOutput::default(), Vec::new(), Vec::new());
    while twin.has_unfinished() && stepped.len() < STEP_LIMIT {
        step(&mut twin, &mut plan, &mut samples)?;
        stepped.push(twin.device_pool().num_used());
    }
    if real != stepped || !engine.kv_is_idle() {
        return Err(format!(
            "the engine held {real:?} blocks after its steps, the scheduler stepped without the \
             forward pass {stepped:?}"
        )
        .into());
    }
    Ok(real)
}

/// Submits `requests` requests of `seq_tokens` (prompt and output) to `engine`'s twin at once
/// and steps it until the steady state: a step that computes no prompt token while a request
/// waits (every admitted request decodes, and there is no memory for the next).
pub fn run_32k(
    engine: &Engine,
    layout: Layout,
    seq_tokens: usize,
    requests: usize,
) -> Result<Run, Box<dyn Error>> {
    let prompt_tokens = seq_tokens - OUTPUT_TOKENS;
    let mut s = twin_of(engine)?;
    let mut rng = ChaCha8Rng::seed_from_u64(SEED + 1);
    let vocab = engine.model_config().vocab_size;
    for i in 0..requests {
        let tokens = prompt(&mut rng, prompt_tokens, vocab);
        s.add_request(Request::new(RequestKey(i as u64), tokens, OUTPUT_TOKENS))?;
    }
    // What the engine's runner builds on the CPU: a block spans one layer tensor per member of
    // a group.
    let c = engine.config();
    let slots = engine.model_config().hybrid_kv_layout().num_slots();
    let shape = engine.model_config().block_shape(c.block_size, c.kv_dtype);
    let mut run = Run {
        layout,
        group_windows: engine.kv_snapshot().map.group_windows,
        num_blocks: engine.num_kv_blocks(),
        slots,
        bytes_per_block: shape.bytes_per_block_per_layer() * slots,
        prefill_peak_blocks: 0,
        first_steady_blocks: 0,
        max_running: 0,
        steady_used: 0,
        steady_tokens: 0,
        preemptions: 0,
        steps: 0,
    };
    let first = SeqId { request: RequestKey(0), index: 0 };
    let (mut plan, mut samples) = (SchedulerOutput::default(), Vec::new());
    loop {
        step(&mut s, &mut plan, &mut samples)?;
        run.steps += 1;
        run.max_running = run.max_running.max(s.num_running());
        let tables = s.seq_tables(first).ok_or("the first request left before the steady state")?;
        // Blocks are appended when a chunk is scheduled and released when the sequence is next
        // scheduled: after a step, a sliding group holds its window and the chunk just written.
        if tables.num_tokens() <= prompt_tokens {
            run.prefill_peak_blocks = run.prefill_peak_blocks.max(tables.num_live_blocks());
        }
        if plan.num_prefill_tokens() == 0 && !plan.is_empty() {
            if s.num_waiting() == 0 {
                return Err(format!("all {requests} requests run at once: submit more").into());
            }
            run.first_steady_blocks = tables.num_live_blocks();
            run.steady_used = s.device_pool().num_used();
            run.steady_tokens = s.kv_tokens_held();
            run.preemptions = s.stats().preemptions();
            return Ok(run);
        }
        if run.steps >= STEP_LIMIT {
            return Err(format!("no steady state after {STEP_LIMIT} steps").into());
        }
    }
}
