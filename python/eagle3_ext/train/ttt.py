"""EAGLE-3 training-time test (TTT): the draft unrolled over its own outputs.

For a batch of sequences (positions t = 0..T-1) the target gives aux features h_t and logits.
Step 0 feeds the draft (feature h_t, token x_{t+1}) at position t; step i feeds the draft's own
step i-1 output at row t with token x_{t+1+i} at position t + i (teacher forcing, shifted one
further per step). Row t of step i predicts the target's distribution at t + 1 + i. Attention
is the tree-like pattern the draft meets at inference: row t of step i sees step-0 keys of
rows 0..t (the real prefix) and its own keys of steps 1..i.

Loss: soft cross-entropy against the target distribution restricted to the draft vocabulary,
weighted 0.8^i, masked where the predicted token is not trained on (padding, prompt tokens of
chat data, beyond the sequence) or the target's top token is outside the draft vocabulary.
The rows a step does not score never reach its lm_head: the [rows, draft vocabulary] logits and
their loss are most of a step's cost on a CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ..draft import Eagle3DraftModel
from ..linear import float32_gemms, linear

STEP_DECAY = 0.8


@dataclass
class TTTStats:
    loss: torch.Tensor                                      # weighted sum over steps (with grad)
    step_loss: List[float] = field(default_factory=list)    # per step, masked mean
    correct: List[int] = field(default_factory=list)        # per step: draft argmax == target argmax
    counted: List[int] = field(default_factory=list)        # per step: positions scored
    token_ce: List[torch.Tensor] = field(default_factory=list)      # per step [B, T] (per_token only)
    token_hit: List[torch.Tensor] = field(default_factory=list)     # per step [B, T] bool
    token_scored: List[torch.Tensor] = field(default_factory=list)  # per step [B, T] bool


def shift(x: torch.Tensor, s: int, fill=0) -> torch.Tensor:
    """x[:, s:] padded at the end back to length T."""
    if s == 0:
        return x
    pad = torch.full_like(x[:, :s], fill)
    return torch.cat([x[:, s:], pad], dim=1)


class TTTAttention:
    """Per-layer keys/values of the unrolled steps and the attention pattern over them."""

    def __init__(self, num_layers: int, valid: torch.Tensor):
        self.kv: List[list] = [[] for _ in range(num_layers)]
        t = valid.shape[1]
        self.causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()

    def for_layer(self, layer: int):
        def attend(q, k, v, scale):
            self.kv[layer].append((k, v))
            rep = q.shape[2] // k.shape[2]
            qf = q.float()
            k0, v0 = (x.repeat_interleave(rep, dim=2).float() for x in self.kv[layer][0])
            scores = [torch.einsum("bqhd,bkhd->bhqk", qf, k0) * scale]
            scores[0] = scores[0].masked_fill(~self.causal, float("-inf"))
            later = [(kj.repeat_interleave(rep, dim=2).float(), vj.repeat_interleave(rep, dim=2).float())
                     for kj, vj in self.kv[layer][1:]]
            for kj, _ in later:  # each row sees only its own unrolled keys
                scores.append((qf * kj).sum(-1).transpose(1, 2)[..., None] * scale)
            probs = torch.cat(scores, dim=-1).softmax(-1)
            t = k0.shape[1]
            out = torch.einsum("bhqk,bkhd->bqhd", probs[..., :t], v0)
            for j, (_, vj) in enumerate(later):
                out = out + probs[..., t + j].transpose(1, 2)[..., None] * vj
            return out.to(q.dtype)
        return attend


def ttt_head_inputs(draft: Eagle3DraftModel, aux_hidden: Sequence[torch.Tensor], input_ids: torch.Tensor,
                    valid: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
    """What the draft's lm_head reads [B, T, hidden] at each unrolled step (see the module
    docstring): step i reads token x_{t+1+i} at position t + i and the previous step's output
    feature. The loss applies the lm_head to the rows it scores only."""
    b, t = input_ids.shape
    attention = TTTAttention(len(draft.layers), valid)
    hidden = draft.project_aux(aux_hidden)
    positions = torch.arange(t, device=input_ids.device).expand(b, t)
    for i in range(steps):
        hidden = draft.run_layers(shift(input_ids, 1 + i), hidden, positions + i, attention.for_layer)
        head_in, hidden = draft.head_input(hidden)
        yield head_in


def ttt_logits(draft: Eagle3DraftModel, aux_hidden: Sequence[torch.Tensor], input_ids: torch.Tensor,
               valid: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
    """The draft's logits [B, T, Vd] at each unrolled step, every row."""
    for head_in in ttt_head_inputs(draft, aux_hidden, input_ids, valid, steps):
        yield linear(draft.lm_head, head_in)


