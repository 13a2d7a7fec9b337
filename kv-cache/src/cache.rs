//! The whole KV cache: every layer's device tensors plus the host-side swap cache.

use crate::{CacheConfig, CacheError, LayerCache};

/// All layers' K/V tensors on the device, and a host swap cache with the same per-block layout.
#[derive(Debug)]
pub struct KvCache {
    config: CacheConfig,
    layers: Vec<LayerCache>,
    swap: Vec<LayerCache>,
}

impl KvCache {
    /// Allocates every tensor once, at its full size.
    pub fn new(config: CacheConfig) -> Result<Self, CacheError> {
        config.shape().validate()?;
        if !config.device.is_cpu() {
            return Err(CacheError::UnsupportedDevice(config.device));
        }
        let layers = (0..config.num_layers)
            .map(|_| LayerCache::new(config.layer_geometry(config.num_blocks)))
            .collect::<Result<Vec<_>, _>>()?;
        let swap = if config.num_swap_blocks == 0 {
            Vec::new()
        } else {
            (0..config.num_layers)
                .map(|_| LayerCache::new(config.layer_geometry(config.num_swap_blocks)))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(KvCache { config, layers, swap })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `l`'s device cache. Panics if `l >= num_layers` (an indexing bug, not input);
    /// see [`KvCache::try_layer`] for the checked form.
    pub fn layer(&self, l: usize) -> &LayerCache {
        &self.layers[l]
    }
    pub fn layer_mut(&mut self, l: usize) -> &mut LayerCache {
        &mut self.layers[l]
    }
    pub fn try_layer(&self, l: usize) -> Result<&LayerCache, CacheError> {
        self.layers.get(l).ok_or(CacheError::LayerOutOfRange { layer: l, num_layers: self.layers.len() })
    }
    pub fn layers(&self) -> &[LayerCache] {
        &self.layers
    }
    pub fn layers_mut(&mut self) -> &mut [LayerCache] {
        &mut self.layers
    }

    /// Host swap cache of every layer (empty when `num_swap_blocks == 0`).
    pub fn swap_layers(&self) -> &[LayerCache] {
        &self.swap
    }

    /// Device and host caches of every layer side by side, for swapping in and out.
    pub fn device_and_swap_mut(&mut self) -> (&mut [LayerCache], &mut [LayerCache]) {
        (&mut self.layers, &mut self.swap)
    }

    /// One token's key of one kv head in layer `layer`, as `f32`.
    pub fn read_key(&self, layer: usize, slot: usize, kv_head: usize) -> Result<Vec<f32>, CacheError> {
        self.try_layer(layer)?.read_key(slot, kv_head)
    }

    /// One token's value of one kv head in layer `layer`, as `f32`.
    pub fn read_value(&self, layer: usize, slot: usize, kv_head: usize) -> Result<Vec<f32>, CacheError> {
        self.try_layer(layer)?.read_value(slot, kv_head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BlockShape, DType};

    #[test]
    fn allocates_every_layer_and_the_swap_cache_once() {
        let shape =
            BlockShape { block_size: 16, num_layers: 3, num_kv_heads: 2, head_size: 64, dtype: DType::F16 };
        let cache = KvCache::new(CacheConfig::new(shape, 10, 4)).unwrap();
        assert_eq!(cache.num_layers(), 3);
        assert_eq!(cache.swap_layers().len(), 3);
        assert_eq!(cache.layer(2).num_blocks(), 10);
        assert_eq!(cache.swap_layers()[0].num_blocks(), 4);
        assert!(cache.layer(0).geometry().same_block_layout(cache.swap_layers()[0].geometry()));
        assert!(matches!(
            cache.read_key(3, 0, 0),
            Err(CacheError::LayerOutOfRange { layer: 3, num_layers: 3 })
        ));
        assert_eq!(cache.read_value(1, 159, 1).unwrap(), vec![0.0; 64]);
    }

    #[test]
    fn invalid_shapes_are_rejected_before_allocating() {
        let shape =
            BlockShape { block_size: 16, num_layers: 1, num_kv_heads: 2, head_size: 12, dtype: DType::F16 };
        assert!(matches!(
            KvCache::new(CacheConfig::new(shape, 1, 0)),
            Err(CacheError::HeadSizeNotMultipleOfX { .. })
        ));
    }
}
