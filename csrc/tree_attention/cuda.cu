// CUDA entries of eagle3::tree_attention and eagle3::tree_attention_paged: validate what the
// host knows (shapes, dtypes, sizes), choose the head-dim tile and the number of KV splits,
// launch on the current stream. Device code: kernel.cuh. Nothing here reads the tensors'
// values, so a call never waits for the device and can be captured into a CUDA graph; the
// kernel checks the values itself, and with validation on (the ops' validate=True,
// common/options.h) the host reads its verdict back and raises the CPU entry's error
// (raise_flagged).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/cuda_host.h"
#include "common/dispatch.h"
#include "tree_attention/inputs.h"
#include "tree_attention/kernel.cuh"

namespace eagle3::tree_attention {
namespace {

using cuda_host::DeviceType;
using cuda_host::aligned16;
using cuda_host::sm_count;

// Aim for this many CTAs per SM before splitting the KV range further.
constexpr int64_t kCtasPerSm = 2;
constexpr int64_t kMaxHeadDim = 256;
// The grid's y (requests) and z (splits) dimensions.
constexpr int64_t kMaxGridYZ = 65535;

template <typename T, int kDp>
void launch(cuda::Params<T>& params, const Problem& p, cudaStream_t stream) {
  // The tree tokens' depths are kept in shared memory only with a sliding window.
  const int depths = params.window > 0 ? params.tree : 0;
  const int bytes = cuda::Smem<T, kDp>::bytes(params.mask_words, depths);
  auto kernel = cuda::tree_attention_kernel<T, kDp>;
  // Raise the kernel's dynamic shared-memory limit once per device and size (not on every
  // call, so that launches inside a CUDA graph capture do nothing but launch).
  constexpr int kDevices = 64;
  static int configured[kDevices] = {};
  const int device = p.q.get_device();
  if (device >= kDevices || configured[device] < bytes) {
    // Say so instead of failing in cudaFuncSetAttribute if a call needs more than the device
    // has (the largest tile, fp32 with Dqk or Dv above 128, needs ~150 KB: sm_80 has 163 KB).
    int optin = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    EAGLE3_CHECK(p.op, bytes <= optin, "this call needs ", bytes,
                 " bytes of shared memory per block (", p.q.scalar_type(), ", head dims ",
                 p.head_dim, " / ", p.v_dim, " in a tile of ", kDp, ", N = ", p.tree,
                 p.window > 0 ? " with a window" : "", ") but the device allows ", optin);
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (device < kDevices) configured[device] = bytes;
  }
  const dim3 grid(static_cast<unsigned>(p.kv_heads * params.row_tiles),
                  static_cast<unsigned>(p.batch), static_cast<unsigned>(params.splits));
  kernel<<<grid, cuda::kThreads, bytes, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (params.splits > 1) {
    const int64_t rows = p.batch * p.tree * p.q_heads;
    const unsigned blocks = static_cast<unsigned>((rows + cuda::kWarps - 1) / cuda::kWarps);
    cuda::merge_splits_kernel<T><<<blocks, cuda::kThreads, 0, stream>>>(params);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename scalar_t>
void run_typed(const Problem& p, const at::Tensor& lens, const at::Tensor& table, const at::Tensor& starts,
               int* error, at::Tensor& out) {
  using T = typename DeviceType<scalar_t>::type;
  cuda::Params<T> params{};
  params.q = reinterpret_cast<const T*>(p.q.data_ptr());
  params.q_batch = p.q.stride(0);
  params.q_token = p.q.stride(1);
  params.q_head = p.q.stride(2);
  params.out = reinterpret_cast<T*>(out.data_ptr());
  params.o_batch = out.stride(0);
  params.o_token = out.stride(1);
  params.o_head = out.stride(2);
  params.k = reinterpret_cast<const T*>(p.k.data_ptr());
  params.v = reinterpret_cast<const T*>(p.v.data_ptr());
  params.k_page = p.k.stride(0);
  params.k_row = p.k.stride(1);
  params.k_head = p.k.stride(2);
  params.v_page = p.v.stride(0);
  params.v_row = p.v.stride(1);
  params.v_head = p.v.stride(2);
  params.page_size = p.page_size;
  params.num_pages = p.num_pages;
  params.capacity = p.capacity;
  params.error = error;
  if (p.paged()) {
    params.block_table = table.data_ptr<int32_t>();
    params.bt_stride = table.stride(0);
  }
  params.cache_lens = lens.data_ptr<int32_t>();
  params.tree_start = starts.defined() ? starts.data_ptr<int32_t>() : nullptr;
  params.mask = p.tree_mask.data_ptr<bool>();
  params.m_batch = p.tree_mask.stride(0);
  params.m_row = p.tree_mask.stride(1);
  params.m_col = p.tree_mask.stride(2);
  params.batch = static_cast<int>(p.batch);
  params.tree = static_cast<int>(p.tree);
  params.q_heads = static_cast<int>(p.q_heads);
  params.kv_heads = static_cast<int>(p.kv_heads);
  params.head_dim = static_cast<int>(p.head_dim);
  params.v_dim = static_cast<int>(p.v_dim);
  params.group = static_cast<int>(p.group());
  params.rows = static_cast<int>(p.tree * p.group());
  params.row_tiles = (params.rows + cuda::kTileRows - 1) / cuda::kTileRows;
  params.mask_words = static_cast<int>((p.tree + 63) / 64);
  params.scale = static_cast<float>(p.scale);
  params.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  params.softcap = static_cast<float>(p.softcap);
  params.window = p.window;
  if (p.sinks.defined()) params.sinks = p.sinks.data_ptr<float>();  // fp32 [Hq], contiguous

  // 16-byte vectors: both widths (K rows are Dqk, V rows Dv) whole vectors, pointers aligned.
  constexpr int64_t kVec = 16 / sizeof(T);
  params.vec_ok = p.head_dim % kVec == 0 && p.v_dim % kVec == 0 && aligned16(params.k) &&
                  aligned16(params.v);
  const int64_t strides[] = {params.k_page, params.k_row, params.k_head,
                             params.v_page, params.v_row, params.v_head};
  for (const int64_t s : strides) params.vec_ok = params.vec_ok && s % kVec == 0;

  // KV splits: the host fixes how many per request, enough CTAs for every SM, without reading
  // cache_lens (no sync); each CTA then cuts its request's real length on the device
  // (kernel.cuh, request_plan), so a short request in a large cache is spread over the splits
  // and the splits past its end return at once. `range` bounds every request's visible length
  // (the capacity, or with a window W at most W - 1 prefix positions plus the N tree tokens):
  // more splits than range / kMinSplitKeys could never all hold positions.
  int64_t range = p.capacity;
  if (p.window > 0) range = std::min(p.capacity, std::min(p.window, p.capacity) + p.tree - 1);
  const int64_t ctas = p.batch * p.kv_heads * params.row_tiles;
  const int64_t wanted = sm_count(p.q.get_device()) * kCtasPerSm;
  int64_t splits = std::max<int64_t>(1, (wanted + ctas - 1) / ctas);
  splits = std::min(splits, std::max<int64_t>(1, range / cuda::kMinSplitKeys));
  params.splits = static_cast<int>(std::min(splits, kMaxGridYZ));
  TORCH_CHECK(p.batch <= kMaxGridYZ, "eagle3.", p.op, ": batch is limited to ", kMaxGridYZ, " on CUDA");

  at::Tensor part_out, part_lse;
  if (params.splits > 1) {
    const auto f32 = out.options().dtype(at::kFloat);
    part_out = at::empty({params.splits, p.batch, p.tree, p.q_heads, p.v_dim}, f32);
    part_lse = at::empty({params.splits, p.batch, p.tree, p.q_heads}, f32);
    params.part_out = part_out.data_ptr<float>();
    params.part_lse = part_lse.data_ptr<float>();
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // One head-dim tile for Q / K and V / O: the larger of Dqk and Dv.
  const int64_t width = std::max(p.head_dim, p.v_dim);
  if (width <= 64) {
    launch<T, 64>(params, p, stream);
  } else if (width <= 128) {
    launch<T, 128>(params, p, stream);
  } else {
    launch<T, 256>(params, p, stream);
  }
}

// Sizes the kernel divides by or needs room for, all known on the host (checked even while a
// CUDA graph is captured, where no value is read): a page of at least one row, and room for
// the N tree tokens in every request's cache.
void check_sizes(const Problem& p) {
  if (p.paged()) {
    EAGLE3_CHECK(p.op, p.page_size > 0, "k_pages has pages of 0 rows (shape ", p.k.sizes(),
                 "); page_size must be at least 1");
    EAGLE3_CHECK(p.op, p.capacity >= p.tree, "block_table has ", p.block_table.size(1), " blocks of ",
                 p.page_size, " = ", p.capacity, " positions, fewer than the ", p.tree, " tree tokens");
  } else {
    EAGLE3_CHECK(p.op, p.capacity >= p.tree, "k_cache holds S_max = ", p.capacity,
                 " positions, fewer than the ", p.tree, " tree tokens");
  }
}

// Validation on: reads the kernel's InvalidValue bits back (a sync; skipped while the
// stream is captured) and, when one is set, raises the CPU entry's error for the same call
// (check_values on host copies of cache_lens, the mask diagonal, block_table and tree_start).
void raise_flagged(const Problem& p, const at::Tensor& error) {
  if (cuda_host::capturing(c10::cuda::getCurrentCUDAStream())) return;
  const int bits = error.item<int>();
  if (bits == 0) return;
  check_values(p, p.cache_lens.cpu(), p.tree_mask.diagonal(0, 1, 2).cpu(),
               p.paged() ? p.block_table.cpu() : at::Tensor(),
               p.tree_start.defined() ? p.tree_start.cpu() : at::Tensor());
  EAGLE3_CHECK(p.op, false, "the kernel found invalid values (bits ", bits,
               ": 1 cache_lens / tree_start, 2 tree_mask diagonal, 4 block_table)");
}

at::Tensor run(const Problem& p) {
  const c10::cuda::CUDAGuard guard(p.q.device());
  EAGLE3_CHECK(p.op, p.head_dim <= kMaxHeadDim, "the q / k head dim ", p.head_dim,
               " is not supported on CUDA (at most ", kMaxHeadDim, ")");
  EAGLE3_CHECK(p.op, p.v_dim <= kMaxHeadDim, "the v head dim ", p.v_dim,
               " is not supported on CUDA (at most ", kMaxHeadDim, ")");
  at::Tensor out = empty_output(p);
  if (out.numel() == 0) return out;
  check_sizes(p);
  const bool validate = cuda_host::validate_values();
  const at::Tensor error = validate ? at::zeros({1}, p.q.options().dtype(at::kInt)) : at::Tensor();
  const at::Tensor lens = p.cache_lens.to(at::kInt).contiguous();
  const at::Tensor table = p.paged() ? p.block_table.contiguous() : at::Tensor();
  const at::Tensor starts = p.tree_start.defined() ? p.tree_start.to(at::kInt).contiguous() : at::Tensor();
  int* error_ptr = validate ? error.data_ptr<int>() : nullptr;
  EAGLE3_DISPATCH_FLOAT_TYPES(out.scalar_type(), "tree_attention", [&] {
    run_typed<scalar_t>(p, lens, table, starts, error_ptr, out);
  });
  if (validate) raise_flagged(p, error);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CUDA, m) {
  m.impl("tree_attention", &contiguous_entry<run>);
  m.impl("tree_attention_paged", &paged_entry<run>);
}

}  // namespace eagle3::tree_attention
