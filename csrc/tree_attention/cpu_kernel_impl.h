// The body of the CPU tree-attention kernel. Included by cpu_avx512.cpp, cpu_avx2.cpp and
// cpu_generic.cpp, each defining EAGLE3_TREE_ISA (a namespace name) and compiling it with its own
// flags (cpu_avx2.cpp also EAGLE3_TREE_AVX2: 8-lane intrinsics where GCC's 16-lane lowering is slow).
// Everything here has internal linkage (anonymous namespace) and uses no inline function
// from another header, so no AVX-512 code can leak into the generic build through the linker.
//
// Work split: one task = one request b, one kv head h and a range of its packed query rows
// (the N tree tokens x G = Hq / Hkv q heads that share the kv head, row r = token r / G, head
// h * G + r % G). The task walks the keys in blocks of kKeys positions: the prefix
// [0, cache_lens[b]) with no mask test (only the last, partial block masks its tail), then the
// N tree positions with tree_mask applied. The queries are stored transposed once per task,
// qt[D][rows] (scaled by scale * log2(e)), so that scores come out as vectors over 16 rows:
//   1. K and V rows are converted to fp32 (kf[kKeys][D], vt[kKeys][D]); each K / V element is
//      read once per task and reused by every packed row.
//   2. Scores st[kKeys][rows] = K . q^T in register tiles of 8 keys x 16 rows (8 accumulators,
//      one q vector and eight broadcast key elements per step of D).
//   3. Online softmax in the log2 domain, vectorized over 16 rows (column maxima, no
//      horizontal reductions): running max m and sum l in fp32, an accumulator row rescaled
//      only when its max moves; exp2 by a degree-6 polynomial.
//   4. acc[rows][D] += P . V in register tiles of 4 rows x 64 columns (16 accumulators).
// bfloat16 on an AVX512-BF16 CPU (the AVX-512 build, D a multiple of 16) instead multiplies
// bf16 pairs with vdpbf16ps (exact products, fp32 sums): q . K on unscaled bf16 queries against
// the K rows read in place, and P . V on probabilities rounded to bf16 against V rows
// interleaved in key pairs.
// Nothing of size [N, S] exists: the scratch is O(rows x D + kKeys x D).
// The portable code is written with GCC/Clang vector extensions (16 x fp32), which the
// compiler lowers to AVX-512 in one build and to SSE2 in the portable one; the AVX2 build
// replaces the hot parts (qk_tile, pv_tile, softmax_block, load_row) with 8-lane intrinsics.
#include <cstdint>
#include <cstring>
#if defined(EAGLE3_TREE_AVX512BF16) || defined(EAGLE3_TREE_AVX2)
#include <immintrin.h>
#endif

#include "tree_attention/cpu_kernel.h"

