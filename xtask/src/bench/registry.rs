//! The data that drives `cargo xtask bench`: which bench targets exist, in which group,
//! which figures are ratios of two measurements of the same run, and the targets
//! the issues set (shown in `report.md`).

use super::Figures;

/// One `cargo bench` target.
#[derive(Debug)]
pub struct BenchTarget {
    /// Figure-name prefix this target measures (what `--only` selects).
    pub group: &'static str,
    pub package: &'static str,
    pub bench: &'static str,
    /// A criterion harness (takes criterion's CLI flags); `false` for plain programs.
    pub criterion: bool,
}

pub const TARGETS: &[BenchTarget] = &[
    BenchTarget { group: "block_alloc", package: "block-alloc", bench: "block_alloc", criterion: true },
    BenchTarget { group: "attn", package: "attn-kernels", bench: "attn", criterion: true },
    BenchTarget { group: "sched", package: "scheduler", bench: "sched", criterion: true },
    BenchTarget { group: "sim", package: "sim", bench: "sim", criterion: false },
    BenchTarget { group: "model", package: "model", bench: "model", criterion: false },
    BenchTarget { group: "e2e", package: "engine", bench: "e2e", criterion: false },
    BenchTarget { group: "server", package: "server", bench: "server", criterion: false },
    BenchTarget { group: "server", package: "server", bench: "embed", criterion: false },
    BenchTarget { group: "peer", package: "engine", bench: "peer", criterion: false },
    BenchTarget { group: "peer", package: "engine", bench: "peer_lookup", criterion: false },
    BenchTarget { group: "kv", package: "engine", bench: "kv", criterion: false },
    BenchTarget { group: "guided", package: "engine", bench: "guided", criterion: false },
    BenchTarget { group: "quality", package: "engine", bench: "quality", criterion: false },
    BenchTarget { group: "spec", package: "engine", bench: "spec", criterion: false },
    BenchTarget { group: "lora", package: "engine", bench: "lora", criterion: false },
    BenchTarget { group: "web", package: "scheduler", bench: "web", criterion: false },
    BenchTarget { group: "web", package: "server", bench: "web_overhead", criterion: false },
];

/// The group `python/bench/scale.py` measures (the package on Ray Serve): run by
/// `python::bench_scale` rather than `cargo bench`.
pub const PYTHON_GROUP: &str = "scale";

/// Ratios of two program figures measured in the same run, as `(name, num, den)`: set only when
/// both were measured now (a ratio across runs would mix two machines' loads).
pub const RATIOS: &[(&str, &str, &str)] = &[
    ("attn.prefill_4k_over_gemm", "attn.prefill_gflops_4k", "model.gemm_gflops"),
    // The faithfulness contract: each path's mean KL divergence over llama.cpp's default's, both
    // against the same f32 reference on the same GGUF.
    (
        "quality.smollm2.default_kld_over_llamacpp",
        "quality.smollm2.default.kld_mean",
        "quality.smollm2.llamacpp_default.kld_mean",
    ),
    (
        "quality.gemma3.default_kld_over_llamacpp",
        "quality.gemma3.default.kld_mean",
        "quality.gemma3.llamacpp_default.kld_mean",
    ),
    (
        "quality.smollm2.int8_kld_over_llamacpp",
        "quality.smollm2.int8.kld_mean",
        "quality.smollm2.llamacpp_default.kld_mean",
    ),
    (
        "quality.gemma3.int8_kld_over_llamacpp",
        "quality.gemma3.int8.kld_mean",
        "quality.gemma3.llamacpp_default.kld_mean",
    ),
];

