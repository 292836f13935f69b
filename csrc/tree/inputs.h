// Validation of the tree ops' arguments, shared by the CPU and CUDA entries so that both
// backends reject exactly the same calls with the same messages, and the text of the errors
// found while walking a tree (TreeError, from tree_logic.h).
//
// What is checked here, before any kernel runs: dtypes, ranks, shapes and sizes of every
// tensor (outputs included), devices, contiguity, scalar arguments. What can only be seen
// while walking (a node whose parent is not selected, an index out of range) is reported
// by the kernels as a TreeError and raised by raise_tree_error.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/checks.h"
#include "tree/tree_logic.h"

namespace eagle3::tree {

inline constexpr const char* kBuildOp = "build_tree_kernel_efficient";
inline constexpr const char* kGreedyOp = "verify_tree_greedy";
inline constexpr const char* kSamplingOp = "tree_speculative_sampling_target_only";
inline constexpr const char* kDraftProbsOp = "tree_speculative_sampling_draft_probs";
// tree_mask_mode 2 packs one row into at most 32 bits.
inline constexpr int64_t kMaxPackedNodes = 32;

inline const char* dtype_hint(at::ScalarType t) {
  switch (t) {
    case at::kLong: return "int64 (torch.int64)";
    case at::kInt: return "int32 (torch.int32)";
    case at::kFloat: return "float32 (torch.float32)";
    case at::kBool: return "bool (torch.bool)";
    default: return "another dtype";
  }
}

inline void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType want) {
  EAGLE3_CHECK_DTYPE(op, t.scalar_type() == want, name, " must be ", dtype_hint(want), ", got ",
               t.scalar_type());
}

inline void check_shape(const char* op, const char* name, const at::Tensor& t,
                        std::vector<int64_t> want, const char* meaning) {
  EAGLE3_CHECK(op, t.sizes() == at::IntArrayRef(want), name, " must have shape ",
               at::IntArrayRef(want), " (", meaning, "), got ", t.sizes());
}

inline void check_contiguous(const char* op, const char* name, const at::Tensor& t) {
  EAGLE3_CHECK(op, t.is_contiguous(), name, " must be contiguous (strides ", t.strides(),
               " for shape ", t.sizes(), ")");
}

inline void check_all_on(const char* op, const at::Tensor& ref, const char* ref_name,
                         std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  for (const auto& [name, t] : others) check_same_device(op, name, *t, ref_name, ref);
}

// --- build_tree_kernel_efficient ------------------------------------------------------------

struct BuildProblem {
  int64_t bs = 0;
  int64_t topk = 0;
  int64_t depth = 0;
  int64_t n = 0;           // draft_token_num
  int64_t mode = 0;        // tree_mask_mode
  int64_t parent_cols = 0; // parent_list.size(1)
  int64_t row_bytes = 0;   // tree_mask_mode 2: bytes per packed row
};

inline bool is_packable_int(at::ScalarType t) {
  return t == at::kByte || t == at::kChar || t == at::kShort || t == at::kInt ||
         t == at::kUInt16 || t == at::kUInt32;
}

