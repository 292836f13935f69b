// Host side of fused_aux_fc's Hopper kernel: one TMA descriptor per aux segment and one for
// the weight, the launch with its dynamic shared memory. The device code is kernel_sm90.cuh.
#include "fused_aux_fc/launch_sm90.h"

#include <limits>

#include <c10/cuda/CUDAException.h>

#include "common/cuda_host.h"
#include "fused_aux_fc/kernel_sm90.cuh"

namespace eagle3::fused_aux_fc::sm90 {
namespace {

using cuda_host::aligned16;

bool fits_int32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

// CuTe's element type for each CUDA half-precision type (same bits).
template <typename T>
struct CutlassElement;
template <>
struct CutlassElement<__half> { using type = cutlass::half_t; };
template <>
struct CutlassElement<__nv_bfloat16> { using type = cutlass::bfloat16_t; };

}  // namespace

bool kernel_available(int device) {
  int major = 0;
  int minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

template <typename T>
bool shape_supported(const cuda::Params<T>& p) {
  if (p.num_segments < 1 || p.num_segments > cuda::kMaxSegments) return false;
  const int64_t total_k = p.num_segments * p.hidden;
  if (p.hidden % kTileK != 0 || !aligned16(p.weight) || !aligned16(p.out)) return false;
  // TMA needs row strides that are multiples of 16 bytes; a stride below the row width (a
  // broadcast view has 0) would make the descriptor encoding fail, so those take another kernel.
  if (p.w_stride % 8 != 0 || p.w_stride < total_k) return false;
  for (int s = 0; s < p.num_segments; ++s) {
    if (p.x_stride[s] % 8 != 0 || p.x_stride[s] < p.hidden || !aligned16(p.x[s])) return false;
  }
  // TMA coordinates are int32, and features index grid.y (at most 65535 tiles).
  return fits_int32(p.rows + kTileM) && fits_int32(total_k) && p.out_features <= 65535LL * kTileN;
}

template <typename T>
void launch(const cuda::Params<T>& p, cudaStream_t stream) {
  using Element = typename CutlassElement<T>::type;
  using Cfg = Config<Element>;
  const int rows = static_cast<int>(p.rows);
  const int hidden = static_cast<int>(p.hidden);
  const int out_features = static_cast<int>(p.out_features);
  Params<Element> params{};
  for (int s = 0; s < p.num_segments; ++s) {
    const auto tma = Cfg::make_tma_x(reinterpret_cast<Element const*>(p.x[s]), rows, hidden, p.x_stride[s]);
    params.x_desc[s] = *tma.get_tma_descriptor();
    if (s == 0) params.tma_x = tma;
  }
  params.tma_w = Cfg::make_tma_w(reinterpret_cast<Element const*>(p.weight), out_features,
                                 p.num_segments * hidden, p.w_stride);
  params.bias = reinterpret_cast<Element const*>(p.bias);
  params.out = reinterpret_cast<Element*>(p.out);
  params.num_segments = p.num_segments;
  params.rows = rows;
  params.hidden = hidden;
  params.out_features = out_features;

  auto* kernel = &wgmma_kernel<Element>;
  // Per launch rather than once: the attribute is held per device, and tensor-parallel
  // processes may drive several.
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Cfg::kSmemBytes));
  const dim3 grid(static_cast<unsigned>((p.rows + kTileM - 1) / kTileM),
                  static_cast<unsigned>((p.out_features + kTileN - 1) / kTileN));
  kernel<<<grid, kThreads, Cfg::kSmemBytes, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template bool shape_supported<__half>(const cuda::Params<__half>&);
template bool shape_supported<__nv_bfloat16>(const cuda::Params<__nv_bfloat16>&);
template void launch<__half>(const cuda::Params<__half>&, cudaStream_t);
template void launch<__nv_bfloat16>(const cuda::Params<__nv_bfloat16>&, cudaStream_t);

}  // namespace eagle3::fused_aux_fc::sm90
