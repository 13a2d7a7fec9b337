//! Device-generic kernel entry points: one trait method per kernel, with the CPU twin and
//! (behind `cuda`) the CUDA twin behind it, chosen by the backend's type.
//!
//! A forward pass written against [`KernelBackend`] calls `b.paged_attention(…)` whatever the
//! device; `b` is [`Cpu`] or, with the `cuda` feature, a
//! [`CudaKernels`](crate::cuda::runtime::CudaKernels) handle. The backend names the types that
//! differ per device (activation buffers, slot mapping, attention metadata, cache, workspace,
//! error), so a mismatch — a host slice handed to a CUDA cache — is a compile error, not a
//! run-time branch. `move_blocks` is the one device-generic copy-and-swap of a step.
//!
//! The crate-root functions ([`crate::paged_attention`] …) remain the CPU implementations with
//! their CPU-only options (instruction set, split policy) for tests and benches.

use kv_cache::{KvCache, LayerCache};

use crate::{AttnError, AttnScores, PagedAttnMetadata};

/// A device the kernels run on, and the types its kernels take.
pub trait KernelBackend {
    /// An activation buffer of `f32` (`[num_tokens, heads, head_size]` rows).
    type Act: ?Sized;
    /// Per-token cache slots of one step (negative = padding).
    type Slots: ?Sized;
    /// Per-step attention metadata (block tables, context lengths, query offsets).
    type Meta<'a>;
    /// One layer of the paged cache.
    type Layer;
    /// The whole cache: every layer plus the host swap space.
    type Cache;
    /// Scratch the attention kernel may need between calls (split-context partials).
    type Workspace;
    type Error: std::error::Error + Send + Sync + 'static;

    /// Writes new K/V rows (`[num_tokens, kv_heads, head_size]`) into their cache slots.
    fn reshape_and_cache(
        &self,
        key: &Self::Act,
        value: &Self::Act,
        slots: &Self::Slots,
        layer: &mut Self::Layer,
    ) -> Result<(), Self::Error>;

    /// Attention of a mixed batch (prefill chunks and decodes) over the paged cache.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention(
        &self,
        out: &mut Self::Act,
        query: &Self::Act,
        layer: &Self::Layer,
        meta: &Self::Meta<'_>,
        num_heads: usize,
        scores: AttnScores,
        workspace: &mut Self::Workspace,
    ) -> Result<(), Self::Error>;

    /// Copy-on-write: copies whole blocks `(src, dst)` in every layer.
    fn copy_blocks(&self, cache: &mut Self::Cache, pairs: &[(u32, u32)]) -> Result<(), Self::Error>;

    /// Moves device blocks to the host swap space, every layer: `(device_block, host_block)`.
    fn swap_out(&self, cache: &mut Self::Cache, mapping: &[(u32, u32)]) -> Result<(), Self::Error>;

    /// Moves host swap blocks back to the device, every layer: `(host_block, device_block)`.
    fn swap_in(&self, cache: &mut Self::Cache, mapping: &[(u32, u32)]) -> Result<(), Self::Error>;

    /// One step's block moves in the order a scheduler plans them: swap-outs first (their
    /// device blocks may be reused by this step), then swap-ins, then copy-on-write copies.
    /// Empty lists cost nothing.
    fn move_blocks(
        &self,
        cache: &mut Self::Cache,
        swap_out: &[(u32, u32)],
        swap_in: &[(u32, u32)],
        copies: &[(u32, u32)],
    ) -> Result<(), Self::Error> {
        if !swap_out.is_empty() {
            self.swap_out(cache, swap_out)?;
        }
        if !swap_in.is_empty() {
            self.swap_in(cache, swap_in)?;
        }
        if !copies.is_empty() {
            self.copy_blocks(cache, copies)?;
        }
        Ok(())
    }
}

/// A backend whose cache writes, attention and block moves are another's: the layer-op backends
/// ([`crate::layer_ops::LayerOps`]) wrap a kernel backend and are one through this.
pub trait WrapsKernels {
    type Kernels: KernelBackend;
    fn kernels(&self) -> &Self::Kernels;
}

impl<T: WrapsKernels> KernelBackend for T {
    type Act = <T::Kernels as KernelBackend>::Act;
    type Slots = <T::Kernels as KernelBackend>::Slots;
    type Meta<'a> = <T::Kernels as KernelBackend>::Meta<'a>;
    type Layer = <T::Kernels as KernelBackend>::Layer;
    type Cache = <T::Kernels as KernelBackend>::Cache;
    type Workspace = <T::Kernels as KernelBackend>::Workspace;
    type Error = <T::Kernels as KernelBackend>::Error;

