//! Element types of the cache (`f32`, `f16`, `bf16`, `int8` codes) and the conversions kernels need.

use half::{bf16, f16};

/// Element type of the K/V cache. Activations stay `f32`; only the cache is narrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Symmetric int8 codes with bf16 scales stored beside them: a key's per group of 32 dims
    /// (16 where the head size is not a multiple of 32), a value's per (token, kv head)
    /// (`crate::int8`).
    Int8,
    /// fp8 e4m3 and e5m2 (vLLM's `fp8`/`fp8_e4m3` and `fp8_e5m2`): named so that the
    /// configuration can refuse them with the device they need; no cache here stores them yet.
    Fp8E4M3,
    Fp8E5M2,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Int8 | DType::Fp8E4M3 | DType::Fp8E5M2 => 1,
        }
    }

    /// Bytes of one scale: 2 (a bf16) for int8, else none.
    pub const fn scale_bytes(self) -> usize {
        match self {
            DType::Int8 => 2,
            _ => 0,
        }
    }

    /// Scales of one token's key in one kv head: int8's groups of [`crate::int8::key_group`]
    /// dims; 0 for the float types.
    pub const fn key_scales(self, head_size: usize) -> usize {
        match self {
            DType::Int8 => head_size / crate::int8::key_group(head_size),
            _ => 0,
        }
    }

    /// Scales of one token's value in one kv head: 1 for int8, 0 for the float types.
    pub const fn value_scales(self) -> usize {
        match self {
            DType::Int8 => 1,
            _ => 0,
        }
    }

    /// Bytes one token's key and value of one kv head take together: their `2 · head_size`
    /// elements and their scales.
    pub const fn kv_bytes_per_head(self, head_size: usize) -> usize {
        2 * head_size * self.size_in_bytes()
            + (self.key_scales(head_size) + self.value_scales()) * self.scale_bytes()
    }

    /// vLLM's `x`: how many elements of one key make up 16 bytes, the innermost key dimension.
    /// int8 keeps 8 (8 bytes): the CPU kernels widen one 8-element chunk of a token to a vector
    /// of 8 `f32` lanes, as they do for the 16-bit types.
    pub const fn x(self) -> usize {
        match self {
            DType::Int8 => 8,
            _ => 16 / self.size_in_bytes(),
        }
    }

    /// fp8 e4m3 or e5m2.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::Fp8E4M3 | DType::Fp8E5M2)
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Int8 => "int8",
            DType::Fp8E4M3 => "fp8_e4m3",
            DType::Fp8E5M2 => "fp8_e5m2",
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

/// The int8 cache's codes: `to_f32` is the code itself and `from_f32` rounds to the nearest code
/// in `-127 ..= 127`; the token's scale, kept beside the codes, turns a code into its value.
impl CacheElem for i8 {
    const DTYPE: DType = DType::Int8;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        crate::int8::code(v, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_packs_sixteen_bytes() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(d.x() * d.size_in_bytes(), 16);
            assert_eq!(d.kv_bytes_per_head(64), 2 * 64 * d.size_in_bytes());
        }
        assert_eq!(DType::Int8.x(), 8);
        // Keys: 64 codes and two group scales; values: 64 codes and a scale.
        assert_eq!(DType::Int8.kv_bytes_per_head(64), 68 + 66);
        assert_eq!(DType::Int8.kv_bytes_per_head(80), 90 + 82);
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
