//! The model's weights on the device, uploaded once from the loaded model in bf16 or f16 (stored
//! as raw 16-bit words: cuBLAS and the kernels read them by dtype, and one buffer type serves
//! both). Norm weights and biases travel in the same half type; a tied LM head reuses the
//! embedding buffer.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use kv_cache::DType;
use quant_kernels::quant::Weight;
use rayon::prelude::*;

use super::error::CudaModelError;
use crate::arch::{LayerMatrix, RopeStyle};
use crate::decoder::{LayerWeight, LayerWeights, Model};
use crate::gguf::unpermute_qk;

/// f32 values as the bits of `dtype` (bf16 or f16), round to nearest even; in parallel chunks
/// (this runs once per weight over up to gigabytes).
pub fn to_half_bits(values: &[f32], dtype: DType) -> Result<Vec<u16>, CudaModelError> {
    fn convert(values: &[f32], bits: impl Fn(f32) -> u16 + Sync) -> Vec<u16> {
        values.par_iter().with_min_len(1 << 16).map(|&v| bits(v)).collect()
    }
    match dtype {
        DType::BF16 => Ok(convert(values, |v| bf16::from_f32(v).to_bits())),
        DType::F16 => Ok(convert(values, |v| f16::from_f32(v).to_bits())),
        other => Err(CudaModelError::Unsupported(format!("{other} weights on the GPU (use bf16 or f16)"))),
    }
}

/// One decoder layer on the device (same fused row order as on the host).
pub type DeviceLayer = LayerWeights<CudaSlice<u16>>;

/// Every weight of the model on the device.
#[derive(Debug)]
pub struct DeviceWeights {
    pub embed: CudaSlice<u16>,
    pub layers: Vec<DeviceLayer>,
    pub final_norm: CudaSlice<u16>,
    /// `None` when tied to `embed`.
    pub lm_head: Option<CudaSlice<u16>>,
}

impl DeviceWeights {
    /// Converts and uploads every weight of `model`.
    pub fn upload(model: &Model, stream: &Arc<CudaStream>, dtype: DType) -> Result<Self, CudaModelError> {
        // Quantized host weights are dequantized on the way (the GPU path computes in bf16/f16).
        let up_dense = |v: &[f32]| -> Result<CudaSlice<u16>, CudaModelError> {
            Ok(stream.clone_htod(&to_half_bits(v, dtype)?)?)
        };
        let up = |w: &Weight| up_dense(&w.to_f32());
        let interleaved = model.config.arch.rope_style == RopeStyle::Interleaved;
        let layers = model
            .layers
            .iter()
            .map(|l| {
                l.try_map(|w, which| match which {
                    // The CUDA kernels rotate halves: Q/K rows (and their biases) go up in HF order.
                    LayerWeight::Matrix(LayerMatrix::Qkv) | LayerWeight::Bias(LayerMatrix::Qkv)
                        if interleaved =>
                    {
                        up_dense(&qkv_rotate_half(model, w))
                    }
                    _ => up(w),
                })
            })
            .collect::<Result<Vec<_>, CudaModelError>>()?;
        Ok(DeviceWeights {
            embed: up(&model.embed)?,
            layers,
            final_norm: up(&model.final_norm)?,
            lm_head: model.lm_head.as_ref().map(up).transpose()?,
        })
    }

    /// The LM head `[vocab, hidden]`.
    pub fn lm_head(&self) -> &CudaSlice<u16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Device bytes of all weights.
    pub fn bytes(&self) -> usize {
        let layer: usize = self.layers.iter().flat_map(|l| l.all()).map(CudaSlice::len).sum();
        2 * (layer + self.embed.len() + self.final_norm.len() + self.lm_head.as_ref().map_or(0, |h| h.len()))
    }
}

/// A GGUF's fused Q/K/V (a matrix or its bias row), dequantized, with the Q and K rows of every
/// head put back in HF (rotate-half) order.
fn qkv_rotate_half(model: &Model, qkv: &Weight) -> Vec<f32> {
    let c = &model.config;
    let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
    let h = qkv.len() / c.qkv_size().max(1);
    let dense = qkv.to_f32();
    let mut rows = unpermute_qk(&dense[..q * h], c.num_attention_heads, h);
    rows.extend(unpermute_qk(&dense[q * h..(q + kv) * h], c.num_key_value_heads, h));
    rows.extend_from_slice(&dense[(q + kv) * h..]);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_bits_round_to_nearest() {
        let v = [1.0f32, -2.5, 1.0 + 1.0 / 512.0, 65504.0];
        let b = to_half_bits(&v, DType::BF16).unwrap_or_default();
        assert_eq!(b[0], 0x3f80);
        assert_eq!(bf16::from_bits(b[1]).to_f32(), -2.5);
        // bf16 steps by 2^-7 above 1: 1 + 2^-9 is nearer to 1.
        assert_eq!(bf16::from_bits(b[2]).to_f32(), 1.0);
        let h = to_half_bits(&v, DType::F16).unwrap_or_default();
        assert_eq!(f16::from_bits(h[3]).to_f32(), 65504.0);
        assert!(to_half_bits(&v, DType::F32).is_err());
    }
}
