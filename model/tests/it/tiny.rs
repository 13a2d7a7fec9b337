//! A tiny random Llama (GQA, 2 layers) written as safetensors + config.json into a temp
//! dir: the paged forward pass, under any chunking and batch mix, equals the naive
//! full-sequence forward pass with no cache.

use std::collections::HashMap;
use std::path::Path;

use model::{Model, Workspace};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use crate::harness::{assign_blocks, build_batch, cache_for};

/// Largest allowed |logit − naive logit| (f32 GEMMs and an online softmax vs f64 loops).
pub const TOL: f32 = 2e-4;

pub const VOCAB: usize = 97;
const HIDDEN: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const INTER: usize = 160;
const LAYERS: usize = 2;

pub fn tiny_config(tied: bool, rope_scaling: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "rope_scaling": rope_scaling, "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2
    })
}

/// Every tensor name and shape of the tiny model.
pub fn tiny_tensors(tied: bool) -> Vec<(String, Vec<usize>)> {
    let mut t = vec![("model.embed_tokens.weight".to_owned(), vec![VOCAB, HIDDEN])];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        t.push((format!("{p}.input_layernorm.weight"), vec![HIDDEN]));
        t.push((format!("{p}.self_attn.q_proj.weight"), vec![HEADS * HEAD_DIM, HIDDEN]));
        t.push((format!("{p}.self_attn.k_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN]));
        t.push((format!("{p}.self_attn.v_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN]));
        t.push((format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, HEADS * HEAD_DIM]));
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]));
        t.push((format!("{p}.mlp.gate_proj.weight"), vec![INTER, HIDDEN]));
        t.push((format!("{p}.mlp.up_proj.weight"), vec![INTER, HIDDEN]));
        t.push((format!("{p}.mlp.down_proj.weight"), vec![HIDDEN, INTER]));
    }
    t.push(("model.norm.weight".to_owned(), vec![HIDDEN]));
    if !tied {
        t.push(("lm_head.weight".to_owned(), vec![VOCAB, HIDDEN]));
    }
    t
}

/// Random weights in `dtype`, written to `dir/model.safetensors` (+ `config.json`).
pub fn write_tiny_model(
    dir: &Path,
    config: &serde_json::Value,
    tensors: &[(String, Vec<usize>)],
    dtype: Dtype,
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let fan_in = *shape.last().unwrap() as f32;
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    if shape.len() == 1 {
                        1.0 + rng.random_range(-0.2..0.2)
                    } else {
                        rng.random_range(-1.0..1.0) * 1.7 / fan_in.sqrt()
                    }
                })
                .collect();
            let bytes = match dtype {
                Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                Dtype::BF16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
                Dtype::F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
                other => panic!("test writes no {other:?}"),
            };
            (name.clone(), shape.clone(), bytes)
        })
        .collect();
    let views: HashMap<String, TensorView<'_>> = data
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).expect("write safetensors");
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
}

fn tiny_model(tied: bool, rope_scaling: serde_json::Value) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_model(dir.path(), &tiny_config(tied, rope_scaling), &tiny_tensors(tied), Dtype::F32, 7);
    let model = Model::load(dir.path()).expect("load tiny model");
    (dir, model)
}

/// Runs `prompts` through the paged forward pass following `schedule` (per step, per
/// sequence, how many tokens to advance), sampling every token, and compares each token's
/// logits with the naive forward pass.
fn check_paged_equals_naive(
    model: &Model,
    prompts: Vec<Vec<u32>>,
    schedule: &[Vec<usize>],
    block_size: usize,
    pool: &[u32],
) {
    let naive: Vec<Vec<f32>> = prompts.iter().map(|p| model::reference::forward_full(model, p)).collect();
    let capacity = prompts.iter().map(Vec::len).max().unwrap();
    let mut seqs = assign_blocks(prompts, capacity, block_size, pool);
    let num_blocks = pool.iter().max().map_or(0, |&b| b as usize + 1);
    let mut cache = cache_for(&model.config, block_size, num_blocks);
    let mut ws = Workspace::default();
    for chunks in schedule {
        let batch = build_batch(&seqs, chunks, block_size, true);
        if batch.token_ids.is_empty() {
            continue;
        }
        let logits = model.forward(&batch.input(), &mut cache, &mut ws).expect("forward");
        let mut row = 0;
        for (i, (s, &n)) in seqs.iter_mut().zip(chunks).enumerate() {
            for pos in s.cached..s.cached + n {
                let got = &logits[row * VOCAB..(row + 1) * VOCAB];
                let want = &naive[i][pos * VOCAB..(pos + 1) * VOCAB];
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() <= TOL, "pos {pos}: {g} vs {w}");
                }
                row += 1;
            }
            s.cached += n;
        }
    }
}

