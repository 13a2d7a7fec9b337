//! The crate built on its own beside `cargo test --workspace --features gpu-check/cuda` (the
//! Python package, by maturin)
//! turns on, with its `workspace-features` feature, the
//! features the test build gives their dependencies: the tests here keep those lists exact, so
//! that no dependency compiles twice in `cargo xtask test`.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::cmd::{cargo, workspace_root};

    /// Each package of `cargo tree ARGS` (over the `edges` kinds) with its features.
    fn feature_sets(args: &[&str], edges: &str) -> BTreeMap<String, BTreeSet<String>> {
        let out = cargo()
            .current_dir(workspace_root())
            .args(["tree", "--quiet", "--prefix", "none", "-e", edges, "-f", "{p}|{f}"])
            .args(args)
            .output()
            .expect("cargo tree runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((package, features)) = line.trim_end_matches(" (*)").split_once('|') else { continue };
            let name = package.split(" (").next().unwrap_or(package).to_owned();
            let set = sets.entry(name).or_default();
            set.extend(features.split(',').filter(|f| !f.is_empty()).map(str::to_owned));
        }
        sets
    }

    /// `package` built alone with `workspace-features` has, in every dependency it shares with
    /// `cargo test --workspace`, exactly that build's features.
    fn assert_features_match_the_test_build(package: &str, manifest: &str) {
        let workspace = feature_sets(
            &["--workspace", "--features", crate::cuda_check::CUDA_FEATURES],
            "normal,build,dev",
        );
        let features = format!("{package}/workspace-features");
        let alone = feature_sets(&["-p", package, "--features", &features], "normal,build");
        let differing: Vec<String> = alone
            .iter()
            .filter(|(name, _)| !name.starts_with(&format!("{package} ")))
            .filter(|(name, features)| workspace.get(*name) != Some(*features))
            .map(|(name, features)| format!("{name}: {features:?} vs {:?}", workspace.get(name)))
            .collect();
        assert!(differing.is_empty(), "update {manifest}'s workspace-features: {differing:#?}");
    }

    #[test]
    fn the_python_package_shares_the_test_builds_features() {
        assert_features_match_the_test_build("paged-llm-python", "python/Cargo.toml");
    }
}