namespace eagle3::tree_attention::cpu::EAGLE3_TREE_ISA {
namespace {

constexpr int kLanes = 16;
typedef float vf __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi __attribute__((vector_size(64), aligned(4)));
typedef uint32_t vu __attribute__((vector_size(64), aligned(4)));
typedef uint16_t vh __attribute__((vector_size(32), aligned(2)));

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_inff();

__attribute__((always_inline)) inline vf splat(float x) { return vf{} + x; }
__attribute__((always_inline)) inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// 2^x for x <= 0 (softmax arguments): round to the nearest integer n, 2^(x - n) by a degree-6
// polynomial on [-0.5, 0.5] (relative error ~1e-7), 2^n through the exponent bits. Below -126
// the result is exactly 0, so masked (-inf) scores give exactly 0. The coefficients, highest
// degree first, are shared by every build's version (exp2_8 below) so that they cannot drift.
constexpr float kExp2Floor = -127.f;  // 2^n with n = -127 gives the +0.0 bit pattern
constexpr float kExp2Poly[7] = {1.5403530393381608e-4f, 1.3333558146428443e-3f, 9.618129107628477e-3f,
                                5.550410866482158e-2f,  2.402265069591007e-1f,  6.931471805599453e-1f,
                                1.f};

__attribute__((always_inline)) inline vf exp2v(vf x) {
  const vf lo = splat(kExp2Floor);
  x = x < lo ? lo : x;
  const vf half = x < splat(0.f) ? splat(-0.5f) : splat(0.5f);
  const vi n = __builtin_convertvector(x + half, vi);  // truncation: round half away from 0
  const vf f = x - __builtin_convertvector(n, vf);
  vf p = splat(kExp2Poly[0]);
#pragma GCC unroll 6
  for (int i = 1; i < 7; ++i) p = p * f + kExp2Poly[i];
  const vi bits = (n + 127) << 23;
  return p * (vf)bits;
}

// cap * tanh(x / cap) * log2(e) (soft-capped logits, into the log2 domain): tanh(|y|) =
// (1 - e) / (1 + e) with e = exp(-2 |y|) <= 1, the sign put back.
__attribute__((always_inline)) inline vf softcap_log2(vf x, float cap) {
  const vf y = x * (1.f / cap);
  const vf ay = y < splat(0.f) ? -y : y;
  const vf e = exp2v(ay * (-2.f * kLog2e));
  vf t = (splat(1.f) - e) / (splat(1.f) + e);
  t = y < splat(0.f) ? -t : t;
  return t * (cap * kLog2e);
}

// --- dtype conversions (fp16 after Maratyszcza's FP16 library, written lane-wise) --------------

__attribute__((always_inline)) inline vf half_to_float(vh h) {
  const vu w = __builtin_convertvector(h, vu) << 16;
  const vu sign = w & 0x80000000u;
  const vu two_w = w + w;
  const vu normalized_bits = (two_w >> 4) + (0xE0u << 23);
  const vf normalized = (vf)normalized_bits * 0x1.0p-112f;
  const vu denormalized_bits = (two_w >> 17) | (126u << 23);
  const vf denormalized = (vf)denormalized_bits - 0.5f;
  const vu result = sign | (two_w < (1u << 27) ? (vu)denormalized
                                               : (vu)normalized);
  return (vf)result;
}

inline uint16_t float_to_half(float f) {
  const float abs_f = bits_to_float(float_to_bits(f) & 0x7fffffffu);
  float base = (abs_f * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Converts n elements of a row of the cache / q dtype to fp32.
template <DType kType>
inline void load_row(const void* src, float* dst, int64_t n) {
  if constexpr (kType == DType::kFloat) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
#ifdef EAGLE3_TREE_AVX2
    // 8 lanes at a time (bf16: the bits moved up; fp16: F16C, exact as the lane-wise code).
    const uint16_t* s8 = static_cast<const uint16_t*>(src);
    int64_t d8 = 0;
    for (; d8 + 8 <= n; d8 += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s8 + d8));
      const __m256 f = kType == DType::kBFloat16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                                                 : _mm256_cvtph_ps(h);
      _mm256_storeu_ps(dst + d8, f);
    }
    for (; d8 < n; ++d8) {
      dst[d8] = kType == DType::kBFloat16 ? bits_to_float(static_cast<uint32_t>(s8[d8]) << 16) : _cvtsh_ss(s8[d8]);
    }
    return;
#endif
    const uint16_t* s = static_cast<const uint16_t*>(src);
    int64_t d = 0;
    for (; d + kLanes <= n; d += kLanes) {
      vh h;
      std::memcpy(&h, s + d, sizeof(h));
      if constexpr (kType == DType::kBFloat16) {
        const vu w = __builtin_convertvector(h, vu) << 16;
        store(dst + d, (vf)w);
      } else {
        store(dst + d, half_to_float(h));
      }
    }
    if (d < n) {
      vh h{};
      std::memcpy(&h, s + d, (n - d) * sizeof(uint16_t));
      float tail[kLanes];
      if constexpr (kType == DType::kBFloat16) {
        const vu w = __builtin_convertvector(h, vu) << 16;
        store(tail, (vf)w);
      } else {
        store(tail, half_to_float(h));
      }
      std::memcpy(dst + d, tail, (n - d) * sizeof(float));
    }
  }
}

template <DType kType>
inline void store_row(const float* src, float factor, void* dst, int64_t n) {
  if constexpr (kType == DType::kFloat) {
    float* o = static_cast<float*>(dst);
    for (int64_t d = 0; d < n; ++d) o[d] = src[d] * factor;
  } else {
    uint16_t* o = static_cast<uint16_t*>(dst);
    for (int64_t d = 0; d < n; ++d) {
      o[d] = kType == DType::kHalf ? float_to_half(src[d] * factor) : float_to_bf16(src[d] * factor);
    }
  }
}

inline int64_t element_size(DType t) { return t == DType::kFloat ? 4 : 2; }

// Element offsets of cache position s of request b, kv head h (contiguous: page b).
inline void kv_offsets(const KvCache& kv, int64_t b, int64_t s, int64_t h, int64_t& k_off,
                       int64_t& v_off) {
  int64_t page = b;
  int64_t row = s;
  if (kv.block_table != nullptr) {
    page = kv.block_table[b * kv.bt_stride + s / kv.page_size];
    row = s % kv.page_size;
  }
  k_off = page * kv.k_page + row * kv.k_row + h * kv.k_head;
  v_off = page * kv.v_page + row * kv.v_row + h * kv.v_head;
}

// s[k][0:16] = sum_d kf[k][d] * qt[d][0:16] for kKeyTile keys: one query vector (16 packed rows,
// qt rows ldq apart) against kKeyTile key rows (kf rows ldk apart); s rows lds apart.
#ifdef EAGLE3_TREE_AVX2
// The AVX2 build's qk_tile on 8-lane registers: GCC splits a 16-lane vector-extension
// multiply by a scalar through the stack, and 8 keys x 2 halves would not fit the 16 ymm
// registers; so two passes of 4 keys, 8 accumulators each.
__attribute__((always_inline)) inline void qk_tile(const float* qt, int64_t ldq, const float* kf,
                                                  int64_t ldk, int64_t D, float* s, int64_t lds) {
  static_assert(kKeyTile % 4 == 0, "qk_tile takes keys in fours");
  for (int j0 = 0; j0 < kKeyTile; j0 += 4) {
    __m256 lo[4], hi[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
    const float* k0 = kf + j0 * ldk;
    for (int64_t d = 0; d < D; ++d) {
      const __m256 q_lo = _mm256_loadu_ps(qt + d * ldq), q_hi = _mm256_loadu_ps(qt + d * ldq + 8);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256 kj = _mm256_broadcast_ss(k0 + j * ldk + d);
        lo[j] = _mm256_fmadd_ps(kj, q_lo, lo[j]);
        hi[j] = _mm256_fmadd_ps(kj, q_hi, hi[j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(s + (j0 + j) * lds, lo[j]);
      _mm256_storeu_ps(s + (j0 + j) * lds + 8, hi[j]);
    }
  }
}
#else
__attribute__((always_inline)) inline void qk_tile(const float* qt, int64_t ldq, const float* kf,
                                                  int64_t ldk, int64_t D, float* s, int64_t lds) {
  vf a[kKeyTile];
#pragma GCC unroll 8
  for (int j = 0; j < kKeyTile; ++j) a[j] = vf{};
  for (int64_t d = 0; d < D; ++d) {
    const vf q = load(qt + d * ldq);
#pragma GCC unroll 8
    for (int j = 0; j < kKeyTile; ++j) a[j] += kf[j * ldk + d] * q;
  }
#pragma GCC unroll 8
  for (int j = 0; j < kKeyTile; ++j) store(s + j * lds, a[j]);
}
#endif

#ifdef EAGLE3_TREE_AVX512BF16
// The bfloat16 variant of qk_tile (AVX512-BF16): qt2[d/2][16 rows][2] holds the unscaled bf16
// queries in pairs along D, krows[j] points at key j's raw bf16 row; each vdpbf16ps multiplies
// two D elements of 16 rows exactly and adds in fp32, so K is never converted. Scores are
// scaled by `scale` on the way out.
__attribute__((always_inline)) inline void qk_tile_bf16(const uint16_t* qt2, int64_t ldq,
                                                       const uint16_t* const* krows, int64_t D2,
                                                       float scale, float* s, int64_t lds) {
  __m512 a[kKeyTile];
#pragma GCC unroll 8
  for (int j = 0; j < kKeyTile; ++j) a[j] = _mm512_setzero_ps();
  for (int64_t dp = 0; dp < D2; ++dp) {
    const __m512bh q = (__m512bh)_mm512_loadu_si512(qt2 + dp * ldq);
#pragma GCC unroll 8
    for (int j = 0; j < kKeyTile; ++j) {
      int32_t pair;
      std::memcpy(&pair, krows[j] + 2 * dp, sizeof(pair));
      a[j] = _mm512_dpbf16_ps(a[j], q, (__m512bh)_mm512_set1_epi32(pair));
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kKeyTile; ++j) _mm512_storeu_ps(s + j * lds, _mm512_mul_ps(a[j], _mm512_set1_ps(scale)));
}

// 16 bf16 from a and 16 from b interleaved as 16 (a_i, b_i) pairs (one 32-bit lane each).
__attribute__((always_inline)) inline __m512i interleave_bf16(__m256i a, __m256i b) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// The bfloat16 variant of pv_tile: o[4][64] += sum over key pairs of p2[kp][row] . v2[kp][64],
// where p2 holds (p[2kp], p[2kp + 1]) of each row as a bf16 pair and v2[kp][d] the pair
// (v[2kp][d], v[2kp + 1][d]); one vdpbf16ps covers two keys.
__attribute__((always_inline)) inline void pv_tile_bf16(const uint32_t* p2, int64_t ldp, int64_t pairs,
                                                       const uint16_t* v2, int64_t ldv, float* o,
                                                       int64_t ldo) {
  __m512 acc[kRowTile][4];
#pragma GCC unroll 4
  for (int i = 0; i < kRowTile; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_loadu_ps(o + i * ldo + j * kLanes);
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const uint16_t* vr = v2 + kp * ldv;
    __m512bh v[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) v[j] = (__m512bh)_mm512_loadu_si512(vr + j * 2 * kLanes);
#pragma GCC unroll 4
    for (int i = 0; i < kRowTile; ++i) {
      const __m512bh pi = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(p2[kp * ldp + i]));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], pi, v[j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < kRowTile; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + i * ldo + j * kLanes, acc[i][j]);
}
#endif

// o[4][64] += sum_k p[k][0:4] * v[k][64] for k < n  (p rows ldp apart, v rows ldv apart, o rows
// ldo apart).
#ifdef EAGLE3_TREE_AVX2
// The AVX2 build's pv_tile (see its qk_tile): 4 rows x 64 columns would take 32 ymm
// accumulators, so four passes of 2 rows x 32 columns, 8 accumulators each.
__attribute__((always_inline)) inline void pv_tile(const float* p, int64_t ldp, int64_t n,
                                                  const float* v, int64_t ldv, float* o,
                                                  int64_t ldo) {
  static_assert(kRowTile % 2 == 0 && kColTile % 32 == 0, "pv_tile takes rows in twos, columns in 32s");
  for (int i0 = 0; i0 < kRowTile; i0 += 2) {
    for (int c0 = 0; c0 < kColTile; c0 += 32) {
      __m256 acc[2][4];
#pragma GCC unroll 2
      for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_loadu_ps(o + (i0 + i) * ldo + c0 + 8 * j);
      for (int64_t k = 0; k < n; ++k) {
        const float* vr = v + k * ldv + c0;
        const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8), v2 = _mm256_loadu_ps(vr + 16),
                     v3 = _mm256_loadu_ps(vr + 24);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
          const __m256 pi = _mm256_broadcast_ss(p + k * ldp + i0 + i);
          acc[i][0] = _mm256_fmadd_ps(pi, v0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(pi, v1, acc[i][1]);
          acc[i][2] = _mm256_fmadd_ps(pi, v2, acc[i][2]);
          acc[i][3] = _mm256_fmadd_ps(pi, v3, acc[i][3]);
        }
      }
#pragma GCC unroll 2
      for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + (i0 + i) * ldo + c0 + 8 * j, acc[i][j]);
    }
  }
}
#else
__attribute__((always_inline)) inline void pv_tile(const float* p, int64_t ldp, int64_t n,
                                                  const float* v, int64_t ldv, float* o,
                                                  int64_t ldo) {
  vf acc[kRowTile][4];
#pragma GCC unroll 4
  for (int i = 0; i < kRowTile; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = load(o + i * ldo + j * kLanes);
  for (int64_t k = 0; k < n; ++k) {
    const float* vr = v + k * ldv;
    const vf v0 = load(vr), v1 = load(vr + kLanes), v2 = load(vr + 2 * kLanes),
             v3 = load(vr + 3 * kLanes);
#pragma GCC unroll 4
    for (int i = 0; i < kRowTile; ++i) {
      const float pi = p[k * ldp + i];
      acc[i][0] += pi * v0;
      acc[i][1] += pi * v1;
      acc[i][2] += pi * v2;
      acc[i][3] += pi * v3;
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < kRowTile; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) store(o + i * ldo + j * kLanes, acc[i][j]);
}
#endif

#ifdef EAGLE3_TREE_AVX2
// exp2v on 8 lanes (the same rounding, polynomial and exponent bits).
__attribute__((always_inline)) inline __m256 exp2_8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kExp2Floor));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 half = _mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(-0.5f), negative);
  const __m256i n = _mm256_cvttps_epi32(_mm256_add_ps(x, half));
  const __m256 f = _mm256_sub_ps(x, _mm256_cvtepi32_ps(n));
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
#pragma GCC unroll 6
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// softmax_block on 8-lane registers (GCC lowers the 16-lane version lane by lane on AVX2).
__attribute__((always_inline)) inline void softmax_block(float* st, int64_t Rp, int64_t n, int64_t rows, float* m,
                                                        float* l, float* acc, int64_t Dvp) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  for (int64_t r = 0; r < Rp; r += 8) {
    __m256 mx = _mm256_loadu_ps(st + r);
    for (int64_t k = 1; k < n; ++k) mx = _mm256_max_ps(mx, _mm256_loadu_ps(st + k * Rp + r));
    const __m256 m_old = _mm256_loadu_ps(m + r);
    const __m256 m_new = _mm256_max_ps(mx, m_old);
    // A row that has seen nothing yet (all -inf) subtracts 0 instead: its p and alpha are 0.
    const __m256 m_use = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
    const __m256 alpha = exp2_8(_mm256_sub_ps(m_old, m_use));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; ++k) {
      const __m256 e = exp2_8(_mm256_sub_ps(_mm256_loadu_ps(st + k * Rp + r), m_use));
      _mm256_storeu_ps(st + k * Rp + r, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_storeu_ps(l + r, _mm256_fmadd_ps(_mm256_loadu_ps(l + r), alpha, sum));
    _mm256_storeu_ps(m + r, m_new);
    float a[8];
    _mm256_storeu_ps(a, alpha);
    for (int i = 0; i < 8 && r + i < rows; ++i) {
      if (a[i] != 1.f) {
        float* ar = acc + (r + i) * Dvp;
        const __m256 ai = _mm256_set1_ps(a[i]);
        for (int64_t d = 0; d < Dvp; d += 8) _mm256_storeu_ps(ar + d, _mm256_mul_ps(_mm256_loadu_ps(ar + d), ai));
      }
    }
  }
}
#else
// Online softmax of one block: st[n][Rp] holds the block's scores (log2 domain), 16 rows per
// vector; turns them into probabilities, folds them into the running max m and sum l, and
// rescales the accumulator rows of acc (Dvp apart) whose max moved.
__attribute__((always_inline)) inline void softmax_block(float* st, int64_t Rp, int64_t n, int64_t rows, float* m,
                                                        float* l, float* acc, int64_t Dvp) {
  const vf neg_inf = splat(kNegInf);
for (int64_t r = 0; r < Rp; r += kLanes) {
  vf mx = load(st + r);
  for (int64_t k = 1; k < n; ++k) {
    const vf x = load(st + k * Rp + r);
    mx = x > mx ? x : mx;
  }
  const vf m_old = load(m + r);
  vf m_new = mx > m_old ? mx : m_old;
  // A row that has seen nothing yet (all -inf) subtracts 0 instead: its p and alpha are 0.
  const vf m_use = m_new == neg_inf ? splat(0.f) : m_new;
  const vf alpha = exp2v(m_old - m_use);
  vf sum = {};
  for (int64_t k = 0; k < n; ++k) {
    const vf e = exp2v(load(st + k * Rp + r) - m_use);
    store(st + k * Rp + r, e);
    sum += e;
  }
  store(l + r, load(l + r) * alpha + sum);
  store(m + r, m_new);
  for (int i = 0; i < kLanes && r + i < rows; ++i) {
    if (alpha[i] != 1.f) {
      float* ar = acc + (r + i) * Dvp;
      for (int64_t d = 0; d < Dvp; d += kLanes) store(ar + d, load(ar + d) * alpha[i]);
    }
  }
}
}
#endif

template <DType kType>
void run_typed(const Params& p, const Task& t, float* scratch) {
  const int64_t b = t.b, h = t.h, row_begin = t.row_begin, row_end = t.row_end;
  const int64_t D = p.head_dim;
  const int64_t Dv = p.v_dim;
  const int64_t Dp = round_up(D, kColTile);
  const int64_t Dvp = round_up(Dv, kColTile);
  const int64_t rows = row_end - row_begin;
  const int64_t Rp = round_up(rows, kLanes);
  const int64_t G = p.q_heads / p.kv_heads;
  const int64_t esize = element_size(kType);

  float* qt = scratch;            // [D][Rp] scaled queries, transposed (rows along lanes)
  float* acc = qt + D * Rp;       // [Rp][Dvp] unnormalized outputs
  float* st = acc + Rp * Dvp;     // [kKeys][Rp] scores, then probabilities
  float* m = st + kKeys * Rp;     // [Rp] running max (log2 domain)
  float* l = m + Rp;              // [Rp] running sum
  float* kf = l + Rp;             // [kKeys][Dp] keys
  float* vt = kf + kKeys * Dp;    // [kKeys][Dvp] values
  float* tmp = vt + kKeys * Dvp;  // [Dp] one converted query row
  // (then, for the bf16 dot-product path, qt2: [D / 2][Rp][2] bf16 = D * Rp / 2 floats, and
  // pt2: [kKeys / 2][Rp] bf16 pairs = kKeys * Rp / 2 floats)

  std::memset(qt, 0, sizeof(float) * D * Rp);
  std::memset(acc, 0, sizeof(float) * Rp * Dvp);
  std::memset(kf, 0, sizeof(float) * kKeys * (Dp + Dvp));

  // With a soft-cap the scores are capped first and moved to the log2 domain after.
  const bool capped = p.softcap > 0.f;
  const float qscale = capped ? p.scale : p.scale * kLog2e;
  const char* qbase = static_cast<const char*>(p.q);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = (row_begin + r) / G;
    const int64_t head = h * G + (row_begin + r) % G;
    const int64_t off = b * p.q_batch + token * p.q_token + head * p.q_head;
    load_row<kType>(qbase + off * esize, tmp, D);
    for (int64_t d = 0; d < D; ++d) qt[d * Rp + r] = tmp[d] * qscale;
  }
  for (int64_t r = 0; r < Rp; ++r) {
    m[r] = kNegInf;
    l[r] = 0.f;
  }
#ifdef EAGLE3_TREE_AVX512BF16
  // bf16 with AVX512-BF16 and Dqk, Dv multiples of 16: q . K and P . V on bf16 pairs
  // (qk_tile_bf16, pv_tile_bf16). The queries go unscaled into qt2[d/2][Rp][2]; K rows are read
  // in place, V rows are interleaved in key pairs into vt2, probabilities rounded to bf16 pairs
  // into pt2.
  const bool bf16_dot = kType == DType::kBFloat16 && p.bf16_dot && D % kLanes == 0 && Dv % kLanes == 0;
  uint16_t* qt2 = reinterpret_cast<uint16_t*>(tmp + Dp);  // [D / 2][Rp][2]
  const uint16_t* krows[kKeys];
  const uint16_t* vrows[kKeys + 1];
  uint16_t* vt2 = reinterpret_cast<uint16_t*>(vt);                 // [kKeys / 2][Dvp][2]
  uint32_t* pt2 = reinterpret_cast<uint32_t*>(qt2 + D * Rp);       // [kKeys / 2][Rp]
  const uint16_t* zero_row = reinterpret_cast<const uint16_t*>(tmp);
  if (bf16_dot) {
    std::memset(tmp, 0, sizeof(float) * Dp);
    std::memset(qt2, 0, sizeof(uint16_t) * D * Rp);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t token = (row_begin + r) / G;
      const int64_t head = h * G + (row_begin + r) % G;
      const int64_t off = b * p.q_batch + token * p.q_token + head * p.q_head;
      const uint16_t* qr = reinterpret_cast<const uint16_t*>(qbase + off * esize);
      for (int64_t d = 0; d < D; ++d) qt2[(d / 2) * Rp * 2 + r * 2 + d % 2] = qr[d];
    }
  }
#else
  constexpr bool bf16_dot = false;
#endif

