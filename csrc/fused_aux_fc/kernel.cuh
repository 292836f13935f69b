// Device code of fused_aux_fc, free of torch types so the native benchmark can launch it.
//
// The op is out^T[N, T] = W[N, K] . X^T[K, T] with K = k * H and X split into k segments
// (the captured hidden states), each with its own pointer and row stride. Two kernels:
//
// tensor_core_kernel (fp16 / bf16, H and strides multiples of 8): a CTA owns a tile of
//   kTileM weight rows x kTileT activation rows and a slice of K (split-K). Tiles of W and X
//   stream through a two-stage cp.async pipeline in shared memory; warps (kWarpsM x kWarpsT)
//   run 16x16x16 tensor-core MMAs (mma.sync on sm_80 and sm_90) with fp32 accumulators. The
//   K loop maps each 8-element vector to its segment (k / H), so no concatenation exists.
//   Decode-sized T (<= 128): one activation tile holds all T rows (DecodeTile, T rounded up
//   to 16 / 32 / 64 / 128), so the grid has a single tile along T and every weight element is
//   read from global memory exactly once; a tile per 16 rows would stream W once per tile.
//   Such a grid has few output tiles, so K is split across CTAs until every SM streams W;
//   each split writes fp32 partials and split_k_reduce_kernel sums them in a fixed order
//   (deterministic). With one split the epilogue writes the output directly.
//
// simt_kernel (fp32, or shapes the vector path cannot take): one warp per (weight row,
//   group of kSimtRows activation rows); lanes stride along K with coalesced loads and a
//   warp reduction finishes each dot product. Correct for any H and stride.
#pragma once

#include <mma.h>

#include <cstdint>

#include "common/cuda_utils.cuh"

