// CPU entry of eagle3::tree_speculative_sampling_draft_probs.
//
// at::parallel_for over requests. Each request: the draft-probability walk (tree_logic.h),
// whose residual at a node is relu(p - c q) / Z for one scalar c, so a rejection costs one
// pass over the node's two rows (Z for the new c) and nothing is allocated or written but
// the outputs. Then one final token from relu(p - c q) at the last accepted node: one pass
// for the total, a second that skips 256-token blocks by their sum and stops in the block
// where the running sum passes the coin. Element values are float32 without FMA contraction
// (CMakeLists.txt compiles this file with -ffp-contract=off), bit for bit the reference's;
// sums are float32 in blocked order. The CPU kernel is deterministic whatever
// `deterministic` says.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "tree/inputs.h"

namespace eagle3::tree {
namespace {

// Vocabulary entries one parallel task should cover at least (every rejection and the final
// sample read a row pair): below this, waking another thread costs more than it saves.
constexpr int64_t kTokensPerTask = 1 << 17;
// Vocabulary entries summed as independent lanes (the compiler turns them into SIMD adds).
constexpr int64_t kLanes = 16;
// Scan granularity of the final sample.
constexpr int64_t kScanBlock = 256;

// One node's rows: target p and draft q, [vocab] each.
struct RowPair {
  const float* p;
  const float* q;

  float residual(int64_t x, float c) const { return draft_residual(p[x], q[x], c); }

  float mass(float c, int64_t begin, int64_t end) const {
    float lanes[kLanes] = {};
    int64_t x = begin;
    for (; x + kLanes <= end; x += kLanes) {
      for (int64_t k = 0; k < kLanes; ++k) lanes[k] += residual(x + k, c);
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
    for (; x < end; ++x) sum += residual(x, c);
    return sum;
  }
};

// The first token whose running sum of relu(p - c q) passes coin * total, among tokens with
// positive residual; the last such token when rounding leaves the sum short. A residual that
// is zero everywhere (rounding after a rejection; exact arithmetic never gets there) falls
// back to the target row (c = 0); V - 1 when that is zero too (as the target-only op).
int64_t sample_final(const RowPair& rows, int64_t vocab, float c, float coin) {
  float total = rows.mass(c, 0, vocab);
  if (!(total > 0.0f)) {
    c = 0.0f;
    total = rows.mass(c, 0, vocab);
  }
  const float u = coin * total;
  float running = 0.0f;
  for (int64_t start = 0; start < vocab; start += kScanBlock) {
    const int64_t end = std::min(start + kScanBlock, vocab);
    const float block = rows.mass(c, start, end);
    if (!(running + block > u)) {
      running += block;
      continue;
    }
    for (int64_t x = start; x < end; ++x) {  // the crossing is in this block
      const float v = rows.residual(x, c);
      if (v <= 0.0f) continue;
      running += v;
      if (running > u) return x;
    }
  }
  for (int64_t x = vocab - 1; x >= 0; --x) {
    if (rows.residual(x, c) > 0.0f) return x;
  }
  return vocab - 1;
}

void tree_speculative_sampling_draft_probs_cpu(
    at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index,
    const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, const at::Tensor& draft_probs, bool deterministic) {
  (void)deterministic;
  const VerifyProblem p = check_sampling_draft_probs(
      predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
      retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
      draft_probs);
  const int64_t n = p.n, vocab = p.vocab;
  const VerifyBatch batch = verify_batch(p, predicts, accept_index, accept_token_num, candidates,
                                         retrive_index, retrive_next_token, retrive_next_sibling);
  const float* coins = uniform_samples.data_ptr<float>();
  const float* final_coins = uniform_samples_for_final_sampling.data_ptr<float>();
  const float* target = target_probs.data_ptr<float>();
  const float* draft = draft_probs.data_ptr<float>();

  std::vector<TreeError> errors(p.bs);
  const int64_t grain = std::max<int64_t>(1, kTokensPerTask / vocab);
  at::parallel_for(0, p.bs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* p_rows = target + b * n * vocab;
      const float* q_rows = draft + b * n * vocab;
      auto row_pair = [&](int64_t row) { return RowPair{p_rows + row * vocab, q_rows + row * vocab}; };
      auto target_at = [&](int64_t row, int64_t token) { return p_rows[row * vocab + token]; };
      auto draft_at = [&](int64_t row, int64_t token) { return q_rows[row * vocab + token]; };
      auto mass = [&](int64_t row, float c) { return row_pair(row).mass(c, 0, vocab); };
      DraftProbsWalk walk;
      errors[b] = draft_probs_walk_request(batch, b, vocab, coins + b * n, target_at, draft_at, mass,
                                           /*write_outputs=*/true, &walk);
      if (errors[b].code != kOk) continue;
      const int64_t token = sample_final(row_pair(walk.final_row), vocab, walk.c, final_coins[b]);
      batch.predicts[walk.last_global] = static_cast<int32_t>(token);
    }
  });
  raise_first(kDraftProbsOp, errors);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) {
  m.impl("tree_speculative_sampling_draft_probs", &tree_speculative_sampling_draft_probs_cpu);
}

}  // namespace eagle3::tree
