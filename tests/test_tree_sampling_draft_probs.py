"""Tests of tree_speculative_sampling_draft_probs (recursive rejection sampling with the draft's
probabilities, children drawn i.i.d. with replacement): a hand-worked tree, random trees and
drafts against the reference, equality with the target-only op for one-hot drafts, opcheck,
every error path, and statistical losslessness with negative controls."""

import pytest
import torch

from conftest import DEVICES, op_error
from eagle3_ext import reference
from eagle3_ext.decoding import tree
from eagle3_ext.ops import tree_speculative_sampling_draft_probs, tree_speculative_sampling_target_only
from sampling_stats import chi_square, chi_square_bound

OP_NAME = "tree_speculative_sampling_draft_probs"

# --- helpers --------------------------------------------------------------------------------


def tree_lists(parents):
    """retrive_next_token and retrive_next_sibling of one request from its parents (-1 for the
    root), children in ascending order, as build_tree_kernel_efficient orders them."""
    n = len(parents)
    next_token, next_sibling = [-1] * n, [-1] * n
    for parent in range(n):
        children = [j for j in range(1, n) if parents[j] == parent]
        if children:
            next_token[parent] = children[0]
        for a, c in zip(children, children[1:]):
            next_sibling[a] = c
    return next_token, next_sibling


def batch_lists(parents_per_request):
    """retrive_index, retrive_next_token, retrive_next_sibling ([bs, N] int64) of a batch."""
    bs, n = len(parents_per_request), len(parents_per_request[0])
    links = [tree_lists(p) for p in parents_per_request]
    return [torch.arange(bs * n).reshape(bs, n), torch.tensor([nt for nt, _ in links]),
            torch.tensor([ns for _, ns in links])]


def outputs(bs, n, steps, device):
    return (torch.full((bs * n,), -1, dtype=torch.int32, device=device),
            torch.full((bs, steps), -1, dtype=torch.int32, device=device),
            torch.zeros(bs, dtype=torch.int32, device=device))


def run(fn, cand, lists, coins, final, target, draft, steps, device, deterministic=True):
    """predicts, accept_index, accept_token_num (on the CPU) of one call of `fn` (the op or the
    reference) on `device`."""
    bs, n = cand.shape
    outs = outputs(bs, n, steps, device)
    fn(*outs, cand.to(device), *(t.to(device) for t in lists), coins.to(device), final.to(device),
       target.to(device), draft.to(device), deterministic)
    return [t.cpu() for t in outs]


def emitted_tokens(predicts, accept_index):
    """[bs, S]: the tokens each request emits (accepted drafts, then the final token), -1 after."""
    return torch.where(accept_index >= 0, predicts[accept_index.clamp_min(0).long()], -1)


# --- a hand-worked tree: N = 4, V = 4, S = 3 ------------------------------------------------
#
#   0 root -+- 1 (token 1) --- 3 (token 3)
#           +- 2 (token 2)
#
# Every number is dyadic, so each comparison below is exact in float32.
# Root: p = [.375, .125, .25, .25], q = [.125, .5, .25, .125].
#   node 1 (token 1): accepted iff u1 < p(1) / q(1) = .25.
#   rejected: c = 1, residual relu(p - q) = [.25, 0, 0, .125], Z = .375.
#   node 2 (token 2): residual 0 there: always rejected; c = 1.375,
#   residual relu(p - 1.375 q) = [.203125, 0, 0, .078125], Z = .28125: the final token is 0
#   when u_final * .28125 < .203125 (u_final < 13/18), else 3. (Normalized, [13/18, 5/18]
#   = normalize(relu(normalize(relu(p - q)) - q)).)
# Node 1: p = [.25, .25, .25, .25], q = [0, 0, .5, .5].
#   node 3 (token 3): accepted iff u3 < .5; rejected: residual [.25, .25, 0, 0], Z = .5.
# Node 2: p = [.5, 0, .25, .25]; node 3: p = [0, 0, 1, 0] (q not read: no children).
HAND_PARENTS = [-1, 0, 0, 1]
HAND_TOKENS = [0, 1, 2, 3]
HAND_TARGET = [[0.375, 0.125, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25], [0.5, 0.0, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0]]
HAND_DRAFT = [[0.125, 0.5, 0.25, 0.125], [0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]]


