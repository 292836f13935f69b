// The AVX-512 build of fused_aux_fc's streaming kernel (cpu_stream_impl.h; compiled with
// AVX-512 flags, see CMakeLists.txt; the op checks stream_isa() first).
// bfloat16 uses the AVX512-BF16 dot product (exact products, fp32 sums); float16 widens to
// fp32 on load; all three dtypes accumulate in fp32.
#include <immintrin.h>

#include "fused_aux_fc/cpu_stream_impl.h"

namespace eagle3::fused_aux_fc {
namespace {

// One vector step of the reduction for each dtype: how many hidden elements it covers, how
// to load a (masked) step of weights and activations, and the multiply-add.
template <typename scalar_t>
struct Step512;

template <>
struct Step512<float> {
  using Acc = __m512;
  static constexpr int64_t kWidth = 16;
  static constexpr int64_t kFeatureTile = 4;
  static constexpr int64_t kRowTile = 4;
  static constexpr int64_t kOneRowFeatureTile = 8;
  using W = __m512;
  using X = __m512;
  using Mask = __mmask16;
  static W load_w(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static X load_x(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static Acc fma(Acc acc, W w, X x) { return _mm512_fmadd_ps(w, x, acc); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static float reduce(Acc v) { return _mm512_reduce_add_ps(v); }
  static __mmask16 mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static __mmask16 full() { return 0xffff; }
};

template <>
struct Step512<c10::Half> {
  using Acc = __m512;
  static constexpr int64_t kWidth = 16;
  static constexpr int64_t kFeatureTile = 4;
  static constexpr int64_t kRowTile = 4;
  static constexpr int64_t kOneRowFeatureTile = 8;
  using W = __m512;
  using X = __m512;
  using Mask = __mmask16;
  static W load_w(const c10::Half* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
  static X load_x(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static Acc fma(Acc acc, W w, X x) { return _mm512_fmadd_ps(w, x, acc); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static float reduce(Acc v) { return _mm512_reduce_add_ps(v); }
  static __mmask16 mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static __mmask16 full() { return 0xffff; }
};

template <>
struct Step512<c10::BFloat16> {
  using Acc = __m512;
  static constexpr int64_t kWidth = 32;
  static constexpr int64_t kFeatureTile = 4;
  static constexpr int64_t kRowTile = 4;
  static constexpr int64_t kOneRowFeatureTile = 8;
  using W = __m512bh;
  using X = __m512bh;
  using Mask = __mmask32;
  static W load_w(const c10::BFloat16* p, __mmask32 m) {
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
  }
  static X load_x(const c10::BFloat16* p, __mmask32 m) {
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
  }
  static Acc fma(Acc acc, W w, X x) { return _mm512_dpbf16_ps(acc, w, x); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static float reduce(Acc v) { return _mm512_reduce_add_ps(v); }
  static __mmask32 mask(int64_t n) {
    return static_cast<__mmask32>(n >= 32 ? 0xffffffffu : ((1u << n) - 1u));
  }
  static __mmask32 full() { return 0xffffffffu; }
};

}  // namespace

template <typename scalar_t>
void stream_features_avx512(const StreamArgs<scalar_t>& a, int64_t feature_begin, int64_t feature_end) {
  stream_feature_range<Step512<scalar_t>>(a, feature_begin, feature_end);
}

template void stream_features_avx512<float>(const StreamArgs<float>&, int64_t, int64_t);
template void stream_features_avx512<c10::Half>(const StreamArgs<c10::Half>&, int64_t, int64_t);
template void stream_features_avx512<c10::BFloat16>(const StreamArgs<c10::BFloat16>&, int64_t, int64_t);

}  // namespace eagle3::fused_aux_fc
