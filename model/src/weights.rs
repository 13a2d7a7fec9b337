//! Safetensors checkpoints (one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`), memory-mapped: bf16/f16 matrices stay in their format
//! (mapped, no copy), everything else is converted tensor by tensor to f32.
//!
//! A shard index is untrusted input: its file names must stay inside the model folder, and
//! its `weight_map` must agree with the tensors the shards actually hold.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use quant_kernels::quant::{GgmlType, Part, Storage, Weight};
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use crate::error::{ModelError, Result};
use crate::load_progress::{OnLoad, fault_in};

/// One memory-mapped shard.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    mmap: Arc<Mmap>,
}

/// All tensors of a checkpoint, readable by name.
#[derive(Debug)]
pub struct SafetensorsFiles {
    shards: Vec<Shard>,
    /// tensor name -> shard index
    index: HashMap<String, usize>,
    /// What to call the checkpoint in "missing tensor" errors.
    display_path: PathBuf,
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// `name` from a shard index as a path under `dir`, refused when it could leave the folder
/// (absolute, `..`, a drive prefix) or names nothing.
fn shard_path(dir: &Path, name: &str, index_path: &Path) -> Result<PathBuf> {
    let rel = Path::new(name);
    let plain = !name.is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(ModelError::BadSafetensors {
            path: index_path.to_path_buf(),
            reason: format!("shard name {name:?} must be a relative path inside the model folder"),
        });
    }
    Ok(dir.join(rel))
}

