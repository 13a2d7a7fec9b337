//! Element types of the cache (`f32`, `f16`, `bf16`) and the conversions kernels need.

use half::{bf16, f16};

/// Element type of the K/V cache. Activations stay `f32`; only the cache is narrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// vLLM's `x`: how many elements of one key make up 16 bytes, the innermost key dimension.
    pub const fn x(self) -> usize {
        16 / self.size_in_bytes()
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be stored in the cache; lets kernels be generic over the dtype.
pub trait CacheElem: Copy + Send + Sync + bytemuck::Pod + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl CacheElem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// [`CacheElem`] for a `half` type, whose own conversions are the cache's.
macro_rules! half_cache_elem {
    ($t:ident, $dtype:ident) => {
        impl CacheElem for $t {
            const DTYPE: DType = DType::$dtype;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                $t::to_f32(self)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $t::from_f32(v)
            }
        }
    };
}

half_cache_elem!(f16, F16);
half_cache_elem!(bf16, BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_packs_sixteen_bytes() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(d.x() * d.size_in_bytes(), 16);
        }
        assert_eq!(DType::F32.x(), 4);
        assert_eq!(DType::BF16.x(), 8);
    }

    #[test]
    fn conversions_round_trip_representable_values() {
        for v in [0.0f32, 1.0, -2.5, 0.125, 1024.0] {
            assert_eq!(f16::from_f32(v).to_f32(), v);
            assert_eq!(<bf16 as CacheElem>::from_f32(v).to_f32(), v);
            assert_eq!(<f32 as CacheElem>::from_f32(v).to_f32(), v);
        }
    }
}
