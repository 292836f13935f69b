// The per-request logic of the tree ops, shared by the CPU kernels and the CUDA kernels:
// plain pointers and sizes, no torch types, callable from host and device code. Each
// function handles one request; the callers split the batch (CPU: at::parallel_for over
// requests, CUDA: one block per request).
//
// Invalid input found while walking (a node whose parent is not selected, an index out of
// range, a cycle) is not skipped: the function stops and reports a TreeError, which the host
// turns into an exception naming the request, the node and the value (inputs.h).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EAGLE3_HD __host__ __device__ __forceinline__
#else
#define EAGLE3_HD inline
#endif

namespace eagle3::tree {

enum TreeMaskMode : int64_t { kFullMask = 0, kQlenOnly = 1, kQlenOnlyBitpacking = 2 };

// What went wrong, where. code == kOk means nothing did.
enum TreeErrorCode : int32_t {
  kOk = 0,
  kSelectedIndexOutOfRange,   // selected_index[b, node - 1] = value; its parent slot is out of range
  kParentNotSelected,         // node's parent candidate parent_list[...] = value is not selected
  kParentCycle,               // following node's parents never reaches the root
  kNegativeSeqLen,            // verified_seq_len[b] = value < 0
  kMaskSizeMismatch,          // mode-0 tree_mask size differs from value (found on the device)
  kNextTokenOutOfRange,       // retrive_next_token[b, node] = value not in [-1, N)
  kNextSiblingOutOfRange,     // retrive_next_sibling[b, node] = value not in [-1, N)
  kSiblingCycle,              // the sibling list starting at node's first child does not end
  kRetriveIndexOutOfRange,    // retrive_index[b, node] = value not in [0, bs * N)
  kCandidateOutOfRange,       // candidates[b, node] = value not in [0, V)
};

struct TreeError {
  int32_t code = kOk;
  int32_t request = 0;
  int32_t node = 0;
  int64_t value = 0;
};

EAGLE3_HD TreeError make_error(int32_t code, int64_t request, int64_t node, int64_t value) {
  TreeError e;
  e.code = code;
  e.request = static_cast<int32_t>(request);
  e.node = static_cast<int32_t>(node);
  e.value = value;
  return e;
}

// Bytes of one bit-packed mask row (tree_mask_mode 2) for n tree nodes.
EAGLE3_HD int64_t packed_row_bytes(int64_t n) { return n <= 8 ? 1 : (n <= 16 ? 2 : 4); }

// --- build_tree_kernel_efficient ------------------------------------------------------------

// One request's view of build_tree_kernel_efficient's inputs.
struct BuildRequest {
  const int64_t* parent_row;    // parent_list[b, :], parent_cols entries
  const int64_t* selected_row;  // selected_index[b, :], n - 1 entries
  int64_t parent_cols;
  int64_t topk;
  int64_t n;                    // draft_token_num
  int64_t request;
};

// Tree node of the parent of node `node` (1 <= node < n): the root (0) when its candidate's
// parent slot is 0, else 1 + the position of parent_list[b, slot] in selected_index[b, :]
// (its first occurrence). Returns -1 and sets *err when the tree is invalid.
EAGLE3_HD int64_t resolve_parent(const BuildRequest& r, int64_t node, TreeError* err) {
  const int64_t candidate = r.selected_row[node - 1];
  const int64_t slot = candidate < 0 ? -1 : candidate / r.topk;
  if (slot < 0 || (slot > 0 && slot >= r.parent_cols)) {
    *err = make_error(kSelectedIndexOutOfRange, r.request, node, candidate);
    return -1;
  }
  if (slot == 0) return 0;
  const int64_t parent_candidate = r.parent_row[slot];
  for (int64_t j = 0; j < r.n - 1; ++j) {
    if (r.selected_row[j] == parent_candidate) return j + 1;
  }
  *err = make_error(kParentNotSelected, r.request, node, parent_candidate);
  return -1;
}

// Depth of `node` (root 0) given every node's parent; -1 and *err on a cycle.
EAGLE3_HD int64_t node_depth(const int64_t* parents, int64_t n, int64_t node, int64_t request,
                             TreeError* err) {
  int64_t depth = 0;
  for (int64_t cur = node; cur != 0; cur = parents[cur]) {
    if (++depth >= n) {
      *err = make_error(kParentCycle, request, node, cur);
      return -1;
    }
  }
  return depth;
}

// Sets the visible columns of `node`'s mask row: bit j for every draft node j on the path
// from the root to `node` (self included); the root (bit 0) is set by the caller.
template <typename SetBit>
EAGLE3_HD void for_each_on_path(const int64_t* parents, int64_t node, SetBit set_bit) {
  for (int64_t cur = node; cur != 0; cur = parents[cur]) set_bit(cur);
}

// --- verification ---------------------------------------------------------------------------

// One request's view of the verify ops' tree tensors.
struct VerifyRequest {
  const int64_t* candidates;     // [n]
  const int64_t* retrive_index;  // [n]
  const int64_t* next_token;     // [n]
  const int64_t* next_sibling;   // [n]
  int64_t n;
  int64_t total_nodes;           // bs * n: the range of retrive_index
  int64_t request;
};

// The verify ops' tree tensors and outputs for the whole batch; request(b) is one request.
struct VerifyBatch {
  const int64_t* candidates;     // [bs, n]
  const int64_t* retrive_index;  // [bs, n]
  const int64_t* next_token;     // [bs, n]
  const int64_t* next_sibling;   // [bs, n]
  int32_t* predicts;             // [bs * n]
  int32_t* accept_index;         // [bs, num_steps]
  int32_t* accept_num;           // [bs]
  int64_t bs;
  int64_t n;
  int64_t num_steps;

