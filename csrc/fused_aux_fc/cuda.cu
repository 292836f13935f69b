// CUDA entry of eagle3::fused_aux_fc: validates, picks a kernel and a split of K, launches on
// the current stream. The device code is in kernel.cuh.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/cuda_host.h"
#include "common/dispatch.h"
#include "fused_aux_fc/inputs.h"
#include "fused_aux_fc/kernel.cuh"
#if EAGLE3_WITH_SM90_WGMMA
#include "fused_aux_fc/launch_sm90.h"
#endif

namespace eagle3::fused_aux_fc {
namespace {

using cuda_host::DeviceType;
using cuda_host::aligned16;
using cuda_host::sm_count;

// Enough CTAs in flight that every SM keeps several W tiles streaming.
constexpr int kCtasPerSm = 4;
// A split smaller than this many K tiles spends more on partials than it gains.
constexpr int64_t kMinStepsPerSplit = 8;
// Up to this many activation rows one decode tile holds them all (W is streamed once).
constexpr int64_t kDecodeMaxRows = 128;

bool vector_path_ok(const Problem& p) {
  if (p.weight.scalar_type() == at::kFloat) return false;
  if (p.hidden % cuda::kVector != 0 || p.weight.stride(0) % cuda::kVector != 0) return false;
  if (!aligned16(p.weight.data_ptr())) return false;
  for (const at::Tensor& x : p.segments) {
    if (x.stride(0) % cuda::kVector != 0 || !aligned16(x.data_ptr())) return false;
  }
  return true;
}

template <typename T, typename Cfg>
void launch_tensor_core(cuda::Params<T>& params, const Problem& p, cudaStream_t stream) {
  const int64_t tiles_m = (p.out_features + Cfg::kTileM - 1) / Cfg::kTileM;
  const int64_t tiles_t = (p.rows + Cfg::kTileT - 1) / Cfg::kTileT;
  const int64_t total_k = params.num_segments * p.hidden;
  const int64_t k_steps = (total_k + cuda::kTileK - 1) / cuda::kTileK;
  const int64_t wanted = static_cast<int64_t>(sm_count(p.weight.get_device())) * kCtasPerSm;
  int64_t splits = (wanted + tiles_m * tiles_t - 1) / (tiles_m * tiles_t);
  splits = std::max<int64_t>(1, std::min(splits, k_steps / kMinStepsPerSplit));
  const int64_t steps_per_split = (k_steps + splits - 1) / splits;
  params.k_per_split = steps_per_split * cuda::kTileK;
  params.splits = static_cast<int>((total_k + params.k_per_split - 1) / params.k_per_split);

  at::Tensor partial;
  if (params.splits > 1) {
    partial = at::empty({params.splits, p.rows, p.out_features},
                        p.weight.options().dtype(at::kFloat));
    params.partial = partial.data_ptr<float>();
  }
  const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_t),
                  static_cast<unsigned>(params.splits));
  cuda::tensor_core_kernel<T, Cfg><<<grid, Cfg::kThreads, 0, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (params.splits > 1) {
    constexpr int kThreads = 256;
    const int64_t total = p.rows * p.out_features;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
    cuda::split_k_reduce_kernel<T><<<blocks, kThreads, 0, stream>>>(params);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename scalar_t>
void run(const Problem& p, at::Tensor& out) {
  using T = typename DeviceType<scalar_t>::type;
  cuda::Params<T> params{};
  params.num_segments = static_cast<int>(p.segments.size());
  for (int s = 0; s < params.num_segments; ++s) {
    params.x[s] = reinterpret_cast<const T*>(p.segments[s].data_ptr());
    params.x_stride[s] = p.segments[s].stride(0);
  }
  params.weight = reinterpret_cast<const T*>(p.weight.data_ptr());
  params.w_stride = p.weight.stride(0);
  params.bias = p.bias.defined() ? reinterpret_cast<const T*>(p.bias.data_ptr()) : nullptr;
  params.out = reinterpret_cast<T*>(out.data_ptr());
  params.rows = p.rows;
  params.hidden = p.hidden;
  params.out_features = p.out_features;
  params.splits = 1;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  if constexpr (!std::is_same_v<T, float>) {
#if EAGLE3_WITH_SM90_WGMMA
    // Prefill-sized T on Hopper: the TMA + wgmma kernel, when the shapes suit it.
    if (p.rows > kDecodeMaxRows && sm90::shape_supported(params) &&
        sm90::kernel_available(p.weight.get_device())) {
      sm90::launch(params, stream);
      return;
    }
#endif
    if (vector_path_ok(p)) {
      if (p.rows <= 16) {
        launch_tensor_core<T, cuda::DecodeTile<16>>(params, p, stream);
      } else if (p.rows <= 32) {
        launch_tensor_core<T, cuda::DecodeTile<32>>(params, p, stream);
      } else if (p.rows <= 64) {
        launch_tensor_core<T, cuda::DecodeTile<64>>(params, p, stream);
      } else if (p.rows <= kDecodeMaxRows) {
        launch_tensor_core<T, cuda::DecodeTile<128>>(params, p, stream);
      } else {
        launch_tensor_core<T, cuda::PrefillTile>(params, p, stream);
      }
      return;
    }
  }
  const int64_t row_groups = (p.rows + cuda::kSimtRows - 1) / cuda::kSimtRows;
  const int64_t blocks = (row_groups * p.out_features + cuda::kSimtWarps - 1) / cuda::kSimtWarps;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "eagle3.fused_aux_fc: problem too large");
  cuda::simt_kernel<T><<<static_cast<unsigned>(blocks), 32 * cuda::kSimtWarps, 0, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor fused_aux_fc_cuda(at::TensorList aux_hidden, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias) {
  Problem p = check_and_flatten(aux_hidden, weight, bias);
  const c10::cuda::CUDAGuard guard(p.weight.device());
  at::Tensor out = at::empty({p.rows, p.out_features}, p.weight.options());
  if (p.rows > 0 && p.out_features > 0) {
    EAGLE3_DISPATCH_FLOAT_TYPES(out.scalar_type(), "fused_aux_fc", [&] { run<scalar_t>(p, out); });
  }
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CUDA, m) { m.impl("fused_aux_fc", &fused_aux_fc_cuda); }

}  // namespace eagle3::fused_aux_fc
