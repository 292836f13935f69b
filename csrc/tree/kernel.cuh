// Device code of the tree ops, free of torch types (plain pointers and sizes). The tree
// logic itself is shared with the CPU kernels (tree_logic.h); this file adds how the work is
// split on the GPU:
//
// build_tree_kernel:  one block per request, one thread per tree node (blockDim >= N, at
//   most kMaxBuildNodes). The block resolves every node's parent into shared memory, then each
//   thread writes its node's position, retrieve-list entries (a scan of the parents, O(N)) and
//   mask row. The request's mask offset in mode 0 is a block-wide sum of the preceding
//   seq_lens.
// verify_greedy_kernel: one thread per request (the walk is a short serial chain of
//   dependent loads; a block per request would leave all but one lane idle).
// tree_sampling_kernel: one block of kSamplingThreads per request. Thread 0 walks the tree
//   (a few dependent loads of single probabilities), then the whole block samples the final
//   token from relu(target - draft) over the vocabulary: pass 1 sums the residual, pass 2
//   scans it chunk by chunk (blockDim x VEC tokens) and stops at the first chunk whose
//   running sum passes coin * total. Rows are read with 16-byte vector loads when V % 4 == 0.
//   Reductions and scans are warp shuffles plus one shared-memory step across warps; in
//   deterministic mode the cross-warp sum is added in warp order, otherwise with shared
//   atomics (the result can then differ in the last bits from run to run).
// tree_sampling_draft_probs_kernel: one block of kSamplingThreads per request. A rejected
//   child needs the new residual's mass (a sum over the vocabulary), so every thread of the
//   block walks the tree (the same reads and decisions in each, thread 0 writes the outputs)
//   and the block sums relu(p - c q) at each rejection; no scratch: the residual is one scalar
//   c (tree_logic.h). The final token is sampled as above from relu(p - c q). Element values
//   use __fmul_rn / __fsub_rn (no FMA), bit for bit the CPU kernel's and the reference's.
//
// Errors: each block stores its request's first TreeError (lowest node) in errors[b], when
// the host passed a buffer (validation on; it then reads them back and raises).
// Without one the errors are dropped, but an invalid request still stops before any read or
// write out of bounds.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/cuda_utils.cuh"
#include "tree/tree_logic.h"