namespace eagle3::fused_aux_fc::cuda {

inline constexpr int kMaxSegments = 16;
inline constexpr int kVector = 8;  // 16-bit elements per 16-byte copy
inline constexpr int kTileK = 32;  // K elements per pipeline stage
inline constexpr int kPad = 8;     // shared-memory row padding (elements) against bank conflicts
inline constexpr int kStages = 2;
inline constexpr int kSimtRows = 4;
inline constexpr int kSimtWarps = 8;

template <typename T>
struct Params {
  const T* x[kMaxSegments];          // k segments [rows, hidden]
  int64_t x_stride[kMaxSegments];    // row stride of each segment (elements)
  int num_segments;
  const T* weight;                   // [out_features, num_segments * hidden]
  int64_t w_stride;
  const T* bias;                     // [out_features] or nullptr
  T* out;                            // [rows, out_features], contiguous
  float* partial;                    // [splits, rows, out_features] when splits > 1
  int64_t rows;
  int64_t hidden;
  int64_t out_features;
  int64_t k_per_split;               // multiple of kTileK
  int splits;
};

template <int kTileM_, int kTileT_, int kWarpsM_, int kWarpsT_>
struct TileConfig {
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileT = kTileT_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsT = kWarpsT_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsT;
  static constexpr int kFragsM = kTileM / kWarpsM / 16;  // 16x16 fragments per warp along M
  static constexpr int kFragsT = kTileT / kWarpsT / 16;
  static constexpr int kRowElems = kTileK + kPad;
  static constexpr int kStageElems = (kTileM + kTileT) * kRowElems;
  static constexpr int kPipelineBytes = kStages * kStageElems * 2;
  static constexpr int kEpilogueBytes = kWarpsM * kWarpsT * 16 * 16 * 4;
  static constexpr int kSmemBytes =
      kPipelineBytes > kEpilogueBytes ? kPipelineBytes : kEpilogueBytes;
  static_assert(kFragsM >= 1 && kFragsT >= 1, "warp tile smaller than one fragment");
};

// Decode-sized T: 64 weight rows x kRows (16, 32, 64 or 128, at least T) activation rows per
// CTA, 4 warps. Up to 32 rows the warps stack along M (a warp owns 16 weight rows x all rows);
// from 64 rows they form 2 x 2, so that each warp loads fewer fragments from shared memory
// per MMA (2 + kRows / 32 instead of 1 + kRows / 16).
template <int kRows>
using DecodeTile = TileConfig<64, kRows, kRows >= 64 ? 2 : 4, kRows >= 64 ? 2 : 1>;
// Prefill-sized T: 128 x 128 per CTA, 8 warps, each 64 x 32.
using PrefillTile = TileConfig<128, 128, 2, 4>;

template <typename T, typename Cfg>
__device__ __forceinline__ void load_stage(const Params<T>& p, T* w_tile, T* x_tile,
                                           int64_t m0, int64_t t0, int64_t k0, int64_t k_end) {
  constexpr int kVecPerRow = kTileK / kVector;
  const int64_t total_k = p.num_segments * p.hidden;
  for (int v = threadIdx.x; v < Cfg::kTileM * kVecPerRow; v += Cfg::kThreads) {
    const int r = v / kVecPerRow;
    const int c = (v % kVecPerRow) * kVector;
    const int64_t m = m0 + r;
    const int64_t kk = k0 + c;
    const bool valid = m < p.out_features && kk < k_end && kk < total_k;
    const T* src = valid ? p.weight + m * p.w_stride + kk : p.weight;
    eagle3::cuda::cp_async_16(w_tile + r * Cfg::kRowElems + c, src, valid);
  }
  for (int v = threadIdx.x; v < Cfg::kTileT * kVecPerRow; v += Cfg::kThreads) {
    const int r = v / kVecPerRow;
    const int c = (v % kVecPerRow) * kVector;
    const int64_t t = t0 + r;
    const int64_t kk = k0 + c;
    const bool valid = t < p.rows && kk < k_end && kk < total_k;
    const T* src = p.x[0];
    if (valid) {
      // H is a multiple of kVector, so a vector never straddles two segments.
      const int64_t seg = kk / p.hidden;
      src = p.x[seg] + t * p.x_stride[seg] + (kk - seg * p.hidden);
    }
    eagle3::cuda::cp_async_16(x_tile + r * Cfg::kRowElems + c, src, valid);
  }
}

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    tensor_core_kernel(const __grid_constant__ Params<T> p) {
  using namespace nvcuda;
  __shared__ __align__(128) unsigned char smem[Cfg::kSmemBytes];
  T* stage_base = reinterpret_cast<T*>(smem);

  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * Cfg::kTileM;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * Cfg::kTileT;
  const int split = blockIdx.z;
  const int64_t total_k = p.num_segments * p.hidden;
  const int64_t k_begin = split * p.k_per_split;
  const int64_t k_end = k_begin + p.k_per_split < total_k ? k_begin + p.k_per_split : total_k;
  const int steps = k_end > k_begin ? static_cast<int>((k_end - k_begin + kTileK - 1) / kTileK) : 0;

  const int warp = threadIdx.x / 32;
  const int warp_m = warp % Cfg::kWarpsM;
  const int warp_t = warp / Cfg::kWarpsM;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[Cfg::kFragsM][Cfg::kFragsT];
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kFragsT; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  auto w_tile = [&](int stage) { return stage_base + stage * Cfg::kStageElems; };
  auto x_tile = [&](int stage) { return w_tile(stage) + Cfg::kTileM * Cfg::kRowElems; };

  if (steps > 0) load_stage<T, Cfg>(p, w_tile(0), x_tile(0), m0, t0, k_begin, k_end);
  eagle3::cuda::cp_async_commit();
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    if (step + 1 < steps) {
      load_stage<T, Cfg>(p, w_tile((step + 1) % kStages), x_tile((step + 1) % kStages), m0, t0,
                         k_begin + static_cast<int64_t>(step + 1) * kTileK, k_end);
    }
    eagle3::cuda::cp_async_commit();  // an empty group on the last step keeps the count
    eagle3::cuda::cp_async_wait<1>();
    __syncthreads();
    const T* ws = w_tile(stage);
    const T* xs = x_tile(stage);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[Cfg::kFragsM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[Cfg::kFragsT];
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i) {
        const int row = (warp_m * Cfg::kFragsM + i) * 16;
        wmma::load_matrix_sync(a[i], ws + row * Cfg::kRowElems + kk, Cfg::kRowElems);
      }
#pragma unroll
      for (int j = 0; j < Cfg::kFragsT; ++j) {
        const int row = (warp_t * Cfg::kFragsT + j) * 16;
        wmma::load_matrix_sync(b[j], xs + row * Cfg::kRowElems + kk, Cfg::kRowElems);
      }
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kFragsT; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  eagle3::cuda::cp_async_wait<0>();
  __syncthreads();

  // Epilogue: each warp stages one 16x16 fragment at a time (C[m][t], row-major) and writes
  // it with bounds checks, either as the final output or as this split's fp32 partial.
  float* staging = reinterpret_cast<float*>(smem) + warp * 16 * 16;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < Cfg::kFragsT; ++j) {
      wmma::store_matrix_sync(staging, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      const int64_t mb = m0 + (warp_m * Cfg::kFragsM + i) * 16;
      const int64_t tb = t0 + (warp_t * Cfg::kFragsT + j) * 16;
      for (int e = lane; e < 256; e += 32) {
        // Consecutive lanes take consecutive m so that global writes along a row coalesce.
        const int dm = e % 16;
        const int dt = e / 16;
        const int64_t m = mb + dm;
        const int64_t t = tb + dt;
        if (m >= p.out_features || t >= p.rows) continue;
        const float v = staging[dm * 16 + dt];
        if (p.splits == 1) {
          const float b = p.bias ? eagle3::cuda::to_float(p.bias[m]) : 0.f;
          p.out[t * p.out_features + m] = eagle3::cuda::from_float<T>(v + b);
        } else {
          p.partial[(static_cast<int64_t>(split) * p.rows + t) * p.out_features + m] = v;
        }
      }
      __syncwarp();
    }
  }
}

