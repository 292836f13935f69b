// The eagle3_ext._C Python module. Importing it loads the library whose static initializers
// register every eagle3 op (csrc/registration.cpp and the kernels' TORCH_LIBRARY_IMPL blocks);
// its only function reports how the library was built.
#include <string>

#include <pybind11/pybind11.h>

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

}  // namespace

PYBIND11_MODULE(_C, module) {
  module.doc() = "eagle3_ext native ops (registered in the torch.ops.eagle3 namespace)";
  module.def("build_info", &build_info, "How this native module was compiled");
}
