//! A GGUF (v2/v3) reader: header, metadata key/values and tensor directory, over a
//! memory-mapped file (for a model's weights, a copy in huge pages where the kernel offers
//! them: [`GgufFile::open_for_weights`]). Every offset and length is checked against the file
//! size, so a truncated download is an error, not a panic.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use quant_kernels::ggml::{GgmlType, dequantize};
use quant_kernels::quant::Storage;

use crate::error::{ModelError, Result};
use crate::load_progress::{LoadProgress, OnLoad, REPORT_EVERY, fault_in};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor of the directory.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the fastest-varying (the row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    /// Row-major (PyTorch order) shape: the GGUF dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An opened GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    mmap: Arc<Mmap>,
}

/// Whether the kernel backs anonymous memory advised `MADV_HUGEPAGE` with huge pages.
fn huge_pages_offered() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|mode| mode.contains("[always]") || mode.contains("[madvise]"))
}

/// The first `len` bytes of the file at `path` in an anonymous mapping advised for huge
/// pages (its length rounded up to whole 2 MiB pages, so the kernel aligns it to one).
fn read_into_huge_pages(path: &Path, len: usize, on: OnLoad<'_>) -> std::io::Result<Mmap> {
    use std::io::Read;
    const HUGE_PAGE: usize = 2 << 20;
    let mut file = File::open(path)?;
    if file.metadata()?.len() != len as u64 {
        return Err(std::io::Error::other("the file changed size while it was being opened"));
    }
    let mut anon = memmap2::MmapMut::map_anon(len.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE)?;
    // A hint: without it the copy still works, on small pages.
    let _ = anon.advise(memmap2::Advice::HugePage);
    let total = len as u64;
    on(LoadProgress::Bytes { done: 0, total });
    let mut done = 0;
    for chunk in anon[..len].chunks_mut(REPORT_EVERY) {
        file.read_exact(chunk)?;
        done += chunk.len() as u64;
        on(LoadProgress::Bytes { done, total });
    }
    anon.make_read_only()
}

