"""Pure-PyTorch definitions of what every eagle3 op computes.

These are the ground truth that the tests compare the C++ and CUDA kernels against and the
baselines that the benchmarks time. They favour clarity over speed.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def fused_aux_fc(
    aux_hidden: Sequence[torch.Tensor], weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """cat(aux_hidden, -1) @ weight.T (+ bias), computed in fp32, returned in the input dtype."""
    x = torch.cat(list(aux_hidden), dim=-1)
    out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(aux_hidden[0].dtype)


def cat_linear(
    aux_hidden: Sequence[torch.Tensor], weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """The unfused baseline an engine would otherwise run: torch.cat + F.linear in the input dtype."""
    return F.linear(torch.cat(list(aux_hidden), dim=-1), weight, bias)


# --- Tree building and verification ---------------------------------------------------------
# Same signatures and in-place outputs as the ops (torch.ops.eagle3.build_tree_kernel_efficient,
# verify_tree_greedy, tree_speculative_sampling_target_only and _draft_probs): plain loops over
# requests and nodes, on CPU tensors. Invalid trees raise ValueError.


def _tree_parents(parent_row: list, selected_row: list, topk: int, n: int) -> list:
    """parents[i] for every node (-1 for the root): node i >= 1 is candidate selected_row[i - 1],
    its parent is the root when candidate // topk == 0, else the node holding the candidate
    parent_row[candidate // topk]."""
    parents = [-1]
    for i in range(1, n):
        slot = selected_row[i - 1] // topk
        if slot == 0:
            parents.append(0)
            continue
        parent_candidate = parent_row[slot]
        if parent_candidate not in selected_row:
            raise ValueError(f"node {i}: parent candidate {parent_candidate} is not selected")
        parents.append(selected_row.index(parent_candidate) + 1)
    return parents


def _path_to_root(parents: list, node: int) -> list:
    """The draft nodes from `node` up to (not including) the root."""
    path = []
    while node != 0:
        path.append(node)
        node = parents[node]
    return path


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Fills tree_mask, positions and the retrive_* lists in place (see the op's schema)."""
    n = draft_token_num
    seq_lens = verified_seq_len.tolist()
    mask_bytes = tree_mask.view(torch.uint8) if tree_mask_mode == 2 else None
    row_bytes = 1 if n <= 8 else (2 if n <= 16 else 4)
    block_start = 0  # start of the request's mask block (modes 0 and 1)
    for b, seq_len in enumerate(seq_lens):
        parents = _tree_parents(
            parent_list[b].tolist() if parent_list.numel() else [], selected_index[b].tolist(), topk, n
        )
        retrive_next_token[b] = -1
        retrive_next_sibling[b] = -1
        for i in range(n):
            path = _path_to_root(parents, i)
            positions[b * n + i] = seq_len + len(path)
            retrive_index[b, i] = b * n + i
            if tree_mask_mode == 2:
                bits = 1 + sum(1 << j for j in path)
                for k in range(row_bytes):
                    mask_bytes[(b * n + i) * row_bytes + k] = (bits >> (8 * k)) & 0xFF
            else:
                prefix = seq_len if tree_mask_mode == 0 else 0
                row = block_start + i * (prefix + n) + prefix
                tree_mask[row : row + n] = False
                tree_mask[row] = True
                for j in path:
                    tree_mask[row + j] = True
        # Children in ascending order: the first child is the smallest, siblings follow.
        for parent in range(n):
            children = [j for j in range(1, n) if parents[j] == parent]
            if children:
                retrive_next_token[b, parent] = children[0]
                for a, c in zip(children, children[1:]):
                    retrive_next_sibling[b, a] = c
        block_start += ((seq_len if tree_mask_mode == 0 else 0) + n) * n


def _walk_tree(b, candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
               accept_index, accept_token_num, try_child) -> int:
    """The walk both verify ops share: from the root, at most S - 1 levels; at each level the
    children of the last accepted node are tried in sibling order and the first one that
    try_child(last_global, node) accepts is taken. Returns the last accepted global index."""
    last = int(retrive_index[b, 0])
    accept_index[b, 0] = last
    accepted, node = 0, 0
    for _ in range(1, accept_index.shape[1]):
        child = int(retrive_next_token[b, node])
        while child != -1 and not try_child(last, child):
            child = int(retrive_next_sibling[b, child])
        if child == -1:
            break
        predicts[last] = candidates[b, child]
        accepted += 1
        last = int(retrive_index[b, child])
        accept_index[b, accepted] = last
        node = child
    accept_token_num[b] = accepted
    return last


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree walk; fills predicts, accept_index and accept_token_num in place."""
    target = target_predict.flatten()
    for b in range(candidates.shape[0]):
        last = _walk_tree(
            b, candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
            accept_index, accept_token_num,
            lambda last, node: int(candidates[b, node]) == int(target[last]),
        )
        predicts[last] = target[last]


def sample_residual(target_row: torch.Tensor, draft_row: Optional[torch.Tensor], coin: float) -> int:
    """The final token of tree sampling: the first token whose running sum of
    relu(target - draft) (in vocabulary order, in float64) exceeds coin * total, among tokens
    with positive residual; the last such token if rounding leaves the sum short; V - 1 if
    there is none."""
    residual = target_row if draft_row is None else target_row - draft_row
    residual = residual.clamp_min(0)
    cdf = torch.cumsum(residual.double(), 0)
    u = float(coin) * float(cdf[-1])
    hits = ((cdf > u) & (residual > 0)).nonzero()
    if len(hits):
        return int(hits[0])
    valid = (residual > 0).nonzero()
    return int(valid[-1]) if len(valid) else residual.numel() - 1


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
    deterministic: bool = True,
) -> None:
    """Recursive rejection sampling over each node's children (float32 arithmetic, as the
    kernels), then the final token from the residual; fills the outputs in place."""
    num_steps = accept_index.shape[1]
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    t_single = f32(threshold_single)
    t_acc = torch.maximum(f32(threshold_acc), f32(1e-9))
    for b in range(candidates.shape[0]):
        state = dict(row=0, coin=uniform_samples[b, 0], prob_acc=f32(0.0))

        def try_child(last, node):
            token, row = int(candidates[b, node]), state["row"]
            q = target_probs[b, row, token]
            state["prob_acc"] = state["prob_acc"] + q
            if state["coin"] <= state["prob_acc"] / t_acc or q >= t_single:
                state.update(row=node, coin=uniform_samples[b, node], prob_acc=f32(0.0))
                return True
            draft_probs[b, row, token] = q  # its mass leaves the residual
            return False

        last = _walk_tree(
            b, candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
            accept_index, accept_token_num, try_child,
        )
        row = state["row"]
        draft_row = None if int(accept_token_num[b]) == num_steps - 1 else draft_probs[b, row]
        predicts[last] = sample_residual(
            target_probs[b, row], draft_row, float(uniform_samples_for_final_sampling[b])
        )


def tree_speculative_sampling_draft_probs(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    deterministic: bool = True,
) -> None:
    """Recursive rejection sampling with the draft's probabilities, children drawn i.i.d. from
    their parent's draft row (see the op); fills the outputs in place.

    At a node with target p and draft q, after k rejected children the target's residual is
    p_k = normalize(relu(p_{k-1} - q)) = relu(p - c_k q) / Z_k, with c_0 = 0, Z_0 = 1 and
    c_{k+1} = c_k + Z_k, Z_k = sum(relu(p - c_k q)). Child x is accepted when its coin
    u < p_k(x) / q(x), computed as u * Z_k * q(x) < relu(p - c_k q)(x). Elements are float32
    (``c * q`` then the subtraction, as the kernels), sums in float64 rounded to float32.
    """
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    vocab = target_probs.shape[2]
    for b in range(candidates.shape[0]):
        state = dict(row=0, c=f32(0.0), z=f32(1.0))

        def residual(row, c):
            return (target_probs[b, row] - c * draft_probs[b, row]).clamp_min(0)

        def try_child(last, node):
            token, row, c, z = int(candidates[b, node]), state["row"], state["c"], state["z"]
            if not 0 <= token < vocab:
                raise ValueError(f"request {b}, node {node}: candidates = {token} is not a token id")
            q = draft_probs[b, row, token]
            r = (target_probs[b, row, token] - c * q).clamp_min(0)
            if uniform_samples[b, node] * z * q < r:
                state.update(row=node, c=f32(0.0), z=f32(1.0))
                return True
            c = c + z
            state.update(c=c, z=residual(row, c).double().sum().float())
            return False

        last = _walk_tree(
            b, candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
            accept_index, accept_token_num, try_child,
        )
        final = residual(state["row"], state["c"])
        if not bool((final > 0).any()):  # rounded to zero everywhere: the target row itself
            final = target_probs[b, state["row"]]
        predicts[last] = sample_residual(final, None, float(uniform_samples_for_final_sampling[b]))


# --- Batched pure-PyTorch verification (the baseline an engine would otherwise run) ---------
# The same results as the loops above, computed for all requests at once with tensor ops: a
# Python loop over tree levels and siblings only. Works on any device.


def _walk_tree_batched(candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                       predicts, accept_index, accept_token_num, try_children, on_accept):
    """Level by level for the whole batch. try_children(searching, child, last) returns which
    of the searching requests accept their current child; on_accept(ok, child) is told which
    requests accepted which child. Returns the last accepted global index per request."""
    bs, n = candidates.shape
    rows = torch.arange(bs, device=candidates.device)
    last = retrive_index[:, 0].clone()
    accept_index[:, 0] = last.to(accept_index.dtype)
    node = torch.zeros_like(last)
    active = torch.ones(bs, dtype=torch.bool, device=candidates.device)
    accepted = torch.zeros_like(last)
    for step in range(1, accept_index.shape[1]):
        child = torch.where(active, retrive_next_token[rows, node], -1)
        found = torch.full_like(child, -1)
        for _ in range(n):
            searching = (child >= 0) & (found < 0)
            if not bool(searching.any()):
                break
            c = child.clamp_min(0)
            ok = searching & try_children(searching, c, last)
            found = torch.where(ok, c, found)
            child = torch.where(searching & ~ok, retrive_next_sibling[rows, c], child)
        active = found >= 0
        if not bool(active.any()):
            break
        f = found.clamp_min(0)
        on_accept(active, f)
        g = retrive_index[rows, f]
        predicts[last[active]] = candidates[rows, f][active].to(predicts.dtype)
        accept_index[active, step] = g[active].to(accept_index.dtype)
        accepted += active.long()
        last = torch.where(active, g, last)
        node = torch.where(active, f, node)
    accept_token_num.copy_(accepted)
    return last


def verify_tree_greedy_batched(predicts, accept_index, accept_token_num, candidates, retrive_index,
                               retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """verify_tree_greedy with tensor ops over the whole batch."""
    rows = torch.arange(candidates.shape[0], device=candidates.device)
    target = target_predict.flatten()
    last = _walk_tree_batched(
        candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index,
        accept_token_num, lambda searching, child, last: candidates[rows, child] == target[last],
        lambda ok, child: None,
    )
    predicts[last] = target[last].to(predicts.dtype)


def tree_speculative_sampling_batched(predicts, accept_index, accept_token_num, candidates,
                                      retrive_index, retrive_next_token, retrive_next_sibling,
                                      uniform_samples, uniform_samples_for_final_sampling,
                                      target_probs, draft_probs, threshold_single: float,
                                      threshold_acc: float, deterministic: bool = True) -> None:
    """tree_speculative_sampling_target_only with tensor ops over the whole batch."""
    bs, _ = candidates.shape
    rows = torch.arange(bs, device=candidates.device)
    t_acc = max(torch.tensor(threshold_acc, dtype=torch.float32).item(), 1e-9)
    t_acc = torch.tensor(t_acc, dtype=torch.float32, device=candidates.device)
    t_single = torch.tensor(threshold_single, dtype=torch.float32, device=candidates.device)
    state = dict(row=torch.zeros(bs, dtype=torch.long, device=candidates.device),
                 coin=uniform_samples[:, 0].clone(),
                 prob_acc=torch.zeros(bs, dtype=torch.float32, device=candidates.device))

    def try_children(searching, child, last):
        token, row = candidates[rows, child], state["row"]
        q = target_probs[rows, row, token]
        state["prob_acc"] = torch.where(searching, state["prob_acc"] + q, state["prob_acc"])
        ok = (state["coin"] <= state["prob_acc"] / t_acc) | (q >= t_single)
        rejected = searching & ~ok
        draft_probs[rows[rejected], row[rejected], token[rejected]] = q[rejected]
        return ok

    def on_accept(ok, child):
        state["row"] = torch.where(ok, child, state["row"])
        state["coin"] = torch.where(ok, uniform_samples[rows, child], state["coin"])
        state["prob_acc"] = torch.where(ok, 0.0, state["prob_acc"])

    last = _walk_tree_batched(candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                              predicts, accept_index, accept_token_num, try_children, on_accept)
    row = state["row"]
    full = (accept_token_num == accept_index.shape[1] - 1).unsqueeze(1)
    q, p = target_probs[rows, row], draft_probs[rows, row]
    residual = torch.where(full, q, q - p).clamp_min(0)
    cdf = torch.cumsum(residual.double(), 1)
    u = uniform_samples_for_final_sampling.double() * cdf[:, -1]
    positive = residual > 0
    hit = (cdf > u.unsqueeze(1)) & positive
    vocab = residual.shape[1]
    last_valid = torch.where(positive.any(1), vocab - 1 - positive.flip(1).int().argmax(1), vocab - 1)
    sampled = torch.where(hit.any(1), hit.int().argmax(1), last_valid)
    predicts[last] = sampled.to(predicts.dtype)


def tree_positions(cache_lens: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """Position of each tree token: ``cache_lens[b] + depth``, the depth being the number of
    tree tokens it sees (ancestors and itself) minus one. int64 ``[B, N]``."""
    depth = tree_mask.sum(-1).long() - 1
    return cache_lens.to(device=tree_mask.device, dtype=torch.long).view(-1, 1) + depth


def dense_tree_mask(cache_lens: torch.Tensor, tree_mask: torch.Tensor, kv_len: int,
                    window: int = 0) -> torch.Tensor:
    """The dense mask equivalent to (cache_lens, tree_mask[, window]): bool ``[B, 1, N, kv_len]``.

    Entry ``[b, 0, i, s]`` is True when tree token i of request b may attend cache position s:
    a prefix position ``s < cache_lens[b]``, or the tree position ``s = cache_lens[b] + j`` of a
    tree token j with ``tree_mask[b, i, j]``; with a window W also only when the key's position
    (s for the prefix, ``tree_positions`` for tree tokens) is above the query's position - W.
    This is the 4D mask SDPA (and Hugging Face's sdpa attention) takes for a tree verify forward.
    """
    B, N, _ = tree_mask.shape
    pos = torch.arange(kv_len, device=tree_mask.device).view(1, 1, kv_len)
    lens = cache_lens.to(device=tree_mask.device, dtype=torch.long).view(B, 1, 1)
    j = pos - lens  # tree index of each position, [B, 1, kv_len]
    in_tree = (j >= 0) & (j < N)
    seen = torch.gather(tree_mask, 2, j.clamp(0, max(N - 1, 0)).expand(B, N, kv_len))
    mask = (pos < lens) | (seen & in_tree)
    if window > 0:
        tree_pos = tree_positions(cache_lens, tree_mask)                       # [B, N]
        key_pos = torch.where(in_tree, torch.gather(tree_pos[:, None, :], 2, j.clamp(0, max(N - 1, 0))), pos)
        mask = mask & (key_pos > tree_pos[:, :, None] - window)
    return mask.unsqueeze(1)


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_start: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """eagle3.tree_attention in fp32 with the dense tree mask, in q's dtype: SDPA, or with a
    soft-cap or sinks the explicit softmax (a sink is one more logit per head, with no value).

    q ``[B, N, Hq, Dqk]``; k_cache ``[B, S_max, Hkv, Dqk]``; v_cache ``[B, S_max, Hkv, Dv]``;
    cache_lens ``[B]``; tree_mask bool ``[B, N, N]``; sinks ``[Hq]``; tree_start ``[B]`` (the
    tree tokens are first moved from there to right after the prefix). Returns
    ``[B, N, Hq, Dv]``.
    """
    if tree_start is not None:
        k_cache, v_cache = (move_tree(c, cache_lens, tree_start, tree_mask.size(1)) for c in (k_cache, v_cache))
    Hq, Hkv = q.size(2), k_cache.size(2)
    qf = q.float().transpose(1, 2)  # [B, Hq, N, D]
    k = k_cache.float().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)  # [B, Hq, S, D]
    v = v_cache.float().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    mask = dense_tree_mask(cache_lens, tree_mask, k_cache.size(1), window)
    if softcap == 0 and sinks is None:
        out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).to(q.dtype)
    scores = qf @ k.transpose(-1, -2) * scale                                   # [B, Hq, N, S]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(1, Hq, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return (probs @ v).transpose(1, 2).to(q.dtype)


def move_tree(cache: torch.Tensor, cache_lens: torch.Tensor, tree_start: torch.Tensor, n: int) -> torch.Tensor:
    """A copy of ``cache`` [B, S, Hkv, D] with each request's n tree rows moved from slots
    ``tree_start[b] + j`` to ``cache_lens[b] + j``."""
    out = cache.clone()
    for b in range(cache.size(0)):
        src, dst = int(tree_start[b]), int(cache_lens[b])
        out[b, dst:dst + n] = cache[b, src:src + n]
    return out


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A paged cache ``[P, page_size, Hkv, D]`` as a contiguous ``[B, max_blocks * page_size, Hkv, D]``."""
    table = block_table.long().clamp(0, pages.size(0) - 1)  # unused entries may hold anything
    return pages[table].flatten(1, 2)


def tree_attention_paged(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_start: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """eagle3.tree_attention_paged: the pages gathered into a contiguous cache, then tree_attention."""
    return tree_attention(q, gather_pages(k_pages, block_table), gather_pages(v_pages, block_table), cache_lens,
                          tree_mask, scale, window, softcap, sinks, tree_start)


def sdpa_dense_mask(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """The unfused baseline: SDPA in the input dtype with a dense mask, Hugging Face layout.

    q ``[B, Hq, N, D]``; k, v ``[B, Hkv, S, D]`` (GQA through ``enable_gqa``); mask bool
    ``[B, 1, N, S]`` (from dense_tree_mask). Returns ``[B, Hq, N, D]``.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
