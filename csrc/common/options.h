// The kernels' settings that are no argument of an op (the op schemas match sgl-kernel's and
// stay as they are): the cap on the CPU kernels' vector ISA and the CUDA entries' read-back of
// the errors their kernels find in the tensors' values. Defined in options.cpp, set from Python
// through the _C module (eagle3_ext.ops.set_cpu_isa, the ops' validate= argument).
#pragma once

#include <optional>
#include <string_view>

namespace eagle3 {

// The x86 vector ISAs the CPU kernels are built for. Widest last: a cap is a minimum.
enum class CpuIsa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

// "generic", "avx2", "avx512"; and back (std::nullopt for any other name).
const char* cpu_isa_name(CpuIsa isa);
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

// The cap on the builds the CPU kernels run, for the whole process (std::nullopt: none, each
// kernel runs the widest build the CPU has). Its first value is EAGLE3_CPU_ISA's, read once, at
// the first call of cpu_isa_cap (unset or empty: none; another name than the three raises a
// ValueError, at every call until set_cpu_isa_cap replaces it).
std::optional<CpuIsa> cpu_isa_cap();
void set_cpu_isa_cap(std::optional<CpuIsa> cap);

// Whether this thread's CUDA entries read back what their kernels flagged in the tensors' values
// and raise the CPU entries' errors (one synchronization per call; see common/cuda_host.h).
// A thread's setting is std::nullopt, the process default, until set: EAGLE3_CUDA_VALIDATE=1
// on, unset, empty or 0 off (read once, at the first call that needs it; another value raises
// a ValueError). set_cuda_validation sets this thread's setting (std::nullopt: back to the
// default) and returns the one it replaces, so that a caller can restore it.
bool cuda_validation();
std::optional<bool> set_cuda_validation(std::optional<bool> on);

}  // namespace eagle3
