// Host side of fused_aux_fc's Hopper kernel: one TMA descriptor per aux segment and one for
// the weight, the launch with its dynamic shared memory. The device code is kernel_sm90.cuh.
#include "fused_aux_fc/launch_sm90.h"

#include <limits>

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include "fused_aux_fc/kernel_sm90.cuh"

namespace eagle3::fused_aux_fc::sm90 {
namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool fits_int32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

template <class Element>
void launch_typed(const LaunchArgs& a, cudaStream_t stream) {
  using Cfg = Config<Element>;
  const int rows = static_cast<int>(a.rows);
  const int hidden = static_cast<int>(a.hidden);
  const int out_features = static_cast<int>(a.out_features);
  Params<Element> params{};
  for (int s = 0; s < a.num_segments; ++s) {
    const auto tma = Cfg::make_tma_x(static_cast<Element const*>(a.x[s]), rows, hidden, a.x_stride[s]);
    params.x_desc[s] = *tma.get_tma_descriptor();
    if (s == 0) params.tma_x = tma;
  }
  params.tma_w = Cfg::make_tma_w(static_cast<Element const*>(a.weight), out_features,
                                 a.num_segments * hidden, a.w_stride);
  params.bias = static_cast<Element const*>(a.bias);
  params.out = static_cast<Element*>(a.out);
  params.num_segments = a.num_segments;
  params.rows = rows;
  params.hidden = hidden;
  params.out_features = out_features;

  auto* kernel = &wgmma_kernel<Element>;
  // Per launch rather than once: the attribute is held per device, and tensor-parallel
  // processes may drive several.
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Cfg::kSmemBytes));
  const dim3 grid(static_cast<unsigned>((a.rows + kTileM - 1) / kTileM),
                  static_cast<unsigned>((a.out_features + kTileN - 1) / kTileN));
  kernel<<<grid, kThreads, Cfg::kSmemBytes, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool kernel_available(int device) {
  int major = 0;
  int minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

bool shape_supported(const LaunchArgs& a) {
  if (a.num_segments < 1 || a.num_segments > kMaxSegments) return false;
  const int64_t total_k = a.num_segments * a.hidden;
  if (a.hidden % kTileK != 0 || !aligned16(a.weight) || !aligned16(a.out)) return false;
  // TMA needs row strides that are multiples of 16 bytes; a stride below the row width (a
  // broadcast view has 0) would make the descriptor encoding fail, so those take another kernel.
  if (a.w_stride % 8 != 0 || a.w_stride < total_k) return false;
  for (int s = 0; s < a.num_segments; ++s) {
    if (a.x_stride[s] % 8 != 0 || a.x_stride[s] < a.hidden || !aligned16(a.x[s])) return false;
  }
  // TMA coordinates are int32, and features index grid.y (at most 65535 tiles).
  return fits_int32(a.rows + kTileM) && fits_int32(total_k) && a.out_features <= 65535LL * kTileN;
}

void launch(const LaunchArgs& args, cudaStream_t stream) {
  if (args.bfloat16) {
    launch_typed<cutlass::bfloat16_t>(args, stream);
  } else {
    launch_typed<cutlass::half_t>(args, stream);
  }
}

}  // namespace eagle3::fused_aux_fc::sm90
