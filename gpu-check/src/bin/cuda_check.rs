//! `cuda_check`: compile every CUDA program of the instantiation table with NVRTC for the given
//! architectures, print each kernel's registers / shared memory / spills, and exit non-zero on a
//! compile error, a missing entry point, or a spill in an attention kernel. Needs libnvrtc on
//! the library path, no GPU. `cargo xtask cuda-check` installs NVRTC and runs this.
//!
//! Usage: `cuda_check [--arch sm_80,sm_90] [--headers DIR] [--jobs N] [--filter TEXT]
//! [--log-cache DIR]` (the compiler logs of earlier compiles: an unchanged program is not
//! compiled again).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use attn_kernels::cuda::check::{self, CheckOptions};

fn main() -> ExitCode {
    let mut opts = CheckOptions {
        archs: vec!["sm_80".into(), "sm_90".into()],
        header_dir: std::env::temp_dir().join("attn-kernels-nvrtc-headers"),
        jobs: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
        filter: None,
        log_cache: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        let parsed: Result<(), String> = match a.as_str() {
            "--arch" => value().map(|v| opts.archs = v.split(',').map(str::to_owned).collect()),
            "--headers" => value().map(|v| opts.header_dir = PathBuf::from(v)),
            "--jobs" => {
                value().and_then(|v| v.parse().map_err(|e| format!("--jobs: {e}"))).map(|n| opts.jobs = n)
            }
            "--filter" => value().map(|v| opts.filter = Some(v)),
            "--log-cache" => value().map(|v| opts.log_cache = Some(PathBuf::from(v))),
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = parsed {
            eprintln!("cuda_check: {e}");
            return ExitCode::from(2);
        }
    }
    let start = Instant::now();
    let report = match check::run(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cuda_check: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", check::format_table(&report));
    println!(
        "cuda-check: {} programs compiled for {} ({} unchanged, judged from their cached logs), {} kernels, {:.0} s",
        report.programs_compiled,
        opts.archs.join("+"),
        report.logs_reused,
        report.kernels.len(),
        start.elapsed().as_secs_f64()
    );
    if report.passed() {
        println!("cuda-check: ok (no compile error, no missing entry, no spill in an attention kernel)");
        ExitCode::SUCCESS
    } else {
        for f in &report.failures {
            eprintln!("FAIL {f}");
        }
        ExitCode::FAILURE
    }
}
