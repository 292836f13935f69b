"""SpeculativeGenerator: EAGLE-3 speculative decoding around any Hugging Face causal LM, with
the ``generate`` contract of Hugging Face's own.

The call resolves its options (``settings``), prepares the prompts (``inputs``), checks the
capture once (the guard) and runs a ``Batch``: prefill, then draft-verify-accept-compact
rounds until every request stopped. Greedy output is token-identical to the target's own
greedy decoding; sampling emits tokens with exactly the target's (processed, filtered)
distribution.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import List, Optional, Union

import torch

from .. import hf_attention
from ..compiled.draft import draft_capacity
from ..compiled.graphs import CompiledRound
from ..compiled.options import CompileOptions, compile_options
from ..compiled.verify import node_buckets
from ..decoding.batch import Batch
from ..decoding.capture import AuxHiddenCapture
from ..decoding.drafting import draft_cache_capacity
from ..distributed import tp
from ..draft import Eagle3DraftModel, fingerprint
from ..draft.aux_layers import describe_fix
from ..errors import BadInputError
from ..preflight.architecture import check_served
from ..preflight.loading import load_pair_for_generation
from ..preflight.memory import check_fits
from .config import TreeConfig
from .inputs import prepare
from .settings import GenerateSettings, resolve
from .stats import GenerationStats

logger = logging.getLogger(__name__)


class CaptureMismatchError(BadInputError):
    """The captured target states do not match the draft's activation fingerprint."""


