// The AVX2 + FMA build of fused_aux_fc's streaming kernel (cpu_stream_impl.h; compiled with
// AVX2 flags, see CMakeLists.txt; the op checks stream_isa() first). CPUs without AVX-512
// otherwise send few-row problems to ATen's GEMMs, whose half-precision path re-blocks the
// whole weight on every call: 0.2-0.6 ms for the bundled draft's projection of 1-16 rows,
// where reading the weight once takes tens of microseconds.
// bfloat16 and float16 widen to fp32 on load (bf16 by a 16-bit shift: products stay exact);
// all three dtypes accumulate in fp32 with 8-lane FMAs. The last, partial step of a chunk
// goes through a zero-filled copy (AVX2 has no masked 16-bit loads).
#include <immintrin.h>

#include "fused_aux_fc/cpu_stream_impl.h"

namespace eagle3::fused_aux_fc {
namespace {

constexpr int64_t kLanes = 8;

inline __m256 widen_bf16(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// n < kLanes elements of p, zero-filled to kLanes.
template <typename T>
inline void copy_partial(const T* p, int64_t n, T (&buf)[kLanes]) {
  std::memset(buf, 0, sizeof(buf));
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
}

inline __m256 load_f32(const float* p, int64_t n) {
  if (n == kLanes) return _mm256_loadu_ps(p);
  float buf[kLanes];
  copy_partial(p, n, buf);
  return _mm256_loadu_ps(buf);
}

inline __m256 load_f16(const c10::Half* p, int64_t n) {
  if (n == kLanes) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  c10::Half buf[kLanes];
  copy_partial(p, n, buf);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buf)));
}

inline __m256 load_bf16(const c10::BFloat16* p, int64_t n) {
  if (n == kLanes) return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  c10::BFloat16 buf[kLanes];
  copy_partial(p, n, buf);
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buf)));
}

inline float reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 ymm registers: a 4 x 2 accumulator grid, 4 weight vectors and one activation vector.
struct Step256Base {
  using Acc = __m256;
  using W = __m256;
  using X = __m256;
  using Mask = int64_t;  // valid lanes
  static constexpr int64_t kWidth = kLanes;
  static constexpr int64_t kFeatureTile = 4;
  static constexpr int64_t kRowTile = 2;
  // 16 vector registers: 4 weights, 4 accumulators and the activation already take 9.
  static constexpr int64_t kOneRowFeatureTile = 4;
  static Mask mask(int64_t n) { return n; }
  static Acc fma(Acc acc, W w, X x) { return _mm256_fmadd_ps(w, x, acc); }
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(Acc v) { return reduce8(v); }
};

template <typename scalar_t>
struct Step256;

template <>
struct Step256<float> : Step256Base {
  static W load_w(const float* p, Mask n) { return load_f32(p, n); }
  static X load_x(const float* p, Mask n) { return load_f32(p, n); }
};

template <>
struct Step256<c10::Half> : Step256Base {
  static W load_w(const c10::Half* p, Mask n) { return load_f16(p, n); }
  static X load_x(const float* p, Mask n) { return load_f32(p, n); }  // widened by the caller
};

template <>
struct Step256<c10::BFloat16> : Step256Base {
  static W load_w(const c10::BFloat16* p, Mask n) { return load_bf16(p, n); }
  static X load_x(const c10::BFloat16* p, Mask n) { return load_bf16(p, n); }
};

}  // namespace

template <typename scalar_t>
void stream_features_avx2(const StreamArgs<scalar_t>& a, int64_t feature_begin, int64_t feature_end) {
  stream_feature_range<Step256<scalar_t>>(a, feature_begin, feature_end);
}

template void stream_features_avx2<float>(const StreamArgs<float>&, int64_t, int64_t);
template void stream_features_avx2<c10::Half>(const StreamArgs<c10::Half>&, int64_t, int64_t);
template void stream_features_avx2<c10::BFloat16>(const StreamArgs<c10::BFloat16>&, int64_t, int64_t);

}  // namespace eagle3::fused_aux_fc
