// CUDA entries of the tree ops: validate the arguments (inputs.h, the same checks as the CPU
// entries), launch on the current stream (kernel.cuh). What only a walk of the tree finds (an
// invalid tree, a token or index out of range) the kernels report as per-request TreeErrors,
// read back and raised only with validation on (the ops' validate=True, common/options.h: a
// synchronization, skipped while a CUDA graph is captured). By default nothing is read back: an
// invalid request's outputs are left partly written, as sgl-kernel does, and the kernels never
// index out of bounds.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "common/cuda_host.h"
#include "tree/inputs.h"
#include "tree/kernel.cuh"

namespace eagle3::tree {
namespace {

using cuda_host::aligned16;

// With validation on, one zeroed TreeError per request on the device of `like`;
// otherwise undefined (no allocation, no memset: the kernels then record nothing).
at::Tensor error_buffer(int64_t bs, const at::Tensor& like) {
  if (!cuda_host::validate_values()) return at::Tensor();
  return at::zeros({std::max<int64_t>(bs, 1) * static_cast<int64_t>(sizeof(TreeError))},
                   like.options().dtype(at::kByte));
}

TreeError* errors_ptr(const at::Tensor& buffer) {
  return buffer.defined() ? reinterpret_cast<TreeError*>(buffer.data_ptr()) : nullptr;
}

// Raises the first request's TreeError, if any; only when the buffer exists (validation on)
// and the stream is not being captured.
void raise_device_errors(const char* op, const at::Tensor& buffer, int64_t bs,
                         cudaStream_t stream) {
  if (!buffer.defined() || cuda_host::capturing(stream)) return;
  const at::Tensor host = buffer.cpu();  // waits for the kernel
  raise_first(op, reinterpret_cast<const TreeError*>(host.data_ptr()), bs);
}

void build_tree_kernel_efficient_cuda(const at::Tensor& parent_list,
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
  EAGLE3_CHECK(kBuildOp, p.n <= cuda::kMaxBuildNodes, "draft_token_num ", p.n,
               " exceeds the CUDA kernel's limit of ", cuda::kMaxBuildNodes,
               " nodes (one thread per node)");
  if (p.bs == 0) return;
  const c10::cuda::CUDAGuard guard(verified_seq_len.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor errors = error_buffer(p.bs, verified_seq_len);

  cuda::BuildParams params;
  params.parent_list = p.parent_cols > 0 ? parent_list.data_ptr<int64_t>() : nullptr;
  params.selected = selected_index.data_ptr<int64_t>();
  params.seq_lens = verified_seq_len.data_ptr<int64_t>();
  params.mask_bool = p.mode == kQlenOnlyBitpacking ? nullptr : tree_mask.data_ptr<bool>();
  params.mask_packed =
      p.mode == kQlenOnlyBitpacking ? static_cast<uint8_t*>(tree_mask.data_ptr()) : nullptr;
  params.mask_numel = tree_mask.numel();
  params.positions = positions.data_ptr<int64_t>();
  params.retrive_index = retrive_index.data_ptr<int64_t>();
  params.next_token = retrive_next_token.data_ptr<int64_t>();
  params.next_sibling = retrive_next_sibling.data_ptr<int64_t>();
  params.errors = errors_ptr(errors);
  params.bs = p.bs;
  params.n = p.n;
  params.topk = p.topk;
  params.parent_cols = p.parent_cols;
  params.mode = p.mode;
  params.row_bytes = p.row_bytes;

  const int threads = static_cast<int>((p.n + cuda::kWarpSize - 1) / cuda::kWarpSize * cuda::kWarpSize);
  const size_t smem = static_cast<size_t>(p.n) * sizeof(int64_t);
  cuda::build_tree_kernel<<<static_cast<unsigned>(p.bs), threads, smem, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  raise_device_errors(kBuildOp, errors, p.bs, stream);
}

void verify_tree_greedy_cuda(at::Tensor& predicts, at::Tensor& accept_index,
                             at::Tensor& accept_token_num, const at::Tensor& candidates,
                             const at::Tensor& retrive_index,
                             const at::Tensor& retrive_next_token,
                             const at::Tensor& retrive_next_sibling,
                             const at::Tensor& target_predict) {
  const VerifyProblem p = check_greedy(predicts, accept_index, accept_token_num, candidates,
                                       retrive_index, retrive_next_token, retrive_next_sibling,
                                       target_predict);
  if (p.bs == 0) return;
  const c10::cuda::CUDAGuard guard(candidates.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor errors = error_buffer(p.bs, candidates);
  const VerifyBatch batch = verify_batch(p, predicts, accept_index, accept_token_num, candidates,
                                         retrive_index, retrive_next_token, retrive_next_sibling);
  const unsigned blocks = static_cast<unsigned>((p.bs + cuda::kGreedyThreads - 1) / cuda::kGreedyThreads);
  cuda::verify_greedy_kernel<<<blocks, cuda::kGreedyThreads, 0, stream>>>(
      batch, target_predict.data_ptr<int64_t>(), errors_ptr(errors));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  raise_device_errors(kGreedyOp, errors, p.bs, stream);
}

template <int VEC>
void launch_sampling(const cuda::SamplingParams& params, bool deterministic, int64_t bs,
                     cudaStream_t stream) {
  if (deterministic) {
    cuda::tree_sampling_kernel<VEC, true>
        <<<static_cast<unsigned>(bs), cuda::kSamplingThreads, 0, stream>>>(params);
  } else {
    cuda::tree_sampling_kernel<VEC, false>
        <<<static_cast<unsigned>(bs), cuda::kSamplingThreads, 0, stream>>>(params);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void tree_speculative_sampling_target_only_cuda(
    at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index,
    const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, at::Tensor& draft_probs, double threshold_single,
    double threshold_acc, bool deterministic) {
  const VerifyProblem p = check_sampling(
      predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
      retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
      draft_probs, threshold_single, threshold_acc);
  if (p.bs == 0) return;
  const c10::cuda::CUDAGuard guard(candidates.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor errors = error_buffer(p.bs, candidates);

  cuda::SamplingParams params;
  params.batch = verify_batch(p, predicts, accept_index, accept_token_num, candidates,
                              retrive_index, retrive_next_token, retrive_next_sibling);
  params.coins = uniform_samples.data_ptr<float>();
  params.final_coins = uniform_samples_for_final_sampling.data_ptr<float>();
  params.target = target_probs.data_ptr<float>();
  params.draft = draft_probs.data_ptr<float>();
  params.errors = errors_ptr(errors);
  params.vocab = p.vocab;
  params.threshold_single = static_cast<float>(threshold_single);
  params.threshold_acc = std::max(static_cast<float>(threshold_acc), kMinThresholdAcc);

  // 16-byte loads need every row to start on a 16-byte boundary.
  const bool vector_ok = p.vocab % 4 == 0 && aligned16(params.target) && aligned16(params.draft);
  if (vector_ok) {
    launch_sampling<4>(params, deterministic, p.bs, stream);
  } else {
    launch_sampling<1>(params, deterministic, p.bs, stream);
  }
  raise_device_errors(kSamplingOp, errors, p.bs, stream);
}

template <int VEC>
void launch_sampling_draft_probs(const cuda::DraftProbsParams& params, bool deterministic,
                                 int64_t bs, cudaStream_t stream) {
  if (deterministic) {
    cuda::tree_sampling_draft_probs_kernel<VEC, true>
        <<<static_cast<unsigned>(bs), cuda::kSamplingThreads, 0, stream>>>(params);
  } else {
    cuda::tree_sampling_draft_probs_kernel<VEC, false>
        <<<static_cast<unsigned>(bs), cuda::kSamplingThreads, 0, stream>>>(params);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void tree_speculative_sampling_draft_probs_cuda(
    at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index,
    const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, const at::Tensor& draft_probs, bool deterministic) {
  const VerifyProblem p = check_sampling_draft_probs(
      predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
      retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
      draft_probs);
  if (p.bs == 0) return;
  const c10::cuda::CUDAGuard guard(candidates.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor errors = error_buffer(p.bs, candidates);

  cuda::DraftProbsParams params;
  params.batch = verify_batch(p, predicts, accept_index, accept_token_num, candidates,
                              retrive_index, retrive_next_token, retrive_next_sibling);
  params.coins = uniform_samples.data_ptr<float>();
  params.final_coins = uniform_samples_for_final_sampling.data_ptr<float>();
  params.target = target_probs.data_ptr<float>();
  params.draft = draft_probs.data_ptr<float>();
  params.errors = errors_ptr(errors);
  params.vocab = p.vocab;

  // 16-byte loads need every row to start on a 16-byte boundary.
  const bool vector_ok = p.vocab % 4 == 0 && aligned16(params.target) && aligned16(params.draft);
  if (vector_ok) {
    launch_sampling_draft_probs<4>(params, deterministic, p.bs, stream);
  } else {
    launch_sampling_draft_probs<1>(params, deterministic, p.bs, stream);
  }
  raise_device_errors(kDraftProbsOp, errors, p.bs, stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CUDA, m) {
  m.impl("build_tree_kernel_efficient", &build_tree_kernel_efficient_cuda);
  m.impl("verify_tree_greedy", &verify_tree_greedy_cuda);
  m.impl("tree_speculative_sampling_target_only", &tree_speculative_sampling_target_only_cuda);
  m.impl("tree_speculative_sampling_draft_probs", &tree_speculative_sampling_draft_probs_cuda);
}

}  // namespace eagle3::tree
