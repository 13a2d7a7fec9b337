//! The int8 KV cache (`DType::Int8`) on the public goldens of SmolLM2 and Gemma 3 270M (greedy
//! outputs of outside f32 implementations): each greedy generation keeps the golden tokens, or
//! departs from them first at a near tie — where the f32 cache, given the same tokens, ranks the
//! golden token at most [`NEAR_TIE`] logits above the one the int8 cache picks. After its first
//! departure a generation continues on its own tokens and is no longer compared.

use std::path::PathBuf;

use kv_cache::DType;
use model::{ActivationPrecision, Model};
use serde_json::Value;

use crate::harness::{argmax, greedy_batch_with};

/// The largest margin of the golden token over the int8 cache's pick, in the f32 cache's row, at
/// which a departure counts as a near tie.
const NEAR_TIE: f32 = 0.25;

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("parse goldens")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Runs the goldens' generations side by side over an int8 cache; returns, per generation, the
/// step of its first departure (if any) and the reference's margin there: in the f32 cache's
/// row for the same tokens, how far the golden token's logit is above the int8 cache's pick.
/// Fails on a departure that is not a near tie.
fn departures(model: &Model, goldens: &Value) -> Vec<Option<(usize, f32)>> {
    let gens = goldens["generations"].as_array().expect("generations");
    let prompts: Vec<Vec<u32>> = gens.iter().map(|g| ids(&g["prompt_ids"])).collect();
    let expected: Vec<Vec<u32>> = gens.iter().map(|g| ids(&g["output_ids"])).collect();
    let steps = expected.iter().map(Vec::len).max().expect("a generation");
    // The f32 cache's rows (it keeps every golden token, so its inputs are the goldens').
    let mut reference = std::collections::HashMap::new();
    greedy_batch_with(model, prompts.clone(), steps, DType::F32, |step, i, row| {
        reference.insert((step, i), row.to_vec());
    });
    let mut first: Vec<Option<(usize, f32)>> = vec![None; gens.len()];
    greedy_batch_with(model, prompts, steps, DType::Int8, |step, i, row| {
        let Some(&want) = expected[i].get(step) else { return };
        let got = argmax(row);
        if first[i].is_some() || got == want {
            return;
        }
        let f32_row = &reference[&(step, i)];
        let margin = f32_row[want as usize] - f32_row[got as usize];
        assert!(
            margin <= NEAR_TIE,
            "{}: step {step} picks {got} over the golden {want}, which the f32 cache ranks {margin:.3} logits \
             higher: not a near tie",
            gens[i]["name"]
        );
        first[i] = Some((step, margin));
    });
    eprintln!("int8 KV: first departures (step, the f32 cache's margin there) per generation: {first:?}");
    first
}

#[test]
fn smollm2_int8_kv_keeps_the_golden_tokens_or_departs_at_a_near_tie() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let mut model = Model::load(&gguf).expect("load");
    model.activations = ActivationPrecision::F32;
    departures(&model, &golden("smollm2-135m-instruct.json"));
}

#[test]
fn gemma3_int8_kv_keeps_the_golden_tokens_or_departs_at_a_near_tie() {
    let mut model = Model::load(&model::testing::gemma3_gguf_for_tests()).expect("load");
    model.activations = ActivationPrecision::F32;
    departures(&model, &golden("gemma3-270m-public.json"));
}