    fn reshape_and_cache(
        &self,
        key: &Self::Act,
        value: &Self::Act,
        slots: &Self::Slots,
        layer: &mut Self::Layer,
    ) -> Result<(), Self::Error> {
        self.kernels().reshape_and_cache(key, value, slots, layer)
    }

    fn paged_attention(
        &self,
        out: &mut Self::Act,
        query: &Self::Act,
        layer: &Self::Layer,
        meta: &Self::Meta<'_>,
        num_heads: usize,
        scores: AttnScores,
        workspace: &mut Self::Workspace,
    ) -> Result<(), Self::Error> {
        self.kernels().paged_attention(out, query, layer, meta, num_heads, scores, workspace)
    }

    fn copy_blocks(&self, cache: &mut Self::Cache, pairs: &[(u32, u32)]) -> Result<(), Self::Error> {
        self.kernels().copy_blocks(cache, pairs)
    }

    fn swap_out(&self, cache: &mut Self::Cache, mapping: &[(u32, u32)]) -> Result<(), Self::Error> {
        self.kernels().swap_out(cache, mapping)
    }

    fn swap_in(&self, cache: &mut Self::Cache, mapping: &[(u32, u32)]) -> Result<(), Self::Error> {
        self.kernels().swap_in(cache, mapping)
    }
}

/// The host: the CPU kernels of this crate over a [`KvCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu;

impl KernelBackend for Cpu {
    type Act = [f32];
    type Slots = [i64];
    type Meta<'a> = PagedAttnMetadata<'a>;
    type Layer = LayerCache;
    type Cache = KvCache;
    /// The CPU kernels keep per-thread scratch of their own.
    type Workspace = ();
    type Error = AttnError;

    fn reshape_and_cache(
        &self,
        key: &[f32],
        value: &[f32],
        slots: &[i64],
        layer: &mut LayerCache,
    ) -> Result<(), AttnError> {
        crate::reshape_and_cache(key, value, slots, layer)
    }

    fn paged_attention(
        &self,
        out: &mut [f32],
        query: &[f32],
        layer: &LayerCache,
        meta: &PagedAttnMetadata<'_>,
        num_heads: usize,
        scores: AttnScores,
        _workspace: &mut (),
    ) -> Result<(), AttnError> {
        crate::paged_attention(&crate::AttnOptions::default(), out, query, layer, meta, num_heads, scores)
    }

    fn copy_blocks(&self, cache: &mut KvCache, pairs: &[(u32, u32)]) -> Result<(), AttnError> {
        crate::copy_blocks(cache, pairs)
    }

    fn swap_out(&self, cache: &mut KvCache, mapping: &[(u32, u32)]) -> Result<(), AttnError> {
        crate::swap_out(cache, mapping)
    }

    fn swap_in(&self, cache: &mut KvCache, mapping: &[(u32, u32)]) -> Result<(), AttnError> {
        crate::swap_in(cache, mapping)
    }
}

#[cfg(feature = "cuda")]
mod cuda_backend {
    //! The CUDA twin: launches through [`CudaKernels`] on its device's stream.

    use cudarc::driver::CudaSlice;
    use kv_cache::cuda::{CudaKvCache, DeviceLayerCache};

    use super::KernelBackend;
    use crate::AttnScores;
    use crate::cuda::CudaError;
    use crate::cuda::DeviceAttnMetadata;
    use crate::cuda::ops::{self, AttnWorkspace, DeviceSlotMapping};
    use crate::cuda::runtime::CudaKernels;

    impl KernelBackend for CudaKernels {
        type Act = CudaSlice<f32>;
        type Slots = DeviceSlotMapping;
        type Meta<'a> = DeviceAttnMetadata;
        type Layer = DeviceLayerCache;
        type Cache = CudaKvCache;
        type Workspace = AttnWorkspace;
        type Error = CudaError;

        fn reshape_and_cache(
            &self,
            key: &CudaSlice<f32>,
            value: &CudaSlice<f32>,
            slots: &DeviceSlotMapping,
            layer: &mut DeviceLayerCache,
        ) -> Result<(), CudaError> {
            ops::reshape_and_cache(self, key, value, slots, layer)
        }

