//! LoRA adapters against PEFT: the tiny Llama and Qwen2 checkpoints of `tests/data/families/`
//! with the two PEFT adapters of `tests/data/lora/<family>/` each (`make.py` there: ranks 8 and
//! 16, other target modules, one with rsLoRA and a layer without one of its pairs). One batch
//! holds every prompt three times — base, adapter `sql`, adapter `chat` — so each step mixes the
//! three; every row's logits must be within [`TOLERANCE`] of PEFT's merged model (of
//! transformers' for the base rows) at each of 8 positions, prefilled whole and then decoded a
//! token a step, from the HF folder and from llama.cpp's GGUF of the same weights (whose Q/K
//! rows are in llama.cpp's order: the adapter's `B` rows must follow). llama.cpp's LoRA GGUFs of
//! the same adapters (`make_gguf.py`) against llama.cpp's own logits over them (Llama; over the
//! HF folder too, whose rows are in the other order) and against PEFT's (Qwen2's `sql`, beside
//! the PEFT folder of `chat` in one batch). Adapters that do not fit the base are refused at
//! load, and a step carrying another model's adapter before any op.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::{LoraAdapter, LoraBatch, Model, Workspace};
use serde_json::Value;

use crate::harness::{argmax, assign_blocks, build_batch, cache_for};

/// The issue's bound on |logit − PEFT's logit| (f32 math in another order: measured worst below).
const TOLERANCE: f32 = 1e-3;

