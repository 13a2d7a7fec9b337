//! `cargo xtask test`: the single command CI runs — fmt, clippy (in the test build), tidy, the
//! model fetches the real-model tests need (SmolLM2; Gemma 3 270M's GGUF for its vocabulary),
//! Chromium for the web page's browser test, the CUDA compile check, every test
//! of the workspace, then the Python package's pytest suite (`python.rs`).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{Context, bail};
use clap::Args;

use crate::cmd::{cargo, run as run_cmd, workspace_root};
use crate::cuda_check::{self, CUDA_FEATURES};
use crate::{paged_llm, python, tidy};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Skip fmt and clippy (handy while iterating; CI never passes this).
    #[arg(long)]
    pub no_lint: bool,
    /// Skip `cuda-check` (handy while iterating; CI never passes this).
    #[arg(long)]
    pub no_cuda_check: bool,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let mut phases = PhaseClock::default();
    if !args.no_lint {
        run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
        // Clippy lints the workspace's crates as the test build compiles them (the `cuda` build,
        // a superset of the default one's code but for one test; see `clippy_build.rs`).
        // SAFETY: no thread has been started yet.
        unsafe { crate::clippy_build::lint_every_workspace_build()? };
    }
    // What the tests need beyond the build (venvs, Chromium, llama.cpp, NVRTC) is installed on a
    // thread of its own, beside the build: downloads wait on the network, and a cargo build
    // leaves a core idle for stretches (one crate at a time near its end).
    let prepare = std::thread::spawn({
        let cuda = !args.no_cuda_check;
        move || prepare_the_tests_needs(cuda)
    });
    tidy::check(&workspace_root())?;
    eprintln!("tidy: ok");
    // Every test program, and the `paged-llm` binary and examples they run, in one build (what
    // nextest would build first), the `cuda` feature on: the CUDA host tests and the NVRTC
    // check's binary come from the same build; the fetches below run its `paged-llm`.
    run_cmd(cargo().args(["test", "--workspace", "--features", CUDA_FEATURES, "--no-run"]))?;
    if !args.no_lint {
        // The benches are not run here, but linted as `cargo clippy --all-targets` would.
        run_cmd(cargo().args(["test", "--workspace", "--features", CUDA_FEATURES, "--no-run", "--benches"]))?;
    }
    phases.lap(if args.no_lint { "test build" } else { "test build, clippy" });
    // The real-model tests read the converted default model, and the SentencePiece tokenizer's
    // tests Gemma 3's vocabulary from its GGUF; fetching is idempotent.
    for model in ["smollm2", "gemma3-270m"] {
        paged_llm::fetch_with_test_build(model)?;
    }
    phases.lap("models");
    let prepared = prepare.join().map_err(|_| anyhow::anyhow!("the preparation thread panicked"))?;
    eprintln!("prepared beside the build in {:.0} s", prepared?);
    phases.lap("waiting for the preparation");
    if !args.no_cuda_check {
        // Its host tests are among the workspace's in this build.
        let check =
            cuda_check::CudaCheckArgs { arch: "sm_80,sm_90".to_owned(), filter: None, no_host_tests: true };
        cuda_check::run(&check)?;
        phases.lap("cuda-check");
    }
    let workspace = run_workspace_tests();
    phases.lap("workspace tests");
    // The Python package, built and installed into its venv, against the real model (only
    // after the workspace's tests passed: it runs on the same engine).
    let outcome = workspace.and_then(|()| {
        let python = python::test();
        phases.lap("python");
        python
    });
    // The table also ends a failed run's log (CI keeps the logs of failed runs).
    phases.report();
    outcome
}

/// Installs what the tests run besides the build; returns the seconds it took. Idempotent.
fn prepare_the_tests_needs(cuda: bool) -> anyhow::Result<f64> {
    let started = std::time::Instant::now();
    // The server's client tests drive it with the official `openai` Python package.
    ensure_openai_venv()?;
    // The server's browser test drives the web page in headless Chromium.
    ensure_chromium()?;
    // `make-model`'s test writes a GGUF with llama.cpp's quantizer and loads it in llama.cpp:
    // llama-cpp-python built for this CPU (minutes on a fresh machine).
    crate::llamacpp::python()?;
    if cuda {
        cuda_check::ensure_nvrtc()?;
    }
    // The Python package's venv (maturin, pytest, Ray, openai-python).
    python::ensure_venv()?;
    Ok(started.elapsed().as_secs_f64())
}

/// Wall-clock time of each phase of the run, printed as it ends and again as a table at the end
/// of the tests (passed or failed), so a CI log shows where its time went.
#[derive(Debug)]
struct PhaseClock {
    last: std::time::Instant,
    laps: Vec<(&'static str, f64)>,
}

impl Default for PhaseClock {
    fn default() -> Self {
        Self { last: std::time::Instant::now(), laps: Vec::new() }
    }
}

impl PhaseClock {
    fn lap(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        let seconds = (now - self.last).as_secs_f64();
        self.last = now;
        eprintln!("phase {phase}: {seconds:.0} s");
        self.laps.push((phase, seconds));
    }

