// Paged attention over vLLM's KV layout: the decode kernel (one thread block per query token;
// also serves any varlen batch when forced); the tiled prefill kernel is attention_prefill.cu (one thread block
// per tile of query rows of one sequence, K/V tiles staged in shared memory, online softmax).
//
// key cache   [num_blocks, num_kv_heads, HEAD / X, BS, X]   (X = 16 bytes of cache_t)
// value cache [num_blocks, num_kv_heads, HEAD, BS]
//
// One thread block (4 warps) serves one query token and QPK query heads that share one KV head
// (GQA), so each K/V byte is read once for the QPK heads. Grid: x = query tokens (x allows
// 2^31 - 1 blocks; y and z stop at 65 535), y = num_kv_heads * (G / QPK) head groups, z = context
// partitions (v2; v1 has one partition = the whole context). Query/output activations are f32, the cache is f32/f16/bf16, all math is f32.
//
// Q·K: a warp takes one cache block at a time; lane l loads 16-byte chunk (i * 32 + l) of the
// block's key tile, so a warp load is 512 contiguous bytes. Chunk j belongs to token j % BS and
// dim-chunk j / BS; the 32 / BS lanes of one token combine their partial dots with shuffles.
// Softmax: logits for the whole partition live in shared memory (max and sum by block reduction).
// P·V: warp w owns rows [w * HEAD / 4, (w + 1) * HEAD / 4) of the value tile and walks every block
// of the partition; again 16-byte chunks, contiguous per warp. Tokens past the context are
// zeroed before the multiply so NaN-poisoned padding never reaches the output.
//
// v2 (partition_size > 0) writes per-partition results normalised by the partition's own sum plus its max logit and
// exp-sum; `paged_attention_v2_reduce` merges them by log-sum-exp.
//
// Offsets into the cache, the activations and the v2 scratch are 64-bit (`long long`): a pool
// passes 2^31 elements at 2^31 / (HEAD * BS * kv heads) blocks, 131 072 blocks of 8 kv heads of
// 128 in blocks of 16. Block ids themselves are `int` (the host refuses pools of more than
// 2^31 - 1 blocks). gpu_check's far-offset case reads every tile past element 2^32.

#define PA_NUM_THREADS 128
#define PA_NUM_WARPS (PA_NUM_THREADS / WARP_SIZE)

// The query token's sequence and its causal context length (tokens it may attend to).
// Decode (query_start_loc == nullptr): token i is sequence i and sees seq_lens[i] tokens.
// Varlen: the query tokens of sequence s are [qsl[s], qsl[s+1]); they are the last ones of its
// seq_lens[s] tokens, so token t sees seq_lens[s] - (qsl[s+1] - t) + 1 tokens.
__device__ __forceinline__ void query_context(int token, const int* __restrict__ seq_lens,
                                              const int* __restrict__ query_start_loc,
                                              int num_seqs, int* seq, int* ctx) {
  if (query_start_loc == nullptr) {
    *seq = token;
    *ctx = seq_lens[token];
    return;
  }
  int lo = 0, hi = num_seqs - 1;  // largest s with qsl[s] <= token
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start_loc[mid] <= token) lo = mid; else hi = mid - 1;
  }
  *seq = lo;
  *ctx = seq_lens[lo] - (query_start_loc[lo + 1] - token) + 1;
}

// Whether sequence `seq` of a varlen batch has more than one query token (the tiled kernel's).
__device__ __forceinline__ bool is_prefill_seq(int seq, const int* __restrict__ query_start_loc) {
  return query_start_loc != nullptr && query_start_loc[seq + 1] - query_start_loc[seq] > 1;
}