def hand_batch(bs):
    lists = batch_lists([HAND_PARENTS] * bs)
    return (torch.tensor([HAND_TOKENS] * bs), lists, torch.tensor([HAND_TARGET] * bs),
            torch.tensor([HAND_DRAFT] * bs))


@pytest.mark.parametrize("fn", [tree_speculative_sampling_draft_probs, reference.tree_speculative_sampling_draft_probs],
                         ids=["op", "reference"])
@pytest.mark.parametrize("device", DEVICES)
def test_hand_tree(fn, device):
    if fn is reference.tree_speculative_sampling_draft_probs and device != "cpu":
        pytest.skip("the reference runs on the CPU")
    # Column 0 of the coins (the root's) is never read: 0.999 there changes nothing.
    #   r0: u1 .75 rejects node 1, node 2 is rejected, u_final .5 < 13/18 -> token 0.
    #   r1: u1 .125 accepts node 1, u3 .25 accepts node 3: S - 1 = 2 accepted, the final token
    #       from node 3's full row -> token 2.
    #   r2: u1 .125 accepts node 1, u3 .75 rejects node 3: residual [.25, .25, 0, 0],
    #       u_final .75 -> token 1.
    #   r3: as r0 with u_final .9 > 13/18 -> token 3.
    #   r4: u1 = .25 exactly: not < .25, rejected; u_final 0 -> the first token with mass, 0.
    bs = 5
    cand, lists, target, draft = hand_batch(bs)
    coins = torch.tensor([[0.999, 0.75, 0.5, 0.5], [0.999, 0.125, 0.5, 0.25], [0.999, 0.125, 0.5, 0.75],
                          [0.999, 0.75, 0.0, 0.5], [0.999, 0.25, 0.5, 0.5]])
    final = torch.tensor([0.5, 0.5, 0.75, 0.9, 0.0])
    predicts, accept_index, accept_num = run(fn, cand, lists, coins, final, target, draft, 3, device)
    assert accept_num.tolist() == [0, 2, 1, 0, 0]
    assert accept_index.tolist() == [[0, -1, -1], [4, 5, 7], [8, 9, -1], [12, -1, -1], [16, -1, -1]]
    assert predicts.reshape(bs, 4).tolist() == [[0, -1, -1, -1], [1, 3, -1, 2], [1, 1, -1, -1], [3, -1, -1, -1],
                                                [0, -1, -1, -1]]


@pytest.mark.parametrize("device", DEVICES)
def test_draft_probs_not_written(device):
    cand, lists, target, draft = hand_batch(2)
    draft = draft.to(device)
    before = draft.clone()
    run(tree_speculative_sampling_draft_probs, cand, lists, torch.full((2, 4), 0.9), torch.full((2,), 0.5), target,
        draft, 3, device)
    assert torch.equal(draft, before)


# --- random trees and drafts against the reference -----------------------------------------


