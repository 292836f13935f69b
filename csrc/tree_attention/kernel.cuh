// Device code of tree_attention / tree_attention_paged, free of torch types (plain pointers,
// sizes, strides) so the native benchmark can launch it.
//
// Work split (flash-attention style, one kernel family for contiguous and paged caches):
//   grid  (Hkv x row tiles, B, KV splits); block kThreads = 4 warps.
//   A CTA owns request b, kv head h, a tile of kTileRows packed query rows (row r = tree token
//   r / G, q head h * G + r % G, G = Hq / Hkv) and one split of the request's visible cache
//   positions [start, cache_lens[b] + N), start = the request's window start (0 without a
//   sliding window). Packing the G heads that share a kv head into the tile means each K / V
//   element is read once per kv head (not G times), and the tile has enough rows for 16x16x16
//   tensor-core MMAs even at N = 8.
//   Warp w owns rows [16 w, 16 w + 16) of the tile; a warp whose 16 rows are all padding
//   (past N * G) helps load K / V and meets every barrier but computes nothing.
//   Splits: the host fixes how many per request (enough CTAs for every SM) without reading
//   cache_lens; each CTA cuts its request's real length on the device (request_plan): splits
//   of ceil(len / splits) positions, at least kMinSplitKeys, so that a short request in a large
//   cache is spread over the splits instead of landing in the first one, and the splits past
//   its end return at once.
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
//     3. Online softmax in fp32 (log2 domain): two lanes per row, each holding the row's
//        running max / sum in registers; P stored in T. With a soft-cap each score becomes
//        cap * tanh(scale * s / cap) before the mask; with a sliding window W a row at
//        position pos (cache_lens[b] + its depth in the tree) also masks keys at positions
//        <= pos - W (the depths of all N tree tokens are counted once per CTA into shared
//        memory).
//     4. O += P V into the warp's fp32 output tile, kept in registers across all blocks
//        (OutTile: WMMA accumulator fragments, rescaled row by row through a map of their
//        elements' rows; SIMT registers for fp32).
//   With one split the epilogue writes O / l (O / (l + 2^(sink - m)) with attention sinks);
//   otherwise each split writes O / l and its log-sum-exp (-inf for a row that saw nothing in
//   the split, e.g. all of it before the row's window), and merge_splits_kernel combines the
//   splits that held positions (weights 2^(lse_s - max)) and adds the sink to the denominator
//   once.
//
// Invalid values (cache_lens, tree_start, the mask diagonal, block_table entries: what the CPU
// entry checks on the host) are never read on the host here. The kernel keeps every access in
// bounds regardless (an invalid request reads nothing and its rows are zero; a slot whose page
// is not one is read as zeros) and, when given Params::error (validation on), or-s
// an InvalidValue bit into it for the host to raise.
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
// A split shorter than this many positions costs more in partials than it gains: a request's
// splits are at least this long, so a short request leaves the later splits empty.
inline constexpr int64_t kMinSplitKeys = 256;
inline constexpr float kLog2e = 1.4426950408889634f;

// What the kernel found wrong in the tensors' values, or-ed into Params::error.
enum InvalidValue : int {
  kInvalidLength = 1,    // cache_lens[b] < 0, or tree_start[b] before it / the N slots past the capacity
  kInvalidDiagonal = 2,  // tree_mask[b, i, i] is False
  kInvalidPage = 4,      // a block_table entry the request uses is not a page
};

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
  int64_t num_pages;           // P (B when contiguous)
  int64_t capacity;            // cache positions a request can address
  const int32_t* cache_lens;   // [B]
  const int32_t* tree_start;   // [B] slot of tree token 0, or nullptr (= cache_lens)
  const bool* mask;            // [B, N, N]
  int64_t m_batch, m_row, m_col;
  const float* sinks;          // [Hq] sink logits (natural log domain) or nullptr
  float* part_out;             // [splits, B, N, Hq, Dv] when splits > 1
  float* part_lse;             // [splits, B, N, Hq] (log2 domain)
  int* error;                  // InvalidValue bits, or nullptr: nothing is recorded
  int batch, tree, q_heads, kv_heads, group;
  int head_dim;    // Dqk: q and k
  int v_dim;       // Dv: v and the output
  int rows;        // N * G packed rows per (request, kv head)
  int row_tiles;   // ceil(rows / kTileRows)
  int splits;      // KV splits per request (grid z), at least 1
  int mask_words;  // ceil(N / 64)
  int64_t window;  // sliding window in positions, 0 = none
  float scale;       // softmax scale (natural domain)
  float scale_log2;  // scale * log2(e)
  float softcap;     // logit soft-cap, 0 = none
  bool vec_ok;     // 16-byte vectors: Dqk, Dv, strides and pointers aligned
};

constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Shared-memory layout of one CTA, in bytes; every region starts 128-byte aligned (WMMA needs
// 32-byte aligned fragment pointers). The output tile lives in registers (OutTile), not here.
template <typename T, int kDp>
struct Smem {
  static constexpr int kPad = 16 / sizeof(T);  // keeps rows 16-byte aligned, staggers banks
  static constexpr int kLd = kDp + kPad;       // Q / K / V row stride (elements)
  static constexpr int kLdP = kBlockKeys + kPad;
  // K / V blocks in flight: two (the next block loads while this one is used) where shared
  // memory allows it on sm_80 (fp16 / bf16 up to D = 256, fp32 up to D = 128), else one.
  static constexpr int kStages = sizeof(T) * kDp <= 512 ? 2 : 1;
  static constexpr int kKvStage = align128(kBlockKeys * kLd * static_cast<int>(sizeof(T)));
  // fp32 scores, 16 rows per warp; the warp's scratch before the loop (OutTile's row map) and
  // after it (the epilogue stages O through it).
  static constexpr int kS = 0;
  static constexpr int kF = kS + align128(kTileRows * kLdS * 4);  // per-row output factor
  static constexpr int kQ = kF + align128(kTileRows * 4);
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
__device__ __forceinline__ void flag(const Params<T>& p, int bits) {
  if (p.error != nullptr) atomicOr(p.error, bits);
}

// Request b's cache positions and their cut into splits, from cache_lens[b] (and tree_start[b])
// read on the device: the visible positions [start, start + len) go to splits of `chunk`
// positions (ceil(len / splits), at least kMinSplitKeys, a multiple of kBlockKeys); only the
// first `active` splits hold any. The attention kernel and the merge both call this, so they
// agree on which splits wrote partials. An invalid request (negative length, tree slots outside
// [cache_lens[b], capacity)) gets len = 0: nothing is read and its rows come out zero.
struct RequestPlan {
  int64_t prefix;      // cache_lens[b] (0 when invalid)
  int64_t tree_slot0;  // cache slot of tree token 0 (tree_start[b], else cache_lens[b])
  int64_t start;       // the root's window start, 0 without a window
  int64_t len;
  int64_t chunk;
  int active;
  bool valid;
};

template <typename T>
__device__ __forceinline__ RequestPlan request_plan(const Params<T>& p, int b) {
  RequestPlan r;
  const int64_t lens = p.cache_lens[b];
  const int64_t slot0 = p.tree_start != nullptr ? p.tree_start[b] : lens;
  r.valid = lens >= 0 && slot0 >= lens && slot0 + p.tree <= p.capacity;
  r.prefix = r.valid ? lens : 0;
  r.tree_slot0 = r.valid ? slot0 : 0;
  r.start = p.window > 0 && r.prefix - p.window + 1 > 0 ? r.prefix - p.window + 1 : 0;
  r.len = r.valid ? r.prefix + p.tree - r.start : 0;
  int64_t chunk = (r.len + p.splits - 1) / p.splits;
  chunk = chunk > kMinSplitKeys ? chunk : kMinSplitKeys;
  r.chunk = (chunk + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  r.active = static_cast<int>((r.len + r.chunk - 1) / r.chunk);
  return r;
}

// Offsets of cache slot s (request b, kv head h) in K and V. A paged slot whose block_table
// entry is not a page of the cache (an invalid input) is flagged and reported absent (false).
template <typename T>
__device__ __forceinline__ bool kv_offsets(const Params<T>& p, int b, int64_t s, int h,
                                           int64_t& k_off, int64_t& v_off) {
  int64_t page = b;
  int64_t row = s;
  if (p.block_table != nullptr) {
    page = p.block_table[b * p.bt_stride + s / p.page_size];
    row = s % p.page_size;
    if (page < 0 || page >= p.num_pages) {
      flag(p, kInvalidPage);
      return false;
    }
  }
  k_off = page * p.k_page + row * p.k_row + h * p.k_head;
  v_off = page * p.v_page + row * p.v_row + h * p.v_head;
  return true;
}

// Starts copying K and V rows of cache slots [s0, s0 + n) into shared memory (rows >= n, and
// rows without a valid page, become zero) and commits them as one cp.async group; the
// elementwise path (unaligned caches) copies synchronously. The caller waits for the group and
// synchronizes the CTA. K rows are Dqk wide, V rows Dv: one pass over the wider of the two
// (one page lookup per row and column chunk serves both), each copy stopping at its own width,
// so that the columns past it keep the zeros the kernel wrote at its start.
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
      int64_t k_off = 0, v_off = 0;
      const bool valid = key < n && kv_offsets(p, b, s0 + key, h, k_off, v_off);
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
      int64_t k_off = 0, v_off = 0;
      if (key < n && kv_offsets(p, b, s0 + key, h, k_off, v_off)) {
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

// The warp's output tile O[16 rows][kDp] in fp32 registers, for the whole walk over the keys
// (no shared-memory round trip per block). init() before the loop; per block rescale() by the
// softmax's factor, then accumulate(); for_each() hands the final values to the epilogue.
// The factor of row r is held by lane 2 r (warp_softmax's row owner).
template <typename T, int kDp, bool kSimt = std::is_same_v<T, float>>
struct OutTile;

// fp16 / bf16: kDp / 16 WMMA accumulator fragments, fragment c = columns [16 c, 16 c + 16).
// WMMA leaves the map from a fragment's elements to (row, column) unspecified but fixed for the
// fragment type: loading a matrix whose entries are their own row numbers reveals each
// element's row, so rows are rescaled in registers without assuming a layout.
template <typename T, int kDp>
struct OutTile<T, kDp, false> {
  using Acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
  static constexpr int kFrags = kDp / 16;
  static constexpr int kElems = Acc::num_elements;
  Acc acc[kFrags];
  int rows[kElems];  // the tile row (0..15) of each element, the same in every fragment

  // `scratch`: this warp's 16 x kLdS floats, free until the caller's next barrier.
  __device__ __forceinline__ void init(float* scratch) {
    using namespace nvcuda;
#pragma unroll
    for (int c = 0; c < kFrags; ++c) wmma::fill_fragment(acc[c], 0.f);
    const int lane = threadIdx.x % 32;
    for (int e = lane; e < 16 * 16; e += 32) scratch[(e / 16) * kLdS + e % 16] = static_cast<float>(e / 16);
    __syncwarp();
    Acc map;
    wmma::load_matrix_sync(map, scratch, kLdS, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < kElems; ++i) rows[i] = static_cast<int>(map.x[i]);
    __syncwarp();  // every lane has read the map before the scratch is written again
  }

  __device__ __forceinline__ void rescale(float alpha, int width) {
    if (!__any_sync(0xffffffffu, alpha != 1.f)) return;  // no row's max moved
    float a[kElems];
#pragma unroll
    for (int i = 0; i < kElems; ++i) a[i] = __shfl_sync(0xffffffffu, alpha, 2 * rows[i]);
#pragma unroll
    for (int c = 0; c < kFrags; ++c) {
      if (16 * c >= width) break;  // (columns past Dv stay zero)
#pragma unroll
      for (int i = 0; i < kElems; ++i) acc[c].x[i] *= a[i];
    }
  }

  // O += P[16][kBlockKeys] V[kBlockKeys][width]; P rows past n are zero, V rows past n too.
  __device__ __forceinline__ void accumulate(const T* ps, const T* vs, int /*n*/, int width) {
    using namespace nvcuda;
    using L = Smem<T, kDp>;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[kBlockKeys / 16];
#pragma unroll
    for (int k = 0; k < kBlockKeys / 16; ++k) wmma::load_matrix_sync(a[k], ps + 16 * k, L::kLdP);
#pragma unroll
    for (int c = 0; c < kFrags; ++c) {
      if (16 * c >= width) break;
#pragma unroll
      for (int k = 0; k < kBlockKeys / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bv;
        wmma::load_matrix_sync(bv, vs + 16 * k * L::kLd + 16 * c, L::kLd);
        wmma::mma_sync(acc[c], a[k], bv, acc[c]);
      }
    }
  }

  // store(r, d, value) for every r < 16, d < width; one fragment at a time through `scratch`
  // (this warp's 16 x kLdS floats), lanes along the columns of a row.
  template <typename Store>
  __device__ __forceinline__ void for_each(float* scratch, int width, Store store) {
    using namespace nvcuda;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int c = 0; c < kFrags; ++c) {
      if (16 * c >= width) break;
      wmma::store_matrix_sync(scratch, acc[c], kLdS, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * 16; e += 32) {
        const int d = 16 * c + e % 16;
        if (d < width) store(e / 16, d, scratch[(e / 16) * kLdS + e % 16]);
      }
      __syncwarp();
    }
  }
};

// fp32 (SIMT): lane owns columns lane + 32 j of all 16 rows.
template <typename T, int kDp>
struct OutTile<T, kDp, true> {
  static constexpr int kCols = kDp / 32;
  float o[16][kCols];

  __device__ __forceinline__ void init(float* /*scratch*/) {
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < kCols; ++j) o[r][j] = 0.f;
  }

  __device__ __forceinline__ void rescale(float alpha, int /*width*/) {
    if (!__any_sync(0xffffffffu, alpha != 1.f)) return;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float a = __shfl_sync(0xffffffffu, alpha, 2 * r);
#pragma unroll
      for (int j = 0; j < kCols; ++j) o[r][j] *= a;
    }
  }

  // O += P V over the block's n keys: one V row per key into registers, then all 16 rows.
  // Columns past `width` are zero in V; whole 32-column groups past it are skipped.
  __device__ __forceinline__ void accumulate(const T* ps, const T* vs, int n, int width) {
    using L = Smem<T, kDp>;
    const int lane = threadIdx.x % 32;
    for (int k = 0; k < n; ++k) {
      float v[kCols];
#pragma unroll
      for (int j = 0; j < kCols; ++j) v[j] = 32 * j < width ? vs[k * L::kLd + lane + 32 * j] : 0.f;
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const float pk = ps[r * L::kLdP + k];
#pragma unroll
        for (int j = 0; j < kCols; ++j) o[r][j] += pk * v[j];
      }
    }
  }

  template <typename Store>
  __device__ __forceinline__ void for_each(float* /*scratch*/, int width, Store store) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        if (lane + 32 * j < width) store(r, lane + 32 * j, o[r][j]);
      }
  }
};

