// The CPU tree-attention kernel compiled for AVX2 + FMA (see CMakeLists.txt for the flags);
// cpu.cpp calls it on CPUs that have AVX2 and FMA but not AVX-512F (the 16-lane vectors of
// cpu_kernel_impl.h become pairs of 8-lane registers).
#define EAGLE3_TREE_ISA avx2
#define EAGLE3_TREE_AVX2 1  // the q.K and P.V micro kernels on 8-lane registers
#include "tree_attention/cpu_kernel_impl.h"

namespace eagle3::tree_attention::cpu {

void run_task_avx2(const Params& p, const Task& t, float* scratch) {
  avx2::run_task(p, t, scratch);
}

}  // namespace eagle3::tree_attention::cpu
