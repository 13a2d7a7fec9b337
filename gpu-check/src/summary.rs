//! The short summary `gpu_run` prints at the end of the GPU run (and writes to
//! `$OUT/summary.txt`): how many check sections passed, then per section its status and passed
//! / failed / error counts, the failing cases with their parameters, the last log lines of a
//! section that crashed or timed out, the benchmarks apart (they measure, so they do not count
//! toward the checks that passed), and the headline figures.

use std::fmt::Write as _;

use serde_json::Value;

use crate::figures::{Figures, SectionRecord, Status};
use crate::runner::records_in;
use crate::sections::{Kind, SECTIONS};

/// Failing cases listed per section (the log and `figures.json` have the rest).
const CASES_SHOWN: usize = 12;

/// The headline figures, in the order printed.
const HEADLINES: [&str; 18] = [
    "device",
    "driver",
    "cuda.copy_tb_s",
    "cuda.decode_bw_fraction",
    "cuda.decode_v1_bw_fraction",
    "cuda.decode_v2_bw_fraction",
    "cuda.paged_over_contiguous",
    // The automatic v1/v2 choice on sweep shapes it was not fitted to.
    "cuda.sweep.heldout_auto_picked_faster",
    "cuda.sweep.heldout_auto_worst_over_best",
    "cuda.e2e_output_tok_s",
    "cuda.e2e_decode_step_ms",
    "cuda.e2e_decode_step_bw_fraction",
    "cuda.e2e_greedy_tokens",
    "cuda.e2e_greedy_argmax_agreement",
    "cuda.e2e_greedy_near_ties",
    "cuda.e2e_greedy_disagreements_not_ties",
    "cuda.forward_tiny_bf16_max_logit_error_over_tolerance",
    "cuda.forward_tiny_f16_max_logit_error_over_tolerance",
];

/// The summary of a figures file.
pub fn render(figures: &Figures) -> String {
    let mut records = records_in(figures);
    // Plan order first, anything else after.
    records.sort_by_key(|r| SECTIONS.iter().position(|s| s.name == r.section).unwrap_or(usize::MAX));
    let (checks, benchmarks): (Vec<_>, Vec<_>) = records.iter().partition(|r| r.kind == Kind::Check);
    let mut out = String::new();
    let ok = checks.iter().filter(|r| r.status.is_ok()).count();
    let benchmark_words: Vec<String> =
        benchmarks.iter().map(|r| format!("{} {}", r.section, status_word(r.status))).collect();
    let benchmark_words = if benchmark_words.is_empty() { "none".into() } else { benchmark_words.join(", ") };
    let _ = writeln!(
        out,
        "GPU run summary: {ok} of {} check sections passed; benchmarks: {benchmark_words}",
        checks.len()
    );
    for r in &checks {
        section_lines(&mut out, r);
    }
    if !benchmarks.is_empty() {
        let _ = writeln!(out, "benchmarks (measure only, not counted among the checks):");
        for r in &benchmarks {
            section_lines(&mut out, r);
        }
    }
    let _ = writeln!(out, "headline figures:");
    for key in HEADLINES {
        if let Some(v) = figures.get(key) {
            let _ = writeln!(out, "  {key} = {}", show(v));
        }
    }
    let worst: Vec<(&String, &Value)> =
        figures.iter().filter(|(k, _)| k.starts_with("check.") && k.ends_with("max_rel_err")).collect();
    if let Some((k, v)) = worst.iter().max_by(|a, b| {
        let (x, y) = (a.1.as_f64().unwrap_or(0.0), b.1.as_f64().unwrap_or(0.0));
        x.total_cmp(&y)
    }) {
        let _ = writeln!(out, "  largest attention error: {k} = {}", show(v));
    }
    out
}

