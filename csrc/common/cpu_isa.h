// The x86 vector ISAs the CPU kernels are built for, and the EAGLE3_CPU_ISA cap that tests use
// to run every build a machine has. Include from files compiled without ISA flags only (an
// inline function emitted in an AVX-512 file could be the copy the linker keeps).
#pragma once

#include <cstdlib>
#include <string_view>

namespace eagle3 {

// Widest last: a cap is a minimum.
enum class CpuIsa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

// AVX2 with FMA and F16C: every AVX2 build uses all three.
inline bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// `widest` (what this CPU runs for a kernel), capped by EAGLE3_CPU_ISA=avx2 or =generic. Read
// per call, so a test can cover every build in one process.
inline CpuIsa capped_isa(CpuIsa widest) {
  const char* env = std::getenv("EAGLE3_CPU_ISA");
  const std::string_view cap = env != nullptr ? env : "";
  if (cap == "generic") return CpuIsa::kGeneric;
  if (cap == "avx2" && widest == CpuIsa::kAvx512) return CpuIsa::kAvx2;
  return widest;
}

}  // namespace eagle3
