// Every eagle3 op schema, in one place. Kernels register their implementations next to
// their code (csrc/<op>/cpu.cpp, csrc/<op>/cuda.cu); fake kernels live in eagle3_ext/ops.py.
#include <pybind11/pybind11.h>
#include <torch/library.h>

TORCH_LIBRARY(eagle3, m) {
  m.set_python_module("eagle3_ext.ops");

  // out = cat(aux_hidden, -1) @ weight.T (+ bias) without building the concatenation.
  //   aux_hidden: k tensors [..., H] of one shape, dtype and device (the captured target
  //               hidden states); weight: [H_out, k * H]; bias: [H_out] or None.
  //   returns [..., H_out] in the input dtype, accumulated in fp32.
  m.def("fused_aux_fc(Tensor[] aux_hidden, Tensor weight, Tensor? bias) -> Tensor");
}

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
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, module) {
  module.doc() = "eagle3_ext native ops (registered in the torch.ops.eagle3 namespace)";
  module.def("build_info", &build_info, "How this native module was compiled");
}