fn section_lines(out: &mut String, r: &SectionRecord) {
    let flag = if r.status.is_ok() { "" } else { "  <--" };
    let _ = writeln!(
        out,
        "  {:<16} {:<9} passed {:>4}  failed {:>3}  errors {:>2}  {:>6.1} s{flag}",
        r.section,
        status_word(r.status),
        r.passed,
        r.failed,
        r.errors,
        r.seconds
    );
    for case in r.failing.iter().take(CASES_SHOWN) {
        let _ = writeln!(out, "      {case}");
    }
    if r.failing.len() > CASES_SHOWN {
        let _ = writeln!(out, "      … {} more in figures.json", r.failing.len() - CASES_SHOWN);
    }
    for line in &r.log_tail {
        let _ = writeln!(out, "      | {line}");
    }
}

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Running => "running",
        Status::Passed => "passed",
        Status::Failed => "FAILED",
        Status::NoCases => "NO CASES",
        Status::Error => "ERROR",
        Status::TimedOut => "TIMEOUT",
        Status::Crashed => "CRASHED",
        Status::Skipped => "SKIPPED",
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{x:.4}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::runner::merge_into;

    #[test]
    fn names_each_failing_case_with_its_parameters_and_the_headlines() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("figures.json");
        let mut figures = Figures::new();
        figures.insert("cuda.decode_bw_fraction".into(), json!(0.83));
        let failing = SectionRecord {
            section: "attention_v2".into(),
            status: Status::Failed,
            passed: 140,
            failed: 2,
            failing: vec![
                "attention prefill bf16 h256 b32 kv8 group 4 ctx 1100 V2: max rel err 3.2e-2".into(),
                "attention long f16 h128 b16 kv8 group 8 ctx 32768 V2: max rel err 1.0e30".into(),
            ],
            seconds: 7.5,
            ..SectionRecord::default()
        };
        let crashed = SectionRecord {
            section: "far_offsets".into(),
            status: Status::Crashed,
            errors: 1,
            failing: vec!["error: ended by signal 11".into()],
            log_tail: vec!["CUDA_ERROR_ILLEGAL_ADDRESS".into()],
            ..SectionRecord::default()
        };
        let passed = SectionRecord {
            section: "reshape".into(),
            status: Status::Passed,
            passed: 1,
            ..SectionRecord::default()
        };
        let bench = SectionRecord {
            section: "bandwidth".into(),
            kind: Kind::Benchmark,
            status: Status::Passed,
            passed: 1,
            figures: figures.clone(),
            ..SectionRecord::default()
        };
        for r in [&bench, &crashed, &failing, &passed] {
            merge_into(&path, r).unwrap();
        }
        let figures: Figures = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let text = render(&figures);
        assert!(
            text.starts_with("GPU run summary: 1 of 3 check sections passed; benchmarks: bandwidth passed\n"),
            "{text}"
        );
        // Plan order among the checks (reshape, attention_v2, far_offsets), the benchmarks after.
        let at =
            |s: &str| text.find(&format!("  {s} ")).unwrap_or_else(|| panic!("{s} missing from\n{text}"));
        assert!(at("reshape") < at("attention_v2") && at("attention_v2") < at("far_offsets"));
        assert!(at("far_offsets") < text.find("benchmarks (measure only").unwrap());
        assert!(text.find("benchmarks (measure only").unwrap() < at("bandwidth"));
        assert!(text.contains("h256 b32 kv8 group 4 ctx 1100 V2"));
        assert!(text.contains("ctx 32768"));
        assert!(text.contains("CRASHED") && text.contains("signal 11") && text.contains("| CUDA_ERROR"));
        assert!(text.contains("cuda.decode_bw_fraction = 0.8300"));
    }

    /// The summary of `records` merged into a fresh figures file.
    fn summary_of(records: &[SectionRecord]) -> String {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("figures.json");
        for r in records {
            merge_into(&path, r).unwrap();
        }
        render(&serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap())
    }

    #[test]
    fn a_check_section_that_ran_no_case_is_not_counted_as_passed() {
        let record = |section: &str, status, passed| SectionRecord {
            section: section.into(),
            status,
            passed,
            ..SectionRecord::default()
        };
        let text =
            summary_of(&[record("reshape", Status::Passed, 37), record("attention_v1", Status::NoCases, 0)]);
        assert!(
            text.starts_with("GPU run summary: 1 of 2 check sections passed; benchmarks: none\n"),
            "{text}"
        );
        let line = text.lines().find(|l| l.contains("attention_v1")).unwrap();
        assert!(line.contains("NO CASES") && line.ends_with("<--"), "{line}");
    }

    #[test]
    fn benchmarks_do_not_count_toward_the_checks_line() {
        let check = SectionRecord {
            section: "far_offsets".into(),
            status: Status::Passed,
            passed: 5,
            ..SectionRecord::default()
        };
        let bench = |section: &str, status| SectionRecord {
            section: section.into(),
            kind: Kind::Benchmark,
            status,
            passed: 1,
            ..SectionRecord::default()
        };
        let text = summary_of(&[check, bench("bandwidth", Status::Passed), bench("e2e", Status::TimedOut)]);
        // One check, and it passed; the benchmarks, a passed one and a timed-out one, neither
        // raise nor lower that count, and each is reported with its status.
        assert!(
            text.starts_with(
                "GPU run summary: 1 of 1 check sections passed; benchmarks: bandwidth passed, e2e TIMEOUT\n"
            ),
            "{text}"
        );
        let line = text.lines().find(|l| l.trim_start().starts_with("e2e ")).unwrap();
        assert!(line.contains("TIMEOUT") && line.ends_with("<--"), "{line}");
    }
}
