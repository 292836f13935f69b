// Host-side helpers shared by the CUDA launchers (cuda.cu files): c10 dtype -> CUDA dtype, a
// 16-byte alignment test for vector paths, the SM count for grid sizing, the switch for the
// read-back of the errors kernels find in the tensors' values.
#pragma once

#include <cstdint>

#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "common/options.h"

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

// Validation on (the ops' validate=True, common/options.h): the CUDA entries read back what
// their kernels flagged in the tensors' values (cache_lens, tree_mask, block_table, an invalid
// tree) and raise the CPU entries' errors; one synchronization per call. Off by default, so
// that the hot path never waits for the device (the kernels then skip what is invalid without
// reading out of bounds). A thread-local read per call: a wrapper switches it around one call.
inline bool validate_values() { return cuda_validation(); }

// Whether `stream` is being captured into a CUDA graph, where a read-back (a sync) would
// invalidate the capture: the validating entries then skip it.
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace eagle3::cuda_host
