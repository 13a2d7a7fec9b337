//! Tidy's module-cycle check: inside a crate no two modules depend on each other, directly or
//! through others. A module depends on another when its file names a path into it (`use
//! crate::a::b`, `super::c::d`, `crate::{a, b}` groups, a path written inline); a module naming
//! its own ancestors is the ordinary shape of a module tree (a child uses its parent's types)
//! and is no edge, nor is naming a crate's `error` module: every module returns the crate's
//! error type, which wraps theirs. Test modules written inline (`mod tests { … }`) are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// A module's path inside its crate (`["cuda", "forward"]`; the crate root is empty).
type ModPath = Vec<String>;

/// Module → the modules it depends on, each with one path that makes it depend (the evidence).
type Edges = BTreeMap<ModPath, BTreeMap<ModPath, String>>;

/// Every cycle between the modules of each crate under `root` (a folder with `Cargo.toml` and
/// `src/`), one line per cycle.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    crates.sort();
    for krate in crates {
        let modules = read_modules(&krate.join("src"))?;
        let name = krate.file_name().unwrap_or_default().to_string_lossy().into_owned();
        problems.extend(cycles(&edges(&modules)).into_iter().map(|c| format!("{name}: {c}")));
    }
    Ok(problems)
}

/// Each module of the crate whose sources are in `src` and its text without comments, string
/// contents or inline test modules.
fn read_modules(src: &Path) -> anyhow::Result<BTreeMap<ModPath, String>> {
    let skip = |name: &str| name == "bin";
    let has_lib = src.join("lib.rs").is_file();
    let mut modules = BTreeMap::new();
    for file in crate::cmd::files_under(src, &skip)? {
        let rel = file.strip_prefix(src)?;
        if rel.extension().is_none_or(|e| e != "rs") || (has_lib && rel == Path::new("main.rs")) {
            continue;
        }
        let mut path: ModPath =
            rel.with_extension("").iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if path.len() == 1 && matches!(path[0].as_str(), "lib" | "main")
            || path.last().is_some_and(|l| l == "mod")
        {
            path.pop();
        }
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        modules.insert(path, without_inline_modules(&code_only(&text)));
    }
    Ok(modules)
}

/// The module graph: an edge for every path a module names into another that is not its
/// ancestor nor the crate's `error` module.
fn edges(modules: &BTreeMap<ModPath, String>) -> Edges {
    let mut edges = Edges::new();
    for (module, text) in modules {
        for path in named_paths(text) {
            let Some(target) = resolve(module, &path, modules) else { continue };
            if !module.starts_with(&target) && target != ["error"] {
                edges.entry(module.clone()).or_default().entry(target).or_insert_with(|| path.join("::"));
            }
        }
    }
    edges
}

/// The module a path names, from inside `module`: the longest prefix of it that is a module
/// (`None` for a path into another crate).
fn resolve(module: &ModPath, path: &[String], modules: &BTreeMap<ModPath, String>) -> Option<ModPath> {
    let mut base = module.clone();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &path[1..];
        }
        Some("self") => rest = &path[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) if modules.contains_key(&[module.as_slice(), &[first.to_owned()]].concat()) => {}
        _ => return None,
    }
    (0..=rest.len())
        .rev()
        .map(|n| [base.as_slice(), &rest[..n]].concat())
        .find(|candidate| modules.contains_key(candidate))
}

/// Every path the text names: each `use` declaration's expanded tree, and each inline path that
/// starts at `crate`, `self` or `super`.
fn named_paths(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let tokens = tokenize(text);
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let end = tokens[i..].iter().position(|t| t == ";").map_or(tokens.len(), |n| i + n);
            expand_tree(&tokens[i + 1..end], &mut Vec::new(), &mut paths);
            i = end;
        } else if matches!(tokens[i].as_str(), "crate" | "self" | "super") {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while j + 1 < tokens.len() && tokens[j] == "::" && is_ident(&tokens[j + 1]) {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            paths.push(path);
            i = j;
        }
        i += 1;
    }
    paths
}

/// Expands a `use` tree (`a::{b, c::d as e, *}`) under `prefix` into its paths.
fn expand_tree(tokens: &[String], prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let depth = prefix.len();
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "{" => {
                let close = matching_brace(tokens, i);
                for item in split_top_level(&tokens[i + 1..close]) {
                    expand_tree(item, prefix, out);
                }
                prefix.truncate(depth);
                return;
            }
            "as" | "*" => break,
            "::" => {}
            t if is_ident(t) => prefix.push(t.to_owned()),
            _ => {}
        }
        i += 1;
    }
    if prefix.len() > depth {
        out.push(prefix.clone());
    }
    prefix.truncate(depth);
}

/// The index of the `}` closing the `{` at `open`.
fn matching_brace(tokens: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        depth += match t.as_str() {
            "{" => 1,
            "}" => -1,
            _ => 0,
        };
        if depth == 0 {
            return i;
        }
    }
    tokens.len()
}