/// An adapter of a check: its name, its file or folder in `lora/<family>/`, and the file there
/// holding its reference generations.
type Source = (&'static str, &'static str, &'static str);
const PEFT: [Source; 2] = [("sql", "sql", "expected.json"), ("chat", "chat", "expected.json")];
const LLAMA_CPP: [Source; 2] =
    [("sql", "sql.gguf", "expected_gguf.json"), ("chat", "chat.gguf", "expected_gguf.json")];

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("parse json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// One expected generation: prompt, greedy ids, logits per step.
struct Expected {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn generations(v: &Value) -> Vec<Expected> {
    v.as_array()
        .expect("generations")
        .iter()
        .take(3)
        .map(|g| Expected {
            prompt: ids(&g["prompt_ids"]),
            greedy: ids(&g["greedy_ids"]),
            logits: g["logits"]
                .as_array()
                .expect("logits")
                .iter()
                .map(|row| {
                    row.as_array().expect("row").iter().map(|x| x.as_f64().expect("logit") as f32).collect()
                })
                .collect(),
        })
        .collect()
}

/// Runs every (prompt, adapter) pair side by side and returns the largest logit difference.
fn check(family: &str, file: &str, sources: [Source; 2]) -> f32 {
    let path = data().join("families").join(family).join(file);
    let file = if file.is_empty() { "folder" } else { file };
    let model = Model::load(&path).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let base = generations(&json(data().join("families").join(family).join("expected.json"))["generations"]);
    // Row r of the batch: prompt r / 3 under adapter r % 3 (0 = base).
    let mut adapters: Vec<Option<Arc<LoraAdapter>>> = vec![None];
    let mut expected: Vec<Vec<Expected>> = vec![base];
    for (name, at, reference) in sources {
        let dir = data().join("lora").join(family);
        let adapter = LoraAdapter::load(name, &dir.join(at), &model.config).unwrap_or_else(|e| panic!("{e}"));
        adapters.push(Some(Arc::new(adapter)));
        expected.push(generations(&json(dir.join(reference))["adapters"][name]));
    }
    let rows: Vec<(usize, usize)> = (0..3).flat_map(|p| (0..3).map(move |a| (p, a))).collect();
    // Teacher-forced: each sequence is its prompt then the reference's greedy tokens but the last.
    let tokens: Vec<Vec<u32>> = rows
        .iter()
        .map(|&(p, a)| {
            let e = &expected[a][p];
            e.prompt.iter().chain(&e.greedy[..e.greedy.len() - 1]).copied().collect()
        })
        .collect();
    let block_size = 16;
    let capacity = tokens.iter().map(Vec::len).max().unwrap_or(0);
    let per_seq = capacity.div_ceil(block_size);
    let pool: Vec<u32> = (0..(per_seq * rows.len()) as u32).rev().collect();
    let mut seqs = assign_blocks(tokens, capacity, block_size, &pool);
    let mut cache = cache_for(&model.config, block_size, pool.len());
    let mut ws = Workspace::default();
    let vocab = model.config.vocab_size;
    let mut worst = 0.0f32;
    let mut compared = 0;
    // The prompts whole in the first step, then one token a step.
    let mut first = true;
    while seqs.iter().any(|s| s.cached < s.tokens.len()) {
        let chunks: Vec<usize> = rows
            .iter()
            .zip(&seqs)
            .map(
                |(&(p, a), s)| {
                    if first { expected[a][p].prompt.len() } else { 1.min(s.tokens.len() - s.cached) }
                },
            )
            .collect();
        first = false;
        let batch = build_batch(&seqs, &chunks, block_size, true);
        let mut lora = LoraBatch::default();
        let mut seq_in_batch = 0;
        for (i, &n) in chunks.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let range = batch.query_start_loc[seq_in_batch]..batch.query_start_loc[seq_in_batch + 1];
            if let Some(adapter) = &adapters[rows[i].1] {
                lora.add(adapter, range);
            }
            seq_in_batch += 1;
        }
        let mut input = batch.input();
        input.lora = Some(&lora);
        let logits = model.forward(&input, &mut cache, &mut ws).expect("forward");
        let mut row_at = 0;
        for (i, &n) in chunks.iter().enumerate() {
            let (p, a) = rows[i];
            let e = &expected[a][p];
            for pos in seqs[i].cached..seqs[i].cached + n {
                let row = &logits[row_at * vocab..(row_at + 1) * vocab];
                row_at += 1;
                let Some(step) = pos.checked_sub(e.prompt.len() - 1) else { continue };
                for (id, (got, want)) in row.iter().zip(&e.logits[step]).enumerate() {
                    let diff = (got - want).abs();
                    worst = worst.max(diff);
                    assert!(
                        diff <= TOLERANCE,
                        "{family} ({file}), prompt {p}, adapter {a}, step {step}: logit of {id} is {got}, PEFT's {want}"
                    );
                }
                assert_eq!(
                    argmax(row),
                    e.greedy[step],
                    "{family} ({file}), prompt {p}, adapter {a}: greedy token {step}"
                );
                compared += 1;
            }
            seqs[i].cached += n;
        }
    }
    assert_eq!(compared, 9 * 8, "{family} ({file}): rows compared");
    eprintln!(
        "{family} ({file}): 3 prompts × base, sql, chat in one batch, largest logit difference {worst:.2e}"
    );
    worst
}

#[test]
fn llama_adapters_match_peft_in_a_mixed_batch() {
    check("llama", "", PEFT);
}

#[test]
fn llama_adapters_over_the_gguf_follow_its_row_order() {
    check("llama", "model.gguf", PEFT);
}

#[test]
fn qwen2_adapters_match_peft_in_a_mixed_batch() {
    check("qwen2", "", PEFT);
    check("qwen2", "model.gguf", PEFT);
}

#[test]
fn llama_cpp_lora_ggufs_match_llama_cpp_over_either_base() {
    check("llama", "model.gguf", LLAMA_CPP);
    check("llama", "", LLAMA_CPP);
}

#[test]
fn a_qwen2_lora_gguf_matches_peft_beside_a_peft_folder() {
    let mixed = [("sql", "sql.gguf", "expected.json"), PEFT[1]];
    check("qwen2", "", mixed);
    check("qwen2", "model.gguf", mixed);
}

#[test]
fn adapters_that_do_not_fit_the_base_are_refused_naming_the_tensor() {
    let llama = Model::load(&data().join("families/llama")).expect("load llama");
    let qwen = Model::load(&data().join("families/qwen2")).expect("load qwen2");
    // Qwen2's adapter over Llama: the same module names, other shapes.
    let err = LoraAdapter::load_peft("x", &data().join("lora/qwen2/sql"), &llama.config).expect_err("shape");
    let text = err.to_string();
    assert!(text.contains("lora_A.weight") || text.contains("lora_B.weight"), "{text}");
    assert!(text.contains("shape"), "{text}");
    // A folder without an adapter.
    let err =
        LoraAdapter::load_peft("x", &data().join("families/llama"), &qwen.config).expect_err("no adapter");
    assert!(err.to_string().contains("adapter_config.json"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let copy = |config: &str| {
        std::fs::write(dir.path().join("adapter_config.json"), config).expect("write config");
        std::fs::copy(
            data().join("lora/llama/sql/adapter_model.safetensors"),
            dir.path().join("adapter_model.safetensors"),
        )
        .expect("copy weights");
    };
    let base = std::fs::read_to_string(data().join("lora/llama/sql/adapter_config.json")).expect("config");
    for (field, value, says) in [
        ("use_dora", "true", "use_dora"),
        ("bias", "\"all\"", "bias"),
        ("r", "0", "r must be"),
        ("modules_to_save", "[\"lm_head\"]", "modules_to_save"),
        ("peft_type", "\"IA3\"", "LORA"),
        ("target_modules", "[\"q_proj\"]", "k_proj"),
    ] {
        let mut config: Value = serde_json::from_str(&base).expect("parse");
        config[field] = serde_json::from_str(value).expect("value");
        copy(&config.to_string());
        let err = LoraAdapter::load_peft("x", dir.path(), &llama.config).expect_err(field);
        assert!(err.to_string().contains(says), "{field}: {err}");
    }
    // A rank that is not the tensors': every shape is checked.
    let mut config: Value = serde_json::from_str(&base).expect("parse");
    config["r"] = 4.into();
    copy(&config.to_string());
    let err = LoraAdapter::load_peft("x", dir.path(), &llama.config).expect_err("rank");
    assert!(err.to_string().contains("has shape"), "{err}");
    copy(&base);
    let adapter = LoraAdapter::load_peft("sql", dir.path(), &llama.config).expect("the copy loads");
    assert_eq!((adapter.rank, adapter.num_pairs()), (8, 4 * llama.config.num_hidden_layers));
}

#[test]
fn lora_ggufs_that_do_not_fit_the_base_are_refused_naming_why() {
    let llama = Model::load(&data().join("families/llama")).expect("load llama");
    let qwen = Model::load(&data().join("families/qwen2")).expect("load qwen2");
    for (path, config, says) in [
        // Another architecture's adapter.
        ("lora/qwen2/sql.gguf", &llama.config, "an adapter of a qwen2 model, the base is llama"),
        // A model, not an adapter.
        ("families/llama/model.gguf", &llama.config, "not a LoRA adapter"),
        // Not a GGUF at all.
        ("lora/llama/sql/adapter_config.json", &llama.config, "not a GGUF"),
    ] {
        let err = LoraAdapter::load("x", &data().join(path), config).expect_err(path);
        assert!(err.to_string().contains(says), "{path}: {err}");
    }
    // The architecture's name matches but a shape does not: the tensor is named.
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = std::fs::read(data().join("lora/qwen2/sql.gguf")).expect("read");
    let text = String::from_utf8_lossy(&bytes);
    let at = text.find("qwen2").expect("the architecture's name");
    let mut renamed = bytes.clone();
    // `qwen2` → `llama`, the same length: a Qwen2 adapter claiming to be Llama's.
    renamed[at..at + 5].copy_from_slice(b"llama");
    let path = dir.path().join("renamed.gguf");
    std::fs::write(&path, renamed).expect("write");
    let err = LoraAdapter::load("x", &path, &llama.config).expect_err("shapes");
    assert!(err.to_string().contains("lora_") && err.to_string().contains("has shape"), "{err}");
    let adapter = LoraAdapter::load("sql", &data().join("lora/qwen2/sql.gguf"), &qwen.config).expect("loads");
    assert_eq!((adapter.rank, adapter.num_pairs()), (8, 4 * qwen.config.num_hidden_layers));
}

#[test]
fn a_step_with_an_adapter_of_another_model_is_refused_before_any_op() {
    let llama = Model::load(&data().join("families/llama")).expect("load llama");
    let qwen = Model::load(&data().join("families/qwen2")).expect("load qwen2");
    let adapter = LoraAdapter::load_peft("q", &data().join("lora/qwen2/sql"), &qwen.config).expect("load");
    let seqs = assign_blocks(vec![vec![1, 2, 3]], 16, 16, &[0]);
    let batch = build_batch(&seqs, &[3], 16, false);
    let mut lora = LoraBatch::default();
    lora.add(&Arc::new(adapter), 0..3);
    let mut input = batch.input();
    input.lora = Some(&lora);
    let mut cache = cache_for(&llama.config, 16, 1);
    let err =
        llama.forward(&input, &mut cache, &mut Workspace::default()).expect_err("another model's adapter");
    assert!(err.to_string().contains("does not fit this model's shapes"), "{err}");
}
