// Validation of tree_attention's and tree_attention_paged's arguments, shared by the CPU and
// CUDA entries so that both backends reject exactly the same calls with the same messages.
//
// Two layers of checks:
//   check_inputs  shapes, ranks, dtypes, devices, strides: metadata only, never syncs.
//   check_values  what depends on the tensors' contents (cache_lens against the cache size,
//                 the mask's diagonal, block_table entries). On CPU it reads them in place,
//                 on every call. On CUDA the kernel checks the same conditions on the device
//                 (no sync) and only flags them; with validation on (the ops' validate=True,
//                 common/options.h) the CUDA entry reads the flag back and, when set, runs
//                 check_values on host copies so that the error is the CPU entry's.
#pragma once

#include <cmath>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "common/checks.h"

namespace eagle3::tree_attention {

inline constexpr const char* kOp = "tree_attention";
inline constexpr const char* kOpPaged = "tree_attention_paged";

// One call described for both layouts. The contiguous cache is the paged one with a single
// page per request: page b of request b, page_size = S_max, no block table.
struct Problem {
  const char* op = kOp;
  at::Tensor q;            // [B, N, Hq, Dqk], unit stride along the head dim
  at::Tensor k, v;         // [B or P, S_max or page_size, Hkv, Dqk / Dv], unit stride along it
  at::Tensor block_table;  // int32 [B, max_blocks] (paged) or undefined
  at::Tensor cache_lens;   // int32 / int64 [B]
  at::Tensor tree_mask;    // bool [B, N, N]
  at::Tensor sinks;        // fp32 [Hq] contiguous, or undefined
  at::Tensor tree_start;   // int32 / int64 [B]: slot of tree token 0, or undefined (= cache_lens)
  int64_t batch = 0, tree = 0, q_heads = 0, kv_heads = 0;
  int64_t head_dim = 0;    // Dqk: q and k
  int64_t v_dim = 0;       // Dv: v and the output
  int64_t window = 0;      // sliding window in positions, 0 = none
  double softcap = 0.0;    // logit soft-cap, 0 = none
  int64_t page_size = 0;   // rows per page (S_max when contiguous)
  int64_t capacity = 0;    // cache positions each request can address
  int64_t num_pages = 0;   // P (B when contiguous)
  double scale = 1.0;
  bool paged() const { return block_table.defined(); }
  int64_t group() const { return q_heads / kv_heads; }
};

inline void check_cache(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q,
                        const char* layout) {
  EAGLE3_CHECK(op, t.dim() == 4, name, " must have 4 dimensions ", layout, ", got shape ",
               t.sizes());
  check_same_dtype(op, name, t, "q", q);
  check_same_device(op, name, t, "q", q);
  EAGLE3_CHECK(op, t.size(3) <= 1 || t.stride(3) == 1, name,
               " must have unit stride along the head dim (the cache is read in place, never "
               "copied), got strides ",
               t.strides());
}

inline Problem check_inputs(const char* op, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const std::optional<at::Tensor>& block_table,
                            const at::Tensor& cache_lens, const at::Tensor& tree_mask,
                            double scale, int64_t window, double softcap,
                            const std::optional<at::Tensor>& sinks,
                            const std::optional<at::Tensor>& tree_start) {
  const bool paged = block_table.has_value();
  const char* k_name = paged ? "k_pages" : "k_cache";
  const char* v_name = paged ? "v_pages" : "v_cache";
  const char* layout = paged ? "[P, page_size, Hkv, D]" : "[B, S_max, Hkv, D]";

  EAGLE3_CHECK(op, q.dim() == 4, "q must have 4 dimensions [B, N, Hq, D], got shape ", q.sizes());
  check_float_tensor(op, "q", q);
  check_cache(op, k_name, k, q, layout);
  check_cache(op, v_name, v, q, layout);
  EAGLE3_CHECK(op, k.size(3) == q.size(3), k_name, " has head_dim ", k.size(3), " but q has ",
               q.size(3), "; queries and keys must match (values may differ: MLA)");
  EAGLE3_CHECK(op, k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2),
               k_name, " has shape ", k.sizes(), " but ", v_name, " has ", v.sizes(),
               "; they must match in all but the head dim");
  EAGLE3_CHECK(op, v.size(3) > 0, v_name, " has an empty head dim");

