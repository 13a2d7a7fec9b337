//! Where a weight's bytes live: an f32 vector, an owned byte buffer (weights quantized at
//! load), or a range of a memory-mapped model file shared by every tensor of that file.

use std::ops::Range;
use std::sync::Arc;

use memmap2::Mmap;

/// The bytes of one [`super::Part`].
#[derive(Debug)]
pub enum Storage {
    /// f32 values (kept typed so they stay aligned for the f32 kernels).
    F32(Vec<f32>),
    /// Bytes made at load time (quantized or converted).
    Owned(Vec<u8>),
    /// A range of a mapped file: the page cache holds the bytes, not the heap.
    Mapped { map: Arc<Mmap>, range: Range<usize> },
}

impl Storage {
    /// A range of `map`; `None` when it lies outside the mapping.
    pub fn mapped(map: Arc<Mmap>, range: Range<usize>) -> Option<Self> {
        (range.start <= range.end && range.end <= map.len()).then_some(Self::Mapped { map, range })
    }

    /// The same bytes for a second owner: a mapped range shares the mapping, the others are
    /// copied.
    pub fn share(&self) -> Self {
        match self {
            Self::F32(v) => Self::F32(v.clone()),
            Self::Owned(b) => Self::Owned(b.clone()),
            Self::Mapped { map, range } => Self::Mapped { map: Arc::clone(map), range: range.clone() },
        }
    }

    #[inline]
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::F32(v) => bytemuck::cast_slice(v),
            Self::Owned(b) => b,
            Self::Mapped { map, range } => &map[range.clone()],
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => 4 * v.len(),
            Self::Owned(b) => b.len(),
            Self::Mapped { range, .. } => range.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
