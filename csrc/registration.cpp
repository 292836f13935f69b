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

  // Attention of N draft-tree tokens against a KV prefix plus the tree itself (verify forward).
  //   q:            [B, N, Hq, D], the tree tokens' queries (any strides).
  //   k/v_cache:    [B, S_max, Hkv, D] (strided views allowed, e.g. HF's [B, Hkv, S, D]
  //                 permuted; unit stride along D); the tree tokens' K/V are already written
  //                 at positions cache_lens[b] .. cache_lens[b] + N - 1. Hq % Hkv == 0 (GQA).
  //   cache_lens:   int32 or int64 [B], committed prefix length of each request.
  //   tree_mask:    bool [B, N, N], [b, i, j] = tree token i sees tree token j (ancestors and
  //                 itself; the diagonal must be set, a padding row sets only the diagonal).
  //   scale:        softmax scale (usually D ** -0.5).
  //   returns [B, N, Hq, D] in q's dtype; softmax in fp32. Query i of request b sees prefix
  //   positions [0, cache_lens[b]) and tree positions cache_lens[b] + j where the mask is set.
  m.def(
      "tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_lens, "
      "Tensor tree_mask, float scale) -> Tensor");

  // tree_attention over a paged KV cache.
  //   k/v_pages:    [P, page_size, Hkv, D] physical pages (strided views allowed).
  //   block_table:  int32 [B, max_blocks], logical page p of request b is physical page
  //                 block_table[b, p]; cache position s lives in page s // page_size at row
  //                 s % page_size. The other arguments are those of tree_attention.
  m.def(
      "tree_attention_paged(Tensor q, Tensor k_pages, Tensor v_pages, Tensor block_table, "
      "Tensor cache_lens, Tensor tree_mask, float scale) -> Tensor");
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
