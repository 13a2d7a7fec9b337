//! The simulator on a model with sliding-window layers: the engine's hybrid KV layout runs
//! several times the 32k-token Gemma 3 sequences a full cache runs in the same memory.

use sim::{CostModel, Hardware, KvGroups, ModelShape, SimSetup, Trace, simulate_paged};

/// Twenty requests growing to 32.7k tokens, all at once, in KV memory for four 32k sequences
/// of every layer (outputs long enough that the first are still running when the last start).
fn max_running(groups: KvGroups) -> usize {
    let max_model_len = 32_768;
    let setup = SimSetup {
        capacity_tokens: 4 * max_model_len + 64,
        max_model_len,
        kv_groups: groups,
        watermark: 0.0,
        ..SimSetup::paper_sharegpt()
    };
    let lines: String = (0..20).map(|_| "{\"input\": 30000, \"output\": 2700, \"arrival\": 0}\n").collect();
    let trace = Trace::from_jsonl(&lines, f64::INFINITY, max_model_len, 0).expect("trace");
    let cost = CostModel::new(ModelShape::GEMMA3_270M, Hardware::A100_40GB);
    let report = simulate_paged(&trace, &setup, &cost).expect("simulate");
    assert_eq!(report.finished, 20, "every request finishes");
    report.max_running
}

#[test]
fn gemma3_runs_over_four_times_the_32k_sequences_of_a_full_cache() {
    let gemma = ModelShape::GEMMA3_270M;
    let hybrid = max_running(KvGroups::of(&gemma));
    let full = max_running(KvGroups::of(&ModelShape { sliding_layers: 0, ..gemma }));
    assert_eq!(full, 4);
    assert!(hybrid >= 4 * full, "hybrid runs {hybrid} at once, a full cache {full}");
}
