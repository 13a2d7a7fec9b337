// Cache maintenance kernels: write new keys/values into the paged cache, copy whole blocks.

// Scatter this step's keys and values (f32, [num_tokens, num_kv_heads, head_size] with a token
// stride) into the cache at slot_mapping[token]; a negative slot is padding and is skipped.
// Grid: num_tokens; 128 threads loop over kv_heads * head_size.
template <typename cache_t>
__device__ __forceinline__ void reshape_and_cache_body(
    const float* __restrict__ key, const float* __restrict__ value, cache_t* __restrict__ k_cache,
    cache_t* __restrict__ v_cache, const long long* __restrict__ slot_mapping, int num_kv_heads,
    int head_size, int block_size, long long key_stride, long long value_stride) {
  constexpr int X = CacheTraits<cache_t>::X;
  const long long token = blockIdx.x;
  const long long slot = slot_mapping[token];
  if (slot < 0) return;
  const long long blk = slot / block_size;
  const long long off = slot % block_size;
  const int n = num_kv_heads * head_size;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / head_size;
    const int d = i % head_size;
    const long long tile = (blk * num_kv_heads + h) * head_size;
    const long long k_idx = ((tile / X + d / X) * block_size + off) * X + d % X;
    const long long v_idx = (tile + d) * block_size + off;
    k_cache[k_idx] = CacheTraits<cache_t>::from_f32(key[token * key_stride + i]);
    v_cache[v_idx] = CacheTraits<cache_t>::from_f32(value[token * value_stride + i]);
  }
}

#define RESHAPE_AND_CACHE(TN, T)                                                           \
  extern "C" __global__ void reshape_and_cache_##TN(                                       \
      const float* __restrict__ key, const float* __restrict__ value,                      \
      T* __restrict__ k_cache, T* __restrict__ v_cache,                                    \
      const long long* __restrict__ slot_mapping, int num_kv_heads, int head_size,         \
      int block_size, long long key_stride, long long value_stride) {                      \
    reshape_and_cache_body<T>(key, value, k_cache, v_cache, slot_mapping, num_kv_heads,    \
                              head_size, block_size, key_stride, value_stride);            \
  }

// Copy-on-write: for every pair (grid.x: up to 2^31 - 1) and layer (grid.y), copy block mapping[2p] to
// mapping[2p+1] in both the key and the value cache. A block is `block_bytes` bytes (a multiple
// of 16: head sizes and block sizes make it so), copied as 16-byte vectors. Every index is 64-bit:
// `2 * pair` passes 2^31 past 2^30 pairs, and block × vectors per block passes it in a tensor
// over 32 GiB.
extern "C" __global__ void copy_blocks(const unsigned long long* __restrict__ key_ptrs,
                                       const unsigned long long* __restrict__ value_ptrs,
                                       const long long* __restrict__ mapping,
                                       long long block_bytes) {
  const long long pair = blockIdx.x;
  const int layer = blockIdx.y;
  const long long src = mapping[2 * pair];
  const long long dst = mapping[2 * pair + 1];
  const long long n = block_bytes / 16;
  uint4* k = reinterpret_cast<uint4*>(key_ptrs[layer]);
  uint4* v = reinterpret_cast<uint4*>(value_ptrs[layer]);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    k[dst * n + i] = k[src * n + i];
    v[dst * n + i] = v[src * n + i];
  }
}