  Problem p;
  p.op = op;
  p.batch = q.size(0);
  p.tree = q.size(1);
  p.q_heads = q.size(2);
  p.head_dim = q.size(3);
  p.v_dim = v.size(3);
  p.kv_heads = k.size(2);
  p.scale = scale;
  EAGLE3_CHECK(op, window >= 0, "window must be 0 (none) or a positive number of positions, got ",
               window);
  EAGLE3_CHECK(op, softcap >= 0.0 && std::isfinite(softcap),
               "softcap must be 0 (none) or a positive finite cap, got ", softcap);
  p.window = window;
  p.softcap = softcap;
  if (sinks.has_value()) {
    const at::Tensor& s = *sinks;
    check_float_tensor(op, "sinks", s);
    check_same_device(op, "sinks", s, "q", q);
    EAGLE3_CHECK(op, s.dim() == 1 && s.size(0) == q.size(2), "sinks must have shape [", q.size(2),
                 "] (one logit per query head), got ", s.sizes());
    p.sinks = s.to(at::kFloat).contiguous();
  }
  if (tree_start.has_value()) {
    const at::Tensor& t = *tree_start;
    EAGLE3_CHECK(op, t.dim() == 1 && t.size(0) == q.size(0), "tree_start must have shape [", q.size(0),
                 "] (one slot per request), got ", t.sizes());
    EAGLE3_CHECK_DTYPE(op, t.scalar_type() == at::kInt || t.scalar_type() == at::kLong,
                 "tree_start must be int32 or int64, got ", t.scalar_type());
    check_same_device(op, "tree_start", t, "q", q);
    p.tree_start = t;
  }
  EAGLE3_CHECK(op, p.kv_heads > 0 && p.q_heads % p.kv_heads == 0, "q has ", p.q_heads,
               " heads, which is not a multiple of the ", p.kv_heads, " kv heads of ", k_name,
               " (grouped-query attention needs Hq % Hkv == 0)");
  EAGLE3_CHECK(op, std::isfinite(scale), "scale must be finite, got ", scale);

  EAGLE3_CHECK(op, cache_lens.dim() == 1 && cache_lens.size(0) == p.batch,
               "cache_lens must have shape [", p.batch, "] (one prefix length per request), got ",
               cache_lens.sizes());
  EAGLE3_CHECK_DTYPE(op, cache_lens.scalar_type() == at::kInt || cache_lens.scalar_type() == at::kLong,
               "cache_lens must be int32 or int64, got ", cache_lens.scalar_type());
  check_same_device(op, "cache_lens", cache_lens, "q", q);

  EAGLE3_CHECK_DTYPE(op, tree_mask.scalar_type() == at::kBool, "tree_mask must be bool, got ",
               tree_mask.scalar_type(), " (True = the tree token may see the other one)");
  EAGLE3_CHECK(op, tree_mask.dim() == 3 && tree_mask.size(0) == p.batch &&
                       tree_mask.size(1) == p.tree && tree_mask.size(2) == p.tree,
               "tree_mask must have shape [", p.batch, ", ", p.tree, ", ", p.tree,
               "] ([B, N, N] from q), got ", tree_mask.sizes());
  check_same_device(op, "tree_mask", tree_mask, "q", q);

  if (paged) {
    const at::Tensor& bt = *block_table;
    EAGLE3_CHECK_DTYPE(op, bt.scalar_type() == at::kInt, "block_table must be int32, got ",
                 bt.scalar_type());
    EAGLE3_CHECK(op, bt.dim() == 2 && bt.size(0) == p.batch,
                 "block_table must have shape [", p.batch, ", max_blocks], got ", bt.sizes());
    check_same_device(op, "block_table", bt, "q", q);
    p.block_table = bt;
    p.page_size = k.size(1);
    p.num_pages = k.size(0);
    p.capacity = bt.size(1) * p.page_size;
  } else {
    EAGLE3_CHECK(op, k.size(0) == p.batch, k_name, " holds ", k.size(0),
                 " requests but q has B = ", p.batch);
    p.page_size = k.size(1);
    p.num_pages = k.size(0);
    p.capacity = k.size(1);
  }
  p.q = q.size(3) <= 1 || q.stride(3) == 1 ? q : q.contiguous();
  p.k = k;
  p.v = v;
  p.cache_lens = cache_lens;
  p.tree_mask = tree_mask;
  return p;
}

