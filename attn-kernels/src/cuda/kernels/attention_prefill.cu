// The tiled prefill kernel of paged attention (FlashAttention-style, CUDA cores, f32 math),
// compiled after attention.cu (its query-row helpers).
//
// One thread block (PF_NUM_THREADS threads) serves one tile of one sequence's query rows for one
// KV head: PF_ROWS rows = up to `tile_tokens` consecutive query tokens x `tile_heads` query heads
// of the KV head's GQA group (row r is token tok0 + r / tile_heads, head chunk_head0 + r %
// tile_heads). Grid: x = tiles (the host's list `tiles`, pairs (sequence, first query token of
// the sequence), longest causal work first; x allows 2^31 - 1), y = num_kv_heads * head chunks
// (ceil(group / tile_heads) <= 65 535, checked on the host).
//
// The block walks the keys its rows may see, 0 .. position of its last token, PF_KEYS at a time
// (whole cache blocks: PF_KEYS is a multiple of every block size), so causal tiles past the
// tile's last row are never visited. Per key tile: the K tile is converted to f32 into shared
// memory as [key][HEAD + 1] (padded: conflict-free column reads), the V tile transposed to
// [key][HEAD]; keys past the sequence are written as 0 and never loaded (their blocks may not
// exist; in tests they hold NaN). Then thread (row r, lane-in-row sub) computes the scores of
// keys sub + PF_TPR * j against the scaled query row in shared memory, masks keys past the row's
// position or the sequence to -inf, and runs the online softmax: row max and sum combined over
// the PF_TPR threads of the row by shuffles, the accumulator rescaled by exp(m_old - m_new),
// probabilities to shared memory, then acc[i] += p * V[key][sub + PF_TPR * i]. Each thread
// keeps HEAD / PF_TPR output dims of its row in registers; the row's sum divides them at the end.
//
// Dynamic shared memory (floats, mirrored by kernels::cuda::ops::PrefillPlan::shared_bytes):
// PF_ROWS * (HEAD + 1) queries + PF_KEYS * (HEAD + 1) keys + PF_KEYS * HEAD values +
// PF_ROWS * (PF_KEYS + 1) probabilities: 29 KB at HEAD 64, 53 KB at 128 (the opt-in path),
// 84 KB at 256 (16 rows). Offsets are 64-bit like the decode kernel's.

#define PF_NUM_THREADS 128
#define PF_KEYS 32

template <int HEAD> struct PrefillShape {
  static constexpr int ROWS = HEAD > 128 ? 16 : 32;   // query rows per tile
  static constexpr int TPR = PF_NUM_THREADS / ROWS;   // threads per row
  static constexpr int KPT = PF_KEYS / TPR;           // scores per thread per key tile
  static constexpr int DPT = HEAD / TPR;              // output dims per thread
  static constexpr int QS = HEAD + 1;                 // padded row stride of queries and keys
  static constexpr int PS = PF_KEYS + 1;              // padded row stride of probabilities
};

