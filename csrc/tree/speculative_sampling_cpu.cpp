// CPU entry of eagle3::tree_speculative_sampling_target_only.
//
// at::parallel_for over requests. Each request: the rejection-sampling walk (tree_logic.h),
// then one final token from relu(target - draft) at the last accepted node's row: one pass
// for the total, a second that skips 256-token blocks by their sum and stops in the block
// where the running sum passes the coin. The CPU kernel is deterministic whatever
// `deterministic` says.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "tree/inputs.h"

namespace eagle3::tree {
namespace {

// Vocabulary entries one parallel task should cover at least (the final sample reads a
// row twice): below this, waking another thread costs more than it saves.
constexpr int64_t kTokensPerTask = 1 << 17;

// Vocabulary entries summed as independent lanes (the compiler turns them into SIMD adds).
constexpr int64_t kLanes = 16;
// Scan granularity of the final sample: whole blocks are skipped by their sum until the one
// where the running sum passes the coin, which is then scanned token by token.
constexpr int64_t kScanBlock = 256;

template <bool kSubtract>
inline float residual(const float* q, const float* p, int64_t x) {
  const float v = kSubtract ? q[x] - p[x] : q[x];
  return v > 0.0f ? v : 0.0f;
}

template <bool kSubtract>
float residual_sum(const float* q, const float* p, int64_t begin, int64_t end) {
  float lanes[kLanes] = {};
  int64_t x = begin;
  for (; x + kLanes <= end; x += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += residual<kSubtract>(q, p, x + k);
  }
  float sum = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
  for (; x < end; ++x) sum += residual<kSubtract>(q, p, x);
  return sum;
}

// The first token whose running sum of relu(q - p) passes coin * total, among tokens with
// positive residual; the last such token when rounding leaves the sum short, vocab - 1 when
// there is none (as sgl-kernel). Sums are float32 in blocked order (as on the GPU); the
// reference sums in float64, so the two can differ only when the coin falls within rounding
// error of a token boundary.
template <bool kSubtract>
int64_t sample_residual(const float* q, const float* p, int64_t vocab, float coin) {
  const float u = coin * residual_sum<kSubtract>(q, p, 0, vocab);
  float running = 0.0f;
  for (int64_t start = 0; start < vocab; start += kScanBlock) {
    const int64_t end = std::min(start + kScanBlock, vocab);
    const float block = residual_sum<kSubtract>(q, p, start, end);
    if (!(running + block > u)) {
      running += block;
      continue;
    }
    for (int64_t x = start; x < end; ++x) {  // the crossing is in this block
      const float v = residual<kSubtract>(q, p, x);
      if (v <= 0.0f) continue;
      running += v;
      if (running > u) return x;
    }
  }
  for (int64_t x = vocab - 1; x >= 0; --x) {
    if (residual<kSubtract>(q, p, x) > 0.0f) return x;
  }
  return vocab - 1;
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
  const int64_t grain = std::max<int64_t>(1, kTokensPerTask / vocab);
  at::parallel_for(0, p.bs, grain, [&](int64_t begin, int64_t end) {
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
      const float* d = p_rows + walk.final_row * vocab;
      const int64_t token = walk.subtract_draft
                                ? sample_residual<true>(q, d, vocab, final_coins[b])
                                : sample_residual<false>(q, d, vocab, final_coins[b]);
      batch.predicts[walk.last_global] = static_cast<int32_t>(token);
    }
  });
  raise_first(kSamplingOp, errors);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) {
  m.impl("tree_speculative_sampling_target_only", &tree_speculative_sampling_target_only_cpu);
}

}  // namespace eagle3::tree
