//! Tidy checks over the source tree: every `.rs` file opens with a `//!` doc line, no test
//! is switched off with `#[ignore]`, no source file (`.rs`, `.cu`, `.cuh`, `.py`, `.js`) is
//! longer than `MAX_LINES`, no two modules of a crate depend on each other (`module_cycles.rs`),
//! ARCHITECTURE.md stays a map (`MAX_MAP_LINES`), and the crate graph is the one ARCHITECTURE.md
//! draws (`layering.rs`).

use std::path::Path;

use anyhow::{Context, bail};

use crate::cmd::files_under;

/// The longest a source file of any language may be. A file past it holds more than one concern
/// and is split by concern; there is no allowlist, so the limit cannot quietly grow exceptions.
const MAX_LINES: usize = 600;

/// The source files' extensions [`MAX_LINES`] applies to.
const SOURCE_EXTENSIONS: [&str; 5] = ["rs", "cu", "cuh", "py", "js"];

/// The longest ARCHITECTURE.md may be: a codemap and its invariants, not a log of how the code
/// came to be (that is the commits' job, and the figures are the bench report's).
const MAX_MAP_LINES: usize = 400;

/// Walks the workspace (skipping build output, hidden folders and `node_modules`) and checks
/// every source file, then the map.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let skip = |name: &str| name.starts_with('.') || name.starts_with("target") || name == "node_modules";
    let files = files_under(root, &skip)?;
    let mut problems = Vec::new();
    for file in &files {
        let Some(ext) = file.extension().and_then(|e| e.to_str()) else { continue };
        if !SOURCE_EXTENSIONS.contains(&ext) {
            continue;
        }
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let mut found: Vec<String> = check_length(&text).into_iter().collect();
        if ext == "rs" {
            found.extend(check_file(&text));
        }
        problems.extend(found.into_iter().map(|p| format!("{}: {p}", file.display())));
    }
    problems.extend(crate::module_cycles::check(root)?);
    let map_path = root.join("ARCHITECTURE.md");
    let map =
        std::fs::read_to_string(&map_path).with_context(|| format!("reading {}", map_path.display()))?;
    let map_lines = map.lines().count();
    if map_lines > MAX_MAP_LINES {
        problems.push(format!(
            "{}: {map_lines} lines, over the limit of {MAX_MAP_LINES}: keep it a map (where things are, \
             the invariants); how a kernel works belongs in its module doc",
            map_path.display()
        ));
    }
    if !problems.is_empty() {
        bail!("tidy found {} problem(s):\n{}", problems.len(), problems.join("\n"));
    }
    crate::layering::check(root)
}

/// A file over `MAX_LINES` lines, reported (empty when it is short enough).
fn check_length(text: &str) -> Option<String> {
    let lines = text.lines().count();
    (lines > MAX_LINES).then(|| format!("{lines} lines, over the limit of {MAX_LINES}: split it by concern"))
}

/// The problems in one `.rs` file's text (empty when it is tidy).
fn check_file(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if !first.starts_with("//!") {
        problems.push("does not start with a `//!` doc line".to_owned());
    }
    // Spelled in two halves so this file does not trip its own check.
    let ignore_attr = concat!("#[", "ignore");
    let ignored = text.lines().enumerate().filter(|(_, line)| line.trim_start().starts_with(ignore_attr));
    problems.extend(ignored.map(|(n, _)| format!("line {}: tests must not be ignored", n + 1)));
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_is_tidy() {
        check(&crate::cmd::workspace_root()).unwrap();
    }

    #[test]
    fn missing_doc_line_is_reported() {
        assert_eq!(check_file("fn main() {}\n").len(), 1);
        assert!(check_file("//! fine\nfn main() {}\n").is_empty());
    }

    #[test]
    fn long_file_is_reported() {
        let text = |lines: usize| "x\n".repeat(lines);
        assert!(check_length(&text(MAX_LINES)).is_none());
        let problem = check_length(&text(MAX_LINES + 1)).unwrap();
        assert!(problem.contains("601 lines"), "{problem}");
    }

    #[test]
    fn ignored_test_is_reported() {
        let text = format!("//! doc\n{}]\nfn t() {{}}\n", concat!("#[", "ignore"));
        let problems = check_file(&text);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("line 2"));
    }
}
