// CPU entries of eagle3::tree_attention and eagle3::tree_attention_paged: validate, describe
// the call to the framework-free kernel (cpu_kernel.h), split it into tasks and run them with
// at::parallel_for.
//
// Tasks: (request b, kv head h, block of packed query rows). The N x G query rows of one
// (b, h) (G = Hq / Hkv) share every K / V element, so a task takes as many of them as fit
// cpu::kMaxTaskRows; only when B x Hkv gives fewer tasks than threads are the rows split
// further (each split re-reads that head's K / V, from cache on a long prefix), and then the
// cache positions (KV splits with fp32 partials merged by log-sum-exp).
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/cpu_isa.h"
#include "tree_attention/cpu_kernel.h"
#include "tree_attention/inputs.h"

namespace eagle3::tree_attention {
namespace {

constexpr int64_t kMinRowsPerTask = 8;
// A KV split shorter than this many positions costs more in partials than it gains.
constexpr int64_t kMinSplitPositions = 512;
constexpr int64_t kScratchAlign = 16;  // floats (64 bytes)

using TaskRunner = void (*)(const cpu::Params&, const cpu::Task&, float*);

// The widest build the CPU runs: AVX-512 (AVX-512F), then AVX2, then the portable one, under
// the process's cap (common/cpu_isa.h).
TaskRunner pick_task_runner() {
#if defined(__x86_64__) || defined(_M_X64)
  static const CpuIsa widest = __builtin_cpu_supports("avx512f") ? CpuIsa::kAvx512
                               : cpu_has_avx2()                  ? CpuIsa::kAvx2
                                                                 : CpuIsa::kGeneric;
#else
  static const CpuIsa widest = CpuIsa::kGeneric;
#endif
  switch (capped_isa(widest)) {
    case CpuIsa::kAvx512: return &cpu::run_task_avx512;
    case CpuIsa::kAvx2: return &cpu::run_task_avx2;
    default: return &cpu::run_task_generic;
  }
}

cpu::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return cpu::DType::kHalf;
    case at::kBFloat16:
      return cpu::DType::kBFloat16;
    default:
      return cpu::DType::kFloat;
  }
}

