//! Benchmark group `guided`: what structured outputs cost on the default model as users run it
//! (SmolLM2-135M-Instruct, the Q4_1 GGUF, CPU).
//!
//! - `guided.step_overhead_b64`: decode-step time of 64 sequences each constrained by a JSON
//!   schema over that of the same 64 requests unconstrained (same prompts, same sampling
//!   parameters: the model's defaults, what a server request that sets none gets). Two engines of
//!   the same model hold the two batches and step in turns, the one that goes first alternating;
//!   each pair of back-to-back steps gives a ratio, and the figure is the median over every pair
//!   of an odd number of rounds. Pairing cancels the drift of a shared machine's speed, which
//!   moves a whole run's step time by tens of percent. `guided.cpu_overhead_b64` is the median
//!   over rounds of the ratio of the process's CPU time over those steps: the work the masks add,
//!   whatever share of the machine other processes take.
//! - `guided.mask_us_p50`: the median over the constrained decode steps of the time spent
//!   computing one sequence's mask (`MaskTimes` in the engine's metrics);
//!   `guided.mask_wait_us_p50` is the time those steps spent on their guides outside the forward
//!   pass (feeding them their tokens, computing masks not ready when the forward ended).
//! - `guided.schema_compile_ms_p50`: the median time to compile one of the structured-outputs
//!   acceptance set's schemas (`engine/tests/data/json_schemas.json`) into a guide, its first
//!   mask included: what admission does for a request.
//!
//! Writes `$BENCH_FIGURES_DIR/guided.json` and the fragment `guided.md`.

use std::error::Error;
use std::fmt::Write as _;
use std::time::Instant;

use engine::structured::Grammars;
use engine::{ChatMessage, Constraint, Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};

mod support;

const BATCH: usize = 64;
/// Rounds of the two runs (odd, for a median).
const ROUNDS: usize = 5;
/// Decode steps skipped once every sequence decodes (the first masks of a grammar are the
/// costliest), then measured.
const SKIP_STEPS: usize = 2;
const MEASURED_STEPS: usize = 32;
/// Compilations of each acceptance schema.
const COMPILE_REPEATS: usize = 5;

/// The acceptance set: `{"schemas": [{"topic", "schema"}]}`.
const SCHEMAS: &str = include_str!("../tests/data/json_schemas.json");

/// What the 64 constrained sequences produce: a catalogue long enough that none finishes within
/// the measured steps, with every kind of value (keys, integers and numbers with bounds, bounded
/// strings, enums, arrays, booleans) so that the masks cost what they cost in general.
fn catalogue_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"products": {"type": "array", "minItems": 64, "maxItems": 64, "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                "name": {"type": "string", "maxLength": 16},
                "category": {"enum": ["food", "tools", "toys", "books", "garden"]},
                "price": {"type": "number", "minimum": 0, "maximum": 1000},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
                "in_stock": {"type": "boolean"}
            },
            "required": ["id", "name", "category", "price", "tags", "in_stock"],
            "additionalProperties": false
        }}},
        "required": ["products"],
        "additionalProperties": false
    })
}