def random_parents(n, g, chain=False):
    return [-1] + [i - 1 if chain else int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


def random_draft(target, kind, g):
    """Draft rows for target rows [..., V]: 'mixed' (related to the target), 'zeros' (no mass on
    about half of the vocabulary, where the target has some), 'equal' (the target's rows) or
    'one-hot' (a random token)."""
    vocab = target.shape[-1]
    if kind == "equal":
        return target.clone()
    if kind == "one-hot":
        return torch.nn.functional.one_hot(torch.randint(0, vocab, target.shape[:-1], generator=g), vocab).float()
    other = torch.softmax(torch.randn(target.shape, generator=g) * 3, -1)
    mixed = 0.5 * target + 0.5 * other
    if kind == "zeros":
        mixed = mixed * (torch.rand(target.shape, generator=g) < 0.5)
        mixed[..., 0] += 1e-3  # no row without mass
    return mixed / mixed.sum(-1, keepdim=True)


def random_case(bs, n, vocab, seed, kind="mixed", chain=False):
    """A batch of random trees whose children were drawn i.i.d. from their parent's draft row
    (so siblings may repeat), with random target rows and coins."""
    g = torch.Generator().manual_seed(seed)
    parents = [random_parents(n, g, chain) for _ in range(bs)]
    target = torch.softmax(torch.randn(bs, n, vocab, generator=g) * 3, -1)
    draft = random_draft(target, kind, g)
    cand = torch.zeros(bs, n, dtype=torch.long)
    cand[:, 0] = torch.randint(0, vocab, (bs,), generator=g)
    for b in range(bs):
        for j in range(1, n):
            cand[b, j] = torch.multinomial(draft[b, parents[b][j]], 1, generator=g)
    return cand, batch_lists(parents), torch.rand(bs, n, generator=g), torch.rand(bs, generator=g), target, draft


KINDS = ["mixed", "zeros", "equal", "one-hot"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "bs, n, vocab, depth, chain",
    [(16, 8, 64, 4, False), (8, 6, 33, 5, True), (8, 24, 1000, 5, False), (4, 1, 17, 3, False),
     (4, 8, 32001, 4, False), (2, 8, 128256, 4, False)],
    ids=["tree", "chain", "wide", "N1", "vocab32001", "vocab128256"],
)
def test_random_trees_match_reference(device, kind, bs, n, vocab, depth, chain):
    case = random_case(bs, n, vocab, seed=bs + n + vocab + KINDS.index(kind), kind=kind, chain=chain)
    got = run(tree_speculative_sampling_draft_probs, *case, depth + 1, device)
    want = run(reference.tree_speculative_sampling_draft_probs, *case, depth + 1, "cpu")
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_random_trees_exercise_every_path():
    # The random cases above reach what they should: rejections followed by acceptances of a
    # later sibling, descents, and requests that stop at the depth limit.
    cand, lists, coins, final, target, draft = random_case(64, 12, 20, seed=0)
    predicts, accept_index, accept_num = run(tree_speculative_sampling_draft_probs, cand, lists, coins, final, target,
                                             draft, 4, "cpu")
    first_child = lists[1][:, 0]
    accepted_first = accept_index[:, 1].long() - torch.arange(64) * 12
    assert ((accept_num > 0) & (accepted_first != first_child)).any(), "no later sibling accepted"
    assert (accept_num == 3).any() and (accept_num == 0).any() and (accept_num == 1).any()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CPU kernel is always deterministic: the flag "
                                                         "only changes the CUDA reduction order")
@pytest.mark.parametrize("vocab", [1000, 32001], ids=["vec4", "scalar"])
def test_deterministic_flag(vocab):
    case = random_case(16, 8, vocab, seed=vocab)
    runs = [run(tree_speculative_sampling_draft_probs, *case, 5, "cuda", deterministic=d) for d in (True, True, False)]
    want = run(reference.tree_speculative_sampling_draft_probs, *case, 5, "cpu")
    for outs in runs:
        for g, w in zip(outs, want):
            assert torch.equal(g, w)


# --- one-hot drafts: the target-only op's behaviour -----------------------------------------
#
# A one-hot draft proposes its token for sure, the case the target-only op is written for: a
# child is accepted with probability p(x) and a rejection removes x from the residual. Every
# child drawn from a one-hot row is that row's token, and after its rejection the copies are
# rejected too (no mass left on x), so a tree of k copies per node walks as the chain of
# single children does under the target-only op, with the coin of a node's first child there
# read as the coin of the node itself.


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copies", [1, 3], ids=["chain", "3-copies"])
def test_one_hot_draft_equals_target_only(device, copies):
    bs, depth, vocab = 256, 4, 12
    g = torch.Generator().manual_seed(copies)
    chain_tokens = torch.randint(0, vocab, (bs, depth + 1), generator=g)
    # target rows that give the chain's tokens substantial mass, so that all depths occur
    target_chain = torch.softmax(torch.randn(bs, depth + 1, vocab, generator=g), -1)
    boost = torch.nn.functional.one_hot(chain_tokens[:, 1:], vocab).float() * 2.5
    target_chain[:, :depth] = torch.softmax(target_chain[:, :depth].log() + boost, -1)
    coins_chain = torch.rand(bs, depth + 1, generator=g)
    final = torch.rand(bs, generator=g)
    want = run(tree_speculative_sampling_target_only_exact, chain_tokens, batch_lists([[-1, *range(depth)]] * bs),
               coins_chain, final, target_chain, torch.zeros_like(target_chain), depth + 1, device)

    # The tree: level d holds `copies` children of the first node of level d - 1.
    n = 1 + depth * copies
    parents, level_of = [-1], [0]
    for d in range(1, depth + 1):
        first_above = 0 if d == 1 else 1 + (d - 2) * copies
        parents += [first_above] * copies
        level_of += [d] * copies
    level_of = torch.tensor(level_of)
    cand = chain_tokens[:, level_of]
    target = target_chain[:, level_of]
    draft = torch.zeros(bs, n, vocab)
    for node in range(n):  # each node's draft: one-hot on its children's token
        if level_of[node] < depth:
            draft[torch.arange(bs), node, chain_tokens[:, level_of[node] + 1]] = 1.0
    coins = torch.rand(bs, n, generator=g)
    for d in range(1, depth + 1):  # the first copy at level d gets the chain coin of level d - 1
        coins[:, 1 + (d - 1) * copies] = coins_chain[:, d - 1]
    predicts, accept_index, accept_num = run(tree_speculative_sampling_draft_probs, cand, batch_lists([parents] * bs),
                                             coins, final, target, draft, depth + 1, device)
    assert torch.equal(accept_num, want[2])
    assert torch.equal(emitted_tokens(predicts, accept_index), emitted_tokens(want[0], want[1]))
    assert len(set(accept_num.tolist())) == depth + 1  # every acceptance length occurs