  EAGLE3_HD VerifyRequest request(int64_t b) const {
    return VerifyRequest{candidates + b * n, retrive_index + b * n, next_token + b * n,
                         next_sibling + b * n, n, bs * n, b};
  }
};

// Reads retrive_index[b, node], checked against [0, bs * N).
EAGLE3_HD bool global_index(const VerifyRequest& r, int64_t node, int64_t* out, TreeError* err) {
  const int64_t g = r.retrive_index[node];
  if (g < 0 || g >= r.total_nodes) {
    *err = make_error(kRetriveIndexOutOfRange, r.request, node, g);
    return false;
  }
  *out = g;
  return true;
}

EAGLE3_HD bool checked_link(const int64_t* links, int32_t code, const VerifyRequest& r,
                            int64_t node, int64_t* out, TreeError* err) {
  const int64_t v = links[node];
  if (v < -1 || v >= r.n) {
    *err = make_error(code, r.request, node, v);
    return false;
  }
  *out = v;
  return true;
}

// The walk both verify ops share: from the root, at most num_steps - 1 levels; at each level
// the children of the last accepted node are tried in sibling order and the first that
// try_child(last_global, node, &err) accepts becomes the last accepted node (its token goes
// to predicts at its parent). *last_global: the global index of the last accepted node.
// write_outputs false: the walk only decides (a CUDA block whose threads all walk the same
// tree lets one of them write).
template <typename TryChild>
EAGLE3_HD TreeError walk_tree(const VerifyBatch& batch, int64_t b, TryChild try_child,
                              int64_t* last_global, bool write_outputs = true) {
  const VerifyRequest r = batch.request(b);
  int32_t* predicts = batch.predicts;
  int32_t* accept_row = batch.accept_index + b * batch.num_steps;
  TreeError err;
  int64_t last;
  if (!global_index(r, 0, &last, &err)) return err;
  if (write_outputs) accept_row[0] = static_cast<int32_t>(last);
  int64_t accepted = 0;
  int64_t cur = 0;
  for (int64_t step = 1; step < batch.num_steps; ++step) {
    const int64_t parent = cur;
    if (!checked_link(r.next_token, kNextTokenOutOfRange, r, parent, &cur, &err)) return err;
    int64_t visited = 0;
    while (cur != -1) {
      if (++visited > r.n) return make_error(kSiblingCycle, r.request, parent, cur);
      int64_t g;
      if (!global_index(r, cur, &g, &err)) return err;
      const bool accept = try_child(last, cur, &err);
      if (err.code != kOk) return err;
      if (accept) {
        ++accepted;
        if (write_outputs) {
          predicts[last] = static_cast<int32_t>(r.candidates[cur]);
          accept_row[accepted] = static_cast<int32_t>(g);
        }
        last = g;
        break;
      }
      if (!checked_link(r.next_sibling, kNextSiblingOutOfRange, r, cur, &cur, &err)) return err;
    }
    if (cur == -1) break;
  }
  if (write_outputs) batch.accept_num[b] = static_cast<int32_t>(accepted);
  *last_global = last;
  return err;
}

// Greedy verification of one request (verify_tree_greedy): a child is accepted when its token
// is the target's argmax at the last accepted node; the target's token there is the bonus.
// target_predict: flat [bs * N], indexed by global node index.
EAGLE3_HD TreeError verify_greedy_request(const VerifyBatch& batch, int64_t b,
                                          const int64_t* target_predict) {
  const int64_t* candidates = batch.candidates + b * batch.n;
  auto matches_target = [&](int64_t last, int64_t node, TreeError*) {
    return candidates[node] == target_predict[last];
  };
  int64_t last;
  TreeError err = walk_tree(batch, b, matches_target, &last);
  if (err.code == kOk) batch.predicts[last] = static_cast<int32_t>(target_predict[last]);
  return err;
}

// Outcome of the rejection-sampling walk of one request; the final token is then sampled
// from row `final_row` of the request (local node index) by the caller.
struct SamplingWalk {
  int64_t last_global = 0;     // global index of the last accepted node
  int64_t final_row = 0;       // its local node index: the target_probs row to sample from
  bool subtract_draft = true;  // false after num_steps - 1 accepted tokens: no residual
};

// Rejection-sampling walk of request b (tree_speculative_sampling_target_only), before the
// final sample. coins: uniform_samples[b, :], one per level (at the last accepted node); child k is accepted when
// coin <= (sum of the target probabilities of children 1..k) / threshold_acc or its own
// probability >= threshold_single. probs(row, token) reads target_probs[b, row, token];
// reject(row, token) records a rejected child's target mass in draft_probs[b, row, token].
template <typename Probs, typename Reject>
EAGLE3_HD TreeError sampling_walk_request(const VerifyBatch& batch, int64_t b, int64_t vocab,
                                          const float* coins, float threshold_single,
                                          float threshold_acc, Probs probs, Reject reject,
                                          SamplingWalk* walk) {
  const int64_t* candidates = batch.candidates + b * batch.n;
  int64_t row = 0;
  float coin = coins[0];
  float prob_acc = 0.0f;
  auto try_child = [&](int64_t, int64_t node, TreeError* err) {
    const int64_t token = candidates[node];
    if (token < 0 || token >= vocab) {
      *err = make_error(kCandidateOutOfRange, b, node, token);
      return false;
    }
    const float p = probs(row, token);
    prob_acc += p;
    if (coin <= prob_acc / threshold_acc || p >= threshold_single) {
      prob_acc = 0.0f;
      row = node;
      coin = coins[node];
      return true;
    }
    reject(row, token);
    return false;
  };
  TreeError err = walk_tree(batch, b, try_child, &walk->last_global);
  walk->final_row = row;
  walk->subtract_draft = batch.accept_num[b] != batch.num_steps - 1;
  return err;
}

// threshold_acc is divided by; like sgl-kernel, 0 is read as a tiny positive number.
constexpr float kMinThresholdAcc = 1e-9f;

// --- tree_speculative_sampling_draft_probs --------------------------------------------------
//
// Recursive rejection sampling with the draft's probabilities, children drawn i.i.d. (with
// replacement) from the draft distribution q of their parent. At a node with target p, the
// residual after k rejected children is p_k = normalize(relu(p_{k-1} - q)), which equals
// relu(p - c_k q) / Z_k with c_0 = 0, Z_0 = 1 (the target row as given) and
// c_{k+1} = c_k + Z_k, Z_k = sum over the vocabulary of relu(p - c_k q): the residual is one
// scalar c and its mass Z, not a buffer, and each rejection costs one pass over the row.

// relu(p - c q) rounded as two float32 operations, never fused into an FMA, so that the CPU
// kernel, the CUDA kernel and the reference compute the same value for every token.
EAGLE3_HD float draft_residual(float p, float q, float c) {
#if defined(__CUDA_ARCH__)
  const float v = __fsub_rn(p, __fmul_rn(c, q));
#else
  const float v = p - c * q;  // the CPU source is compiled with -ffp-contract=off
#endif
  return v > 0.0f ? v : 0.0f;
}

// Whether a child with target residual r = relu(p - c q)(x) and draft probability q(x) is
// accepted with its coin: coin < r / (Z q(x)), i.e. with probability min(1, p_k(x) / q(x)).
// q(x) = 0 accepts any x with residual mass; r = 0 never accepts.
EAGLE3_HD bool draft_accepts(float coin, float mass, float q, float r) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__fmul_rn(coin, mass), q) < r;
#else
  return coin * mass * q < r;
