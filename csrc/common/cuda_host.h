// Host-side helpers shared by the CUDA launchers (cuda.cu files): c10 dtype -> CUDA dtype, a
// 16-byte alignment test for vector paths, the SM count for grid sizing.
#pragma once

#include <cstdint>

#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace eagle3::cuda_host {

// The device element type of a c10 scalar type: float, __half, __nv_bfloat16.
template <typename T>
struct DeviceType { using type = T; };
template <>
struct DeviceType<c10::Half> { using type = __half; };
template <>
struct DeviceType<c10::BFloat16> { using type = __nv_bfloat16; };

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

inline int sm_count(int device) {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace eagle3::cuda_host
