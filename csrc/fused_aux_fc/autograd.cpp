// Autograd of eagle3::fused_aux_fc, registered in C++ for every backend: a call that needs no
// gradient goes straight to the CPU or CUDA kernel without entering Python (the draft runs the
// op at every decoding step), and training gets the gradients as plain GEMMs per segment:
//   d aux_s = dOut @ W_s,   d W_s = dOut^T @ aux_s,   d bias = sum over rows of dOut,
// with W_s = weight[:, s * H : (s + 1) * H].
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace eagle3::fused_aux_fc {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_kernel(at::TensorList aux_hidden, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("eagle3::fused_aux_fc", "")
          .typed<at::Tensor(at::TensorList, const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(aux_hidden, weight, bias);
}

class FusedAuxFcFunction : public torch::autograd::Function<FusedAuxFcFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::TensorList aux_hidden,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<at::Tensor> saved(aux_hidden.begin(), aux_hidden.end());
    saved.push_back(weight);
    ctx->save_for_backward(saved);
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return call_kernel(aux_hidden, weight, bias);
  }

  // One gradient per forward input (k aux tensors, weight, bias); the context numbers only
  // the tensor inputs, so the bias is input k + 1 when it exists.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor weight = saved.back();
    saved.pop_back();
    const size_t k = saved.size();
    const int64_t hidden = saved[0].size(-1);
    const at::Tensor grad = grad_outputs[0].reshape({-1, grad_outputs[0].size(-1)});
    variable_list grads(k + 2);
    for (size_t s = 0; s < k; ++s) {
      if (ctx->needs_input_grad(s)) {
        const at::Tensor w_s = weight.narrow(1, static_cast<int64_t>(s) * hidden, hidden);
        grads[s] = grad.mm(w_s).view(saved[s].sizes());
      }
    }
    if (ctx->needs_input_grad(k)) {
      std::vector<at::Tensor> blocks;
      for (const at::Tensor& x : saved) blocks.push_back(grad.t().mm(x.reshape({-1, hidden})));
      grads[k] = at::cat(blocks, 1);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(k + 1)) {
      grads[k + 1] = grad.sum(0);
    }
    return grads;
  }
};

at::Tensor fused_aux_fc_autograd(at::TensorList aux_hidden, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias) {
  return FusedAuxFcFunction::apply(aux_hidden, weight, bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, Autograd, m) { m.impl("fused_aux_fc", &fused_aux_fc_autograd); }

}  // namespace eagle3::fused_aux_fc