#endif
}

// Outcome of the draft-probability walk: the final token is sampled from
// relu(p - c q) at row final_row (c = 0: the full target row).
struct DraftProbsWalk {
  int64_t last_global = 0;  // global index of the last accepted node
  int64_t final_row = 0;    // its local node index
  float c = 0.0f;           // the residual's scalar at that node
};

// Walk of request b for tree_speculative_sampling_draft_probs, before the final sample.
// coins: uniform_samples[b, :], child node i is decided by coins[i]. target(row, token) and
// draft(row, token) read target_probs / draft_probs [b, row, token]; mass(row, c) returns the
// sum over the vocabulary of draft_residual(target, draft, c) at row (after a rejection).
template <typename Target, typename Draft, typename Mass>
EAGLE3_HD TreeError draft_probs_walk_request(const VerifyBatch& batch, int64_t b, int64_t vocab,
                                             const float* coins, Target target, Draft draft,
                                             Mass mass, bool write_outputs,
                                             DraftProbsWalk* walk) {
  const int64_t* candidates = batch.candidates + b * batch.n;
  int64_t row = 0;
  float c = 0.0f, z = 1.0f;
  auto try_child = [&](int64_t, int64_t node, TreeError* err) {
    const int64_t token = candidates[node];
    if (token < 0 || token >= vocab) {
      *err = make_error(kCandidateOutOfRange, b, node, token);
      return false;
    }
    const float q = draft(row, token);
    if (draft_accepts(coins[node], z, q, draft_residual(target(row, token), q, c))) {
      row = node;
      c = 0.0f;
      z = 1.0f;
      return true;
    }
    c += z;
    z = mass(row, c);
    return false;
  };
  TreeError err = walk_tree(batch, b, try_child, &walk->last_global, write_outputs);
  walk->final_row = row;
  walk->c = c;
  return err;
}

}  // namespace eagle3::tree
