//! `--config FILE.yaml`, as vLLM's: a YAML mapping of option names (`max-num-seqs` or
//! `max_num_seqs`) to values, read before the command line is parsed and put in `--config`'s
//! place. An option given on the command line as well keeps the command line's value.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use serde_norway::Value;

/// The command line with each `--config FILE` (or `--config=FILE`) replaced by the options the
/// file sets, less those the command line sets itself.
pub fn expand(args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some(at) = args.iter().position(|a| a == "--config" || a.to_string_lossy().starts_with("--config="))
    else {
        return Ok(args);
    };
    let (path, taken) = match args[at].to_string_lossy().strip_prefix("--config=") {
        Some(path) => (OsString::from(path), 1),
        None => (args.get(at + 1).cloned().context("--config needs a FILE.yaml")?, 2),
    };
    let given: Vec<String> = args
        .iter()
        .filter_map(|a| a.to_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(option_name)
        .collect();
    let from_file = options_of(Path::new(&path))?
        .into_iter()
        .filter(|(name, _)| !given.contains(name))
        .flat_map(|(name, values)| flags(&name, values))
        .collect::<Vec<_>>();
    let mut out = args[..at].to_vec();
    out.extend(from_file);
    out.extend(args[at + taken..].iter().cloned());
    expand(out)
}

/// An option's name as the command line spells it: `max_num_seqs` and `max-num-seqs=4` are
/// `max-num-seqs`.
fn option_name(raw: &str) -> String {
    raw.split('=').next().unwrap_or(raw).replace('_', "-")
}

/// The file's options in order: each name with its values as command-line words (`None` for a
/// flag that is on, no entry for one that is off).
fn options_of(path: &Path) -> anyhow::Result<Vec<(String, Vec<Option<String>>)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--config: reading {}", path.display()))?;
    let doc: Value =
        serde_norway::from_str(&text).with_context(|| format!("--config: {} is not YAML", path.display()))?;
    let Value::Mapping(map) = doc else {
        bail!("--config: {} must be a mapping of option names to values", path.display());
    };
    let mut options = Vec::with_capacity(map.len());
    for (key, value) in map {
        let Value::String(key) = key else {
            bail!("--config: {}: an option name is not a string", path.display())
        };
        if key == "config" {
            bail!("--config: {} sets config itself", path.display());
        }
        let values = match value {
            Value::Bool(false) | Value::Null => continue,
            Value::Bool(true) => vec![None],
            Value::Sequence(items) => {
                items.iter().map(|v| word(v, &key).map(Some)).collect::<anyhow::Result<_>>()?
            }
            other => vec![Some(word(&other, &key)?)],
        };
        options.push((option_name(&key), values));
    }
    Ok(options)
}

/// A scalar as its command-line word; a mapping as JSON (`speculative-config: {method: ngram}`).
fn word(value: &Value, key: &str) -> anyhow::Result<String> {
    Ok(match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Mapping(_) => {
            serde_json::to_string(&serde_norway::from_value::<serde_json::Value>(value.clone())?)?
        }
        _ => bail!("--config: {key}: a value must be a string, number, boolean, list or mapping"),
    })
}

fn flags(name: &str, values: Vec<Option<String>>) -> Vec<OsString> {
    let mut words = Vec::new();
    for value in values {
        words.push(OsString::from(format!("--{name}")));
        words.extend(value.map(OsString::from));
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_with(yaml: &str, args: &[&str]) -> anyhow::Result<Vec<String>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, yaml)?;
        let args = args.iter().map(|a| a.replace("FILE", &file.to_string_lossy()));
        let out = expand(args.map(OsString::from).collect())?;
        Ok(out.into_iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn options_from_the_file_take_config_place_and_the_command_line_wins() {
        let yaml = "max_num_seqs: 8\nport: 9000\nno-prefix-caching: true\nabort-on-shutdown: false\n\
                    allowed-origins: [http://a.test, http://b.test]\n\
                    speculative_config: {method: ngram, num_speculative_tokens: 3}\n";
        let out = expand_with(yaml, &["paged-llm", "serve", "--config", "FILE", "--port", "8001"]).unwrap();
        assert_eq!(
            out,
            [
                "paged-llm",
                "serve",
                "--max-num-seqs",
                "8",
                "--no-prefix-caching",
                "--allowed-origins",
                "http://a.test",
                "--allowed-origins",
                "http://b.test",
                "--speculative-config",
                r#"{"method":"ngram","num_speculative_tokens":3}"#,
                "--port",
                "8001",
            ]
        );
        let eq = expand_with("seed: 3\n", &["paged-llm", "run", "--config=FILE"]).unwrap();
        assert_eq!(eq, ["paged-llm", "run", "--seed", "3"]);
    }

    #[test]
    fn a_missing_or_malformed_file_is_an_error_naming_it() {
        let err =
            expand(["p", "serve", "--config", "/nonexistent.yaml"].map(OsString::from).to_vec()).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent.yaml"), "{err:#}");
        for bad in ["- a\n- b\n", "port: [\n", "config: other.yaml\n"] {
            assert!(expand_with(bad, &["p", "serve", "--config", "FILE"]).is_err(), "{bad}");
        }
        assert!(expand(["p", "serve", "--config"].map(OsString::from).to_vec()).is_err());
    }
}
