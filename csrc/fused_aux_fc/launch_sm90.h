// Host entry of fused_aux_fc's Hopper (sm_90a) wgmma kernel, kept apart from cuda.cu so that
// only one translation unit pays for the CuTe headers. It takes the same launch parameters as
// the mma.sync kernels (kernel.cuh); T is __half or __nv_bfloat16.
#pragma once

#include <cuda_runtime_api.h>

#include "fused_aux_fc/kernel.cuh"

namespace eagle3::fused_aux_fc::sm90 {

// True when the device is compute capability 9.0, where this build's sm_90a code runs.
bool kernel_available(int device);

// True when the shapes, strides and pointers suit TMA and the K tiling: H a multiple of 64,
// row strides multiples of 8 elements and at least one row wide, 16-byte aligned pointers,
// sizes within int32 and the grid's limits.
template <typename T>
bool shape_supported(const cuda::Params<T>& p);

// Launches on `stream`; requires kernel_available and shape_supported.
template <typename T>
void launch(const cuda::Params<T>& p, cudaStream_t stream);

}  // namespace eagle3::fused_aux_fc::sm90