@dataclass
class SpeculativeGenerateOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns.

    sequences: LongTensor [B, prompt + new], as Hugging Face's generate returns it (the prompt
        part as given or left-padded, new tokens padded with pad_token_id after a request ends).
    new_tokens[b]: request b's new tokens; finish_reasons[b]: "eos", "stop" or "length";
    text[b]: the new tokens decoded (when a tokenizer is known); stats: over the whole call.
    """

    sequences: torch.Tensor
    new_tokens: List[List[int]]
    finish_reasons: List[str]
    stats: GenerationStats
    text: Optional[List[str]] = None


class SpeculativeGenerator:
    """Wraps ``target`` (a transformers AutoModelForCausalLM) with an EAGLE-3 ``draft``.

    Args:
        target: the model to accelerate; its outputs are what ``generate`` returns.
        draft: an Eagle3DraftModel trained for this target (validated here, before any token).
        tree: the draft tree per round; ``TreeConfig.chain(d)`` drafts a chain of d tokens.
        tokenizer: for string prompts, chat messages, stop strings and text output.
        attention: "tree" runs the verify forward through eagle3.tree_attention (the
            "eagle3_tree" attention implementation); "sdpa" keeps the model's own attention and
            passes a 4D mask.
        check_ranks: under tensor parallelism, verify after each call that every rank produced the
            same tokens (an all-gather; default False).
        compile: run the verify forward and the draft's side of a round as ``torch.compile``
            graphs over static caches (compiled/verify.py, compiled/draft.py):
            faster rounds after a one-off compilation per batch size and cache capacity (reported
            in the stats as ``compile_time_s``). True compiles with ``CompileOptions()``; a
            ``CompileOptions`` chooses how (autotuning, C++ wrapper, CUDA graphs, AOTInductor
            packages and their folder); False or None (the default False) compiles nothing. Tree
            attention only, one process (not under tensor parallelism).
        strict: the capture guard. When the draft carries an activation fingerprint, the first
            ``generate`` runs the fingerprint's probe through the target and compares the
            captured states with it before any draft step; a mismatch (a capture of other layers
            than the draft was trained on, or another target) raises ``CaptureMismatchError``.
            ``strict=False`` turns that into a warning.

    Nothing about the target is changed outside ``generate``: each call switches it to eval
    mode and to the tree attention and restores both afterwards, even when it raises.
    """

    def __init__(self, target, draft: Eagle3DraftModel, tree: TreeConfig = TreeConfig(), tokenizer=None,
                 attention: str = "tree", check_ranks: bool = False, strict: bool = True,
                 compile: Union[bool, None, CompileOptions] = False):
        if not (hasattr(target, "config") and callable(getattr(target, "get_input_embeddings", None))):
            raise TypeError(f"target must be a transformers causal LM (from AutoModelForCausalLM), got "
                            f"{type(target).__name__}; SpeculativeGenerator.from_pretrained also takes a directory")
        if not isinstance(draft, Eagle3DraftModel):
            raise TypeError(f"draft must be an Eagle3DraftModel, got {type(draft).__name__}; "
                            "SpeculativeGenerator.from_pretrained also takes a directory")
        if tokenizer is not None and not (callable(tokenizer) and callable(getattr(tokenizer, "decode", None))):
            raise TypeError(f"tokenizer must be a transformers tokenizer or None, got {type(tokenizer).__name__}")
        if attention not in ("tree", "sdpa"):
            raise ValueError(f"attention must be 'tree' or 'sdpa', got {attention!r}")
        if not isinstance(tree, TreeConfig):
            raise TypeError(f"tree must be a TreeConfig, got {type(tree).__name__}")
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}")
        if not isinstance(check_ranks, bool):
            raise TypeError(f"check_ranks must be True or False, got {check_ranks!r}")
        options = compile_options(compile)
        if options is not None and attention != "tree":
            raise ValueError(f"compile={compile!r} needs attention='tree' (the compiled graph runs "
                             "eagle3.tree_attention)")
        if options is not None and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise ValueError(f"compile={compile!r} is not supported under tensor parallelism yet; run without it")
        check_served(target.config)
        self.target = target
        self.draft = draft.eval()
        self.tree = tree
        self.tokenizer = tokenizer
        draft.validate_against_target(target.config)
        target_device = target.get_input_embeddings().weight.device
        if draft.fc.weight.device != target_device:
            raise ValueError(f"the draft is on {draft.fc.weight.device} but the target on {target_device}")
        draft.bind_embeddings(target.get_input_embeddings())
        self.capture = AuxHiddenCapture(target, draft.aux_layer_ids)
        self.use_tree_attention = attention == "tree"
        self.max_positions = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        self.check_ranks = check_ranks
        self.strict = strict
        self.capture_check: Optional[fingerprint.CaptureCheck] = None  # the guard's result, once it ran
        self.compiled = (CompiledRound(target, options, node_buckets(tree.num_draft_tokens, tree.lookup_tokens))
                         if options is not None else None)
        self._warned_draft_context = False

    @classmethod
    def from_pretrained(cls, target, draft, *, tokenizer=None, dtype: Union[None, str, torch.dtype] = None,
                        draft_dtype: Union[None, str, torch.dtype] = None, device: Union[None, str, torch.device] = None,
                        tree: Optional[TreeConfig] = None, attention: str = "tree", strict: bool = True,
                        check_ranks: bool = False,
                        compile: Union[bool, None, CompileOptions] = False) -> "SpeculativeGenerator":
        """A generator from a target and a draft, each a directory or an already loaded model.

        ``dtype`` / ``draft_dtype``: the target's and the draft's dtype (a torch.dtype or its
        name; default: the target as transformers loads it, the draft as saved); ``device``: where
        both run; ``tokenizer``: default, the target directory's; ``tree``: default TreeConfig();
        ``attention``, ``strict``, ``check_ranks``, ``compile``: as for the constructor.
        """
        compile_options(compile)  # a bad value fails before the models load
        target_model, draft_model, tok = load_pair_for_generation(target, draft, tokenizer, dtype, draft_dtype, device)
        return cls(target_model, draft_model, tree or TreeConfig(), tokenizer=tok, attention=attention,
                   check_ranks=check_ranks, strict=strict, compile=compile)

    # --- generation ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask: Optional[torch.Tensor] = None, *, generation_config=None,
                 **kwargs):
        """Speculative decoding with Hugging Face's ``generate`` contract (decoder-only models).

        Args:
            input_ids: LongTensor [B, L] (or [L]) with ``attention_mask`` for left or right
                padding; also a string, a list of strings, chat messages (a conversation or a list
                of them, rendered with the tokenizer's chat template) or token-id lists.
            attention_mask: [B, L] (1 = token); without it, padding is inferred like Hugging
                Face does (pad_token_id set, not the EOS token, present in the input).
            generation_config: a transformers GenerationConfig (default: the target's).
            kwargs: generation config fields (``max_new_tokens``, ``min_new_tokens``,
                ``do_sample``, ``temperature``, ``top_p``, ``top_k``, ``eos_token_id``,
                ``pad_token_id``, ``stop_strings``, ``return_dict_in_generate``, ...) and
                ``tokenizer=``, ``streamer=`` (any batch size: a 1-D tensor per put at batch 1,
                else a [B, n] tensor), ``logits_processor=`` (applied to the target's
                distribution at every tree node, so greedy and sampling stay exact) and
                ``seed=`` (a private generator; the global RNG is untouched).

        Returns:
            LongTensor [B, prompt + new], equal to the target's own greedy ``generate`` output;
            with ``return_dict_in_generate=True`` a SpeculativeGenerateOutput.
        """
        settings, prompts = self._resolve(input_ids, attention_mask, generation_config, kwargs)
        device = self.target.get_input_embeddings().weight.device
        rng = torch.Generator(device=device)
        rng.manual_seed(tp.shared_seed(settings.seed))  # one seed on every tensor-parallel rank
        streamer = settings.streamer
        if streamer is not None:
            streamer.put(prompts.echo.cpu())
        started = time.perf_counter()
        compiled_before = self._compile_s()
        with self._session(), (self.compiled.pool.lease() if self.compiled is not None else nullcontext()):
            guard_s = self._guard_capture()
            batch = Batch(self, prompts.ids, settings, rng, prompts.echo)
            batch.prefill()
            while not batch.done:
                batch.round()
        if streamer is not None:
            streamer.end()
        new = [r.new for r in batch.requests]
        if self.check_ranks:
            tp.check_ranks_agree(new)
        stats = batch.stats
        stats.guard_time_s = guard_s
        stats.compile_time_s = self._compile_s() - compiled_before  # within the draft and verify times
        stats.total_time_s = time.perf_counter() - started
        stats.new_tokens = sum(len(t) for t in new)
        sequences = self._sequences(prompts.echo, new, settings.pad_token_id)
        if not settings.return_dict_in_generate:
            return sequences
        tok = settings.tokenizer
        text = None if tok is None else [tok.decode(t, skip_special_tokens=True) for t in new]
        return SpeculativeGenerateOutput(sequences, new, [r.reason for r in batch.requests], stats, text)

    def check_inputs(self, input_ids=None, attention_mask: Optional[torch.Tensor] = None, *, generation_config=None,
                     **kwargs) -> None:
        """Raises the ValueError / TypeError that ``generate`` would raise for these arguments
        (options, prompts, context length, memory), without running either model."""
        self._resolve(input_ids, attention_mask, generation_config, kwargs)

    def _resolve(self, input_ids, attention_mask, generation_config, kwargs):
        settings = resolve(getattr(self.target, "generation_config", None), generation_config, dict(kwargs),
                           self.tokenizer)
        prompts = prepare(input_ids, attention_mask, settings.tokenizer, settings.pad_token_id,
                          settings.eos_token_ids)
        self._check_prompts(prompts.ids, settings)
        return settings, prompts

    @staticmethod
    def _sequences(echo: torch.Tensor, new: List[List[int]], pad: int) -> torch.Tensor:
        longest = max(len(t) for t in new)
        tail = torch.full((len(new), longest), pad, dtype=torch.long)
        for b, t in enumerate(new):
            tail[b, :len(t)] = torch.tensor(t, dtype=torch.long)
        return torch.cat([echo.cpu(), tail], dim=1).to(echo.device)

    def _check_prompts(self, ids: List[List[int]], settings: GenerateSettings) -> None:
        vocab = self.target.config.vocab_size
        for b, p in enumerate(ids):
            if not p:
                raise BadInputError(f"prompt {b} is empty; give at least one token")
            if max(p) >= vocab or min(p) < 0:
                raise BadInputError(f"prompt {b} has token ids outside the target vocabulary [0, {vocab})")
            if len(p) >= self.max_positions:
                raise BadInputError(f"prompt {b} has {len(p)} tokens, longer than the target's context "
                                    f"({self.max_positions} positions)")
            new = settings.new_tokens_for(len(p))
            if new < 1:
                raise BadInputError(f"prompt {b} has {len(p)} tokens, which leaves no room under max_length="
                                    f"{settings.max_length}; pass max_new_tokens")
            if len(p) + new > self.max_positions:
                raise BadInputError(f"prompt {b} has {len(p)} tokens and max_new_tokens is {new}: {len(p) + new} "
                                    f"positions, beyond the target's context ({self.max_positions}, its "
                                    f"max_position_embeddings); lower max_new_tokens to {self.max_positions - len(p)}")
        longest = max(len(p) + settings.new_tokens_for(len(p)) for p in ids)
        draft_context = self.draft.config.max_position_embeddings
        if longest > draft_context and not self._warned_draft_context:
            # The draft's rotary embedding extrapolates: the output stays the target's (lossless),
            # only acceptance may fall past the positions the draft was trained on.
            logger.warning("this call reaches position %d, beyond the draft's max_position_embeddings (%d): the "
                           "output is unchanged, but acceptance may fall there", longest, draft_context)
            self._warned_draft_context = True
        check_fits(self, len(ids), max(len(p) for p in ids), max(settings.new_tokens_for(len(p)) for p in ids))

    def draft_cache_slots(self, longest_prompt: int, most_new: int) -> int:
        """The capacity a call's draft cache is allocated with (compiled: rounded up so that
        calls of similar length share the draft's graphs)."""
        sized = draft_capacity if self.compiled is not None else draft_cache_capacity
        return sized(self.tree, longest_prompt, most_new)

    def _compile_s(self) -> float:
        """Seconds spent compiling so far (compile=True: the verify and the draft graphs)."""
        return self.compiled.compile_s if self.compiled is not None else 0.0

    @contextmanager
    def _session(self):
        """Eval mode and the chosen attention for the call; the caller's settings restored after."""
        target, draft = self.target, self.draft
        training = (target.training, draft.training)
        attention = getattr(target.config, "_attn_implementation", None)
        target.eval()
        draft.eval()
        if self.use_tree_attention:
            if attention != hf_attention.ATTENTION_NAME:
                target.set_attn_implementation(hf_attention.register())
        try:
            yield
        finally:
            if getattr(target.config, "_attn_implementation", None) != attention and attention is not None:
                target.set_attn_implementation(attention)
            target.train(training[0])
            draft.train(training[1])

    @property
    def attention_path(self) -> str:
        """Which attention verifies: "tree" (eagle3.tree_attention) or "sdpa" (the model's own)."""
        return "tree" if self.use_tree_attention else "sdpa"

    def check_capture(self) -> "fingerprint.CaptureCheck":
        """Runs the capture guard now rather than at the first ``generate`` (see ``strict``): a
        draft told other layers than it was trained on fails here. None for a draft without an
        activation fingerprint."""
        self._guard_capture()
        return self.capture_check

    def _guard_capture(self) -> float:
        """The capture guard (see ``strict``); returns the seconds it took (0 after the first call)."""
        fp = self.draft.config.fingerprint
        if fp is None or self.capture_check is not None:
            return 0.0
        self.capture_check = fingerprint.check(fp, self.target, self.draft.aux_layer_ids)
        if not self.capture_check.ok:
            message = f"capture check failed: {self.capture_check.describe()}"
            if self.capture_check.problem is None and None not in self.capture_check.looks_like:
                message += f". To read the trained layers, {describe_fix(self.capture_check.trained_ids)}"
            message += "; or pass strict=False (eagle3 generate --no-strict-capture) to run anyway"
            if self.strict:
                raise CaptureMismatchError(message)
            logger.warning(message)
        return self.capture_check.time_s

    def check_capture_width(self, aux_hidden: List[torch.Tensor]) -> None:
        """Raises unless every captured state (one per aux layer, from the prefill) is as wide as
        the hidden size the draft reads."""
        hidden = self.draft.config.target_hidden_size
        for index, state in zip(self.draft.aux_layer_ids, aux_hidden):
            if state.shape[-1] != hidden:
                raise ValueError(
                    f"the captured hidden state of layer index {index} has width {state.shape[-1]} but the target's "
                    f"hidden size is {hidden}: a sharded capture (a tensor-parallel layer output taken before its "
                    "all-reduce) cannot feed the draft")