at::Tensor run(const Problem& p) {
  check_values(p, p.cache_lens, p.tree_mask.diagonal(0, 1, 2), p.block_table, p.tree_start);
  EAGLE3_CHECK(p.op, p.window == 0 || p.tree <= cpu::kMaxWindowTree, "a sliding window is supported for trees of at "
               "most ", cpu::kMaxWindowTree, " tokens on CPU, got N = ", p.tree);
  at::Tensor out = empty_output(p);
  if (out.numel() == 0) return out;

  const at::Tensor lens = p.cache_lens.to(at::kLong).contiguous();
  const at::Tensor table = p.paged() ? p.block_table.contiguous() : at::Tensor();
  const at::Tensor starts = p.tree_start.defined() ? p.tree_start.to(at::kLong).contiguous() : at::Tensor();

  cpu::Params prm;
  prm.dtype = kernel_dtype(p.q.scalar_type());
  prm.q = p.q.data_ptr();
  prm.q_batch = p.q.stride(0);
  prm.q_token = p.q.stride(1);
  prm.q_head = p.q.stride(2);
  prm.out = out.data_ptr();
  prm.o_batch = out.stride(0);
  prm.o_token = out.stride(1);
  prm.o_head = out.stride(2);
  prm.kv.k = p.k.data_ptr();
  prm.kv.v = p.v.data_ptr();
  prm.kv.k_page = p.k.stride(0);
  prm.kv.k_row = p.k.stride(1);
  prm.kv.k_head = p.k.stride(2);
  prm.kv.v_page = p.v.stride(0);
  prm.kv.v_row = p.v.stride(1);
  prm.kv.v_head = p.v.stride(2);
  prm.kv.page_size = p.page_size;
  if (p.paged()) {
    prm.kv.block_table = table.data_ptr<int32_t>();
    prm.kv.bt_stride = table.stride(0);
  }
  prm.cache_lens = lens.data_ptr<int64_t>();
  prm.mask = reinterpret_cast<const uint8_t*>(p.tree_mask.data_ptr<bool>());
  prm.m_batch = p.tree_mask.stride(0);
  prm.m_row = p.tree_mask.stride(1);
  prm.m_col = p.tree_mask.stride(2);
  prm.batch = p.batch;
  prm.tree = p.tree;
  prm.q_heads = p.q_heads;
  prm.kv_heads = p.kv_heads;
  prm.head_dim = p.head_dim;
  prm.v_dim = p.v_dim;
  prm.scale = static_cast<float>(p.scale);
  prm.window = p.window;
  prm.softcap = static_cast<float>(p.softcap);
  if (p.sinks.defined()) prm.sinks = p.sinks.data_ptr<float>();
  if (starts.defined()) prm.tree_start = starts.data_ptr<int64_t>();
#if defined(__x86_64__) || defined(_M_X64)
  static const bool has_bf16_dot = __builtin_cpu_supports("avx512bf16");
  prm.bf16_dot = has_bf16_dot;
#endif

  const int64_t rows = p.tree * p.group();
  const int64_t threads = at::get_num_threads();
  int64_t rows_per_task = std::min(rows, cpu::kMaxTaskRows);
  auto blocks_of = [&](int64_t r) { return (rows + r - 1) / r; };
  while (rows_per_task > kMinRowsPerTask &&
         p.batch * p.kv_heads * blocks_of(rows_per_task) < threads) {
    rows_per_task = (rows_per_task + 1) / 2;
  }
  const int64_t row_blocks = blocks_of(rows_per_task);
  const int64_t head_tasks = p.batch * p.kv_heads * row_blocks;

  // Still fewer tasks than threads (few requests, few rows: decode, small trees): split the
  // cache positions too, down to kMinSplitPositions each, and merge the splits afterwards.
  // Positions count from each request's window start (all of them without a window).
  const int64_t* len = prm.cache_lens;
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    longest = std::max(longest, len[b] + p.tree - window_start(len[b], p.window));
  }
  int64_t splits = 1;
  if (head_tasks < threads) {
    splits = std::max<int64_t>(1, std::min((threads + head_tasks - 1) / head_tasks,
                                           longest / kMinSplitPositions));
  }
  const int64_t chunk = (longest + splits - 1) / splits;
  splits = (longest + chunk - 1) / chunk;
  at::Tensor part_out, part_lse;
  if (splits > 1) {
    const auto f32 = out.options().dtype(at::kFloat);
    part_out = at::empty({splits, p.batch, p.tree, p.q_heads, p.v_dim}, f32);
    part_lse = at::empty({splits, p.batch, p.tree, p.q_heads}, f32);
    prm.part_out = part_out.data_ptr<float>();
    prm.part_lse = part_lse.data_ptr<float>();
  }
  const int64_t tasks = head_tasks * splits;

  const int64_t per_thread =
      (static_cast<int64_t>(cpu::scratch_floats(p.head_dim, p.v_dim, rows_per_task)) + kScratchAlign - 1) /
      kScratchAlign * kScratchAlign;
  at::Tensor scratch = at::empty({threads * per_thread + kScratchAlign}, out.options().dtype(at::kFloat));
  float* base = scratch.data_ptr<float>();
  base += (kScratchAlign - (reinterpret_cast<uintptr_t>(base) / sizeof(float)) % kScratchAlign) %
          kScratchAlign;
  const TaskRunner run_task = pick_task_runner();

  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    float* mine = base + at::get_thread_num() * per_thread;
    for (int64_t i = begin; i < end; ++i) {
      cpu::Task t;
      const int64_t split = i % splits;
      const int64_t rest = i / splits;
      t.row_begin = (rest % row_blocks) * rows_per_task;
      t.row_end = std::min(rows, t.row_begin + rows_per_task);
      t.h = (rest / row_blocks) % p.kv_heads;
      t.b = rest / (row_blocks * p.kv_heads);
      t.kv_begin = split * chunk;
      t.kv_end = t.kv_begin + chunk;
      t.split = splits > 1 ? split : -1;
      run_task(prm, t, mine);
    }
  });
  if (splits > 1) {
    // out = sum_s 2^(lse_s - max) O_s / (sum_s 2^(lse_s - max) [+ 2^(sink - max)]); the split
    // holding the tree is never empty (every token sees itself). The sink is one more term of
    // the denominator, with no value.
    at::Tensor lse = part_lse;
    if (p.sinks.defined()) {
      const at::Tensor sink = (p.sinks * static_cast<float>(M_LOG2E)).view({1, 1, 1, p.q_heads});
      lse = at::cat({part_lse, sink.expand({1, p.batch, p.tree, p.q_heads})}, 0);
    }
    const at::Tensor weights = at::softmax(lse * static_cast<float>(M_LN2), 0).narrow(0, 0, splits).unsqueeze(-1);
    out.copy_((part_out * weights).sum(0));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) {
  m.impl("tree_attention", &contiguous_entry<run>);
  m.impl("tree_attention_paged", &paged_entry<run>);
}

}  // namespace eagle3::tree_attention
