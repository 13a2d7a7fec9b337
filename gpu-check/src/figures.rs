//! What the GPU programs share around their checks: the flat JSON map of figures they fill, how
//! a section of checks runs (timed, its error counted, never ending the run), and how a run ends
//! (the map printed and written to `$OUT`, the exit code).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::{Map, Value, json};

/// Figures by flat key (`check.…`, `cuda.…`).
pub type Figures = Map<String, Value>;
/// What a check returns: usually a count of failed checks.
pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Runs one section of checks, recording its wall time as `time.<name>_s`; an error is recorded
/// as `error.<name>` and counts as one failure, and the caller's other sections still run.
pub fn section(name: &str, figures: &mut Figures, run: impl FnOnce(&mut Figures) -> Res<usize>) -> usize {
    let start = Instant::now();
    let result = run(figures);
    let seconds = start.elapsed().as_secs_f64();
    figures.insert(format!("time.{name}_s"), json!(seconds));
    eprintln!("section {name}: {seconds:.1} s");
    match result {
        Ok(failures) => failures,
        Err(e) => {
            eprintln!("FAIL {name}: {e}");
            figures.insert(format!("error.{name}"), Value::String(e.to_string()));
            1
        }
    }
}

/// Ends program `name`: records `result` (failed checks, or the error that stopped the run) as
/// `error` and `passed_key` (1 when nothing failed), prints the figures and writes them to
/// `$OUT/<name>.json` (`$OUT` defaults to the working folder). Success only when nothing failed
/// and the file was written.
pub fn finish(name: &str, passed_key: &str, mut figures: Figures, result: Res<usize>) -> ExitCode {
    let ok = match &result {
        Ok(failures) => *failures == 0,
        Err(e) => {
            figures.insert("error".into(), Value::String(e.to_string()));
            false
        }
    };
    figures.insert(passed_key.into(), json!(if ok { 1 } else { 0 }));
    let text = serde_json::to_string_pretty(&Value::Object(figures)).unwrap_or_default();
    println!("{text}");
    let out_dir = std::env::var_os("OUT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    let written = std::fs::create_dir_all(&out_dir)
        .and_then(|()| std::fs::write(out_dir.join(format!("{name}.json")), &text));
    if let Err(e) = written {
        eprintln!("{name}: writing {}: {e}", out_dir.display());
        return ExitCode::FAILURE;
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
