// The AVX2 + FMA build of fused_aux_fc's streaming kernel (cpu_stream_impl.h; compiled with
// AVX2 flags, see CMakeLists.txt; the op checks stream_isa() first). CPUs without AVX-512
// otherwise send few-row problems to ATen's GEMMs, whose half-precision path re-blocks the
// whole weight on every call: 0.2-0.6 ms for the bundled draft's projection of 1-16 rows,
// where reading the weight once takes tens of microseconds.
// float16 widens to fp32 on load; all three dtypes accumulate in fp32 with 8-lane FMAs (bf16
// products stay exact). bfloat16 takes 16 elements a step as one 256-bit load and splits them
// in place, as AVX512-BF16's pair dot product does: each 32-bit lane holds an (even, odd) pair,
// so a mask keeps the odd element and a 16-bit shift makes the even one, both already fp32;
// the activation is split the same way and two FMAs add both halves. Widening 8 elements at a
// time instead (a zero-extending load, then the shift) spends two instructions per 8 weights
// where this spends three per 16: the bundled draft's head (384 -> 4096, one row, weights in
// cache) took 72 us against 51 us now (43 against 62 GB/s), six rows 305 against 290 us. The
// last, partial step of a chunk goes through a zero-filled copy (AVX2 has no masked 16-bit
// loads).
#include <immintrin.h>

#include "fused_aux_fc/cpu_stream_impl.h"

namespace eagle3::fused_aux_fc {
namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kBf16PairLanes = 2 * kLanes;

// Every lane of a step: the loads of the full steps need no mask.
struct Full {};

// n < kLanes elements of p, zero-filled to kLanes.
template <typename T, int64_t kN>
inline void copy_partial(const T* p, int64_t n, T (&buf)[kN]) {
  std::memset(buf, 0, sizeof(buf));
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
}

inline __m256 load_f32(const float* p, Full) { return _mm256_loadu_ps(p); }
inline __m256 load_f32(const float* p, int64_t n) {
  float buf[kLanes];
  copy_partial(p, n, buf);
  return _mm256_loadu_ps(buf);
}

inline __m256 load_f16(const c10::Half* p, Full) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load_f16(const c10::Half* p, int64_t n) {
  c10::Half buf[kLanes];
  copy_partial(p, n, buf);
  return load_f16(buf, Full{});
}

// 16 bf16 elements as fp32: lane j of ``even`` is element 2j, of ``odd`` element 2j + 1.
struct Bf16Pairs {
  __m256 even, odd;
};

inline Bf16Pairs split_bf16(__m256i bits) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)), _mm256_castsi256_ps(_mm256_and_si256(bits, high))};
}

inline Bf16Pairs load_bf16_pairs(const c10::BFloat16* p, Full) {
  return split_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Bf16Pairs load_bf16_pairs(const c10::BFloat16* p, int64_t n) {
  c10::BFloat16 buf[kBf16PairLanes];
  copy_partial(p, n, buf);
  return load_bf16_pairs(buf, Full{});
}

inline float reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The common part of the three dtypes' steps. The tiles are each dtype's own, sized so that the
// kF x kR accumulators, the weights and the activation fit the 16 ymm registers: a tile that
// spills runs at half speed. Measured on SmolLM2-135M's 6-row verify (2 threads, weights in
// memory), the fp32 tiles 3 x 4 and 4 x 3 tie and 4 x 2 and 2 x 4 are slower; bf16's 2 x 4 and
// 2 x 3 tie and 3 x 2 and 4 x 2 spill.
struct Step256Base {
  using Acc = __m256;
  using Mask = int64_t;  // valid lanes
  static constexpr int64_t kWidth = kLanes;
  static Mask mask(int64_t n) { return n; }
  static Full full() { return {}; }
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(Acc v) { return reduce8(v); }
};

template <typename scalar_t>
struct Step256;

// fp32 and fp16 (widened on load): 3 x 4 accumulators, 3 weights and the activation: 16.
struct Step256Fp32Tiles : Step256Base {
  using W = __m256;
  using X = __m256;
  static constexpr int64_t kFeatureTile = 3;
  static constexpr int64_t kRowTile = 4;
  static constexpr int64_t kOneRowFeatureTile = 4;
  static Acc fma(Acc acc, W w, X x) { return _mm256_fmadd_ps(w, x, acc); }
};

template <>
struct Step256<float> : Step256Fp32Tiles {
  template <typename M>
  static W load_w(const float* p, M m) { return load_f32(p, m); }
  template <typename M>
  static X load_x(const float* p, M m) { return load_f32(p, m); }
};

template <>
struct Step256<c10::Half> : Step256Fp32Tiles {
  template <typename M>
  static W load_w(const c10::Half* p, M m) { return load_f16(p, m); }
  template <typename M>
  static X load_x(const float* p, M m) { return load_f32(p, m); }  // widened by the caller
};

// 16 elements a step (the file's comment): one accumulator per (feature, row), two FMAs into it.
// 2 x 4 accumulators, 2 weights' halves and the activation's halves: 14 registers.
template <>
struct Step256<c10::BFloat16> : Step256Base {
  using W = Bf16Pairs;
  using X = Bf16Pairs;
  static constexpr int64_t kWidth = kBf16PairLanes;
  static constexpr int64_t kFeatureTile = 2;
  static constexpr int64_t kRowTile = 4;
  // The single-row tile stays at 4 features: four weights' halves, four accumulators and the
  // activation's halves take 14 of the 16 registers (8 features spilled: 120 us for the head).
  static constexpr int64_t kOneRowFeatureTile = 4;
  template <typename M>
  static W load_w(const c10::BFloat16* p, M m) { return load_bf16_pairs(p, m); }
  template <typename M>
  static X load_x(const c10::BFloat16* p, M m) { return load_bf16_pairs(p, m); }
  static Acc fma(Acc acc, const W& w, const X& x) {
    return _mm256_fmadd_ps(w.odd, x.odd, _mm256_fmadd_ps(w.even, x.even, acc));
  }
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
