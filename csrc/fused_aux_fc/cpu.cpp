// CPU entry of eagle3::fused_aux_fc.
//
// Few rows (decode; any number for float16): the streaming kernel reads the weight once per
// block of rows and accumulates all k segments in fp32 registers.
// More rows, float32: one ATen GEMM per weight column block, accumulated into the output
// (beta = 1); fp32 accumulation is exact and no activation is copied.
// More rows, float16 / bfloat16: ATen's half-precision GEMMs round their output, so
// accumulating column blocks would round the running sum k times, and GEMMs over K = H are
// measurably less efficient than one over K = k * H. Instead row tiles of the k segments are
// packed side by side into a reused, cache-sized scratch buffer and each tile runs one GEMM
// over the full K with fp32 accumulation: the [rows, k * hidden] concatenation never exists
// beyond one tile.
// Up to kSwappedMaxRows rows that GEMM is computed transposed, out^T = W . X^T: oneDNN's
// half-precision GEMM re-blocks its second operand on every call, and as X^T that is the
// small activation tile rather than the whole weight (measured 4-17% faster at 32-64 rows,
// H = 1024 and 4096). The transposed result is the only per-call allocation besides the output.
#include <array>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/cpu_isa.h"
#include "common/dispatch.h"
#include "fused_aux_fc/cpu_stream.h"
#include "fused_aux_fc/inputs.h"

