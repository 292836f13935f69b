// The body of fused_aux_fc's CPU streaming kernel, written once over a vector Step (see the
// two builds: cpu_stream.cpp for AVX-512, cpu_stream_avx2.cpp for AVX2 + FMA). Each build
// includes this header in an anonymous namespace of its own, compiled with its own flags.
//
// Work split: the caller hands each thread a range of output features (weight rows). A
// thread walks them in blocks of kFeatureTile weight rows. For each block it walks the k * H
// reduction in chunks of kChunk elements; for each chunk it sweeps the activation rows in
// tiles of kRowTile with a kFeatureTile x kRowTile grid of fp32 vector accumulators in
// registers (spilled to a small per-block array between chunks). Each weight byte comes from
// memory once, the chunk stays in L1 while all row tiles use it, and every loaded vector
// feeds kRowTile (or kFeatureTile) multiply-adds.
//
// A Step<scalar_t> gives: Acc (fp32 accumulator vector), W / X (loaded weight / activation
// vectors), kWidth (hidden elements per step), kFeatureTile, kRowTile, kOneRowFeatureTile
// (the feature tile for a single activation row), Mask with mask(n) (the first n of kWidth
// lanes) and full() (every lane: a mask, or a type of its own whose loads need none), load_w /
// load_x (zero beyond the mask), fma, zero and reduce (horizontal sum).
//
// One activation row (a decode step) gives each loaded weight vector one multiply-add, so the
// loop is bound by the multiply-add's latency along each accumulator and by the weight's
// arrival from memory: the single-row tile is wider (more independent accumulators), and the
// first row tile of each block prefetches the same step of the next block's weight rows (the
// weight is walked in order, but the hardware prefetcher alone left a cold 3 MB head at a
// third of the memory bandwidth).
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "fused_aux_fc/cpu_stream.h"

namespace eagle3::fused_aux_fc {
namespace {

// Scalar conversions written here on the raw bits rather than through c10's inline operators:
// the including file is compiled with ISA flags, and an inline function emitted there could be
// the copy the linker keeps for every other file too.
inline float to_float(float v) { return v; }
inline float to_float(c10::Half v) { return _cvtsh_ss(v.x); }
inline float to_float(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <typename scalar_t>
inline scalar_t from_float(float v) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return v;
  } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
    return c10::Half(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT), c10::Half::from_bits());
  } else {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    // Round to nearest even; NaN stays a quiet NaN.
    const uint16_t out = std::isnan(v) ? uint16_t{0x7fc0}
                                       : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    return c10::BFloat16(out, c10::BFloat16::from_bits());
  }
}

// Hidden elements per chunk: a chunk of kFeatureTile weight rows plus the activation rows
// stays in L1 while every row tile passes over it, so L2 serves each weight byte once.
constexpr int64_t kChunk = 512;

// One vector step at hidden offset h over lanes m: loads kF weight vectors and multiplies each
// with the kR activation rows into v.
template <typename S, typename scalar_t, typename XT, int64_t kF, int64_t kR, typename M>
inline __attribute__((always_inline)) void tile_step(const scalar_t* w, int64_t w_stride, const XT* x,
                                                     int64_t x_stride, int64_t h, M m, typename S::Acc (&v)[kF][kR]) {
  typename S::W wv[kF];
  for (int64_t f = 0; f < kF; ++f) wv[f] = S::load_w(w + f * w_stride + h, m);
  for (int64_t r = 0; r < kR; ++r) {
    const typename S::X xv = S::load_x(x + r * x_stride + h, m);
    for (int64_t f = 0; f < kF; ++f) v[f][r] = S::fma(v[f][r], wv[f], xv);
  }
}

