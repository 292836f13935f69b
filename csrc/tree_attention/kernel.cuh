// Device code of tree_attention / tree_attention_paged, free of torch types (plain pointers,
// sizes, strides) so the native benchmark can launch it.
//
// Work split (flash-attention style, one kernel family for contiguous and paged caches):
//   grid  (Hkv x row tiles, B, KV splits); block kThreads = 4 warps.
//   A CTA owns request b, kv head h, a tile of kTileRows packed query rows (row r = tree token
//   r / G, q head h * G + r % G, G = Hq / Hkv) and one split of the cache positions
//   start + [split * chunk, (split + 1) * chunk) of [start, cache_lens[b] + N), start = the
//   request's window start (0 without a sliding window). Packing the G heads that share a kv
//   head into the tile means each K / V element is read once per kv head (not G times), and
//   the tile has enough rows for 16x16x16 tensor-core MMAs even at N = 8.
//   Warp w owns rows [16 w, 16 w + 16) of the tile.
//   Head dims: q / k have Dqk, v / the output Dv (they differ for MLA); the template tile kDp
//   covers the larger, the padding columns of each tile stay zero, and the Q K^T and P V loops
//   stop at their own width.
//   The CTA walks its positions in blocks of kBlockKeys: the prefix part with no mask test
//   (only a tail bound), then the tree part with a bitmask built once per CTA in shared memory
//   (bit j of row r = tree_mask[b, token(r), j]). Per block:
//     1. K and V rows -> shared memory (cp.async, 16-byte vectors, zero-filled past the end;
//        a page lookup per row: the contiguous cache is one page per request), double-
//        buffered where shared memory allows: block i + 1 loads while block i is computed.
//     2. S = Q K^T: WMMA 16x16x16 (mma.sync on sm_80 / sm_90a) with fp32 accumulators for
//        fp16 / bf16; a SIMT loop for fp32.
//     3. Online softmax in fp32 (log2 domain): two lanes per row, running max / sum in shared
//        memory, the fp32 output rows rescaled only when the max moves; P stored in T. With a
//        soft-cap each score becomes cap * tanh(scale * s / cap) before the mask; with a
//        sliding window W a row at position pos (cache_lens[b] + its depth in the tree) also
//        masks keys at positions <= pos - W (the depths of all N tree tokens are counted once
//        per CTA into shared memory).
//     4. O += P V: WMMA on the fp32 output tile in shared memory (SIMT for fp32).
//   With one split the epilogue writes O / l (O / (l + 2^(sink - m)) with attention sinks);
//   otherwise each split writes O / l and its log-sum-exp (-inf for a row that saw nothing in
//   the split, e.g. all of it before the row's window), and merge_splits_kernel combines them
//   (weights 2^(lse_s - max)) and adds the sink to the denominator once. Splits are chosen on
//   the host from the cache capacity (with a window: from the window + N, the longest range a
//   request can see) so that a short batch of long prefixes still fills every SM.
#pragma once

#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_utils.cuh"

