//! The runner of the GPU run: each section in its own process (a CUDA fault is sticky for the
//! process that made it, so one bad kernel cannot fail the sections after it), under a time cap
//! and the run's remaining budget; the section's output appended to its program's log
//! (`$OUT/<program>.log`), its record merged into `$OUT/figures.json` as soon as it ends, so a
//! kill of the whole run keeps every section that finished. Tested against fake sections
//! (`tests/runner.rs`, the `fake_section` fixture binary).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::figures::{Figures, RECORD_PATH_ENV, SectionRecord, Status, write_json_atomically};
use crate::sections::Kind;

/// Log lines kept in the record of a section that timed out or crashed.
const TAIL_LINES: usize = 12;

/// One section to run: its name, the log it writes to, the command, extra environment, its cap.
#[derive(Debug, Clone)]
pub struct SectionRun {
    pub name: String,
    /// The log's stem: the section's output is appended to `<out>/<log>.log`.
    pub log: String,
    /// Put in the record the runner writes itself (a section skipped, or killed before it wrote
    /// one), so a benchmark is still reported as one.
    pub kind: Kind,
    pub command: Vec<OsString>,
    pub env: Vec<(String, String)>,
    pub cap: Duration,
}

/// Where a run writes: `figures.json` and the logs in `out`, the sections' own records in
/// `scratch` (not returned by the device tool, which brings back a few files only).
#[derive(Debug, Clone)]
pub struct RunDirs {
    pub out: PathBuf,
    pub scratch: PathBuf,
}

impl RunDirs {
    pub fn figures(&self) -> PathBuf {
        self.out.join("figures.json")
    }
}

/// Runs `sections` in order within `budget`, merging each record into `figures.json` as it
/// ends; a section the budget no longer covers is recorded as skipped.
pub fn run_all(sections: &[SectionRun], dirs: &RunDirs, budget: Duration) -> Vec<SectionRecord> {
    let start = Instant::now();
    let mut records = Vec::with_capacity(sections.len());
    for run in sections {
        let left = budget.saturating_sub(start.elapsed());
        let record = if left < Duration::from_secs(1) {
            eprintln!("gpu_run: {}: skipped, the run's time budget is spent", run.name);
            SectionRecord {
                section: run.name.clone(),
                kind: run.kind,
                status: Status::Skipped,
                ..SectionRecord::default()
            }
        } else {
            run_one(run, dirs, run.cap.min(left))
        };
        if let Err(e) = merge_into(&dirs.figures(), &record) {
            eprintln!("gpu_run: writing {}: {e}", dirs.figures().display());
        }
        records.push(record);
    }
    records
}

/// Runs one section process under `cap`; its record, completed with what the runner saw.
pub fn run_one(run: &SectionRun, dirs: &RunDirs, cap: Duration) -> SectionRecord {
    let record_path = dirs.scratch.join(format!("{}.json", run.name));
    let _ = std::fs::remove_file(&record_path);
    let log_path = dirs.out.join(format!("{}.log", run.log));
    let start = Instant::now();
    let outcome = spawn_and_wait(run, &record_path, &log_path, cap);
    let seconds = start.elapsed().as_secs_f64();
    let mut record = SectionRecord::read(&record_path).unwrap_or_default();
    record.section = run.name.clone();
    record.kind = run.kind;
    record.seconds = seconds;
    let (status, why) = match outcome {
        Err(e) => (Status::Skipped, Some(format!("could not start: {e}"))),
        Ok(Ended::TimedOut) => (Status::TimedOut, Some(format!("killed at its {} s cap", cap.as_secs()))),
        Ok(Ended::Signal(sig)) => (Status::Crashed, Some(format!("ended by signal {sig}"))),
        Ok(Ended::Code(code)) if record.status == Status::Running => {
            (Status::Crashed, Some(format!("exited with code {code} before finishing its record")))
        }
        Ok(Ended::Code(0)) => (record.status, None),
        // A finished record that says it passed but a failing exit: trust the failure.
        Ok(Ended::Code(code)) if record.status == Status::Passed => {
            (Status::Crashed, Some(format!("exited with code {code} after passing")))
        }
        Ok(Ended::Code(_)) => (record.status, None),
    };
    record.status = status;
    if let Some(why) = why {
        record.errors += 1;
        record.failing.push(format!("error: {why}"));
        record.log_tail = log_tail(&log_path, TAIL_LINES);
    }
    eprintln!("gpu_run: {}: {:?} in {seconds:.1} s", run.name, record.status);
    record
}

/// How a section process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Code(i32),
    Signal(i32),
    TimedOut,
}

fn spawn_and_wait(run: &SectionRun, record: &Path, log_path: &Path, cap: Duration) -> std::io::Result<Ended> {
    let (program, args) = run.command.split_first().ok_or_else(|| std::io::Error::other("empty command"))?;
    if let Some(parent) = log_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if let Some(parent) = record.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut log = OpenOptions::new().create(true).append(true).open(log_path)?;
    writeln!(log, "\n===== section {} (cap {} s) =====", run.name, cap.as_secs())?;
    log.flush()?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(run.env.iter().map(|(k, v)| (k, v)))
        .env(RECORD_PATH_ENV, record)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        // Its own process group, so a kill at the cap reaches what it started too (the
        // sanitizer's target).
        .process_group(0);
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + cap;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(match (status.code(), status.signal()) {
                (Some(code), _) => Ended::Code(code),
                (None, sig) => Ended::Signal(sig.unwrap_or(0)),
            });
        }
        if Instant::now() >= deadline {
            let pid = i32::try_from(child.id()).unwrap_or(0);
            // SAFETY: signals the process group this runner created for the child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
            let _ = writeln!(log, "===== section {}: killed at its {} s cap =====", run.name, cap.as_secs());
            return Ok(Ended::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `n` lines of the log (of its last 64 KiB).
pub fn log_tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(mut f) = File::open(path) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| (*l).to_owned()).collect()
}

/// Adds `record` to the figures file at `path`: its figures under their own keys, the rest
/// under `section.<name>`; written through a rename, so the file is always whole.
pub fn merge_into(path: &Path, record: &SectionRecord) -> std::io::Result<()> {
    let mut figures: Figures = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        })
        .unwrap_or_default();
    for (k, v) in &record.figures {
        figures.insert(k.clone(), v.clone());
    }
    let mut outcome = record.clone();
    outcome.figures = Figures::new();
    let outcome = serde_json::to_value(outcome).map_err(std::io::Error::other)?;
    figures.insert(format!("section.{}", record.section), outcome);
    write_json_atomically(path, &Value::Object(figures))
}

/// Every section record in a figures file, in the order they were written.
pub fn records_in(figures: &Figures) -> Vec<SectionRecord> {
    figures
        .iter()
        .filter(|(k, _)| k.starts_with("section."))
        .filter_map(|(_, v)| serde_json::from_value(v.clone()).ok())
        .collect()
}