template <typename cache_t, int HEAD, int BS>
__device__ __forceinline__ void paged_prefill_body(
    float* __restrict__ out,  // [tokens, heads, HEAD]
    const float* __restrict__ q,  // [tokens, heads, HEAD]
    const cache_t* __restrict__ k_cache, const cache_t* __restrict__ v_cache,
    const int* __restrict__ block_tables, int max_blocks_per_seq, const int* __restrict__ seq_rows,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc,
    const int* __restrict__ tiles, int num_heads, int num_kv_heads, float scale, int tile_heads,
    int tile_tokens, int window) {
  using S = PrefillShape<HEAD>;
  constexpr int X = CacheTraits<cache_t>::X;
  constexpr int NB = PF_KEYS / BS;    // cache blocks per key tile
  constexpr int KCH = HEAD / X;       // 16-byte chunks per key token
  constexpr int CPR = BS / X;         // 16-byte chunks per value row of a block
  static_assert(PF_KEYS % BS == 0 && BS % X == 0, "block size");
  static_assert(HEAD % X == 0 && HEAD % S::TPR == 0 && S::ROWS * S::TPR == PF_NUM_THREADS, "head");
  static_assert(WARP_SIZE % S::TPR == 0, "the threads of a row share a warp");

  const long long tile_idx = blockIdx.x;
  const int seq = tiles[2 * tile_idx];
  const int tok0 = tiles[2 * tile_idx + 1];
  const int group = num_heads / num_kv_heads;
  const int chunks = (group + tile_heads - 1) / tile_heads;
  const int kv_head = blockIdx.y / chunks;
  const int head0 = kv_head * group + (blockIdx.y % chunks) * tile_heads;  // first head of the tile
  const int heads = min(tile_heads, kv_head * group + group - head0);       // heads in this chunk
  const int q_begin = query_start_loc[seq];
  const int qlen = query_start_loc[seq + 1] - q_begin;
  const int seq_len = seq_lens[seq];
  const int first_pos = seq_len - qlen;  // position of the sequence's first query token
  const int ntok = min(tile_tokens, qlen - tok0);
  const int kend = min(seq_len, first_pos + tok0 + ntok);  // keys any row of the tile sees

  const int tid = threadIdx.x;
  const int r = tid / S::TPR;
  const int sub = tid % S::TPR;
  const int rt = r / tile_heads;
  const int rh = r % tile_heads;
  const bool row_ok = rt < ntok && rh < heads;
  const int pos = first_pos + tok0 + rt;  // the row sees keys 0..=pos

  extern __shared__ float smem[];
  float* q_s = smem;                          // [ROWS][QS]
  float* k_s = q_s + S::ROWS * S::QS;         // [PF_KEYS][QS]
  float* v_s = k_s + PF_KEYS * S::QS;         // [PF_KEYS][HEAD]
  float* p_s = v_s + PF_KEYS * HEAD;          // [ROWS][PS]

  for (int i = tid; i < S::ROWS * HEAD; i += PF_NUM_THREADS) {
    const int rr = i / HEAD, d = i % HEAD;
    const int t = rr / tile_heads, h = rr % tile_heads;
    float v = 0.f;
    if (t < ntok && h < heads)
      v = q[((long long)(q_begin + tok0 + t) * num_heads + head0 + h) * HEAD + d] * scale;
    q_s[rr * S::QS + d] = v;
  }

  const long long tile = (long long)HEAD * BS;  // elements of one (block, kv head) tile
  const long long block_stride = tile * num_kv_heads;
  const int* __restrict__ table = block_tables + (long long)seq_rows[seq] * max_blocks_per_seq;

  float acc[S::DPT];
#pragma unroll
  for (int i = 0; i < S::DPT; ++i) acc[i] = 0.f;
  float m_run = NEG_INF, l_run = 0.f;

  // A sliding window: the tile's first row sees keys from its position - window + 1 on, every
  // later row from later keys; key tiles wholly before that are never visited.
  const int klo = window > 0 ? max(0, first_pos + tok0 - window + 1) : 0;
  for (int kt0 = klo / PF_KEYS * PF_KEYS; kt0 < kend; kt0 += PF_KEYS) {
    __syncthreads();  // the previous key tile is consumed (and the queries are in place)
    // K tile: chunk j of block b is dim-chunk j / BS of token j % BS.
    for (int j = tid; j < NB * BS * KCH; j += PF_NUM_THREADS) {
      const int b = j / (BS * KCH), jj = j % (BS * KCH);
      const int c = jj / BS, t = jj % BS;
      const int key = kt0 + b * BS + t;
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);  // all-zero bits: 0.0 in every cache dtype
      if (key < seq_len) {
        const long long phys = table[kt0 / BS + b];
        raw = reinterpret_cast<const uint4*>(k_cache + phys * block_stride + kv_head * tile)[jj];
      }
      float kf[X];
      CacheTraits<cache_t>::load16(raw, kf);
#pragma unroll
      for (int e = 0; e < X; ++e) k_s[(b * BS + t) * S::QS + c * X + e] = kf[e];
    }
    // V tile, transposed: chunk j of block b is tokens (j % CPR) * X.. of value row j / CPR.
    for (int j = tid; j < NB * HEAD * CPR; j += PF_NUM_THREADS) {
      const int b = j / (HEAD * CPR), jj = j % (HEAD * CPR);
      const int d = jj / CPR, t0 = (jj % CPR) * X;
      const int key0 = kt0 + b * BS + t0;
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (key0 < seq_len) {
        const long long phys = table[kt0 / BS + b];
        raw = reinterpret_cast<const uint4*>(v_cache + phys * block_stride + kv_head * tile)[jj];
      }
      float vf[X];
      CacheTraits<cache_t>::load16(raw, vf);
#pragma unroll
      for (int e = 0; e < X; ++e) v_s[(b * BS + t0 + e) * HEAD + d] = key0 + e < seq_len ? vf[e] : 0.f;
    }
    __syncthreads();

    // Scores of keys sub + TPR * j for this thread's row.
    float s[S::KPT];
#pragma unroll
    for (int j = 0; j < S::KPT; ++j) s[j] = 0.f;
    const float* qr = q_s + r * S::QS;
#pragma unroll 8
    for (int d = 0; d < HEAD; ++d) {
      const float qv = qr[d];
#pragma unroll
      for (int j = 0; j < S::KPT; ++j) s[j] = fmaf(qv, k_s[(sub + S::TPR * j) * S::QS + d], s[j]);
    }
    float m_tile = NEG_INF;
#pragma unroll
    for (int j = 0; j < S::KPT; ++j) {
      const int key = kt0 + sub + S::TPR * j;
      const bool valid = row_ok && key <= pos && key < seq_len && (window <= 0 || key > pos - window);
      s[j] = valid ? s[j] : NEG_INF;
      m_tile = fmaxf(m_tile, s[j]);
    }
#pragma unroll
    for (int m = 1; m < S::TPR; m <<= 1) m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, m));
    const float m_new = fmaxf(m_run, m_tile);
    // A row that has seen no key yet (m_new = -inf) keeps a zero accumulator and sum.
    const bool seen = m_new != NEG_INF;
    const float alpha = seen ? __expf(m_run - m_new) : 1.f;  // exp(-inf) = 0 on the first keys
    float psum = 0.f;
