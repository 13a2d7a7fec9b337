//! A tiny random Llama written as an ordinary HF folder (config, safetensors, byte-level BPE
//! tokenizer with ChatML specials, chat template): the fixture of the engine's and the
//! server's tests (feature `testing`).

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, TensorView};

pub const HIDDEN: usize = 128;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = 64;
pub const INTER: usize = 256;
pub const LAYERS: usize = 2;
pub const VOCAB: usize = 272;
pub const MAX_POS: usize = 1024;
/// Special tokens after the 256 bytes and 4 merges.
pub const ENDOFTEXT: u32 = 260;
pub const IM_START: u32 = 261;
pub const IM_END: u32 = 262;

/// Writes the tiny model into `dir`.
pub fn write_tiny_llama(dir: &Path, seed: u64) {
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": false,
        "max_position_embeddings": MAX_POS,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": IM_END,
    });
    write(dir, "config.json", &config.to_string());
    write(
        dir,
        "generation_config.json",
        &serde_json::json!({"eos_token_id": [IM_END, ENDOFTEXT]}).to_string(),
    );
    write(
        dir,
        "tokenizer_config.json",
        &serde_json::json!({
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "chat_template": "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        })
        .to_string(),
    );
    write(dir, "tokenizer.json", &tokenizer_json());
    write_weights(dir, seed);
}

fn write(dir: &Path, name: &str, text: &str) {
    if let Err(e) = std::fs::write(dir.join(name), text) {
        panic!("writing {name}: {e}");
    }
}

/// Uniform weights with standard deviation `gain/sqrt(fan_in)`: embeddings of std 1, layers
/// that keep the residual stream's scale, and an untied LM head giving logits of std ~3, so
/// greedy choices depend on the context and are far from ties, and temperature 1 is random.
fn write_weights(dir: &Path, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, fan_in: Option<(usize, f32)>| {
        let n: usize = shape.iter().product();
        let a = fan_in.map_or(0.0, |(f, gain)| gain * (3.0 / f as f32).sqrt());
        let values: Vec<f32> = (0..n)
            .map(|_| match fan_in {
                Some(_) => rng.random_range(-a..a),
                None => 1.0,
            })
            .collect();
        tensors.push((name, shape, bytemuck_bytes(&values)));
    };
    add("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN], Some((1, 1.0)));
    add("lm_head.weight".into(), vec![VOCAB, HIDDEN], Some((HIDDEN, 3.0)));
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![HIDDEN], None);
        add(format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN], None);
        add(format!("{p}.self_attn.q_proj.weight"), vec![HEADS * HEAD_DIM, HIDDEN], Some((HIDDEN, 1.0)));
        add(format!("{p}.self_attn.k_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN], Some((HIDDEN, 1.0)));
        add(format!("{p}.self_attn.v_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN], Some((HIDDEN, 1.0)));
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![HIDDEN, HEADS * HEAD_DIM],
            Some((HEADS * HEAD_DIM, 1.0)),
        );
        add(format!("{p}.mlp.gate_proj.weight"), vec![INTER, HIDDEN], Some((HIDDEN, 1.0)));
        add(format!("{p}.mlp.up_proj.weight"), vec![INTER, HIDDEN], Some((HIDDEN, 1.0)));
        add(format!("{p}.mlp.down_proj.weight"), vec![HIDDEN, INTER], Some((INTER, 1.0)));
    }
    add("model.norm.weight".into(), vec![HIDDEN], None);
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .filter_map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes).ok().map(|v| (name.clone(), v))
        })
        .collect();
    if let Err(e) = safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")) {
        panic!("writing safetensors: {e}");
    }
}

fn bytemuck_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// GPT-2 byte-level BPE over the 256 bytes, a few merges, and ChatML special tokens.
pub fn tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, c) in crate::tokenizer::gpt2_byte_alphabet().iter().enumerate() {
        vocab.insert(c.to_string(), serde_json::json!(i));
    }
    let merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")];
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), serde_json::json!(256 + i));
    }
    let specials = [(ENDOFTEXT, "<|endoftext|>"), (IM_START, "<|im_start|>"), (IM_END, "<|im_end|>")];
    for (id, s) in specials {
        vocab.insert(s.into(), serde_json::json!(id));
    }
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|(id, s)| {
            serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
    })
    .to_string()
}

