//! Benchmark group `guided`: what structured outputs cost on the default model as users run it
//! (SmolLM2-135M-Instruct, the Q4_1 GGUF, CPU).
//!
//! - `guided.step_overhead_b64`: the median decode-step time of 64 sequences each constrained by
//!   a JSON schema over that of the same 64 requests unconstrained (same prompts, same sampling
//!   parameters: the model's defaults, what a server request that sets none gets), measured in
//!   the same round; the median over an odd number of rounds, the order of the two runs
//!   alternating between rounds. `guided.cpu_overhead_b64` is the same ratio of the process's CPU
//!   time over those steps: the work the masks add, whatever share of the machine other
//!   processes take.
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

/// One round: the median step of each run, and their CPU times' ratio.
#[derive(Debug)]
struct Round {
    plain_ms: f64,
    guided_ms: f64,
    cpu_ratio: Option<f64>,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.guided_ms / self.plain_ms
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { f64::NAN } else { s[s.len() / 2] }
}

/// One run's decode steps with all 64 sequences running: each step's time, and for a guided run
/// the mask time per sequence and the step's time on guides outside its forward (microseconds); the process's
/// CPU time over them (clock ticks), where the system reports it.
#[derive(Debug, Default)]
struct Run {
    step_ms: Vec<f64>,
    mask_us: Vec<f64>,
    wait_us: Vec<f64>,
    cpu_ticks: Option<u64>,
}

/// User + system CPU time of this process so far, in clock ticks (Linux's `/proc/self/stat`).
/// On a machine other processes load, a step's wall time counts their share too, and the mask
/// worker, one more thread, gets a share of its own; the CPU time is the work the step did.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    Some(rest.next()?.parse::<u64>().ok()? + rest.next()?.parse::<u64>().ok()?)
}

/// Submits the 64 requests (constrained by `schema` if given), steps until they all decode,
/// measures [`MEASURED_STEPS`] decode steps, then aborts them all.
fn run(engine: &mut Engine, schema: Option<&serde_json::Value>, round: usize) -> Result<Run, Box<dyn Error>> {
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
    let mut out = Run::default();
    let (mut decoding, mut cpu_start) = (0, None);
    while out.step_ms.len() < MEASURED_STEPS {
        let before = engine.metrics();
        let t0 = Instant::now();
        let outputs = engine.step()?;
        let step_ms = t0.elapsed().as_secs_f64() * 1e3;
        let after = engine.metrics();
        if outputs.iter().any(|o| o.finished) {
            return Err(format!(
                "a sequence finished within the measured steps: {:?}",
                outputs.iter().find(|o| o.finished)
            )
            .into());
        }
        let prefill = after.prompt_tokens > before.prompt_tokens;
        if prefill || after.gauges.num_running != BATCH {
            continue;
        }
        decoding += 1;
        if decoding <= SKIP_STEPS {
            cpu_start = cpu_ticks();
            continue;
        }
        out.step_ms.push(step_ms);
        let (b, a) = (before.guided_masks, after.guided_masks);
        if a.masks > b.masks {
            out.mask_us.push((a.compute_s - b.compute_s) * 1e6 / (a.masks - b.masks) as f64);
            out.wait_us.push((a.wait_s - b.wait_s) * 1e6);
        }
    }
    out.cpu_ticks = cpu_ticks().zip(cpu_start).map(|(end, start)| end - start);
    for id in &ids {
        engine.abort(id)?;
    }
    while engine.has_unfinished() {
        engine.step()?;
    }
    if schema.is_some() && out.mask_us.len() != out.step_ms.len() {
        return Err("a guided step prepared no mask beside its forward pass".into());
    }
    Ok(out)
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
    let mut engine = Engine::new(&model, config())?;

    let compile_ms = compile_times(&engine)?;
    let compile_p50 = median(&compile_ms);
    eprintln!("guided: schema compile p50 {compile_p50:.2} ms over {} compilations", compile_ms.len());

    let schema = catalogue_schema();
    // Warm-up: buffers, page faults, the grammar factory.
    run(&mut engine, None, 0)?;
    run(&mut engine, Some(&schema), 0)?;
    let mut rounds = Vec::new();
    let (mut mask_us, mut wait_us) = (vec![], vec![]);
    for round in 1..=ROUNDS {
        let (plain, guided) = if round % 2 == 1 {
            let p = run(&mut engine, None, round)?;
            (p, run(&mut engine, Some(&schema), round)?)
        } else {
            let g = run(&mut engine, Some(&schema), round)?;
            (run(&mut engine, None, round)?, g)
        };
        let r = Round {
            plain_ms: median(&plain.step_ms),
            guided_ms: median(&guided.step_ms),
            cpu_ratio: guided.cpu_ticks.zip(plain.cpu_ticks).map(|(g, p)| g as f64 / p.max(1) as f64),
        };
        eprintln!(
            "guided: round {round}: step {:.1} ms plain, {:.1} ms guided ({:.3}; CPU time {:.3}); mask {:.1} \
             µs/seq, wait {:.0} µs",
            r.plain_ms,
            r.guided_ms,
            r.ratio(),
            r.cpu_ratio.unwrap_or(f64::NAN),
            median(&guided.mask_us),
            median(&guided.wait_us)
        );
        rounds.push(r);
        mask_us.extend(guided.mask_us);
        wait_us.extend(guided.wait_us);
    }

    let of = |f: fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let mut figures = serde_json::json!({
        "guided.step_overhead_b64": of(Round::ratio),
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
         {MEASURED_STEPS} decode steps per run after {SKIP_STEPS}, {ROUNDS} rounds (median). \
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