// Checks everything but the size of a mode-0 mask, which depends on sum(verified_seq_len)
// (checked by the CPU entry on the host and by the CUDA kernel on the device).
inline BuildProblem check_build(const at::Tensor& parent_list, const at::Tensor& selected_index,
                                const at::Tensor& verified_seq_len, const at::Tensor& tree_mask,
                                const at::Tensor& positions, const at::Tensor& retrive_index,
                                const at::Tensor& retrive_next_token,
                                const at::Tensor& retrive_next_sibling, int64_t topk,
                                int64_t depth, int64_t draft_token_num, int64_t tree_mask_mode) {
  const char* op = kBuildOp;
  BuildProblem p;
  EAGLE3_CHECK(op, topk >= 1, "topk must be >= 1, got ", topk);
  EAGLE3_CHECK(op, depth >= 1, "depth must be >= 1, got ", depth);
  EAGLE3_CHECK(op, draft_token_num >= 1, "draft_token_num must be >= 1 (the root), got ",
               draft_token_num);
  EAGLE3_CHECK(op, tree_mask_mode >= 0 && tree_mask_mode <= 2,
               "tree_mask_mode must be 0 (full mask), 1 (draft columns only) or 2 (bit-packed), got ",
               tree_mask_mode);
  check_dim(op, "verified_seq_len", verified_seq_len, 1);
  p.bs = verified_seq_len.size(0);
  p.topk = topk;
  p.depth = depth;
  p.n = draft_token_num;
  p.mode = tree_mask_mode;
  const int64_t bs = p.bs, n = p.n;

  const at::Tensor& ref = verified_seq_len;
  check_all_on(op, ref, "verified_seq_len",
               {{"parent_list", &parent_list}, {"selected_index", &selected_index},
                {"tree_mask", &tree_mask}, {"positions", &positions},
                {"retrive_index", &retrive_index}, {"retrive_next_token", &retrive_next_token},
                {"retrive_next_sibling", &retrive_next_sibling}});

  check_dtype(op, "verified_seq_len", verified_seq_len, at::kLong);
  check_dtype(op, "selected_index", selected_index, at::kLong);
  check_shape(op, "selected_index", selected_index, {bs, n - 1}, "[bs, draft_token_num - 1]");
  const int64_t parent_cols = topk * (depth - 1) + 1;
  check_dim(op, "parent_list", parent_list, 2);
  const bool empty_parents = depth == 1 && parent_list.size(1) == 0;  // what sglang passes
  EAGLE3_CHECK(op, parent_list.size(0) == bs && (parent_list.size(1) == parent_cols || empty_parents),
               "parent_list must have shape [", bs, ", ", parent_cols,
               "] ([bs, topk * (depth - 1) + 1] for topk ", topk, ", depth ", depth, "), got ",
               parent_list.sizes());
  if (!empty_parents) check_dtype(op, "parent_list", parent_list, at::kLong);
  p.parent_cols = parent_list.size(1);

  check_dtype(op, "positions", positions, at::kLong);
  // sgl-kernel indexes positions flat; engines pass [bs * N] or [bs, N].
  EAGLE3_CHECK(op, positions.numel() == bs * n && positions.dim() <= 2,
               "positions must have bs * draft_token_num = ", bs * n,
               " elements ([bs * N] or [bs, N]), got shape ", positions.sizes());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"retrive_index", &retrive_index},
                                {"retrive_next_token", &retrive_next_token},
                                {"retrive_next_sibling", &retrive_next_sibling}}) {
    check_dtype(op, name, *t, at::kLong);
    check_shape(op, name, *t, {bs, n}, "[bs, draft_token_num]");
    check_contiguous(op, name, *t);
  }
  check_contiguous(op, "positions", positions);
  check_contiguous(op, "tree_mask", tree_mask);
  check_contiguous(op, "parent_list", parent_list);
  check_contiguous(op, "selected_index", selected_index);
  check_contiguous(op, "verified_seq_len", verified_seq_len);

  if (tree_mask_mode == kQlenOnly) {
    check_dtype(op, "tree_mask", tree_mask, at::kBool);
    EAGLE3_CHECK(op, tree_mask.numel() == bs * n * n, "tree_mask (tree_mask_mode 1) must have ",
                 bs * n * n, " = bs * N * N = ", bs, " * ", n, " * ", n, " elements, got ",
                 tree_mask.numel(), " (shape ", tree_mask.sizes(), ")");
  } else if (tree_mask_mode == kFullMask) {
    check_dtype(op, "tree_mask", tree_mask, at::kBool);
  } else {
    EAGLE3_CHECK(op, n <= kMaxPackedNodes, "tree_mask_mode 2 packs a row into at most ",
                 kMaxPackedNodes, " bits, but draft_token_num is ", n,
                 "; use tree_mask_mode 0 or 1");
    p.row_bytes = packed_row_bytes(n);
    EAGLE3_CHECK_DTYPE(op, is_packable_int(tree_mask.scalar_type()),
                 "tree_mask (tree_mask_mode 2) must be an integer tensor (uint8, int16 or "
                 "int32 rows), got ", tree_mask.scalar_type());
    const int64_t bytes = tree_mask.numel() * tree_mask.element_size();
    EAGLE3_CHECK(op, bytes == bs * n * p.row_bytes, "tree_mask (tree_mask_mode 2) must hold ",
                 bs * n, " packed rows of ", p.row_bytes, " byte(s) for draft_token_num ", n,
                 " (", bs * n * p.row_bytes, " bytes), got ", tree_mask.numel(), " x ",
                 tree_mask.element_size(), " bytes (shape ", tree_mask.sizes(), ", dtype ",
                 tree_mask.scalar_type(), ")");
  }
  return p;
}