/// The comma-separated items of a brace group, nested groups kept whole.
fn split_top_level(tokens: &[String]) -> Vec<&[String]> {
    let (mut items, mut start, mut depth) = (Vec::new(), 0, 0);
    for (i, t) in tokens.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                items.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&tokens[start..]);
    items
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokenize(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".to_owned());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            tokens.push(c.to_string());
        }
        i += 1;
    }
    tokens
}

/// The text with comments removed and string and character literals emptied, so that neither
/// a path in a doc comment nor a brace in a string counts.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                i += 2;
                while i + 1 < c.len() && !(c[i] == '*' && c[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            'r' if matches!(c.get(i + 1), Some('"' | '#')) && (i == 0 || !c[i - 1].is_alphanumeric()) => {
                let hashes = c[i + 1..].iter().take_while(|&&ch| ch == '#').count();
                if c.get(i + 1 + hashes) != Some(&'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                i += hashes + 2;
                while i < c.len()
                    && !(c[i] == '"'
                        && c[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes)
                {
                    i += 1;
                }
                i += hashes + 1;
                out.push_str("\"\"");
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // A character literal ('x', '\n', '\''), not a lifetime.
            '\'' if c.get(i + 2) == Some(&'\'') || c.get(i + 1) == Some(&'\\') => {
                i += if c.get(i + 1) == Some(&'\\') { 4 } else { 3 };
                while i < c.len() && c[i - 1] != '\'' {
                    i += 1;
                }
                out.push_str("' '");
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// The text without the bodies of modules written inline (`mod tests { … }`): their paths are
/// a test's, not the module's.
fn without_inline_modules(code: &str) -> String {
    let tokens = tokenize(code);
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "mod" && tokens.get(i + 2).is_some_and(|t| t == "{") {
            i = matching_brace(&tokens, i + 2) + 1;
            continue;
        }
        out.push(tokens[i].as_str());
        i += 1;
    }
    out.join(" ")
}

/// Each strongly connected set of two or more modules, written as its modules and the paths
/// that join them.
fn cycles(edges: &Edges) -> Vec<String> {
    let nodes: BTreeSet<&ModPath> = edges.keys().chain(edges.values().flat_map(|t| t.keys())).collect();
    let reach = |from: &ModPath| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for next in edges.get(&n).into_iter().flat_map(|t| t.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&ModPath, BTreeSet<ModPath>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for &n in &nodes {
        if done.contains(n) || !reachable[n].contains(n) {
            continue;
        }
        let set: BTreeSet<&ModPath> = nodes
            .iter()
            .copied()
            .filter(|m| reachable[n].contains(*m) && reachable[*m].contains(n))
            .collect();
        let name = |m: &ModPath| if m.is_empty() { "crate".to_owned() } else { m.join("::") };
        let joins: Vec<String> = set
            .iter()
            .flat_map(|&a| edges[a].iter().filter(|(b, _)| set.contains(b)).map(move |(b, via)| (a, b, via)))
            .map(|(a, b, via)| format!("{} -> {} (`{via}`)", name(a), name(b)))
            .collect();
        found.push(format!("modules in a cycle: {}", joins.join(", ")));
        done.extend(set.into_iter().cloned());
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(files: &[(&str, &str)]) -> BTreeMap<ModPath, String> {
        files
            .iter()
            .map(|(path, text)| {
                let path = path.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
                (path, without_inline_modules(&code_only(text)))
            })
            .collect()
    }

    #[test]
    fn a_cycle_through_a_use_group_is_found() {
        let m = modules(&[
            ("", "mod a; mod b;"),
            ("a", "use crate::{b::Thing, other};"),
            ("b", "fn f() { let _ = super::a::make(); }"),
        ]);
        let found = cycles(&edges(&m));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a -> b (`crate::b::Thing`)") && found[0].contains("b -> a"), "{found:?}");
    }

    #[test]
    fn a_child_naming_its_parent_comments_strings_and_inline_tests_are_no_edge() {
        let m = modules(&[
            ("", "mod a; mod b; use a::X;"),
            ("a", "use super::Shared; // crate::b::x\nconst S: &str = \"crate::b::y\";"),
            ("b", "use crate::a::X;\n#[cfg(test)]\nmod tests { use crate::b::Z; }"),
            ("a::c", "use crate::a::Y; use super::super::b::W;"),
        ]);
        let e = edges(&m);
        assert!(cycles(&e).is_empty(), "{e:?}");
        assert!(e[&vec!["a".to_owned(), "c".to_owned()]].contains_key(&vec!["b".to_owned()]));
    }

    #[test]
    fn the_workspace_has_no_module_cycle() {
        let problems = check(&crate::cmd::workspace_root()).unwrap();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