namespace eagle3::tree::cuda {

inline constexpr int kWarpSize = 32;
// Upper bound on N for the build kernel: one thread per node in one block.
inline constexpr int kMaxBuildNodes = 1024;
inline constexpr int kSamplingThreads = 512;
inline constexpr int kSamplingWarps = kSamplingThreads / kWarpSize;
inline constexpr int kGreedyThreads = 128;

// --- build_tree_kernel_efficient --------------------------------------------------------------

struct BuildParams {
  const int64_t* parent_list;   // [bs, parent_cols] or null when parent_cols == 0
  const int64_t* selected;      // [bs, n - 1]
  const int64_t* seq_lens;      // [bs]
  bool* mask_bool;              // modes 0 and 1
  uint8_t* mask_packed;         // mode 2
  int64_t mask_numel;           // elements of the mask tensor (mode 0 bound check)
  int64_t* positions;           // [bs * n]
  int64_t* retrive_index;       // [bs, n]
  int64_t* next_token;          // [bs, n]
  int64_t* next_sibling;        // [bs, n]
  TreeError* errors;            // [bs], or nullptr: errors are not recorded
  int64_t bs, n, topk, parent_cols, mode, row_bytes;
};

__global__ void build_tree_kernel(BuildParams p) {
  extern __shared__ int64_t parents[];  // [n]
  // Lowest node with an invalid parent, then (a separate word, so that no thread lowers one
  // while another reads it) lowest node on a parent cycle; INT_MAX for none.
  __shared__ int parent_error_node;
  __shared__ int cycle_node;
  __shared__ int first_negative;               // first request with seq_len < 0
  __shared__ unsigned long long seq_before;    // sum of seq_len over requests < b
  __shared__ unsigned long long seq_total;     // sum over all requests
  const int64_t b = blockIdx.x, n = p.n;
  const int i = threadIdx.x;
  if (i == 0) {
    parent_error_node = INT_MAX;
    cycle_node = INT_MAX;
    first_negative = INT_MAX;
    seq_before = 0;
    seq_total = 0;
    parents[0] = 0;
  }
  __syncthreads();
  // Mode 0: this request's block starts after the preceding requests' [N, seq_len + N] blocks,
  // and every block checks the mask's total size. A negative seq_len is reported by its own
  // request only (the first one), as the CPU entry does.
  {
    unsigned long long before = 0, total_local = 0;
    for (int64_t r = i; r < p.bs; r += blockDim.x) {
      const int64_t len = p.seq_lens[r];
      if (len < 0) atomicMin(&first_negative, static_cast<int>(r));
      total_local += static_cast<unsigned long long>(len);
      if (r < b) before += static_cast<unsigned long long>(len);
    }
    if (before) atomicAdd(&seq_before, before);
    if (total_local) atomicAdd(&seq_total, total_local);
  }
  __syncthreads();
  // first_negative, seq_before and seq_total are final here (written before the barrier).
  const int64_t seq_len = p.seq_lens[b];
  if (first_negative != INT_MAX) {
    if (i == 0 && first_negative == b && p.errors) p.errors[b] = make_error(kNegativeSeqLen, b, 0, seq_len);
    return;
  }
  // Mode 0: a mask of the wrong size would be written out of bounds. Checked before the tree,
  // as the CPU entry does (every thread computes the same, so the block leaves together).
  if (p.mode == kFullMask) {
    const int64_t needed = static_cast<int64_t>(seq_total) * n + p.bs * n * n;
    if (needed != p.mask_numel) {
      if (i == 0 && p.errors) p.errors[b] = make_error(kMaskSizeMismatch, b, 0, needed);
      return;
    }
  }
  TreeError err;
  BuildRequest r;
  r.parent_row = p.parent_list == nullptr ? nullptr : p.parent_list + b * p.parent_cols;
  r.selected_row = p.selected + b * (n - 1);
  r.parent_cols = p.parent_cols;
  r.topk = p.topk;
  r.n = n;
  r.request = b;
  if (i > 0 && i < n) parents[i] = resolve_parent(r, i, &err);
  if (err.code != kOk) atomicMin(&parent_error_node, i);
  __syncthreads();
  if (parent_error_node != INT_MAX) {  // the same value in every thread: no write after it
    if (i == parent_error_node && p.errors) p.errors[b] = err;
    return;
  }
  int64_t depth = 0;
  if (i < n) {
    depth = node_depth(parents, n, i, b, &err);
    if (err.code != kOk) atomicMin(&cycle_node, i);
  }
  __syncthreads();
  if (cycle_node != INT_MAX) {
    if (i == cycle_node && p.errors) p.errors[b] = err;
    return;
  }
  if (i >= n) return;
  const int64_t mask_offset = static_cast<int64_t>(seq_before) * n + b * n * n;
  const int64_t width = p.mode == kFullMask ? seq_len + n : n;

  p.positions[b * n + i] = seq_len + depth;
  p.retrive_index[b * n + i] = b * n + i;
  int64_t first_child = -1, sibling = -1;
  for (int64_t j = n - 1; j > 0; --j) {
    if (parents[j] == i) first_child = j;
    if (i > 0 && j > i && parents[j] == parents[i]) sibling = j;
  }
  p.next_token[b * n + i] = first_child;
  p.next_sibling[b * n + i] = sibling;

  if (p.mode == kQlenOnlyBitpacking) {
    uint32_t bits = 1u;
    for_each_on_path(parents, i, [&](int64_t j) { bits |= 1u << j; });
    uint8_t* row = p.mask_packed + (b * n + i) * p.row_bytes;
    for (int64_t k = 0; k < p.row_bytes; ++k) row[k] = static_cast<uint8_t>(bits >> (8 * k));
    return;
  }
  const int64_t prefix = p.mode == kFullMask ? seq_len : 0;
  bool* draft_cols = p.mask_bool + (p.mode == kFullMask ? mask_offset : b * n * n) + i * width + prefix;
  draft_cols[0] = true;
  for (int64_t j = 1; j < n; ++j) draft_cols[j] = false;
  for_each_on_path(parents, i, [&](int64_t j) { draft_cols[j] = true; });
}

// --- verify_tree_greedy -------------------------------------------------------------------

__global__ void verify_greedy_kernel(VerifyBatch batch, const int64_t* target_predict,
                                     TreeError* errors) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch.bs) return;
  const TreeError err = verify_greedy_request(batch, b, target_predict);
  if (err.code != kOk && errors) errors[b] = err;
}