// Checks that depend on the tensors' contents. `lens`, `diag` and `table` are CPU tensors:
// cache_lens, the mask diagonal [B, N] and the block table (undefined: not checked). The CUDA
// kernel's device-side checks (kernel.cuh, InvalidValue) mirror these conditions.
inline void check_values(const Problem& p, const at::Tensor& lens, const at::Tensor& diag,
                         const at::Tensor& table, const at::Tensor& starts) {
  const char* op = p.op;
  const at::Tensor lens64 = lens.to(at::kLong).contiguous();
  const int64_t* l = lens64.data_ptr<int64_t>();
  const at::Tensor starts64 = starts.defined() ? starts.to(at::kLong).contiguous() : lens64;
  const int64_t* ts = starts64.data_ptr<int64_t>();
  for (int64_t b = 0; b < p.batch; ++b) {
    EAGLE3_CHECK(op, l[b] >= 0, "cache_lens[", b, "] = ", l[b], " is negative");
    EAGLE3_CHECK(op, ts[b] >= l[b], "tree_start[", b, "] = ", ts[b], " is inside the prefix (cache_lens[", b,
                 "] = ", l[b], "): the tree tokens sit after it");
    const int64_t needed = ts[b] + p.tree;
    if (p.paged()) {
      EAGLE3_CHECK(op, needed <= p.capacity, "block_table is too short: request ", b,
                   " needs ", needed, " cache positions (", p.tree_start.defined() ? "tree_start[" : "cache_lens[", b,
                   "] = ", ts[b], " plus ", p.tree, " tree tokens) but block_table has ", p.block_table.size(1),
                   " blocks of ", p.page_size, " = ", p.capacity, " positions");
    } else {
      EAGLE3_CHECK(op, needed <= p.capacity, p.tree_start.defined() ? "tree_start[" : "cache_lens[", b, "] = ",
                   ts[b], " plus the ", p.tree, " tree tokens needs ", needed,
                   " cache positions but k_cache holds S_max = ", p.capacity);
    }
  }
  const at::Tensor d = diag.contiguous();
  const bool* dp = d.data_ptr<bool>();
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.tree; ++i) {
      EAGLE3_CHECK(op, dp[b * p.tree + i], "tree_mask[", b, ", ", i, ", ", i,
                   "] is False: every tree token must see itself (set the diagonal; a padding "
                   "row sets only its diagonal)");
    }
  }
  if (table.defined() && p.page_size > 0) {
    const auto t = table.accessor<int32_t, 2>();
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t blocks = (ts[b] + p.tree + p.page_size - 1) / p.page_size;
      for (int64_t j = 0; j < blocks; ++j) {
        const int64_t page = t[b][j];
        EAGLE3_CHECK(op, page >= 0 && page < p.num_pages, "block_table[", b, ", ", j, "] = ",
                     page, " is not a page of k_pages (P = ", p.num_pages, "); request ", b,
                     " uses its first ", blocks, " blocks");
      }
    }
  }
}

// The two ops' entry points for a backend whose kernel is `run(problem)`: validation, then run.
template <at::Tensor (*run)(const Problem&)>
at::Tensor contiguous_entry(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& cache_lens, const at::Tensor& tree_mask, double scale,
                            int64_t window, double softcap, const std::optional<at::Tensor>& sinks,
                            const std::optional<at::Tensor>& tree_start) {
  return run(check_inputs(kOp, q, k_cache, v_cache, std::nullopt, cache_lens, tree_mask, scale,
                          window, softcap, sinks, tree_start));
}

template <at::Tensor (*run)(const Problem&)>
at::Tensor paged_entry(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages,
                       const at::Tensor& block_table, const at::Tensor& cache_lens,
                       const at::Tensor& tree_mask, double scale, int64_t window, double softcap,
                       const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_start) {
  return run(check_inputs(kOpPaged, q, k_pages, v_pages, block_table, cache_lens, tree_mask, scale,
                          window, softcap, sinks, tree_start));
}

inline at::Tensor empty_output(const Problem& p) {
  return at::empty({p.batch, p.tree, p.q_heads, p.v_dim}, p.q.options());
}

// The earliest cache position any tree token of a request with prefix `len` may see: with a
// window W, the root (depth 0, position len) sees positions > len - W; deeper tokens see less
// of the prefix. 0 without a window.
inline int64_t window_start(int64_t len, int64_t window) {
  return window > 0 && len - window + 1 > 0 ? len - window + 1 : 0;
}

}  // namespace eagle3::tree_attention