// Online-softmax update of this warp's 16 rows for one block of n keys at cache positions
// [s0, s0 + n) (two lanes per row, 16 keys each; both keep the row's running max m and sum l).
// kTree: keys are tree tokens j0 + key, visible where the row's bitmask bit is set. With a
// sliding window a key is visible only at a position >= first (this lane's row's earliest
// visible position); a tree token's position is prefix + its depth, not its cache slot.
// Writes P into ps and returns the factor 2^(m_old - m_new) the row's O must be scaled by.
template <typename T, int kDp, bool kTree>
__device__ __forceinline__ float warp_softmax(const Params<T>& p, int warp_row0, int n, int j0,
                                              int64_t s0, int64_t prefix, int64_t first,
                                              const float* ss, T* ps, const uint64_t* bits,
                                              const int* depth, float& m, float& l) {
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
  const float m_new = fmaxf(m, mx);
  const float m_use = m_new == kNegInf ? 0.f : m_new;  // nothing seen yet: p = alpha = 0
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float e = exp2f(x[i] - m_use);
    sum += e;
    ps[r * L::kLdP + half * 16 + i] = eagle3::cuda::from_float<T>(e);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = exp2f(m - m_use);
  m = m_new;
  l = l * alpha + sum;
  __syncwarp();  // P is complete before the warp's P V reads it
  return alpha;
}

