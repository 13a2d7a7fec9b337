//! The layering check: the crate graph drawn in ARCHITECTURE.md (its ```layering block) must be
//! exactly the graph the Cargo.toml files declare, read with `cargo metadata`. A dependency
//! the document does not draw fails tidy, and so does an arrow the document draws but no
//! Cargo.toml has: the map stays the territory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, bail};

/// Crate → the workspace crates it depends on (any kind: normal, dev, build).
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Compares ARCHITECTURE.md's ```layering block with the workspace's real dependencies.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let doc_path = root.join("ARCHITECTURE.md");
    let doc =
        std::fs::read_to_string(&doc_path).with_context(|| format!("reading {}", doc_path.display()))?;
    let drawn = drawn_graph(&doc).with_context(|| format!("{}: the layering block", doc_path.display()))?;
    let real = real_graph()?;
    let problems = differences(&drawn, &real);
    if !problems.is_empty() {
        bail!("layering: ARCHITECTURE.md and the Cargo.toml files disagree:\n{}", problems.join("\n"));
    }
    Ok(())
}

/// Parses the fenced block that starts with "```layering": one line per crate,
/// `crate: dep dep …` (a crate with no workspace dependency has nothing after the colon).
pub fn drawn_graph(doc: &str) -> anyhow::Result<Graph> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != "```layering");
    if lines.next().is_none() {
        bail!("no ```layering block");
    }
    let mut graph = Graph::new();
    for line in lines.take_while(|l| l.trim() != "```") {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (krate, deps) =
            line.split_once(':').with_context(|| format!("`{line}`: expected `crate: deps`"))?;
        let deps = deps.split_whitespace().map(str::to_owned).collect();
        if graph.insert(krate.trim().to_owned(), deps).is_some() {
            bail!("crate `{}` is listed twice", krate.trim());
        }
    }
    Ok(graph)
}

/// The workspace's crate graph from `cargo metadata --no-deps`.
fn real_graph() -> anyhow::Result<Graph> {
    let out = crate::cmd::cargo()
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    graph_from_metadata(&meta)
}

/// The feature with which a crate built alone (xtask, the Python package) turns on the test build's
/// dependency features.
const BUILD_SHARING_FEATURE: &str = "workspace-features";

fn graph_from_metadata(meta: &serde_json::Value) -> anyhow::Result<Graph> {
    let packages = meta["packages"].as_array().context("metadata has no packages")?;
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut graph = Graph::new();
    for p in packages {
        let name = p["name"].as_str().context("package without a name")?;
        // Dependencies only a build-sharing feature turns on (to match another build's
        // features, not to be used) are no arrow.
        let sharing: BTreeSet<String> = p["features"][BUILD_SHARING_FEATURE]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str()?.strip_prefix("dep:").map(str::to_owned))
            .collect();
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                !(d["optional"].as_bool() == Some(true)
                    && d["name"].as_str().is_some_and(|n| sharing.contains(n)))
            })
            .filter_map(|d| d["name"].as_str())
            // A self dev-dependency (tests turning on the crate's own `testing` feature) is no arrow.
            .filter(|d| names.contains(d) && *d != name)
            .map(str::to_owned)
            .collect();
        graph.insert(name.to_owned(), deps);
    }
    Ok(graph)
}

/// Every way the two graphs differ, as readable lines (empty when they agree).
fn differences(drawn: &Graph, real: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for (krate, deps) in real {
        let Some(allowed) = drawn.get(krate) else {
            problems.push(format!("crate `{krate}` is missing from the layering block"));
            continue;
        };
        for dep in deps.difference(allowed) {
            problems.push(format!("`{krate}` depends on `{dep}`, which the layering does not allow"));
        }
        for dep in allowed.difference(deps) {
            problems.push(format!(
                "the layering draws `{krate}` → `{dep}`, but {krate}'s Cargo.toml has no such dependency"
            ));
        }
    }
    for krate in drawn.keys().filter(|k| !real.contains_key(*k)) {
        problems.push(format!("the layering block lists `{krate}`, which is not a workspace crate"));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges.iter().map(|(k, d)| ((*k).to_owned(), d.iter().map(|s| (*s).to_owned()).collect())).collect()
    }

    #[test]
    fn the_block_parses_and_blank_and_comment_lines_are_skipped() {
        let doc =
            "text\n```layering\n# host\nblock-alloc:\nscheduler: block-alloc\n\nsim: scheduler\n```\nmore\n";
        let g = drawn_graph(doc).unwrap();
        assert_eq!(
            g,
            graph(&[("block-alloc", &[]), ("scheduler", &["block-alloc"]), ("sim", &["scheduler"])])
        );
        assert!(drawn_graph("no block").is_err());
        assert!(drawn_graph("```layering\na: b\na: c\n```").is_err());
    }

    #[test]
    fn forbidden_missing_and_stale_arrows_are_each_reported() {
        let drawn = graph(&[("a", &[]), ("b", &["a"]), ("ghost", &[])]);
        let real = graph(&[("a", &["b"]), ("b", &[]), ("c", &[])]);
        let p = differences(&drawn, &real);
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(p.iter().any(|l| l.contains("`a` depends on `b`")));
        assert!(p.iter().any(|l| l.contains("draws `b` → `a`")));
        assert!(p.iter().any(|l| l.contains("`c` is missing")));
        assert!(p.iter().any(|l| l.contains("`ghost`")));
        assert!(differences(&real, &real).is_empty());
    }

    #[test]
    fn dependencies_only_the_build_sharing_feature_turns_on_are_ignored() {
        let meta = serde_json::json!({"packages": [
            {"name": "a", "features": {"workspace-features": ["dep:b", "c/x"]},
             "dependencies": [{"name": "b", "optional": true}, {"name": "c", "optional": false}]},
            {"name": "b", "dependencies": []},
            {"name": "c", "dependencies": []},
        ]});
        let g = graph_from_metadata(&meta).expect("graph");
        assert_eq!(g["a"], BTreeSet::from(["c".to_owned()]));
    }

    #[test]
    fn metadata_dependencies_outside_the_workspace_and_on_itself_are_ignored() {
        let meta = serde_json::json!({"packages": [
            {"name": "a", "dependencies": [{"name": "serde"}, {"name": "b"}, {"name": "a"}]},
            {"name": "b", "dependencies": []},
        ]});
        assert_eq!(graph_from_metadata(&meta).unwrap(), graph(&[("a", &["b"]), ("b", &[])]));
    }

    #[test]
    fn architecture_md_draws_the_real_graph() {
        check(&crate::cmd::workspace_root()).unwrap();
    }
}