// Dynamic shared memory (floats): 2 * PA_NUM_WARPS * QPK reduction scratch, QPK * HEAD query,
// QPK * LEN logits where LEN = the partition length rounded up to whole blocks. The host computes
// the same size (kernels::cuda::launch::shared_bytes).
template <typename cache_t, int HEAD, int BS, int QPK>
__device__ __forceinline__ void paged_attention_body(
    float* __restrict__ out,         // v1: [tokens, heads, HEAD]; v2: [tokens, heads, max_parts, HEAD]
    float* __restrict__ exp_sums,    // v2: [tokens, heads, max_parts]
    float* __restrict__ max_logits,  // v2: [tokens, heads, max_parts]
    const float* __restrict__ q,     // [tokens, heads, HEAD]
    const cache_t* __restrict__ k_cache, const cache_t* __restrict__ v_cache,
    const int* __restrict__ block_tables, int max_blocks_per_seq, const int* __restrict__ seq_rows,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, int num_seqs,
    int num_heads, int num_kv_heads, float scale, int max_parts, int partition_size,
    int token_offset, int skip_prefill, int window) {
  constexpr int X = CacheTraits<cache_t>::X;
  static_assert(BS <= WARP_SIZE && WARP_SIZE % BS == 0, "block size must divide the warp");
  static_assert(BS % X == 0, "a value row of a block must be whole 16-byte chunks");
  static_assert(HEAD % X == 0 && HEAD % PA_NUM_WARPS == 0, "head size");
  constexpr int TPT = WARP_SIZE / BS;        // lanes per key token
  constexpr int KCHUNKS = HEAD / X;          // 16-byte chunks per key token
  constexpr int K_ITERS = (KCHUNKS + TPT - 1) / TPT;
  constexpr int CPR = BS / X;                // 16-byte chunks per value row of a block
  constexpr int ROWS = HEAD / PA_NUM_WARPS;  // value rows per warp
  constexpr int WCH = ROWS * CPR;            // value chunks per warp per block
  constexpr int V_ITERS = (WCH + WARP_SIZE - 1) / WARP_SIZE;
  constexpr int K_BATCH = K_ITERS < 8 ? K_ITERS : 8;  // 16-byte key loads in flight per lane
  constexpr int V_BATCH = V_ITERS < 4 ? V_ITERS : 4;  // 16-byte value loads in flight per lane

  // A launch covers query tokens token_offset.. (the host splits v2 batches so that the
  // per-partition scratch, indexed by the launch's own token `slot`, stays bounded). v1
  // launches always start at token 0, so `slot` also indexes v1's `out` (one fewer register).
  const int token = blockIdx.x + token_offset;
  const int slot = blockIdx.x;
  const int part = blockIdx.z;
  const int group = num_heads / num_kv_heads;
  const int groups_per_kv = group / QPK;
  const int kv_head = blockIdx.y / groups_per_kv;
  const int head0 = kv_head * group + (blockIdx.y % groups_per_kv) * QPK;
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;

  int seq, ctx;
  query_context(token, seq_lens, query_start_loc, num_seqs, &seq, &ctx);
  // A mixed batch: the tiled prefill kernel writes the rows of sequences of more than one query
  // token, this launch only the decode tokens (uniform per block: before any barrier).
  if (skip_prefill && is_prefill_seq(seq, query_start_loc)) return;
  const bool split = partition_size > 0;  // v2: this block is one partition of the context
  const int part_start = split ? part * partition_size : 0;
  if (ctx <= part_start) {
    // v2: the reduce kernel never reads partitions past the context.
    if (!split) {
      for (int i = threadIdx.x; i < QPK * HEAD; i += PA_NUM_THREADS)
        out[((long long)token * num_heads + head0 + i / HEAD) * HEAD + i % HEAD] = 0.f;
    }
    return;
  }
  const int end = split ? min(part_start + partition_size, ctx) : ctx;
  // A sliding window: the query (at ctx - 1) sees keys ctx - window ..; blocks wholly before
  // are not read. A v2 partition wholly before the window weighs nothing in the merge.
  const int lo = window > 0 ? max(0, ctx - window) : 0;
  if (end <= lo) {
    for (int i = threadIdx.x; i < QPK * HEAD; i += PA_NUM_THREADS)
      out[(((long long)slot * num_heads + head0 + i / HEAD) * max_parts + part) * HEAD + i % HEAD] = 0.f;
    if (threadIdx.x < QPK) {
      const long long idx = ((long long)slot * num_heads + head0 + threadIdx.x) * max_parts + part;
      max_logits[idx] = NEG_INF;
      exp_sums[idx] = 0.f;
    }
    return;
  }
  const int start = max(part_start, lo);
  const int start_blk = start / BS;
  const int end_blk = (end + BS - 1) / BS;
  const int len = (end_blk - start_blk) * BS;

  extern __shared__ float smem[];
  float* red_max = smem;
  float* red_sum = smem + PA_NUM_WARPS * QPK;
  float* q_s = smem + 2 * PA_NUM_WARPS * QPK;
  float* logits = q_s + QPK * HEAD;

  // The first key in the window, read back after the key loop: kept in a register across it,
  // it would spill the widest instantiations.
  __shared__ int window_start;
  if (threadIdx.x == 0) window_start = start;
  for (int i = threadIdx.x; i < QPK * HEAD; i += PA_NUM_THREADS)
    q_s[i] = q[((long long)token * num_heads + head0 + i / HEAD) * HEAD + i % HEAD] * scale;
  __syncthreads();

  const long long tile = (long long)HEAD * BS;  // elements of one (block, kv head) tile
  const long long block_stride = tile * num_kv_heads;
  // The sequence's row of the (persistent, padded) table.
  const int* __restrict__ table = block_tables + (long long)seq_rows[seq] * max_blocks_per_seq;

  // ---- Q·K ----
  const int t_in_blk = lane % BS;
  const int c0 = lane / BS;
  // Keys of the first block before the window (0 without one): a predicate per lane, so the
  // window costs the key loop no register.
  const bool lane_in_window = t_in_blk >= start - start_blk * BS;
  float qk_max[QPK];
#pragma unroll
  for (int g = 0; g < QPK; ++g) qk_max[g] = NEG_INF;
  for (int b = start_blk + warp; b < end_blk; b += PA_NUM_WARPS) {
    const long long phys = table[b];
    const uint4* kb = reinterpret_cast<const uint4*>(k_cache + phys * block_stride + kv_head * tile);
    float acc[QPK];
#pragma unroll
    for (int g = 0; g < QPK; ++g) acc[g] = 0.f;
    // Loads go out K_BATCH at a time: enough in flight, bounded registers for wide heads.
#pragma unroll 1
    for (int i0 = 0; i0 < K_ITERS; i0 += K_BATCH) {
      uint4 raw[K_BATCH];
#pragma unroll
      for (int ii = 0; ii < K_BATCH; ++ii) {
        const int i = i0 + ii;
        if ((K_ITERS % K_BATCH == 0 || i < K_ITERS) && (KCHUNKS % TPT == 0 || c0 + i * TPT < KCHUNKS))
          raw[ii] = kb[i * WARP_SIZE + lane];
      }
#pragma unroll
      for (int ii = 0; ii < K_BATCH; ++ii) {
        const int i = i0 + ii;
        const int c = c0 + i * TPT;
        if ((K_ITERS % K_BATCH == 0 || i < K_ITERS) && (KCHUNKS % TPT == 0 || c < KCHUNKS)) {
          float kf[X];
          CacheTraits<cache_t>::load16(raw[ii], kf);
#pragma unroll
          for (int g = 0; g < QPK; ++g) {
            const float* qs = q_s + g * HEAD + c * X;
#pragma unroll
            for (int e = 0; e < X; ++e) acc[g] = fmaf(qs[e], kf[e], acc[g]);
          }
        }
      }
    }
#pragma unroll
    for (int m = BS; m < WARP_SIZE; m <<= 1) {
#pragma unroll
      for (int g = 0; g < QPK; ++g) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], m);
    }
    const int t = b * BS + t_in_blk;
    if (c0 == 0) {
#pragma unroll
      for (int g = 0; g < QPK; ++g) {
        const float v = t < end && (b != start_blk || lane_in_window) ? acc[g] : NEG_INF;
        logits[g * len + (t - start_blk * BS)] = v;
        qk_max[g] = fmaxf(qk_max[g], v);
      }
    }
  }

  // ---- softmax over the partition ----
