//! Benchmark group `guided`: what structured outputs cost on the default model as users run it
//! (SmolLM2-135M-Instruct, the Q4_1 GGUF, CPU).
//!
//! Decode steps: 64 sequences each constrained by a JSON schema against the same 64 requests
//! unconstrained (same prompts, same sampling parameters: the model's defaults, what a server
//! request that sets none gets). Two engines of the same model hold the two batches and step in
//! turns, the one that goes first alternating; each pair of back-to-back decode steps gives a
//! ratio. Pairing cancels the drift of a shared machine's speed, which moves a whole run's step
//! time by tens of percent. A round runs every step from admission to the whole batch's
//! `DECODE_STEPS`th decode step (`guided_steps/`). The schemas: a product catalogue with every
//! kind of value, and four of the structured-outputs acceptance set
//! (`engine/tests/data/json_schemas.json`) of other shapes, each as the items of a 64-long array,
//! so that no sequence finishes within a round (a batch that shrank would no longer be the plain
//! one's).
//!
//! - `guided.step_overhead_b64_mean`, `guided.step_overhead_b64_p90`: the mean and the 90th
//!   percentile of the ratios of every decode pair of every round of every schema, the first
//!   decode steps (a grammar's costliest masks) included.
//! - `guided.step_overhead_b64`: the catalogue's median ratio over its decode pairs past the
//!   first two, over an odd number of rounds. `guided.cpu_overhead_b64` is the median over those
//!   rounds of the ratio of the process's CPU time over the same steps: the work the masks add,
//!   whatever share of the machine other processes take.
//! - `guided.mask_us_p50`: the median over the catalogue's decode steps of the time spent
//!   computing one sequence's mask (`MaskTimes` in the engine's metrics);
//!   `guided.mask_wait_us_p50` is the time those steps spent on their guides outside the forward
//!   pass (feeding them their tokens, computing masks not ready when the forward ended).
//! - `guided.ttft_overhead`: the time to the first token of one request on an idle engine, from
//!   before its submission (where its schema is compiled) to the step that sampled it, constrained
//!   over unconstrained, paired and alternated alike, over every schema of the acceptance set,
//!   each several times; the median pair, because a neighbour's time slice falls whole into one
//!   of these short measurements and moves the mean from run to run (the fragment gives the mean
//!   and the p90 too). Every pair includes its schema's compilation.
//! - `guided.schema_compile_ms_p50`: the median time to compile one of the acceptance set's
//!   schemas into a guide, its first mask included: what admission does for a request.
//!
//! Writes `$BENCH_FIGURES_DIR/guided.json` and the fragment `guided.md`.

use std::error::Error;
use std::fmt::Write as _;
use std::time::Instant;

use engine::structured::Grammars;
use engine::{Constraint, Engine, EngineConfig, KvCacheSize};

mod guided_steps;
mod support;

use guided_steps::{BATCH, DECODE_STEPS, Round, SKIP_STEPS, mean, median, percentile};

/// Rounds of the catalogue (odd, for the median over rounds).
const ROUNDS: usize = 5;
/// Rounds of each of the acceptance set's schemas.
const SET_ROUNDS: usize = 3;
/// The acceptance set's schemas the decode steps run, by topic: nested objects through `$ref`,
/// a string under a pattern, alternatives (`anyOf`) told apart by a constant, and an object of
/// arrays of objects reached through a root `$ref`.
const STEP_TOPICS: [&str; 4] = ["a line segment", "a product code", "a shape", "an order"];
/// Compilations of each acceptance schema.
const COMPILE_REPEATS: usize = 5;
/// First-token pairs of each acceptance schema.
const TTFT_REPEATS: usize = 3;

/// The acceptance set: `{"schemas": [{"topic", "schema"}]}`.
const SCHEMAS: &str = include_str!("../tests/data/json_schemas.json");

/// What the 64 constrained sequences produce: a catalogue long enough that none finishes within
/// a round, with every kind of value (keys, integers and numbers with bounds, bounded strings,
/// enums, arrays, booleans) so that the masks cost what they cost in general.
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

/// The acceptance set's `(topic, schema)` pairs.
fn acceptance_set() -> Result<Vec<(String, serde_json::Value)>, Box<dyn Error>> {
    let set: serde_json::Value = serde_json::from_str(SCHEMAS)?;
    let schemas = set["schemas"].as_array().ok_or("json_schemas.json has no schemas")?;
    schemas
        .iter()
        .map(|s| {
            let topic = s["topic"].as_str().ok_or("a schema without a topic")?;
            Ok((topic.to_owned(), s["schema"].clone()))
        })
        .collect()
}

