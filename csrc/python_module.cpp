// The eagle3_ext._C Python module. Importing it loads the library whose static initializers
// register every eagle3 op (csrc/registration.cpp and the kernels' TORCH_LIBRARY_IMPL blocks);
// its functions report how the library was built and get and set the kernels' settings that
// are no argument of an op (common/options.h; eagle3_ext/ops.py wraps them).
#include <optional>
#include <string>

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/options.h"

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["compiled_torch_version"] = EAGLE3_TORCH_VERSION;
#ifdef EAGLE3_WITH_CUDA
  info["cuda_compiled"] = true;
#else
  info["cuda_compiled"] = false;
#endif
  pybind11::list archs;
  const std::string arch_list = EAGLE3_CUDA_ARCHS;
  size_t start = 0;
  while (start < arch_list.size()) {
    size_t end = arch_list.find(',', start);
    if (end == std::string::npos) end = arch_list.size();
    if (end > start) archs.append(arch_list.substr(start, end - start));
    start = end + 1;
  }
  info["cuda_archs"] = archs;
  // fused_aux_fc's TMA + wgmma kernel for Hopper (sm_90a) was compiled in.
  info["sm90_wgmma"] = static_cast<bool>(EAGLE3_WITH_SM90_WGMMA);
  return info;
}

// A c10::Error (the ValueError of a bad EAGLE3_CPU_ISA or EAGLE3_CUDA_VALIDATE) as Python's.
template <typename F>
auto value_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw pybind11::value_error(e.what_without_backtrace());
  }
}

std::optional<std::string> get_cpu_isa() {
  return value_errors([] {
    const std::optional<eagle3::CpuIsa> cap = eagle3::cpu_isa_cap();
    return cap.has_value() ? std::optional<std::string>(eagle3::cpu_isa_name(*cap)) : std::nullopt;
  });
}

void set_cpu_isa(const std::optional<std::string>& name) {
  if (!name.has_value()) {
    eagle3::set_cpu_isa_cap(std::nullopt);
    return;
  }
  const std::optional<eagle3::CpuIsa> isa = eagle3::parse_cpu_isa(*name);
  if (!isa.has_value()) {
    throw pybind11::value_error("isa must be 'generic', 'avx2', 'avx512' or None, got '" + *name + "'");
  }
  eagle3::set_cpu_isa_cap(isa);
}

bool cuda_validation() {
  return value_errors([] { return eagle3::cuda_validation(); });
}

}  // namespace

PYBIND11_MODULE(_C, module) {
  module.doc() = "eagle3_ext native ops (registered in the torch.ops.eagle3 namespace)";
  module.def("build_info", &build_info, "How this native module was compiled");
  module.def("get_cpu_isa", &get_cpu_isa,
             "The cap on the CPU kernels' ISA ('generic', 'avx2', 'avx512'), None for none");
  module.def("set_cpu_isa", &set_cpu_isa, pybind11::arg("isa"),
             "Sets the cap on the CPU kernels' ISA for the process ('generic', 'avx2', 'avx512'; None: none)");
  module.def("cuda_validation", &cuda_validation,
             "Whether this thread's CUDA entries read back and raise the errors found in the tensors' values");
  module.def("set_cuda_validation", &eagle3::set_cuda_validation, pybind11::arg("on"),
             "Sets this thread's CUDA validation (None: the process default); returns the setting it replaces");
}