  const char* kbase = static_cast<const char*>(p.kv.k);
  const char* vbase = static_cast<const char*>(p.kv.v);
  const int64_t prefix = p.cache_lens[b];
  const vf neg_inf = splat(kNegInf);
  const uint8_t* mask_b = p.mask + b * p.m_batch;

  // Sliding window: a tree token's position is prefix + its depth (the tree tokens it sees,
  // itself included, minus one); row r sees positions >= first[r] = its position - W + 1.
  // Tree token j sits at tree_pos[j]. Without a window every row sees from position 0.
  const int64_t W = p.window;
  int64_t tree_pos[kMaxWindowTree];
  int64_t first[kMaxTaskRows];
  int64_t max_first = 0;
  if (W > 0) {
    for (int64_t j = 0; j < p.tree && j < kMaxWindowTree; ++j) {
      int64_t seen = 0;
      for (int64_t c = 0; c < p.tree; ++c) seen += mask_b[j * p.m_row + c * p.m_col] != 0;
      tree_pos[j] = prefix + seen - 1;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    first[r] = W > 0 ? tree_pos[(row_begin + r) / G] - W + 1 : 0;
    max_first = first[r] > max_first ? first[r] : max_first;
  }

  // One block of n <= kKeys keys at cache positions [s0, s0 + n); tree_j0 >= 0 marks a block
  // of tree positions (tree tokens tree_j0 ...), whose scores go through tree_mask.
  // Tree token j's K/V sit at slot tree_slot0 + j (right after the prefix unless tree_start
  // says otherwise); its position stays prefix + depth.
  const int64_t tree_slot0 = p.tree_start != nullptr ? p.tree_start[b] : prefix;
  auto block = [&](int64_t s0, int64_t n, int64_t tree_j0) {
    const int64_t slot0 = tree_j0 >= 0 ? tree_slot0 + tree_j0 : s0;
    for (int64_t k = 0; k < n; ++k) {
      int64_t k_off, v_off;
      kv_offsets(p.kv, b, slot0 + k, h, k_off, v_off);
#ifdef EAGLE3_TREE_AVX512BF16
      if (bf16_dot) {
        krows[k] = reinterpret_cast<const uint16_t*>(kbase + k_off * esize);
      } else {
        load_row<kType>(kbase + k_off * esize, kf + k * Dp, D);
      }
#else
      load_row<kType>(kbase + k_off * esize, kf + k * Dp, D);
#endif
#ifdef EAGLE3_TREE_AVX512BF16
      if (bf16_dot) {
        vrows[k] = reinterpret_cast<const uint16_t*>(vbase + v_off * esize);
        continue;
      }
#endif
      load_row<kType>(vbase + v_off * esize, vt + k * Dvp, Dv);
    }
#ifdef EAGLE3_TREE_AVX512BF16
    if (bf16_dot) {  // V as key pairs: vt2[k / 2][Dp][2]
      if (n % 2) vrows[n] = zero_row;
      for (int64_t k = 0; k < n; k += 2) {
        uint16_t* dst = vt2 + (k / 2) * Dvp * 2;
        for (int64_t d = 0; d < Dv; d += kLanes) {
          const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrows[k] + d));
          const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrows[k + 1] + d));
          _mm512_storeu_si512(dst + d * 2, interleave_bf16(a, c));
        }
      }
    }