// Sums the split-K partials in split order (deterministic) and adds the bias.
template <typename T>
__global__ void split_k_reduce_kernel(const __grid_constant__ Params<T> p) {
  const int64_t total = p.rows * p.out_features;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i % p.out_features;
    float v = p.bias ? eagle3::cuda::to_float(p.bias[m]) : 0.f;
    for (int s = 0; s < p.splits; ++s) v += p.partial[s * total + i];
    p.out[i] = eagle3::cuda::from_float<T>(v);
  }
}

template <typename T>
__global__ void __launch_bounds__(32 * kSimtWarps) simt_kernel(const __grid_constant__ Params<T> p) {
  const int64_t row_groups = (p.rows + kSimtRows - 1) / kSimtRows;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kSimtWarps + threadIdx.x / 32;
  if (task >= row_groups * p.out_features) return;
  const int64_t m = task % p.out_features;  // neighbouring warps share activation rows
  const int64_t t0 = (task / p.out_features) * kSimtRows;
  const int lane = threadIdx.x % 32;
  float acc[kSimtRows] = {};
  const T* w_row = p.weight + m * p.w_stride;
  for (int s = 0; s < p.num_segments; ++s) {
    const T* w = w_row + s * p.hidden;
    for (int64_t h = lane; h < p.hidden; h += 32) {
      const float wv = eagle3::cuda::to_float(w[h]);
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        if (t0 + r < p.rows) acc[r] += wv * eagle3::cuda::to_float(p.x[s][(t0 + r) * p.x_stride[s] + h]);
      }
    }
  }
  const float b = p.bias ? eagle3::cuda::to_float(p.bias[m]) : 0.f;
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    const float v = eagle3::cuda::warp_sum(acc[r]);
    if (lane == 0 && t0 + r < p.rows) p.out[(t0 + r) * p.out_features + m] = eagle3::cuda::from_float<T>(v + b);
  }
}

}  // namespace eagle3::fused_aux_fc::cuda
