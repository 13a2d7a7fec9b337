//! The command line: grouped help, one-line errors with exit code 2, `--config FILE.yaml`, the
//! model load's progress.

use std::process::Output;

use crate::support::paged_llm;

fn run(args: &[&str]) -> Output {
    paged_llm().args(args).env_remove("RUST_BACKTRACE").output().unwrap_or_else(|e| panic!("paged-llm: {e}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_lists_every_subcommand_and_groups_options_as_vllm() {
    let top = run(&["--help"]);
    assert!(top.status.success());
    let text = String::from_utf8_lossy(&top.stdout);
    for sub in ["serve", "run", "bench", "plan", "perplexity", "fetch-model", "make-model"] {
        assert!(text.contains(&format!("\n  {sub} ")), "{sub} missing from:\n{text}");
    }
    let serve = run(&["serve", "--help"]);
    let text = String::from_utf8_lossy(&serve.stdout);
    for heading in ["ModelConfig:", "CacheConfig:", "SchedulerConfig:", "DeviceConfig:", "Frontend:"] {
        assert!(text.contains(heading), "{heading} missing from serve --help:\n{text}");
    }
    let group_of = |flag: &str| {
        let at = text.find(flag).unwrap_or_else(|| panic!("{flag} missing"));
        text[..at].rfind("Config:").map(|h| text[..h].rsplit('\n').next().unwrap_or("").to_owned())
    };
    assert_eq!(group_of("--kv-cache-dtype").as_deref(), Some("Cache"));
    assert_eq!(group_of("--max-num-seqs").as_deref(), Some("Scheduler"));
    assert_eq!(group_of("--kv-events-config").as_deref(), Some("Vllm"));
    for sub in [
        &["run"][..],
        &["bench", "throughput"],
        &["bench", "latency"],
        &["bench", "serve"],
        &["plan"],
        &["perplexity"],
        &["fetch-model"],
        &["make-model"],
    ] {
        let out = run(&[sub, &["--help"]].concat());
        assert!(out.status.success() && !out.stdout.is_empty(), "{sub:?} --help: {}", stderr(&out));
    }
    let bench_serve = String::from_utf8_lossy(&run(&["bench", "serve", "--help"]).stdout).into_owned();
    for flag in ["--request-rate", "--max-concurrency", "--metric-percentiles", "--base-url"] {
        assert!(bench_serve.contains(flag), "{flag}: {bench_serve}");
    }
}

#[test]
fn a_bad_command_line_is_one_line_and_exit_code_2() {
    for (args, says) in [
        (&["serve", "--no-such-option"][..], "unexpected argument '--no-such-option'"),
        (&["serve", "--port", "eighty"], "invalid value 'eighty' for '--port"),
        (&["serve", "--kv-cache-dtype", "int4"], "invalid value 'int4'"),
        (&["bench", "serve", "--request-rate", "fast"], "invalid value 'fast'"),
        (&["no-such-command"], "unrecognized subcommand"),
        (&["serve", "--config", "/no/such/file.yaml"], "/no/such/file.yaml"),
        (&["serve", "--kv-events-config", r#"{"enable_kv_cache_events": true, "endpont": "x"}"#], "endpont"),
        (&["serve", "--kv-events-config", "{not json"], "--kv-events-config"),
    ] {
        let out = run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line:\n{err}");
        assert!(err.starts_with("paged-llm: error: ") && err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    }
}

#[test]
fn a_config_file_sets_options_and_the_command_line_overrides_them() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("plan.yaml");
    // `plan` runs in a moment: its JSON names the settings it simulated.
    std::fs::write(&file, "block_size: 32\nmax-num-seqs: 3\nkv_tokens: 4096\njson: true\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let config = file.to_string_lossy().into_owned();
    let out = run(&["plan", "--config", &config, "--max-num-seqs", "2", "--num-requests", "20"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let text = json.to_string();
    // 4096 slots in blocks of 32 (the file's), at most 2 running (the command line's, not 3).
    assert!(text.contains("\"num_blocks\":128"), "{text}");
    assert!(text.contains("\"max_running\":2,"), "{text}");
    std::fs::write(&file, "block_size: huge\n").unwrap_or_else(|e| panic!("{e}"));
    let bad = run(&["plan", "--config", &config]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("invalid value 'huge' for '--block-size"), "{}", stderr(&bad));
}

/// Not on a terminal, a model's load prints lines as its bytes are read and its tensors built,
/// ending at every tensor the checkpoint holds.
#[test]
fn a_load_prints_its_bytes_and_tensors_as_it_goes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    model::testing::write_tiny_llama(dir.path(), 7);
    let file = std::fs::read(dir.path().join("model.safetensors")).unwrap_or_else(|e| panic!("{e}"));
    let tensors = safetensors::SafeTensors::deserialize(&file).unwrap_or_else(|e| panic!("{e}")).len();
    let model = dir.path().to_string_lossy().into_owned();
    let args = ["--input-len", "4", "--output-len", "2", "--num-iters-warmup", "0", "--num-iters", "1"];
    let out = run(&[&["bench", "latency", "--model", &model, "--num-kv-blocks", "16"][..], &args].concat());
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let name = dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mib = file.len() as f64 / (1u64 << 20) as f64;
    for line in [
        format!("reading {name}: 100% ({mib:.1} of {mib:.1} MiB)"),
        format!("loading: 100% ({tensors} of {tensors} tensors)"),
    ] {
        assert!(err.lines().any(|l| l == line), "no line {line:?} in:\n{err}");
    }
    // The tensors as they load, not only at the end.
    assert!(err.lines().filter(|l| l.starts_with("loading: ")).count() >= 5, "{err}");
}
