//! What the GPU programs share around their checks: the flat JSON map of figures they fill, and
//! how a run ends (the map printed and written to `$OUT`, the exit code).

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Map, Value, json};

/// Figures by flat key (`check.…`, `cuda.…`).
pub type Figures = Map<String, Value>;
/// What a check returns: usually a count of failed checks.
pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

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