template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads) tree_attention_kernel(const __grid_constant__ Params<T> p) {
  using L = Smem<T, kDp>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  float* row_factor = reinterpret_cast<float*>(smem + L::kF);
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
  const RequestPlan plan = request_plan(p, b);
  if (!plan.valid && blockIdx.x == 0 && split == 0 && threadIdx.x == 0) flag(p, kInvalidLength);
  // A split past the request's end does nothing (uniform in the CTA, before any barrier): the
  // merge skips it. With one split the CTA runs on, to write the rows (zero if invalid).
  if (p.splits > 1 && split >= plan.active) return;
  if (p.error != nullptr && p.block_table != nullptr && plan.valid && blockIdx.x == 0 && split == 0) {
    // (Validation only.) Every block_table entry the request uses, as the CPU entry checks,
    // not only those of the slots read (kv_offsets flags those in any case).
    const int64_t used = (plan.tree_slot0 + p.tree + p.page_size - 1) / p.page_size;
    for (int64_t j = threadIdx.x; j < used; j += kThreads) {
      const int64_t page = p.block_table[b * p.bt_stride + j];
      if (page < 0 || page >= p.num_pages) flag(p, kInvalidPage);
    }
  }
  const int64_t prefix = plan.prefix;
  const int64_t total = plan.start + plan.len;  // cache_lens[b] + N (start when invalid)
  const int64_t begin = plan.start + split * plan.chunk;
  const int64_t end = begin + plan.chunk < total ? begin + plan.chunk : total;

  // Zero Q / K / V: their padding columns past Dqk / Dv stay zero (the copies stop at each
  // width), and so do the rows of Q past N * G.
  for (int i = threadIdx.x; i < (L::kP - L::kQ) / 4; i += kThreads) {
    reinterpret_cast<uint32_t*>(smem + L::kQ)[i] = 0u;
  }
  __syncthreads();
  // Q tile and the tree bitmask of each row.
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
      const int token = gr / p.group;
      const bool* mrow = p.mask + b * p.m_batch + static_cast<int64_t>(token) * p.m_row;
      for (int j = w * 64; j < p.tree && j < w * 64 + 64; ++j) {
        if (mrow[j * p.m_col]) word |= uint64_t{1} << (j - w * 64);
      }
      // (Validation only.) Every tree token must see itself.
      if (p.error != nullptr && token >> 6 == w && !((word >> (token & 63)) & 1u)) flag(p, kInvalidDiagonal);
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
  const int warp_row0 = warp * 16;
  const T* q_warp = qs + warp_row0 * L::kLd;
  float* s_warp = ss + warp_row0 * kLdS;
  T* p_warp = ps + warp_row0 * L::kLdP;
  OutTile<T, kDp> o;
  o.init(s_warp);
  __syncthreads();

  // A warp whose rows are all padding loads its share of K / V and meets every barrier, but
  // computes nothing and writes nothing.
  const bool warp_active = row0 + warp_row0 < p.rows;
  // The earliest position the row of this lane (two lanes per row in warp_softmax) may see:
  // its own position prefix + depth, minus W - 1. Tile rows past N * G see everything (their
  // results are never written).
  int64_t first = 0;
  if (p.window > 0) {
    const int gr = row0 + warp_row0 + (lane >> 1);
    if (gr < p.rows) first = prefix + depth[gr / p.group] + 1 - p.window;
  }
  float m = neg_inf();  // this lane's row: running max (log2 domain) and sum
  float l = 0.f;

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
  auto block_slot = [&](int i) {
    const int64_t s0 = block_start(i);
    return i < prefix_blocks ? s0 : plan.tree_slot0 + (s0 - prefix);
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
    if (warp_active) {
      const int n = block_size(i);
      const int64_t s0 = block_start(i);
      warp_scores<T, kDp>(q_warp, stage_k(stage), s_warp, p.head_dim);
      __syncwarp();
      const float alpha =
          i < prefix_blocks  // prefix: no mask test (but the window's); tree: the bitmask decides
              ? warp_softmax<T, kDp, false>(p, warp_row0, n, 0, s0, prefix, first, s_warp, p_warp,
                                            bits, depth, m, l)
              : warp_softmax<T, kDp, true>(p, warp_row0, n, static_cast<int>(s0 - prefix), s0, prefix,
                                           first, s_warp, p_warp, bits, depth, m, l);
      o.rescale(alpha, p.v_dim);
      o.accumulate(p_warp, stage_v(stage), n, p.v_dim);
    }
    __syncthreads();  // this stage is overwritten by the prefetch of block i + 2
  }
  eagle3::cuda::cp_async_wait<0>();
  if (!warp_active) return;  // (no barrier follows)

  // Epilogue. The row owners (lanes 2 r) turn m and l into the row's factor: 1 / l, with one
  // split and sinks 1 / (l + 2^(sink - m)), and with several splits also write the lse.
  auto part_row = [&](int token, int head) {  // this split's partial row of (b, token, head)
    return ((static_cast<int64_t>(split) * p.batch + b) * p.tree + token) * p.q_heads + head;
  };
  float* factor = row_factor + warp_row0;
  const int own_gr = row0 + warp_row0 + (lane >> 1);
  if ((lane & 1) == 0) {
    float f = l > 0.f ? 1.f / l : 0.f;
    if (own_gr < p.rows) {
      const int head = h * p.group + own_gr % p.group;
      if (p.splits == 1 && p.sinks != nullptr) {
        // The sink joins the denominator with no value, rescaled to the larger of m and the
        // sink so that neither exponent overflows.
        const float sink = p.sinks[head] * kLog2e;
        const float top = fmaxf(m, sink);
        const float keep = exp2f(m - top);
        f = keep / (l * keep + exp2f(sink - top));
      } else if (p.splits > 1) {
        // A row that saw nothing in this split (l = 0: the split lies before its window)
        // gets lse = -inf, weight 0 in the merge.
        p.part_lse[part_row(own_gr / p.group, head)] = l > 0.f ? m + log2f(l) : neg_inf();
      }
    }
    factor[lane >> 1] = f;
  }
  __syncwarp();
  o.for_each(s_warp, p.v_dim, [&](int r, int d, float value) {
    const int gr = row0 + warp_row0 + r;
    if (gr >= p.rows) return;
    const int token = gr / p.group;
    const int head = h * p.group + gr % p.group;
    const float x = value * factor[r];
    if (p.splits == 1) {
      p.out[b * p.o_batch + token * p.o_token + head * p.o_head + d] = eagle3::cuda::from_float<T>(x);
    } else {
      p.part_out[part_row(token, head) * p.v_dim + d] = x;
    }
  });
}