#pragma unroll
  for (int g = 0; g < QPK; ++g) {
    const float m = warp_max(qk_max[g]);
    if (lane == 0) red_max[warp * QPK + g] = m;
  }
  __syncthreads();
  float row_max[QPK];
#pragma unroll
  for (int g = 0; g < QPK; ++g) {
    float m = NEG_INF;
#pragma unroll
    for (int w = 0; w < PA_NUM_WARPS; ++w) m = fmaxf(m, red_max[w * QPK + g]);
    row_max[g] = m;
  }
  float row_sum[QPK];
#pragma unroll
  for (int g = 0; g < QPK; ++g) row_sum[g] = 0.f;
  for (int i = threadIdx.x; i < len; i += PA_NUM_THREADS) {
    const bool valid = start_blk * BS + i < end && start_blk * BS + i >= window_start;
#pragma unroll
    for (int g = 0; g < QPK; ++g) {
      const float e = valid ? __expf(logits[g * len + i] - row_max[g]) : 0.f;
      logits[g * len + i] = e;
      row_sum[g] += e;
    }
  }
#pragma unroll
  for (int g = 0; g < QPK; ++g) {
    const float s = warp_sum(row_sum[g]);
    if (lane == 0) red_sum[warp * QPK + g] = s;
  }
  __syncthreads();
  float inv_sum[QPK];
