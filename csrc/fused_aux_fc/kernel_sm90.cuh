// Hopper (sm_90a) mainloop of fused_aux_fc for prefill-sized T, written with CuTe: TMA loads
// into 128-byte-swizzled shared memory, wgmma from shared memory, fp32 accumulators.
// Framework-free (CuTe, CUTLASS's barriers and kernel.cuh's launch parameters) so any launcher
// can use it.
//
// The GEMM is out[T, N] = X[T, K] . W[N, K]^T with K = k * H, so both operands are K-major
// (the layout wgmma reads without transposition). X is not one tensor but k segments, each
// with its own pointer and row stride: every segment gets its own TMA descriptor (built on
// the host, carried in the kernel parameters), and the K loop picks the descriptor of the
// segment a K tile falls in, k_tile / (H / kTileK), at the tile's offset inside it. H must be
// a multiple of kTileK so that no tile straddles two segments; the launcher checks this.
//
// One CTA computes a kTileM x kTileN output tile with two consumer warpgroups stacked along
// M. One elected thread issues the TMA loads of a kStages-deep ring; a "full" transaction
// barrier per stage says its bytes have landed, an "empty" barrier (all threads arrive) says
// the wgmmas that read it are done and it may be refilled. Rows past T and weight rows past
// N are zero-filled by TMA and never stored.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include "fused_aux_fc/kernel.cuh"

namespace eagle3::fused_aux_fc::sm90 {

inline constexpr int kTileM = 128;  // activation rows per CTA (2 warpgroups x 64)
inline constexpr int kTileN = 128;  // output features per CTA
inline constexpr int kTileK = 64;   // one 128-byte swizzle row of 16-bit elements
inline constexpr int kStages = 4;
inline constexpr int kThreads = 256;

template <class Element>
struct Config {
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using SmemLayoutX = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileK>{}, cute::Int<kStages>{})));
  using SmemLayoutW = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::make_shape(cute::Int<kTileN>{}, cute::Int<kTileK>{}, cute::Int<kStages>{})));
  using MmaOp = decltype(cute::SM90::GMMA::ss_op_selector<Element, Element, float, TileShape,
                                                          cute::GMMA::Major::K,
                                                          cute::GMMA::Major::K>());
  using TiledMma =
      decltype(cute::make_tiled_mma(MmaOp{}, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

  static constexpr int kStageBytes = (kTileM + kTileN) * kTileK * static_cast<int>(sizeof(Element));
  // X and W rings, then the full and empty barriers of every stage.
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * static_cast<int>(sizeof(uint64_t));

  // A row-major [rows, cols] matrix with a runtime row stride, as TMA sees it.
  static auto gmem_matrix(Element const* ptr, int rows, int cols, int64_t row_stride) {
    return cute::make_tensor(cute::make_gmem_ptr(ptr), cute::make_shape(rows, cols),
                             cute::make_stride(row_stride, cute::Int<1>{}));
  }
  static auto make_tma_x(Element const* ptr, int rows, int hidden, int64_t row_stride) {
    return cute::make_tma_atom(cute::SM90_TMA_LOAD{}, gmem_matrix(ptr, rows, hidden, row_stride),
                               SmemLayoutX{}(cute::_, cute::_, 0),
                               cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileK>{}));
  }
  static auto make_tma_w(Element const* ptr, int out_features, int total_k, int64_t row_stride) {
    return cute::make_tma_atom(cute::SM90_TMA_LOAD{},
                               gmem_matrix(ptr, out_features, total_k, row_stride),
                               SmemLayoutW{}(cute::_, cute::_, 0),
                               cute::make_shape(cute::Int<kTileN>{}, cute::Int<kTileK>{}));
  }
  using TmaX = decltype(make_tma_x(nullptr, 0, 0, 0));
  using TmaW = decltype(make_tma_w(nullptr, 0, 0, 0));
};

template <class Element>
struct Params {
  typename Config<Element>::TmaX tma_x;        // segment 0: the partitioning of every segment
  cute::TmaDescriptor x_desc[cuda::kMaxSegments];  // one descriptor per segment
  typename Config<Element>::TmaW tma_w;        // [out_features, k * hidden]
  Element const* bias;                         // [out_features] or nullptr
  Element* out;                                // [rows, out_features], contiguous
  int num_segments;
  int rows;
  int hidden;
  int out_features;
};