// The size a mode-0 mask must have, given sum(verified_seq_len).
inline void check_full_mask_size(const at::Tensor& tree_mask, const BuildProblem& p,
                                 int64_t seq_len_sum) {
  const int64_t want = seq_len_sum * p.n + p.bs * p.n * p.n;
  EAGLE3_CHECK(kBuildOp, tree_mask.numel() == want, "tree_mask (tree_mask_mode 0) must have ",
               want, " = sum(verified_seq_len) * N + bs * N * N = ", seq_len_sum, " * ", p.n,
               " + ", p.bs, " * ", p.n, " * ", p.n, " elements, got ", tree_mask.numel());
}

// --- verify_tree_greedy / tree_speculative_sampling_target_only / _draft_probs ---------------

struct VerifyProblem {
  int64_t bs = 0;
  int64_t n = 0;
  int64_t num_steps = 0;  // accept_index.size(1)
  int64_t vocab = 0;      // sampling only
};

inline VerifyProblem check_verify_common(const char* op, const at::Tensor& predicts,
                                         const at::Tensor& accept_index,
                                         const at::Tensor& accept_token_num,
                                         const at::Tensor& candidates,
                                         const at::Tensor& retrive_index,
                                         const at::Tensor& retrive_next_token,
                                         const at::Tensor& retrive_next_sibling) {
  VerifyProblem p;
  check_dim(op, "candidates", candidates, 2);
  p.bs = candidates.size(0);
  p.n = candidates.size(1);
  EAGLE3_CHECK(op, p.n >= 1, "candidates must have at least one column (the root), got shape ",
               candidates.sizes());
  check_all_on(op, candidates, "candidates",
               {{"predicts", &predicts}, {"accept_index", &accept_index},
                {"accept_token_num", &accept_token_num}, {"retrive_index", &retrive_index},
                {"retrive_next_token", &retrive_next_token},
                {"retrive_next_sibling", &retrive_next_sibling}});
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"candidates", &candidates},
                                {"retrive_index", &retrive_index},
                                {"retrive_next_token", &retrive_next_token},
                                {"retrive_next_sibling", &retrive_next_sibling}}) {
    check_dtype(op, name, *t, at::kLong);
    check_shape(op, name, *t, {p.bs, p.n}, "[bs, N] like candidates");
    check_contiguous(op, name, *t);
  }
  check_dtype(op, "predicts", predicts, at::kInt);
  check_shape(op, "predicts", predicts, {p.bs * p.n}, "[bs * N]");
  check_contiguous(op, "predicts", predicts);
  check_dtype(op, "accept_index", accept_index, at::kInt);
  check_dim(op, "accept_index", accept_index, 2);
  EAGLE3_CHECK(op, accept_index.size(0) == p.bs && accept_index.size(1) >= 1,
               "accept_index must have shape [", p.bs, ", max_depth + 1] with max_depth + 1 >= 1, got ",
               accept_index.sizes());
  p.num_steps = accept_index.size(1);
  check_contiguous(op, "accept_index", accept_index);
  check_dtype(op, "accept_token_num", accept_token_num, at::kInt);
  check_shape(op, "accept_token_num", accept_token_num, {p.bs}, "[bs]");
  check_contiguous(op, "accept_token_num", accept_token_num);
  return p;
}