@dataclass
class TargetView:
    """What the loss reads of the target's logits: the top token over the whole vocabulary
    (``top`` [B, T] int64) and the logits of the draft vocabulary's tokens (``draft_logits``
    [B, T, Vd] fp32). An offline cache stores exactly this, so training from it sees the
    numbers online training sees."""

    top: torch.Tensor
    draft_logits: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor, d2t: torch.Tensor) -> "TargetView":
        """From the full logits [B, T, V] and the draft's d2t offsets."""
        draft_target_ids = torch.arange(d2t.numel(), device=logits.device) + d2t.to(logits.device)
        logits = logits.float()
        return cls(top=logits.argmax(-1), draft_logits=logits[..., draft_target_ids])


def soft_ce_and_top(logits: torch.Tensor, target_p: torch.Tensor):
    """Per row of [rows, V]: the soft cross-entropy -sum_v target_p_v log softmax(logits)_v
    (float32, differentiable in ``logits``) and the top index of ``logits``."""
    log_p = F.log_softmax(logits.float(), dim=-1)
    return -(target_p * log_p).sum(-1), log_p.argmax(-1)


@functools.cache
def compiled_soft_ce():
    """``soft_ce_and_top`` compiled once per process (any number of rows). Eager, its passes over
    the [rows, draft vocabulary] float32 tensors (the log-softmax, the product, the sum, the
    argmax and their backward) take longer on a CPU than the lm_head's products; Inductor fuses
    them into one pass forward and one backward (about 4x faster at 2345 x 16384, after a
    compile of about 8 s)."""
    return torch.compile(soft_ce_and_top, dynamic=True)