// --- tree_speculative_sampling_target_only ------------------------------------------------

struct SamplingParams {
  VerifyBatch batch;
  const float* coins;        // [bs, n]
  const float* final_coins;  // [bs]
  const float* target;       // [bs, n, vocab]
  float* draft;              // [bs, n, vocab]
  TreeError* errors;         // [bs], or nullptr: errors are not recorded
  int64_t vocab;
  float threshold_single, threshold_acc;
};

template <int VEC>
__device__ __forceinline__ void load_residual(const float* q, const float* p, int64_t start,
                                              int64_t vocab, float (&out)[VEC]) {
  if constexpr (VEC == 4) {
    if (start < vocab) {  // vocab % 4 == 0: a vector is all in or all out
      const float4 qv = *reinterpret_cast<const float4*>(q + start);
      float4 pv = make_float4(0.f, 0.f, 0.f, 0.f);
      if (p != nullptr) pv = *reinterpret_cast<const float4*>(p + start);
      out[0] = fmaxf(qv.x - pv.x, 0.f);
      out[1] = fmaxf(qv.y - pv.y, 0.f);
      out[2] = fmaxf(qv.z - pv.z, 0.f);
      out[3] = fmaxf(qv.w - pv.w, 0.f);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const int64_t x = start + k;
    out[k] = x < vocab ? fmaxf(q[x] - (p != nullptr ? p[x] : 0.f), 0.f) : 0.f;
  }
}

// Sum of v over the block, the same in every thread. Deterministic: warp sums added in warp
// order; otherwise shared atomics.
template <bool DETERMINISTIC>
__device__ __forceinline__ float block_sum(float v, float* warp_sums, float* total) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = eagle3::cuda::warp_sum(v);
  if (threadIdx.x == 0) *total = 0.f;
  __syncthreads();
  if (lane == 0) {
    if constexpr (DETERMINISTIC) {
      warp_sums[warp] = v;
    } else {
      atomicAdd(total, v);
    }
  }
  __syncthreads();
  if constexpr (DETERMINISTIC) {
    if (threadIdx.x == 0) {
      float s = 0.f;
      for (int w = 0; w < kSamplingWarps; ++w) s += warp_sums[w];
      *total = s;
    }
    __syncthreads();
  }
  const float result = *total;
  __syncthreads();
  return result;
}

// One chunk of an inverse-CDF draw over a block: v holds this thread's VEC values of the chunk,
// starting at index `start`; `running` is the mass before the chunk (advanced past it). Records
// in shared memory the first index whose inclusive CDF passes u (atomicMin into first_hit) and
// the last index with mass (atomicMax into last_valid, the fallback when rounding keeps the CDF
// below u). Returns, on every thread alike, whether the CDF has passed u.
template <int VEC>
__device__ __forceinline__ bool scan_chunk_for_coin(const float (&v)[VEC], int64_t start, float u, float& running,
                                                    float* warp_sums, int* first_hit, int* last_valid) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float inclusive[VEC];
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) inclusive[k] = (acc += v[k]);
  float scan = acc;  // warp inclusive scan of the per-thread sums
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const float other = __shfl_up_sync(0xffffffffu, scan, offset);
    if (lane >= offset) scan += other;
  }
  if (lane == kWarpSize - 1) warp_sums[warp] = scan;
  __syncthreads();
  float before = running;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  float chunk_total = 0.f;
  for (int w = 0; w < kSamplingWarps; ++w) chunk_total += warp_sums[w];
  before += scan - acc;
  int hit = INT_MAX, valid = -1;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    if (v[k] > 0.f) {
      valid = static_cast<int>(start + k);
      if (hit == INT_MAX && before + inclusive[k] > u) hit = static_cast<int>(start + k);
    }
  }
  if (hit != INT_MAX) atomicMin(first_hit, hit);
  if (valid >= 0) atomicMax(last_valid, valid);
  running += chunk_total;
  __syncthreads();
  return *first_hit != INT_MAX;
}