/// Turns random chunk proposals into a schedule that finishes every sequence.
fn schedule_from(lens: &[usize], proposals: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut done = vec![0usize; lens.len()];
    let mut out = Vec::new();
    for prop in proposals {
        let step: Vec<usize> = lens
            .iter()
            .zip(&mut done)
            .zip(prop)
            .map(|((&l, d), &p)| {
                let n = p.min(l - *d);
                *d += n;
                n
            })
            .collect();
        out.push(step);
    }
    // Finish the rest one token at a time: pure decode steps.
    while done.iter().zip(lens).any(|(d, l)| d < l) {
        let step = lens
            .iter()
            .zip(&mut done)
            .map(|(&l, d)| {
                let n = usize::from(*d < l);
                *d += n;
                n
            })
            .collect();
        out.push(step);
    }
    out
}

fn random_prompt(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(0..VOCAB as u32)).collect()
}

#[test]
fn whole_prompt_prefill_then_decodes_equals_naive() {
    let (_dir, model) = tiny_model(true, serde_json::Value::Null);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let prompts = vec![random_prompt(&mut rng, 37)];
    let mut schedule = vec![vec![20]];
    schedule.extend(std::iter::repeat_n(vec![1], 17));
    let pool: Vec<u32> = vec![5, 0, 3];
    check_paged_equals_naive(&model, prompts, &schedule, 16, &pool);
}

#[test]
fn untied_head_and_llama3_rope_equal_naive() {
    let scaling = serde_json::json!({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16});
    let (_dir, model) = tiny_model(false, scaling);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let prompts = vec![random_prompt(&mut rng, 30), random_prompt(&mut rng, 9)];
    let schedule = vec![vec![30, 4], vec![0, 5]];
    let pool: Vec<u32> = (0..8).rev().collect();
    check_paged_equals_naive(&model, prompts, &schedule, 8, &pool);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Any chunking and any batch mix (prefill chunks next to decodes, sequences idle for a
    /// step), scattered physical blocks, block sizes 8/16/32.
    #[test]
    fn any_chunking_and_batch_mix_equals_naive(
        seed in any::<u64>(),
        block_size in prop::sample::select(vec![8usize, 16, 32]),
        lens in prop::collection::vec(1usize..48, 1..4),
        proposals in prop::collection::vec(prop::collection::vec(0usize..20, 3), 0..6),
    ) {
        let (_dir, model) = tiny_model(true, serde_json::Value::Null);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let prompts: Vec<Vec<u32>> = lens.iter().map(|&l| random_prompt(&mut rng, l)).collect();
        let schedule = schedule_from(&lens, &proposals);
        let capacity = *lens.iter().max().unwrap();
        let n_blocks = capacity.div_ceil(block_size) * lens.len();
        let mut pool: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, rng.random_range(0..=i));
        }
        check_paged_equals_naive(&model, prompts, &schedule, block_size, &pool);
    }
}