    fn report(&self) {
        for (phase, seconds) in &self.laps {
            eprintln!("  {phase:<32} {seconds:>7.0} s");
        }
        let total: f64 = self.laps.iter().map(|(_, seconds)| seconds).sum();
        eprintln!("  {:<32} {total:>7.0} s", "total");
    }
}

/// `target/venv-openai` with the `openai` package (pydantic comes with it), `anthropic` (the
/// `/v1/messages` checks) and `jsonschema`, which the structured-outputs checks validate with.
fn ensure_openai_venv() -> anyhow::Result<()> {
    // Pinned: the SDKs' request shapes and stream helpers are what the tests check against.
    let packages = ["openai==2.54.0", "anthropic==0.75.0", "jsonschema==4.26.0"];
    crate::cmd::ensure_venv("venv-openai", "openai, anthropic, httpx, pydantic, jsonschema", &packages)
        .map(drop)
}

/// What the browser test runs (Debian's packages): the browser and its WebDriver.
const CHROMIUM_BINARIES: [&str; 2] = ["/usr/bin/chromium", "/usr/bin/chromedriver"];

/// Installs `chromium` and `chromium-driver` with apt-get when missing (as root only; anyone
/// else is told what to run).
fn ensure_chromium() -> anyhow::Result<()> {
    if CHROMIUM_BINARIES.iter().all(|p| std::path::Path::new(p).exists()) {
        return Ok(());
    }
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        bail!(
            "the browser test needs {} and {}: run `sudo apt-get install -y chromium chromium-driver`",
            CHROMIUM_BINARIES[0],
            CHROMIUM_BINARIES[1]
        );
    }
    run_cmd(std::process::Command::new("apt-get").arg("update"))?;
    run_cmd(std::process::Command::new("apt-get").args(["install", "-y", "chromium", "chromium-driver"]))?;
    Ok(())
}

/// Every test of the workspace. With cargo-nextest installed (as on the project's machines):
/// `cargo nextest run` (each test its own process, both cores busy across test programs; the
/// slowest tests first, `.config/nextest.toml`), then with `cargo test` what nextest cannot run:
/// the browser test's own harness and the doc tests. Without it, `cargo test` runs everything.
/// Every command selects the whole workspace, so all of them share one build. Ends with one line
/// of totals (`tests: N passed, M failed`): cargo's own last line is a crate's doc tests.
fn run_workspace_tests() -> anyhow::Result<()> {
    let mut totals = TestTotals::default();
    let nextest = cargo().args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success());
    // Every command runs even when one before it failed (as `--no-fail-fast`); the first failure
    // is the run's.
    let outcomes = if nextest {
        vec![
            stream_tests(
                cargo().args([
                    "nextest",
                    "run",
                    "--workspace",
                    "--features",
                    CUDA_FEATURES,
                    "--no-fail-fast",
                ]),
                Stream::Stderr,
                &mut totals,
            ),
            stream_tests(
                cargo().args(["test", "--workspace", "--features", CUDA_FEATURES, "--test", "browser"]),
                Stream::Stdout,
                &mut totals,
            ),
            stream_tests(
                cargo().args(["test", "--workspace", "--features", CUDA_FEATURES, "--doc"]),
                Stream::Stdout,
                &mut totals,
            ),
        ]
    } else {
        eprintln!("cargo-nextest is not installed: running the tests with cargo test");
        let mut test = cargo();
        test.args(["test", "--workspace", "--features", CUDA_FEATURES]);
        vec![stream_tests(&mut test, Stream::Stdout, &mut totals)]
    };
    println!("tests: {} passed, {} failed", totals.passed, totals.failed);
    outcomes.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    if totals.passed == 0 {
        bail!("the test run ran no test");
    }
    Ok(())
}

/// Which of a test command's outputs carries its results.
#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Runs a test command, echoing the output that carries its results line by line and adding its
/// result lines to `totals`.
fn stream_tests(
    cmd: &mut std::process::Command,
    stream: Stream,
    totals: &mut TestTotals,
) -> anyhow::Result<()> {
    eprintln!("$ {cmd:?}");
    match stream {
        Stream::Stdout => cmd.stdout(Stdio::piped()),
        Stream::Stderr => cmd.stderr(Stdio::piped()),
    };
    let mut child = cmd.spawn().with_context(|| format!("could not start {cmd:?}"))?;
    let lines: Box<dyn std::io::Read> = match stream {
        Stream::Stdout => Box::new(child.stdout.take().context("the test command's stdout")?),
        Stream::Stderr => Box::new(child.stderr.take().context("the test command's stderr")?),
    };
    for line in BufReader::new(lines).lines() {
        let line = line?;
        match stream {
            Stream::Stdout => println!("{line}"),
            Stream::Stderr => eprintln!("{line}"),
        }
        totals.add_line(&line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("tests failed ({status}): {cmd:?}");
    }
    Ok(())
}

/// Sums libtest's `test result: ok. N passed; M failed; …` lines and nextest's
/// `Summary [ 570.9s] 408 tests run: 405 passed (5 slow), 3 failed, 0 skipped`.
#[derive(Debug, Default, PartialEq)]
struct TestTotals {
    passed: u64,
    failed: u64,
}

impl TestTotals {
    fn add_line(&mut self, line: &str) {
        let rest = match (line.strip_prefix("test result: "), line.split_once(" tests run: ")) {
            (Some(rest), _) => rest,
            (None, Some((head, rest))) if head.trim_start().starts_with("Summary [") => rest,
            _ => return,
        };
        for part in rest.split(['.', ';', ',', '(']) {
            match part.split_whitespace().collect::<Vec<_>>()[..] {
                [n, "passed"] => self.passed += n.parse::<u64>().unwrap_or(0),
                [n, "failed"] => self.failed += n.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up_libtest_and_nextest_result_lines() {
        let mut t = TestTotals::default();
        t.add_line(
            "test result: ok. 14 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.03s",
        );
        t.add_line("test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out");
        t.add_line("running 5 tests");
        t.add_line("     Summary [ 570.858s] 408 tests run: 408 passed (5 slow), 0 skipped");
        t.add_line("     Summary [  12.000s] 10 tests run: 7 passed, 3 failed, 1 skipped");
        t.add_line("        PASS [   0.013s] (  1/408) xtask tests run: 99 passed");
        assert_eq!(t, TestTotals { passed: 432, failed: 5 });
    }
}