def tree_speculative_sampling_target_only_exact(*args):
    """The target-only op with its lossless thresholds (1.0, 1.0), in run()'s signature."""
    *tensors, deterministic = args
    tree_speculative_sampling_target_only(*tensors, 1.0, 1.0, deterministic)


# --- losslessness ---------------------------------------------------------------------------
#
# A Markov target over 5 tokens (row t: the next-token distribution after t) and Markov drafts
# unlike it. Each round builds a 2-level tree from the last emitted token: 3 root children
# drawn i.i.d. from the draft's row, 2 children of each drawn from theirs, the target's and the
# draft's rows at every node given by its token, and verifies it; rounds repeat until every
# trial has emitted 2 tokens. The first token and the first two tokens must follow the target
# exactly: Pearson's chi-square over all outcomes (cells under 20 expected pooled) stays below
# the 1e-4 critical value (tests/sampling_stats.py). The same test must reject deliberately
# lossy verifiers (the negative controls).

STAT_TRIALS = 20_000
STAT_VOCAB = 5
STAT_START = 0
STAT_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]
STAT_STEPS = 3
MARKOV_TARGET = torch.tensor([
    [0.40, 0.25, 0.15, 0.12, 0.08],
    [0.10, 0.45, 0.05, 0.30, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.20],
    [0.05, 0.10, 0.60, 0.05, 0.20],
    [0.30, 0.05, 0.05, 0.30, 0.30],
])
MARKOV_DRAFTS = {
    # unlike the target, with zeros where the target has mass (row 1 and 3: on its mode)
    "different": torch.tensor([
        [0.05, 0.15, 0.50, 0.30, 0.00],
        [0.50, 0.00, 0.25, 0.05, 0.20],
        [0.70, 0.10, 0.10, 0.05, 0.05],
        [0.20, 0.40, 0.00, 0.20, 0.20],
        [0.00, 0.50, 0.30, 0.00, 0.20],
    ]),
    "equal": MARKOV_TARGET.clone(),
    # deterministic proposals, on the target's mode for some rows and off it for others
    "one-hot": torch.nn.functional.one_hot(torch.tensor([2, 3, 0, 2, 4]), STAT_VOCAB).float(),
}


def markov_round(context, draft, g):
    """The op's inputs for one round from each trial's last token: tree, coins, target and
    draft rows."""
    trials, n = context.shape[0], len(STAT_PARENTS)
    cand = torch.empty(trials, n, dtype=torch.long)
    cand[:, 0] = context
    for node in range(1, n):
        cand[:, node] = torch.multinomial(draft[cand[:, STAT_PARENTS[node]]], 1, replacement=True,
                                          generator=g).squeeze(1)
    lists = [torch.arange(trials * n).reshape(trials, n),
             *(torch.tensor(links).expand(trials, n).contiguous() for links in tree_lists(STAT_PARENTS))]
    return (cand, lists, torch.rand(trials, n, generator=g), torch.rand(trials, generator=g),
            MARKOV_TARGET[cand].contiguous(), draft[cand].contiguous())


