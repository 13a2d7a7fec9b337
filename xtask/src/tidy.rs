//! Tidy checks over the source tree: every `.rs` file opens with a `//!` doc line, no test
//! is switched off with `#[ignore]`, and the crate graph is the one ARCHITECTURE.md draws
//! (`layering.rs`).

use std::path::Path;

use anyhow::{Context, bail};

use crate::cmd::files_under;

/// Walks the workspace (skipping build output and hidden folders) and checks every `.rs` file.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let files = files_under(root, &|name| name.starts_with('.') || name.starts_with("target"))?;
    let mut problems = Vec::new();
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        problems.extend(check_file(&text).into_iter().map(|p| format!("{}: {p}", file.display())));
    }
    if !problems.is_empty() {
        bail!("tidy found {} problem(s):\n{}", problems.len(), problems.join("\n"));
    }
    crate::layering::check(root)
}

/// The problems in one file's text (empty when it is tidy).
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
    fn ignored_test_is_reported() {
        let text = format!("//! doc\n{}]\nfn t() {{}}\n", concat!("#[", "ignore"));
        let problems = check_file(&text);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("line 2"));
    }
}