#pragma unroll
    for (int j = 0; j < S::KPT; ++j) {
      const float p = (seen && s[j] != NEG_INF) ? __expf(s[j] - m_new) : 0.f;
      p_s[r * S::PS + sub + S::TPR * j] = p;
      psum += p;
    }
#pragma unroll
    for (int m = 1; m < S::TPR; m <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, m);
    l_run = l_run * alpha + psum;
    m_run = m_new;
#pragma unroll
    for (int i = 0; i < S::DPT; ++i) acc[i] *= alpha;
    __syncwarp();  // the row's probabilities come from its own TPR threads, all in this warp

    const int nk = min(PF_KEYS, kend - kt0);
    const float* pr = p_s + r * S::PS;
    for (int k = 0; k < nk; ++k) {
      const float p = pr[k];
      const float* vr = v_s + k * HEAD + sub;
#pragma unroll
      for (int i = 0; i < S::DPT; ++i) acc[i] = fmaf(p, vr[S::TPR * i], acc[i]);
    }
  }

  if (row_ok) {
    const float inv = 1.f / l_run;  // l_run >= 1: the row's max key contributes exp(0)
    float* o = out + ((long long)(q_begin + tok0 + rt) * num_heads + head0 + rh) * HEAD + sub;
#pragma unroll
    for (int i = 0; i < S::DPT; ++i) o[S::TPR * i] = acc[i] * inv;
  }
}

#define PF_PARAMS(T)                                                                       \
  float *__restrict__ out, const float *__restrict__ q, const T *__restrict__ k_cache,     \
      const T *__restrict__ v_cache, const int *__restrict__ block_tables,                 \
      int max_blocks_per_seq, const int *__restrict__ seq_rows,                            \
      const int *__restrict__ seq_lens, const int *__restrict__ query_start_loc,           \
      const int *__restrict__ tiles, int num_heads, int num_kv_heads, float scale,         \
      int tile_heads, int tile_tokens, int window
#define PF_ARGS                                                                            \
  out, q, k_cache, v_cache, block_tables, max_blocks_per_seq, seq_rows, seq_lens,          \
      query_start_loc, tiles, num_heads, num_kv_heads, scale, tile_heads, tile_tokens, window

// One instantiation per (dtype, HEAD, BS): the GQA group is a runtime tiling parameter.
#define PAGED_PREFILL(TN, T, HEAD, BS)                                                     \
  extern "C" __global__ void __launch_bounds__(PF_NUM_THREADS, 4)                             \
      paged_prefill_##TN##_h##HEAD##_b##BS(PF_PARAMS(T)) {                                  \
    paged_prefill_body<T, HEAD, BS>(PF_ARGS);                                              \
  }