def markov_counts(verify, draft, length, seed):
    """Counts of each trial's first `length` tokens, rounds of `verify` (the op's signature)."""
    g = torch.Generator().manual_seed(seed)
    seqs = [[] for _ in range(STAT_TRIALS)]
    context = torch.full((STAT_TRIALS,), STAT_START, dtype=torch.long)
    for _ in range(length):  # every round emits at least one token
        case = markov_round(context, draft, g)
        predicts, accept_index, accept_num = run(verify, *case, STAT_STEPS, "cpu")
        emitted = emitted_tokens(predicts, accept_index)
        for seq, row in zip(seqs, emitted.tolist()):
            seq.extend(t for t in row if t >= 0)
        context = emitted[torch.arange(STAT_TRIALS), accept_num.long()]
    counts = {}
    for seq in seqs:
        counts[tuple(seq[:length])] = counts.get(tuple(seq[:length]), 0) + 1
    return counts


def markov_exact(length):
    probs = {(): 1.0}
    for _ in range(length):
        probs = {s + (v,): pr * float(MARKOV_TARGET[s[-1] if s else STAT_START, v])
                 for s, pr in probs.items() for v in range(STAT_VOCAB)}
    return probs


def lossless_stat(verify, draft, length, seed=1):
    """(chi-square statistic, 1e-4 critical value) of `verify`'s first `length` tokens."""
    counts = markov_counts(verify, draft, length, seed)
    exact = markov_exact(length)
    assert set(counts) <= set(exact)
    stat, dof = chi_square(counts, exact, STAT_TRIALS)
    return stat, chi_square_bound(dof)


@pytest.mark.parametrize("draft", list(MARKOV_DRAFTS), ids=list(MARKOV_DRAFTS))
@pytest.mark.parametrize("length", [1, 2], ids=["first-token", "first-two-tokens"])
def test_lossless(draft, length):
    stat, critical = lossless_stat(tree_speculative_sampling_draft_probs, MARKOV_DRAFTS[draft], length)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: the emitted tokens do not follow the target"


def verify_without_residual_update(predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                                   next_sibling, coins, final_coins, target_probs, draft_probs, deterministic):
    """Negative control, deliberately lossy: every sibling is accepted with min(1, p(x) / q(x))
    against the node's original target p (the residual is not updated after a rejection), and
    after rejections the final token comes from normalize(relu(p - q)), once."""
    cand, nt, ns = candidates.tolist(), next_token.tolist(), next_sibling.tolist()
    u, uf = coins.tolist(), final_coins.tolist()
    target, draft = target_probs.tolist(), draft_probs.tolist()
    n, steps = candidates.shape[1], accept_index.shape[1]
    for b in range(len(cand)):
        path, final_row = [0], None
        while final_row is None:
            node = path[-1]
            p, q = target[b][node], draft[b][node]
            if len(path) == steps or nt[b][node] == -1:
                final_row = p
                break
            child = nt[b][node]
            while child != -1 and not u[b][child] * q[cand[b][child]] < p[cand[b][child]]:
                child = ns[b][child]
            if child == -1:
                final_row = [max(pi - qi, 0.0) for pi, qi in zip(p, q)]
            else:
                path.append(child)
        total, running, token = sum(final_row), 0.0, len(final_row) - 1
        for x, v in enumerate(final_row):
            running += v
            if v > 0 and running > uf[b] * total:
                token = x
                break
        for i, node in enumerate(path):
            accept_index[b, i] = b * n + node
            predicts[b * n + node] = cand[b][path[i + 1]] if i + 1 < len(path) else token
        accept_num[b] = len(path) - 1


def verify_with_draft_claimed_equal_to_target(*args):
    """Negative control: the op told that the children came from the target's distribution
    (draft_probs = target_probs) while they came from the draft: every first child is kept."""
    *tensors, target_probs, _, deterministic = args
    tree_speculative_sampling_draft_probs(*tensors, target_probs, target_probs, deterministic)


