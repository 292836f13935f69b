// CPU entry of eagle3::tree_speculative_sampling_target_only.
//
// at::parallel_for over requests. Each request: the rejection-sampling walk (tree_logic.h),
// then one final token from relu(target - draft) at the last accepted node's row, found by
// a running sum in double precision in vocabulary order (the reference does the same, so
// the two agree token for token). The CPU kernel is deterministic whatever `deterministic`
// says.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "tree/inputs.h"

namespace eagle3::tree {
namespace {

// Requests per parallel task: the final sample reads a whole vocabulary row.
constexpr int64_t kRequestGrain = 1;

// Index of the first token whose running sum of residual mass exceeds coin * total, among
// tokens with positive residual; the last such token when rounding leaves the sum short,
// vocab - 1 when there is none (as sgl-kernel).
int64_t sample_residual(const float* q, const float* p, int64_t vocab, float coin) {
  auto residual = [&](int64_t x) {
    const float v = p == nullptr ? q[x] : q[x] - p[x];
    return v > 0.0f ? v : 0.0f;
  };
  double total = 0.0;
  for (int64_t x = 0; x < vocab; ++x) total += residual(x);
  const double u = static_cast<double>(coin) * total;
  double running = 0.0;
  int64_t last_valid = -1;
  for (int64_t x = 0; x < vocab; ++x) {
    const float v = residual(x);
    if (v <= 0.0f) continue;
    running += v;
    last_valid = x;
    if (running > u) return x;
  }
  return last_valid >= 0 ? last_valid : vocab - 1;
}

void tree_speculative_sampling_target_only_cpu(
    at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index,
    const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, at::Tensor& draft_probs, double threshold_single,
    double threshold_acc, bool deterministic) {
  (void)deterministic;
  const VerifyProblem p = check_sampling(
      predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
      retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
      draft_probs, threshold_single, threshold_acc);
  const int64_t n = p.n, vocab = p.vocab;
  const VerifyBatch batch = verify_batch(p, predicts, accept_index, accept_token_num, candidates,
                                         retrive_index, retrive_next_token, retrive_next_sibling);
  const float* coins = uniform_samples.data_ptr<float>();
  const float* final_coins = uniform_samples_for_final_sampling.data_ptr<float>();
  const float* target = target_probs.data_ptr<float>();
  float* draft = draft_probs.data_ptr<float>();
  const float t_single = static_cast<float>(threshold_single);
  const float t_acc = std::max(static_cast<float>(threshold_acc), kMinThresholdAcc);

  std::vector<TreeError> errors(p.bs);
  at::parallel_for(0, p.bs, kRequestGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* q_rows = target + b * n * vocab;
      float* p_rows = draft + b * n * vocab;
      auto probs = [&](int64_t row, int64_t token) { return q_rows[row * vocab + token]; };
      auto reject = [&](int64_t row, int64_t token) {
        p_rows[row * vocab + token] = q_rows[row * vocab + token];
      };
      SamplingWalk walk;
      errors[b] = sampling_walk_request(batch, b, vocab, coins + b * n, t_single, t_acc, probs,
                                        reject, &walk);
      if (errors[b].code != kOk) continue;
      const float* q = q_rows + walk.final_row * vocab;
      const float* d = walk.subtract_draft ? p_rows + walk.final_row * vocab : nullptr;
      batch.predicts[walk.last_global] = static_cast<int32_t>(sample_residual(q, d, vocab, final_coins[b]));
    }
  });
  raise_first(kSamplingOp, errors);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) {
  m.impl("tree_speculative_sampling_target_only", &tree_speculative_sampling_target_only_cpu);
}

}  // namespace eagle3::tree
