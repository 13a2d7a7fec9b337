// Shared device helpers for the attention and model kernels: cache element traits
// (16-byte vector loads converted to f32), warp/block reductions, constants.
//
// NVRTC sees this file as a prefix of every program (the Rust side concatenates it),
// so there is no #include of it; only the toolkit's own fp16/bf16 headers are included.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define WARP_SIZE 32
#define NEG_INF __int_as_float(0xff800000)

// One cache element type: X = elements per 16 bytes (vLLM's `x`), and the conversions.
template <typename T> struct CacheTraits;

template <> struct CacheTraits<float> {
  static constexpr int X = 4;
  __device__ __forceinline__ static void load16(const uint4& r, float* f) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  }
  __device__ __forceinline__ static float to_f32(float v) { return v; }
  __device__ __forceinline__ static float from_f32(float v) { return v; }
};

template <> struct CacheTraits<__half> {
  static constexpr int X = 8;
  __device__ __forceinline__ static void load16(const uint4& r, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __half22float2(h[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
  __device__ __forceinline__ static float to_f32(__half v) { return __half2float(v); }
  __device__ __forceinline__ static __half from_f32(float v) { return __float2half_rn(v); }
};

template <> struct CacheTraits<__nv_bfloat16> {
  static constexpr int X = 8;
  __device__ __forceinline__ static void load16(const uint4& r, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(h[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
  __device__ __forceinline__ static float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 from_f32(float v) { return __float2bfloat16_rn(v); }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Sum over the whole thread block; `scratch` holds one float per warp. All threads get the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int num_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}
