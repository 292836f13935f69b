// Which build of a CPU kernel runs: the widest the CPU has, under the process's cap
// (common/options.h: eagle3_ext.ops.set_cpu_isa, first EAGLE3_CPU_ISA), which tests use to run
// every build a machine has. Include from files compiled without ISA flags only (an inline
// function emitted in an AVX-512 file could be the copy the linker keeps).
#pragma once

#include "common/options.h"

namespace eagle3 {

// AVX2 with FMA and F16C: every AVX2 build uses all three.
inline bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// `widest` (what this CPU runs for a kernel) under the cap (cpu_isa_cap, an atomic load: read
// per call, so that a test can cover every build in one process).
inline CpuIsa capped_isa(CpuIsa widest) {
  const std::optional<CpuIsa> cap = cpu_isa_cap();
  return cap.has_value() && *cap < widest ? *cap : widest;
}

}  // namespace eagle3
