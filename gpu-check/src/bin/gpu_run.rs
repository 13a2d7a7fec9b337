//! `gpu_run`: the GPU run's driver (what `run.sh` ends with). Starts every section of
//! `gpu_check::sections::SECTIONS` as its own process of the bundle's `gpu_check` or
//! `gpu_model_check` (`--only NAME`; checks with `CUDA_LAUNCH_BLOCKING=1`), within the run's
//! time budget; appends each program's output to `$OUT/<program>.log`, merges each section's
//! record into `$OUT/figures.json` as it ends, and prints the summary (also
//! `$OUT/summary.txt`). Exits non-zero when a section did not pass.
//!
//! `gpu_run --sanitize` runs the smallest cases of the sections marked for it under
//! `compute-sanitizer` (`--tool memcheck`, then `--tool racecheck`; the tool from
//! `$COMPUTE_SANITIZER`, else `compute-sanitizer` on `PATH`), logged to `$OUT/sanitize.log`.
//! `gpu_run --summary FILE` prints the summary of an existing figures file.
//!
//! Options: `--out DIR` (default `$OUT`, else `./gpu-out`), `--only a,b` (those sections),
//! `--started-at UNIX_SECONDS` (when `run.sh` started: the budget shrinks by what set-up took).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpu_check::figures::{Figures, SectionRecord};
use gpu_check::runner::{RunDirs, SectionRun, run_all};
use gpu_check::sections::{
    Kind, RUN_BUDGET_S, RUN_TIMEOUT_S, SANITIZE_BUDGET_S, SANITIZE_CAP_S, SECTIONS, Section,
};
use gpu_check::summary::render;

/// Seconds kept back at the end of `run.sh`'s timeout for the summary.
const SUMMARY_MARGIN_S: u64 = 15;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    if let Some(file) = flag("--summary") {
        return match read_figures(Path::new(&file)) {
            Some(f) => {
                print!("{}", render(&f));
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("gpu_run: {file} is not a figures file");
                ExitCode::FAILURE
            }
        };
    }
    let out = flag("--out")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("OUT").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("gpu-out"));
    let dirs = RunDirs { out, scratch: std::env::temp_dir().join(format!("gpu-run-{}", std::process::id())) };
    let Some(bin_dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) else {
        eprintln!("gpu_run: cannot find the bundle's folder");
        return ExitCode::FAILURE;
    };
    let only: Option<Vec<String>> = flag("--only").map(|s| s.split(',').map(str::to_owned).collect());
    let chosen = SECTIONS.iter().filter(|s| only.as_ref().is_none_or(|o| o.iter().any(|n| n == s.name)));
    let sanitize = args.iter().any(|a| a == "--sanitize");
    let (plan, budget) = if sanitize {
        let tool = std::env::var_os("COMPUTE_SANITIZER").unwrap_or_else(|| "compute-sanitizer".into());
        (sanitize_plan(chosen, &bin_dir, &tool), Duration::from_secs(SANITIZE_BUDGET_S))
    } else {
        let started = flag("--started-at").and_then(|s| s.parse::<u64>().ok());
        (plan(chosen, &bin_dir), budget(started))
    };
    eprintln!(
        "gpu_run: {} sections, budget {} s, output in {}",
        plan.len(),
        budget.as_secs(),
        dirs.out.display()
    );
    let records = run_all(&plan, &dirs, budget);
    let _ = std::fs::remove_dir_all(&dirs.scratch);
    let figures = read_figures(&dirs.figures()).unwrap_or_default();
    let text = render(&figures);
    print!("{text}");
    if let Err(e) = std::fs::write(dirs.out.join("summary.txt"), &text) {
        eprintln!("gpu_run: writing the summary: {e}");
    }
    if records.iter().all(|r: &SectionRecord| r.status.is_ok()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The run's budget: [`RUN_BUDGET_S`], less what `run.sh` spent before this started.
fn budget(started_at: Option<u64>) -> Duration {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let spent = started_at.map_or(0, |s| now.saturating_sub(s));
    Duration::from_secs(RUN_BUDGET_S.min(RUN_TIMEOUT_S.saturating_sub(SUMMARY_MARGIN_S + spent)))
}

fn command(bin_dir: &Path, s: &Section, extra: &[&str]) -> Vec<OsString> {
    let mut c = vec![bin_dir.join(s.program.binary()).into_os_string(), "--only".into(), s.name.into()];
    c.extend(extra.iter().map(OsString::from));
    c
}

fn plan<'a>(sections: impl Iterator<Item = &'a Section>, bin_dir: &Path) -> Vec<SectionRun> {
    sections
        .map(|s| SectionRun {
            name: s.name.to_owned(),
            log: s.program.binary().to_owned(),
            kind: s.kind,
            command: command(bin_dir, s, &[]),
            env: if s.kind == Kind::Check {
                vec![("CUDA_LAUNCH_BLOCKING".into(), "1".into())]
            } else {
                Vec::new()
            },
            cap: Duration::from_secs(s.cap_s),
        })
        .collect()
}

fn sanitize_plan<'a>(
    sections: impl Iterator<Item = &'a Section> + Clone,
    bin_dir: &Path,
    tool: &OsString,
) -> Vec<SectionRun> {
    let mut runs = Vec::new();
    for check in ["memcheck", "racecheck"] {
        for s in sections.clone().filter(|s| s.sanitize) {
            let mut cmd: Vec<OsString> = vec![tool.clone()];
            cmd.extend(["--tool", check, "--error-exitcode", "9", "--print-limit", "20"].map(OsString::from));
            cmd.extend(command(bin_dir, s, &["--smallest"]));
            runs.push(SectionRun {
                name: format!("{check}_{}", s.name),
                log: "sanitize".into(),
                kind: Kind::Check,
                command: cmd,
                env: Vec::new(),
                cap: Duration::from_secs(SANITIZE_CAP_S),
            });
        }
    }
    runs
}

fn read_figures(path: &Path) -> Option<Figures> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}
