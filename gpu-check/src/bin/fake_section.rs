//! A fake section process for the runner's tests (`gpu-check/tests/runner.rs`): records
//! like a real section, then passes, panics, faults like a sticky CUDA error (every later case
//! of the process fails the same way), hangs, aborts, or ends without running a case, as
//! `FAKE_SECTION` says.

use std::process::ExitCode;
use std::time::Duration;

use gpu_check::figures::{Recorder, run_with};

fn main() -> ExitCode {
    let mode = std::env::var("FAKE_SECTION").unwrap_or_default();
    run_with(Recorder::new(&format!("fake_{mode}")), |r| {
        match mode.as_str() {
            "pass" | "after" => {
                r.pass(2);
                r.figure(format!("cuda.fake_{}", r.section()), 1.5);
            }
            "panic" => {
                r.pass(1);
                r.fail("bf16 h256 b32 kv8 group 4 ctx 1100 V2: max rel err 4.0e-1");
                let v: Vec<u32> = Vec::new();
                let _ = v[std::hint::black_box(3)];
            }
            "sticky" => {
                // A fault poisons the process's context: every later case fails the same way.
                for case in ["f16 h64 b8 ctx 61", "f16 h64 b16 ctx 700", "bf16 h128 b16 ctx 1100"] {
                    r.error(format!("{case}: CUDA_ERROR_ILLEGAL_ADDRESS, an illegal memory access"));
                }
                return Err("CUDA_ERROR_ILLEGAL_ADDRESS".into());
            }
            "hang" => {
                r.pass(4);
                r.fail("bf16 h128 b16 kv8 group 8 ctx 32768: max rel err 1.0e30");
                std::thread::sleep(Duration::from_secs(60));
            }
            "abort" => std::process::abort(),
            // A check whose case list came out empty: it ends cleanly having checked nothing.
            "empty" => r.figure("cuda.fake_empty_cases", 0),
            other => return Err(format!("unknown mode {other}").into()),
        }
        Ok(())
    })
}