fn config() -> EngineConfig {
    EngineConfig {
        max_model_len: Some(512),
        max_num_seqs: 256,
        kv_cache: KvCacheSize::Blocks(1024),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// One round: per pair of steps (one of each engine, back to back) the guided step's time over
/// the plain one's; each engine's median step; the CPU times' ratio over the round's steps.
#[derive(Debug)]
struct Round {
    pair_ratios: Vec<f64>,
    plain_ms: f64,
    guided_ms: f64,
    cpu_ratio: Option<f64>,
}

impl Round {
    fn ratio(&self) -> f64 {
        median(&self.pair_ratios)
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { f64::NAN } else { s[s.len() / 2] }
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

/// One engine's side of a round: its request ids, its step times (ms), its CPU ticks, and for
/// the guided engine the mask time per sequence and the step's time on guides outside its
/// forward (µs).
#[derive(Debug, Default)]
struct Side {
    ids: Vec<String>,
    step_ms: Vec<f64>,
    cpu_ticks: Option<u64>,
    mask_us: Vec<f64>,
    wait_us: Vec<f64>,
}

/// Submits the 64 requests (constrained by `schema` if given).
fn submit(
    engine: &mut Engine,
    schema: Option<&serde_json::Value>,
    round: usize,
) -> Result<Side, Box<dyn Error>> {
    let mut params = SamplingParams {
        max_tokens: Some(400),
        ignore_eos: true,
        ..engine.default_sampling_params().clone()
    };
    params.constraint = schema.cloned().map(Constraint::JsonSchema);
    let ids: Vec<String> = (0..BATCH).map(|i| format!("guided-{round}-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let ask = format!("List the products of shop number {i} as JSON.");
        let prompt = Prompt::Chat(vec![ChatMessage::new("user", ask)]);
        engine.add_request(id.clone(), prompt, SamplingParams { seed: Some(i as u64), ..params.clone() })?;
    }
    Ok(Side { ids, cpu_ticks: Some(0), ..Side::default() })
}

/// Steps until every sequence decodes, then [`SKIP_STEPS`] decode steps more.
fn until_decoding(engine: &mut Engine) -> Result<(), Box<dyn Error>> {
    let mut decoding = 0;
    while decoding < SKIP_STEPS {
        let before = engine.metrics();
        engine.step()?;
        let after = engine.metrics();
        let prefill = after.prompt_tokens > before.prompt_tokens;
        decoding = if prefill || after.gauges.num_running != BATCH { 0 } else { decoding + 1 };
    }
    Ok(())
}

/// One measured decode step of `side`'s engine, all its sequences running.
fn measured_step(engine: &mut Engine, side: &mut Side) -> Result<(), Box<dyn Error>> {
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
        return Err("a measured step was not a decode step of the whole batch".into());
    }
    side.step_ms.push(step_ms);
    side.cpu_ticks = side.cpu_ticks.zip(cpu).map(|(a, b)| a + b);
    let (b, a) = (before.guided_masks, after.guided_masks);
    if a.masks > b.masks {
        side.mask_us.push((a.compute_s - b.compute_s) * 1e6 / (a.masks - b.masks) as f64);
        side.wait_us.push((a.wait_s - b.wait_s) * 1e6);
    }
    Ok(())
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

/// One round: 64 plain requests on one engine and 64 constrained ones on the other, then
/// [`MEASURED_STEPS`] pairs of decode steps, the engine that steps first alternating.
fn round(
    plain: &mut Engine,
    guided: &mut Engine,
    schema: &serde_json::Value,
    round: usize,
) -> Result<(Round, Side), Box<dyn Error>> {
    let mut p = submit(plain, None, round)?;
    let mut g = submit(guided, Some(schema), round)?;
    until_decoding(plain)?;
    until_decoding(guided)?;
    for k in 0..MEASURED_STEPS {
        if k % 2 == 0 {
            measured_step(plain, &mut p)?;
            measured_step(guided, &mut g)?;
        } else {
            measured_step(guided, &mut g)?;
            measured_step(plain, &mut p)?;
        }
    }
    finish(plain, &p)?;
    finish(guided, &g)?;
    if g.mask_us.len() != g.step_ms.len() {
        return Err("a guided step prepared no mask beside its forward pass".into());
    }
    let r = Round {
        pair_ratios: g.step_ms.iter().zip(&p.step_ms).map(|(g, p)| g / p).collect(),
        plain_ms: median(&p.step_ms),
        guided_ms: median(&g.step_ms),
        cpu_ratio: g.cpu_ticks.zip(p.cpu_ticks).map(|(g, p)| g as f64 / p.max(1) as f64),
    };
    Ok((r, g))
}

/// Compile times of the acceptance set's schemas, milliseconds, every repeat of every schema.
fn compile_times(engine: &Engine) -> Result<Vec<f64>, Box<dyn Error>> {
    let set: serde_json::Value = serde_json::from_str(SCHEMAS)?;
    let schemas = set["schemas"].as_array().ok_or("json_schemas.json has no schemas")?;
    let grammars =
        Grammars::new(engine.tokenizer(), engine.model_config().vocab_size, engine.eos_token_ids())?;
    let mut times = Vec::new();
    for _ in 0..COMPILE_REPEATS {
        for s in schemas {
            let constraint = Constraint::JsonSchema(s["schema"].clone());
            let t0 = Instant::now();
            grammars.check(&constraint)?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(times)
}

fn main() -> Result<(), Box<dyn Error>> {
    let figures_dir = support::figures_dir()?;
    let model = model::testing::default_model_fetched()?;
    let mut plain = Engine::new(&model, config())?;
    let mut guided = Engine::new(&model, config())?;

    let compile_ms = compile_times(&guided)?;
    let compile_p50 = median(&compile_ms);
    eprintln!("guided: schema compile p50 {compile_p50:.2} ms over {} compilations", compile_ms.len());

    let schema = catalogue_schema();
    // Warm-up: buffers, page faults, the grammar factory.
    round(&mut plain, &mut guided, &schema, 0)?;
    let mut rounds = Vec::new();
    let (mut mask_us, mut wait_us) = (vec![], vec![]);
    for n in 1..=ROUNDS {
        let (r, g) = round(&mut plain, &mut guided, &schema, n)?;
        eprintln!(
            "guided: round {n}: step {:.1} ms plain, {:.1} ms guided (pairs' median {:.3}; CPU time {:.3}); \
             mask {:.1} µs/seq, wait {:.0} µs",
            r.plain_ms,
            r.guided_ms,
            r.ratio(),
            r.cpu_ratio.unwrap_or(f64::NAN),
            median(&g.mask_us),
            median(&g.wait_us)
        );
        rounds.push(r);
        mask_us.extend(g.mask_us);
        wait_us.extend(g.wait_us);
    }

    let of = |f: fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let mut figures = serde_json::json!({
        "guided.step_overhead_b64": median(&rounds.iter().flat_map(|r| r.pair_ratios.clone()).collect::<Vec<_>>()),
        "guided.mask_us_p50": median(&mask_us),
        "guided.mask_wait_us_p50": median(&wait_us),
        "guided.schema_compile_ms_p50": compile_p50,
        "guided.step_ms_b64_plain": of(|r| r.plain_ms),
        "guided.step_ms_b64_guided": of(|r| r.guided_ms),
    });
    if rounds.iter().all(|r| r.cpu_ratio.is_some()) {
        figures["guided.cpu_overhead_b64"] = of(|r| r.cpu_ratio.unwrap_or(f64::NAN)).into();
    }
    std::fs::write(figures_dir.join("guided.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    let mut md = String::from("## Structured outputs (`guided`)\n\n");
    writeln!(
        md,
        "SmolLM2-135M-Instruct (Q4_1 GGUF, CPU), {BATCH} chat requests decoding together with the model's \
         default sampling parameters, each constrained by a product-catalogue JSON schema or not; \
         two engines stepping in turns, {MEASURED_STEPS} pairs of decode steps per round after {SKIP_STEPS}, {ROUNDS} rounds; the overhead is the median of every pair's ratio, a round's ratio the median of its pairs. \
         `cpu_overhead` is the same ratio of the process's CPU time (the work done, whatever else runs \
         on the machine). Schema compile: the {} compilations of the acceptance set's schemas \
         ({COMPILE_REPEATS} each), first mask included. Command: `cargo xtask bench --only guided`.\n",
        compile_ms.len()
    )?;
    support::figures_table(&mut md, &figures);
    md.push_str("\n| round | plain step (ms) | guided step (ms) | ratio | CPU time ratio |\n|---:|---:|---:|---:|---:|\n");
    for (i, r) in rounds.iter().enumerate() {
        let cpu = r.cpu_ratio.map_or_else(|| "-".to_owned(), |c| format!("{c:.3}"));
        writeln!(md, "| {} | {:.2} | {:.2} | {:.3} | {cpu} |", i + 1, r.plain_ms, r.guided_ms, r.ratio())?;
    }
    std::fs::write(figures_dir.join("guided.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}