inline VerifyProblem check_greedy(const at::Tensor& predicts, const at::Tensor& accept_index,
                                  const at::Tensor& accept_token_num, const at::Tensor& candidates,
                                  const at::Tensor& retrive_index,
                                  const at::Tensor& retrive_next_token,
                                  const at::Tensor& retrive_next_sibling,
                                  const at::Tensor& target_predict) {
  const char* op = kGreedyOp;
  VerifyProblem p = check_verify_common(op, predicts, accept_index, accept_token_num, candidates,
                                        retrive_index, retrive_next_token, retrive_next_sibling);
  check_same_device(op, "target_predict", target_predict, "candidates", candidates);
  check_dtype(op, "target_predict", target_predict, at::kLong);
  check_shape(op, "target_predict", target_predict, {p.bs, p.n}, "[bs, N] like candidates");
  check_contiguous(op, "target_predict", target_predict);
  return p;
}

// The tensors both sampling ops take after the tree: coins, target_probs, draft_probs.
inline void check_sampling_tensors(const char* op, VerifyProblem& p, const at::Tensor& candidates,
                                   const at::Tensor& uniform_samples,
                                   const at::Tensor& uniform_samples_for_final_sampling,
                                   const at::Tensor& target_probs, const at::Tensor& draft_probs) {
  check_all_on(op, candidates, "candidates",
               {{"uniform_samples", &uniform_samples},
                {"uniform_samples_for_final_sampling", &uniform_samples_for_final_sampling},
                {"target_probs", &target_probs}, {"draft_probs", &draft_probs}});
  check_dtype(op, "uniform_samples", uniform_samples, at::kFloat);
  check_shape(op, "uniform_samples", uniform_samples, {p.bs, p.n}, "[bs, N] like candidates");
  check_dtype(op, "uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, at::kFloat);
  check_shape(op, "uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, {p.bs},
              "[bs]");
  check_dtype(op, "target_probs", target_probs, at::kFloat);
  check_dim(op, "target_probs", target_probs, 3);
  p.vocab = target_probs.size(2);
  EAGLE3_CHECK(op, p.vocab >= 1, "target_probs has an empty vocabulary, shape ", target_probs.sizes());
  check_shape(op, "target_probs", target_probs, {p.bs, p.n, p.vocab}, "[bs, N, V]");
  check_dtype(op, "draft_probs", draft_probs, at::kFloat);
  check_shape(op, "draft_probs", draft_probs, {p.bs, p.n, p.vocab}, "[bs, N, V] like target_probs");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"uniform_samples", &uniform_samples},
                                {"uniform_samples_for_final_sampling", &uniform_samples_for_final_sampling},
                                {"target_probs", &target_probs}, {"draft_probs", &draft_probs}}) {
    check_contiguous(op, name, *t);
  }
}

inline VerifyProblem check_sampling(const at::Tensor& predicts, const at::Tensor& accept_index,
                                    const at::Tensor& accept_token_num,
                                    const at::Tensor& candidates, const at::Tensor& retrive_index,
                                    const at::Tensor& retrive_next_token,
                                    const at::Tensor& retrive_next_sibling,
                                    const at::Tensor& uniform_samples,
                                    const at::Tensor& uniform_samples_for_final_sampling,
                                    const at::Tensor& target_probs, const at::Tensor& draft_probs,
                                    double threshold_single, double threshold_acc) {
  const char* op = kSamplingOp;
  VerifyProblem p = check_verify_common(op, predicts, accept_index, accept_token_num, candidates,
                                        retrive_index, retrive_next_token, retrive_next_sibling);
  EAGLE3_CHECK(op, threshold_single >= 0.0 && threshold_single <= 1.0,
               "threshold_single must be in [0, 1], got ", threshold_single);
  EAGLE3_CHECK(op, threshold_acc >= 0.0 && threshold_acc <= 1.0,
               "threshold_acc must be in [0, 1], got ", threshold_acc);
  check_sampling_tensors(op, p, candidates, uniform_samples, uniform_samples_for_final_sampling,
                         target_probs, draft_probs);
  return p;
}