/// Bounds-checked little-endian cursor.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            ModelError::gguf(self.path, format!("truncated: needs {n} bytes at offset {}", self.pos))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n).ok().filter(|&n| n <= self.buf.len()).ok_or_else(|| {
            ModelError::gguf(self.path, format!("length {n} at offset {} exceeds the file", self.pos))
        })
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            ModelError::gguf(self.path, format!("invalid UTF-8 string at offset {}", self.pos - n))
        })
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.array()?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => GgufValue::Bool(self.take(1)?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 if depth == 0 => {
                let elem_ty = self.u32()?;
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem_ty, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(ModelError::gguf(self.path, format!("unknown metadata value type {other}")));
            }
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        Self::parse(path, true)
    }

    /// The header and metadata only (`tensors` left empty): a file's vocabulary and
    /// hyperparameters, whatever ggml types its tensors use.
    pub fn open_metadata(path: &Path) -> Result<Self> {
        Self::parse(path, false)
    }

    fn parse(path: &Path, with_tensors: bool) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: read-only map of a file we just opened; we only read it.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let mut c = Cursor { buf: &mmap, pos: 0, path };
        if c.take(4)? != b"GGUF" {
            return Err(ModelError::gguf(path, "bad magic (not a GGUF file)"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::gguf(path, format!("unsupported GGUF version {version}")));
        }
        let n_tensors = c.len()?;
        let n_kv = c.len()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let value = c.value(ty, 0)?;
            metadata.insert(key, value);
        }
        if !with_tensors {
            return Ok(Self {
                path: path.to_path_buf(),
                version,
                metadata,
                tensors: Vec::new(),
                mmap: Arc::new(mmap),
            });
        }
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()? as usize;
            if n_dims > 4 {
                return Err(ModelError::gguf(path, format!("tensor `{name}` has {n_dims} dims")));
            }
            let dims = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
            let ty = c.u32()?;
            let offset = c.u64()?;
            raw.push((name, dims, ty, offset));
        }
        let alignment = metadata.get("general.alignment").and_then(GgufValue::as_u64).unwrap_or(32) as usize;
        if alignment == 0 {
            return Err(ModelError::gguf(path, "general.alignment is 0"));
        }
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ty, offset) in raw {
            let ggml_type = GgmlType::from_id(ty).ok_or_else(|| {
                let kind = ggml_type_name(ty).unwrap_or("unknown");
                ModelError::gguf(path, format!("tensor `{name}`: ggml type {kind} ({ty}) is not supported"))
            })?;
            let n_elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let n_bytes = n_elements.and_then(|n| ggml_type.n_bytes(n as usize, dims.first().copied()));
            let n_bytes = n_bytes.ok_or_else(|| {
                ModelError::gguf(
                    path,
                    format!("tensor `{name}`: dims {dims:?} do not fit type {ggml_type:?}"),
                )
            })?;
            let start = data_start.checked_add(offset as usize);
            match start.and_then(|s| s.checked_add(n_bytes)) {
                Some(end) if end <= mmap.len() => {}
                _ => {
                    return Err(ModelError::gguf(
                        path,
                        format!(
                            "truncated: tensor `{name}` needs bytes up to {} but the file has {}",
                            data_start as u64 + offset + n_bytes as u64,
                            mmap.len()
                        ),
                    ));
                }
            }
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset: data_start + offset as usize,
                n_bytes,
            });
        }
        Ok(Self { path: path.to_path_buf(), version, metadata, tensors, mmap: Arc::new(mmap) })
    }

    /// [`Self::open`] for a model's weights, every byte in memory before it returns, reported to
    /// `on`: read into anonymous memory that the kernel backs with transparent huge pages where
    /// it offers them (Linux with THP `always` or `madvise`), else the file's mapping faulted in.
    /// A batch-1 decode step walks every weight, and on 4 KiB pages nearly every page of them
    /// misses the TLB (the page-ahead prefetches walk into pages it does not hold); on 2 MiB
    /// pages few do. The copy is read with `read`, not through the file's mapping, so the
    /// resident set holds one copy.
    pub fn open_for_weights(path: &Path, on: OnLoad<'_>) -> Result<Self> {
        let mut g = Self::open(path)?;
        if huge_pages_offered() {
            let copy = read_into_huge_pages(path, g.mmap.len(), on).map_err(|e| ModelError::io(path, e))?;
            g.mmap = Arc::new(copy);
        } else {
            fault_in(&[&g.mmap], on);
        }
        Ok(g)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw (possibly quantized) bytes of a tensor; bounds were checked at open.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.mmap[info.offset..info.offset + info.n_bytes]
    }

    /// A tensor's bytes as weight storage sharing this file's mapping (no copy).
    pub fn tensor_storage(&self, info: &GgufTensorInfo) -> Storage {
        Storage::Mapped { map: Arc::clone(&self.mmap), range: info.offset..info.offset + info.n_bytes }
    }

    /// A tensor dequantized to f32 (norm weights, small tensors).
    pub fn tensor_f32(&self, info: &GgufTensorInfo) -> Vec<f32> {
        let mut out = vec![0.0; info.n_elements()];
        dequantize(info.ggml_type, self.tensor_bytes(info), &mut out);
        out
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get(key)
            .and_then(GgufValue::as_u64)
            .ok_or_else(|| ModelError::gguf(&self.path, format!("missing or non-integer metadata `{key}`")))
    }

    pub fn require_f64(&self, key: &str) -> Result<f64> {
        self.get(key)
            .and_then(GgufValue::as_f64)
            .ok_or_else(|| ModelError::gguf(&self.path, format!("missing or non-numeric metadata `{key}`")))
    }

    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get(key)
            .and_then(GgufValue::as_str)
            .ok_or_else(|| ModelError::gguf(&self.path, format!("missing or non-string metadata `{key}`")))
    }
}