namespace eagle3::tree_attention::cuda {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kTileRows = 16 * kWarps;  // packed query rows per CTA
inline constexpr int kBlockKeys = 32;          // cache positions per shared-memory block
inline constexpr int kLdS = kBlockKeys + 4;    // fp32 score row stride (floats)
inline constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
struct Params {
  const T* q;  // [B, N, Hq, Dqk]
  int64_t q_batch, q_token, q_head;
  T* out;      // [B, N, Hq, Dv]
  int64_t o_batch, o_token, o_head;
  const T* k;  // pages [P, page_size, Hkv, Dqk] (contiguous: P = B, page_size = S_max)
  const T* v;  // pages [P, page_size, Hkv, Dv]
  int64_t k_page, k_row, k_head, v_page, v_row, v_head;
  const int32_t* block_table;  // [B, bt_stride] or nullptr (contiguous)
  int64_t bt_stride;
  int64_t page_size;
  const int32_t* cache_lens;   // [B]
  const int32_t* tree_start;   // [B] slot of tree token 0, or nullptr (= cache_lens)
  const bool* mask;            // [B, N, N]
  int64_t m_batch, m_row, m_col;
  const float* sinks;          // [Hq] sink logits (natural log domain) or nullptr
  float* part_out;             // [splits, B, N, Hq, Dv] when splits > 1
  float* part_lse;             // [splits, B, N, Hq] (log2 domain)
  int batch, tree, q_heads, kv_heads, group;
  int head_dim;    // Dqk: q and k
  int v_dim;       // Dv: v and the output
  int rows;        // N * G packed rows per (request, kv head)
  int row_tiles;   // ceil(rows / kTileRows)
  int splits;
  int mask_words;  // ceil(N / 64)
  int64_t chunk;   // positions per split, a multiple of kBlockKeys
  int64_t window;  // sliding window in positions, 0 = none
  float scale;       // softmax scale (natural domain)
  float scale_log2;  // scale * log2(e)
  float softcap;     // logit soft-cap, 0 = none
  bool vec_ok;     // 16-byte vectors: Dqk, Dv, strides and pointers aligned
};

constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Shared-memory layout of one CTA, in bytes; every region starts 128-byte aligned (WMMA needs
// 32-byte aligned fragment pointers).
template <typename T, int kDp>
struct Smem {
  static constexpr int kPad = 16 / sizeof(T);  // keeps rows 16-byte aligned, staggers banks
  static constexpr int kLd = kDp + kPad;       // Q / K / V row stride (elements)
  static constexpr int kLdP = kBlockKeys + kPad;
  static constexpr int kLdO = kDp + 4;         // fp32 output row stride
  // K / V blocks in flight: two (the next block loads while this one is used) where shared
  // memory allows it on sm_80 (fp16 / bf16 up to D = 128, fp32 up to D = 64), else one.
  static constexpr int kStages = sizeof(T) * kDp <= 256 ? 2 : 1;
  static constexpr int kKvStage = align128(kBlockKeys * kLd * static_cast<int>(sizeof(T)));
  static constexpr int kO = 0;
  static constexpr int kS = kO + align128(kTileRows * kLdO * 4);
  static constexpr int kM = kS + align128(kTileRows * kLdS * 4);
  static constexpr int kL = kM + align128(kTileRows * 4);
  static constexpr int kQ = kL + align128(kTileRows * 4);
  static constexpr int kK = kQ + align128(kTileRows * kLd * static_cast<int>(sizeof(T)));
  static constexpr int kV = kK + kStages * kKvStage;
  static constexpr int kP = kV + kStages * kKvStage;
  static constexpr int kBits = kP + align128(kTileRows * kLdP * static_cast<int>(sizeof(T)));
  // The depth of each tree token (int), only with a sliding window: right after the bitmask
  // (8-byte aligned, which an int needs).
  static constexpr int depth_offset(int mask_words) { return kBits + kTileRows * mask_words * 8; }
  static constexpr int bytes(int mask_words, int depths) {
    return depth_offset(mask_words) + depths * static_cast<int>(sizeof(int));
  }
};

template <typename T>
__device__ __forceinline__ void kv_offsets(const Params<T>& p, int b, int64_t s, int h,
                                           int64_t& k_off, int64_t& v_off) {
  int64_t page = b;
  int64_t row = s;
  if (p.block_table != nullptr) {
    page = p.block_table[b * p.bt_stride + s / p.page_size];
    row = s % p.page_size;
  }
  k_off = page * p.k_page + row * p.k_row + h * p.k_head;
  v_off = page * p.v_page + row * p.v_row + h * p.v_head;
}

// Starts copying K and V rows of cache slots [s0, s0 + n) into shared memory (rows >= n become
// zero) and commits them as one cp.async group; the elementwise path (unaligned caches) copies
// synchronously. The caller waits for the group and synchronizes the CTA. K rows are Dqk wide,
// V rows Dv: one pass over the wider of the two (one page lookup per row and column chunk
// serves both), each copy stopping at its own width, so that the columns past it keep the
// zeros the kernel wrote at its start.
template <typename T, int kDp>
__device__ __forceinline__ void issue_kv(const Params<T>& p, int b, int h, int64_t s0, int n,
                                        T* ks, T* vs) {
  using L = Smem<T, kDp>;
  if (p.vec_ok) {
    constexpr int kVec = 16 / sizeof(T);
    const int k_chunks = p.head_dim / kVec;
    const int v_chunks = p.v_dim / kVec;
    const int chunks = k_chunks > v_chunks ? k_chunks : v_chunks;
    for (int idx = threadIdx.x; idx < kBlockKeys * chunks; idx += kThreads) {
      const int key = idx / chunks;
      const int ci = idx % chunks;
      const int c = ci * kVec;
      const bool valid = key < n;
      int64_t k_off = 0, v_off = 0;
      if (valid) kv_offsets(p, b, s0 + key, h, k_off, v_off);
      if (ci < k_chunks) eagle3::cuda::cp_async_16(ks + key * L::kLd + c, p.k + k_off + c, valid);
      if (ci < v_chunks) eagle3::cuda::cp_async_16(vs + key * L::kLd + c, p.v + v_off + c, valid);
    }
  } else {
    const int width = p.head_dim > p.v_dim ? p.head_dim : p.v_dim;
    for (int idx = threadIdx.x; idx < kBlockKeys * width; idx += kThreads) {
      const int key = idx / width;
      const int d = idx % width;
      T kv = eagle3::cuda::from_float<T>(0.f);
      T vv = kv;
      if (key < n) {
        int64_t k_off, v_off;
        kv_offsets(p, b, s0 + key, h, k_off, v_off);
        if (d < p.head_dim) kv = p.k[k_off + d];
        if (d < p.v_dim) vv = p.v[v_off + d];
      }
      if (d < p.head_dim) ks[key * L::kLd + d] = kv;
      if (d < p.v_dim) vs[key * L::kLd + d] = vv;
    }
  }
  eagle3::cuda::cp_async_commit();  // (an empty group on the elementwise path)
}

// S[16 rows of this warp][kBlockKeys] = Q K^T (unscaled), fp32 into ss (row stride kLdS).
// `width` = Dqk: the columns past it are zero in Q and K and add nothing, so the loops stop
// there (at the 16-column MMA step that covers it) instead of at the tile width kDp.
template <typename T, int kDp>
__device__ __forceinline__ void warp_scores(const T* qs, const T* ks, float* ss, int width) {
  using L = Smem<T, kDp>;
  if constexpr (std::is_same_v<T, float>) {
    const int lane = threadIdx.x % 32;  // lane = key
    for (int r = 0; r < 16; ++r) {
      float acc = 0.f;
#pragma unroll 8
      for (int d = 0; d < width; ++d) acc += qs[r * L::kLd + d] * ks[lane * L::kLd + d];
      ss[r * kLdS + lane] = acc;
    }
  } else {
    using namespace nvcuda;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kBlockKeys / 16];
#pragma unroll
    for (int j = 0; j < kBlockKeys / 16; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll
    for (int d = 0; d < kDp; d += 16) {
      if (d >= width) break;
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::load_matrix_sync(a, qs + d, L::kLd);
#pragma unroll
      for (int j = 0; j < kBlockKeys / 16; ++j) {
        // K^T as a column-major [D x keys] matrix is K row-major [keys x D].
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bk;
        wmma::load_matrix_sync(bk, ks + j * 16 * L::kLd + d, L::kLd);
        wmma::mma_sync(acc[j], a, bk, acc[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < kBlockKeys / 16; ++j) {
      wmma::store_matrix_sync(ss + j * 16, acc[j], kLdS, wmma::mem_row_major);
    }
  }
}

// O[16 rows of this warp][Dv] (fp32, row stride kLdO) += P[16][kBlockKeys] V[kBlockKeys][Dv].
// `width` = Dv: V's columns past it are zero, so O's stay zero and are not computed.
template <typename T, int kDp>
__device__ __forceinline__ void warp_accumulate(const T* ps, const T* vs, float* os, int n,
                                                int width) {
  using L = Smem<T, kDp>;
  if constexpr (std::is_same_v<T, float>) {
    const int lane = threadIdx.x % 32;
    for (int d = lane; d < width; d += 32) {
      for (int r = 0; r < 16; ++r) {
        float acc = os[r * L::kLdO + d];
        for (int k = 0; k < n; ++k) acc += ps[r * L::kLdP + k] * vs[k * L::kLd + d];
        os[r * L::kLdO + d] = acc;
      }
    }
  } else {
    using namespace nvcuda;
#pragma unroll 2
    for (int c = 0; c < width; c += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, os + c, L::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBlockKeys; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bv;
        wmma::load_matrix_sync(a, ps + kk, L::kLdP);
        wmma::load_matrix_sync(bv, vs + kk * L::kLd + c, L::kLd);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(os + c, acc, L::kLdO, wmma::mem_row_major);
    }
  }
}

// Online-softmax update of this warp's 16 rows for one block of n keys at cache positions
// [s0, s0 + n) (two lanes per row, 16 keys each). kTree: keys are tree tokens j0 + key, visible
// where the row's bitmask bit is set. With a sliding window a key is visible only at a position
// >= first (this lane's row's earliest visible position); a tree token's position is
// prefix + its depth, not its cache slot.
template <typename T, int kDp, bool kTree>
__device__ __forceinline__ void warp_softmax(const Params<T>& p, int warp_row0, int n, int j0,
                                             int64_t s0, int64_t prefix, int64_t first,
                                             const float* ss, T* ps, float* os, float* m_s,
                                             float* l_s, const uint64_t* bits, const int* depth) {
  using L = Smem<T, kDp>;
  const int lane = threadIdx.x % 32;
  const int r = lane >> 1;           // row within the warp
  const int half = lane & 1;
  const int row = warp_row0 + r;     // row within the tile
  const float kNegInf = neg_inf();
  const bool windowed = p.window > 0;
  // Prefix blocks: keys below this index lie before the row's window.
  const int64_t first_key = first - s0;
  // Logits in the log2 domain, every one before its mask test (masked keys become -inf below).
  // (The branch is uniform: the plain path stays one multiply per score.)
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = ss[r * kLdS + half * 16 + i];
  if (p.softcap > 0.f) {
    // Soft-cap: cap * tanh(scale * s / cap), then into the log2 domain.
    const float cap_in = p.scale / p.softcap;
    const float cap_out = p.softcap * kLog2e;
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = cap_out * tanhf(x[i] * cap_in);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] *= p.scale_log2;
  }
  float mx = kNegInf;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int key = half * 16 + i;
    bool visible = key < n;
    if constexpr (kTree) {
      const int j = j0 + key;
      visible = visible && ((bits[row * p.mask_words + (j >> 6)] >> (j & 63)) & 1u);
      // (j < N here: depth is read only for a key of the block)
      if (windowed) visible = visible && prefix + depth[j] >= first;
    } else {
      if (windowed) visible = visible && key >= first_key;
    }
    x[i] = visible ? x[i] : kNegInf;
    mx = fmaxf(mx, x[i]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  const float m_old = m_s[row];
  const float m_new = fmaxf(m_old, mx);
  const float m_use = m_new == kNegInf ? 0.f : m_new;  // nothing seen yet: p = alpha = 0
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float e = exp2f(x[i] - m_use);
    sum += e;
    ps[r * L::kLdP + half * 16 + i] = eagle3::cuda::from_float<T>(e);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = exp2f(m_old - m_use);
  __syncwarp();  // both lanes of a row have read m_old
  if (half == 0) {
    m_s[row] = m_new;
    l_s[row] = l_s[row] * alpha + sum;
  }
  if (alpha != 1.f) {  // (O's columns past Dv are zero)
    for (int d = half; d < p.v_dim; d += 2) os[r * L::kLdO + d] *= alpha;
  }
  __syncwarp();
}

template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads) tree_attention_kernel(const __grid_constant__ Params<T> p) {
  using L = Smem<T, kDp>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* os = reinterpret_cast<float*>(smem + L::kO);
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  float* m_s = reinterpret_cast<float*>(smem + L::kM);
  float* l_s = reinterpret_cast<float*>(smem + L::kL);
  T* qs = reinterpret_cast<T*>(smem + L::kQ);
  T* ks = reinterpret_cast<T*>(smem + L::kK);
  T* vs = reinterpret_cast<T*>(smem + L::kV);
  T* ps = reinterpret_cast<T*>(smem + L::kP);
  uint64_t* bits = reinterpret_cast<uint64_t*>(smem + L::kBits);
  int* depth = reinterpret_cast<int*>(smem + L::depth_offset(p.mask_words));  // window only

  const int tile = blockIdx.x % p.row_tiles;
  const int h = blockIdx.x / p.row_tiles;
  const int b = blockIdx.y;
  const int split = blockIdx.z;
  const int row0 = tile * kTileRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t prefix = p.cache_lens[b];
  const int64_t total = prefix + p.tree;
  // Splits count positions from the earliest one any row of the request sees (the root's
  // window start): with a window the positions before it are never loaded.
  const int64_t start =
      p.window > 0 && prefix - p.window + 1 > 0 ? prefix - p.window + 1 : 0;
  const int64_t begin = start + split * p.chunk;
  const int64_t end = begin + p.chunk < total ? begin + p.chunk : total;

  // Zero Q / K / V (their padding columns past Dqk / Dv stay zero: the copies stop at each
  // width) and O; init row stats.
  for (int i = threadIdx.x; i < (L::kP - L::kQ) / 4; i += kThreads) {
    reinterpret_cast<uint32_t*>(smem + L::kQ)[i] = 0u;
  }
  for (int i = threadIdx.x; i < kTileRows * L::kLdO; i += kThreads) os[i] = 0.f;
  for (int i = threadIdx.x; i < kTileRows; i += kThreads) {
    m_s[i] = neg_inf();
    l_s[i] = 0.f;
  }
  __syncthreads();
  // Q tile (rows past N * G stay zero) and the tree bitmask of each row.
  for (int idx = threadIdx.x; idx < kTileRows * p.head_dim; idx += kThreads) {
    const int r = idx / p.head_dim;
    const int d = idx % p.head_dim;
    const int gr = row0 + r;
    if (gr < p.rows) {
      const int token = gr / p.group;
      const int head = h * p.group + gr % p.group;
      qs[r * L::kLd + d] = p.q[b * p.q_batch + token * p.q_token + head * p.q_head + d];
    }
  }
  for (int idx = threadIdx.x; idx < kTileRows * p.mask_words; idx += kThreads) {
    const int r = idx / p.mask_words;
    const int w = idx % p.mask_words;
    const int gr = row0 + r;
    uint64_t word = 0;
    if (gr < p.rows) {
      const bool* mrow = p.mask + b * p.m_batch + static_cast<int64_t>(gr / p.group) * p.m_row;
      for (int j = w * 64; j < p.tree && j < w * 64 + 64; ++j) {
        if (mrow[j * p.m_col]) word |= uint64_t{1} << (j - w * 64);
      }
    }
    bits[idx] = word;
  }
  if (p.window > 0) {
    // Depth of every tree token (it is a key of every row): the tree tokens its mask row sees,
    // itself included, minus one. One warp per token, 32 columns per ballot.
    for (int t = warp; t < p.tree; t += kWarps) {
      const bool* mrow = p.mask + b * p.m_batch + static_cast<int64_t>(t) * p.m_row;
      int seen = 0;
      for (int c0 = 0; c0 < p.tree; c0 += 32) {
        const int j = c0 + lane;
        const bool v = j < p.tree && mrow[static_cast<int64_t>(j) * p.m_col];
        seen += __popc(__ballot_sync(0xffffffffu, v));
      }
      if (lane == 0) depth[t] = seen - 1;
    }
  }
  __syncthreads();

  const int warp_row0 = warp * 16;
  const T* q_warp = qs + warp_row0 * L::kLd;
  float* s_warp = ss + warp_row0 * kLdS;
  T* p_warp = ps + warp_row0 * L::kLdP;
  float* o_warp = os + warp_row0 * L::kLdO;
  // The earliest position the row of this lane (two lanes per row in warp_softmax) may see:
  // its own position prefix + depth, minus W - 1. Tile rows past N * G see everything (their
  // results are never written).
  int64_t first = 0;
  if (p.window > 0) {
    const int gr = row0 + warp_row0 + (lane >> 1);
    if (gr < p.rows) first = prefix + depth[gr / p.group] + 1 - p.window;
  }

  // The CTA's blocks: prefix blocks over [begin, prefix_end), then tree blocks over
  // [tree_begin, end).
  const int64_t prefix_end = end < prefix ? end : prefix;
  const int64_t tree_begin = begin > prefix ? begin : prefix;
  const int prefix_blocks =
      prefix_end > begin ? static_cast<int>((prefix_end - begin + kBlockKeys - 1) / kBlockKeys) : 0;
  const int tree_blocks =
      end > tree_begin ? static_cast<int>((end - tree_begin + kBlockKeys - 1) / kBlockKeys) : 0;
  const int blocks = prefix_blocks + tree_blocks;
  auto block_start = [&](int i) {
    return i < prefix_blocks ? begin + static_cast<int64_t>(i) * kBlockKeys
                             : tree_begin + static_cast<int64_t>(i - prefix_blocks) * kBlockKeys;
  };
  // The cache slot of a block's first key: a prefix position is its own slot; tree token j sits
  // at tree_slot0 + j (right after the prefix unless tree_start says otherwise).
  const int64_t tree_slot0 = p.tree_start != nullptr ? p.tree_start[b] : prefix;
  auto block_slot = [&](int i) {
    const int64_t s0 = block_start(i);
    return i < prefix_blocks ? s0 : tree_slot0 + (s0 - prefix);
  };
  auto block_size = [&](int i) {
    const int64_t limit = i < prefix_blocks ? prefix_end : end;
    const int64_t left = limit - block_start(i);
    return static_cast<int>(left < kBlockKeys ? left : kBlockKeys);
  };
  auto stage_k = [&](int stage) { return ks + stage * (L::kKvStage / static_cast<int>(sizeof(T))); };
  auto stage_v = [&](int stage) { return vs + stage * (L::kKvStage / static_cast<int>(sizeof(T))); };

  if (L::kStages == 2 && blocks > 0) issue_kv<T, kDp>(p, b, h, block_slot(0), block_size(0), ks, vs);
  for (int i = 0; i < blocks; ++i) {
    const int stage = L::kStages == 2 ? i & 1 : 0;
    if constexpr (L::kStages == 2) {
      // Prefetch block i + 1 into the other stage (its last readers passed the trailing
      // barrier of iteration i - 1); an empty group keeps the wait count uniform.
      if (i + 1 < blocks) {
        issue_kv<T, kDp>(p, b, h, block_slot(i + 1), block_size(i + 1), stage_k(stage ^ 1),
                         stage_v(stage ^ 1));
      } else {
        eagle3::cuda::cp_async_commit();
      }
      eagle3::cuda::cp_async_wait<1>();
    } else {
      issue_kv<T, kDp>(p, b, h, block_slot(i), block_size(i), ks, vs);
      eagle3::cuda::cp_async_wait<0>();
    }
    __syncthreads();
    const int n = block_size(i);
    const int64_t s0 = block_start(i);
    warp_scores<T, kDp>(q_warp, stage_k(stage), s_warp, p.head_dim);
    __syncwarp();
    if (i < prefix_blocks) {  // prefix: no mask test (but the window's)
      warp_softmax<T, kDp, false>(p, warp_row0, n, 0, s0, prefix, first, s_warp, p_warp, o_warp,
                                  m_s, l_s, bits, depth);
    } else {                  // tree: the bitmask decides
      warp_softmax<T, kDp, true>(p, warp_row0, n, static_cast<int>(s0 - prefix), s0, prefix, first,
                                 s_warp, p_warp, o_warp, m_s, l_s, bits, depth);
    }
    warp_accumulate<T, kDp>(p_warp, stage_v(stage), o_warp, n, p.v_dim);
    __syncthreads();  // this stage is overwritten by the prefetch of block i + 2
  }
  eagle3::cuda::cp_async_wait<0>();
  __syncwarp();

  // Epilogue: this warp's rows, lanes along Dv.
  for (int r = 0; r < 16; ++r) {
    const int row = warp_row0 + r;
    const int gr = row0 + row;
    if (gr >= p.rows) break;
    const int token = gr / p.group;
    const int head = h * p.group + gr % p.group;
    const float l = l_s[row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (p.splits == 1) {
      float factor = inv;
      if (p.sinks != nullptr) {
        // The sink joins the denominator with no value: O / (l + 2^(sink - m)), rescaled to the
        // larger of m and the sink so that neither exponent overflows.
        const float m = m_s[row];
        const float sink = p.sinks[head] * kLog2e;
        const float top = fmaxf(m, sink);
        const float keep = exp2f(m - top);
        factor = keep / (l * keep + exp2f(sink - top));
      }
      T* o = p.out + b * p.o_batch + token * p.o_token + head * p.o_head;
      for (int d = lane; d < p.v_dim; d += 32) {
        o[d] = eagle3::cuda::from_float<T>(os[row * L::kLdO + d] * factor);
      }
    } else {
      // A row that saw nothing in this split (l = 0: the split lies before its window or past
      // the request's end) gets lse = -inf, weight 0 in the merge.
      const int64_t idx =
          ((static_cast<int64_t>(split) * p.batch + b) * p.tree + token) * p.q_heads + head;
      float* o = p.part_out + idx * p.v_dim;
      for (int d = lane; d < p.v_dim; d += 32) o[d] = os[row * L::kLdO + d] * inv;
      if (lane == 0) p.part_lse[idx] = l > 0.f ? m_s[row] + log2f(l) : neg_inf();
    }
  }
}

// One warp per output row (b, token, head):
//   out = sum_s 2^(lse_s - max) O_s / (sum_s 2^(lse_s - max) [+ 2^(sink - max)]).
// The split holding the row's own tree position is never empty (every token sees itself), so
// max is finite; empty splits (lse = -inf) weigh 0. The sink is one more term of the
// denominator, with no value, added here once rather than in every split.
template <typename T>
__global__ void __launch_bounds__(kThreads) merge_splits_kernel(const __grid_constant__ Params<T> p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.tree * p.q_heads;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int head = static_cast<int>(row % p.q_heads);
  const int token = static_cast<int>((row / p.q_heads) % p.tree);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.q_heads) * p.tree));
  float mx = neg_inf();
  for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, p.part_lse[s * rows + row]);
  const float sink = p.sinks != nullptr ? p.sinks[head] * kLog2e : neg_inf();
  if (p.sinks != nullptr) mx = fmaxf(mx, sink);
  float denom = 0.f;
  for (int s = 0; s < p.splits; ++s) denom += exp2f(p.part_lse[s * rows + row] - mx);
  if (p.sinks != nullptr) denom += exp2f(sink - mx);
  T* o = p.out + b * p.o_batch + token * p.o_token + head * p.o_head;
  for (int d = lane; d < p.v_dim; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float w = exp2f(p.part_lse[s * rows + row] - mx);
      acc += w * p.part_out[(s * rows + row) * p.v_dim + d];
    }
    o[d] = eagle3::cuda::from_float<T>(acc / denom);
  }
}

}  // namespace eagle3::tree_attention::cuda
