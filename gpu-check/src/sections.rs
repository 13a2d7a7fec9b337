//! The sections of the GPU run in the order `gpu_run` starts them, one process each: which
//! program runs a section (`gpu_check` or `gpu_model_check`, with `--only NAME`), its time cap,
//! its estimated time on the H200 machine (16 cores; host work scaled from the 2-core
//! development VM, device work as bytes over bandwidth), whether it is a check or a benchmark
//! (`bandwidth` and `e2e` only measure), and whether the sanitizer script runs its smallest
//! cases.
//!
//! | section | program | what | estimate | cap |
//! |---|---|---|---|---|
//! | `reshape` | gpu_check | `reshape_and_cache`, 36 configurations × 37 slots | 2 s | 20 s |
//! | `copy_swap` | gpu_check | copy-on-write copies and swaps, bf16, 2 layers × 32 blocks | 2 s | 20 s |
//! | `attention_v1` | gpu_check | every configuration × decode / varlen / prefill batches, long contexts, long prompts through v1 | 8 s | 40 s |
//! | `attention_v2` | gpu_check | the same through v2 | 8 s | 40 s |
//! | `attention_split` | gpu_check | the same through v2 with a two-token workspace (several launches) | 8 s | 40 s |
//! | `prefill_tiles` | gpu_check | the same through the tiled prefill path (what the engine runs) | 8 s | 40 s |
//! | `bandwidth` | gpu_check | 1 GiB copies, decode over 64 × 4 096 tokens × 6 variants, the v1/v2 sweep (92 shapes the variant choice was fitted to, 120 held out) | 4 s | 30 s |
//! | `far_offsets` | gpu_check | every cache kernel past element 2³² of a 17 GB pool | 3 s | 30 s |
//! | `model_bf16` | gpu_model_check | three tiny random models, CUDA bf16 forward against the CPU's | 9 s | 30 s |
//! | `model_f16` | gpu_model_check | the same in f16 | 9 s | 30 s |
//! | `model_families` | gpu_model_check | every family's tiny checkpoint, bf16, contexts inside its windows | 3 s | 20 s |
//! | `e2e_greedy` | gpu_model_check | the engine's greedy tokens on the GPU, each checked against the CPU forward | 20 s | 60 s |
//! | `e2e` | gpu_model_check | `cuda.e2e_output_tok_s`: 256 × (512 in, 128 out) on a Llama-3.2-1B shape; its decode steps' bytes over a 1 GiB copy's bandwidth | 30 s | 60 s |
//!
//! About 120 s expected. The caps sum past the run's budget on purpose: `gpu_run` gives each
//! section the smaller of its cap and what is left of [`RUN_BUDGET_S`], so a hang costs one
//! section, and the summary is printed inside [`RUN_TIMEOUT_S`] whatever happens.

use serde::{Deserialize, Serialize};

/// What a section is for: a check passes or fails on its cases; a benchmark measures (its
/// figures are its result), so the summary reports it apart and does not count it among the
/// checks that passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    #[default]
    Check,
    Benchmark,
}

/// The two programs of the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `gpu_check`: kernels against the CPU reference, bandwidth.
    Kernels,
    /// `gpu_model_check`: the CUDA forward against the CPU's, the engine on CUDA.
    Model,
}

impl Program {
    /// The binary's file name (also its log's stem: `$OUT/<binary>.log`).
    pub fn binary(self) -> &'static str {
        match self {
            Program::Kernels => "gpu_check",
            Program::Model => "gpu_model_check",
        }
    }
}

/// One section of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub name: &'static str,
    pub program: Program,
    pub estimate_s: u64,
    pub cap_s: u64,
    /// Checks run with `CUDA_LAUNCH_BLOCKING=1` (a fault is reported at the launch that made it),
    /// the benchmarks without it; the summary counts the checks that passed and reports the
    /// benchmarks apart.
    pub kind: Kind,
    /// The sanitizer script runs this section's smallest cases.
    pub sanitize: bool,
}

const fn section(name: &'static str, program: Program, estimate_s: u64, cap_s: u64) -> Section {
    Section { name, program, estimate_s, cap_s, kind: Kind::Check, sanitize: false }
}

