// Small element-wise and row kernels of the decoder forward on CUDA (the GEMMs are cuBLAS):
// embedding gather, RMSNorm (also from the f32 residual stream, plain or Gemma's 1 + w), rotary
// embedding (HF rotate-half), per-head RMSNorm of Q/K, gated activations (SiLU or tanh-GELU
// times up), bias and residual adds, logit soft-capping, casts.
// T is the activation type (float, __half or __nv_bfloat16); all arithmetic is f32.

// out[n, hidden] = table[ids[n], :]. Grid: tokens; any block size.
template <typename T>
__device__ __forceinline__ void embedding_body(T* __restrict__ out, const T* __restrict__ table,
                                               const unsigned int* __restrict__ ids, int hidden) {
  const long long row = blockIdx.x;
  const T* src = table + (long long)ids[row] * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[row * hidden + i] = src[i];
}

// out = x / sqrt(mean(x^2) + eps) * weight, per row. Grid: rows; block size a multiple of 32.
template <typename T>
__device__ __forceinline__ void rms_norm_body(T* __restrict__ out, const T* __restrict__ x,
                                              const T* __restrict__ weight, float eps, int hidden) {
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const T* xr = x + row * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = CacheTraits<T>::to_f32(xr[i]);
    ss = fmaf(v, v, ss);
  }
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = CacheTraits<T>::to_f32(xr[i]) * inv * CacheTraits<T>::to_f32(weight[i]);
    out[row * hidden + i] = CacheTraits<T>::from_f32(v);
  }
}

// HF rotate-half rotary embedding, in place on q [n, num_heads, head] and k [n, num_kv_heads,
// head] (token strides given). cos_sin: f32 [max_pos, head] = cos of the head/2 frequencies, then
// their sin (the host builds it, so any RoPE scaling lives there). Grid: tokens.
template <typename T>
__device__ __forceinline__ void rotary_body(T* __restrict__ q, T* __restrict__ k,
                                            const float* __restrict__ cos_sin,
                                            const long long* __restrict__ positions, int num_heads,
                                            int num_kv_heads, int head_size, long long q_stride,
                                            long long k_stride) {
  const long long token = blockIdx.x;
  const int half = head_size / 2;
  const float* cs = cos_sin + positions[token] * head_size;
  const int total = (num_heads + num_kv_heads) * half;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int h = i / half;
    const int r = i % half;
    T* base = h < num_heads ? q + token * q_stride + (long long)h * head_size
                            : k + token * k_stride + (long long)(h - num_heads) * head_size;
    const float c = cs[r];
    const float s = cs[half + r];
    const float x1 = CacheTraits<T>::to_f32(base[r]);
    const float x2 = CacheTraits<T>::to_f32(base[r + half]);
    base[r] = CacheTraits<T>::from_f32(x1 * c - x2 * s);
    base[r + half] = CacheTraits<T>::from_f32(x2 * c + x1 * s);
  }
}

// out[n, inter] = act(gate[n, :]) * up[n, :] with act SiLU or (GELU) tanh-approximated GELU
// (0.5·g·(1 + tanh(z)) = g / (1 + e^(-2z))); row strides given so a fused gate_up output works.
// Grid: rows.
template <typename T, bool GELU>
__device__ __forceinline__ void gated_body(T* __restrict__ out, const T* __restrict__ gate,
                                           const T* __restrict__ up, int inter,
                                           long long in_stride) {
  const long long row = blockIdx.x;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = CacheTraits<T>::to_f32(gate[row * in_stride + i]);
    const float u = CacheTraits<T>::to_f32(up[row * in_stride + i]);
    const float z = GELU ? 1.5957691216f * (g + 0.044715f * g * g * g) : g;
    out[row * inter + i] = CacheTraits<T>::from_f32(g / (1.f + __expf(-z)) * u);
  }
}

