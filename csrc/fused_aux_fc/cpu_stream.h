// The CPU streaming kernel of fused_aux_fc: for few rows the op is bound by reading the
// weight once from memory, so it walks the weight rows once and accumulates every segment
// in fp32 registers (framework-free: raw pointers, sizes, strides).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace eagle3::fused_aux_fc {

// The kernel's accumulator array holds this many activation rows; callers pass larger
// problems in blocks of this many rows (the weight is then read once per block).
inline constexpr int64_t kStreamRowsCap = 64;

// Up to this many rows the AVX-512 build beats ATen's GEMMs (measured on an AVX512-BF16 CPU):
// bf16 GEMMs use the same dot-product instructions with better blocking from ~24 rows on; fp32
// GEMMs catch up around 64 rows; ATen has no fast fp16 GEMM on such CPUs, so the kernel (fp16
// widened to fp32 FMAs) is faster at any size.
template <typename scalar_t>
inline constexpr int64_t kStreamMaxRows =
    std::is_same_v<scalar_t, c10::BFloat16> ? 24
    : std::is_same_v<scalar_t, float>       ? kStreamRowsCap
                                            : std::numeric_limits<int64_t>::max();

// The same for the AVX2 build (measured on a 2-core AVX2 CPU without AVX-512, bundled draft's
// shape, see cpu_stream_avx2.cpp): ATen's half-precision GEMMs there re-block the weight on
// every call, so the kernel wins at any size it was measured at; ATen's fp32 GEMM catches up
// from about 16 rows on (half-precision, 1-128 rows: 2-5x faster than ATen).
template <typename scalar_t>
inline constexpr int64_t kStreamMaxRowsAvx2 =
    std::is_same_v<scalar_t, float> ? 16 : std::numeric_limits<int64_t>::max();

template <typename scalar_t>
struct StreamArgs {
  // bfloat16 multiplies bf16 pairs directly; float16 activations are widened to fp32 once.
  using x_type = std::conditional_t<std::is_same_v<scalar_t, c10::BFloat16>, c10::BFloat16, float>;
  const x_type* x[16] = {};          // k segments, each [rows, hidden]
  int64_t x_stride[16] = {};         // row stride of each segment
  int64_t k = 0;
  const scalar_t* weight = nullptr;  // [out_features, k * hidden], row stride w_stride
  int64_t w_stride = 0;
  const scalar_t* bias = nullptr;    // [out_features] or null
  scalar_t* out = nullptr;           // [rows, out_features], contiguous
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t out_features = 0;
};

// Output features [feature_begin, feature_end) for all rows (rows <= kStreamRowsCap), by each
// build (cpu_stream.cpp, cpu_stream_avx2.cpp).
template <typename scalar_t>
void stream_features_avx512(const StreamArgs<scalar_t>& args, int64_t feature_begin, int64_t feature_end);
template <typename scalar_t>
void stream_features_avx2(const StreamArgs<scalar_t>& args, int64_t feature_begin, int64_t feature_end);

}  // namespace eagle3::fused_aux_fc
