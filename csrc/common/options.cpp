// The settings of common/options.h.
#include "common/options.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include <c10/util/Exception.h>

namespace eagle3 {
namespace {

constexpr int kNoCap = -1;
constexpr int kUnread = -2;  // EAGLE3_CPU_ISA not read yet

// The cap as an int: a CpuIsa, kNoCap or kUnread.
std::atomic<int> isa_cap{kUnread};

int cap_from_environment() {
  const char* env = std::getenv("EAGLE3_CPU_ISA");
  if (env == nullptr || *env == '\0') return kNoCap;
  const std::optional<CpuIsa> isa = parse_cpu_isa(env);
  TORCH_CHECK_VALUE(isa.has_value(), "EAGLE3_CPU_ISA (the first value of eagle3_ext.ops.set_cpu_isa's cap) must be ",
                    "generic, avx2 or avx512, or unset, got '", env, "'");
  return static_cast<int>(*isa);
}

bool validation_from_environment() {
  // A static initialized by a call that throws is tried again by the next call.
  static const bool on = [] {
    const char* env = std::getenv("EAGLE3_CUDA_VALIDATE");
    const std::string value = env != nullptr ? env : "";
    TORCH_CHECK_VALUE(value.empty() || value == "0" || value == "1", "EAGLE3_CUDA_VALIDATE (the default of the ",
                      "eagle3_ext.ops wrappers' validate=) must be 0 or 1, got '", value, "'");
    return value == "1";
  }();
  return on;
}

// std::nullopt: the process default (validation_from_environment).
thread_local std::optional<bool> thread_validation;

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    default: return "generic";
  }
}

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  if (name == "generic") return CpuIsa::kGeneric;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "avx512") return CpuIsa::kAvx512;
  return std::nullopt;
}

std::optional<CpuIsa> cpu_isa_cap() {
  int cap = isa_cap.load(std::memory_order_relaxed);
  if (cap == kUnread) {
    int unread = kUnread;
    // A set_cpu_isa_cap between the load and here wins over the environment.
    isa_cap.compare_exchange_strong(unread, cap_from_environment(), std::memory_order_relaxed);
    cap = isa_cap.load(std::memory_order_relaxed);
  }
  if (cap == kNoCap) return std::nullopt;
  return static_cast<CpuIsa>(cap);
}

void set_cpu_isa_cap(std::optional<CpuIsa> cap) {
  isa_cap.store(cap.has_value() ? static_cast<int>(*cap) : kNoCap, std::memory_order_relaxed);
}

bool cuda_validation() {
  return thread_validation.has_value() ? *thread_validation : validation_from_environment();
}

std::optional<bool> set_cuda_validation(std::optional<bool> on) {
  const std::optional<bool> previous = thread_validation;
  thread_validation = on;
  return previous;
}

}  // namespace eagle3