/// Every difference an [`model::Architecture`] can describe, switched on at once (the biases
/// loaded from the checkpoint, the rest set on the description with random norms added): the
/// paged forward still equals the naive one, which follows the same description.
#[test]
fn every_architecture_feature_equals_naive() {
    use model::arch::LayerMatrix;

    let mut config = tiny_config(false, serde_json::Value::Null);
    config["attention_bias"] = serde_json::json!(true);
    let mut tensors = tiny_tensors(false);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}.self_attn");
        for (name, rows) in [("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)] {
            tensors.push((format!("{p}.{name}_proj.bias"), vec![rows * HEAD_DIM]));
        }
        tensors.push((format!("{p}.o_proj.bias"), vec![HIDDEN]));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_model(dir.path(), &config, &tensors, Dtype::F32, 9);
    let model = Model::load(dir.path()).expect("load tiny model with biases");
    assert!(model.config.arch.qkv_bias && model.config.arch.o_bias);
    let qkv_bias = model.layers[0].bias(LayerMatrix::Qkv).map(|b| b.to_f32());
    assert!(qkv_bias.as_ref().is_some_and(|b| b.len() == (HEADS + 2 * KV_HEADS) * HEAD_DIM));
    let model = model::testing::with_every_architecture_feature(model, 4);
    // The checkpoint's biases were kept.
    assert_eq!(model.layers[0].bias(LayerMatrix::Qkv).map(|b| b.to_f32()), qkv_bias);

    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let prompts = vec![random_prompt(&mut rng, 21), random_prompt(&mut rng, 6)];
    let schedule = vec![vec![13, 6], vec![8, 0]];
    let pool: Vec<u32> = (0..6).collect();
    check_paged_equals_naive(&model, prompts, &schedule, 8, &pool);
}

/// A runner that computes fewer logit rows per pass than a step asks for (a CUDA model's buffers
/// hold `max_num_seqs` rows; a request's prompt logprobs ask for a row per prompt position) runs
/// the step in passes: the logits are those of one pass, and so is the cache the next step reads.
#[test]
fn a_step_in_several_logit_passes_equals_one_pass() {
    use model::{KvCacheSize, Runner, RunnerConfig, StepInput};
    let prompt = random_prompt(&mut ChaCha8Rng::seed_from_u64(3), 21);
    let run = |limit: Option<usize>| {
        let (_dir, model) = tiny_model(true, serde_json::Value::Null);
        let config = RunnerConfig {
            device: model::runner::Device::Cpu,
            kv_cache: KvCacheSize::Blocks(4),
            kv_dtype: model::runner::DType::F32,
            block_size: 16,
            max_model_len: 64,
            swap_bytes: 0,
            max_num_batched_tokens: 64,
            max_num_seqs: 1,
            gpu_memory_utilization: 0.9,
        };
        let mut runner = Runner::new(model, &config).expect("runner");
        if let Some(rows) = limit {
            runner.limit_logit_rows(rows);
        }
        assert_eq!(runner.max_logit_rows(), limit);
        runner.write_table_row(0, 0, &[2, 0]).expect("row");
        // Row 0's blocks are 2 then 0: positions 0..16 in slots 32.., the rest from slot 0.
        let slots: Vec<i64> =
            (0..prompt.len() as i64).map(|p| if p < 16 { 32 + p } else { p - 16 }).collect();
        let rows: Vec<usize> = (0..prompt.len()).rev().collect();
        let prefill =
            model::testing::forward_one_sequence(&mut runner, &prompt, &slots, &rows).expect("forward");
        // One decode after it reads the cache the passes wrote.
        let (token, position, slot) = ([7u32], [prompt.len() as u32], [prompt.len() as i64 - 16]);
        let step = StepInput {
            token_ids: &token,
            positions: &position,
            slot_mapping: &slot,
            group_slot_mapping: &[],
            query_start_loc: &[0, 1],
            seq_lens: &[prompt.len() + 1],
            seq_rows: &[0],
            sample_indices: &[0],
            pool_indices: &[],
            lora: None,
        };
        let decode = runner.forward(&step).expect("decode").to_vec();
        (prefill, decode)
    };
    let (whole, decode) = run(None);
    assert_eq!(whole.len(), prompt.len() * VOCAB);
    for limit in [1, 4, 20] {
        let (passes, after) = run(Some(limit));
        // The LM head of fewer rows may take another matmul kernel: the same logits up to
        // rounding; the cache is the same to the bit (so is the next step).
        assert_eq!(passes.len(), whole.len());
        let worst = passes.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "{limit} rows a pass: logits differ by {worst}");
        assert_eq!(after, decode, "{limit} rows a pass: the next step differs");
    }
}