// out[i] (f32) += x[i] (T): a normed branch joining the f32 residual stream. Grid-stride loop.
template <typename T>
__device__ __forceinline__ void add_into_f32_body(float* __restrict__ out, const T* __restrict__ x,
                                                  long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] += CacheTraits<T>::to_f32(x[i]);
}

// RMSNorm of every head of f32 rows in place (Q or K before the rotation): x[r, :] =
// rmsnorm(x[r, :]) * (offset + weight) over rows of head_size, weight in T. Each thread rewrites
// only the elements it read before the block's sum, so in place is safe. Grid: tokens · heads;
// block size a multiple of 32.
template <typename T>
__device__ __forceinline__ void rms_norm_heads_body(float* __restrict__ x, const T* __restrict__ weight,
                                                    float offset, float eps, int head_size) {
  __shared__ float scratch[32];
  float* xr = x + (long long)blockIdx.x * head_size;
  float ss = 0.f;
  for (int i = threadIdx.x; i < head_size; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / head_size + eps);
  for (int i = threadIdx.x; i < head_size; i += blockDim.x)
    xr[i] = xr[i] * inv * (offset + CacheTraits<T>::to_f32(weight[i]));
}

// out[r, :] (f32) += bias (T), per row. Grid: rows.
template <typename T>
__device__ __forceinline__ void add_bias_body(float* __restrict__ out, const T* __restrict__ bias,
                                              int width) {
  const long long row = blockIdx.x;
  for (int i = threadIdx.x; i < width; i += blockDim.x)
    out[row * width + i] += CacheTraits<T>::to_f32(bias[i]);
}

// out[i] = a[i] + b[i]; out may alias a. Grid-stride loop.
template <typename T>
__device__ __forceinline__ void add_body(T* out, const T* a, const T* b, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = CacheTraits<T>::from_f32(CacheTraits<T>::to_f32(a[i]) + CacheTraits<T>::to_f32(b[i]));
}

template <typename S, typename D>
__device__ __forceinline__ void cast_body(D* __restrict__ out, const S* __restrict__ in, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = CacheTraits<D>::from_f32(CacheTraits<S>::to_f32(in[i]));
}

// The forward keeps the residual stream in f32 and feeds the GEMMs T: out[r, :] (T) =
// rmsnorm(x[src, :]) * (offset + weight) with src = rows[r] (the sampled rows before the LM
// head) or r when rows is null. Grid: output rows; block size a multiple of 32.
template <typename T>
__device__ __forceinline__ void rms_norm_f32_body(T* __restrict__ out, const float* __restrict__ x,
                                                  const T* __restrict__ weight,
                                                  const int* __restrict__ rows, float offset,
                                                  float eps, int hidden) {
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const long long src = rows == nullptr ? row : (long long)rows[row];
  const float* xr = x + src * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    out[row * hidden + i] =
        CacheTraits<T>::from_f32(xr[i] * inv * (offset + CacheTraits<T>::to_f32(weight[i])));
}

// out[n, hidden] (f32 residual stream) = table[ids[n], :] * scale. Grid: tokens.
template <typename T>
__device__ __forceinline__ void embedding_f32_body(float* __restrict__ out, const T* __restrict__ table,
                                                   const unsigned int* __restrict__ ids, float scale,
                                                   int hidden) {
  const long long row = blockIdx.x;
  const T* src = table + (long long)ids[row] * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    out[row * hidden + i] = CacheTraits<T>::to_f32(src[i]) * scale;
}