/// `model` with every difference an [`crate::Architecture`] can describe switched on: Q/K/V and
/// O biases (where the checkpoint has none, random), per-head Q/K norms and sandwich norms
/// (random weights), GeGLU, Gemma's `1 + w` norms, an embedding scale, a logit soft-cap and an
/// attention scale of its own, so that a test of the one forward covers every branch of it.
pub fn with_every_architecture_feature(mut model: crate::Model, seed: u64) -> crate::Model {
    use crate::arch::{Activation, LayerMatrix, LayerNorm};
    use quant_kernels::quant::Weight;

    let c = &model.config;
    let (h, d) = (c.hidden_size, c.head_dim);
    let (qkv_rows, attention_scale) = (c.qkv_size(), 0.5 / (d as f32).sqrt());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut row =
        |width: usize| Weight::from_f32(1, width, (0..width).map(|_| rng.random_range(-0.3..0.3)).collect());
    model.layers = std::mem::take(&mut model.layers)
        .into_iter()
        .map(|mut l| {
            for (m, width) in [(LayerMatrix::Qkv, qkv_rows), (LayerMatrix::O, h)] {
                if l.bias(m).is_none() {
                    l = l.with_bias(m, row(width));
                }
            }
            l.with_norm(LayerNorm::QNorm, row(d))
                .with_norm(LayerNorm::KNorm, row(d))
                .with_norm(LayerNorm::PostAttentionLayernorm, row(h))
                .with_norm(LayerNorm::PostFeedforwardLayernorm, row(h))
        })
        .collect();
    let arch = &mut model.config.arch;
    arch.qkv_bias = true;
    arch.o_bias = true;
    arch.norm_weight_offset = 1.0;
    arch.activation = Activation::GeluTanh;
    arch.qk_norm = true;
    arch.sandwich_norms = true;
    arch.embedding_scale = Some((h as f32).sqrt());
    arch.final_logit_softcap = Some(30.0);
    arch.attention_scale = attention_scale;
    model
}

/// `$var`, else `name` under the workspace's `target/models/` (where `cargo xtask fetch-model`
/// writes).
/// The logits of one forward over `tokens` as the only sequence, at table row 0: positions
/// `0..`, K/V written to `slots`, the logits of rows `sample` (in that order).
pub fn forward_one_sequence(
    runner: &mut crate::Runner,
    tokens: &[u32],
    slots: &[i64],
    sample: &[usize],
) -> Result<Vec<f32>, crate::ModelError> {
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let step = crate::StepInput {
        token_ids: tokens,
        positions: &positions,
        slot_mapping: slots,
        group_slot_mapping: &[],
        query_start_loc: &[0, tokens.len()],
        seq_lens: &[tokens.len()],
        seq_rows: &[0],
        sample_indices: sample,
        pool_indices: &[],
        lora: None,
    };
    Ok(runner.forward(&step)?.to_vec())
}

fn model_path(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/models").join(name))
}

/// `path` for tests when `present`; otherwise fails with what to run (`cargo xtask fetch-model`
/// with `args`) or which variable to set.
fn for_tests(path: PathBuf, present: bool, args: &[&str], var: &str) -> PathBuf {
    assert!(present, "{} not found: run `{}` first (or set {var})", path.display(), fetch_command(args));
    path
}

/// `path` for benchmarks: runs `cargo xtask fetch-model` with `args` when `present` says it is
/// missing.
fn fetched(path: PathBuf, present: impl Fn(&Path) -> bool, args: &[&str]) -> Result<PathBuf, String> {
    if !present(&path) {
        eprintln!("{} missing; running {}", path.display(), fetch_command(args));
        fetch_model(args)?;
        if !present(&path) {
            return Err(format!("{} did not write {}", fetch_command(args), path.display()));
        }
    }
    Ok(path)
}