// Adds the products over hidden [h0, h1) of segment s to acc[f][row0 + r]. The full steps run
// in a loop of their own and the partial last step after it: a tail branch inside the loop
// (AVX2's partial loads go through a copy) made the compiler keep the accumulators on the stack.
template <typename S, typename scalar_t, int64_t kF, int64_t kR>
inline void tile_chunk(const StreamArgs<scalar_t>& a, int64_t n0, int64_t row0, int64_t s, int64_t h0, int64_t h1,
                       typename S::Acc (*acc)[kStreamRowsCap]) {
  using XT = typename StreamArgs<scalar_t>::x_type;
  typename S::Acc v[kF][kR];
  for (int64_t f = 0; f < kF; ++f)
    for (int64_t r = 0; r < kR; ++r) v[f][r] = acc[f][row0 + r];
  const scalar_t* w = a.weight + n0 * a.w_stride + s * a.hidden;
  const XT* x = a.x[s] + row0 * a.x_stride[s];
  const int64_t ws = a.w_stride, xs = a.x_stride[s];
  const auto full = S::full();
  int64_t h = h0;
  if (row0 == 0) {
    // The first row tile prefetches the next block's rows, kF rows on (a hint: past the
    // weight's end it is dropped, not read).
    const char* next = reinterpret_cast<const char*>(w + kF * ws);
    for (; h + S::kWidth <= h1; h += S::kWidth) {
      for (int64_t f = 0; f < kF; ++f)
        _mm_prefetch(next + (f * ws + h) * static_cast<int64_t>(sizeof(scalar_t)), _MM_HINT_T0);
      tile_step<S, scalar_t, XT, kF, kR>(w, ws, x, xs, h, full, v);
    }
  } else {
    for (; h + S::kWidth <= h1; h += S::kWidth) tile_step<S, scalar_t, XT, kF, kR>(w, ws, x, xs, h, full, v);
  }
  if (h < h1) tile_step<S, scalar_t, XT, kF, kR>(w, ws, x, xs, h, S::mask(h1 - h), v);
  for (int64_t f = 0; f < kF; ++f)
    for (int64_t r = 0; r < kR; ++r) acc[f][row0 + r] = v[f][r];
}

// Computes out[:, n0 : n0 + kF] over all k segments, chunk by chunk of hidden.
template <typename S, typename scalar_t, int64_t kF>
void feature_block(const StreamArgs<scalar_t>& a, int64_t n0) {
  constexpr int64_t kRowTile = S::kRowTile;
  static_assert(kRowTile <= 4, "the remainder rows below are dispatched for tiles of up to 4 rows");
  typename S::Acc acc[kF][kStreamRowsCap];
  for (int64_t f = 0; f < kF; ++f)
    for (int64_t r = 0; r < a.rows; ++r) acc[f][r] = S::zero();
  for (int64_t s = 0; s < a.k; ++s) {
    for (int64_t h0 = 0; h0 < a.hidden; h0 += kChunk) {
      const int64_t h1 = std::min(a.hidden, h0 + kChunk);
      int64_t row = 0;
      for (; row + kRowTile <= a.rows; row += kRowTile) tile_chunk<S, scalar_t, kF, kRowTile>(a, n0, row, s, h0, h1, acc);
      switch (a.rows - row) {  // fewer than kRowTile rows left
        case 3: tile_chunk<S, scalar_t, kF, 3>(a, n0, row, s, h0, h1, acc); break;
        case 2: tile_chunk<S, scalar_t, kF, 2>(a, n0, row, s, h0, h1, acc); break;
        case 1: tile_chunk<S, scalar_t, kF, 1>(a, n0, row, s, h0, h1, acc); break;
        default: break;
      }
    }
  }
  for (int64_t f = 0; f < kF; ++f) {
    const float b = a.bias ? to_float(a.bias[n0 + f]) : 0.f;
    for (int64_t r = 0; r < a.rows; ++r)
      a.out[r * a.out_features + n0 + f] = from_float<scalar_t>(S::reduce(acc[f][r]) + b);
  }
}

// Output features [feature_begin, feature_end) for all rows, in blocks of kFeatureTile.
template <typename S, typename scalar_t>
void stream_feature_range(const StreamArgs<scalar_t>& a, int64_t feature_begin, int64_t feature_end) {
  int64_t n = feature_begin;
  constexpr int64_t kWide = S::kOneRowFeatureTile;
  if (a.rows == 1) {
    for (; n + kWide <= feature_end; n += kWide) feature_block<S, scalar_t, kWide>(a, n);
  }
  constexpr int64_t kFeatureTile = S::kFeatureTile;
  for (; n + kFeatureTile <= feature_end; n += kFeatureTile) feature_block<S, scalar_t, kFeatureTile>(a, n);
  for (; n < feature_end; ++n) feature_block<S, scalar_t, 1>(a, n);
}

}  // namespace
}  // namespace eagle3::fused_aux_fc
