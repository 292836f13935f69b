// Every eagle3 op schema, in one place. Kernels register their implementations next to
// their code (csrc/<op>/cpu.cpp, csrc/<op>/cuda.cu); fake kernels live in eagle3_ext/ops.py.
#include <torch/library.h>

TORCH_LIBRARY(eagle3, m) {
  m.set_python_module("eagle3_ext.ops");

  // out = cat(aux_hidden, -1) @ weight.T (+ bias) without building the concatenation.
  //   aux_hidden: k tensors [..., H] of one shape, dtype and device (the captured target
  //               hidden states); weight: [H_out, k * H]; bias: [H_out] or None.
  //   returns [..., H_out] in the input dtype, accumulated in fp32.
  m.def("fused_aux_fc(Tensor[] aux_hidden, Tensor weight, Tensor? bias) -> Tensor");

  // --- Tree building and verification (drop-in for sgl-kernel's ops of the same names) ---
  // Sizes: bs requests, N = draft_token_num tree nodes per request (node 0 is the root, the
  // last verified token), S = accept_index.size(1) = max accepted depth + 1, V = vocabulary.
  // Node i's global index is b * N + i (retrive_index). Mutated outputs are annotated (x!);
  // entries the op does not own are left as the caller filled them.

  // Builds the tree of one EAGLE-2 draft round from the per-step top-k bookkeeping.
  //   parent_list: int64 [bs, topk * (depth - 1) + 1] (may have 0 columns when depth == 1):
  //                candidate index of each frontier node; selected_index: int64 [bs, N - 1]:
  //                the candidates kept as nodes 1..N-1, whose parent is candidate
  //                parent_list[b, selected_index // topk] (index 0 means the root);
  //                verified_seq_len: int64 [bs], the prefix length of each request.
  //   tree_mask (written): tree_mask_mode 0: bool flat [sum(seq_len) * N + bs * N * N], per
  //                request an [N, seq_len + N] row-major block (prefix columns untouched, root
  //                column set, draft columns = ancestors + self); 1: bool [bs * N * N] (the
  //                draft columns only); 2: one bit-packed row per node, [bs * N] of 1/2/4-byte
  //                integers for N <= 8/16/32, bit j = node j visible, bit 0 the root.
  //   positions (written): int64 [bs * N] = seq_len + depth. retrive_index, retrive_next_token,
  //                retrive_next_sibling (written): int64 [bs, N]: b * N + i, first child and
  //                next sibling of each node in ascending node order, -1 for none.
  m.def(
      "build_tree_kernel_efficient(Tensor parent_list, Tensor selected_index, "
      "Tensor verified_seq_len, Tensor(a!) tree_mask, Tensor(b!) positions, "
      "Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, Tensor(e!) retrive_next_sibling, "
      "int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()");

  // Greedy verification: from the root, accept the child whose token equals the target's
  // argmax at the last accepted node, until no child matches or S - 1 tokens are accepted.
  //   predicts (written): int32 [bs * N], at each accepted node (root included) the target's
  //                next token there; the last accepted node's entry is the bonus token.
  //   accept_index (written): int32 [bs, S], global indices of the root then accepted nodes.
  //   accept_token_num (written): int32 [bs], accepted draft tokens (not root, not bonus).
  //   candidates, retrive_index, retrive_next_token, retrive_next_sibling: int64 [bs, N];
  //   target_predict: int64 [bs, N], the target's argmax at every node.
  m.def(
      "verify_tree_greedy(Tensor(a!) predicts, Tensor(b!) accept_index, "
      "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrive_index, "
      "Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor target_predict) -> ()");

  // Sampling verification: recursive rejection sampling over each node's children, draft
  // tokens taken as deterministic proposals. A child is accepted when its coin
  // (uniform_samples at the last accepted node) <= the running sum of the children's target
  // probabilities / threshold_acc, or its own probability >= threshold_single. A rejected
  // child's target probability is written into draft_probs at the parent's row, so the final
  // token is sampled (uniform_samples_for_final_sampling) from relu(target - draft) at the
  // last accepted node, or from the full target there after S - 1 accepted tokens. With
  // both thresholds 1.0 the emitted tokens follow the target distribution exactly.
  //   outputs and tree tensors as verify_tree_greedy; uniform_samples: float32 [bs, N];
  //   uniform_samples_for_final_sampling: float32 [bs]; target_probs: float32 [bs, N, V];
  //   draft_probs (written): float32 [bs, N, V], zeros on entry;
  //   threshold_single, threshold_acc: in [0, 1]; deterministic: a reproducible reduction
  //   order on CUDA (the CPU kernel is always deterministic).
  m.def(
      "tree_speculative_sampling_target_only(Tensor(a!) predicts, Tensor(b!) accept_index, "
      "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrive_index, "
      "Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor uniform_samples, "
      "Tensor uniform_samples_for_final_sampling, Tensor target_probs, Tensor(d!) draft_probs, "
      "float threshold_single, float threshold_acc, bool deterministic) -> ()");

  // Sampling verification with the draft's probabilities (SpecInfer / EAGLE style), lossless
  // for any draft: the children of node i are taken as drawn i.i.d. (with replacement) from
  // draft_probs[b, i]. At the last accepted node, with target p and draft q, the children are
  // tried in sibling order; child node j, token x = candidates[b, j], is accepted when its
  // own coin uniform_samples[b, j] < p'(x) / q(x) (probability min(1, p'(x) / q(x))), p'
  // starting as p; on rejection p' <- normalize(relu(p' - q)) and the next sibling is tried
  // (q unchanged). After an accepted child the walk descends; when no child is accepted, or
  // after S - 1 accepted tokens, the final token is drawn (uniform_samples_for_final_sampling)
  // from p' at the last accepted node. The emitted tokens then follow the target exactly.
  //   outputs and tree tensors as verify_tree_greedy; uniform_samples: float32 [bs, N] (column
  //   0 unused); uniform_samples_for_final_sampling: float32 [bs]; target_probs: float32
  //   [bs, N, V], rows summing to 1; draft_probs: float32 [bs, N, V], read only, row i the
  //   distribution node i's children were drawn from; deterministic: as above. No thresholds:
  //   the op is lossless by construction.
  m.def(
      "tree_speculative_sampling_draft_probs(Tensor(a!) predicts, Tensor(b!) accept_index, "
      "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrive_index, "
      "Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor uniform_samples, "
      "Tensor uniform_samples_for_final_sampling, Tensor target_probs, Tensor draft_probs, "
      "bool deterministic) -> ()");

  // Attention of N draft-tree tokens against a KV prefix plus the tree itself (verify forward).
  //   q:            [B, N, Hq, Dqk], the tree tokens' queries (any strides).
  //   k_cache:      [B, S_max, Hkv, Dqk]; v_cache: [B, S_max, Hkv, Dv] (Dv may differ from Dqk,
  //                 as in MLA: DeepSeek-V3 192 / 128). Strided views allowed (e.g. HF's
  //                 [B, Hkv, S, D] permuted; unit stride along the head dim); the tree tokens'
  //                 K/V are already written at cache_lens[b] .. cache_lens[b] + N - 1.
  //                 Hq % Hkv == 0 (GQA).
  //   cache_lens:   int32 or int64 [B], committed prefix length of each request.
  //   tree_mask:    bool [B, N, N], [b, i, j] = tree token i sees tree token j (ancestors and
  //                 itself; the diagonal must be set, a padding row sets only the diagonal).
  //   scale:        softmax scale (usually Dqk ** -0.5).
  //   window:       0, or a sliding window of W positions: token i, at position
  //                 cache_lens[b] + d_i (d_i = the tree tokens it sees minus one, its depth),
  //                 sees only positions > its position - W (prefix position s at s, tree token
  //                 j at cache_lens[b] + d_j), as transformers' sliding_window_overlay.
  //   softcap:      0, or c > 0: logits become c * tanh(scale * q.k / c) (Gemma 2).
  //   sinks:        None, or [Hq] per-head sink logits (GPT-OSS): each head's softmax
  //                 denominator also counts exp(sink), which has no value.
  //   tree_start:   None, or int32 / int64 [B]: the tree tokens' K/V sit at cache slots
  //                 tree_start[b] + j instead of cache_lens[b] + j (>= cache_lens[b]); requests
  //                 of different lengths can then share one append offset. Positions do not
  //                 change: tree token j is still at cache_lens[b] + its depth.
  //   returns [B, N, Hq, Dv] in q's dtype; softmax in fp32. Query i of request b sees prefix
  //   positions [0, cache_lens[b]) and tree positions cache_lens[b] + j where the mask is set.
  m.def(
      "tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_lens, "
      "Tensor tree_mask, float scale, int window=0, float softcap=0., Tensor? sinks=None, "
      "Tensor? tree_start=None) -> Tensor");

  // tree_attention over a paged KV cache.
  //   k_pages:      [P, page_size, Hkv, Dqk]; v_pages: [P, page_size, Hkv, Dv] (strided views
  //                 allowed).
  //   block_table:  int32 [B, max_blocks], logical page p of request b is physical page
  //                 block_table[b, p]; cache position s lives in page s // page_size at row
  //                 s % page_size. The other arguments are those of tree_attention.
  m.def(
      "tree_attention_paged(Tensor q, Tensor k_pages, Tensor v_pages, Tensor block_table, "
      "Tensor cache_lens, Tensor tree_mask, float scale, int window=0, float softcap=0., "
      "Tensor? sinks=None, Tensor? tree_start=None) -> Tensor");
}
