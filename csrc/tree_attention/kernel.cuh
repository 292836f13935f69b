// Device code of tree_attention / tree_attention_paged, free of torch types (plain pointers,
// sizes, strides) so the native benchmark can launch it.
//
// Work split (flash-attention style, one kernel family for contiguous and paged caches):
//   grid  (Hkv x row tiles, B, KV splits); block kThreads = 4 warps.
//   A CTA owns request b, kv head h, a tile of kTileRows packed query rows (row r = tree token
//   r / G, q head h * G + r % G, G = Hq / Hkv) and one split of the cache positions
//   [split * chunk, (split + 1) * chunk) of [0, cache_lens[b] + N). Packing the G heads that
//   share a kv head into the tile means each K / V element is read once per kv head (not G
//   times), and the tile has enough rows for 16x16x16 tensor-core MMAs even at N = 8.
//   Warp w owns rows [16 w, 16 w + 16) of the tile.
//   The CTA walks its positions in blocks of kBlockKeys: the prefix part with no mask test
//   (only a tail bound), then the tree part with a bitmask built once per CTA in shared memory
//   (bit j of row r = tree_mask[b, token(r), j]). Per block:
//     1. K and V rows -> shared memory (cp.async, 16-byte vectors, zero-filled past the end;
//        a page lookup per row: the contiguous cache is one page per request), double-
//        buffered where shared memory allows: block i + 1 loads while block i is computed.
//     2. S = Q K^T: WMMA 16x16x16 (mma.sync on sm_80 / sm_90a) with fp32 accumulators for
//        fp16 / bf16; a SIMT loop for fp32.
//     3. Online softmax in fp32 (log2 domain): two lanes per row, running max / sum in shared
//        memory, the fp32 output rows rescaled only when the max moves; P stored in T.
//     4. O += P V: WMMA on the fp32 output tile in shared memory (SIMT for fp32).
//   With one split the epilogue writes O / l; otherwise each split writes O / l and its
//   log-sum-exp, and merge_splits_kernel combines them (weights 2^(lse_s - max)). Splits are
//   chosen on the host from the cache capacity so that a short batch of long prefixes still
//   fills every SM.
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