/// Every section, in running order.
pub const SECTIONS: [Section; 13] = [
    Section { sanitize: true, ..section("reshape", Program::Kernels, 2, 20) },
    section("copy_swap", Program::Kernels, 2, 20),
    section("attention_v1", Program::Kernels, 8, 40),
    Section { sanitize: true, ..section("attention_v2", Program::Kernels, 8, 40) },
    section("attention_split", Program::Kernels, 8, 40),
    Section { sanitize: true, ..section("prefill_tiles", Program::Kernels, 8, 40) },
    Section { kind: Kind::Benchmark, ..section("bandwidth", Program::Kernels, 4, 30) },
    section("far_offsets", Program::Kernels, 3, 30),
    section("model_bf16", Program::Model, 9, 30),
    section("model_f16", Program::Model, 9, 30),
    section("model_families", Program::Model, 3, 20),
    section("e2e_greedy", Program::Model, 20, 60),
    Section { kind: Kind::Benchmark, ..section("e2e", Program::Model, 30, 60) },
];

/// The sections `program` runs (what its `--only` accepts).
pub fn of(program: Program) -> impl Iterator<Item = &'static Section> {
    SECTIONS.iter().filter(move |s| s.program == program)
}

/// The section called `name`.
pub fn by_name(name: &str) -> Option<&'static Section> {
    SECTIONS.iter().find(|s| s.name == name)
}

/// What `gpu_run` may spend on the sections together.
pub const RUN_BUDGET_S: u64 = 300;
/// `run.sh` in all (set-up, the cubin probe and its fallback, the sections, the summary): the
/// `timeout_s` that `cargo xtask gpu-check --bundle` prints. Two runs and a machine start fit in
/// the 15 minutes a session may hold the device.
pub const RUN_TIMEOUT_S: u64 = 360;
/// The sanitizer script's cap per tool and section (the sanitizers slow kernels 10–100×).
pub const SANITIZE_CAP_S: u64 = 90;
/// What `gpu_run --sanitize` may spend in all, and `sanitize.sh`'s `timeout_s`.
pub const SANITIZE_BUDGET_S: u64 = 420;
pub const SANITIZE_TIMEOUT_S: u64 = 480;

// Set-up, the probe and a fallback precompile fit between the budget and the timeout; two runs
// and a machine start fit in the 15 minutes a session may hold the device.
const _: () = assert!(RUN_BUDGET_S + 45 <= RUN_TIMEOUT_S);
const _: () = assert!(2 * RUN_TIMEOUT_S + 120 <= 15 * 60);
const _: () = assert!(SANITIZE_BUDGET_S + 45 <= SANITIZE_TIMEOUT_S);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_estimates_fit_the_budget() {
        let mut names: Vec<_> = SECTIONS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SECTIONS.len());
        let estimates: u64 = SECTIONS.iter().map(|s| s.estimate_s).sum();
        assert!(estimates * 2 <= RUN_BUDGET_S, "{estimates} s expected: leave room for slow starts");
        assert!(SECTIONS.iter().all(|s| s.estimate_s < s.cap_s && s.cap_s <= RUN_BUDGET_S));
        assert_eq!(by_name("e2e").map(|s| s.program), Some(Program::Model));
        assert_eq!(of(Program::Kernels).count() + of(Program::Model).count(), SECTIONS.len());
        assert!(SECTIONS.iter().filter(|s| s.sanitize).all(|s| s.program == Program::Kernels));
        let benchmarks: Vec<_> =
            SECTIONS.iter().filter(|s| s.kind == Kind::Benchmark).map(|s| s.name).collect();
        assert_eq!(benchmarks, ["bandwidth", "e2e"]);
    }

    #[test]
    fn the_bundle_prints_these_timeouts() {
        // xtask (which does not depend on this crate) prints the `timeout_s` of each script.
        let xtask = include_str!("../../xtask/src/gpu_check.rs");
        assert!(xtask.contains(&format!("pub const RUN_TIMEOUT_S: u64 = {RUN_TIMEOUT_S};")));
        assert!(xtask.contains(&format!("pub const SANITIZE_TIMEOUT_S: u64 = {SANITIZE_TIMEOUT_S};")));
    }
}