impl SafetensorsFiles {
    /// Opens `dir/model.safetensors`, or the shards named by `dir/model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| ModelError::io(&index_path, e))?;
            let idx: ShardIndex = serde_json::from_str(&text).map_err(|e| ModelError::BadSafetensors {
                path: index_path.clone(),
                reason: format!("invalid shard index: {e}"),
            })?;
            let names: BTreeSet<&String> = idx.weight_map.values().collect();
            let paths =
                names.iter().map(|f| shard_path(dir, f, &index_path)).collect::<Result<Vec<PathBuf>>>()?;
            let files = Self::open_files(&paths, index_path.clone())?;
            files.check_index(&idx.weight_map, &names.into_iter().collect::<Vec<_>>(), &index_path)?;
            Ok(files)
        } else {
            let path = dir.join("model.safetensors");
            Self::open_files(std::slice::from_ref(&path), path.clone())
        }
    }

    /// Opens the given shard files; `display_path` names the checkpoint in errors.
    pub fn open_files(paths: &[PathBuf], display_path: PathBuf) -> Result<Self> {
        let mut shards = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for path in paths {
            let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
            // SAFETY: the map is read-only; a checkpoint changing under a running
            // process is outside what we can defend against (the same holds for every
            // mmap-based loader).
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
            let st = SafeTensors::deserialize(&mmap)
                .map_err(|e| ModelError::BadSafetensors { path: path.clone(), reason: e.to_string() })?;
            for name in st.names() {
                if let Some(other) = index.insert(name.to_owned(), shards.len()) {
                    let other: &Shard = &shards[other];
                    return Err(ModelError::BadSafetensors {
                        path: path.clone(),
                        reason: format!("tensor `{name}` is also in {}", other.path.display()),
                    });
                }
            }
            shards.push(Shard { path: path.clone(), mmap: Arc::new(mmap) });
        }
        Ok(Self { shards, index, display_path })
    }

    /// Every tensor of the index is in the shard it names, and every tensor of the shards is
    /// in the index under its own shard (`shard_names[i]` is the index's name of shard `i`).
    fn check_index(
        &self,
        weight_map: &BTreeMap<String, String>,
        shard_names: &[&String],
        index_path: &Path,
    ) -> Result<()> {
        let bad = |reason: String| Err(ModelError::BadSafetensors { path: index_path.to_path_buf(), reason });
        for (tensor, file) in weight_map {
            match self.index.get(tensor) {
                Some(&i) if shard_names.get(i).is_some_and(|n| *n == file) => {}
                Some(&i) => {
                    return bad(format!(
                        "weight_map puts `{tensor}` in {file:?} but it is in {:?}",
                        shard_names.get(i).map_or("?", |n| n.as_str())
                    ));
                }
                None => return bad(format!("weight_map lists `{tensor}` but {file:?} does not hold it")),
            }
        }
        if let Some((tensor, &i)) = self.index.iter().find(|(t, _)| !weight_map.contains_key(*t)) {
            return bad(format!(
                "{:?} holds `{tensor}`, which weight_map does not list",
                shard_names.get(i).map_or("?", |n| n.as_str())
            ));
        }
        Ok(())
    }

    /// Brings every shard's bytes into memory now, reporting them to `on`
    /// ([`crate::load_progress`]).
    pub fn fault_in(&self, on: OnLoad<'_>) {
        let maps: Vec<&[u8]> = self.shards.iter().map(|s| &s.mmap[..]).collect();
        fault_in(&maps, on);
    }

    /// Every tensor name of the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Reads tensor `name`, checks its shape, and converts it to f32.
    pub fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.load_f32_concat(&[(name, shape)])
    }

    /// Reads several tensors into one buffer, one after the other (fused weights such as Q, K
    /// and V). Every part's shape is checked against the file's header before the buffer is
    /// allocated, so its size is bounded by data the checkpoint really holds, whatever a
    /// config claims.
    pub fn load_f32_concat(&self, parts: &[(&str, &[usize])]) -> Result<Vec<f32>> {
        let views = parts
            .iter()
            .map(|&(name, shape)| self.view_with_shape(name, shape))
            .collect::<Result<Vec<_>>>()?;
        let len = views.iter().map(|(_, v)| v.shape().iter().product::<usize>()).sum();
        let mut out = vec![0.0f32; len];
        let mut rest = out.as_mut_slice();
        for (&(name, _), (shard, view)) in parts.iter().zip(&views) {
            let (part, tail) = rest.split_at_mut(view.shape().iter().product());
            convert_to_f32(view.dtype(), view.data(), part).map_err(|dtype| {
                ModelError::UnsupportedDtype { path: shard.path.clone(), tensor: name.to_owned(), dtype }
            })?;
            rest = tail;
        }
        Ok(out)
    }

    /// A `[rows, cols]` matrix stacked from `parts` (name, rows) by rows, as [`Weight`]: bf16
    /// and f16 tensors stay in their format, mapped from the file; f32 (or an all-f32
    /// matrix) becomes one f32 buffer.
    pub fn load_weight(&self, parts: &[(&str, usize)], cols: usize) -> Result<Weight> {
        let shapes: Vec<[usize; 2]> = parts.iter().map(|&(_, rows)| [rows, cols]).collect();
        let views = parts
            .iter()
            .zip(&shapes)
            .map(|(&(name, _), shape)| self.view_with_shape(name, shape))
            .collect::<Result<Vec<_>>>()?;
        if views.iter().all(|(_, v)| !matches!(v.dtype(), Dtype::BF16 | Dtype::F16)) {
            let named: Vec<(&str, &[usize])> =
                parts.iter().zip(&shapes).map(|(&(n, _), s)| (n, &s[..])).collect();
            let rows = parts.iter().map(|p| p.1).sum();
            return Ok(Weight::from_f32(rows, cols, self.load_f32_concat(&named)?));
        }
        let mut out = Vec::with_capacity(parts.len());
        for (&(name, rows), (shard, view)) in parts.iter().zip(&views) {
            let ty = match view.dtype() {
                Dtype::BF16 => GgmlType::BF16,
                Dtype::F16 => GgmlType::F16,
                _ => {
                    out.push(
                        Part::new(
                            GgmlType::F32,
                            rows,
                            cols,
                            Storage::F32(self.load_f32(name, &[rows, cols])?),
                        )
                        .map_err(|reason| ModelError::BadSafetensors { path: shard.path.clone(), reason })?,
                    );
                    continue;
                }
            };
            // The view's bytes lie inside the shard's mapping: share it.
            let start = view.data().as_ptr() as usize - shard.mmap.as_ptr() as usize;
            let storage = Storage::mapped(Arc::clone(&shard.mmap), start..start + view.data().len())
                .ok_or_else(|| ModelError::BadSafetensors {
                    path: shard.path.clone(),
                    reason: format!("tensor `{name}` outside the file"),
                })?;
            let part = Part::new(ty, rows, cols, storage).map_err(|reason| ModelError::BadSafetensors {
                path: shard.path.clone(),
                reason: format!("tensor `{name}`: {reason}"),
            })?;
            out.push(part);
        }
        Ok(Weight::from_parts(cols, out))
    }

    /// Tensor `name` and its shard, when it has exactly `shape`.
    fn view_with_shape(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<(&Shard, safetensors::tensor::TensorView<'_>)> {
        let shard_idx = *self.index.get(name).ok_or_else(|| ModelError::MissingTensor {
            path: self.display_path.clone(),
            tensor: name.to_owned(),
        })?;
        let shard = &self.shards[shard_idx];
        let st = SafeTensors::deserialize(&shard.mmap)
            .map_err(|e| ModelError::BadSafetensors { path: shard.path.clone(), reason: e.to_string() })?;
        let view = st
            .tensor(name)
            .map_err(|_| ModelError::MissingTensor { path: shard.path.clone(), tensor: name.to_owned() })?;
        if view.shape() != shape {
            return Err(ModelError::WrongShape {
                path: shard.path.clone(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        Ok((shard, view))
    }
}

/// Converts little-endian bf16/f16/f32 bytes to f32 (in parallel chunks: this runs once per
/// weight at load, over hundreds of MB).
fn convert_to_f32(dtype: Dtype, bytes: &[u8], out: &mut [f32]) -> std::result::Result<(), String> {
    const CHUNK: usize = 1 << 16;
    match dtype {
        Dtype::F32 => out.par_chunks_mut(CHUNK).zip(bytes.par_chunks(CHUNK * 4)).for_each(|(o, b)| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(4)) {
                *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }),
        Dtype::BF16 => out.par_chunks_mut(CHUNK).zip(bytes.par_chunks(CHUNK * 2)).for_each(|(o, b)| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(2)) {
                *v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }),
        Dtype::F16 => out.par_chunks_mut(CHUNK).zip(bytes.par_chunks(CHUNK * 2)).for_each(|(o, b)| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(2)) {
                *v = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }),
        other => return Err(format!("{other:?}")),
    }
    Ok(())
}
