"""Where a speculative output leaves plain decoding, and whether rounding explains it.

In bf16 / fp16 the verify forward (many tokens at once) and plain decoding (one token at a
time) round differently, so at a near-tie of the target's top two logits they may pick
different tokens; both are the target's greedy choice within its own precision. Any other
divergence is a bug. ``first_divergence`` finds the first differing token, recomputes the
target's logits there in fp32 from the shared prefix, and calls it a near-tie when the fp32
margin between the two chosen tokens is within ``NEAR_TIE_ULPS`` units of the run's dtype's
rounding at that logit size. In fp32 nothing is a near-tie: outputs must be identical.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional, Sequence

import torch

# Unit roundoff per dtype (half the spacing of numbers in [1, 2)).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 0.0}
# A logit is a long sum through every layer; 16 unit roundoffs of its size is the budget the
# two paths' rounding may differ by (measured differences on the bundled pair stay below it).
NEAR_TIE_ULPS = 16


def fp32_reference(target):
    """The target itself in fp32, or an fp32 copy of its (rounded) weights."""
    return target if target.get_input_embeddings().weight.dtype == torch.float32 else copy.deepcopy(target).float()


def first_divergence(target, prompt: Sequence[int], ours: Sequence[int], theirs: Sequence[int],
                     reference=None) -> Optional[Dict[str, Any]]:
    """None if ``ours`` and ``theirs`` agree (one may stop earlier); else {"position": index of the
    first differing new token, "tokens": [ours, theirs] there, "margin": their fp32 logit margin,
    "bound": the near-tie bound for the target's dtype, "near_tie": margin <= bound}.
    ``reference``: ``fp32_reference(target)``, made here when not given (pass it to check
    several outputs with one copy)."""
    position = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if position is None:
        return None
    a, b = int(ours[position]), int(theirs[position])
    dtype = target.get_input_embeddings().weight.dtype
    device = target.get_input_embeddings().weight.device
    fp32 = fp32_reference(target) if reference is None else reference
    ids = torch.tensor([list(prompt) + list(ours[:position])], device=device)
    with torch.no_grad():
        logits = fp32(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    margin = abs(float(logits[a] - logits[b]))
    size = max(abs(float(logits[a])), abs(float(logits[b])), 1.0)
    bound = NEAR_TIE_ULPS * UNIT_ROUNDOFF.get(dtype, 0.0) * size
    # An exact fp32 tie is no excuse: both argmaxes resolve it to the same (lowest) index.
    return {"position": position, "tokens": [a, b], "margin": margin, "bound": bound,
            "near_tie": bound > 0 and margin <= bound}