template <int VEC, bool DETERMINISTIC>
__global__ void __launch_bounds__(kSamplingThreads) tree_sampling_kernel(SamplingParams p) {
  __shared__ int64_t last_global, final_row;
  __shared__ bool subtract_draft;
  __shared__ int walk_failed;
  __shared__ float warp_sums[kSamplingWarps];
  __shared__ float total;
  __shared__ int first_hit;
  __shared__ int last_valid;
  const int64_t b = blockIdx.x, n = p.batch.n, vocab = p.vocab;
  const int tid = threadIdx.x;
  const float* q_rows = p.target + b * n * vocab;
  float* p_rows = p.draft + b * n * vocab;

  if (tid == 0) {
    auto probs = [&](int64_t row, int64_t token) { return q_rows[row * vocab + token]; };
    auto reject = [&](int64_t row, int64_t token) {
      p_rows[row * vocab + token] = q_rows[row * vocab + token];
    };
    SamplingWalk w;
    const TreeError err = sampling_walk_request(p.batch, b, vocab, p.coins + b * n,
                                                p.threshold_single, p.threshold_acc, probs,
                                                reject, &w);
    last_global = w.last_global;
    final_row = w.final_row;
    subtract_draft = w.subtract_draft;
    walk_failed = err.code != kOk;
    if (err.code != kOk && p.errors) p.errors[b] = err;
    first_hit = INT_MAX;
    last_valid = -1;
  }
  __syncthreads();  // also publishes thread 0's draft_probs writes to the block
  if (walk_failed) return;

  const float* q = q_rows + final_row * vocab;
  const float* d = subtract_draft ? p_rows + final_row * vocab : nullptr;
  constexpr int64_t kChunk = static_cast<int64_t>(kSamplingThreads) * VEC;

  // Pass 1: the residual's total mass.
  float local = 0.f;
  for (int64_t start = tid * VEC; start < vocab; start += kChunk) {
    float v[VEC];
    load_residual<VEC>(q, d, start, vocab, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) local += v[k];
  }
  const float u = p.final_coins[b] * block_sum<DETERMINISTIC>(local, warp_sums, &total);

  // Pass 2: inclusive scan chunk by chunk until the running sum passes u.
  float running = 0.f;
  for (int64_t base = 0; base < vocab; base += kChunk) {
    const int64_t start = base + tid * VEC;
    float v[VEC];
    load_residual<VEC>(q, d, start, vocab, v);
    if (scan_chunk_for_coin<VEC>(v, start, u, running, warp_sums, &first_hit, &last_valid)) break;
  }
  if (tid == 0) {
    const int64_t sampled = first_hit != INT_MAX ? first_hit : (last_valid >= 0 ? last_valid : vocab - 1);
    p.batch.predicts[last_global] = static_cast<int32_t>(sampled);
  }
}

// --- tree_speculative_sampling_draft_probs ------------------------------------------------

struct DraftProbsParams {
  VerifyBatch batch;
  const float* coins;        // [bs, n]
  const float* final_coins;  // [bs]
  const float* target;       // [bs, n, vocab]
  const float* draft;        // [bs, n, vocab]
  TreeError* errors;         // [bs], or nullptr: errors are not recorded
  int64_t vocab;
};

