//! The reference file of a quality run (`--save-logits`, read back by `--kl-reference`), little
//! endian:
//!
//! ```text
//! magic "PLLMQREF", version u32 (1)
//! vocab u32, ctx u32, stride u32, windows u32, first_scored u32, top_k u32
//! name_len u32, name (UTF-8: the model that made it)
//! tokens: windows × ctx u32 (each window's tokens as run, BOS first where the model adds one)
//! rows: per window, ctx − 1 − first_scored rows of
//!       next u32 (log-probability of the text's next token, an f32's bits),
//!       top_k × (token u32, log-probability f32), most likely first
//! ```
//!
//! Top-k rows rather than whole ones: a row of a 262 144-token vocabulary is 1 MiB, and the
//! KL divergence over the top [`TOP_K`] and the rest as one outcome is within rounding of the
//! whole one when they hold nearly all of the mass (`stats.rs`). The reader checks the header's
//! sizes with checked arithmetic and the file's length against them before reading any row.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::QualityError;

const MAGIC: &[u8; 8] = b"PLLMQREF";
const VERSION: u32 = 1;
/// Tokens kept per row.
pub const TOP_K: usize = 64;
/// Longest model name kept.
const MAX_NAME: usize = 4096;

/// What a reference file describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceHeader {
    pub vocab: usize,
    pub ctx: usize,
    pub stride: usize,
    pub windows: usize,
    pub first_scored: usize,
    pub top_k: usize,
    pub name: String,
}

impl ReferenceHeader {
    /// The header of a run over `plan`'s windows of a `vocab`-token model, keeping [`TOP_K`].
    pub fn for_plan(plan: &super::WindowPlan, vocab: usize, name: String) -> Self {
        Self {
            vocab,
            ctx: plan.ctx,
            stride: plan.stride,
            windows: plan.windows,
            first_scored: plan.first_scored(),
            top_k: TOP_K.min(vocab),
            name,
        }
    }

    fn rows_per_window(&self) -> usize {
        self.ctx.saturating_sub(1 + self.first_scored)
    }

    fn row_bytes(&self) -> Option<u64> {
        (self.top_k as u64).checked_mul(8)?.checked_add(4)
    }

    /// The file's whole length, or `None` when the sizes overflow.
    fn file_len(&self) -> Option<u64> {
        let header = 8 + 4 * 8 + self.name.len() as u64;
        let tokens = (self.windows as u64).checked_mul(self.ctx as u64)?.checked_mul(4)?;
        let rows = (self.windows as u64)
            .checked_mul(self.rows_per_window() as u64)?
            .checked_mul(self.row_bytes()?)?;
        header.checked_add(tokens)?.checked_add(rows)
    }
}

pub(super) fn io_err(path: &Path) -> impl Fn(std::io::Error) -> QualityError + '_ {
    move |source| QualityError::Io { path: path.display().to_string(), source }
}

/// A malformed file of this module's formats, saying why.
pub(super) fn bad_file(path: &Path) -> impl Fn(String) -> QualityError + '_ {
    move |reason| QualityError::BadReference { path: path.display().to_string(), reason }
}

/// Opens `path`, a file of this module's formats (`what`: "a reference file", …): checks its
/// 8-byte `magic` and the `version` in the first of the `W` little-endian u32 words after it.
/// Returns the reader past those words, the file's length in bytes and the words (the version
/// first), so that the caller can check its own sizes against that length.
pub(super) fn open_headed<const W: usize>(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
    what: &str,
) -> Result<(BufReader<File>, u64, [usize; W]), QualityError> {
    let (err, bad) = (io_err(path), bad_file(path));
    let file = File::open(path).map_err(&err)?;
    let len = file.metadata().map_err(&err)?.len();
    let mut input = BufReader::new(file);
    let mut head = vec![0u8; 8 + 4 * W];
    input.read_exact(&mut head).map_err(|_| bad(format!("{len} bytes: shorter than a header")))?;
    if &head[..8] != magic {
        return Err(bad(format!("not {what} (no {} magic)", String::from_utf8_lossy(magic))));
    }
    let words: [usize; W] = std::array::from_fn(|i| {
        u32::from_le_bytes([head[8 + 4 * i], head[9 + 4 * i], head[10 + 4 * i], head[11 + 4 * i]]) as usize
    });
    if words[0] != version as usize {
        return Err(bad(format!("version {} (this build reads {version})", words[0])));
    }
    Ok((input, len, words))
}