namespace eagle3::fused_aux_fc {
namespace {

// The widest streaming build this CPU runs for scalar_t (AVX-512 needs AVX512-BF16 for bf16).
template <typename scalar_t>
CpuIsa widest_stream_isa() {
#if defined(__x86_64__) || defined(_M_X64)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") &&
                      (!std::is_same_v<scalar_t, c10::BFloat16> || __builtin_cpu_supports("avx512bf16"));
  if (avx512) return CpuIsa::kAvx512;
#endif
  return cpu_has_avx2() ? CpuIsa::kAvx2 : CpuIsa::kGeneric;
}

// The build to run: the widest, under the process's cap (common/cpu_isa.h); kGeneric: none,
// the op uses ATen's GEMMs.
template <typename scalar_t>
CpuIsa stream_isa() {
  static const CpuIsa widest = widest_stream_isa<scalar_t>();
  return capped_isa(widest);
}

// The most rows `isa`'s build takes in one call for scalar_t before ATen's GEMMs are faster.
template <typename scalar_t>
int64_t stream_max_rows(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 ? kStreamMaxRows<scalar_t> : isa == CpuIsa::kAvx2 ? kStreamMaxRowsAvx2<scalar_t> : 0;
}

// Output features per parallel task of the streaming kernel.
constexpr int64_t kStreamGrain = 16;

template <typename scalar_t>
void run_stream_kernel(const Problem& p, at::Tensor& out, CpuIsa isa) {
  using x_type = typename StreamArgs<scalar_t>::x_type;
  const int64_t k = static_cast<int64_t>(p.segments.size());
  // float16 activations are widened once (they are small next to the weight) so the inner
  // loop is a plain fp32 multiply-add.
  std::vector<at::Tensor> xs;
  for (const at::Tensor& x : p.segments) xs.push_back(x.to(c10::CppTypeToScalarType<x_type>::value));
  for (int64_t row0 = 0; row0 < p.rows; row0 += kStreamRowsCap) {
    StreamArgs<scalar_t> a;
    a.k = k;
    for (int64_t s = 0; s < k; ++s) {
      a.x[s] = xs[s].data_ptr<x_type>() + row0 * xs[s].stride(0);
      a.x_stride[s] = xs[s].stride(0);
    }
    a.weight = p.weight.data_ptr<scalar_t>();
    a.w_stride = p.weight.stride(0);
    a.bias = p.bias.defined() ? p.bias.data_ptr<scalar_t>() : nullptr;
    a.out = out.data_ptr<scalar_t>() + row0 * p.out_features;
    a.rows = std::min(kStreamRowsCap, p.rows - row0);
    a.hidden = p.hidden;
    a.out_features = p.out_features;
    at::parallel_for(0, p.out_features, kStreamGrain, [&](int64_t begin, int64_t end) {
      if (isa == CpuIsa::kAvx512) {
        stream_features_avx512<scalar_t>(a, begin, end);
      } else {
        stream_features_avx2<scalar_t>(a, begin, end);
      }
    });
  }
}

// Scratch budget for one packed row tile: large enough that a tile is a full-speed GEMM,
// small enough to stay in the last-level cache between packing and use.
constexpr int64_t kPackBytes = 8 << 20;
// A GEMM over fewer rows than this loses efficiency; tiles are never split finer.
constexpr int64_t kMinPackRows = 256;
// Up to this many rows the packed GEMM runs transposed (see the file comment); beyond it the
// two forms measure the same.
constexpr int64_t kSwappedMaxRows = 64;

// Rows per tile: the fewest tiles that respect the budget, balanced so that no small
// remainder tile runs a GEMM of its own.
int64_t packed_tile_rows(int64_t rows, int64_t row_bytes) {
  const int64_t budget_rows = std::max(kMinPackRows, kPackBytes / row_bytes);
  const int64_t tiles = (rows + budget_rows - 1) / budget_rows;
  return (rows + tiles - 1) / tiles;
}

// A per-thread buffer of at least `numel` elements of the weight's dtype, reused across calls.
at::Tensor scratch_buffer(int64_t numel, const at::TensorOptions& options) {
  thread_local at::Tensor scratch;
  if (!scratch.defined() || scratch.scalar_type() != options.dtype().toScalarType() ||
      scratch.numel() < numel) {
    scratch = at::empty({numel}, options);
  }
  return scratch.narrow(0, 0, numel);
}

// Copies rows [r0, r0 + n) of the k segments side by side into dst ([n, k * hidden]) with
// ATen's cat kernel, the same copy the unfused baseline makes, but into reused memory.
void pack_rows(const Problem& p, int64_t r0, int64_t n, at::Tensor& dst) {
  std::array<at::Tensor, kMaxSegments> rows;
  const size_t k = p.segments.size();
  for (size_t s = 0; s < k; ++s) rows[s] = p.segments[s].narrow(0, r0, n);
  at::cat_out(dst, at::TensorList(rows.data(), k), 1);
}

// out = packed @ W^T (+ bias), or for few rows (out^T = W @ packed^T)^T.
void packed_gemm(const Problem& p, const at::Tensor& packed, at::Tensor& out) {
  if (out.size(0) <= kSwappedMaxRows) {
    at::Tensor out_t = at::empty({p.out_features, out.size(0)}, out.options());
    if (p.bias.defined()) {
      // A [out_features, 1] bias broadcasts along rows and is added before the one rounding.
      at::addmm_out(out_t, p.bias.unsqueeze(1), p.weight, packed.t());
    } else {
      at::mm_out(out_t, p.weight, packed.t());
    }
    out.copy_(out_t.t());
  } else if (p.bias.defined()) {
    at::addmm_out(out, p.bias, packed, p.weight.t());
  } else {
    at::mm_out(out, packed, p.weight.t());
  }
}

void run_packed_row_tiles(const Problem& p, at::Tensor& out) {
  const int64_t width = static_cast<int64_t>(p.segments.size()) * p.hidden;
  const int64_t tile_rows = packed_tile_rows(p.rows, width * p.weight.element_size());
  const at::Tensor scratch = scratch_buffer(tile_rows * width, p.weight.options());
  for (int64_t r0 = 0; r0 < p.rows; r0 += tile_rows) {
    const int64_t n = std::min(tile_rows, p.rows - r0);
    at::Tensor tile = scratch.narrow(0, 0, n * width).view({n, width});
    pack_rows(p, r0, n, tile);
    at::Tensor out_tile = out.narrow(0, r0, n);
    packed_gemm(p, tile, out_tile);
  }
}

void run_segment_gemms(const Problem& p, at::Tensor& out) {
  const int64_t k = static_cast<int64_t>(p.segments.size());
  for (int64_t s = 0; s < k; ++s) {
    at::Tensor w_s = p.weight.narrow(1, s * p.hidden, p.hidden).t();
    if (s == 0) {
      if (p.bias.defined()) {
        at::addmm_out(out, p.bias, p.segments[0], w_s);
      } else {
        at::mm_out(out, p.segments[0], w_s);
      }
    } else {
      out.addmm_(p.segments[s], w_s);
    }
  }
}

at::Tensor fused_aux_fc_cpu(at::TensorList aux_hidden, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
  Problem p = check_and_flatten(aux_hidden, weight, bias);
  at::Tensor out = at::empty({p.rows, p.out_features}, p.weight.options());
  if (p.rows > 0 && p.out_features > 0) {
    bool streamed = false;
    EAGLE3_DISPATCH_FLOAT_TYPES(out.scalar_type(), "fused_aux_fc", [&] {
      const CpuIsa isa = stream_isa<scalar_t>();
      if (isa != CpuIsa::kGeneric && p.rows <= stream_max_rows<scalar_t>(isa)) {
        run_stream_kernel<scalar_t>(p, out, isa);
        streamed = true;
      }
    });
    if (!streamed) {
      if (p.weight.scalar_type() == at::kFloat) {
        run_segment_gemms(p, out);
      } else {
        run_packed_row_tiles(p, out);
      }
    }
  }
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) { m.impl("fused_aux_fc", &fused_aux_fc_cpu); }

}  // namespace eagle3::fused_aux_fc