#pragma unroll
  for (int g = 0; g < QPK; ++g) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < PA_NUM_WARPS; ++w) s += red_sum[w * QPK + g];
    inv_sum[g] = 1.f / s;  // s >= 1: the max logit contributes exp(0)
    if (split && threadIdx.x == 0) {
      const long long idx = ((long long)slot * num_heads + head0 + g) * max_parts + part;
      max_logits[idx] = row_max[g];
      exp_sums[idx] = s;
    }
  }

  // ---- P·V ----
  float vacc[V_ITERS][QPK];
#pragma unroll
  for (int i = 0; i < V_ITERS; ++i)
#pragma unroll
    for (int g = 0; g < QPK; ++g) vacc[i][g] = 0.f;
  for (int b = start_blk; b < end_blk; ++b) {
    const long long phys = table[b];
    const uint4* vb =
        reinterpret_cast<const uint4*>(v_cache + phys * block_stride + kv_head * tile) + warp * WCH;
    // Keys before `start` in its block are written tokens: their weights are 0, no mask needed.
    const bool partial = (b + 1) * BS > end;
    const float* p = logits + (b - start_blk) * BS;
#pragma unroll
    for (int i0 = 0; i0 < V_ITERS; i0 += V_BATCH) {
      uint4 raw[V_BATCH];
#pragma unroll
      for (int ii = 0; ii < V_BATCH; ++ii) {
        const int i = i0 + ii;
        if ((V_ITERS % V_BATCH == 0 || i < V_ITERS) && (WCH % WARP_SIZE == 0 || i * WARP_SIZE + lane < WCH))
          raw[ii] = vb[i * WARP_SIZE + lane];
      }
#pragma unroll
      for (int ii = 0; ii < V_BATCH; ++ii) {
        const int i = i0 + ii;
        const int j = i * WARP_SIZE + lane;
        if ((V_ITERS % V_BATCH == 0 || i < V_ITERS) && (WCH % WARP_SIZE == 0 || j < WCH)) {
          const int t0 = (j % CPR) * X;
          float vf[X];
          CacheTraits<cache_t>::load16(raw[ii], vf);
          if (partial) {
#pragma unroll
            for (int e = 0; e < X; ++e)
              if (b * BS + t0 + e >= end) vf[e] = 0.f;
          }
#pragma unroll
          for (int g = 0; g < QPK; ++g) {
#pragma unroll
            for (int e = 0; e < X; ++e) vacc[i][g] = fmaf(p[g * len + t0 + e], vf[e], vacc[i][g]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V_ITERS; ++i) {
#pragma unroll
    for (int m = 1; m < CPR; m <<= 1) {
#pragma unroll
      for (int g = 0; g < QPK; ++g) vacc[i][g] += __shfl_xor_sync(0xffffffffu, vacc[i][g], m);
    }
    const int j = i * WARP_SIZE + lane;
    if ((WCH % WARP_SIZE == 0 || j < WCH) && j % CPR == 0) {
      const int row = warp * ROWS + j / CPR;
#pragma unroll
      for (int g = 0; g < QPK; ++g) {
        const long long head_idx = (long long)slot * num_heads + head0 + g;
        const long long o = split ? (head_idx * max_parts + part) * HEAD + row : head_idx * HEAD + row;
        out[o] = vacc[i][g] * inv_sum[g];
      }
    }
  }
}

#define PA_PARAMS(T)                                                                       \
  float *__restrict__ out, float *__restrict__ exp_sums, float *__restrict__ max_logits,   \
      const float *__restrict__ q, const T *__restrict__ k_cache,                          \
      const T *__restrict__ v_cache, const int *__restrict__ block_tables,                 \
      int max_blocks_per_seq, const int *__restrict__ seq_rows,                            \
      const int *__restrict__ seq_lens,                                                    \
      const int *__restrict__ query_start_loc, int num_seqs, int num_heads,                \
      int num_kv_heads, float scale, int max_parts, int partition_size, int token_offset,   \
      int skip_prefill, int window
#define PA_ARGS                                                                            \
  out, exp_sums, max_logits, q, k_cache, v_cache, block_tables, max_blocks_per_seq,        \
      seq_rows, seq_lens, query_start_loc, num_seqs, num_heads, num_kv_heads, scale, max_parts, \
      partition_size, token_offset, skip_prefill, window

// One kernel for both decode variants: v1 (partition_size == 0: the whole context in one block,
// grid.z == 1) and v2 (partition_size > 0: grid.z partitions, merged by
// paged_attention_v2_reduce). The split is a uniform runtime branch, so one instantiation serves
// both and the compile check stays affordable.
#define PAGED_ATTENTION(TN, T, HEAD, BS, QPK)                                              \
  extern "C" __global__ void __launch_bounds__(PA_NUM_THREADS, 4)                          \
      paged_attention_##TN##_h##HEAD##_b##BS##_g##QPK(PA_PARAMS(T)) {                       \
    paged_attention_body<T, HEAD, BS, QPK>(PA_ARGS);                                       \
  }

// Merge the partitions of one (query token, head): grid (tokens of the launch, num_heads), 128
// threads, dynamic shared memory = max_parts floats. Query token = blockIdx.x + token_offset;
// the scratch is indexed by blockIdx.x, as the attention launch of the same tokens wrote it.
extern "C" __global__ void __launch_bounds__(PA_NUM_THREADS, 4) paged_attention_v2_reduce(
    float* __restrict__ out, const float* __restrict__ exp_sums,
    const float* __restrict__ max_logits, const float* __restrict__ tmp_out,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, int num_seqs,
    int num_heads, int head_size, int max_parts, int partition_size, int token_offset,
    int skip_prefill) {
  const int token = blockIdx.x + token_offset;
  const int head = blockIdx.y;
  int seq, ctx;
  query_context(token, seq_lens, query_start_loc, num_seqs, &seq, &ctx);
  if (skip_prefill && is_prefill_seq(seq, query_start_loc)) return;
  float* o = out + ((long long)token * num_heads + head) * head_size;
  const long long head_idx = (long long)blockIdx.x * num_heads + head;  // in the scratch
  const int parts = ctx > 0 ? min((ctx + partition_size - 1) / partition_size, max_parts) : 0;
  if (parts == 0) {
    for (int d = threadIdx.x; d < head_size; d += PA_NUM_THREADS) o[d] = 0.f;
    return;
  }
  const float* tmp = tmp_out + head_idx * max_parts * head_size;
  if (parts == 1) {
    for (int d = threadIdx.x; d < head_size; d += PA_NUM_THREADS) o[d] = tmp[d];
    return;
  }
  extern __shared__ float weights[];
  __shared__ float scratch[PA_NUM_WARPS];
  const float* ml = max_logits + head_idx * max_parts;
  const float* es = exp_sums + head_idx * max_parts;
  float m = NEG_INF;
  for (int p = threadIdx.x; p < parts; p += PA_NUM_THREADS) m = fmaxf(m, ml[p]);
  m = warp_max(m);
  if (threadIdx.x % WARP_SIZE == 0) scratch[threadIdx.x / WARP_SIZE] = m;
  __syncthreads();
  float gmax = NEG_INF;
  for (int w = 0; w < PA_NUM_WARPS; ++w) gmax = fmaxf(gmax, scratch[w]);
  float local = 0.f;
  for (int p = threadIdx.x; p < parts; p += PA_NUM_THREADS) {
    const float w = es[p] * __expf(ml[p] - gmax);
    weights[p] = w;
    local += w;
  }
  const float total = block_sum(local, scratch);  // syncs, so `weights` is visible after it
  const float inv = 1.f / total;
  for (int d = threadIdx.x; d < head_size; d += PA_NUM_THREADS) {
    float acc = 0.f;
    for (int p = 0; p < parts; ++p) acc = fmaf(weights[p], tmp[(long long)p * head_size + d], acc);
    o[d] = acc * inv;
  }
}