/// Errors unless a file's `len` bytes are the `want` its header describes.
pub(super) fn check_len(path: &Path, len: u64, want: u64) -> Result<(), QualityError> {
    if len == want {
        return Ok(());
    }
    let what = if len < want { "truncated" } else { "longer than its header says" };
    Err(bad_file(path)(format!("{what}: {len} bytes, its header describes {want}")))
}

/// Writes a reference file row by row; [`ReferenceWriter::finish`] checks that every row came.
#[derive(Debug)]
pub struct ReferenceWriter {
    out: BufWriter<File>,
    path: PathBuf,
    rows_left: usize,
    top_k: usize,
}

impl ReferenceWriter {
    pub fn create(path: &Path, header: &ReferenceHeader, tokens: &[u32]) -> Result<Self, QualityError> {
        if tokens.len() != header.windows * header.ctx || header.name.len() > MAX_NAME {
            return Err(QualityError::BadPlan(format!(
                "{} tokens for {} windows of {}",
                tokens.len(),
                header.windows,
                header.ctx
            )));
        }
        let err = io_err(path);
        let mut out = BufWriter::new(File::create(path).map_err(&err)?);
        let mut bytes = MAGIC.to_vec();
        for v in [
            VERSION as usize,
            header.vocab,
            header.ctx,
            header.stride,
            header.windows,
            header.first_scored,
            header.top_k,
            header.name.len(),
        ] {
            bytes.extend_from_slice(&(v as u32).to_le_bytes());
        }
        bytes.extend_from_slice(header.name.as_bytes());
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        out.write_all(&bytes).map_err(&err)?;
        Ok(Self {
            out,
            path: path.to_owned(),
            rows_left: header.windows * header.rows_per_window(),
            top_k: header.top_k,
        })
    }

    /// The next row: the text's next token's log-probability and the top tokens.
    pub fn write_row(&mut self, next: f32, top: &[(u32, f32)]) -> Result<(), QualityError> {
        if top.len() != self.top_k || self.rows_left == 0 {
            return Err(QualityError::BadPlan(format!(
                "a row of {} tokens (want {}), {} rows left",
                top.len(),
                self.top_k,
                self.rows_left
            )));
        }
        self.rows_left -= 1;
        let mut bytes = Vec::with_capacity(4 + 8 * top.len());
        bytes.extend_from_slice(&next.to_le_bytes());
        for &(t, lp) in top {
            bytes.extend_from_slice(&t.to_le_bytes());
            bytes.extend_from_slice(&lp.to_le_bytes());
        }
        self.out.write_all(&bytes).map_err(io_err(&self.path))
    }

    pub fn finish(mut self) -> Result<(), QualityError> {
        if self.rows_left != 0 {
            return Err(QualityError::BadPlan(format!("{} rows were never written", self.rows_left)));
        }
        self.out.flush().map_err(io_err(&self.path))
    }
}

/// Reads a reference file: its header and tokens at once, then its rows in order.
#[derive(Debug)]
pub struct ReferenceReader {
    pub header: ReferenceHeader,
    pub tokens: Vec<u32>,
    input: BufReader<File>,
    path: PathBuf,
    row: Vec<u8>,
}