def target_only_on_sampled_children(*args):
    """Negative control: the target-only op (lossless for distinct siblings) on children drawn
    with replacement: a repeated sibling adds its target probability to the running sum again."""
    *tensors, target_probs, _, deterministic = args
    tree_speculative_sampling_target_only(*tensors, target_probs, torch.zeros_like(target_probs), 1.0, 1.0,
                                          deterministic)


@pytest.mark.parametrize(
    "verify", [verify_without_residual_update, verify_with_draft_claimed_equal_to_target,
               target_only_on_sampled_children],
    ids=["no-residual-update", "draft-claimed-equal-to-target", "target-only-on-sampled-children"],
)
def test_lossy_controls_are_rejected(verify):
    # The bound has teeth: the same test, the same draft, a verifier that is lossy on purpose.
    stat, critical = lossless_stat(verify, MARKOV_DRAFTS["different"], length=2)
    assert stat > critical, f"negative control not rejected: chi-square {stat:.1f} <= {critical:.1f}"


# --- the tree-level helper ------------------------------------------------------------------


def test_verify_sampling_draft_probs():
    cand, lists, _, _, target, draft = random_case(3, 8, 50, seed=5)
    t = tree.DraftTree(cand, torch.ones(3 * 8 * 8, dtype=torch.bool), torch.zeros(3 * 8, dtype=torch.long), *lists,
                       topk=2, depth=4, tree_mask_mode=1)
    result = tree.verify_sampling_draft_probs(t, target, draft, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)  # the helper's coins: [bs, N], then [bs]
    coins, final = torch.rand(3, 8, generator=g), torch.rand(3, generator=g)
    predicts, accept_index, accept_num = run(reference.tree_speculative_sampling_draft_probs, cand, lists, coins,
                                             final, target, draft, 5, "cpu")
    assert torch.equal(result.accept_index, accept_index)
    assert torch.equal(result.accept_length, accept_num)
    assert torch.equal(result.predicts, predicts)
    emitted = emitted_tokens(predicts, accept_index).tolist()
    assert result.accepted_tokens == [[token for token in row if token >= 0] for row in emitted]


# --- opcheck --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    cand, lists, coins, final, target, draft = random_case(4, 8, 40, seed=0)
    args = (*outputs(4, 8, 5, device), cand.to(device), *(t.to(device) for t in lists), coins.to(device),
            final.to(device), target.to(device), draft.to(device), True)
    torch.library.opcheck(torch.ops.eagle3.tree_speculative_sampling_draft_probs.default, args)


# --- errors ---------------------------------------------------------------------------------


def op_args(**changes):
    cand, lists, target, draft = hand_batch(2)
    predicts, accept_index, accept_num = outputs(2, 4, 3, "cpu")
    args = dict(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=cand,
                retrive_index=lists[0], retrive_next_token=lists[1], retrive_next_sibling=lists[2],
                uniform_samples=torch.full((2, 4), 0.5), uniform_samples_for_final_sampling=torch.full((2,), 0.5),
                target_probs=target, draft_probs=draft, deterministic=True)
    args.update(changes)
    return args


def with_value(t, pos, value):
    t = t.clone()
    t[pos] = value
    return t