/// `schema` as the items of an array of exactly 64, its `$defs` moved to the root where its
/// `$ref`s look for them.
fn repeated(schema: &serde_json::Value) -> serde_json::Value {
    let mut item = schema.clone();
    let defs = item.as_object_mut().and_then(|o| o.remove("$defs"));
    let mut array = serde_json::json!({"type": "array", "minItems": 64, "maxItems": 64, "items": item});
    if let Some(defs) = defs {
        array["$defs"] = defs;
    }
    array
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

/// Compile times of the acceptance set's schemas, milliseconds, every repeat of every schema.
fn compile_times(engine: &Engine, set: &[(String, serde_json::Value)]) -> Result<Vec<f64>, Box<dyn Error>> {
    let grammars =
        Grammars::new(engine.tokenizer(), engine.model_config().vocab_size, engine.eos_token_ids())?;
    let mut times = Vec::new();
    for _ in 0..COMPILE_REPEATS {
        for (_, schema) in set {
            let constraint = Constraint::JsonSchema(schema.clone());
            let t0 = Instant::now();
            grammars.check(&constraint)?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(times)
}

/// The rounds of one schema.
struct Schema {
    topic: String,
    rounds: Vec<Round>,
}

impl Schema {
    fn ratios(&self) -> Vec<f64> {
        self.rounds.iter().flat_map(|r| r.pair_ratios.iter().copied()).collect()
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let started = Instant::now();
    let figures_dir = support::figures_dir()?;
    let model = model::testing::default_model_fetched()?;
    let mut plain = Engine::new(&model, config())?;
    let mut guided = Engine::new(&model, config())?;

    let set = acceptance_set()?;
    let compile_ms = compile_times(&guided, &set)?;
    let compile_p50 = median(&compile_ms);
    eprintln!("guided: schema compile p50 {compile_p50:.2} ms over {} compilations", compile_ms.len());

    let mut step_schemas = vec![("a product catalogue".to_owned(), catalogue_schema(), ROUNDS)];
    for topic in STEP_TOPICS {
        let (_, schema) = set.iter().find(|(t, _)| t == topic).ok_or(format!("no schema {topic:?}"))?;
        step_schemas.push((topic.to_owned(), repeated(schema), SET_ROUNDS));
    }
    // Warm-up: buffers, page faults, the grammar factory (built for the first constrained request).
    guided_steps::round(&mut plain, &mut guided, &catalogue_schema(), "warm-up")?;
    let mut schemas = Vec::new();
    let (mut mask_us, mut wait_us) = (vec![], vec![]);
    for (s, (topic, schema, rounds)) in step_schemas.iter().enumerate() {
        let mut done = Schema { topic: topic.clone(), rounds: Vec::new() };
        for n in 1..=*rounds {
            let (r, g) = guided_steps::round(&mut plain, &mut guided, schema, &format!("{s}-{n}"))?;
            eprintln!(
                "guided: {topic}, round {n}: step {:.1} ms plain, {:.1} ms guided; ratios mean {:.3}, \
                 median past {SKIP_STEPS} {:.3}, max {:.3}; CPU time {:.3}; mask {:.1} µs/seq, wait {:.0} µs",
                r.plain_ms,
                r.guided_ms,
                mean(&r.pair_ratios),
                median(r.past_skip()),
                percentile(&r.pair_ratios, 1.0),
                r.cpu_ratio.unwrap_or(f64::NAN),
                median(g.mask_us.get(SKIP_STEPS..).unwrap_or(&[])),
                median(g.wait_us.get(SKIP_STEPS..).unwrap_or(&[])),
            );
            if s == 0 {
                mask_us.extend(g.mask_us.get(SKIP_STEPS..).unwrap_or(&[]));
                wait_us.extend(g.wait_us.get(SKIP_STEPS..).unwrap_or(&[]));
            }
            done.rounds.push(r);
        }
        schemas.push(done);
    }

    let (ttft_plain, ttft_guided) = guided_steps::ttft_pairs(&mut plain, &mut guided, &set, TTFT_REPEATS)?;
    let ttft: Vec<f64> = ttft_guided.iter().zip(&ttft_plain).map(|(g, p)| g / p).collect();
    eprintln!(
        "guided: first token over {} pairs: mean {:.3}, median {:.3}, p90 {:.3}",
        ttft.len(),
        mean(&ttft),
        median(&ttft),
        percentile(&ttft, 0.9)
    );

    let catalogue = schemas.first().ok_or("no catalogue rounds")?;
    let all: Vec<f64> = schemas.iter().flat_map(Schema::ratios).collect();
    let of = |f: fn(&Round) -> f64| median(&catalogue.rounds.iter().map(f).collect::<Vec<_>>());
    let past_skip: Vec<f64> = catalogue.rounds.iter().flat_map(|r| r.past_skip().to_vec()).collect();
    let mut figures = serde_json::json!({
        "guided.step_overhead_b64": median(&past_skip),
        "guided.step_overhead_b64_mean": mean(&all),
        "guided.step_overhead_b64_p90": percentile(&all, 0.9),
        "guided.ttft_overhead": median(&ttft),
        "guided.mask_us_p50": median(&mask_us),
        "guided.mask_wait_us_p50": median(&wait_us),
        "guided.schema_compile_ms_p50": compile_p50,
        "guided.step_ms_b64_plain": of(|r| r.plain_ms),
        "guided.step_ms_b64_guided": of(|r| r.guided_ms),
    });
    if catalogue.rounds.iter().all(|r| r.cpu_ratio.is_some()) {
        figures["guided.cpu_overhead_b64"] = of(|r| r.cpu_ratio.unwrap_or(f64::NAN)).into();
    }
    std::fs::write(figures_dir.join("guided.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    let md = report(&figures, &schemas, (&ttft_plain, &ttft_guided, &ttft), compile_ms.len())?;
    std::fs::write(figures_dir.join("guided.md"), md)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    eprintln!("guided: {:.0} s in all", started.elapsed().as_secs_f64());
    Ok(())
}

/// The Markdown fragment: the setting, the figures, the step ratios per schema, the catalogue's
/// rounds and the first-token times.
fn report(
    figures: &serde_json::Value,
    schemas: &[Schema],
    (ttft_plain, ttft_guided, ttft): (&[f64], &[f64], &[f64]),
    compilations: usize,
) -> Result<String, Box<dyn Error>> {
    let mut md = String::from("## Structured outputs (`guided`)\n\n");
    writeln!(
        md,
        "SmolLM2-135M-Instruct (Q4_1 GGUF, CPU), {BATCH} chat requests decoding together with the model's \
         default sampling parameters, each constrained by a JSON schema or not; two engines stepping in \
         turns, every step from admission to the {DECODE_STEPS}th decode step of the whole batch. \
         `step_overhead_b64_mean` and `_p90` take the guided-over-plain ratio of every decode pair of \
         every schema; `step_overhead_b64` is the catalogue's median past its first {SKIP_STEPS} decode \
         steps, `cpu_overhead` the same ratio of the process's CPU time (the work done, whatever else \
         runs on the machine). The acceptance set's schemas run as the items of a 64-long array, so \
         that no sequence finishes within a round. `ttft_overhead`: the median pair of one request \
         on an idle engine, from before its submission (the schema's compilation) to the step that \
         sampled its first token, over the same request unconstrained; every schema of the \
         acceptance set, {TTFT_REPEATS} times each, after a warm-up that built the grammar factory. \
         Schema compile: the {compilations} compilations of the acceptance set's schemas \
         ({COMPILE_REPEATS} each), first mask included. Command: `cargo xtask bench --only guided`.\n",
    )?;
    support::figures_table(&mut md, figures);
    md.push_str(
        "\n| schema | rounds | decode pairs | mean ratio | median | p90 | max | plain step (ms) | guided step (ms) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in schemas {
        let r = s.ratios();
        let ms = |f: fn(&Round) -> f64| median(&s.rounds.iter().map(f).collect::<Vec<_>>());
        writeln!(
            md,
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} |",
            s.topic,
            s.rounds.len(),
            r.len(),
            mean(&r),
            median(&r),
            percentile(&r, 0.9),
            percentile(&r, 1.0),
            ms(|r| r.plain_ms),
            ms(|r| r.guided_ms),
        )?;
    }
    md.push_str(
        "\n| catalogue round | plain step (ms) | guided step (ms) | median ratio past the first steps \
         | CPU time ratio |\n|---:|---:|---:|---:|---:|\n",
    );
    for (i, r) in schemas.first().map_or(&[][..], |s| &s.rounds[..]).iter().enumerate() {
        let cpu = r.cpu_ratio.map_or_else(|| "-".to_owned(), |c| format!("{c:.3}"));
        writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.3} | {cpu} |",
            i + 1,
            r.plain_ms,
            r.guided_ms,
            median(r.past_skip())
        )?;
    }
    writeln!(
        md,
        "\nFirst token, constrained over unconstrained, {} pairs: mean {:.3}, median {:.3}, p90 {:.3}, max {:.3}; \
         plain {:.1} ms and guided {:.1} ms at the median, guided {:.1} ms at the p90.",
        ttft.len(),
        mean(ttft),
        median(ttft),
        percentile(ttft, 0.9),
        percentile(ttft, 1.0),
        median(ttft_plain),
        median(ttft_guided),
        percentile(ttft_guided, 0.9),
    )?;
    Ok(md)
}
