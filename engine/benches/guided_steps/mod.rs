//! The `guided` bench's measurements: a round of paired decode steps of a constrained batch
//! and a plain one, the paired times to a first token, and the statistics taken of them.

use std::error::Error;
use std::time::Instant;

use engine::{ChatMessage, Constraint, Engine, Prompt, SamplingParams};

pub const BATCH: usize = 64;
/// Decode steps of the whole batch a round runs (every one of them measured).
pub const DECODE_STEPS: usize = SKIP_STEPS + 32;
/// The first decode steps the median figure leaves out (a grammar's first masks are its
/// costliest); the mean and the p90 take them.
pub const SKIP_STEPS: usize = 2;
/// Steps a round may take before the bench gives up (prefill included).
const STEP_LIMIT: usize = 4 * DECODE_STEPS;

/// The median of `v`, the upper one of an even count (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The nearest-rank `q` quantile of `v` (NaN when empty): the smallest value with at least a
/// fraction `q` of `v` at or below it.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len().max(1));
    s.get(rank - 1).copied().unwrap_or(f64::NAN)
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// User + system CPU time of this process so far, in clock ticks (Linux's `/proc/self/stat`).
/// On a machine other processes load, a step's wall time counts their share too; the CPU time
/// is the work the step did.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    Some(rest.next()?.parse::<u64>().ok()? + rest.next()?.parse::<u64>().ok()?)
}

/// One engine's side of a round: its request ids, the time of each of its decode steps (ms,
/// from the first), its CPU ticks over the decode steps past [`SKIP_STEPS`], and for the guided
/// engine the mask time per sequence and the step's time on guides outside its forward (µs),
/// per decode step.
#[derive(Debug, Default)]
pub struct Side {
    ids: Vec<String>,
    pub step_ms: Vec<f64>,
    pub cpu_ticks: Option<u64>,
    pub mask_us: Vec<f64>,
    pub wait_us: Vec<f64>,
}

/// A round of one schema: per decode step `k` (from the first), the guided step's time over the
/// plain one's taken back to back; each engine's median step past [`SKIP_STEPS`]; the CPU
/// times' ratio over those steps.
#[derive(Debug)]
pub struct Round {
    pub pair_ratios: Vec<f64>,
    pub plain_ms: f64,
    pub guided_ms: f64,
    pub cpu_ratio: Option<f64>,
}

impl Round {
    /// The ratios the median figure takes.
    pub fn past_skip(&self) -> &[f64] {
        self.pair_ratios.get(SKIP_STEPS..).unwrap_or(&[])
    }
}