/// Targets stated by the issues, shown beside the figures in `report.md`.
pub const GOALS: &[(&str, &str)] = &[
    ("block_alloc.alloc_free_ns", "≤ 50"),
    ("block_alloc.append_token_ns", "≤ 20"),
    ("block_alloc.fork_1k_blocks_us", "≤ 10"),
    ("block_alloc.prefix_lookup_4k_tokens_us", "≤ 10"),
    ("attn.decode_read_fraction", "≥ 0.80"),
    ("attn.decode_read_fraction_bf16", "≥ 0.70"),
    ("attn.decode_read_fraction_int8", "≥ 0.70"),
    ("kv.int8_max_seqs_over_bf16", "≥ 1.9"),
    ("peer.decode_6000_int8kv_over_llamacpp_q8kv", "≥ 2.0"),
    ("attn.paged_over_contiguous_bs16", "≤ 1.10"),
    ("attn.paged_over_contiguous_bs8", "≤ 1.15"),
    ("sched.step_us_256", "≤ 20"),
    ("sched.step_us_1024", "≤ 80"),
    ("sim.sharegpt.kv_util_paged", "≥ 0.96"),
    ("sim.sharegpt.concurrency_paged_over_oracle", "≥ 2.0"),
    ("model.decode_b1_bw_fraction", "≥ 0.7"),
    ("spec.verify_k4_over_k0", "≤ 1.3"),
    ("spec.ngram_b1_speedup_grounded", "≥ 2.0"),
    ("spec.ngram_b1_speedup_open", "≥ 0.97"),
    ("spec.gemma3.ngram_b1_speedup_grounded", "≥ 1.8"),
    ("spec.b64_ratio", "≥ 0.97"),
    ("peer.decode_b1_spec_over_llamacpp_lookup", "≥ 2.0"),
    ("lora.mixed_b64_over_base", "≥ 0.85"),
    ("lora.single_b64_over_base", "≥ 0.92"),
    ("model.l1b.prefill_mac_fraction", "≥ 0.8"),
    ("model.l1b.decode_b16_mac_fraction", "≥ 0.6"),
    ("model.l1b.decode_b1_bw_fraction", "≥ 0.8"),
    ("model.decode_b64_gemm_fraction", "≥ 0.5"),
    ("e2e.batching_gain", "≥ 8"),
    ("server.embed_over_prefill", "≥ 0.9"),
    ("attn.prefill_4k_over_gemm", "≥ 0.6"),
    ("peer.prefill_6000_over_llamacpp", "≥ 2.5"),
    ("peer.prefill_512_over_llamacpp", "≥ 2.0"),
    ("peer.decode_b1_over_llamacpp", "≥ 1.3"),
    ("peer.e2e_64_over_llamacpp", "≥ 3.0"),
    ("peer.gemma3.prefill_512_over_llamacpp", "≥ 2.0"),
    ("peer.gemma3.decode_b1_over_llamacpp", "≥ 1.3"),
    ("peer.gemma3.e2e_64_over_llamacpp", "≥ 2.5"),
    ("peer.gemma3.prefill_6000_over_llamacpp", "≥ 2.0"),
    ("peer.gemma3.decode_6000_over_llamacpp", "≥ 2.0"),
    ("peer.l1b.prefill_512_over_llamacpp", "≥ 2.0"),
    ("peer.l1b.decode_b1_over_llamacpp", "≥ 1.7"),
    ("peer.l1b.e2e_16_over_llamacpp", "≥ 1.8"),
    ("peer.l1b.e2e_64_over_llamacpp", "≥ 2.0"),
    ("peer.l1b_q4km.prefill_512_over_llamacpp", "≥ 1.5"),
    ("peer.l1b_q4km.decode_b1_over_llamacpp", "≥ 1.5"),
    ("peer.l1b_q4km.e2e_16_over_llamacpp", "≥ 1.5"),
    ("peer.l1b_q4km.e2e_64_over_llamacpp", "≥ 1.5"),
    ("peer.l8b.decode_b1_over_llamacpp", "≥ 1.4"),
    ("peer.l8b.prefill_512_over_llamacpp", "≥ 1.5"),
    ("kv.gemma3_bytes_per_token_32k_over_full", "≤ 0.25"),
    ("kv.gemma3_max_seqs_32k_over_full", "≥ 4"),
    ("e2e.kv_util_mean", "≥ 0.9"),
    ("cuda.decode_bw_fraction", "≥ 0.80"),
    ("cuda.paged_over_contiguous", "≤ 1.10"),
    ("web.kv_map_snapshot_us", "≤ 200"),
    ("guided.step_overhead_b64", "≤ 1.05"),
    ("web.dashboard_overhead", "≥ 0.98"),
    ("scale.serve_over_inprocess", "≥ 0.85"),
    ("quality.smollm2.default_kld_over_llamacpp", "≤ 0.25"),
    ("quality.gemma3.default_kld_over_llamacpp", "≤ 0.25"),
    ("quality.smollm2.default.top1_agree", "≥ 0.995"),
    ("quality.gemma3.default.top1_agree", "≥ 0.995"),
    ("quality.smollm2.int8_kld_over_llamacpp", "≤ 1.0"),
    ("quality.gemma3.int8_kld_over_llamacpp", "≤ 1.0"),
    // Where the caches hold every conversation: with less, a replica's users outnumber what its
    // cache holds, and an admission mostly evicts what the last request freed, whatever the routing.
    ("scale.prefix_hit_gain_over_rr_all", "≥ 0.2"),
    ("scale.prefix_ttft_p50_over_rr_all", "≤ 0.7"),
    // Routing on the replicas' KV cache events: sooner than round robin where half fits, and
    // never fewer hits than the approximate router's guesses.
    ("scale.events_ttft_p50_over_rr_half", "≤ 0.6"),
    ("scale.events_hit_over_approx_quarter", "≥ 1.0"),
    ("scale.events_hit_over_approx_half", "≥ 1.0"),
    ("scale.events_hit_over_approx_all", "≥ 1.0"),
];

pub fn group_names() -> String {
    let mut groups: Vec<&str> = TARGETS.iter().map(|t| t.group).collect();
    groups.push(PYTHON_GROUP);
    groups.dedup();
    groups.join(", ")
}

/// Every [`RATIOS`] figure whose two inputs are in `fresh` (this run's figures).
pub fn same_run_ratios(fresh: &Figures) -> Figures {
    RATIOS
        .iter()
        .filter_map(|&(name, num, den)| Some((name.to_owned(), fresh.get(num)? / fresh.get(den)?)))
        .collect()
}