/// ggml's name of type id `id` (for errors about types this engine has no kernels for).
fn ggml_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
        "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
        "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    match id {
        34 => Some("TQ1_0"),
        35 => Some("TQ2_0"),
        _ => NAMES.get(id as usize).copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A minimal GGUF v3: two metadata keys and one 2×32 Q8_0 tensor.
    fn tiny_gguf() -> Vec<u8> {
        let mut data = Vec::new();
        for row in 0..2i8 {
            data.extend(half::f16::from_f32(0.5).to_le_bytes());
            data.extend((0..32i8).map(|q| (q - 16 + row) as u8));
        }
        gguf_of(&[("token_embd.weight", &[32, 2], 8, data)])
    }

    /// A GGUF v3 with two metadata keys and `tensors` (name, dims, ggml type id, bytes), each
    /// tensor's bytes at the next 32-byte boundary of the data section.
    fn gguf_of(tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.merges");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a b");
        string(&mut b, "ab c");
        let mut offset = 0u64;
        for (name, dims, ty, data) in tensors {
            string(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset = (offset + data.len() as u64).div_ceil(32) * 32;
        }
        for (_, _, _, data) in tensors {
            b.resize(b.len().div_ceil(32) * 32, 0);
            b.extend(data);
        }
        b
    }

    /// GGUF type ids 6, 7 and 13 are Q5_0, Q5_1 and Q5_K: read with their block sizes (a
    /// wrong size would misplace or refuse the tensors after the first) and dequantized.
    #[test]
    fn five_bit_tensors_are_read_with_their_types() {
        // Q5_0: d = 1, fifth bits 0, nibbles 0 → every value −16; Q5_1: d = 1, m = 2, all
        // fifth bits set, nibbles 0 → every value 18; Q5_K: a zero super-block.
        let q5_0 = [half::f16::from_f32(1.0).to_le_bytes().as_slice(), &[0; 20]].concat().repeat(2);
        let q5_1 = [
            half::f16::from_f32(1.0).to_le_bytes().as_slice(),
            &half::f16::from_f32(2.0).to_le_bytes(),
            &[0xff; 4],
            &[0; 16],
        ]
        .concat();
        let tensors: [(&str, &[u64], u32, Vec<u8>); 3] =
            [("a", &[32, 2], 6, q5_0), ("b", &[32], 7, q5_1), ("c", &[256], 13, vec![0; 176])];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, gguf_of(&tensors)).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let want = [(GgmlType::Q5_0, 44, -16.0), (GgmlType::Q5_1, 24, 18.0), (GgmlType::Q5_K, 176, 0.0)];
        for ((name, ..), (ty, n_bytes, value)) in tensors.iter().zip(want) {
            let t = g.tensor(name).unwrap();
            assert_eq!((t.ggml_type, t.n_bytes), (ty, n_bytes), "tensor {name}");
            assert!(g.tensor_f32(t).iter().all(|&v| v == value), "tensor {name}");
        }
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, tiny_gguf()).unwrap();
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.require_str("general.architecture").unwrap(), "llama");
        let header = GgufFile::open_metadata(&path).unwrap();
        assert_eq!((header.metadata, header.tensors.len()), (g.metadata.clone(), 0));
        let merges = g.get("tokenizer.ggml.merges").and_then(GgufValue::as_array).unwrap();
        assert_eq!(merges[1].as_str(), Some("ab c"));
        let t = g.tensor("token_embd.weight").unwrap();
        assert_eq!(t.shape(), vec![2, 32]);
        let mut out = vec![0.0; 64];
        dequantize(t.ggml_type, g.tensor_bytes(t), &mut out);
        assert_eq!(out[0], -8.0);
        assert_eq!(out[32 + 31], 8.0);
    }

    #[test]
    fn weights_opened_into_huge_pages_hold_the_file_s_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, tiny_gguf()).unwrap();
        let (mapped, resident) = (
            GgufFile::open(&path).unwrap(),
            GgufFile::open_for_weights(&path, &mut crate::load_progress::unwatched).unwrap(),
        );
        assert_eq!(mapped.tensors.len(), resident.tensors.len());
        for t in &mapped.tensors {
            assert_eq!(mapped.tensor_bytes(t), resident.tensor_bytes(t));
            assert_eq!(resident.tensor_storage(t).bytes(), mapped.tensor_bytes(t));
        }
        // Where the kernel offers huge pages the copy is anonymous memory, padded to whole
        // 2 MiB pages; elsewhere it is the file's own mapping.
        let expect_copy = huge_pages_offered();
        assert_eq!(resident.mmap.len() % (2 << 20) == 0, expect_copy, "{} bytes", resident.mmap.len());
    }

    #[test]
    fn truncated_and_foreign_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let bytes = tiny_gguf();
        for cut in [10, 60, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = GgufFile::open(&path).unwrap_err().to_string();
            assert!(err.contains("m.gguf") && err.contains("truncated"), "cut {cut}: {err}");
        }
        std::fs::write(&path, b"PK\x03\x04 not a gguf").unwrap();
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert!(err.contains("not a GGUF file"), "{err}");
    }
}
