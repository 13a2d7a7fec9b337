//! `copy_blocks` / `swap_out` / `swap_in` round trips: moved blocks arrive intact (int8: codes
//! and scales, as read back dequantized), every other block keeps its bytes.

use attn_kernels::{AttnError, copy_blocks, swap_blocks, swap_in, swap_out};
use kv_cache::{BlockShape, CacheConfig, DType, KvCache, LayerCache};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn filled_cache(dtype: DType, num_blocks: usize, num_swap: usize, seed: u64) -> KvCache {
    let shape = BlockShape { block_size: 8, num_layers: 3, num_kv_heads: 2, head_size: 64, dtype };
    let mut cache = KvCache::new(CacheConfig::new(shape, num_blocks, num_swap)).expect("cache");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for layer in cache.layers_mut() {
        let slots = layer.geometry().num_slots();
        for slot in 0..slots {
            for h in 0..2 {
                let k: Vec<f32> = (0..64).map(|_| rng.random_range(-8.0f32..8.0)).collect();
                let v: Vec<f32> = (0..64).map(|_| rng.random_range(-8.0f32..8.0)).collect();
                layer.write_token(slot, h, &k, &v).expect("write");
            }
        }
    }
    cache
}

/// Every token of block `b`, both tensors, all heads.
fn block_contents(layer: &LayerCache, b: usize) -> Vec<f32> {
    let bs = layer.block_size();
    let mut out = Vec::new();
    for slot in b * bs..(b + 1) * bs {
        for h in 0..layer.num_kv_heads() {
            out.extend(layer.read_key(slot, h).expect("key"));
            out.extend(layer.read_value(slot, h).expect("value"));
        }
    }
    out
}

fn snapshot(layers: &[LayerCache]) -> Vec<Vec<Vec<f32>>> {
    layers.iter().map(|l| (0..l.num_blocks()).map(|b| block_contents(l, b)).collect()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn copy_blocks_copies_pairs_and_nothing_else(
        dtype in prop::sample::select(vec![DType::F32, DType::F16, DType::BF16, DType::Int8]),
        pairs in prop::collection::vec((0u32..12, 0u32..12), 0..6),
        seed in any::<u64>(),
    ) {
        let mut cache = filled_cache(dtype, 12, 0, seed);
        let mut expect = snapshot(cache.layers());
        for layer in expect.iter_mut() {
            for &(s, d) in &pairs {
                layer[d as usize] = layer[s as usize].clone();
            }
        }
        copy_blocks(&mut cache, &pairs).expect("copy");
        prop_assert_eq!(snapshot(cache.layers()), expect);
    }

    #[test]
    fn swap_out_then_in_round_trips(
        dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::Int8]),
        moves in prop::collection::vec((0u32..10, 0u32..6), 1..4),
        seed in any::<u64>(),
    ) {
        // Distinct host destinations so a later move cannot overwrite an earlier one.
        let mut seen = std::collections::HashSet::new();
        let moves: Vec<(u32, u32)> = moves.into_iter().filter(|&(_, h)| seen.insert(h)).collect();
        let mut cache = filled_cache(dtype, 10, 6, seed);
        let device_before = snapshot(cache.layers());
        let host_before = snapshot(cache.swap_layers());
        swap_out(&mut cache, &moves).expect("swap out");
        let host_after = snapshot(cache.swap_layers());
        prop_assert_eq!(snapshot(cache.layers()), device_before.clone());
        for (l, layer) in host_after.iter().enumerate() {
            for (h, block) in layer.iter().enumerate() {
                match moves.iter().find(|&&(_, dst)| dst as usize == h) {
                    Some(&(src, _)) => prop_assert_eq!(block, &device_before[l][src as usize]),
                    None => prop_assert_eq!(block, &host_before[l][h]),
                }
            }
        }
        // Bring them back into the device blocks reversed, and check the rest stayed put.
        let back: Vec<(u32, u32)> = moves.iter().zip(moves.iter().rev()).map(|(&(_, h), &(d, _))| (h, d)).collect();
        swap_in(&mut cache, &back).expect("swap in");
        let device_after = snapshot(cache.layers());
        for (l, layer) in device_after.iter().enumerate() {
            for (d, block) in layer.iter().enumerate() {
                match back.iter().rev().find(|&&(_, dst)| dst as usize == d) {
                    Some(&(h, _)) => prop_assert_eq!(block, &host_after[l][h as usize]),
                    None => prop_assert_eq!(block, &device_before[l][d]),
                }
            }
        }
    }
}

#[test]
fn out_of_range_ids_fail_before_any_copy() {
    let mut cache = filled_cache(DType::F32, 4, 2, 1);
    let before = snapshot(cache.layers());
    let err = copy_blocks(&mut cache, &[(0, 1), (2, 4)]).unwrap_err();
    assert_eq!(err, AttnError::BlockOutOfRange { block: 4, num_blocks: 4 });
    assert!(swap_out(&mut cache, &[(0, 0), (1, 2)]).is_err());
    assert!(swap_in(&mut cache, &[(2, 0)]).is_err());
    assert_eq!(snapshot(cache.layers()), before);
}

#[test]
fn swapping_between_different_layouts_is_refused() {
    let a = filled_cache(DType::F32, 2, 0, 1);
    let mut b = filled_cache(DType::BF16, 2, 0, 1);
    let err = swap_blocks(a.layer(0), b.layer_mut(0), &[(0, 0)]).unwrap_err();
    assert!(matches!(err, AttnError::LayoutMismatch { .. }));
}