        fn paged_attention(
            &self,
            out: &mut CudaSlice<f32>,
            query: &CudaSlice<f32>,
            layer: &DeviceLayerCache,
            meta: &DeviceAttnMetadata,
            num_heads: usize,
            scores: AttnScores,
            workspace: &mut AttnWorkspace,
        ) -> Result<(), CudaError> {
            ops::paged_attention_with(self, out, query, layer, meta, num_heads, scores, workspace, None)
                .map(|_variant| ())
        }

        fn copy_blocks(&self, cache: &mut CudaKvCache, pairs: &[(u32, u32)]) -> Result<(), CudaError> {
            ops::copy_blocks(self, cache, pairs)
        }

        fn swap_out(&self, cache: &mut CudaKvCache, mapping: &[(u32, u32)]) -> Result<(), CudaError> {
            crate::cuda::swap::swap(self, cache, mapping, true)
        }

        fn swap_in(&self, cache: &mut CudaKvCache, mapping: &[(u32, u32)]) -> Result<(), CudaError> {
            crate::cuda::swap::swap(self, cache, mapping, false)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The generic entry points reach the CPU kernels unchanged: same bytes, same errors.

    use kv_cache::{BlockShape, CacheConfig, DType};

    use super::{Cpu, KernelBackend};
    use crate::{AttnError, PagedAttnMetadata};

    fn cache() -> kv_cache::KvCache {
        let shape =
            BlockShape { block_size: 16, num_layers: 1, num_kv_heads: 1, head_size: 64, dtype: DType::F32 };
        match kv_cache::KvCache::new(CacheConfig::new(shape, 4, 2)) {
            Ok(c) => c,
            Err(e) => panic!("cache: {e}"),
        }
    }

    #[test]
    fn cpu_backend_runs_the_cpu_kernels() -> Result<(), AttnError> {
        let mut generic = cache();
        let mut direct = cache();
        let key: Vec<f32> = (0..3 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
        let value: Vec<f32> = (0..3 * 64).map(|i| (i as f32 * 0.11).cos()).collect();
        let slots = vec![16i64, 17, 18];
        Cpu.reshape_and_cache(&key, &value, &slots, generic.layer_mut(0))?;
        crate::reshape_and_cache(&key, &value, &slots, direct.layer_mut(0))?;
        assert_eq!(generic.read_key(0, 17, 0).ok(), direct.read_key(0, 17, 0).ok());

        let (tables, lens, starts) = (vec![1u32], vec![3usize], vec![0usize, 1]);
        let meta = PagedAttnMetadata {
            query_start_loc: &starts,
            seq_lens: &lens,
            block_tables: &tables,
            max_blocks_per_seq: 1,
            seq_rows: None,
        };
        let query: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
        let (mut a, mut b) = (vec![0.0f32; 64], vec![0.0f32; 64]);
        Cpu.paged_attention(&mut a, &query, generic.layer(0), &meta, 1, 0.125.into(), &mut ())?;
        crate::paged_attention(
            &crate::AttnOptions::default(),
            &mut b,
            &query,
            direct.layer(0),
            &meta,
            1,
            0.125,
        )?;
        assert_eq!(a, b);

        Cpu.copy_blocks(&mut generic, &[(1, 2)])?;
        Cpu.swap_out(&mut generic, &[(2, 1)])?;
        Cpu.swap_in(&mut generic, &[(1, 3)])?;
        assert_eq!(generic.read_key(0, 3 * 16 + 1, 0).ok(), direct.read_key(0, 17, 0).ok());
        // move_blocks: swap-out, swap-in, then copy, as one step plans them.
        let mut stepped = cache();
        crate::reshape_and_cache(&key, &value, &slots, stepped.layer_mut(0))?;
        Cpu.move_blocks(&mut stepped, &[(1, 0)], &[(0, 2)], &[(2, 3)])?;
        assert_eq!(stepped.read_key(0, 3 * 16 + 1, 0).ok(), direct.read_key(0, 17, 0).ok());
        assert_eq!(stepped.read_key(0, 2 * 16 + 2, 0).ok(), direct.read_key(0, 18, 0).ok());
        Cpu.move_blocks(&mut stepped, &[], &[], &[])?;
        // Errors are the CPU kernels' own.
        assert!(matches!(Cpu.copy_blocks(&mut generic, &[(9, 0)]), Err(AttnError::BlockOutOfRange { .. })));
        Ok(())
    }
}
