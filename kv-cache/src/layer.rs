//! One layer's key and value tensors in vLLM's paged layout, and index math over them.

use half::{bf16, f16};

use crate::{CacheElem, CacheError, DType};

/// Shape of one layer's cache tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheGeometry {
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub block_size: usize,
    pub dtype: DType,
}

impl CacheGeometry {
    /// Innermost key dimension: elements per 16 bytes.
    pub const fn x(&self) -> usize {
        self.dtype.x()
    }

    /// Elements of one (block, kv head) tile, in either tensor: `head_size * block_size`.
    pub const fn block_head_elems(&self) -> usize {
        self.head_size * self.block_size
    }

    /// Elements of one block (all kv heads), in either tensor; blocks are contiguous runs of this.
    pub const fn block_elems(&self) -> usize {
        self.num_kv_heads * self.block_head_elems()
    }

    /// Tokens the layer holds.
    pub const fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Elements of each tensor.
    pub const fn tensor_elems(&self) -> usize {
        self.num_blocks * self.block_elems()
    }

    /// Index into the key tensor `[num_blocks, kv_heads, head_size/x, block_size, x]`.
    #[inline]
    pub const fn key_index(&self, slot: usize, kv_head: usize, d: usize) -> usize {
        let (block, offset) = (slot / self.block_size, slot % self.block_size);
        let x = self.x();
        (block * self.num_kv_heads + kv_head) * self.block_head_elems()
            + (d / x) * self.block_size * x
            + offset * x
            + d % x
    }

    /// Index into the value tensor `[num_blocks, kv_heads, head_size, block_size]`.
    #[inline]
    pub const fn value_index(&self, slot: usize, kv_head: usize, d: usize) -> usize {
        let (block, offset) = (slot / self.block_size, slot % self.block_size);
        (block * self.num_kv_heads + kv_head) * self.block_head_elems() + d * self.block_size + offset
    }

    /// Key scales of one token in one kv head (int8: one per group of dims; else 0).
    pub const fn key_scales(&self) -> usize {
        self.dtype.key_scales(self.head_size)
    }

    /// Index into the key scales `[num_blocks, kv_heads, key_scales, block_size]` (int8): the
    /// scale of dims `group · key_group ..` of the token at `slot`.
    #[inline]
    pub const fn key_scale_index(&self, slot: usize, kv_head: usize, group: usize) -> usize {
        let (block, offset) = (slot / self.block_size, slot % self.block_size);
        ((block * self.num_kv_heads + kv_head) * self.key_scales() + group) * self.block_size + offset
    }

    /// Index into the value scales `[num_blocks, kv_heads, block_size]` (int8).
    #[inline]
    pub const fn value_scale_index(&self, slot: usize, kv_head: usize) -> usize {
        let (block, offset) = (slot / self.block_size, slot % self.block_size);
        (block * self.num_kv_heads + kv_head) * self.block_size + offset
    }

    /// Same tile shape (everything but the number of blocks): blocks can be copied between the two.
    pub fn same_block_layout(&self, other: &CacheGeometry) -> bool {
        self.num_kv_heads == other.num_kv_heads
            && self.head_size == other.head_size
            && self.block_size == other.block_size
            && self.dtype == other.dtype
    }
}

/// Typed storage; private so a device variant can be added without touching users.
/// 16-bit types are kept as raw `u16` bits so that allocation is a zeroed `calloc` (untouched
/// pages, see [`crate::huge_pages`]); views cast them to `f16`/`bf16`. int8 keeps its bf16
/// scales beside the codes (indexed by [`CacheGeometry::key_scale_index`] and
/// [`CacheGeometry::value_scale_index`]).
#[derive(Debug)]
pub(crate) enum Storage {
    F32 { key: Vec<f32>, value: Vec<f32> },
    F16 { key: Vec<u16>, value: Vec<u16> },
    BF16 { key: Vec<u16>, value: Vec<u16> },
    Int8 { key: Vec<i8>, value: Vec<i8>, key_scale: Vec<u16>, value_scale: Vec<u16> },
}