// x[i] = cap * tanh(x[i] / cap) over f32 logits. Grid-stride loop.
extern "C" __global__ void softcap_f32(float* __restrict__ x, float cap, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

// Greedy sampling on the device: out[r] = the first index of the largest value of row r of the
// f32 logits [rows, vocab] (NaN never wins; a row with no value above -inf gives 0xFFFFFFFF),
// exactly the host sampler's argmax. Grid: rows; ARGMAX_THREADS threads (a power of two).
#define ARGMAX_THREADS 256
extern "C" __global__ void argmax_rows_f32(unsigned int* __restrict__ out,
                                           const float* __restrict__ logits, long long vocab) {
  __shared__ float best_v[ARGMAX_THREADS];
  __shared__ long long best_i[ARGMAX_THREADS];
  const float* row = logits + (long long)blockIdx.x * vocab;
  float v = NEG_INF;
  long long idx = vocab;
  // Each thread scans its indices in increasing order: only a strictly larger value moves it.
  for (long long i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = row[i];
    if (x > v) {
      v = x;
      idx = i;
    }
  }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const long long oi = best_i[threadIdx.x + stride];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0)
    out[blockIdx.x] = best_v[0] == NEG_INF ? 0xFFFFFFFFu : (unsigned int)best_i[0];
}

#define MODEL_KERNELS(TN, T)                                                               \
  extern "C" __global__ void embedding_##TN(T* out, const T* table, const unsigned int* ids, \
                                            int hidden) {                                  \
    embedding_body<T>(out, table, ids, hidden);                                            \
  }                                                                                        \
  extern "C" __global__ void rms_norm_##TN(T* out, const T* x, const T* weight, float eps, \
                                           int hidden) {                                   \
    rms_norm_body<T>(out, x, weight, eps, hidden);                                         \
  }                                                                                        \
  extern "C" __global__ void rotary_##TN(T* q, T* k, const float* cos_sin,                 \
                                         const long long* positions, int num_heads,        \
                                         int num_kv_heads, int head_size,                  \
                                         long long q_stride, long long k_stride) {         \
    rotary_body<T>(q, k, cos_sin, positions, num_heads, num_kv_heads, head_size, q_stride, \
                   k_stride);                                                              \
  }                                                                                        \
  extern "C" __global__ void silu_mul_##TN(T* out, const T* gate, const T* up, int inter,  \
                                           long long in_stride) {                          \
    gated_body<T, false>(out, gate, up, inter, in_stride);                                 \
  }                                                                                        \
  extern "C" __global__ void gelu_tanh_mul_##TN(T* out, const T* gate, const T* up,        \
                                                int inter, long long in_stride) {          \
    gated_body<T, true>(out, gate, up, inter, in_stride);                                  \
  }                                                                                        \
  extern "C" __global__ void add_bias_f32out_##TN(float* out, const T* bias, int width) {  \
    add_bias_body<T>(out, bias, width);                                                    \
  }                                                                                        \
  extern "C" __global__ void add_into_f32_##TN(float* out, const T* x, long long n) {      \
    add_into_f32_body<T>(out, x, n);                                                       \
  }                                                                                        \
  extern "C" __global__ void rms_norm_heads_f32_##TN(float* x, const T* weight,            \
                                                     float offset, float eps,              \
                                                     int head_size) {                      \
    rms_norm_heads_body<T>(x, weight, offset, eps, head_size);                             \
  }                                                                                        \
  extern "C" __global__ void add_##TN(T* out, const T* a, const T* b, long long n) {       \
    add_body<T>(out, a, b, n);                                                             \
  }                                                                                        \
  extern "C" __global__ void rms_norm_f32in_##TN(T* out, const float* x, const T* weight,  \
                                                 const int* rows, float offset, float eps, \
                                                 int hidden) {                             \
    rms_norm_f32_body<T>(out, x, weight, rows, offset, eps, hidden);                       \
  }                                                                                        \
  extern "C" __global__ void embedding_f32out_##TN(float* out, const T* table,             \
                                                   const unsigned int* ids, float scale,   \
                                                   int hidden) {                           \
    embedding_f32_body<T>(out, table, ids, scale, hidden);                                 \
  }

#define CAST_KERNEL(SN, S, DN, D)                                                          \
  extern "C" __global__ void cast_##SN##_to_##DN(D* out, const S* in, long long n) {       \
    cast_body<S, D>(out, in, n);                                                           \
  }
