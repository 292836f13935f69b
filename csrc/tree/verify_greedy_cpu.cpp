// CPU entry of eagle3::verify_tree_greedy.
//
// at::parallel_for over requests; each request is one walk from the root of at most
// S - 1 levels, visiting each level's children in sibling order (tree_logic.h).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "tree/inputs.h"

namespace eagle3::tree {
namespace {

// Requests per parallel task: a walk touches a few dozen integers.
constexpr int64_t kRequestGrain = 64;

void verify_tree_greedy_cpu(at::Tensor& predicts, at::Tensor& accept_index,
                            at::Tensor& accept_token_num, const at::Tensor& candidates,
                            const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                            const at::Tensor& retrive_next_sibling,
                            const at::Tensor& target_predict) {
  const VerifyProblem p = check_greedy(predicts, accept_index, accept_token_num, candidates,
                                       retrive_index, retrive_next_token, retrive_next_sibling,
                                       target_predict);
  const VerifyBatch batch = verify_batch(p, predicts, accept_index, accept_token_num, candidates,
                                         retrive_index, retrive_next_token, retrive_next_sibling);
  const int64_t* target = target_predict.data_ptr<int64_t>();
  std::vector<TreeError> errors(p.bs);
  at::parallel_for(0, p.bs, kRequestGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      errors[b] = verify_greedy_request(batch, b, target);
    }
  });
  raise_first(kGreedyOp, errors);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3, CPU, m) { m.impl("verify_tree_greedy", &verify_tree_greedy_cpu); }

}  // namespace eagle3::tree
