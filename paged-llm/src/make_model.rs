//! `paged-llm make-model`: a GGUF with random weights at a real model's exact shapes (the
//! table below, from each model's published `config.json`), quantized by llama.cpp's own
//! quantizer, checked to load and run in llama.cpp and in this engine. What the `peer` bench
//! measures real model sizes on, with no weights from a hub.
//!
//! The file is written by `make_model/make_model.py` (weights, tokenizer, quantization; its
//! module doc says how, and it is compiled into this program) run by a Python with
//! llama-cpp-python and `gguf` (`--python`, or `PAGED_LLM_LLAMACPP_PYTHON`; `cargo xtask
//! make-model` passes the checkout's `target/venv-llamacpp`). Left out of the shapes, as they change no
//! cost: Llama 3's RoPE frequency scaling (`rope_freqs`) and the tokenizer itself (SmolLM2's,
//! padded to the real vocabulary size).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use engine::DType;
use model::Model;
use model::quality::Scorer;
use serde_json::json;

use crate::cmd::run_cmd as run;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shape {
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    #[value(name = "qwen2.5-1.5b")]
    Qwen25_1_5b,
    #[value(name = "llama-3.2-3b")]
    Llama32_3b,
    #[value(name = "llama-3.1-8b")]
    Llama31_8b,
    /// Two small layers over a padded vocabulary: the test's shape.
    #[value(name = "tiny")]
    Tiny,
}

/// llama.cpp's file types (`llama_ftype`) the command makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Quant {
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_k_m")]
    Q4KM,
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(Debug, Args)]
pub struct MakeModelArgs {
    #[arg(long, value_enum)]
    pub shape: Shape,
    #[arg(long, value_enum)]
    pub quant: Quant,
    /// Seed of the weights (the same shape, quantization and seed give the same file).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output file [default: made/<shape>-<quant>.gguf in the models folder, `-seed<S>` before the
    /// extension for a seed other than 0].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A Python with llama-cpp-python and `gguf` [default: PAGED_LLM_LLAMACPP_PYTHON, else
    /// python3].
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
}

/// One shape's dimensions, as its `config.json` states them.
struct Dims {
    arch: &'static str,
    hidden: usize,
    ffn: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    tied: bool,
    qkv_bias: bool,
    rope_theta: f64,
    rms_eps: f64,
    context: usize,
}

impl Shape {
    fn dims(self) -> Dims {
        let llama = |hidden, ffn, layers, heads, tied| Dims {
            arch: "llama",
            hidden,
            ffn,
            layers,
            heads,
            kv_heads: 8,
            head_dim: hidden / heads,
            vocab: 128_256,
            tied,
            qkv_bias: false,
            rope_theta: 500_000.0,
            rms_eps: 1e-5,
            context: 131_072,
        };
        match self {
            Shape::Llama32_1b => llama(2048, 8192, 16, 32, true),
            Shape::Llama32_3b => llama(3072, 8192, 28, 24, true),
            Shape::Llama31_8b => llama(4096, 14_336, 32, 32, false),
            Shape::Qwen25_1_5b => Dims {
                arch: "qwen2",
                hidden: 1536,
                ffn: 8960,
                layers: 28,
                heads: 12,
                kv_heads: 2,
                head_dim: 128,
                vocab: 151_936,
                tied: true,
                qkv_bias: true,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                context: 32_768,
            },
            Shape::Tiny => Dims {
                arch: "llama",
                hidden: 256,
                ffn: 512,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 49_408,
                tied: true,
                qkv_bias: false,
                rope_theta: 10_000.0,
                rms_eps: 1e-5,
                context: 2048,
            },
        }
    }

    fn name(self) -> String {
        self.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
    }
}

impl Quant {
    /// `llama_ftype`'s value.
    fn ftype(self) -> u32 {
        match self {
            Quant::Q4_0 => 2,
            Quant::Q8_0 => 7,
            Quant::Q4KM => 15,
        }
    }

    fn name(self) -> String {
        self.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
    }
}

/// Where `make-model` writes a shape's file by default.
pub fn default_out(shape: Shape, quant: Quant, seed: u64) -> PathBuf {
    let seed = if seed == 0 { String::new() } else { format!("-seed{seed}") };
    crate::models_dir().join("made").join(format!("{}-{}{seed}.gguf", shape.name(), quant.name()))
}