def ttt_forward(draft: Eagle3DraftModel, aux_hidden: Sequence[torch.Tensor],
                target: Union[torch.Tensor, TargetView], input_ids: torch.Tensor, loss_mask: torch.Tensor,
                valid: torch.Tensor, steps: int, per_token: bool = False,
                reduce_counts: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                compiled: bool = False) -> TTTStats:
    """Unrolls the draft ``steps`` times over a batch and returns the TTT loss and accuracies.

    Shapes: aux_hidden k x [B, T, H_target]; ``target`` the target's logits [B, T, V] or a
    TargetView of them; input_ids, loss_mask, valid [B, T] (valid = not padding). ``per_token``
    also keeps, per step, each position's cross-entropy and hit (draft top-1 == target top-1)
    with the mask of scored positions.
    ``reduce_counts`` turns this batch's per-step loss normalisers (positions scored, ``[steps]``)
    into the global ones under data parallelism (a sum over the ranks): each rank's loss is then
    its share of the whole batch's loss.
    ``compiled`` runs the per-step soft cross-entropy through torch.compile (``compiled_soft_ce``).
    """
    soft_ce = compiled_soft_ce() if compiled else soft_ce_and_top
    draft_target_ids = torch.arange(draft.config.draft_vocab_size, device=input_ids.device) + draft.d2t
    if not isinstance(target, TargetView):
        target = TargetView.from_logits(target, draft.d2t)
    target_top = target.top                                           # [B, T]
    in_draft_vocab = draft.t2d[target_top]
    target_p = target.draft_logits.float().softmax(-1)                # [B, T, Vd]
    trained = valid & loss_mask

    # What each step scores depends on the target alone, so the normalisers are known (and
    # reduced across ranks) before the draft runs.
    weights = [shift(trained, 2 + i, False) & shift(in_draft_vocab, 1 + i, False) for i in range(steps)]
    counts = torch.stack([w.sum() for w in weights]).float()
    if reduce_counts is not None:
        counts = reduce_counts(counts)
    norms = counts.clamp(min=1)
    stats = TTTStats(loss=torch.zeros((), dtype=torch.float32, device=input_ids.device))
    flat_p = target_p.flatten(0, 1)                                   # [B*T, Vd]
    flat_top = target_top.flatten()
    for i, head_in in enumerate(ttt_head_inputs(draft, aux_hidden, input_ids, valid, steps)):
        # Only the rows step i scores reach the lm_head and the loss: row (b, t) predicts the
        # target at (b, t + 1 + i), which shares b, so its flat index is the row's plus 1 + i.
        scored = shift(trained, 2 + i, False)
        rows = scored.flatten().nonzero().squeeze(1)
        logits = linear(draft.lm_head, head_in.flatten(0, 1).index_select(0, rows))
        ce, top = soft_ce(logits, flat_p.index_select(0, rows + 1 + i))
        step_loss = (ce * weights[i].flatten()[rows]).sum() / norms[i]
        stats.loss = stats.loss + STEP_DECAY ** i * step_loss
        stats.step_loss.append(float(step_loss.detach()))
        hit = draft_target_ids[top] == flat_top[rows + 1 + i]
        stats.correct.append(int(hit.sum()))
        stats.counted.append(rows.numel())
        if per_token:
            stats.token_ce.append(_rows_to_grid(ce.detach(), rows, scored))
            stats.token_hit.append(_rows_to_grid(hit, rows, scored))
            stats.token_scored.append(scored)
    return stats


def _rows_to_grid(values: torch.Tensor, rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-row ``values`` placed back on the [B, T] grid of ``like`` (zero / False elsewhere)."""
    grid = torch.zeros(like.numel(), dtype=values.dtype, device=values.device)
    return grid.index_copy(0, rows, values).view_as(like)


def target_pass(target, capture, input_ids: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype):
    """The target's logits [B, T, V] and the captured aux hidden states (in ``dtype``) for a
    right-padded batch, without gradients; ``capture`` is an attached AuxHiddenCapture. Its
    products take linear.py's many-row routes (SmolLM2-135M over 2 x 1024 tokens in float32 on a
    2-core AMD EPYC: 3.7-4.1 s through ATen, 2.3-2.4 s through oneDNN)."""
    weight = target.get_input_embeddings().weight
    with torch.no_grad(), float32_gemms(weight.device, weight.dtype, input_ids.numel()):
        logits = target(input_ids=input_ids, attention_mask=valid.long()).logits
        aux = [a.to(dtype) for a in capture.take()]
    return logits, aux


class StepAccuracy:
    """Sums TTT results over batches: per-step accuracy acc_i and the mean batch loss."""

    def __init__(self, steps: int):
        self.correct = [0] * steps
        self.counted = [0] * steps
        self.losses: List[float] = []

    def add(self, stats: TTTStats, loss: float) -> None:
        self.losses.append(loss)
        for i, (c, n) in enumerate(zip(stats.correct, stats.counted)):
            self.correct[i] += c
            self.counted[i] += n

    @property
    def acc(self) -> List[float]:
        return [c / n if n else 0.0 for c, n in zip(self.correct, self.counted)]

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / max(1, len(self.losses))


def expected_acceptance_length(acc: Sequence[float]) -> float:
    """1 + sum_i prod_{j<=i} acc_j: tokens per target forward of a chain draft whose step i is
    accepted with probability acc_i given the earlier ones were (bonus token included)."""
    total, survive = 1.0, 1.0
    for a in acc:
        survive *= a
        total += survive
    return total
