//! What one section of the GPU run records in its own process: its figures, its passed /
//! failed / error counts and the parameters of every failing case, written (as a
//! [`SectionRecord`]) to the file the runner names after every failure and at the end, so a
//! kill or a crash keeps what was found; a panic is caught and recorded as an error.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::sections::Kind;

/// Figures by flat key (`check.…`, `cuda.…`).
pub type Figures = Map<String, Value>;
/// What a check returns.
pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The variable through which the runner tells a section process where to write its record.
pub const RECORD_PATH_ENV: &str = "GPU_CHECK_RECORD";

/// Failing cases kept per section (the counts go on; the log has every line).
const MAX_FAILING: usize = 200;

/// How a section ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Started, not finished (what a record read after a kill says).
    #[default]
    Running,
    Passed,
    /// Ran to its end with failing cases.
    Failed,
    /// A check that ran to its end without a failure or an error, but without a case either: it
    /// checked nothing, which must not read as a pass (a benchmark's result is its figures, so
    /// this is for checks only).
    NoCases,
    /// Ran to its end, but something could not run (an error or a panic).
    Error,
    /// Killed at its time cap.
    TimedOut,
    /// Ended by a signal, or exited without finishing its record.
    Crashed,
    /// Not started: the run's time budget was spent, or the program could not be started.
    Skipped,
}

impl Status {
    pub fn is_ok(self) -> bool {
        self == Status::Passed
    }
}

/// One section's outcome: what the runner merges into `figures.json` and the summary reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SectionRecord {
    pub section: String,
    /// Defaults to a check, so a record without the field (written before it existed) still
    /// reads.
    pub kind: Kind,
    pub status: Status,
    pub passed: usize,
    pub failed: usize,
    pub errors: usize,
    /// Each failing case with its parameters (dtype, head size, block size, GQA group,
    /// context …) and what went wrong; errors are prefixed `error: `.
    pub failing: Vec<String>,
    pub seconds: f64,
    /// The last lines of the section's log, kept by the runner when it timed out or crashed.
    pub log_tail: Vec<String>,
    /// The section's figures (flat keys, merged into `figures.json` as they are).
    pub figures: Figures,
}

impl SectionRecord {
    /// Reads a record written by [`Recorder`]; `None` when there is none or it does not parse.
    pub fn read(path: &Path) -> Option<SectionRecord> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }
}

/// The recording side of one section process.
#[derive(Debug)]
pub struct Recorder {
    record: SectionRecord,
    path: Option<PathBuf>,
    start: Instant,
}

impl Recorder {
    /// A recorder for `section`, writing where [`RECORD_PATH_ENV`] says (nowhere when unset);
    /// its kind is the plan's ([`crate::sections::SECTIONS`]), a check for a section not in it.
    pub fn new(section: &str) -> Self {
        let kind = crate::sections::by_name(section).map_or(Kind::Check, |s| s.kind);
        Self::with_path(section, kind, std::env::var_os(RECORD_PATH_ENV).map(PathBuf::from))
    }

    pub fn with_path(section: &str, kind: Kind, path: Option<PathBuf>) -> Self {
        let record = SectionRecord { section: section.to_owned(), kind, ..SectionRecord::default() };
        let rec = Recorder { record, path, start: Instant::now() };
        rec.flush();
        rec
    }

    pub fn section(&self) -> &str {
        &self.record.section
    }

    /// The figures so far (for helpers that fill a map).
    pub fn figures_mut(&mut self) -> &mut Figures {
        &mut self.record.figures
    }

    pub fn figure(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        self.record.figures.insert(key.into(), value.into());
    }

    /// Keeps the largest value seen under `key` (a NaN or an infinity counts as 1e30: JSON has
    /// neither).
    pub fn figure_max(&mut self, key: &str, v: f64) {
        let v = if v.is_finite() { v } else { 1e30 };
        let old = self.record.figures.get(key).and_then(Value::as_f64).unwrap_or(0.0);
        self.figure(key, old.max(v));
    }

    /// `n` more cases passed.
    pub fn pass(&mut self, n: usize) {
        self.record.passed += n;
    }

    /// A case failed: counted, printed, kept with its parameters, and written out at once.
    pub fn fail(&mut self, case: impl Into<String>) {
        let case = case.into();
        eprintln!("FAIL {}: {case}", self.record.section);
        self.record.failed += 1;
        self.keep(case);
    }

    /// Something could not run (a case's upload or launch, the section's setup).
    pub fn error(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("ERROR {}: {what}", self.record.section);
        self.record.errors += 1;
        self.keep(format!("error: {what}"));
    }

    /// Failures and errors so far.
    pub fn problems(&self) -> usize {
        self.record.failed + self.record.errors
    }

    fn keep(&mut self, line: String) {
        if self.record.failing.len() < MAX_FAILING {
            self.record.failing.push(line);
        }
        self.flush();
    }

    fn flush(&self) {
        let Some(path) = &self.path else { return };
        let mut record = self.record.clone();
        record.seconds = self.start.elapsed().as_secs_f64();
        if let Err(e) = write_json_atomically(path, &record) {
            eprintln!("{}: writing {}: {e}", self.record.section, path.display());
        }
    }