impl Storage {
    /// Every tensor as bytes with its bytes per block: key, value, then int8's two scale
    /// tensors. A block is one contiguous run of each, so moving a block moves these runs.
    pub(crate) fn byte_tensors(&self, g: &CacheGeometry) -> [(&[u8], usize); 4] {
        let [elems, key_scales, value_scales] = block_bytes(g);
        match self {
            Storage::F32 { key, value } => {
                [(bytemuck::cast_slice(key), elems), (bytemuck::cast_slice(value), elems), (&[], 0), (&[], 0)]
            }
            Storage::F16 { key, value } | Storage::BF16 { key, value } => {
                [(bytemuck::cast_slice(key), elems), (bytemuck::cast_slice(value), elems), (&[], 0), (&[], 0)]
            }
            Storage::Int8 { key, value, key_scale, value_scale } => [
                (bytemuck::cast_slice(key), elems),
                (bytemuck::cast_slice(value), elems),
                (bytemuck::cast_slice(key_scale), key_scales),
                (bytemuck::cast_slice(value_scale), value_scales),
            ],
        }
    }

    /// [`Storage::byte_tensors`], mutably.
    pub(crate) fn byte_tensors_mut(&mut self, g: &CacheGeometry) -> [(&mut [u8], usize); 4] {
        let [elems, key_scales, value_scales] = block_bytes(g);
        match self {
            Storage::F32 { key, value } => [
                (bytemuck::cast_slice_mut(key), elems),
                (bytemuck::cast_slice_mut(value), elems),
                (&mut [], 0),
                (&mut [], 0),
            ],
            Storage::F16 { key, value } | Storage::BF16 { key, value } => [
                (bytemuck::cast_slice_mut(key), elems),
                (bytemuck::cast_slice_mut(value), elems),
                (&mut [], 0),
                (&mut [], 0),
            ],
            Storage::Int8 { key, value, key_scale, value_scale } => [
                (bytemuck::cast_slice_mut(key), elems),
                (bytemuck::cast_slice_mut(value), elems),
                (bytemuck::cast_slice_mut(key_scale), key_scales),
                (bytemuck::cast_slice_mut(value_scale), value_scales),
            ],
        }
    }
}

/// Bytes of one block in the code tensors (key or value), the key scales and the value scales.
fn block_bytes(g: &CacheGeometry) -> [usize; 3] {
    let value_scales = g.num_kv_heads * g.block_size * g.dtype.scale_bytes();
    [g.block_elems() * g.dtype.size_in_bytes(), value_scales * g.key_scales(), value_scales]
}

/// A zeroed tensor of `n` elements, advised to use huge pages before anything touches it.
fn zeroed<T: Copy + Default + bytemuck::Zeroable>(n: usize) -> Vec<T> {
    // `vec![0; n]` of a primitive is `alloc_zeroed`: fresh pages, not written yet.
    let mut v: Vec<T> = vec![T::default(); n];
    crate::huge_pages::advise(&mut v);
    v
}

/// Borrowed key and value tensors of one layer, by dtype (what kernels dispatch on); int8's
/// codes with their scales, at [`CacheGeometry::key_scale_index`] and
/// [`CacheGeometry::value_scale_index`].
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheSlices<'a> {
    F32 { key: &'a [f32], value: &'a [f32] },
    F16 { key: &'a [f16], value: &'a [f16] },
    BF16 { key: &'a [bf16], value: &'a [bf16] },
    Int8 { key: &'a [i8], value: &'a [i8], key_scale: &'a [bf16], value_scale: &'a [bf16] },
}

/// Mutably borrowed key and value tensors of one layer, by dtype.
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheSlicesMut<'a> {
    F32 { key: &'a mut [f32], value: &'a mut [f32] },
    F16 { key: &'a mut [f16], value: &'a mut [f16] },
    BF16 { key: &'a mut [bf16], value: &'a mut [bf16] },
    Int8 { key: &'a mut [i8], value: &'a mut [i8], key_scale: &'a mut [bf16], value_scale: &'a mut [bf16] },
}

/// One layer's key and value cache, allocated once at its full size.
#[derive(Debug)]
pub struct LayerCache {
    pub(crate) geometry: CacheGeometry,
    pub(crate) storage: Storage,
}

