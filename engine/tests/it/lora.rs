//! LoRA through the engine, over the tiny Llama and its two PEFT adapters
//! (`model/tests/data/lora/`): each request gets PEFT's greedy tokens whether it runs alone or
//! in a batch mixing the base model and both adapters (chunked prefill, decodes); prefix-cache
//! hits never cross adapters; `max_loras` keeps a second adapter waiting; a request holding an
//! adapter that is unloaded finishes under it, and one unloaded and loaded again answers the
//! same; bad adapters and
//! names are typed errors that leave the engine serving and no block held.

use std::path::{Path, PathBuf};

use engine::{
    DType, Engine, EngineConfig, KvCacheSize, LoraConfig, LoraError, LoraRequest, Prompt, RequestError,
    RequestOptions, SamplingParams,
};
use serde_json::Value;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data")
}

fn adapter_dir(name: &str) -> PathBuf {
    data().join("lora/llama").join(name)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// (prompt, greedy tokens) of each of the three prompts under `adapter` (`None`: the base's).
fn expected(adapter: Option<&str>) -> Vec<(Vec<u32>, Vec<u32>)> {
    let path = match adapter {
        Some(_) => data().join("lora/llama/expected.json"),
        None => data().join("families/llama/expected.json"),
    };
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("parse");
    let gens = match adapter {
        Some(name) => &v["adapters"][name],
        None => &v["generations"],
    };
    gens.as_array()
        .expect("list")
        .iter()
        .take(3)
        .map(|g| (ids(&g["prompt_ids"]), ids(&g["greedy_ids"])))
        .collect()
}

fn engine(lora: Option<LoraConfig>, chunk: usize) -> Engine {
    let config = EngineConfig {
        kv_dtype: DType::F32,
        kv_cache: KvCacheSize::Blocks(96),
        max_num_batched_tokens: chunk,
        log_interval: std::time::Duration::ZERO,
        lora,
        ..EngineConfig::default()
    };
    Engine::new(&data().join("families/llama"), config).expect("engine")
}

fn lora_config(max_loras: usize) -> LoraConfig {
    LoraConfig { max_loras, max_lora_rank: 16, max_cpu_loras: Some(4) }
}

fn with_adapter(name: Option<&str>) -> RequestOptions {
    match name {
        Some(name) => RequestOptions::default().with_lora(LoraRequest::at(name, adapter_dir(name))),
        None => RequestOptions::default(),
    }
}

/// Adds each (id, prompt, adapter) and steps until all finish: each request's tokens, and the
/// steps in which each produced tokens.
fn run(
    engine: &mut Engine,
    requests: &[(String, Vec<u32>, Option<&str>)],
) -> Vec<(Vec<u32>, Vec<usize>, usize)> {
    let params = SamplingParams { max_tokens: Some(8), ignore_eos: true, ..SamplingParams::greedy(8) };
    for (id, prompt, adapter) in requests {
        engine
            .add_request_with_options(
                id.clone(),
                Prompt::Tokens(prompt.clone()),
                params.clone(),
                with_adapter(*adapter),
            )
            .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let mut out: Vec<(Vec<u32>, Vec<usize>, usize)> = vec![(Vec::new(), Vec::new(), 0); requests.len()];
    let mut step = 0;
    while engine.has_unfinished() {
        for o in engine.step().expect("step") {
            let i = requests.iter().position(|(id, ..)| *id == o.request_id).expect("known id");
            let tokens: Vec<u32> = o.outputs.iter().flat_map(|c| c.token_ids.iter().copied()).collect();
            if !tokens.is_empty() {
                out[i].1.push(step);
            }
            out[i].0.extend(tokens);
            out[i].2 = o.num_cached_tokens;
        }
        step += 1;
        assert!(step < 1000, "the engine never finished");
    }
    assert!(engine.kv_is_idle(), "blocks leaked");
    out
}

#[test]
fn each_request_gets_peft_tokens_alone_and_in_a_batch_mixing_adapters() {
    let adapters = [None, Some("sql"), Some("chat")];
    let mut all = Vec::new();
    for adapter in adapters {
        for (p, (prompt, greedy)) in expected(adapter).into_iter().enumerate() {
            all.push((format!("{}-{p}", adapter.unwrap_or("base")), prompt, adapter, greedy));
        }
    }
    // Alone, each prompt whole.
    let mut alone = engine(Some(lora_config(4)), 2048);
    for (id, prompt, adapter, greedy) in &all {
        let got = run(&mut alone, &[(id.clone(), prompt.clone(), *adapter)]);
        assert_eq!(&got[0].0, greedy, "{id} alone");
    }
    // All nine in one batch, prefilled 7 tokens a step beside the others' decodes.
    let mut mixed = engine(Some(lora_config(4)), 7);
    let requests: Vec<_> =
        all.iter().map(|(id, prompt, adapter, _)| (id.clone(), prompt.clone(), *adapter)).collect();
    let got = run(&mut mixed, &requests);
    for ((id, _, _, greedy), (tokens, _, _)) in all.iter().zip(&got) {
        assert_eq!(tokens, greedy, "{id} in the mixed batch");
    }
    assert_eq!(mixed.loras().list().len(), 2, "both adapters registered from their requests");
}

/// llama.cpp's GGUF of the `sql` adapter (no rsLoRA, so llama.cpp's scale is PEFT's) gives
/// PEFT's tokens, beside the PEFT folder of the same adapter in one batch.
#[test]
fn a_lora_gguf_serves_beside_its_peft_folder() {
    let mut engine = engine(Some(lora_config(4)), 2048);
    let params = SamplingParams { max_tokens: Some(8), ignore_eos: true, ..SamplingParams::greedy(8) };
    let (prompt, greedy) = expected(Some("sql")).swap_remove(0);
    for (id, path) in [("gguf", data().join("lora/llama/sql.gguf")), ("folder", adapter_dir("sql"))] {
        let options = RequestOptions::default().with_lora(LoraRequest::at(id, path));
        engine
            .add_request_with_options(id, Prompt::Tokens(prompt.clone()), params.clone(), options)
            .expect(id);
    }
    let mut tokens: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    while engine.has_unfinished() {
        for o in engine.step().expect("step") {
            tokens
                .entry(o.request_id.clone())
                .or_default()
                .extend(o.outputs.iter().flat_map(|c| c.token_ids.clone()));
        }
    }
    assert_eq!((&tokens["gguf"], &tokens["folder"]), (&greedy, &greedy));
}

#[test]
fn prefix_cache_hits_never_cross_adapters() {
    let mut engine = engine(Some(lora_config(4)), 2048);
    let (prompt, _) = expected(None).swap_remove(2); // 64 tokens: four full blocks
    let cached =
        |engine: &mut Engine, id: &str, adapter| run(engine, &[(id.into(), prompt.clone(), adapter)])[0].2;
    assert_eq!(cached(&mut engine, "first-sql", Some("sql")), 0);
    assert_eq!(cached(&mut engine, "then-chat", Some("chat")), 0, "chat read sql's blocks");
    assert_eq!(cached(&mut engine, "then-base", None), 0, "the base read an adapter's blocks");
    assert!(cached(&mut engine, "sql-again", Some("sql")) >= 48, "the same adapter shares its blocks");
    assert!(cached(&mut engine, "base-again", None) >= 48, "the base shares its blocks");
}

#[test]
fn max_loras_keeps_a_second_adapter_waiting_until_the_first_finishes() {
    let mut engine = engine(Some(lora_config(1)), 2048);
    let (prompt, _) = expected(None).swap_remove(0);
    let got = run(
        &mut engine,
        &[
            ("a".into(), prompt.clone(), Some("sql")),
            ("b".into(), prompt.clone(), Some("chat")),
            ("c".into(), prompt.clone(), Some("sql")),
            ("d".into(), prompt.clone(), None),
        ],
    );
    let (a, b, c, d) = (&got[0].1, &got[1].1, &got[2].1, &got[3].1);
    // `b` (chat) waits until `a` (sql) left; admission keeps arrival order (nobody starves), so
    // `c` and `d` wait behind `b`; `c` (sql) only once `b` left, and `d` (base, no slot) with it.
    assert!(b.first() > a.last(), "b ran beside a: a {a:?} b {b:?}");
    assert!(c.first() > b.last(), "c (sql) ran beside b (chat): b {b:?} c {c:?}");
    assert_eq!(d.first(), c.first(), "the base model needs no slot: c {c:?} d {d:?}");
}

#[test]
fn adapters_load_unload_and_reload_with_the_same_answers() {
    let mut engine = engine(Some(lora_config(2)), 2048);
    let loras = engine.loras();
    loras.load("sql", &adapter_dir("sql")).expect("load");
    assert_eq!(
        loras.load("sql", &adapter_dir("sql")).expect_err("twice"),
        LoraError::AlreadyLoaded("sql".into())
    );
    let (prompt, greedy) = expected(Some("sql")).swap_remove(1);
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let by_name = RequestOptions::default().with_lora(LoraRequest::named("sql"));
    engine
        .add_request_with_options("held", Prompt::Tokens(prompt.clone()), params.clone(), by_name.clone())
        .expect("add");
    let counts =
        |engine: &Engine| engine.loras().list().iter().map(|l| (l.waiting, l.running)).collect::<Vec<_>>();
    assert_eq!(counts(&engine), [(1, 0)], "waiting");
    engine.step().expect("the first step");
    assert_eq!(counts(&engine), [(0, 1)], "running");
    assert_eq!(engine.loras().unload("sql"), Ok(1), "one request holds it");
    let mut held = Vec::new();
    while engine.has_unfinished() {
        held.extend(
            engine
                .step()
                .expect("step")
                .iter()
                .flat_map(|o| o.outputs.iter().flat_map(|c| c.token_ids.clone())),
        );
    }
    assert_eq!(held[..], greedy[1..], "the held request finished under the unloaded adapter");
    assert!(engine.kv_is_idle());
    let err = engine.add_request_with_options(
        "gone",
        Prompt::Tokens(prompt.clone()),
        params.clone(),
        by_name.clone(),
    );
    assert!(matches!(err, Err(RequestError::Lora { source: LoraError::NotFound(_), .. })), "{err:?}");
    engine.loras().load("sql", &adapter_dir("sql")).expect("load again");
    let got = run(&mut engine, &[("again".into(), prompt.clone(), Some("sql"))]);
    assert_eq!(got[0].0, greedy, "reloaded adapter");
}

#[test]
fn only_max_cpu_loras_adapters_stay_in_memory_and_dropped_ones_are_read_again() {
    let mut engine =
        engine(Some(LoraConfig { max_loras: 1, max_lora_rank: 16, max_cpu_loras: Some(1) }), 2048);
    let (prompt, greedy) = expected(Some("chat")).swap_remove(0);
    engine.loras().load("chat", &adapter_dir("chat")).expect("load chat");
    engine.loras().load("sql", &adapter_dir("sql")).expect("load sql");
    let loaded: Vec<(String, bool)> = engine.loras().list().into_iter().map(|i| (i.name, i.loaded)).collect();
    assert_eq!(loaded, [("chat".to_owned(), false), ("sql".to_owned(), true)], "the older one was dropped");
    let got = run(&mut engine, &[("chat".into(), prompt, Some("chat"))]);
    assert_eq!(got[0].0, greedy, "chat read again from its folder");
}

#[test]
fn bad_adapters_and_names_are_typed_errors_and_the_engine_keeps_serving() {
    let (prompt, greedy) = expected(None).swap_remove(0);
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let add = |engine: &mut Engine, options: RequestOptions| {
        engine.add_request_with_options("x", Prompt::Tokens(prompt.clone()), params.clone(), options)
    };
    let mut off = engine(None, 2048);
    let err = add(&mut off, with_adapter(Some("sql")));
    assert!(matches!(err, Err(RequestError::Lora { source: LoraError::NotEnabled, .. })), "{err:?}");
    assert_eq!(off.loras().load("sql", &adapter_dir("sql")), Err(LoraError::NotEnabled));

    let mut engine = engine(Some(LoraConfig { max_loras: 1, max_lora_rank: 8, max_cpu_loras: None }), 2048);
    let cases = [
        (RequestOptions::default().with_lora(LoraRequest::named("nobody")), "no LoRA adapter named"),
        (
            RequestOptions::default().with_lora(LoraRequest::at("chat", adapter_dir("chat"))),
            "above max_lora_rank 8",
        ),
        (
            RequestOptions::default().with_lora(LoraRequest::at("q", data().join("lora/qwen2/sql"))),
            "has shape",
        ),
        (
            RequestOptions::default().with_lora(LoraRequest::at("none", data().join("families/llama"))),
            "adapter_config.json",
        ),
    ];
    for (options, says) in cases {
        let err = add(&mut engine, options).expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
    }
    assert!(engine.loras().list().is_empty(), "nothing registered by a refusal");
    let err = engine.loras().load("", &adapter_dir("sql")).expect_err("empty name");
    assert_eq!(err, LoraError::BadName(String::new()));
    let got = run(&mut engine, &[("base".into(), prompt.clone(), None)]);
    assert_eq!(got[0].0, greedy, "the engine still serves the base model");
}

#[test]
fn a_bad_lora_config_is_a_config_error() {
    for (config, says) in [
        (LoraConfig { max_loras: 0, max_lora_rank: 8, max_cpu_loras: None }, "max_loras"),
        (LoraConfig { max_loras: 2, max_lora_rank: 0, max_cpu_loras: None }, "max_lora_rank"),
        (LoraConfig { max_loras: 2, max_lora_rank: 8, max_cpu_loras: Some(1) }, "max_cpu_loras"),
    ] {
        let config =
            EngineConfig { lora: Some(config), kv_cache: KvCacheSize::Blocks(16), ..EngineConfig::default() };
        let Err(err) = Engine::new(&data().join("families/llama"), config) else {
            panic!("{says}: accepted")
        };
        assert!(err.to_string().contains(says), "{err}");
    }
}
