//! Writes `target/bench-report/report.md`: every figure with its goal, the raw criterion
//! medians of this run, and the markdown fragments (tables, charts) bench programs produced.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::Figures;
use super::criterion_results::Measured;
use super::registry::GOALS;

pub fn write(
    dir: &Path,
    summary: &Figures,
    fresh: &Figures,
    measured: &BTreeMap<String, Measured>,
    fragments: &[String],
) -> anyhow::Result<()> {
    let goals: BTreeMap<&str, &str> = GOALS.iter().copied().collect();
    let mut md = String::from("# Benchmark report\n\n");
    md.push_str("Figures from `cargo xtask bench` (medians; ratios measured within one run).\n");
    md.push_str("A figure not re-measured by the latest run keeps its previous value (marked *kept*).\n\n");
    md.push_str("| figure | value | goal | |\n|---|---:|---|---|\n");
    for (name, value) in summary {
        let goal = goals.get(name.as_str()).copied().unwrap_or("report");
        let kept = if fresh.contains_key(name) { "" } else { "*kept*" };
        writeln!(md, "| `{name}` | {value:.4} | {goal} | {kept} |")?;
    }
    if !measured.is_empty() {
        md.push_str("\n## Criterion medians of the latest run\n\n| benchmark | median | throughput |\n|---|---:|---:|\n");
        for (id, m) in measured {
            let tput = m.throughput.map(|t| format!("{:.3} G/s", t / m.median_ns)).unwrap_or_default();
            writeln!(md, "| `{id}` | {} | {tput} |", human_time(m.median_ns))?;
        }
    }
    for fragment in fragments {
        md.push('\n');
        md.push_str(fragment);
        md.push('\n');
    }
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

fn human_time(ns: f64) -> String {
    match ns {
        ns if ns < 1e3 => format!("{ns:.1} ns"),
        ns if ns < 1e6 => format!("{:.2} µs", ns / 1e3),
        ns if ns < 1e9 => format!("{:.2} ms", ns / 1e6),
        ns => format!("{:.2} s", ns / 1e9),
    }
}
