// Validation and flattening of fused_aux_fc's arguments, shared by the CPU and CUDA entries
// so that both backends reject exactly the same calls with exactly the same messages.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "common/checks.h"

namespace eagle3::fused_aux_fc {

inline constexpr const char* kOp = "fused_aux_fc";
// Launch parameters carry the segment pointers by value; more than this is no EAGLE-3 draft.
inline constexpr int kMaxSegments = 16;

// The call seen as a GEMM: out[rows, out_features] = sum_s x_s[rows, hidden] @ W_s^T, where
// W_s = weight[:, s * hidden : (s + 1) * hidden].
struct Problem {
  std::vector<at::Tensor> segments;  // k tensors [rows, hidden], unit stride along hidden
  at::Tensor weight;                 // [out_features, k * hidden], unit stride along k * hidden
  at::Tensor bias;                   // [out_features] or undefined
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t out_features = 0;
  std::vector<int64_t> out_shape;    // leading dims of the aux tensors + [out_features]
};

inline Problem check_and_flatten(at::TensorList aux_hidden, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias) {
  const int64_t k = static_cast<int64_t>(aux_hidden.size());
  EAGLE3_CHECK(kOp, k >= 1, "aux_hidden is empty; expected k >= 1 captured hidden states");
  EAGLE3_CHECK(kOp, k <= kMaxSegments, "got ", k, " aux hidden states; at most ", kMaxSegments,
               " are supported");
  const at::Tensor& first = aux_hidden[0];
  check_float_tensor(kOp, "aux_hidden[0]", first);
  EAGLE3_CHECK(kOp, first.dim() >= 1, "aux_hidden[0] must have at least one dimension [..., H]");
  for (int64_t s = 1; s < k; ++s) {
    const at::Tensor& t = aux_hidden[s];
    EAGLE3_CHECK(kOp, t.sizes() == first.sizes(), "aux_hidden[", s, "] has shape ", t.sizes(),
                 " but aux_hidden[0] has ", first.sizes(),
                 "; all captured hidden states must have the same shape");
    EAGLE3_CHECK_DTYPE(kOp, t.scalar_type() == first.scalar_type(), "aux_hidden[", s, "] has dtype ",
                 t.scalar_type(), " but aux_hidden[0] has ", first.scalar_type(),
                 "; they must match");
    EAGLE3_CHECK(kOp, t.device() == first.device(), "aux_hidden[", s, "] is on ", t.device(),
                 " but aux_hidden[0] is on ", first.device(), "; they must be on one device");
  }
  check_dim(kOp, "weight", weight, 2);
  check_same_dtype(kOp, "weight", weight, "aux_hidden", first);
  check_same_device(kOp, "weight", weight, "aux_hidden", first);

  const int64_t hidden = first.size(-1);
  EAGLE3_CHECK(kOp, hidden > 0, "aux hidden states have width 0");
  const int64_t in_features = weight.size(1);
  if (in_features != k * hidden) {
    if (in_features % hidden == 0) {
      const int64_t trained_k = in_features / hidden;
      EAGLE3_CHECK(kOp, false, "got ", k, " aux hidden states of width ", hidden, " (", k * hidden,
                   " in total) but weight expects ", in_features, " = ", trained_k, " x ", hidden,
                   "; the captured layers differ from the ones the draft was trained on (",
                   k > trained_k ? "an embedding output or an extra layer was captured"
                                 : "a layer the draft was trained with is missing",
                   ")");
    }
    EAGLE3_CHECK(kOp, false, "got ", k, " aux hidden states of width ", hidden, " (", k * hidden,
                 " in total) but weight expects ", in_features,
                 ", which is not a multiple of ", hidden,
                 "; the draft was trained for a target of another hidden size");
  }

  Problem p;
  p.hidden = hidden;
  p.out_features = weight.size(0);
  p.rows = hidden == 0 ? 0 : first.numel() / hidden;
  p.out_shape.assign(first.sizes().begin(), first.sizes().end() - 1);
  p.out_shape.push_back(p.out_features);
  p.weight = weight.stride(1) == 1 ? weight : weight.contiguous();
  for (const at::Tensor& t : aux_hidden) {
    at::Tensor x = t.reshape({p.rows, hidden});  // a view whenever the strides allow one
    if (x.stride(1) != 1) x = x.contiguous();
    p.segments.push_back(x);
  }
  if (bias.has_value() && bias->defined()) {
    const at::Tensor& b = *bias;
    EAGLE3_CHECK(kOp, b.dim() == 1 && b.size(0) == p.out_features, "bias must have shape [",
                 p.out_features, "] (weight.size(0)), got ", b.sizes());
    check_same_dtype(kOp, "bias", b, "aux_hidden", first);
    check_same_device(kOp, "bias", b, "aux_hidden", first);
    p.bias = b.contiguous();
  }
  return p;
}

}  // namespace eagle3::fused_aux_fc
