//! Reads criterion's per-benchmark output (`new/benchmark.json` + `new/estimates.json`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::Figures;
use crate::cmd::files_under;

/// One criterion benchmark as measured in this run.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Median time per iteration, nanoseconds.
    pub median_ns: f64,
    /// Bytes (or elements) processed per iteration, when the bench declared a throughput.
    pub throughput: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct BenchmarkJson {
    full_id: String,
    throughput: Option<BTreeMap<String, f64>>,
}

#[derive(Debug, Deserialize)]
struct Estimate {
    point_estimate: f64,
}

#[derive(Debug, Deserialize)]
struct EstimatesJson {
    median: Estimate,
}

/// All benchmarks under `home` (each `…/new/` folder with both files), keyed by criterion's full
/// id (`group/function[/param]`).
pub fn load(home: &Path) -> anyhow::Result<BTreeMap<String, Measured>> {
    let mut out = BTreeMap::new();
    for bench in files_under(home, &|_| false)?.iter().filter(|f| f.ends_with("new/benchmark.json")) {
        let estimates = bench.with_file_name("estimates.json");
        if !estimates.exists() {
            continue;
        }
        let b: BenchmarkJson = serde_json::from_str(&std::fs::read_to_string(bench)?)
            .with_context(|| format!("parsing {}", bench.display()))?;
        let e: EstimatesJson = serde_json::from_str(&std::fs::read_to_string(&estimates)?)
            .with_context(|| format!("parsing {}", estimates.display()))?;
        let throughput = b.throughput.and_then(|t| t.values().next().copied());
        out.insert(b.full_id, Measured { median_ns: e.median.point_estimate, throughput });
    }
    Ok(out)
}

/// Figures named directly by criterion ids `GROUP/leaf_UNIT`.
pub fn figures(measured: &BTreeMap<String, Measured>) -> Figures {
    measured
        .iter()
        .filter_map(|(id, m)| {
            let (group, leaf) = id.split_once('/').filter(|(_, leaf)| !leaf.contains('/'))?;
            Some((format!("{group}.{leaf}"), m.median_ns / unit_scale(leaf)?))
        })
        .collect()
}

/// Nanoseconds per unit named by a figure's unit part: the last `_UNIT` of the leaf, optionally
/// followed by a numeric workload size (`alloc_free_ns`, `step_us_256`).
fn unit_scale(leaf: &str) -> Option<f64> {
    let unit_part = match leaf.rsplit_once('_') {
        Some((head, size)) if !size.is_empty() && size.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => leaf,
    };
    [("_ns", 1.0), ("_us", 1e3), ("_ms", 1e6), ("_s", 1e9)]
        .into_iter()
        .find(|(suffix, _)| unit_part.ends_with(suffix))
        .map(|(_, scale)| scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_suffixes_convert_from_nanoseconds() {
        let mut m = BTreeMap::new();
        m.insert("g/a_ns".to_owned(), Measured { median_ns: 40.0, throughput: None });
        m.insert("g/b_us".to_owned(), Measured { median_ns: 4000.0, throughput: None });
        m.insert("g/plain".to_owned(), Measured { median_ns: 1.0, throughput: None });
        m.insert("g/c_us/16".to_owned(), Measured { median_ns: 1.0, throughput: None });
        m.insert("g/step_us_256".to_owned(), Measured { median_ns: 16_000.0, throughput: None });
        m.insert("g/bytes_256".to_owned(), Measured { median_ns: 1.0, throughput: None });
        let f = figures(&m);
        assert_eq!(f.len(), 3);
        assert_eq!(f["g.step_us_256"], 16.0);
        assert_eq!(f["g.a_ns"], 40.0);
        assert_eq!(f["g.b_us"], 4.0);
    }
}