/// The real default model's folder: `$SMOLLM2_DIR`, else `target/models/SmolLM2-135M-Instruct`
/// under the workspace root (where `cargo xtask fetch-model` writes it).
pub fn smollm2_dir() -> PathBuf {
    model_path("SMOLLM2_DIR", "SmolLM2-135M-Instruct")
}

/// [`smollm2_dir`] for tests: fails with what to run when the model is missing.
pub fn smollm2_dir_for_tests() -> PathBuf {
    let dir = smollm2_dir();
    let present = dir.join("config.json").exists() && dir.join("model.safetensors").exists();
    for_tests(dir, present, &[], "SMOLLM2_DIR")
}

/// [`smollm2_dir`] for benchmarks: runs `cargo xtask fetch-model` when the model is missing.
pub fn smollm2_dir_fetched() -> Result<PathBuf, String> {
    fetched(smollm2_dir(), |dir| dir.join("model.safetensors").exists(), &[])
}

/// `cargo xtask fetch-model` with `args`, as a user types it.
fn fetch_command(args: &[&str]) -> String {
    ["cargo xtask fetch-model"].iter().chain(args).copied().collect::<Vec<_>>().join(" ")
}

/// Runs `cargo xtask fetch-model` with `args` in the workspace.
fn fetch_model(args: &[&str]) -> Result<(), String> {
    xtask("fetch-model", args)
}

/// Runs `cargo xtask <task>` with `args` in the workspace (its output to stderr).
fn xtask(task: &str, args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = std::process::Command::new(cargo)
        .current_dir(root)
        .args(["xtask", task])
        .args(args)
        .stdout(std::process::Stdio::inherit())
        .status()
        .map_err(|e| format!("cargo xtask {task}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo xtask {task} {args:?} failed ({status})")) }
}

/// The GGUF `cargo xtask make-model --shape <shape> --quant <quant>` writes (random weights at a
/// real model's shapes, `target/models/made/`), for benchmarks: made first when missing.
pub fn made_model_fetched(shape: &str, quant: &str) -> Result<PathBuf, String> {
    let made = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/models/made");
    let path = made.join(format!("{shape}-{quant}.gguf"));
    if !path.exists() {
        eprintln!(
            "{} missing; running cargo xtask make-model --shape {shape} --quant {quant}",
            path.display()
        );
        xtask("make-model", &["--shape", shape, "--quant", quant])?;
        if !path.exists() {
            return Err(format!("cargo xtask make-model did not write {}", path.display()));
        }
    }
    Ok(path)
}

/// The default model as users run it (the Q4_1 GGUF, see [`smollm2_gguf`]), for benchmarks:
/// runs `cargo xtask fetch-model` when it is missing.
pub fn default_model_fetched() -> Result<PathBuf, String> {
    smollm2_dir_fetched()?;
    let gguf = smollm2_gguf();
    if gguf.exists() { Ok(gguf) } else { Err(format!("{} missing after fetch-model", gguf.display())) }
}