NEXT_TOKEN, NEXT_SIBLING = batch_lists([HAND_PARENTS] * 2)[1:]


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(target_probs=torch.tensor([HAND_TARGET] * 2).double()), r"target_probs must be float32"),
        (dict(draft_probs=torch.tensor([HAND_DRAFT] * 2).half()), r"draft_probs must be float32"),
        (dict(uniform_samples=torch.full((2, 4), 0.5).half()), r"uniform_samples must be float32"),
        (dict(uniform_samples_for_final_sampling=torch.full((2,), 0.5).double()),
         r"uniform_samples_for_final_sampling must be float32"),
        (dict(draft_probs=torch.zeros(2, 4, 5)), r"draft_probs must have shape \[2, 4, 4\] \(\[bs, N, V\] like target"),
        (dict(draft_probs=torch.zeros(2, 3, 4)), r"draft_probs must have shape \[2, 4, 4\]"),
        (dict(target_probs=torch.zeros(2, 3, 4)), r"target_probs must have shape \[2, 4, 4\] \(\[bs, N, V\]\)"),
        (dict(target_probs=torch.zeros(2, 4)), r"target_probs must have 3 dimensions, got shape \[2, 4\]"),
        (dict(target_probs=torch.zeros(2, 4, 0), draft_probs=torch.zeros(2, 4, 0)),
         r"target_probs has an empty vocabulary"),
        (dict(uniform_samples=torch.full((2, 3), 0.5)), r"uniform_samples must have shape \[2, 4\]"),
        (dict(uniform_samples_for_final_sampling=torch.zeros(3)),
         r"uniform_samples_for_final_sampling must have shape \[2\]"),
        (dict(draft_probs=torch.zeros(2, 4, 8)[:, :, ::2]), r"draft_probs must be contiguous"),
        (dict(predicts=torch.full((8,), -1)), r"predicts must be int32 \(torch.int32\), got Long"),
        (dict(predicts=torch.full((7,), -1, dtype=torch.int32)), r"predicts must have shape \[8\] \(\[bs \* N\]\)"),
        (dict(accept_index=torch.full((2, 0), -1, dtype=torch.int32)), r"accept_index must have shape \[2, max_depth"),
        (dict(accept_token_num=torch.zeros(2, dtype=torch.long)), r"accept_token_num must be int32"),
        (dict(retrive_index=torch.arange(8, dtype=torch.int32).reshape(2, 4)), r"retrive_index must be int64"),
        (dict(candidates=torch.tensor([[0, 1, 2, 3], [0, 1, 7, 3]]), uniform_samples=torch.full((2, 4), 0.99)),
         r"request 1, node 2: candidates = 7 is not a token id in \[0, vocab_size\)"),
        (dict(candidates=torch.tensor([[0, -1, 2, 3], [0, 1, 2, 3]])),
         r"request 0, node 1: candidates = -1 is not a token id"),
        (dict(retrive_next_token=with_value(NEXT_TOKEN, (1, 0), 4)),
         r"invalid tree: request 1, node 0: retrive_next_token = 4 is not in \[-1, N\)"),
        (dict(retrive_index=with_value(torch.arange(8).reshape(2, 4), (0, 1), 8)),
         r"invalid tree: request 0, node 1: retrive_index = 8 is not in \[0, bs \* N\)"),
        (dict(retrive_next_sibling=with_value(NEXT_SIBLING, (0, 2), 1), uniform_samples=torch.full((2, 4), 0.99)),
         r"invalid tree: request 0, node 0: the sibling list of its children does not end"),
    ],
    ids=["target-fp64", "draft-fp16", "coins-fp16", "final-coins-fp64", "draft-vocab", "draft-nodes", "target-shape",
         "target-2d", "empty-vocab", "coins-shape", "final-coins-shape", "draft-strided", "predicts-int64",
         "predicts-size", "accept-index-empty", "accept-num-int64", "index-int32", "candidate-range",
         "candidate-negative", "next-token-range", "retrive-index-range", "sibling-cycle"],
)
def test_bad_inputs(changes, pattern):
    with pytest.raises(op_error(pattern), match=r"eagle3\." + OP_NAME + ": " + pattern):
        tree_speculative_sampling_draft_probs(**op_args(**changes))


def test_python_types():
    with pytest.raises(TypeError, match=r"eagle3\.tree_speculative_sampling_draft_probs: deterministic must be a "
                                        r"bool, got int"):
        tree_speculative_sampling_draft_probs(**op_args(deterministic=1))
    with pytest.raises(TypeError, match=r"draft_probs must be a torch.Tensor, got list"):
        tree_speculative_sampling_draft_probs(**op_args(draft_probs=HAND_DRAFT))


def _cuda(args):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_mismatch_and_tree_errors():
    args = _cuda(op_args())
    args["draft_probs"] = args["draft_probs"].cpu()
    with pytest.raises(ValueError, match=r"draft_probs is on cpu but candidates is on cuda:0"):
        tree_speculative_sampling_draft_probs(**args)
    bad = dict(candidates=torch.tensor([[0, 1, 2, 3], [0, 1, 7, 3]]), uniform_samples=torch.full((2, 4), 0.99))
    # Without validation nothing is read back and the kernel stays in bounds.
    tree_speculative_sampling_draft_probs(**_cuda(op_args(**bad)))
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"request 1, node 2: candidates = 7 is not a token id"):
        tree_speculative_sampling_draft_probs(**_cuda(op_args(**bad)), validate=True)