impl LayerCache {
    /// Allocates zeroed key and value tensors for `geometry`.
    pub fn new(geometry: CacheGeometry) -> Result<Self, CacheError> {
        let g = geometry;
        let bytes =
            g.num_slots() as u128 * g.num_kv_heads as u128 * g.dtype.kv_bytes_per_head(g.head_size) as u128;
        let scales = g.num_blocks.checked_mul(g.num_kv_heads).and_then(|n| n.checked_mul(g.block_size));
        let elems = scales
            .and_then(|n| n.checked_mul(g.head_size))
            .filter(|_| bytes <= isize::MAX as u128)
            .ok_or(CacheError::TooLarge { bytes })?;
        // Within `bytes`, checked above.
        let scales = scales.unwrap_or(0);
        let storage = match geometry.dtype {
            DType::F32 => Storage::F32 { key: zeroed(elems), value: zeroed(elems) },
            DType::F16 => Storage::F16 { key: zeroed(elems), value: zeroed(elems) },
            DType::BF16 => Storage::BF16 { key: zeroed(elems), value: zeroed(elems) },
            DType::Int8 => Storage::Int8 {
                key: zeroed(elems),
                value: zeroed(elems),
                key_scale: zeroed(scales * g.key_scales()),
                value_scale: zeroed(scales),
            },
            DType::Fp8E4M3 | DType::Fp8E5M2 => return Err(CacheError::UnsupportedDtype(g.dtype)),
        };
        Ok(LayerCache { geometry, storage })
    }

    pub fn geometry(&self) -> &CacheGeometry {
        &self.geometry
    }
    pub fn dtype(&self) -> DType {
        self.geometry.dtype
    }
    pub fn num_blocks(&self) -> usize {
        self.geometry.num_blocks
    }
    pub fn block_size(&self) -> usize {
        self.geometry.block_size
    }
    pub fn num_kv_heads(&self) -> usize {
        self.geometry.num_kv_heads
    }
    pub fn head_size(&self) -> usize {
        self.geometry.head_size
    }