// One warp per output row (b, token, head), over the splits that held positions of request b
// (request_plan, as the attention kernel cut them; the others wrote nothing):
//   out = sum_s 2^(lse_s - max) O_s / (sum_s 2^(lse_s - max) [+ 2^(sink - max)]).
// Splits the row saw nothing in (lse = -inf) weigh 0. The sink is one more term of the
// denominator, with no value, added here once rather than in every split. A row no split saw
// anything in and without a sink (only an invalid request) is zero, as with one split, not 0/0.
template <typename T>
__global__ void __launch_bounds__(kThreads) merge_splits_kernel(const __grid_constant__ Params<T> p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.tree * p.q_heads;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int head = static_cast<int>(row % p.q_heads);
  const int token = static_cast<int>((row / p.q_heads) % p.tree);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.q_heads) * p.tree));
  const int active = request_plan(p, b).active;
  const float* lse = p.part_lse + row;  // split s at lse[s * rows]
  float mx = neg_inf();
  for (int s = 0; s < active; ++s) mx = fmaxf(mx, lse[s * rows]);
  const float sink = p.sinks != nullptr ? p.sinks[head] * kLog2e : neg_inf();
  if (p.sinks != nullptr) mx = fmaxf(mx, sink);
  T* o = p.out + b * p.o_batch + token * p.o_token + head * p.o_head;
  if (mx == neg_inf()) {
    for (int d = lane; d < p.v_dim; d += 32) o[d] = eagle3::cuda::from_float<T>(0.f);
    return;
  }
  float denom = 0.f;  // >= 1: the term at the max is 2^0
  for (int s = 0; s < active; ++s) denom += exp2f(lse[s * rows] - mx);
  if (p.sinks != nullptr) denom += exp2f(sink - mx);
  for (int d = lane; d < p.v_dim; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < active; ++s) {
      const float w = exp2f(lse[s * rows] - mx);
      acc += w * p.part_out[(s * rows + row) * p.v_dim + d];
    }
    o[d] = eagle3::cuda::from_float<T>(acc / denom);
  }
}

}  // namespace eagle3::tree_attention::cuda