// relu(p - c q) for VEC tokens from `start` (0 past the vocabulary).
template <int VEC>
__device__ __forceinline__ void load_draft_residual(const float* p, const float* q, float c,
                                                    int64_t start, int64_t vocab,
                                                    float (&out)[VEC]) {
  if constexpr (VEC == 4) {
    if (start < vocab) {  // vocab % 4 == 0: a vector is all in or all out
      const float4 pv = *reinterpret_cast<const float4*>(p + start);
      const float4 qv = *reinterpret_cast<const float4*>(q + start);
      out[0] = draft_residual(pv.x, qv.x, c);
      out[1] = draft_residual(pv.y, qv.y, c);
      out[2] = draft_residual(pv.z, qv.z, c);
      out[3] = draft_residual(pv.w, qv.w, c);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const int64_t x = start + k;
    out[k] = x < vocab ? draft_residual(p[x], q[x], c) : 0.f;
  }
}

// Sum of relu(p - c q) over the vocabulary, the same in every thread.
template <int VEC, bool DETERMINISTIC>
__device__ __forceinline__ float block_residual_mass(const float* p, const float* q, float c,
                                                     int64_t vocab, float* warp_sums,
                                                     float* total) {
  constexpr int64_t kChunk = static_cast<int64_t>(kSamplingThreads) * VEC;
  float local = 0.f;
  for (int64_t start = threadIdx.x * VEC; start < vocab; start += kChunk) {
    float v[VEC];
    load_draft_residual<VEC>(p, q, c, start, vocab, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) local += v[k];
  }
  return block_sum<DETERMINISTIC>(local, warp_sums, total);
}

// The first token whose running sum of relu(p - c q) passes u, among tokens with positive
// residual; the last such token when rounding leaves the sum short, vocab - 1 when there is
// none. The same in every thread. Chunk by chunk (blockDim x VEC tokens), an inclusive scan
// per chunk, stopping at the first chunk where the running sum passes u.
template <int VEC>
__device__ __forceinline__ int64_t block_sample_draft_residual(const float* p, const float* q,
                                                               float c, int64_t vocab, float u,
                                                               float* warp_sums, int* first_hit,
                                                               int* last_valid) {
  constexpr int64_t kChunk = static_cast<int64_t>(kSamplingThreads) * VEC;
  const int tid = threadIdx.x;
  if (tid == 0) {
    *first_hit = INT_MAX;
    *last_valid = -1;
  }
  __syncthreads();
  float running = 0.f;
  for (int64_t base = 0; base < vocab; base += kChunk) {
    const int64_t start = base + tid * VEC;
    float v[VEC];
    load_draft_residual<VEC>(p, q, c, start, vocab, v);
    if (scan_chunk_for_coin<VEC>(v, start, u, running, warp_sums, first_hit, last_valid)) break;
  }
  const int64_t sampled = *first_hit != INT_MAX ? *first_hit : (*last_valid >= 0 ? *last_valid : vocab - 1);
  __syncthreads();  // every thread has read first_hit / last_valid before they are reused
  return sampled;
}

template <int VEC, bool DETERMINISTIC>
__global__ void __launch_bounds__(kSamplingThreads) tree_sampling_draft_probs_kernel(DraftProbsParams p) {
  __shared__ float warp_sums[kSamplingWarps];
  __shared__ float total;
  __shared__ int first_hit;
  __shared__ int last_valid;
  const int64_t b = blockIdx.x, n = p.batch.n, vocab = p.vocab;
  const float* p_rows = p.target + b * n * vocab;
  const float* q_rows = p.draft + b * n * vocab;
  auto target_at = [&](int64_t row, int64_t token) { return p_rows[row * vocab + token]; };
  auto draft_at = [&](int64_t row, int64_t token) { return q_rows[row * vocab + token]; };
  auto mass = [&](int64_t row, float c) {
    return block_residual_mass<VEC, DETERMINISTIC>(p_rows + row * vocab, q_rows + row * vocab, c,
                                                   vocab, warp_sums, &total);
  };
  // Every thread walks (the decisions depend only on values every thread reads, and the
  // masses are the same in every thread), so the block stays together through the sums.
  DraftProbsWalk w;
  const TreeError err = draft_probs_walk_request(p.batch, b, vocab, p.coins + b * n, target_at,
                                                 draft_at, mass, threadIdx.x == 0, &w);
  if (err.code != kOk) {
    if (threadIdx.x == 0 && p.errors) p.errors[b] = err;
    return;  // every thread: err is the same in all of them
  }
  const float* pr = p_rows + w.final_row * vocab;
  const float* qr = q_rows + w.final_row * vocab;
  float c = w.c;
  float z = block_residual_mass<VEC, DETERMINISTIC>(pr, qr, c, vocab, warp_sums, &total);
  if (!(z > 0.f)) {  // the residual rounded to zero everywhere: the target row (CPU kernel alike)
    c = 0.f;
    z = block_residual_mass<VEC, DETERMINISTIC>(pr, qr, c, vocab, warp_sums, &total);
  }
  const int64_t token = block_sample_draft_residual<VEC>(pr, qr, c, vocab, p.final_coins[b] * z,
                                                         warp_sums, &first_hit, &last_valid);
  if (threadIdx.x == 0) p.batch.predicts[w.last_global] = static_cast<int32_t>(token);
}

}  // namespace eagle3::tree::cuda
