// The CPU tree-attention kernel compiled for AVX-512 (see CMakeLists.txt for the flags);
// cpu.cpp calls it only when the CPU has AVX-512F.
#define EAGLE3_TREE_ISA avx512
#define EAGLE3_TREE_AVX512BF16 1  // bf16 q . K with vdpbf16ps when Params::bf16_dot says the CPU has it
#include "tree_attention/cpu_kernel_impl.h"

namespace eagle3::tree_attention::cpu {

void run_task_avx512(const Params& p, const Task& t, float* scratch) {
  avx512::run_task(p, t, scratch);
}

}  // namespace eagle3::tree_attention::cpu
