//! Pooling requests (embeddings) against transformers: every tiny family's final hidden states
//! pooled last-token and mean, raw, normalised and cut to `dimensions`
//! (`model/tests/data/families/<name>/embeddings.json`, made by `make_embeddings.py`), computed
//! through the scheduler in small prefill chunks, alone and in one batch beside generating
//! requests, with and without the prefix cache; refusals leave the engine serving.

use std::path::{Path, PathBuf};

use engine::{
    DType, Engine, EngineConfig, KvCacheSize, PoolingParams, PoolingType, Prompt, RequestError,
    RequestOptions,
};
use serde_json::Value;

use crate::support::forced;

fn family_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data/families").join(name)
}

/// One prompt's reference vectors.
struct Reference {
    prompt: Vec<u32>,
    last: Vec<f32>,
    mean: Vec<f32>,
    last_normalized: Vec<f32>,
    mean_dim32_normalized: Vec<f32>,
}

fn references(name: &str) -> Vec<Reference> {
    let path = family_dir(name).join("embeddings.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()));
    let floats = |v: &Value| -> Vec<f32> {
        v.as_array().expect("a list").iter().map(|x| x.as_f64().expect("a number") as f32).collect()
    };
    v["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| Reference {
            prompt: p["prompt_ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect(),
            last: floats(&p["last"]),
            mean: floats(&p["mean"]),
            last_normalized: floats(&p["last_normalized"]),
            mean_dim32_normalized: floats(&p["mean_dim32_normalized"]),
        })
        .collect()
}

/// A prompt as long as the model (no room for a generated token) pools; one token longer is
/// too long.
#[test]
fn a_prompt_of_the_models_whole_length_pools() {
    let refs = references("llama");
    let len = refs[0].prompt.len();
    let mut engine = engine_at("llama", 64, false, Some(len));
    let got = engine.embed(vec![Prompt::Tokens(refs[0].prompt.clone())], LAST_RAW).expect("embed");
    assert_close(got[0].as_ref().expect("embedding"), &refs[0].last, "prompt = max_model_len");
    let longer = [refs[0].prompt.clone(), vec![refs[0].prompt[0]]].concat();
    let got = engine.embed(vec![Prompt::Tokens(longer)], LAST_RAW).expect("embed call");
    assert!(matches!(got[0], Err(RequestError::TooLong { .. })), "{:?}", got[0].as_ref().err());
    // Generation still needs room for its tokens.
    let out = engine.generate(vec![Prompt::Tokens(refs[0].prompt.clone())], &forced(1)).expect("generate");
    assert!(matches!(out[0], Err(RequestError::TooLong { .. })));
    assert!(engine.kv_is_idle());
}

/// An f32-cache engine over family `name`, prefilling at most `chunk` tokens a step.
fn engine(name: &str, chunk: usize, prefix_caching: bool) -> Engine {
    engine_at(name, chunk, prefix_caching, None)
}

/// [`engine`] serving `max_model_len` (the model's own when `None`).
fn engine_at(name: &str, chunk: usize, prefix_caching: bool, max_model_len: Option<usize>) -> Engine {
    let config = EngineConfig {
        max_model_len,
        kv_dtype: DType::F32,
        kv_cache: KvCacheSize::Blocks(128),
        max_num_batched_tokens: chunk,
        enable_prefix_caching: prefix_caching,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    Engine::new(&family_dir(name), config).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `‖got − want‖ / ‖want‖ ≤ 1e-4`, and the same length.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let diff: f64 = got.iter().zip(want).map(|(&g, &w)| f64::from(g - w).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = want.iter().map(|&w| f64::from(w).powi(2)).sum::<f64>().sqrt();
    assert!(diff <= 1e-4 * norm, "{what}: relative error {:.3e}", diff / norm);
}

const LAST_RAW: PoolingParams =
    PoolingParams { pooling_type: PoolingType::Last, normalize: false, dimensions: None };
const MEAN_RAW: PoolingParams =
    PoolingParams { pooling_type: PoolingType::Mean, normalize: false, dimensions: None };
const LAST_NORMALIZED: PoolingParams =
    PoolingParams { pooling_type: PoolingType::Last, normalize: true, dimensions: None };
const MEAN_DIM32: PoolingParams =
    PoolingParams { pooling_type: PoolingType::Mean, normalize: true, dimensions: Some(32) };

/// Each pooling of every prompt of `refs`, embedded in one batch by `engine`.
fn check_all(engine: &mut Engine, refs: &[Reference], what: &str) {
    let prompts: Vec<Prompt> = refs.iter().map(|r| Prompt::Tokens(r.prompt.clone())).collect();
    for (params, want, label) in [
        (LAST_RAW, refs.iter().map(|r| &r.last).collect::<Vec<_>>(), "last"),
        (MEAN_RAW, refs.iter().map(|r| &r.mean).collect(), "mean"),
        (LAST_NORMALIZED, refs.iter().map(|r| &r.last_normalized).collect(), "last normalized"),
        (MEAN_DIM32, refs.iter().map(|r| &r.mean_dim32_normalized).collect(), "mean dim 32 normalized"),
    ] {
        let got = engine.embed(prompts.clone(), params).unwrap_or_else(|e| panic!("{what}: {e}"));
        for ((got, want), r) in got.into_iter().zip(want).zip(refs) {
            let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_close(&got, want, &format!("{what}, {label}, prompt of {} tokens", r.prompt.len()));
        }
    }
    assert!(engine.kv_is_idle(), "{what}: blocks held after the embeddings");
}

/// Family `name`'s references by the context they are served at: Phi-3's LongRoPE rotates by its
/// short factors up to `original_max_position_embeddings` (32) and by its long ones past it, in
/// transformers by the sequence's length and in the engine (as vLLM) by the served context.
fn by_context(name: &str) -> Vec<(Vec<Reference>, Option<usize>)> {
    let refs = references(name);
    if name != "phi3" {
        return vec![(refs, None)];
    }
    let (short, long): (Vec<Reference>, Vec<Reference>) = refs.into_iter().partition(|r| r.prompt.len() < 32);
    vec![(short, Some(32)), (long, Some(128))]
}

#[test]
fn every_family_pools_transformers_hidden_states_in_chunks() {
    for name in ["llama", "llama-tied", "mistral", "qwen2", "qwen3", "gemma3", "phi3"] {
        for (refs, context) in by_context(name) {
            assert!(!refs.is_empty(), "{name}: no reference at context {context:?}");
            // Chunks of 7 tokens: a prompt's mean gathers rows from many steps.
            let mut chunked = engine_at(name, 7, false, context);
            check_all(&mut chunked, &refs, &format!("{name}, chunks of 7"));
            // One step holds several requests' rows (and, past 64 tokens, chunks again).
            let mut batched = engine_at(name, 64, false, context);
            check_all(&mut batched, &refs, &format!("{name}, chunks of 64"));
        }
    }
}

#[test]
fn pooling_beside_generation_and_over_the_prefix_cache_gives_the_same_vectors() {
    let name = "mistral";
    let refs = references(name);
    let mut engine = engine(name, 24, true);
    // A generating request runs through the same steps as the pooled ones.
    engine.add_request("gen", refs[2].prompt.clone(), forced(12)).expect("generate");
    // Twice each: the second time the prefix cache holds the prompt (last pooling may take
    // the hits; mean pooling computes every position again).
    check_all(&mut engine, &refs, "beside generation, prefix cache cold");
    check_all(&mut engine, &refs, "prefix cache warm");
    let hits = engine.metrics().gauges.prefix_hits;
    assert!(hits > 0, "the second pass took no prefix-cache hit");
}

#[test]
fn bad_pooling_requests_are_typed_errors_and_leave_the_engine_serving() {
    let refs = references("llama");
    let mut engine = engine("llama", 64, true);
    let hidden = refs[0].last.len();
    for dimensions in [0, hidden + 1, usize::MAX] {
        let params = PoolingParams { dimensions: Some(dimensions), ..PoolingParams::default() };
        let options = RequestOptions::default().with_pooling(params);
        match engine.add_request_with_options("bad", refs[0].prompt.clone(), forced(1), options) {
            Err(RequestError::Pooling { reason, .. }) => assert!(reason.contains("dimensions"), "{reason}"),
            other => panic!("dimensions {dimensions}: {other:?}"),
        }
    }
    assert!(!engine.has_unfinished() && engine.kv_is_idle());
    // The full width is allowed, and the engine still serves both kinds of request.
    let full = PoolingParams { dimensions: Some(hidden), normalize: false, pooling_type: PoolingType::Last };
    let got = engine.embed(vec![Prompt::Tokens(refs[0].prompt.clone())], full).expect("embed");
    assert_close(got[0].as_ref().expect("embedding"), &refs[0].last, "dimensions = hidden");
    let out = engine.generate(vec![Prompt::Tokens(refs[0].prompt.clone())], &forced(3)).expect("generate");
    assert_eq!(out[0].as_ref().expect("generated").completions[0].token_ids.len(), 3);
    assert!(engine.kv_is_idle());
}
