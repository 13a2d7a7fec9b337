//! `cargo xtask bench [--quick] [--only GROUP]`: runs the benchmark targets and folds their
//! results into `target/bench-report/summary.json` (flat `{"figure.name": number}`) and `report.md`.
//!
//! Where figures come from (see `registry.rs` for the lists):
//! - criterion benchmarks whose id is `GROUP/leaf_UNIT` (`_ns`, `_us`, `_ms`, `_s`): the median,
//!   converted to that unit, becomes figure `GROUP.leaf_UNIT`;
//! - programs (`harness = false` benches, simulations) that write flat JSON maps, and optional
//!   markdown fragments for the report, into `$BENCH_FIGURES_DIR`; the `scale` group is such a
//!   program in Python (`python/bench/scale.py`, the package on Ray Serve, `python.rs`).
//!
//! A run updates the figures it measured and keeps the others.

mod criterion_results;
mod registry;
mod report;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, fresh_dir, run as run_cmd, workspace_root};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Fewer samples of the same workloads (never smaller workloads).
    #[arg(long)]
    pub quick: bool,
    /// Only run the benchmark groups with this figure-name prefix (repeatable, or several
    /// separated by commas: `--only kv,guided,scale`), e.g. `block_alloc`, `attn`, `sched`,
    /// `sim`, `model`, `e2e`, `cuda`, `scale`.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Instead of running benchmarks, merge the numeric `cuda.*` figures of a GPU run's
    /// `figures.json` (from `sh target/gpu-bundle/run.sh`) into the report.
    #[arg(long, value_name = "FIGURES_JSON", conflicts_with_all = ["quick", "only"])]
    pub import_gpu: Option<std::path::PathBuf>,
}

/// Flat figure map, ordered by name so the JSON diff stays readable.
pub type Figures = BTreeMap<String, f64>;

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    let report_dir = root.join("target/bench-report");
    if let Some(file) = &args.import_gpu {
        return import_gpu_figures(&report_dir, file);
    }
    // Before the last run's folders are cleared: a mistyped group leaves them as they were.
    let known = |g: &str| g == registry::PYTHON_GROUP || registry::TARGETS.iter().any(|t| t.group == g);
    if let Some(unknown) = args.only.iter().find(|g| !known(g)) {
        bail!("no benchmark group {unknown:?}; groups: {}", registry::group_names());
    }
    let criterion_home = report_dir.join("criterion-run");
    let figures_dir = report_dir.join("figures-run");
    fresh_dir(&criterion_home)?;
    fresh_dir(&figures_dir)?;

    let selected: Vec<&registry::BenchTarget> = registry::TARGETS
        .iter()
        .filter(|t| args.only.is_empty() || args.only.iter().any(|g| g == t.group))
        .collect();
    let python_scale = args.only.is_empty() || args.only.iter().any(|g| g == registry::PYTHON_GROUP);
    for target in &selected {
        let mut cmd = cargo();
        cmd.args(["bench", "-p", target.package, "--bench", target.bench, "--"])
            .env("CRITERION_HOME", &criterion_home)
            .env("BENCH_FIGURES_DIR", &figures_dir)
            .env("BENCH_QUICK", if args.quick { "1" } else { "0" });
        if target.criterion {
            cmd.arg("--noplot");
            if args.quick {
                cmd.args(["--sample-size", "10", "--warm-up-time", "0.5", "--measurement-time", "1"]);
            }
        }
        run_cmd(&mut cmd)?;
    }
    if python_scale {
        crate::python::bench_scale(&figures_dir, args.quick)?;
    }

    let measured = criterion_results::load(&criterion_home)?;
    let mut fresh = criterion_results::figures(&measured);
    let fragments = read_program_outputs(&figures_dir, &mut fresh)?;
    let ratios = registry::same_run_ratios(&fresh);
    fresh.extend(ratios);

    let summary = merge_into_summary(&report_dir, &fresh)?;
    report::write(&report_dir, &summary, &fresh, &measured, &fragments)?;
    Ok(())
}

/// `summary.json` with `fresh` merged in (written back); prints what was added.
fn merge_into_summary(report_dir: &Path, fresh: &Figures) -> anyhow::Result<Figures> {
    std::fs::create_dir_all(report_dir)?;
    let summary_path = report_dir.join("summary.json");
    let previous = std::fs::read_to_string(&summary_path).unwrap_or_else(|_| "{}".to_owned());
    let mut summary: Figures =
        serde_json::from_str(&previous).with_context(|| format!("parsing {}", summary_path.display()))?;
    summary.extend(fresh.clone());
    std::fs::write(&summary_path, serde_json::to_string_pretty(&summary)? + "\n")?;
    eprintln!("bench: {} figure(s) measured; wrote {}", fresh.len(), summary_path.display());
    for (name, value) in fresh {
        eprintln!("  {name} = {value:.4}");
    }
    Ok(summary)
}

/// The numeric `cuda.*` figures of a GPU run's `figures.json` (its other entries are section
/// records and per-case checks), merged into `summary.json`.
fn import_gpu_figures(report_dir: &Path, file: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let all: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    let fresh: Figures = all
        .into_iter()
        .filter(|(name, _)| name.starts_with("cuda."))
        .filter_map(|(name, value)| value.as_f64().map(|v| (name, v)))
        .collect();
    if fresh.is_empty() {
        bail!("{} holds no numeric cuda.* figure", file.display());
    }
    merge_into_summary(report_dir, &fresh).map(drop)
}

/// Merges every `*.json` figure map a bench program wrote into `figures`; returns every `*.md`
/// fragment.
fn read_program_outputs(dir: &Path, figures: &mut Figures) -> anyhow::Result<Vec<String>> {
    let mut fragments = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => {
                let map: Figures = serde_json::from_str(&text)
                    .with_context(|| format!("parsing figures in {}", path.display()))?;
                figures.extend(map);
            }
            Some("md") => fragments.push(text),
            _ => {}
        }
    }
    Ok(fragments)
}