// tree_speculative_sampling_draft_probs: the same tensors without the thresholds; draft_probs
// is read, not written.
inline VerifyProblem check_sampling_draft_probs(
    const at::Tensor& predicts, const at::Tensor& accept_index, const at::Tensor& accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index,
    const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, const at::Tensor& draft_probs) {
  const char* op = kDraftProbsOp;
  VerifyProblem p = check_verify_common(op, predicts, accept_index, accept_token_num, candidates,
                                        retrive_index, retrive_next_token, retrive_next_sibling);
  check_sampling_tensors(op, p, candidates, uniform_samples, uniform_samples_for_final_sampling,
                         target_probs, draft_probs);
  return p;
}

// Raw pointers of the verify ops' common tensors (validated by check_verify_common).
inline VerifyBatch verify_batch(const VerifyProblem& p, const at::Tensor& predicts,
                                const at::Tensor& accept_index, const at::Tensor& accept_token_num,
                                const at::Tensor& candidates, const at::Tensor& retrive_index,
                                const at::Tensor& retrive_next_token,
                                const at::Tensor& retrive_next_sibling) {
  return VerifyBatch{candidates.data_ptr<int64_t>(), retrive_index.data_ptr<int64_t>(),
                     retrive_next_token.data_ptr<int64_t>(),
                     retrive_next_sibling.data_ptr<int64_t>(), predicts.data_ptr<int32_t>(),
                     accept_index.data_ptr<int32_t>(), accept_token_num.data_ptr<int32_t>(),
                     p.bs, p.n, p.num_steps};
}

// --- errors found while walking -------------------------------------------------------------

inline std::string describe(const TreeError& e) {
  const std::string at = "request " + std::to_string(e.request) + ", node " + std::to_string(e.node);
  const std::string v = std::to_string(e.value);
  switch (e.code) {
    case kSelectedIndexOutOfRange:
      return "invalid tree: " + at + ": selected_index[" + std::to_string(e.request) + ", " +
             std::to_string(e.node - 1) + "] = " + v +
             " points to a parent slot (selected_index // topk) outside parent_list";
    case kParentNotSelected:
      return "invalid tree: " + at + ": its parent is draft candidate " + v +
             " (from parent_list), which is not among the selected nodes (selected_index); "
             "check the draft scores for NaN";
    case kParentCycle:
      return "invalid tree: " + at + ": following its parents never reaches the root (cycle through node " +
             v + ")";
    case kNegativeSeqLen:
      return "verified_seq_len[" + std::to_string(e.request) + "] = " + v + " is negative";
    case kMaskSizeMismatch:
      return "tree_mask (tree_mask_mode 0) must have " + v +
             " = sum(verified_seq_len) * N + bs * N * N elements";
    case kNextTokenOutOfRange:
      return "invalid tree: " + at + ": retrive_next_token = " + v + " is not in [-1, N)";
    case kNextSiblingOutOfRange:
      return "invalid tree: " + at + ": retrive_next_sibling = " + v + " is not in [-1, N)";
    case kSiblingCycle:
      return "invalid tree: " + at + ": the sibling list of its children does not end (cycle through node " +
             v + ")";
    case kRetriveIndexOutOfRange:
      return "invalid tree: " + at + ": retrive_index = " + v + " is not in [0, bs * N)";
    case kCandidateOutOfRange:
      return at + ": candidates = " + v + " is not a token id in [0, vocab_size)";
    default:
      return "internal error code " + std::to_string(e.code);
  }
}

inline void raise_tree_error(const char* op, const TreeError& e) {
  EAGLE3_CHECK(op, e.code == kOk, describe(e));
}

// The first error of a batch (lowest request), so that messages do not depend on threads.
inline void raise_first(const char* op, const TreeError* errors, int64_t count) {
  for (int64_t b = 0; b < count; ++b) raise_tree_error(op, errors[b]);
}
inline void raise_first(const char* op, const std::vector<TreeError>& errors) {
  raise_first(op, errors.data(), static_cast<int64_t>(errors.size()));
}

}  // namespace eagle3::tree
