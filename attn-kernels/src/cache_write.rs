//! `reshape_and_cache`: scatter this step's K/V rows into their cache slots.

use kv_cache::{CacheElem, CacheGeometry, CacheSlicesMut, LayerCache, int8};

use crate::AttnError;
use crate::meta::{check_len, check_slots};

/// Writes `key`/`value` (`[num_tokens, num_kv_heads, head_size]`, f32) into `cache` at
/// `slot_mapping[i]` for token `i`, converting to the cache dtype (int8: codes and scales by
/// `kv_cache::int8::quantize_token`). A negative slot is padding and is skipped. All slots are
/// checked before the first write.
pub fn reshape_and_cache(
    key: &[f32],
    value: &[f32],
    slot_mapping: &[i64],
    cache: &mut LayerCache,
) -> Result<(), AttnError> {
    let g = *cache.geometry();
    let row = g.num_kv_heads * g.head_size;
    let num_tokens = slot_mapping.len();
    check_len("key [num_tokens, num_kv_heads, head_size]", num_tokens * row, key.len())?;
    check_len("value [num_tokens, num_kv_heads, head_size]", num_tokens * row, value.len())?;
    check_slots(slot_mapping, g.num_slots())?;
    if let CacheSlicesMut::Int8 { key: kc, value: vc, key_scale: ks, value_scale: vs } = cache.slices_mut() {
        for (token, slot) in slot_mapping.iter().enumerate() {
            let Ok(slot) = usize::try_from(*slot) else { continue };
            for h in 0..g.num_kv_heads {
                let src = token * row + h * g.head_size..token * row + (h + 1) * g.head_size;
                int8::quantize_token(&g, slot, h, &key[src.clone()], &value[src], kc, vc, ks, vs);
            }
        }
        return Ok(());
    }
    by_dtype!(CacheSlicesMut, cache.slices_mut(), |kc, vc| scatter(&g, key, value, slot_mapping, kc, vc));
    Ok(())
}

fn scatter<T: CacheElem>(
    g: &CacheGeometry,
    key: &[f32],
    value: &[f32],
    slot_mapping: &[i64],
    key_cache: &mut [T],
    value_cache: &mut [T],
) {
    let (d_size, bs, x) = (g.head_size, g.block_size, g.x());
    let row = g.num_kv_heads * d_size;
    for (token, &slot) in slot_mapping.iter().enumerate() {
        let Ok(slot) = usize::try_from(slot) else { continue };
        for h in 0..g.num_kv_heads {
            let src = token * row + h * d_size;
            let k_src = &key[src..src + d_size];
            let v_src = &value[src..src + d_size];
            // Key: chunks of x consecutive dims are contiguous, chunk stride is block_size * x.
            let k_base = g.key_index(slot, h, 0);
            for (c, chunk) in k_src.chunks_exact(x).enumerate() {
                let dst = &mut key_cache[k_base + c * bs * x..k_base + c * bs * x + x];
                for (d, s) in dst.iter_mut().zip(chunk) {
                    *d = T::from_f32(*s);
                }
            }
            // Value: one element per dim, stride block_size.
            let v_base = g.value_index(slot, h, 0);
            for (d, &s) in v_src.iter().enumerate() {
                value_cache[v_base + d * bs] = T::from_f32(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv_cache::DType;

    fn cache(dtype: DType) -> LayerCache {
        LayerCache::new(CacheGeometry { num_blocks: 4, num_kv_heads: 2, head_size: 64, block_size: 8, dtype })
            .unwrap()
    }

    #[test]
    fn rows_land_in_their_slots_and_padding_is_skipped() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::Int8] {
            let mut c = cache(dtype);
            c.fill(f32::NAN);
            let row = 2 * 64;
            let key: Vec<f32> = (0..3 * row).map(|i| (i % 61) as f32 * 0.25).collect();
            let value: Vec<f32> = (0..3 * row).map(|i| -((i % 37) as f32)).collect();
            reshape_and_cache(&key, &value, &[29, -1, 3], &mut c).unwrap();
            // Exact for the float types (the values are representable); int8 within half a step
            // of the row's largest scale, at most `max |v| / 127` (rounded up to bf16: 2⁻⁸).
            let same = |got: Vec<f32>, want: &[f32]| {
                let step = want.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0 * (1.0 + 1.0 / 128.0);
                let tol = if dtype == DType::Int8 { 0.5 * step } else { 0.0 };
                assert!(
                    got.iter().zip(want).all(|(a, b)| (a - b).abs() <= tol),
                    "{dtype}: {got:?} vs {want:?}"
                );
            };
            for h in 0..2 {
                same(c.read_key(29, h).unwrap(), &key[h * 64..h * 64 + 64]);
                same(c.read_value(29, h).unwrap(), &value[h * 64..h * 64 + 64]);
                let t2 = 2 * row + h * 64;
                same(c.read_key(3, h).unwrap(), &key[t2..t2 + 64]);
                same(c.read_value(3, h).unwrap(), &value[t2..t2 + 64]);
                // Untouched slots keep their poison.
                assert!(c.read_key(4, h).unwrap().iter().all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn an_out_of_range_slot_fails_before_any_write() {
        let mut c = cache(DType::F32);
        let row = 2 * 64;
        let ones = vec![1.0; 2 * row];
        let err = reshape_and_cache(&ones, &ones, &[0, 32], &mut c).unwrap_err();
        assert_eq!(err, AttnError::SlotOutOfRange { token: 1, slot: 32, num_slots: 32 });
        assert_eq!(c.read_key(0, 0).unwrap(), vec![0.0; 64]);
    }

    #[test]
    fn mismatched_lengths_are_rejected() {
        let mut c = cache(DType::F32);
        let err = reshape_and_cache(&[0.0; 128], &[0.0; 127], &[0], &mut c).unwrap_err();
        assert!(matches!(err, AttnError::ShapeMismatch { .. }));
    }
}
