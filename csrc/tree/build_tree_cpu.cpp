// CPU entry of eagle3::build_tree_kernel_efficient.
//
// Requests are independent: at::parallel_for over requests, each built by one thread in
// O(N * depth): parents first (a search of selected_index per node), then positions, the
// first-child / next-sibling lists (one pass in descending node order, so that every list
// comes out in ascending order) and the mask rows (the path of each node to the root).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "tree/inputs.h"

namespace eagle3::tree {
namespace {

// Requests per parallel task: one request is a few microseconds of work at most.
constexpr int64_t kRequestGrain = 16;

struct BuildOutputs {
  bool* mask_bool = nullptr;      // modes 0 and 1
  uint8_t* mask_packed = nullptr; // mode 2
  int64_t* positions = nullptr;
  int64_t* retrive_index = nullptr;
  int64_t* next_token = nullptr;
  int64_t* next_sibling = nullptr;
};

TreeError build_request(const BuildProblem& p, const BuildRequest& r, int64_t seq_len,
                        int64_t mask_offset, const BuildOutputs& out) {
  const int64_t n = p.n, b = r.request;
  TreeError err;
  if (seq_len < 0) return make_error(kNegativeSeqLen, b, 0, seq_len);
  std::vector<int64_t> parents(n, 0);
  for (int64_t i = 1; i < n; ++i) {
    parents[i] = resolve_parent(r, i, &err);
    if (err.code != kOk) return err;
  }
  int64_t* next_token = out.next_token + b * n;
  int64_t* next_sibling = out.next_sibling + b * n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t depth = node_depth(parents.data(), n, i, b, &err);
    if (err.code != kOk) return err;
    out.positions[b * n + i] = seq_len + depth;
    out.retrive_index[b * n + i] = b * n + i;
    next_token[i] = -1;
    next_sibling[i] = -1;
  }
  for (int64_t i = n - 1; i > 0; --i) {  // prepend: lists end up in ascending order
    next_sibling[i] = next_token[parents[i]];
    next_token[parents[i]] = i;
  }

  if (p.mode == kQlenOnlyBitpacking) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits = 1u;  // the root
      for_each_on_path(parents.data(), i, [&](int64_t j) { bits |= 1u << j; });
      uint8_t* row = out.mask_packed + (b * n + i) * p.row_bytes;
      for (int64_t k = 0; k < p.row_bytes; ++k) row[k] = static_cast<uint8_t>(bits >> (8 * k));
    }
    return err;
  }
  // Modes 0 and 1: row i of an [N, prefix + N] block; prefix = seq_len in mode 0, 0 in mode 1.
  const int64_t prefix = p.mode == kFullMask ? seq_len : 0;
  const int64_t width = prefix + n;
  for (int64_t i = 0; i < n; ++i) {
    bool* draft_cols = out.mask_bool + mask_offset + i * width + prefix;
    std::memset(draft_cols, 0, n * sizeof(bool));
    draft_cols[0] = true;
    for_each_on_path(parents.data(), i, [&](int64_t j) { draft_cols[j] = true; });
  }
  return err;
}

void build_tree_kernel_efficient_cpu(const at::Tensor& parent_list,
                                     const at::Tensor& selected_index,
                                     const at::Tensor& verified_seq_len, at::Tensor& tree_mask,
                                     at::Tensor& positions, at::Tensor& retrive_index,
                                     at::Tensor& retrive_next_token,
                                     at::Tensor& retrive_next_sibling, int64_t topk,
                                     int64_t depth, int64_t draft_token_num,
                                     int64_t tree_mask_mode) {
  const BuildProblem p = check_build(parent_list, selected_index, verified_seq_len, tree_mask,
                                     positions, retrive_index, retrive_next_token,
                                     retrive_next_sibling, topk, depth, draft_token_num,
                                     tree_mask_mode);
  const int64_t bs = p.bs, n = p.n;
  const int64_t* seq_lens = verified_seq_len.data_ptr<int64_t>();
  // Where each request's mask block starts (mode 0 blocks have seq_len + N columns).
  std::vector<int64_t> mask_offsets(bs, 0);
  int64_t seq_len_sum = 0;
  for (int64_t b = 0; b < bs; ++b) {
    mask_offsets[b] = seq_len_sum * (p.mode == kFullMask ? n : 0) + b * n * n;
    EAGLE3_CHECK(kBuildOp, seq_lens[b] >= 0, "verified_seq_len[", b, "] = ", seq_lens[b],
                 " is negative");
    seq_len_sum += seq_lens[b];
  }
  if (p.mode == kFullMask) check_full_mask_size(tree_mask, p, seq_len_sum);

  BuildOutputs out;
  if (p.mode == kQlenOnlyBitpacking) {
    out.mask_packed = static_cast<uint8_t*>(tree_mask.data_ptr());
  } else {
    out.mask_bool = tree_mask.data_ptr<bool>();
  }
  out.positions = positions.data_ptr<int64_t>();
  out.retrive_index = retrive_index.data_ptr<int64_t>();
  out.next_token = retrive_next_token.data_ptr<int64_t>();
  out.next_sibling = retrive_next_sibling.data_ptr<int64_t>();
  const int64_t* parents = p.parent_cols > 0 ? parent_list.data_ptr<int64_t>() : nullptr;
  const int64_t* selected = selected_index.data_ptr<int64_t>();

  std::vector<TreeError> errors(bs);
  at::parallel_for(0, bs, kRequestGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      BuildRequest r;
      r.parent_row = parents == nullptr ? nullptr : parents + b * p.parent_cols;
      r.selected_row = selected + b * (n - 1);
      r.parent_cols = p.parent_cols;
      r.topk = p.topk;
      r.n = n;
      r.request = b;
      errors[b] = build_request(p, r, seq_lens[b], mask_offsets[b], out);
    }
  });
  raise_first(kBuildOp, errors);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) {
  m.impl("build_tree_kernel_efficient", &build_tree_kernel_efficient_cpu);
}

}  // namespace eagle3::tree
