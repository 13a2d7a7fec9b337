//! Speculative decoding with a draft model (`{"method": "draft_model"}`) is lossless: a quantized
//! self-draft changes no token, finish or (beyond multi-row rounding) logprob of any request —
//! greedy, seeded, `n > 1`, under recompute and swap preemption with a draft cache that evicts —
//! while its drafts are accepted; SmolLM2's f32 folder drafted by its own Q4_1 GGUF decodes the
//! f32 tokens; a draft of another vocabulary or a shorter context is refused at start.

use engine::spec::SpeculativeConfig;
use engine::{Engine, EngineConfig, SamplingParams};

use crate::speculative::{assert_same, pressures, run, workload};
use crate::support::{Fixture, prompt_tokens, small_config};

/// A draft model at `path` proposing `k` tokens (`quantization`: the format it is quantized to
/// on load), every step (a verification pinned at a plain step's cost, as the n-gram tests').
fn draft(path: &std::path::Path, k: usize, quantization: Option<&str>) -> Option<SpeculativeConfig> {
    let q = quantization.map(|q| format!(r#", "quantization": "{q}""#)).unwrap_or_default();
    let json = format!(
        r#"{{"method": "draft_model", "model": {:?}, "num_speculative_tokens": {k}{q}}}"#,
        path.display().to_string()
    );
    let config = SpeculativeConfig::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
    Some(SpeculativeConfig { verify_cost: Some(1.0), ..config })
}

#[test]
fn a_quantized_self_draft_changes_no_token_and_is_accepted() {
    let fx = Fixture::new();
    let reqs = workload();
    for (name, config) in pressures() {
        let (plain, _) = run(&mut fx.engine(config.clone()), &reqs);
        let spec_config = draft(fx.dir.path(), 4, Some("q8_0"));
        let mut spec = fx.engine(EngineConfig { speculative_config: spec_config, ..config });
        let (drafted, _) = run(&mut spec, &reqs);
        assert_same(&drafted, &plain, name);
        let m = spec.metrics().spec_decode;
        assert!(m.num_draft_tokens > 0, "{name}: drafts were scored");
        // Sampled requests keep a greedy draft token only where they drew it; the greedy ones
        // take most of theirs.
        assert!(m.num_accepted_tokens > 0, "{name}: drafts were accepted");
    }
}

/// Drafts from a model whose own cache is too small for every sequence: sequences take turns
/// (the least recently drafting give their blocks back), and the tokens are the plain ones.
#[test]
fn a_draft_cache_smaller_than_the_batch_evicts_and_keeps_outputs() {
    let fx = Fixture::new();
    let reqs: Vec<(String, Vec<u32>, SamplingParams)> = (0..6u64)
        .map(|i| {
            (
                format!("g{i}"),
                prompt_tokens(i, 40),
                SamplingParams { ignore_eos: true, ..SamplingParams::greedy(30) },
            )
        })
        .collect();
    let (plain, _) = run(&mut fx.engine(small_config(256)), &reqs);
    // The draft's cache has as many blocks as the target's: 24 blocks for 6 sequences of up to
    // 70 tokens (5 blocks each) cannot hold them all at once.
    let config = EngineConfig { kv_cache: engine::KvCacheSize::Blocks(24), ..small_config(24) };
    let mut spec = fx.engine(EngineConfig { speculative_config: draft(fx.dir.path(), 3, None), ..config });
    let (drafted, _) = run(&mut spec, &reqs);
    assert_same(&drafted, &plain, "small draft cache");
    let m = spec.metrics().spec_decode;
    assert_eq!(m.num_accepted_tokens, m.num_draft_tokens, "an exact self-draft is always right");
    assert!(m.num_draft_tokens > 0);
}

#[test]
fn a_draft_of_another_vocabulary_or_a_shorter_context_is_refused() {
    let fx = Fixture::new();
    let copy = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for entry in std::fs::read_dir(fx.dir.path()).unwrap_or_else(|e| panic!("{e}")).flatten() {
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap_or_else(|e| panic!("{e}"));
    }
    let edit = |file: &str, from: &str, to: &str| {
        let path = copy.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains(from), "{file} has no {from}");
        std::fs::write(&path, text.replace(from, to)).unwrap_or_else(|e| panic!("{e}"));
    };
    let start = |spec: Option<SpeculativeConfig>| {
        Engine::new(fx.dir.path(), EngineConfig { speculative_config: spec, ..small_config(64) })
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    edit("tokenizer.json", "<|im_end|>", "<|im_stop|>");
    let e = start(draft(copy.path(), 2, None));
    assert!(e.contains("tokenizer differs from the target's at token"), "{e}");
    edit("tokenizer.json", "<|im_stop|>", "<|im_end|>");
    let config_path = copy.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    config["max_position_embeddings"] = 128.into();
    std::fs::write(&config_path, config.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let e = start(draft(copy.path(), 2, None));
    assert!(e.contains("the draft model serves 128 positions, the target 512"), "{e}");
    let e = start(draft(&model::testing::smollm2_gguf(), 2, None));
    assert!(e.contains("vocabulary") && e.contains("is not the target's"), "{e}");
    let e = start(draft(&copy.path().join("missing"), 2, None));
    assert!(e.contains("draft model") && e.contains("missing"), "{e}");
}

/// SmolLM2's f32 folder drafted by its own Q4_1 GGUF (the same tokenizer): the greedy tokens are
/// the f32 model's own, and most draft tokens are accepted.
#[test]
fn smollm2_f32_drafted_by_its_q4_1_gguf_decodes_the_f32_tokens() {
    let dir = model::testing::smollm2_dir_for_tests();
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let config = EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(128),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    let mut plain = Engine::new(&dir, config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let reqs: Vec<(String, Vec<u32>, SamplingParams)> =
        ["What is the capital of France?", "Name three colours."]
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let chat = plain
                    .render_chat("q", &[model::ChatMessage::new("user", *text)])
                    .unwrap_or_else(|e| panic!("{e}"));
                let prompt =
                    plain.tokenize("q", engine::Prompt::Text(chat)).unwrap_or_else(|e| panic!("{e}"));
                (format!("q{i}"), prompt, SamplingParams::greedy(32))
            })
            .collect();
    let (want, _) = run(&mut plain, &reqs);
    let mut spec = Engine::new(&dir, EngineConfig { speculative_config: draft(&gguf, 4, None), ..config })
        .unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = run(&mut spec, &reqs);
    assert_same(&got, &want, "smollm2 f32 with a Q4_1 draft");
    let m = spec.metrics().spec_decode;
    assert!(
        m.num_accepted_tokens * 2 > m.num_draft_tokens,
        "{} of {}",
        m.num_accepted_tokens,
        m.num_draft_tokens
    );
}

/// A byte budget holds both caches: a self-draft's blocks are as large as the target's, so the
/// target gets half the blocks it gets alone.
#[test]
fn a_byte_budget_is_shared_by_the_target_and_its_draft() {
    let fx = Fixture::new();
    let config = EngineConfig { kv_cache: engine::KvCacheSize::Bytes(8 << 20), ..small_config(0) };
    let alone = fx.engine(config.clone()).num_kv_blocks();
    let shared = fx
        .engine(EngineConfig { speculative_config: draft(fx.dir.path(), 2, None), ..config })
        .num_kv_blocks();
    assert!(
        shared * 2 <= alone && shared * 2 + 2 >= alone,
        "{shared} blocks beside the draft, {alone} alone"
    );
}