/// Submits the 64 requests (constrained by `schema` if given).
fn submit(
    engine: &mut Engine,
    schema: Option<&serde_json::Value>,
    tag: &str,
) -> Result<Side, Box<dyn Error>> {
    let mut params = SamplingParams {
        max_tokens: Some(400),
        ignore_eos: true,
        ..engine.default_sampling_params().clone()
    };
    params.constraint = schema.cloned().map(Constraint::JsonSchema);
    let ids: Vec<String> = (0..BATCH).map(|i| format!("guided-{tag}-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let ask = format!("List the products of shop number {i} as JSON.");
        let prompt = Prompt::Chat(vec![ChatMessage::new("user", ask)]);
        engine.add_request(id.clone(), prompt, SamplingParams { seed: Some(i as u64), ..params.clone() })?;
    }
    Ok(Side { ids, cpu_ticks: Some(0), ..Side::default() })
}

/// One step of `side`'s engine, timed; a decode step of the whole batch is recorded. Returns
/// whether it was one.
fn timed_step(engine: &mut Engine, side: &mut Side) -> Result<bool, Box<dyn Error>> {
    let before = engine.metrics();
    let cpu0 = cpu_ticks();
    let t0 = Instant::now();
    let outputs = engine.step()?;
    let step_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu = cpu_ticks().zip(cpu0).map(|(end, start)| end - start);
    let after = engine.metrics();
    if let Some(done) = outputs.iter().find(|o| o.finished) {
        return Err(format!("a sequence finished within the measured steps: {done:?}").into());
    }
    if after.prompt_tokens > before.prompt_tokens || after.gauges.num_running != BATCH {
        return Ok(false);
    }
    if side.step_ms.len() >= SKIP_STEPS {
        side.cpu_ticks = side.cpu_ticks.zip(cpu).map(|(a, b)| a + b);
    }
    side.step_ms.push(step_ms);
    let (b, a) = (before.guided_masks, after.guided_masks);
    if a.masks > b.masks {
        side.mask_us.push((a.compute_s - b.compute_s) * 1e6 / (a.masks - b.masks) as f64);
        side.wait_us.push((a.wait_s - b.wait_s) * 1e6);
    }
    Ok(true)
}

/// Aborts `side`'s requests and steps its engine until idle.
fn finish(engine: &mut Engine, side: &Side) -> Result<(), Box<dyn Error>> {
    for id in &side.ids {
        engine.abort(id)?;
    }
    while engine.has_unfinished() {
        engine.step()?;
    }
    Ok(())
}

/// One round: 64 plain requests on one engine and 64 constrained by `schema` on the other, then
/// pairs of steps, the engine that steps first alternating, from the first prefill step to the
/// [`DECODE_STEPS`]th decode step. Both engines plan the same steps (same prompts, no sequence
/// finishes), so the pairs of decode steps line up.
pub fn round(
    plain: &mut Engine,
    guided: &mut Engine,
    schema: &serde_json::Value,
    tag: &str,
) -> Result<(Round, Side), Box<dyn Error>> {
    let mut p = submit(plain, None, tag)?;
    let mut g = submit(guided, Some(schema), tag)?;
    let mut pairs = 0;
    while p.step_ms.len() < DECODE_STEPS {
        let (plain_decoded, guided_decoded) = if pairs % 2 == 0 {
            let d = timed_step(plain, &mut p)?;
            (d, timed_step(guided, &mut g)?)
        } else {
            let d = timed_step(guided, &mut g)?;
            (timed_step(plain, &mut p)?, d)
        };
        if plain_decoded != guided_decoded {
            return Err("the plain and the guided engine took steps of different kinds".into());
        }
        pairs += 1;
        if pairs > STEP_LIMIT {
            return Err(
                format!("no {DECODE_STEPS} decode steps of the whole batch in {STEP_LIMIT} steps").into()
            );
        }
    }
    finish(plain, &p)?;
    finish(guided, &g)?;
    if g.mask_us.len() != g.step_ms.len() {
        return Err("a guided step prepared no mask beside its forward pass".into());
    }
    let past = |v: &[f64]| median(v.get(SKIP_STEPS..).unwrap_or(&[]));
    let r = Round {
        pair_ratios: g.step_ms.iter().zip(&p.step_ms).map(|(g, p)| g / p).collect(),
        plain_ms: past(&p.step_ms),
        guided_ms: past(&g.step_ms),
        cpu_ratio: g.cpu_ticks.zip(p.cpu_ticks).map(|(g, p)| g as f64 / p.max(1) as f64),
    };
    Ok((r, g))
}

/// Time to the first token of one request on the idle `engine` (ms): from before its
/// submission (a constraint is compiled there) to the return of the step that sampled it.
fn ttft_ms(
    engine: &mut Engine,
    id: &str,
    ask: &str,
    schema: Option<&serde_json::Value>,
) -> Result<f64, Box<dyn Error>> {
    let mut params =
        SamplingParams { max_tokens: Some(1), seed: Some(0), ..engine.default_sampling_params().clone() };
    params.constraint = schema.cloned().map(Constraint::JsonSchema);
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", ask)]);
    let t0 = Instant::now();
    engine.add_request(id, prompt, params)?;
    loop {
        let outputs = engine.step()?;
        if outputs.iter().any(|o| o.request_id == id && o.completion_tokens > 0) {
            break;
        }
        if !engine.has_unfinished() {
            return Err(format!("{id} finished without a token").into());
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    while engine.has_unfinished() {
        engine.step()?;
    }
    Ok(ms)
}

/// Paired times to a first token: per `(topic, schema)`, `repeats` times, the same request
/// constrained on `guided` and not on `plain`, the engine that goes first alternating. Returns
/// the plain and the guided times (ms), pair by pair.
pub fn ttft_pairs(
    plain: &mut Engine,
    guided: &mut Engine,
    schemas: &[(String, serde_json::Value)],
    repeats: usize,
) -> Result<(Vec<f64>, Vec<f64>), Box<dyn Error>> {
    let (mut p, mut g) = (Vec::new(), Vec::new());
    for rep in 0..repeats {
        for (i, (topic, schema)) in schemas.iter().enumerate() {
            let ask = format!("Give {topic} as JSON.");
            let id = format!("ttft-{rep}-{i}");
            if (rep + i) % 2 == 0 {
                p.push(ttft_ms(plain, &id, &ask, None)?);
                g.push(ttft_ms(guided, &id, &ask, Some(schema))?);
            } else {
                g.push(ttft_ms(guided, &id, &ask, Some(schema))?);
                p.push(ttft_ms(plain, &id, &ask, None)?);
            }
        }
    }
    Ok((p, g))
}