pub fn run_make_model(args: &MakeModelArgs) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| default_out(args.shape, args.quant, args.seed));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let d = args.shape.dims();
    let spec = json!({
        "shape": args.shape.name(), "arch": d.arch, "hidden": d.hidden, "ffn": d.ffn,
        "layers": d.layers, "heads": d.heads, "kv_heads": d.kv_heads, "head_dim": d.head_dim,
        "vocab": d.vocab, "tied": d.tied, "qkv_bias": d.qkv_bias, "rope_theta": d.rope_theta,
        "rms_eps": d.rms_eps, "context": d.context, "ftype": args.quant.ftype(), "seed": args.seed,
    });
    let spec_path = out.with_extension("spec.json");
    std::fs::write(&spec_path, serde_json::to_string_pretty(&spec)?)
        .with_context(|| format!("writing {}", spec_path.display()))?;
    let tokenizer = crate::fetch_model::default_model()?;
    let python = llamacpp_python(args.python.as_deref())?;
    let script = out.with_extension("make_model.py");
    std::fs::write(&script, MAKE_MODEL_PY).with_context(|| format!("writing {}", script.display()))?;
    let made = run(Command::new(python)
        .arg(&script)
        .arg("--spec")
        .arg(&spec_path)
        .arg("--tokenizer")
        .arg(&tokenizer)
        .arg("--out")
        .arg(&out));
    let _ = std::fs::remove_file(&spec_path);
    let _ = std::fs::remove_file(&script);
    made?;
    check_loads(&out, &d)?;
    println!("{}", out.display());
    Ok(())
}

/// The script that writes the file (run by llama.cpp's Python bindings).
const MAKE_MODEL_PY: &str = include_str!("make_model/make_model.py");

/// The Python that runs [`MAKE_MODEL_PY`]: `--python`, else `PAGED_LLM_LLAMACPP_PYTHON`, else
/// `python3` when it imports `llama_cpp` and `gguf`.
fn llamacpp_python(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(python) = flag
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("PAGED_LLM_LLAMACPP_PYTHON").map(PathBuf::from))
    {
        return Ok(python);
    }
    let ready = Command::new("python3")
        .args(["-c", "import llama_cpp, gguf"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        bail!(
            "make-model quantizes with llama.cpp: give --python PATH (a Python with llama-cpp-python and gguf, \
             as `cargo xtask make-model` does), or `pip install llama-cpp-python gguf`"
        );
    }
    Ok(PathBuf::from("python3"))
}

/// This engine loads `path`, finds the shape's dimensions in it, and scores a few tokens to
/// finite log-probabilities.
fn check_loads(path: &Path, d: &Dims) -> anyhow::Result<()> {
    let model = Model::load(path).with_context(|| format!("this engine cannot load {}", path.display()))?;
    let c = &model.config;
    let found = (c.hidden_size, c.num_hidden_layers, c.vocab_size);
    if found != (d.hidden, d.layers, d.vocab) {
        bail!(
            "{} loads as hidden/layers/vocab {found:?}, not {:?}",
            path.display(),
            (d.hidden, d.layers, d.vocab)
        );
    }
    let tokens: Vec<u32> = (100..116).collect();
    let mut scorer = Scorer::new(&model, tokens.len(), DType::F32)?;
    let mut rows = Vec::new();
    scorer.log_probs(&tokens, 8..tokens.len() - 1, &mut rows)?;
    if rows.is_empty() || !rows.iter().all(|v| v.is_finite()) {
        bail!("this engine's log-probabilities of {} are not finite", path.display());
    }
    eprintln!("make-model: this engine loads {} and scores {} rows", path.display(), rows.len() / d.vocab);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: MakeModelArgs,
    }

    #[test]
    fn a_tiny_model_is_made_and_loads_in_llama_cpp_and_in_this_engine() {
        let dir = tempfile::tempdir().unwrap();
        for quant in [Quant::Q4_0, Quant::Q4KM] {
            let out = dir.path().join(format!("tiny-{}.gguf", quant.name()));
            // Both loads (llama.cpp's decode in the script, this engine's scores here) are
            // part of the command: it fails when either engine cannot run the file.
            // `cargo xtask test` makes this venv before the tests run.
            let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/venv-llamacpp/bin/python");
            let args = MakeModelArgs {
                shape: Shape::Tiny,
                quant,
                seed: 1,
                out: Some(out.clone()),
                python: Some(python),
            };
            run_make_model(&args).unwrap();
            let model = Model::load(&out).unwrap();
            assert_eq!(model.config.vocab_size, 49_408, "the padded vocabulary");
            assert_eq!(model.config.intermediate_size, 512);
        }
    }

    #[test]
    fn an_unknown_shape_or_quantization_is_refused_with_the_known_ones() {
        let err = Cli::try_parse_from(["make-model", "--shape", "llama-9b", "--quant", "q4_0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid value 'llama-9b'") && err.contains("llama-3.1-8b"), "{err}");
        let err = Cli::try_parse_from(["make-model", "--shape", "tiny", "--quant", "q3_k"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid value 'q3_k'") && err.contains("q4_k_m"), "{err}");
        let ok = Cli::try_parse_from(["make-model", "--shape", "qwen2.5-1.5b", "--quant", "q8_0"]).unwrap();
        assert_eq!((ok.args.shape, ok.args.quant), (Shape::Qwen25_1_5b, Quant::Q8_0));
    }
}