template <typename T>
struct Params {
  const T* q;  // [B, N, Hq, D]
  int64_t q_batch, q_token, q_head;
  T* out;      // [B, N, Hq, D]
  int64_t o_batch, o_token, o_head;
  const T* k;  // pages [P, page_size, Hkv, D] (contiguous: P = B, page_size = S_max)
  const T* v;
  int64_t k_page, k_row, k_head, v_page, v_row, v_head;
  const int32_t* block_table;  // [B, bt_stride] or nullptr (contiguous)
  int64_t bt_stride;
  int64_t page_size;
  const int32_t* cache_lens;   // [B]
  const bool* mask;            // [B, N, N]
  int64_t m_batch, m_row, m_col;
  float* part_out;             // [splits, B, N, Hq, D] when splits > 1
  float* part_lse;             // [splits, B, N, Hq] (log2 domain)
  int batch, tree, q_heads, kv_heads, head_dim, group;
  int rows;        // N * G packed rows per (request, kv head)
  int row_tiles;   // ceil(rows / kTileRows)
  int splits;
  int mask_words;  // ceil(N / 64)
  int64_t chunk;   // positions per split, a multiple of kBlockKeys
  float scale_log2;  // scale * log2(e)
  bool vec_ok;     // 16-byte vectors: D, strides and pointers aligned
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
  static constexpr int bytes(int mask_words) { return kBits + kTileRows * mask_words * 8; }
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

// Starts copying K and V rows of positions [s0, s0 + n) into shared memory (rows >= n become
// zero) and commits them as one cp.async group; the elementwise path (unaligned caches) copies
// synchronously. The caller waits for the group and synchronizes the CTA.
template <typename T, int kDp>
__device__ __forceinline__ void issue_kv(const Params<T>& p, int b, int h, int64_t s0, int n,
                                        T* ks, T* vs) {
  using L = Smem<T, kDp>;
  if (p.vec_ok) {
    constexpr int kVec = 16 / sizeof(T);
    const int chunks = p.head_dim / kVec;
    for (int idx = threadIdx.x; idx < kBlockKeys * chunks; idx += kThreads) {
      const int key = idx / chunks;
      const int c = (idx % chunks) * kVec;
      const bool valid = key < n;
      int64_t k_off = 0, v_off = 0;
      if (valid) kv_offsets(p, b, s0 + key, h, k_off, v_off);
      eagle3::cuda::cp_async_16(ks + key * L::kLd + c, p.k + k_off + c, valid);
      eagle3::cuda::cp_async_16(vs + key * L::kLd + c, p.v + v_off + c, valid);
    }
  } else {
    for (int idx = threadIdx.x; idx < kBlockKeys * p.head_dim; idx += kThreads) {
      const int key = idx / p.head_dim;
      const int d = idx % p.head_dim;
      T kv = eagle3::cuda::from_float<T>(0.f);
      T vv = kv;
      if (key < n) {
        int64_t k_off, v_off;
        kv_offsets(p, b, s0 + key, h, k_off, v_off);
        kv = p.k[k_off + d];
        vv = p.v[v_off + d];
      }
      ks[key * L::kLd + d] = kv;
      vs[key * L::kLd + d] = vv;
    }
  }
  eagle3::cuda::cp_async_commit();  // (an empty group on the elementwise path)
}

// S[16 rows of this warp][kBlockKeys] = Q K^T (unscaled), fp32 into ss (row stride kLdS).
template <typename T, int kDp>
__device__ __forceinline__ void warp_scores(const T* qs, const T* ks, float* ss) {
  using L = Smem<T, kDp>;
  if constexpr (std::is_same_v<T, float>) {
    const int lane = threadIdx.x % 32;  // lane = key
    for (int r = 0; r < 16; ++r) {
      float acc = 0.f;
#pragma unroll 8
      for (int d = 0; d < kDp; ++d) acc += qs[r * L::kLd + d] * ks[lane * L::kLd + d];
      ss[r * kLdS + lane] = acc;
    }
  } else {
    using namespace nvcuda;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kBlockKeys / 16];
#pragma unroll
    for (int j = 0; j < kBlockKeys / 16; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll
    for (int d = 0; d < kDp; d += 16) {
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

// O[16 rows of this warp][kDp] (fp32, row stride kLdO) += P[16][kBlockKeys] V[kBlockKeys][kDp].
template <typename T, int kDp>
__device__ __forceinline__ void warp_accumulate(const T* ps, const T* vs, float* os, int n) {
  using L = Smem<T, kDp>;
  if constexpr (std::is_same_v<T, float>) {
    const int lane = threadIdx.x % 32;
    for (int d = lane; d < kDp; d += 32) {
      for (int r = 0; r < 16; ++r) {
        float acc = os[r * L::kLdO + d];
        for (int k = 0; k < n; ++k) acc += ps[r * L::kLdP + k] * vs[k * L::kLd + d];
        os[r * L::kLdO + d] = acc;
      }
    }
  } else {
    using namespace nvcuda;
#pragma unroll 2
    for (int c = 0; c < kDp; c += 16) {
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

// Online-softmax update of this warp's 16 rows for one block of n keys (two lanes per row, 16
// keys each). kTree: keys are tree tokens j0 + key, visible where the row's bitmask bit is set.
template <typename T, int kDp, bool kTree>
__device__ __forceinline__ void warp_softmax(const Params<T>& p, int warp_row0, int n, int j0,
                                             const float* ss, T* ps, float* os, float* m_s,
                                             float* l_s, const uint64_t* bits) {
  using L = Smem<T, kDp>;
  const int lane = threadIdx.x % 32;
  const int r = lane >> 1;           // row within the warp
  const int half = lane & 1;
  const int row = warp_row0 + r;     // row within the tile
  const float kNegInf = neg_inf();
  float x[16];
  float mx = kNegInf;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int key = half * 16 + i;
    bool visible = key < n;
    if constexpr (kTree) {
      const int j = j0 + key;
      visible = visible && ((bits[row * p.mask_words + (j >> 6)] >> (j & 63)) & 1u);
    }
    x[i] = visible ? ss[r * kLdS + key] * p.scale_log2 : kNegInf;
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
  if (alpha != 1.f) {
    for (int d = half; d < kDp; d += 2) os[r * L::kLdO + d] *= alpha;
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

  const int tile = blockIdx.x % p.row_tiles;
  const int h = blockIdx.x / p.row_tiles;
  const int b = blockIdx.y;
  const int split = blockIdx.z;
  const int row0 = tile * kTileRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t prefix = p.cache_lens[b];
  const int64_t total = prefix + p.tree;
  const int64_t begin = split * p.chunk;
  const int64_t end = begin + p.chunk < total ? begin + p.chunk : total;

  // Zero Q / K / V (their padding columns past head_dim stay zero) and O; init row stats.
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
  __syncthreads();

  const int warp_row0 = warp * 16;
  const T* q_warp = qs + warp_row0 * L::kLd;
  float* s_warp = ss + warp_row0 * kLdS;
  T* p_warp = ps + warp_row0 * L::kLdP;
  float* o_warp = os + warp_row0 * L::kLdO;

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
  auto block_size = [&](int i) {
    const int64_t limit = i < prefix_blocks ? prefix_end : end;
    const int64_t left = limit - block_start(i);
    return static_cast<int>(left < kBlockKeys ? left : kBlockKeys);
  };
  auto stage_k = [&](int stage) { return ks + stage * (L::kKvStage / static_cast<int>(sizeof(T))); };
  auto stage_v = [&](int stage) { return vs + stage * (L::kKvStage / static_cast<int>(sizeof(T))); };

  if (L::kStages == 2 && blocks > 0) issue_kv<T, kDp>(p, b, h, block_start(0), block_size(0), ks, vs);
  for (int i = 0; i < blocks; ++i) {
    const int stage = L::kStages == 2 ? i & 1 : 0;
    if constexpr (L::kStages == 2) {
      // Prefetch block i + 1 into the other stage (its last readers passed the trailing
      // barrier of iteration i - 1); an empty group keeps the wait count uniform.
      if (i + 1 < blocks) {
        issue_kv<T, kDp>(p, b, h, block_start(i + 1), block_size(i + 1), stage_k(stage ^ 1),
                         stage_v(stage ^ 1));
      } else {
        eagle3::cuda::cp_async_commit();
      }
      eagle3::cuda::cp_async_wait<1>();
    } else {
      issue_kv<T, kDp>(p, b, h, block_start(i), block_size(i), ks, vs);
      eagle3::cuda::cp_async_wait<0>();
    }
    __syncthreads();
    const int n = block_size(i);
    warp_scores<T, kDp>(q_warp, stage_k(stage), s_warp);
    __syncwarp();
    if (i < prefix_blocks) {  // prefix: no mask test
      warp_softmax<T, kDp, false>(p, warp_row0, n, 0, s_warp, p_warp, o_warp, m_s, l_s, bits);
    } else {                  // tree: the bitmask decides
      warp_softmax<T, kDp, true>(p, warp_row0, n, static_cast<int>(block_start(i) - prefix), s_warp,
                                 p_warp, o_warp, m_s, l_s, bits);
    }
    warp_accumulate<T, kDp>(p_warp, stage_v(stage), o_warp, n);
    __syncthreads();  // this stage is overwritten by the prefetch of block i + 2
  }
  eagle3::cuda::cp_async_wait<0>();
  __syncwarp();

  // Epilogue: this warp's rows, lanes along D.
  for (int r = 0; r < 16; ++r) {
    const int row = warp_row0 + r;
    const int gr = row0 + row;
    if (gr >= p.rows) break;
    const int token = gr / p.group;
    const int head = h * p.group + gr % p.group;
    const float l = l_s[row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (p.splits == 1) {
      T* o = p.out + b * p.o_batch + token * p.o_token + head * p.o_head;
      for (int d = lane; d < p.head_dim; d += 32) {
        o[d] = eagle3::cuda::from_float<T>(os[row * L::kLdO + d] * inv);
      }
    } else {
      const int64_t idx =
          ((static_cast<int64_t>(split) * p.batch + b) * p.tree + token) * p.q_heads + head;
      float* o = p.part_out + idx * p.head_dim;
      for (int d = lane; d < p.head_dim; d += 32) o[d] = os[row * L::kLdO + d] * inv;
      if (lane == 0) p.part_lse[idx] = l > 0.f ? m_s[row] + log2f(l) : neg_inf();
    }
  }
}

// One warp per output row (b, token, head): out = sum_s 2^(lse_s - max) O_s / sum_s 2^(lse_s - max).
template <typename T>
__global__ void __launch_bounds__(kThreads) merge_splits_kernel(const __grid_constant__ Params<T> p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.tree * p.q_heads;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float mx = neg_inf();
  for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, p.part_lse[s * rows + row]);
  float denom = 0.f;
  for (int s = 0; s < p.splits; ++s) denom += exp2f(p.part_lse[s * rows + row] - mx);
  const int head = static_cast<int>(row % p.q_heads);
  const int token = static_cast<int>((row / p.q_heads) % p.tree);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.q_heads) * p.tree));
  T* o = p.out + b * p.o_batch + token * p.o_token + head * p.o_head;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float w = exp2f(p.part_lse[s * rows + row] - mx);
      acc += w * p.part_out[(s * rows + row) * p.head_dim + d];
    }
    o[d] = eagle3::cuda::from_float<T>(acc / denom);
  }
}

}  // namespace eagle3::tree_attention::cuda
