// The CPU tree-attention kernel compiled with the default flags: any CPU runs it.
#define EAGLE3_TREE_ISA generic
#include "tree_attention/cpu_kernel_impl.h"

namespace eagle3::tree_attention::cpu {

void run_task_generic(const Params& p, const Task& t, float* scratch) {
  generic::run_task(p, t, scratch);
}

size_t scratch_floats(int64_t head_dim, int64_t v_dim, int64_t rows) {
  const int64_t dp = (head_dim + kColTile - 1) / kColTile * kColTile;
  const int64_t dvp = (v_dim + kColTile - 1) / kColTile * kColTile;
  const int64_t rp = (rows + 15) / 16 * 16;
  // qt, acc, st, m, l, kf, vt, tmp, then the bf16 path's qt2 and pt2 (see run_typed).
  return static_cast<size_t>(head_dim * rp + rp * dvp + kKeys * rp + 2 * rp + kKeys * dp + kKeys * dvp + dp +
                             head_dim * rp / 2 + kKeys * rp / 2 + 16);
}

}  // namespace eagle3::tree_attention::cpu