template <class Element>
__global__ void __launch_bounds__(kThreads, 1) wgmma_kernel(const __grid_constant__ Params<Element> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Cfg = Config<Element>;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  // The 128-byte swizzle repeats every 1024 bytes; both rings start on such a boundary.
  extern __shared__ __align__(1024) unsigned char smem[];
  Element* x_ring = reinterpret_cast<Element*>(smem);
  Element* w_ring = x_ring + cosize_v<typename Cfg::SmemLayoutX>;
  uint64_t* full = reinterpret_cast<uint64_t*>(w_ring + cosize_v<typename Cfg::SmemLayoutW>);
  uint64_t* empty = full + kStages;
  Tensor sX = make_tensor(make_smem_ptr(x_ring), typename Cfg::SmemLayoutX{});  // (BM, BK, stage)
  Tensor sW = make_tensor(make_smem_ptr(w_ring), typename Cfg::SmemLayoutW{});  // (BN, BK, stage)

  // TMA coordinate views: one segment [rows, hidden] and the weight [out_features, k * hidden].
  const int total_k = p.num_segments * p.hidden;
  Tensor mX = p.tma_x.get_tma_tensor(make_shape(p.rows, p.hidden));
  Tensor mW = p.tma_w.get_tma_tensor(make_shape(p.out_features, total_k));
  Tensor gX = local_tile(mX, make_shape(Int<kTileM>{}, Int<kTileK>{}), make_coord(blockIdx.x, _));
  Tensor gW = local_tile(mW, make_shape(Int<kTileN>{}, Int<kTileK>{}), make_coord(blockIdx.y, _));
  auto [tXgX, tXsX] = tma_partition(p.tma_x, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sX),
                                    group_modes<0, 2>(gX));  // (TMA, h_tile), (TMA, stage)
  auto [tWgW, tWsW] = tma_partition(p.tma_w, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sW),
                                    group_modes<0, 2>(gW));  // (TMA, k_tile), (TMA, stage)

  const int tiles_per_segment = p.hidden / kTileK;
  const int k_tiles = p.num_segments * tiles_per_segment;
  const bool producer = threadIdx.x == 0;

  // Loads K tile `k_tile` into `stage`: the segment's descriptor for X, the weight's for W.
  auto load = [&](int k_tile, int stage) {
    const int segment = k_tile / tiles_per_segment;
    const int h_tile = k_tile - segment * tiles_per_segment;
    FullBarrier::arrive_and_expect_tx(&full[stage], Cfg::kStageBytes);
    copy(p.tma_x.with(&p.x_desc[segment], full[stage]), tXgX(_, h_tile), tXsX(_, stage));
    copy(p.tma_w.with(full[stage]), tWgW(_, k_tile), tWsW(_, stage));
  };

  if (producer) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&full[s], 1);
      EmptyBarrier::init(&empty[s], kThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (producer) {
    for (int k_tile = 0; k_tile < kStages && k_tile < k_tiles; ++k_tile) load(k_tile, k_tile);
  }

  typename Cfg::TiledMma mma;
  ThrMMA thr_mma = mma.get_thread_slice(threadIdx.x);
  Tensor tCrX = thr_mma.make_fragment_A(thr_mma.partition_A(sX));  // smem descriptors per stage
  Tensor tCrW = thr_mma.make_fragment_B(thr_mma.partition_B(sW));
  Tensor acc = partition_fragment_C(mma, make_shape(Int<kTileM>{}, Int<kTileN>{}));
  clear(acc);

  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    const int stage = k_tile % kStages;
    FullBarrier::wait(&full[stage], (k_tile / kStages) & 1);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    gemm(mma, tCrX(_, _, _, stage), tCrW(_, _, _, stage), acc);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    EmptyBarrier::arrive(&empty[stage]);
    const int next = k_tile + kStages;
    if (producer && next < k_tiles) {
      // Refill this stage once every thread has finished reading it.
      EmptyBarrier::wait(&empty[stage], (k_tile / kStages) & 1);
      load(next, stage);
    }
  }

  // Epilogue: each accumulator knows its (row, feature) through the same partitioning of an
  // identity tensor; rows and features past the problem are dropped.
  Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
  const int row0 = blockIdx.x * kTileM;
  const int feature0 = blockIdx.y * kTileN;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) {
    const int row = row0 + get<0>(coords(i));
    const int feature = feature0 + get<1>(coords(i));
    if (row < p.rows && feature < p.out_features) {
      const float bias = p.bias != nullptr ? static_cast<float>(p.bias[feature]) : 0.f;
      p.out[static_cast<int64_t>(row) * p.out_features + feature] = Element(acc(i) + bias);
    }
  }
#endif
}

}  // namespace eagle3::fused_aux_fc::sm90
