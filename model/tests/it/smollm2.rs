//! The real default model (SmolLM2-135M-Instruct: the Q4_1 GGUF `cargo xtask fetch-model` keeps,
//! loaded natively with its weights quantized, and the f32 HF folder converted from it) against
//! the reference goldens kept in this crate's `tests/data/`: tokenizer ids, chat prompts, greedy
//! continuations and top-5 logits of an f32 reference forward pass.

use std::path::PathBuf;
use std::sync::OnceLock;

use model::{ActivationPrecision, ChatMessage, Model, ModelFolder};
use serde_json::Value;

use crate::harness::{argmax, greedy_batch};

/// Largest allowed |logit − reference| (the reference's two implementations agreed to 4.5e-5;
/// our f32 sums run in a different order, over 30 layers): 3× the largest difference measured
/// over the folder and the GGUF, whole and prefill-sized batches (7.4e-5, AVX-512).
const LOGIT_TOL: f32 = 2.2e-4;

/// The same for int16 activations (`ActivationPrecision::Int16`, the default on AVX2 and AVX-512
/// CPUs: 2⁻¹⁶ of each group's largest activation per matmul): 3× the 8.5e-3 measured on these
/// goldens (AVX-512, every golden token kept).
const INT16_LOGIT_TOL: f32 = 2.5e-2;

/// The two ways the model is loaded: the HF folder, and the GGUF file itself.
#[derive(Debug, Clone, Copy)]
enum Source {
    Folder,
    Gguf,
}

const SOURCES: [Source; 2] = [Source::Folder, Source::Gguf];

fn model_path(source: Source) -> PathBuf {
    let dir = model::testing::smollm2_dir_for_tests();
    match source {
        Source::Folder => dir,
        Source::Gguf => {
            let gguf = model::testing::smollm2_gguf();
            assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
            gguf
        }
    }
}

fn goldens() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        // Kept inside the repository so a user's clone passes `cargo xtask test` on its own.
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/smollm2-135m-instruct.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("parse goldens")
    })
}

fn folder(source: Source) -> &'static ModelFolder {
    static F: [OnceLock<ModelFolder>; 2] = [OnceLock::new(), OnceLock::new()];
    F[source as usize].get_or_init(|| ModelFolder::open(&model_path(source)).expect("open model folder"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn tokenizer_matches_every_golden_string() {
    for source in SOURCES {
        tokenizer_matches_every_golden_string_from(source);
    }
}

fn tokenizer_matches_every_golden_string_from(source: Source) {
    let tok = &folder(source).tokenizer;
    let cases = goldens()["tokenization"].as_array().expect("tokenization cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let parse_special = case["parse_special"].as_bool().expect("parse_special");
        let add_special = case["add_special"].as_bool().expect("add_special");
        let got = tok.encode(text, parse_special, add_special).expect("encode");
        assert_eq!(got, ids(&case["ids"]), "{source:?}: case {}", case["name"]);
        assert_eq!(
            tok.decode(&got, false).expect("decode"),
            text,
            "{source:?}: round trip of {}",
            case["name"]
        );
    }
}

#[test]
fn config_and_chat_template_match_the_gguf_metadata() {
    for source in SOURCES {
        config_and_chat_template_match_from(source);
    }
}

fn config_and_chat_template_match_from(source: Source) {
    let f = folder(source);
    let meta = &goldens()["metadata"];
    let c = &f.config;
    assert_eq!(c.num_hidden_layers as u64, meta["n_layers"].as_u64().unwrap());
    assert_eq!(c.hidden_size as u64, meta["hidden_size"].as_u64().unwrap());
    assert_eq!(c.num_key_value_heads as u64, meta["n_kv_heads"].as_u64().unwrap());
    assert_eq!(c.vocab_size, 49152);
    assert!(c.tie_word_embeddings);
    assert_eq!(f.generation.eos_token_ids, vec![2]);
    assert_eq!(f.generation.bos_token_id, Some(1));
    let tmpl = f.chat_template.as_ref().expect("chat template");
    for g in goldens()["generations"].as_array().unwrap() {
        let Some(chat) = g["chat"].as_object() else { continue };
        let msgs: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        assert_eq!(tmpl.render(&msgs, true).unwrap(), g["prompt_text"].as_str().unwrap(), "{}", g["name"]);
        let prompt_ids = f.tokenizer.encode(g["prompt_text"].as_str().unwrap(), true, false).unwrap();
        assert_eq!(prompt_ids, ids(&g["prompt_ids"]), "{}", g["name"]);
    }
}

/// All golden prompts run together: one mixed prefill step, then batched greedy decoding;
/// every token must match and every top-5 logit be within `LOGIT_TOL`. The goldens are the
/// Q4_1 model's, so the GGUF with its weights left quantized and f32 activations must meet
/// them as the f32 dequantization does.
#[test]
fn greedy_generations_and_logits_match_the_goldens() {
    for source in SOURCES {
        greedy_generations_and_logits_match_from(source, ActivationPrecision::F32, LOGIT_TOL, 1);
    }
}

/// The goldens' prompts three times over (264 tokens in the first step): a prefill-sized batch,
/// on the path a long prompt takes (dequantized rows into `token_lanes` on AVX2 and AVX-512,
/// slabs into `gemm` on the portable path), and batch-12 decoding after it.
#[test]
fn a_prefill_sized_batch_matches_the_goldens() {
    greedy_generations_and_logits_match_from(Source::Gguf, ActivationPrecision::F32, LOGIT_TOL, 3);
}

/// Int16 activations (`ActivationPrecision::Int16`: the integer decode kernels, and the batch
/// kernels for the prefill) on the GGUF: every golden token, and top-5 logits
/// within their own tolerance, measured (see `INT16_LOGIT_TOL`).
#[test]
fn int16_activations_keep_the_golden_tokens_within_their_tolerance() {
    greedy_generations_and_logits_match_from(Source::Gguf, ActivationPrecision::Int16, INT16_LOGIT_TOL, 1);
}

/// Runs the golden prompts, each `copies` times (side by side in every batch), to the end.
fn greedy_generations_and_logits_match_from(
    source: Source,
    precision: ActivationPrecision,
    tol: f32,
    copies: usize,
) {
    let f = folder(source);
    let mut model = Model::load(&f.dir).expect("load weights");
    model.activations = precision;
    let all = goldens()["generations"].as_array().expect("generations");
    let gens: Vec<&Value> = all.iter().cycle().take(copies * all.len()).collect();
    let prompts: Vec<Vec<u32>> = gens.iter().map(|g| ids(&g["prompt_ids"])).collect();
    let expected: Vec<Vec<u32>> = gens.iter().map(|g| ids(&g["output_ids"])).collect();
    let steps = expected[0].len();
    let mut worst = 0.0f32;
    greedy_batch(&model, prompts, steps, |step, i, row| {
        assert_eq!(argmax(row), expected[i][step], "{source:?} {}: token {step} differs", gens[i]["name"]);
        for pair in gens[i]["top5_per_step"][step].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            let want = pair[1].as_f64().unwrap() as f32;
            let diff = (row[id] - want).abs();
            worst = worst.max(diff);
            assert!(
                diff <= tol,
                "{source:?} {}: step {step} logit of {id}: {} vs {want}",
                gens[i]["name"],
                row[id]
            );
        }
    });
    eprintln!("{source:?} {precision:?}: largest top-5 logit difference: {worst:.2e}");
}
