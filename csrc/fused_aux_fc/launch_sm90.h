// Host entry of fused_aux_fc's Hopper (sm_90a) wgmma kernel, kept apart from cuda.cu so that
// only one translation unit pays for the CuTe headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::fused_aux_fc::sm90 {

// The call as raw pointers: k segments [rows, hidden] with row strides (elements), the weight
// [out_features, k * hidden] with row stride w_stride, an optional bias, a contiguous output.
struct LaunchArgs {
  const void* x[16];
  int64_t x_stride[16];
  int num_segments;
  const void* weight;
  int64_t w_stride;
  const void* bias;
  void* out;
  int64_t rows;
  int64_t hidden;
  int64_t out_features;
  bool bfloat16;  // else float16
};

// True when this build carries the kernel (sm_90a among the compiled architectures and the
// CuTe headers found) and the device is compute capability 9.0.
bool kernel_available(int device);

// True when the shapes, strides and pointers suit TMA and the K tiling: H a multiple of 64,
// row strides multiples of 8 elements and at least one row wide, 16-byte aligned pointers,
// sizes within int32 and the grid's limits.
bool shape_supported(const LaunchArgs& args);

// Launches on `stream`; requires kernel_available and shape_supported.
void launch(const LaunchArgs& args, cudaStream_t stream);

}  // namespace eagle3::fused_aux_fc::sm90