    /// Ends the section: status from the counts (a check without a case is
    /// [`Status::NoCases`]), the record written, the exit code (success only when it passed).
    pub fn finish(mut self) -> ExitCode {
        let r = &self.record;
        self.record.status = if r.errors > 0 {
            Status::Error
        } else if r.failed > 0 {
            Status::Failed
        } else if r.kind == Kind::Check && r.passed == 0 {
            Status::NoCases
        } else {
            Status::Passed
        };
        self.flush();
        let r = &self.record;
        eprintln!(
            "section {}: {:?}, {} passed, {} failed, {} errors in {:.1} s",
            r.section,
            r.status,
            r.passed,
            r.failed,
            r.errors,
            self.start.elapsed().as_secs_f64()
        );
        if r.status.is_ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
    }
}

/// Runs one section in this process: `body` records into the recorder; an error it returns or
/// a panic is recorded as one error (the panic's message too), and the record is finished.
pub fn run_section(section: &str, body: impl FnOnce(&mut Recorder) -> Res<()>) -> ExitCode {
    run_with(Recorder::new(section), body)
}

/// [`run_section`] with a recorder made by the caller.
pub fn run_with(mut rec: Recorder, body: impl FnOnce(&mut Recorder) -> Res<()>) -> ExitCode {
    match catch_unwind(AssertUnwindSafe(|| body(&mut rec))) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => rec.error(e.to_string()),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            rec.error(format!("panicked: {msg}"));
        }
    }
    rec.finish()
}

/// Writes `value` as pretty JSON to `path` through a temporary file and a rename, so a reader
/// (or a kill) never sees half a file.
pub fn write_json_atomically(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    attn_kernels::file::write_atomically(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_on_disk_before_the_section_ends_and_panics_become_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let mut rec = Recorder::with_path("attention_v1", Kind::Check, Some(path.clone()));
        rec.pass(3);
        rec.fail("bf16 h128 b16 group 4 ctx 1100: max rel err 3.1e-2");
        // Written at the failure: a kill now keeps it.
        let read = SectionRecord::read(&path).unwrap();
        assert_eq!((read.status, read.passed, read.failed), (Status::Running, 3, 1));
        assert!(read.failing[0].contains("h128 b16 group 4 ctx 1100"));
        rec.figure_max("check.x", f64::NAN);
        assert_eq!(rec.figures_mut()["check.x"], 1e30);
        assert_eq!(rec.finish(), ExitCode::FAILURE);
        assert_eq!(SectionRecord::read(&path).unwrap().status, Status::Failed);

        let panicking = dir.path().join("p.json");
        let code =
            run_with(Recorder::with_path("bandwidth", Kind::Benchmark, Some(panicking.clone())), |r| {
                r.pass(1);
                panic!("index out of bounds");
            });
        assert_eq!(code, ExitCode::FAILURE);
        let read = SectionRecord::read(&panicking).unwrap();
        assert_eq!((read.status, read.passed, read.errors), (Status::Error, 1, 1));
        assert!(read.failing[0].contains("panicked: index out of bounds"), "{:?}", read.failing);
    }

    #[test]
    fn a_check_that_ran_no_case_is_not_passed_and_a_benchmark_is_judged_by_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.json");
        let code =
            run_with(Recorder::with_path("attention_v2", Kind::Check, Some(empty.clone())), |_| Ok(()));
        assert_eq!(code, ExitCode::FAILURE);
        let read = SectionRecord::read(&empty).unwrap();
        assert_eq!((read.kind, read.status), (Kind::Check, Status::NoCases));
        let text = std::fs::read_to_string(&empty).unwrap();
        assert!(text.contains("\"no_cases\"") && text.contains("\"kind\": \"check\""), "{text}");

        // A benchmark's result is its figures: ending without an error passes.
        let bench = dir.path().join("bench.json");
        let code = run_with(Recorder::with_path("e2e", Kind::Benchmark, Some(bench.clone())), |r| {
            r.figure("cuda.e2e_output_tok_s", 1234.0);
            Ok(())
        });
        assert_eq!(code, ExitCode::SUCCESS);
        let read = SectionRecord::read(&bench).unwrap();
        assert_eq!((read.kind, read.status), (Kind::Benchmark, Status::Passed));
    }

    #[test]
    fn the_kind_comes_from_the_plan_and_a_record_without_one_reads_as_a_check() {
        assert_eq!(Recorder::new("bandwidth").record.kind, Kind::Benchmark);
        assert_eq!(Recorder::new("e2e").record.kind, Kind::Benchmark);
        assert_eq!(Recorder::new("attention_v1").record.kind, Kind::Check);
        assert_eq!(Recorder::new("fake_pass").record.kind, Kind::Check);
        // What a kill leaves from a section started before records had a kind.
        let old: SectionRecord =
            serde_json::from_str(r#"{"section": "reshape", "status": "running"}"#).unwrap();
        assert_eq!((old.kind, old.status), (Kind::Check, Status::Running));
    }
}
