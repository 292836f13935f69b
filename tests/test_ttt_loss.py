"""The TTT loss against its plain definition.

``ttt_forward`` applies the draft's lm_head and the loss to the rows each step scores only. The
reference here is the definition written out over the whole grid: every row's logits, the
target distribution shifted 1 + i positions, the soft cross-entropy masked by the step's weights,
the hits counted where the step scores. Loss, gradients, counts and the doctor's per-token values
must agree.
"""

import pytest
import torch
import torch.nn.functional as F

from eagle3_ext.train.ttt import STEP_DECAY, TargetView, shift, ttt_forward, ttt_logits
from tiny_models import DRAFT_VOCAB, H, VOCAB, make_draft

STEPS = 4


def reference(draft, aux, target_logits, ids, loss_mask, valid, steps):
    """(loss, per-step correct, per-step counted, per-step ce [B, T], per-step hit [B, T])."""
    draft_ids = torch.arange(DRAFT_VOCAB) + draft.d2t
    top = target_logits.argmax(-1)
    target_p = target_logits[..., draft_ids].softmax(-1)
    trained = valid & loss_mask
    weights = [shift(trained, 2 + i, False) & shift(draft.t2d[top], 1 + i, False) for i in range(steps)]
    loss, correct, counted, ces, hits = torch.zeros(()), [], [], [], []
    for i, logits in enumerate(ttt_logits(draft, aux, ids, valid, steps)):
        log_p = F.log_softmax(logits.float(), -1)
        ce = -(shift(target_p, 1 + i) * log_p).sum(-1)
        loss = loss + STEP_DECAY ** i * (ce * weights[i]).sum() / weights[i].sum().clamp(min=1)
        scored = shift(trained, 2 + i, False)
        hit = (draft_ids[log_p.argmax(-1)] == shift(top, 1 + i)) & scored
        correct.append(int(hit.sum()))
        counted.append(int(scored.sum()))
        ces.append(torch.where(scored, ce, 0.0).detach())
        hits.append(hit)
    return loss, correct, counted, ces, hits


def batch(seed, b=3, t=13):
    gen = torch.Generator().manual_seed(seed)
    aux = [torch.randn(b, t, H, generator=gen) for _ in range(3)]
    ids = torch.randint(0, VOCAB, (b, t), generator=gen)
    lengths = torch.tensor([t, t - 4, t - 9])[:b]
    valid = torch.arange(t)[None] < lengths[:, None]                  # right padding
    loss_mask = (torch.rand(b, t, generator=gen) < 0.7) & valid       # a prompt part, some gaps
    target_logits = torch.randn(b, t, VOCAB, generator=gen) * 3
    return aux, ids, loss_mask, valid, target_logits


def agree_at_step_0(draft, aux, ids, valid, target_logits):
    """The target's top token set to the draft's step-0 guess at every other position, so that
    hits are counted too."""
    with torch.no_grad():
        guess = draft.draft_to_target(next(ttt_logits(draft, aux, ids, valid, 1)).argmax(-1))  # [B, T]
    planted = target_logits.clone()
    b, t = ids.shape
    for row in range(b):
        for pos in range(0, t - 1, 2):
            planted[row, pos + 1, guess[row, pos]] += 50.0
    return planted


def grads(draft):
    return {name: p.grad.clone() for name, p in draft.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("flags", [{}, {"norm_output": True}, {"final_norm": False}],
                         ids=["default", "norm_output", "no_final_norm"])
def test_loss_counts_and_gradients_match_the_definition(seed, flags):
    aux, ids, loss_mask, valid, target_logits = batch(seed)
    draft = make_draft(seed, **flags)
    target_logits = agree_at_step_0(draft, aux, ids, valid, target_logits)
    want_loss, want_correct, want_counted, want_ce, want_hit = reference(draft, aux, target_logits, ids, loss_mask,
                                                                         valid, STEPS)
    want_loss.backward()
    want_grads = grads(draft)
    draft.zero_grad()

    stats = ttt_forward(draft, aux, target_logits, ids, loss_mask, valid, STEPS, per_token=True)
    stats.loss.backward()
    torch.testing.assert_close(stats.loss, want_loss, rtol=1e-5, atol=1e-6)
    assert stats.correct == want_correct and stats.counted == want_counted
    assert want_correct[0] and all(want_counted), "the batch must score rows and hit some"
    for got, want in zip(stats.token_ce, want_ce):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert [h.tolist() for h in stats.token_hit] == [h.tolist() for h in want_hit]
    got_grads = grads(draft)
    assert got_grads.keys() == want_grads.keys() and "lm_head.weight" in got_grads
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_target_view_gives_what_the_logits_give():
    aux, ids, loss_mask, valid, target_logits = batch(5)
    draft = make_draft(5)
    from_logits = ttt_forward(draft, aux, target_logits, ids, loss_mask, valid, STEPS)
    from_view = ttt_forward(draft, aux, TargetView.from_logits(target_logits, draft.d2t), ids, loss_mask, valid,
                            STEPS)
    torch.testing.assert_close(from_view.loss, from_logits.loss)
    assert from_view.correct == from_logits.correct


def test_a_step_with_nothing_to_score_adds_nothing():
    aux, ids, _, valid, target_logits = batch(7, t=6)
    draft = make_draft(7)
    nothing = torch.zeros_like(valid)
    stats = ttt_forward(draft, aux, target_logits, ids, nothing, valid, STEPS)
    assert stats.counted == [0] * STEPS and stats.correct == [0] * STEPS
    assert float(stats.loss.detach()) == 0.0


# --- the compiled soft cross-entropy --------------------------------------------------------------

def test_the_compiled_loss_gives_the_eager_loss_and_gradients():
    aux, ids, loss_mask, valid, target_logits = batch(11)
    draft = make_draft(11)
    target_logits = agree_at_step_0(draft, aux, ids, valid, target_logits)
    results = []
    for compiled in (False, True):
        draft.zero_grad()
        stats = ttt_forward(draft, aux, target_logits, ids, loss_mask, valid, STEPS, compiled=compiled)
        stats.loss.backward()
        results.append((stats, grads(draft)))
    (eager, eager_grads), (comp, comp_grads) = results
    torch.testing.assert_close(comp.loss, eager.loss, rtol=1e-5, atol=1e-6)
    assert comp.correct == eager.correct and comp.counted == eager.counted and eager.correct[0]
    for name in eager_grads:
        torch.testing.assert_close(comp_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
