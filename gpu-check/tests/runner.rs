//! The runner against fake sections: the `fake_section` fixture binary is the section process,
//! and passes, panics, faults like a sticky CUDA error, hangs, aborts or runs no case, as
//! `FAKE_SECTION` says.

use std::time::Duration;

use std::path::PathBuf;

use gpu_check::figures::{Figures, Status};
use gpu_check::runner::{RunDirs, SectionRun, records_in, run_all};
use gpu_check::sections::Kind;

const MODE_ENV: &str = "FAKE_SECTION";

fn fake_section_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fake_section"))
}

fn fake(mode: &str, cap_s: u64) -> SectionRun {
    SectionRun {
        name: format!("fake_{mode}"),
        log: "fake_program".into(),
        kind: Kind::Check,
        command: vec![fake_section_exe().into_os_string()],
        env: vec![(MODE_ENV.into(), mode.into())],
        cap: Duration::from_secs(cap_s),
    }
}

fn dirs(tmp: &tempfile::TempDir) -> RunDirs {
    RunDirs { out: tmp.path().join("out"), scratch: tmp.path().join("scratch") }
}

fn read_figures(d: &RunDirs) -> Figures {
    serde_json::from_slice(&std::fs::read(d.figures()).expect("figures.json")).expect("whole JSON")
}

#[test]
fn a_panic_a_sticky_fault_a_hang_and_an_abort_leave_the_other_sections_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(&tmp);
    let plan = [
        fake("pass", 30),
        fake("panic", 30),
        fake("sticky", 30),
        fake("hang", 2),
        fake("abort", 30),
        fake("after", 30),
    ];
    let records = run_all(&plan, &d, Duration::from_secs(120));
    let status: Vec<Status> = records.iter().map(|r| r.status).collect();
    assert_eq!(
        status,
        [Status::Passed, Status::Error, Status::Error, Status::TimedOut, Status::Crashed, Status::Passed]
    );
    let figures = read_figures(&d);
    // Both passing sections' figures are there, the one after four bad sections too.
    assert_eq!(figures["cuda.fake_fake_pass"], 1.5);
    assert_eq!(figures["cuda.fake_fake_after"], 1.5);
    let by_name = |n: &str| records_in(&figures).into_iter().find(|r| r.section == n).unwrap();
    let panic = by_name("fake_panic");
    assert_eq!((panic.passed, panic.failed, panic.errors), (1, 1, 1));
    assert!(panic.failing[0].contains("h256 b32 kv8 group 4 ctx 1100"));
    assert!(panic.failing[1].contains("panicked") && panic.failing[1].contains("index out of bounds"));
    let sticky = by_name("fake_sticky");
    assert_eq!(sticky.errors, 4, "{:?}", sticky.failing);
    assert!(sticky.failing.iter().all(|f| f.contains("CUDA_ERROR_ILLEGAL_ADDRESS")));
    // The hang was killed at its cap; the failure it wrote before hanging survived, with the
    // log's last lines.
    let hang = by_name("fake_hang");
    assert_eq!((hang.passed, hang.failed), (4, 1));
    assert!(hang.failing.iter().any(|f| f.contains("ctx 32768")));
    assert!(hang.failing.iter().any(|f| f.contains("killed at its 2 s cap")));
    assert!(hang.seconds < 10.0);
    assert!(hang.log_tail.iter().any(|l| l.contains("FAIL fake_hang")), "{:?}", hang.log_tail);
    let abort = by_name("fake_abort");
    assert!(abort.failing.iter().any(|f| f.contains("signal 6")), "{:?}", abort.failing);
    // One log for the program, every section's output in it under its header.
    let log = std::fs::read_to_string(d.out.join("fake_program.log")).unwrap();
    for name in ["fake_pass", "fake_panic", "fake_sticky", "fake_hang", "fake_abort", "fake_after"] {
        assert!(log.contains(&format!("===== section {name} ")), "{name}");
    }
}

#[test]
fn sections_past_the_budget_are_skipped_and_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(&tmp);
    // The hang takes the whole budget (its cap is larger): the next sections do not start.
    let bench = SectionRun { kind: Kind::Benchmark, ..fake("pass", 30) };
    let records = run_all(&[fake("hang", 30), fake("pass", 30), bench], &d, Duration::from_millis(2500));
    assert_eq!(records[0].status, Status::TimedOut);
    assert_eq!(records[1].status, Status::Skipped);
    // A skipped benchmark is still reported as a benchmark.
    assert_eq!((records[2].status, records[2].kind), (Status::Skipped, Kind::Benchmark));
    let figures = read_figures(&d);
    assert!(figures.contains_key("section.fake_pass"));
    assert!(!figures.contains_key("cuda.fake_fake_pass"));
}

#[test]
fn a_check_section_that_runs_no_case_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(&tmp);
    let records = run_all(&[fake("empty", 30)], &d, Duration::from_secs(60));
    assert_eq!((records[0].status, records[0].passed, records[0].errors), (Status::NoCases, 0, 0));
    assert!(!records[0].status.is_ok());
    let figures = read_figures(&d);
    assert_eq!(figures["section.fake_empty"]["status"], "no_cases");
    assert_eq!(figures["section.fake_empty"]["kind"], "check");
}

#[test]
fn a_program_that_cannot_start_is_an_error_of_its_section_only() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(&tmp);
    let missing = SectionRun {
        name: "missing".into(),
        command: vec![tmp.path().join("no-such-binary").into_os_string()],
        ..fake("pass", 5)
    };
    let records = run_all(&[missing, fake("pass", 30)], &d, Duration::from_secs(60));
    assert_eq!(records[0].status, Status::Skipped);
    assert!(records[0].failing[0].contains("could not start"));
    assert_eq!(records[1].status, Status::Passed);
}