impl ReferenceReader {
    pub fn open(path: &Path) -> Result<Self, QualityError> {
        let (err, bad) = (io_err(path), bad_file(path));
        let (mut input, len, [_, vocab, ctx, stride, windows, first_scored, top_k, name_len]) =
            open_headed::<8>(path, MAGIC, VERSION, "a reference file")?;
        if name_len > MAX_NAME {
            return Err(bad(format!("a model name of {name_len} bytes")));
        }
        let mut name = vec![0u8; name_len];
        input.read_exact(&mut name).map_err(|_| bad("truncated in its header".into()))?;
        let header = ReferenceHeader {
            vocab,
            ctx,
            stride,
            windows,
            first_scored,
            top_k,
            name: String::from_utf8(name).map_err(|_| bad("the model name is not UTF-8".into()))?,
        };
        if header.ctx < 4
            || header.first_scored + 1 >= header.ctx
            || header.top_k == 0
            || header.top_k > header.vocab
        {
            return Err(bad(format!("inconsistent header {header:?}")));
        }
        let want = header.file_len().ok_or_else(|| bad(format!("sizes overflow: {header:?}")))?;
        check_len(path, len, want)?;
        let mut raw = vec![0u8; header.windows * header.ctx * 4];
        input.read_exact(&mut raw).map_err(&err)?;
        let tokens: Vec<u32> =
            raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= header.vocab) {
            return Err(bad(format!("token {t} is outside its vocabulary of {}", header.vocab)));
        }
        Ok(Self { header, tokens, input, path: path.to_owned(), row: Vec::new() })
    }

    /// Checks that a model of `vocab` tokens can be compared with this reference: another
    /// vocabulary is another model's (its token ids mean other tokens).
    pub fn check_vocab(&self, vocab: usize) -> Result<(), QualityError> {
        if self.header.vocab == vocab {
            return Ok(());
        }
        Err(QualityError::Mismatch(format!(
            "the reference ({}) has a vocabulary of {} tokens, this model {vocab}: another model's",
            self.header.name, self.header.vocab
        )))
    }

    /// Rows of each window.
    pub fn rows_per_window(&self) -> usize {
        self.header.rows_per_window()
    }

    /// The next row: the reference's log-probability of the text's next token, and its top
    /// tokens into `top`.
    pub fn read_row(&mut self, top: &mut Vec<(u32, f32)>) -> Result<f32, QualityError> {
        self.row.resize(4 + 8 * self.header.top_k, 0);
        self.input.read_exact(&mut self.row).map_err(io_err(&self.path))?;
        let word = |i: usize| [self.row[i], self.row[i + 1], self.row[i + 2], self.row[i + 3]];
        top.clear();
        top.extend(
            (0..self.header.top_k)
                .map(|k| (u32::from_le_bytes(word(4 + 8 * k)), f32::from_le_bytes(word(8 + 8 * k)))),
        );
        if let Some(&(t, _)) = top.iter().find(|&&(t, _)| t as usize >= self.header.vocab) {
            return Err(QualityError::BadReference {
                path: self.path.display().to_string(),
                reason: format!("row token {t} outside the vocabulary"),
            });
        }
        Ok(f32::from_le_bytes(word(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> ReferenceHeader {
        ReferenceHeader {
            vocab: 10,
            ctx: 8,
            stride: 8,
            windows: 2,
            first_scored: 4,
            top_k: 3,
            name: "m".into(),
        }
    }

    fn write(path: &Path) {
        let tokens: Vec<u32> = (0..16).map(|i| i % 10).collect();
        let mut w = ReferenceWriter::create(path, &header(), &tokens).unwrap();
        for r in 0..6 {
            w.write_row(-(r as f32), &[(r, -0.1), (9, -2.0), (0, -3.0)]).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn rows_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ref.bin");
        write(&path);
        let mut r = ReferenceReader::open(&path).unwrap();
        assert_eq!((r.header.clone(), r.tokens[11], r.rows_per_window()), (header(), 1, 3));
        assert!(r.check_vocab(10).is_ok());
        let e = r.check_vocab(49_152).unwrap_err().to_string();
        assert!(e.contains("vocabulary of 10 tokens, this model 49152"), "{e}");
        let mut top = Vec::new();
        for row in 0..6u32 {
            assert_eq!(r.read_row(&mut top).unwrap(), -(row as f32));
            assert_eq!(top, vec![(row, -0.1), (9, -2.0), (0, -3.0)]);
        }
    }

    #[test]
    fn truncated_foreign_and_short_writes_are_errors_that_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ref.bin");
        write(&path);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let e = ReferenceReader::open(&path).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains(&format!("{} bytes", bytes.len() - 5)), "{e}");
        std::fs::write(&path, b"GGUF and then some bytes that are not ours at all, long enough").unwrap();
        assert!(ReferenceReader::open(&path).unwrap_err().to_string().contains("magic"));
        let mut w = ReferenceWriter::create(&path, &header(), &[0; 16]).unwrap();
        w.write_row(0.0, &[(1, 0.0), (2, 0.0), (3, 0.0)]).unwrap();
        assert!(w.write_row(0.0, &[(1, 0.0)]).is_err());
        assert!(w.finish().unwrap_err().to_string().contains("5 rows were never written"));
    }
}