    /// Both tensors, by dtype.
    pub fn slices(&self) -> CacheSlices<'_> {
        match &self.storage {
            Storage::F32 { key, value } => CacheSlices::F32 { key, value },
            Storage::F16 { key, value } => {
                CacheSlices::F16 { key: bytemuck::cast_slice(key), value: bytemuck::cast_slice(value) }
            }
            Storage::BF16 { key, value } => {
                CacheSlices::BF16 { key: bytemuck::cast_slice(key), value: bytemuck::cast_slice(value) }
            }
            Storage::Int8 { key, value, key_scale, value_scale } => CacheSlices::Int8 {
                key,
                value,
                key_scale: bytemuck::cast_slice(key_scale),
                value_scale: bytemuck::cast_slice(value_scale),
            },
        }
    }

    /// Both tensors, mutably, by dtype.
    pub fn slices_mut(&mut self) -> CacheSlicesMut<'_> {
        match &mut self.storage {
            Storage::F32 { key, value } => CacheSlicesMut::F32 { key, value },
            Storage::F16 { key, value } => CacheSlicesMut::F16 {
                key: bytemuck::cast_slice_mut(key),
                value: bytemuck::cast_slice_mut(value),
            },
            Storage::BF16 { key, value } => CacheSlicesMut::BF16 {
                key: bytemuck::cast_slice_mut(key),
                value: bytemuck::cast_slice_mut(value),
            },
            Storage::Int8 { key, value, key_scale, value_scale } => CacheSlicesMut::Int8 {
                key,
                value,
                key_scale: bytemuck::cast_slice_mut(key_scale),
                value_scale: bytemuck::cast_slice_mut(value_scale),
            },
        }
    }

    /// `(key, value)` as `T` (int8: the codes), or `None` when the cache holds another dtype.
    pub fn typed<T: CacheElem>(&self) -> Option<(&[T], &[T])> {
        let [(k, _), (v, _), ..] = self.storage.byte_tensors(&self.geometry);
        (T::DTYPE == self.geometry.dtype).then(|| (bytemuck::cast_slice(k), bytemuck::cast_slice(v)))
    }

    /// `(key, value)` as mutable `T`, or `None` when the cache holds another dtype.
    pub fn typed_mut<T: CacheElem>(&mut self) -> Option<(&mut [T], &mut [T])> {
        if T::DTYPE != self.geometry.dtype {
            return None;
        }
        let [(k, _), (v, _), ..] = self.storage.byte_tensors_mut(&self.geometry);
        Some((bytemuck::cast_slice_mut(k), bytemuck::cast_slice_mut(v)))
    }

    /// Sets every element of both tensors (tests poison unused slots with NaN this way; int8
    /// holds `v` as code 127 (0 for 0) and scale `v / 127`, so NaN poisons the scales).
    pub fn fill(&mut self, v: f32) {
        match &mut self.storage {
            Storage::F32 { key, value } => {
                key.fill(v);
                value.fill(v);
            }
            Storage::F16 { key, value } => {
                key.fill(f16::from_f32(v).to_bits());
                value.fill(f16::from_f32(v).to_bits());
            }
            Storage::BF16 { key, value } => {
                key.fill(bf16::from_f32(v).to_bits());
                value.fill(bf16::from_f32(v).to_bits());
            }
            Storage::Int8 { key, value, key_scale, value_scale } => {
                let code = if v == 0.0 { 0 } else { crate::int8::MAX_CODE as i8 };
                key.fill(code);
                value.fill(code);
                key_scale.fill(bf16::from_f32(v / crate::int8::MAX_CODE).to_bits());
                value_scale.fill(bf16::from_f32(v / crate::int8::MAX_CODE).to_bits());
            }
        }
    }

    fn check_slot(&self, slot: usize, kv_head: usize) -> Result<(), CacheError> {
        if slot >= self.geometry.num_slots() {
            return Err(CacheError::SlotOutOfRange { slot, num_slots: self.geometry.num_slots() });
        }
        if kv_head >= self.geometry.num_kv_heads {
            return Err(CacheError::KvHeadOutOfRange { kv_head, num_kv_heads: self.geometry.num_kv_heads });
        }
        Ok(())
    }

    /// One token's key for one kv head, as `f32` (`head_size` values; int8: code · scale).
    pub fn read_key(&self, slot: usize, kv_head: usize) -> Result<Vec<f32>, CacheError> {
        self.check_slot(slot, kv_head)?;
        let g = self.geometry;
        let scale = |d: usize| match &self.storage {
            Storage::Int8 { key_scale, .. } => {
                let group = d / crate::int8::key_group(g.head_size);
                bf16::from_bits(key_scale[g.key_scale_index(slot, kv_head, group)]).to_f32()
            }
            _ => 1.0,
        };
        Ok((0..g.head_size).map(|d| self.key_at(g.key_index(slot, kv_head, d)) * scale(d)).collect())
    }

    /// One token's value for one kv head, as `f32` (`head_size` values; int8: code · scale).
    pub fn read_value(&self, slot: usize, kv_head: usize) -> Result<Vec<f32>, CacheError> {
        self.check_slot(slot, kv_head)?;
        let g = self.geometry;
        let scale = match &self.storage {
            Storage::Int8 { value_scale, .. } => {
                bf16::from_bits(value_scale[g.value_scale_index(slot, kv_head)]).to_f32()
            }
            _ => 1.0,
        };
        Ok((0..g.head_size).map(|d| self.value_at(g.value_index(slot, kv_head, d)) * scale).collect())
    }

    /// Writes one token's key and value for one kv head (converted to the cache dtype).
    ///
    /// A plain per-token writer for tests and tools; the batched writer is
    /// `attn_kernels::reshape_and_cache`.
    pub fn write_token(
        &mut self,
        slot: usize,
        kv_head: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), CacheError> {
        self.check_slot(slot, kv_head)?;
        let g = self.geometry;
        if key.len() != g.head_size || value.len() != g.head_size {
            return Err(CacheError::InvalidShape(format!(
                "key/value of {}/{} values for head_size {}",
                key.len(),
                value.len(),
                g.head_size
            )));
        }
        fn put<T: CacheElem>(
            g: &CacheGeometry,
            k: &mut [T],
            v: &mut [T],
            s: usize,
            h: usize,
            key: &[f32],
            value: &[f32],
        ) {
            for d in 0..g.head_size {
                k[g.key_index(s, h, d)] = T::from_f32(key[d]);
                v[g.value_index(s, h, d)] = T::from_f32(value[d]);
            }
        }
        match self.slices_mut() {
            CacheSlicesMut::F32 { key: k, value: v } => put(&g, k, v, slot, kv_head, key, value),
            CacheSlicesMut::F16 { key: k, value: v } => put(&g, k, v, slot, kv_head, key, value),
            CacheSlicesMut::BF16 { key: k, value: v } => put(&g, k, v, slot, kv_head, key, value),
            CacheSlicesMut::Int8 { key: k, value: v, key_scale, value_scale } => {
                crate::int8::quantize_token(&g, slot, kv_head, key, value, k, v, key_scale, value_scale);
            }
        }
        Ok(())
    }

    fn key_at(&self, i: usize) -> f32 {
        match &self.storage {
            Storage::F32 { key, .. } => key[i],
            Storage::F16 { key, .. } => f16::from_bits(key[i]).to_f32(),
            Storage::BF16 { key, .. } => bf16::from_bits(key[i]).to_f32(),
            Storage::Int8 { key, .. } => key[i] as f32,
        }
    }

    fn value_at(&self, i: usize) -> f32 {
        match &self.storage {
            Storage::F32 { value, .. } => value[i],
            Storage::F16 { value, .. } => f16::from_bits(value[i]).to_f32(),
            Storage::BF16 { value, .. } => bf16::from_bits(value[i]).to_f32(),
            Storage::Int8 { value, .. } => value[i] as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(dtype: DType) -> CacheGeometry {
        CacheGeometry { num_blocks: 5, num_kv_heads: 2, head_size: 16, block_size: 8, dtype }
    }

    #[test]
    fn key_and_value_indices_are_a_bijection_onto_the_tensor() {
        for dtype in [DType::F32, DType::BF16] {
            let g = geom(dtype);
            let mut seen_k = vec![false; g.tensor_elems()];
            let mut seen_v = vec![false; g.tensor_elems()];
            for slot in 0..g.num_slots() {
                for h in 0..g.num_kv_heads {
                    for d in 0..g.head_size {
                        let (ki, vi) = (g.key_index(slot, h, d), g.value_index(slot, h, d));
                        assert!(!seen_k[ki] && !seen_v[vi]);
                        seen_k[ki] = true;
                        seen_v[vi] = true;
                    }
                }
            }
            assert!(seen_k.iter().all(|&s| s) && seen_v.iter().all(|&s| s));
        }
    }

    #[test]
    fn key_layout_matches_vllm_strides() {
        // key [num_blocks, kv_heads, head_size/x, block_size, x] with x = 4 for f32.
        let g = geom(DType::F32);
        let (slot, h, d) = (3 * 8 + 5, 1, 9);
        let expect = (((3 * 2 + 1) * (16 / 4) + 9 / 4) * 8 + 5) * 4 + 9 % 4;
        assert_eq!(g.key_index(slot, h, d), expect);
        // value [num_blocks, kv_heads, head_size, block_size]
        assert_eq!(g.value_index(slot, h, d), ((3 * 2 + 1) * 16 + 9) * 8 + 5);
    }

    #[test]
    fn write_then_read_round_trips_per_dtype() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let mut c = LayerCache::new(geom(dtype)).unwrap();
            let k: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
            let v: Vec<f32> = (0..16).map(|i| -(i as f32)).collect();
            c.write_token(17, 1, &k, &v).unwrap();
            assert_eq!(c.read_key(17, 1).unwrap(), k);
            assert_eq!(c.read_value(17, 1).unwrap(), v);
            assert_eq!(c.read_key(17, 0).unwrap(), vec![0.0; 16]);
        }
        // int8: within half a step of the scale: a key's per group of 16 dims here (head size
        // 48: three groups, the largest |k| of each 7.5, 15.5 and 23.5), a value's per head.
        let g = CacheGeometry { head_size: 48, ..geom(DType::Int8) };
        let mut c = LayerCache::new(g).unwrap();
        let k: Vec<f32> = (0..48).map(|i| i as f32 * 0.5).collect();
        let v: Vec<f32> = (0..48).map(|i| -(i as f32)).collect();
        c.write_token(17, 1, &k, &v).unwrap();
        for (d, (a, b)) in c.read_key(17, 1).unwrap().iter().zip(&k).enumerate() {
            let amax = (d / 16 * 16 + 15) as f32 * 0.5;
            assert!((a - b).abs() <= 0.5 * amax / 127.0 * 1.01, "key dim {d}: {a} vs {b}");
        }
        for (a, b) in c.read_value(17, 1).unwrap().iter().zip(&v) {
            assert!((a - b).abs() <= 0.5 * 47.0 / 127.0 * 1.01, "{a} vs {b}");
        }
        assert_eq!(c.read_key(17, 0).unwrap(), vec![0.0; 48]);
    }

    #[test]
    fn out_of_range_accesses_are_errors() {
        let c = LayerCache::new(geom(DType::F32)).unwrap();
        assert!(matches!(c.read_key(40, 0), Err(CacheError::SlotOutOfRange { slot: 40, num_slots: 40 })));
        assert!(matches!(c.read_value(0, 2), Err(CacheError::KvHeadOutOfRange { .. })));
    }

    #[test]
    fn typed_views_only_for_the_stored_dtype() {
        let mut c = LayerCache::new(geom(DType::BF16)).unwrap();
        assert!(c.typed::<f32>().is_none());
        assert!(c.typed_mut::<f16>().is_none());
        let (k, v) = c.typed::<bf16>().unwrap();
        assert_eq!(k.len(), 5 * 2 * 16 * 8);
        assert_eq!(v.len(), k.len());
    }
}