/// The Q4_1 GGUF the default model's folder is converted from, which `cargo xtask fetch-model`
/// keeps beside that folder: the default model itself (loaded natively), and what llama.cpp
/// runs in the `peer` benchmarks.
pub fn smollm2_gguf() -> PathBuf {
    smollm2_dir().with_file_name("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Gemma 3 270M's Q4_K_M GGUF (a SentencePiece-style vocabulary of 262 144 tokens):
/// `$GEMMA3_GGUF`, else where `cargo xtask fetch-model --model gemma3-270m` writes it.
pub fn gemma3_gguf() -> PathBuf {
    model_path("GEMMA3_GGUF", "gemma3-270m/gemma-3-270m-q4_k_m.gguf")
}

const GEMMA3_FETCH: [&str; 2] = ["--model", "gemma3-270m"];

/// [`gemma3_gguf`] for tests: fails with what to run when the file is missing.
pub fn gemma3_gguf_for_tests() -> PathBuf {
    let path = gemma3_gguf();
    let present = path.exists();
    for_tests(path, present, &GEMMA3_FETCH, "GEMMA3_GGUF")
}

/// [`gemma3_gguf`] for benchmarks: runs `cargo xtask fetch-model --model gemma3-270m` when it
/// is missing.
pub fn gemma3_gguf_fetched() -> Result<PathBuf, String> {
    fetched(gemma3_gguf(), |path| path.exists(), &GEMMA3_FETCH)
}

/// llama.cpp's SPM tokenizer (`llm_tokenizer_spm_session`) as plainly as it can be written,
/// the oracle for the BPE `gguf::vocab` builds from an SPM vocabulary: starting from the
/// characters of `text` (spaces already written as `▁`), join the adjacent pair whose
/// concatenation is a token of the highest score, the leftmost among equal scores, until no
/// pair is a token; then each piece is its token, or its UTF-8 bytes' `<0xNN>` tokens.
/// Special tokens are not split out: `text` is one fragment between them.
pub fn spm_reference_encode(tokens: &[String], scores: &[f32], text: &str) -> Vec<u32> {
    let ids: std::collections::HashMap<&str, u32> =
        tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect();
    let mut pieces: Vec<String> = text.chars().map(String::from).collect();
    loop {
        let mut best: Option<(f32, usize)> = None;
        for i in 0..pieces.len().saturating_sub(1) {
            let joined = format!("{}{}", pieces[i], pieces[i + 1]);
            if let Some(&id) = ids.get(joined.as_str()) {
                let score = scores[id as usize];
                if best.is_none_or(|(s, _)| score > s) {
                    best = Some((score, i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        let right = pieces.remove(i + 1);
        pieces[i].push_str(&right);
    }
    let mut out = Vec::new();
    for p in &pieces {
        match ids.get(p.as_str()) {
            Some(&id) => out.push(id),
            None => out.extend(p.bytes().map(|b| ids[format!("<0x{b:02X}>").as_str()])),
        }
    }
    out
}

/// Writes a PEFT LoRA adapter for a base model of `config` into `dir` (`adapter_config.json`,
/// `adapter_model.safetensors`): rank `rank` on all seven projections of every layer, `A` and `B`
/// random (seeded) with entries of size `1/√fan_in`, `lora_alpha = rank` (scale 1), so the delta
/// is of the base projection's order: a random adapter that changes every answer.
pub fn write_peft_adapter(
    dir: &Path,
    config: &crate::ModelConfig,
    rank: usize,
    seed: u64,
) -> std::io::Result<()> {
    use crate::lora::{TARGET_MODULES, part_dims, peft};
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut random = |n: usize, fan_in: usize| -> Vec<u8> {
        let bound = (3.0 / fan_in as f32).sqrt();
        (0..n).flat_map(|_| rng.random_range(-bound..bound).to_le_bytes()).collect()
    };
    for layer in 0..config.num_hidden_layers {
        for (module, &(_, matrix, part)) in TARGET_MODULES.iter().enumerate() {
            let (fan_in, fan_out) = part_dims(config, matrix, part);
            let name = |ab| peft::tensor_name(layer, module, ab);
            tensors.push((name("A"), vec![rank, fan_in], random(rank * fan_in, fan_in)));
            tensors.push((name("B"), vec![fan_out, rank], random(fan_out * rank, rank)));
        }
    }
    let views = tensors.iter().map(|(name, shape, bytes)| {
        let view = TensorView::new(Dtype::F32, shape.clone(), bytes).map_err(std::io::Error::other);
        view.map(|v| (name.clone(), v))
    });
    let views = views.collect::<std::io::Result<Vec<_>>>()?;
    std::fs::create_dir_all(dir)?;
    safetensors::serialize_to_file(views, None, &dir.join(peft::ADAPTER_WEIGHTS))
        .map_err(std::io::Error::other)?;
    let targets = TARGET_MODULES.map(|(name, ..)| name);
    let config = serde_json::json!({
        "peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets,
        "bias": "none", "use_rslora": false, "use_dora": false, "fan_in_fan_out": false,
    });
    std::fs::write(dir.join(peft::ADAPTER_CONFIG), config.to_string())
}
