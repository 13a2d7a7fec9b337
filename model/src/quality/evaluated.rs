//! The evaluated-rows file: another implementation's run over a reference file's windows (the
//! llama.cpp script beside the peer bench writes one), holding per row only what the comparison
//! needs, so that a 262 144-token vocabulary need not be written out. Little endian:
//!
//! ```text
//! magic "PLLMQEVL", version u32 (1)
//! the reference's vocab u32, ctx u32, windows u32, first_scored u32, top_k u32
//! name_len u32, name (UTF-8: what made it)
//! rows: per window, ctx − 1 − first_scored rows of
//!       next f32 (log-probability of the text's next token), top u32 (the most likely token),
//!       top_k × f32 (log-probabilities of the reference row's top tokens, in its order)
//! ```

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::file::{bad_file, check_len, open_headed};
use super::{QualityError, ReferenceHeader, ReferenceReader, RowComparison, Tally};

const MAGIC: &[u8; 8] = b"PLLMQEVL";
const VERSION: u32 = 1;
const MAX_NAME: usize = 4096;

/// One evaluated row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvaluatedRow {
    pub next: f32,
    pub top: u32,
    /// Log-probabilities of the reference row's top tokens, in its order.
    pub at_reference_tops: Vec<f32>,
}

/// Reads an evaluated-rows file made over `reference`'s windows.
#[derive(Debug)]
pub struct EvaluatedReader {
    pub name: String,
    input: BufReader<File>,
    path: PathBuf,
    top_k: usize,
    vocab: usize,
    buf: Vec<u8>,
}

impl EvaluatedReader {
    /// Opens `path`, checking that it was made over the windows `reference` describes and that
    /// its length holds every row.
    pub fn open(path: &Path, reference: &ReferenceHeader) -> Result<Self, QualityError> {
        let bad = bad_file(path);
        let (mut input, len, [_, vocab, ctx, windows, first, top_k, name_len]) =
            open_headed::<7>(path, MAGIC, VERSION, "an evaluated-rows file")?;
        let theirs = (vocab, ctx, windows, first, top_k);
        let ours =
            (reference.vocab, reference.ctx, reference.windows, reference.first_scored, reference.top_k);
        if theirs != ours {
            return Err(QualityError::Mismatch(format!(
                "{} was made over (vocab, ctx, windows, first scored row, top k) = {theirs:?}, the reference has {ours:?}",
                path.display()
            )));
        }
        if name_len > MAX_NAME {
            return Err(bad(format!("a name of {name_len} bytes")));
        }
        let mut name = vec![0u8; name_len];
        input.read_exact(&mut name).map_err(|_| bad("truncated in its header".into()))?;
        let rows = windows as u64 * ctx.saturating_sub(first + 1) as u64;
        let want = (8 + 4 * 7 + name_len) as u64 + rows * (8 + 4 * top_k as u64);
        check_len(path, len, want)?;
        let name = String::from_utf8(name).map_err(|_| bad("the name is not UTF-8".into()))?;
        Ok(Self { name, input, path: path.to_owned(), top_k, vocab, buf: Vec::new() })
    }

    /// The next row into `row`.
    pub fn read_row(&mut self, row: &mut EvaluatedRow) -> Result<(), QualityError> {
        self.buf.resize(8 + 4 * self.top_k, 0);
        self.input
            .read_exact(&mut self.buf)
            .map_err(|source| QualityError::Io { path: self.path.display().to_string(), source })?;
        let word = |i: usize| [self.buf[i], self.buf[i + 1], self.buf[i + 2], self.buf[i + 3]];
        row.next = f32::from_le_bytes(word(0));
        row.top = u32::from_le_bytes(word(4));
        if row.top as usize >= self.vocab {
            return Err(QualityError::BadReference {
                path: self.path.display().to_string(),
                reason: format!("most likely token {} outside the vocabulary", row.top),
            });
        }
        row.at_reference_tops.clear();
        row.at_reference_tops.extend((0..self.top_k).map(|k| f32::from_le_bytes(word(8 + 4 * k))));
        Ok(())
    }
}

/// Every row of `evaluated` against `reference`'s, in order: the evaluated run's tally.
pub fn compare_evaluated(
    reference: &mut ReferenceReader,
    evaluated: &mut EvaluatedReader,
) -> Result<Tally, QualityError> {
    let (mut tally, mut top, mut row) = (Tally::default(), Vec::new(), EvaluatedRow::default());
    for _ in 0..reference.header.windows * reference.rows_per_window() {
        let reference_next = reference.read_row(&mut top)?;
        evaluated.read_row(&mut row)?;
        tally.add(row.next);
        let c = RowComparison::from_parts(
            row.at_reference_tops.iter().copied(),
            row.top,
            row.next,
            &top,
            reference_next,
        );
        tally.add_comparison(c, reference_next);
    }
    Ok(tally)
}

/// The bytes of an evaluated-rows file's header (for writers and tests).
pub fn evaluated_header(reference: &ReferenceHeader, name: &str) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    let fields = [
        VERSION as usize,
        reference.vocab,
        reference.ctx,
        reference.windows,
        reference.first_scored,
        reference.top_k,
        name.len(),
    ];
    for v in fields {
        bytes.extend_from_slice(&(v as u32).to_le_bytes());
    }
    bytes.extend_from_slice(name.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> ReferenceHeader {
        ReferenceHeader {
            vocab: 10,
            ctx: 8,
            stride: 8,
            windows: 1,
            first_scored: 4,
            top_k: 2,
            name: "r".into(),
        }
    }

    #[test]
    fn rows_read_back_and_other_windows_or_short_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval.bin");
        let mut bytes = evaluated_header(&reference(), "llama.cpp");
        for r in 0..3u32 {
            bytes.extend_from_slice(&(-1.5f32).to_le_bytes());
            bytes.extend_from_slice(&r.to_le_bytes());
            bytes.extend_from_slice(&(-0.5f32).to_le_bytes());
            bytes.extend_from_slice(&(-2.0f32).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let mut r = EvaluatedReader::open(&path, &reference()).unwrap();
        assert_eq!(r.name, "llama.cpp");
        let mut row = EvaluatedRow::default();
        for t in 0..3 {
            r.read_row(&mut row).unwrap();
            assert_eq!(row, EvaluatedRow { next: -1.5, top: t, at_reference_tops: vec![-0.5, -2.0] });
        }
        let other = ReferenceHeader { windows: 2, ..reference() };
        assert!(matches!(EvaluatedReader::open(&path, &other), Err(QualityError::Mismatch(_))));
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(EvaluatedReader::open(&path, &reference()).unwrap_err().to_string().contains("truncated"));
    }
}