#endif
    const int64_t n_tiles = round_up(n, kKeyTile);
    if (bf16_dot) {
#ifdef EAGLE3_TREE_AVX512BF16
      for (int64_t k = n; k < n_tiles; ++k) krows[k] = zero_row;
      for (int64_t k = 0; k < n_tiles; k += kKeyTile) {
        for (int64_t r = 0; r < Rp; r += kLanes) {
          qk_tile_bf16(qt2 + r * 2, Rp * 2, krows + k, D / 2, qscale, st + k * Rp + r, Rp);
        }
      }
#endif
    } else {
      for (int64_t k = 0; k < n_tiles; k += kKeyTile) {
        for (int64_t r = 0; r < Rp; r += kLanes) qk_tile(qt + r, Rp, kf + k * Dp, Dp, D, st + k * Rp + r, Rp);
      }
    }
    if (capped) {
      for (int64_t k = 0; k < n; ++k) {
        for (int64_t r = 0; r < Rp; r += kLanes) store(st + k * Rp + r, softcap_log2(load(st + k * Rp + r), p.softcap));
      }
    }
    for (int64_t k = n; k < kKeys; ++k) {
      for (int64_t r = 0; r < Rp; r += kLanes) store(st + k * Rp + r, neg_inf);
    }
    if (tree_j0 >= 0) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t token = (row_begin + r) / G;
        const uint8_t* mr = mask_b + token * p.m_row + tree_j0 * p.m_col;
        for (int64_t k = 0; k < n; ++k) {
          const bool in_window = W <= 0 || tree_pos[tree_j0 + k] >= first[r];
          if (!mr[k * p.m_col] || !in_window) st[k * Rp + r] = kNegInf;
        }
      }
    } else if (s0 < max_first) {  // prefix keys before a row's window
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < n && s0 + k < first[r]; ++k) st[k * Rp + r] = kNegInf;
      }
    }
    softmax_block(st, Rp, n, rows, m, l, acc, Dvp);
    if (bf16_dot) {
#ifdef EAGLE3_TREE_AVX512BF16
      // P as bf16 key pairs per row: pt2[k / 2][Rp]; a missing odd key has p = 0.
      for (int64_t k = 0; k < n; k += 2) {
        for (int64_t r = 0; r < Rp; r += kLanes) {
          const __m512 a = _mm512_loadu_ps(st + k * Rp + r);
          const __m512 c = k + 1 < n ? _mm512_loadu_ps(st + (k + 1) * Rp + r) : _mm512_setzero_ps();
          const __m512i packed = interleave_bf16((__m256i)_mm512_cvtneps_pbh(a), (__m256i)_mm512_cvtneps_pbh(c));
          _mm512_storeu_si512(pt2 + (k / 2) * Rp + r, packed);
        }
      }
      for (int64_t r = 0; r < rows; r += kRowTile) {
        for (int64_t c = 0; c < Dvp; c += kColTile) {
          pv_tile_bf16(pt2 + r, Rp, (n + 1) / 2, vt2 + c * 2, Dvp * 2, acc + r * Dvp + c, Dvp);
        }
      }
#endif
    } else {
      for (int64_t r = 0; r < rows; r += kRowTile) {
        for (int64_t c = 0; c < Dvp; c += kColTile) {
          pv_tile(st + r, Rp, n, vt + c, Dvp, acc + r * Dvp + c, Dvp);
        }
      }
    }
  };

  // This task's positions [lo, hi) from the request's window start: prefix blocks, then tree
  // blocks.
  const int64_t start = W > 0 && prefix - W + 1 > 0 ? prefix - W + 1 : 0;
  const int64_t lo = start + t.kv_begin;
  const int64_t hi = min64(start + t.kv_end, prefix + p.tree);
  const int64_t prefix_end = min64(hi, prefix);
  for (int64_t s0 = lo; s0 < prefix_end; s0 += kKeys) block(s0, min64(kKeys, prefix_end - s0), -1);
  for (int64_t s0 = lo > prefix ? lo : prefix; s0 < hi; s0 += kKeys) {
    block(s0, min64(kKeys, hi - s0), s0 - prefix);
  }

  if (t.split >= 0) {  // a KV split: normalized fp32 rows and their log2-sum-exp
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t token = (row_begin + r) / G;
      const int64_t head = h * G + (row_begin + r) % G;
      const int64_t idx = ((t.split * p.batch + b) * p.tree + token) * p.q_heads + head;
      const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
      float* o = p.part_out + idx * Dv;
      for (int64_t d = 0; d < Dv; ++d) o[d] = acc[r * Dvp + d] * inv;
      p.part_lse[idx] = l[r] > 0.f ? m[r] + __builtin_log2f(l[r]) : kNegInf;
    }
    return;
  }

  char* obase = static_cast<char*>(p.out);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = (row_begin + r) / G;
    const int64_t head = h * G + (row_begin + r) % G;
    const int64_t off = b * p.o_batch + token * p.o_token + head * p.o_head;
    float factor = 1.f / l[r];
    if (p.sinks != nullptr) {  // the sink joins the denominator: sum + 2^(sink - max)
      const float sink = p.sinks[head] * kLog2e;
      const float top = sink > m[r] ? sink : m[r];
      const float keep = __builtin_exp2f(m[r] - top);
      factor = keep / (l[r] * keep + __builtin_exp2f(sink - top));
    }
    store_row<kType>(acc + r * Dvp, factor, obase + off * esize, Dv);
  }
}

}  // namespace

void run_task(const Params& p, const Task& t, float* scratch) {
  switch (p.dtype) {
    case DType::kFloat:
      run_typed<DType::kFloat>(p, t, scratch);
      break;
    case DType::kHalf:
      run_typed<DType::kHalf>(p, t, scratch);
      break;
    case DType::kBFloat16:
      run_typed<DType::kBFloat16>(p, t, scratch);
      break;
  }
}

}  // namespace eagle3::tree_attention::cpu::EAGLE3_TREE_ISA
