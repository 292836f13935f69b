"""The EAGLE-3 draft head: fc over the captured target features, one (or more) Llama-style
decoder layers whose first attention reads [RMSNorm(token embedding), RMSNorm(feature)],
a final norm and an lm_head over the draft vocabulary."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import BadInputError
from ..linear import linear, linears
from .aux_layers import AuxLayerResolution, check_aux_layers, eagle_default_aux_layers, target_dims
from .cache import Allocate, DraftKVCache
from .checkpoint import load_draft, save_draft
from .config import Eagle3DraftConfig
from .rope import apply_rope, rope_cos_sin, rope_inv_freq

logger = logging.getLogger(__name__)

# attend(q [B, n, Hq, D], k [B, n, Hkv, D], v [B, n, Hkv, D], scale) -> [B, n, Hq, D]: how a
# layer's new queries see keys and values. Inference appends to the KV cache and runs tree
# attention; training builds the training-time-test pattern over its unrolled steps.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def joint_rms_norm(parts: Sequence[torch.Tensor], norm: RMSNorm) -> List[torch.Tensor]:
    """``norm`` over the concatenation of ``parts`` (each [..., H]) along the last dim, returned
    as the normalized parts, so the concatenation is never materialized."""
    total = sum(p.shape[-1] for p in parts)
    sq = sum(p.float().pow(2).sum(-1, keepdim=True) for p in parts)
    inv = torch.rsqrt(sq / total + norm.eps)
    out, start = [], 0
    for p in parts:
        w = norm.weight[start:start + p.shape[-1]]
        out.append(w * (p.float() * inv).to(p.dtype))
        start += p.shape[-1]
    return out


def tree_attention_with_cache(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                              prefix_lens: torch.Tensor, tree_mask: torch.Tensor,
                              scale: float) -> torch.Tensor:
    """Attention of q [B, n, Hq, D] over each request's committed prefix and its tree tokens,
    through eagle3.tree_attention.

    keys/values [B, S, Hkv, D] hold the committed prefix of request b at [0, prefix_lens[b])
    and the t tree tokens right after it; tree_mask [B, n, t] (t >= n, the queries being the
    last n tree tokens) says which tree tokens each query sees. Earlier tree tokens enter the
    op as padding rows (diagonal only) whose outputs are dropped.
    """
    b, n, heads, dim = q.shape
    total = tree_mask.shape[-1]
    if n < total:
        old = total - n
        q = torch.cat([q.new_zeros(b, old, heads, dim), q], dim=1)
        padding_rows = torch.eye(old, total, dtype=torch.bool, device=q.device).expand(b, old, total)
        tree_mask = torch.cat([padding_rows, tree_mask], dim=1)
    out = ops.tree_attention(q, keys, values, prefix_lens, tree_mask.contiguous(), scale)
    return out[:, total - n:]


class DraftAttention(nn.Module):
    def __init__(self, config: Eagle3DraftConfig, in_features: int):
        super().__init__()
        hd, bias = config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(in_features, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(in_features, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(in_features, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, config.hidden_size, bias=bias)

    def forward(self, parts: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        """``parts``: [B, n, H] tensors whose concatenation is the layer's input."""
        b, n, _ = parts[0].shape
        q, k, v = linears((self.q_proj, self.k_proj, self.v_proj), *parts)
        q = apply_rope(q.view(b, n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(b, n, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(b, n, self.num_kv_heads, self.head_dim)
        out = attend(q, k, v, self.head_dim ** -0.5)
        return linear(self.o_proj, out.reshape(b, n, -1).to(parts[0].dtype))


class DraftMLP(nn.Module):
    def __init__(self, config: Eagle3DraftConfig):
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linears((self.gate_proj, self.up_proj), x)
        return linear(self.down_proj, F.silu(gate) * up)


class Eagle3DecoderLayer(nn.Module):
    """The first layer reads [RMSNorm(embedding), RMSNorm(feature)] (2 x hidden wide); any
    further layer is a plain Llama decoder layer."""

    def __init__(self, config: Eagle3DraftConfig, reads_embeddings: bool):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.reads_embeddings = reads_embeddings
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = DraftAttention(config, 2 * h if reads_embeddings else h)
        self.mlp = DraftMLP(config)
        self.input_layernorm = RMSNorm(h, eps)
        if reads_embeddings:
            self.hidden_norm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)

    def forward(self, hidden: torch.Tensor, embeds: Optional[torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        if self.reads_embeddings:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            parts = [self.input_layernorm(embeds), normed]
        else:
            residual, parts = hidden, [self.input_layernorm(hidden)]
        hidden = residual + self.self_attn(parts, cos, sin, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@dataclass
class Eagle3DraftOutput:
    logits: torch.Tensor  # [B, n, draft_vocab_size]
    hidden: torch.Tensor  # [B, n, hidden]: the feature the next draft step reads (pre-norm unless norm_output)


class Eagle3DraftModel(nn.Module):
    """EAGLE-3 draft head. Token embeddings are the target's (``bind_embeddings``), unless the
    checkpoint carries its own ``embed_tokens`` that differs from the target's."""

    def __init__(self, config: Eagle3DraftConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(config.fc_in_features, h, bias=config.fc_bias)
        self.layers = nn.ModuleList(
            [Eagle3DecoderLayer(config, reads_embeddings=(i == 0)) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        k, target_h, eps = config.num_aux_layers, config.target_hidden_size, config.rms_norm_eps
        # Optional normalization of the captured states before the fc (see Eagle3DraftConfig).
        self.fc_norm = nn.ModuleList([RMSNorm(target_h, eps) for _ in range(k)]) if config.fc_norm else None
        self.input_norm = RMSNorm(k * target_h, eps) if config.norm_before_fc else None
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if config.own_embeddings else None
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        # Kept out of the buffers so that .to(bfloat16) cannot round the rope frequencies.
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self._embed: Optional[nn.Embedding] = None
        # Hybrid drafting's n-gram table of the training data (lookup_corpus.py), where one ships.
        self.lookup_corpus = None

    # --- aux layers ------------------------------------------------------------------------
    @property
    def aux_layer_ids(self) -> Optional[list]:
        """Target layers the draft reads, as output_hidden_states indices (0 = embeddings)."""
        return None if self.config.aux_layer_ids is None else list(self.config.aux_layer_ids)

    @property
    def aux_layer_ids_source(self) -> str:
        return self.config.aux_layer_ids_source

    def set_aux_layers(self, resolution: AuxLayerResolution) -> None:
        if resolution.ids is not None:
            bound = self.config.target_num_hidden_layers or max(0, *resolution.ids)
            check_aux_layers(resolution.ids, bound, self.fc.in_features, self.config.target_hidden_size)
        self.config.aux_layer_ids = None if resolution.ids is None else list(resolution.ids)
        self.config.aux_layer_ids_source = resolution.rule
        logger.info("Eagle3 draft: %s", resolution.describe())

    def validate_against_target(self, target_config: Any) -> None:
        """Checks that this draft can run on a target with ``target_config`` (a transformers
        config or a dict); resolves EAGLE's default aux layers if the checkpoint had none.

        Raises ValueError naming the numbers and the likely cause on any disagreement.
        """
        layers, hidden, vocab = target_dims(target_config)
        cfg = self.config
        if cfg.aux_layer_ids is None:
            ids = eagle_default_aux_layers(layers)
            self.set_aux_layers(AuxLayerResolution(ids, f"EAGLE default [2, L//2, L-3] for L={layers}: "
                                                        "the checkpoint stores no ids"))
        elif cfg.target_num_hidden_layers not in (None, layers):
            raise BadInputError(
                f"the draft was trained on a target with {cfg.target_num_hidden_layers} layers but this "
                f"target has {layers}; its aux layers {cfg.aux_layer_ids} may not mean the same depth")
        if hidden != cfg.target_hidden_size:
            raise BadInputError(
                f"target hidden size {hidden} differs from the draft's target_hidden_size "
                f"{cfg.target_hidden_size}: the draft was trained for another target")
        if hidden != cfg.hidden_size and not cfg.own_embeddings:
            raise BadInputError(
                f"target hidden size {hidden} differs from the draft's hidden size {cfg.hidden_size}: the "
                f"draft reads the target's token embeddings, which must have its width")
        if vocab != cfg.vocab_size:
            raise BadInputError(
                f"target vocabulary {vocab} differs from the draft's vocab_size {cfg.vocab_size} (t2d has "
                f"{self.t2d.numel()} entries): the draft was trained with another tokenizer")
        check_aux_layers(cfg.aux_layer_ids, layers, self.fc.in_features, hidden)
        self.check_vocab_mapping()
        if self.lookup_corpus is not None:
            self.lookup_corpus.check_vocab(vocab, "the draft")
        cfg.target_num_hidden_layers = layers

    def check_vocab_mapping(self) -> None:
        """d2t must map draft ids into the target vocabulary, one to one, agreeing with t2d."""
        n_draft, n_target = self.d2t.numel(), self.t2d.numel()
        targets = torch.arange(n_draft, device=self.d2t.device) + self.d2t
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= n_target:
            raise BadInputError(
                f"d2t maps draft ids to target ids in [{lo}, {hi}], outside the target vocabulary "
                f"[0, {n_target}): target id = i + d2t[i] must stay in range")
        if n_draft < n_target and not bool(self.d2t.any()):
            raise BadInputError(
                f"d2t is all zeros although the draft vocabulary ({n_draft}) is smaller than the "
                f"target's ({n_target}): draft id i would always mean target id i; the d2t buffer "
                "was not loaded or not trained")
        if torch.unique(targets).numel() != n_draft:
            raise BadInputError("d2t maps two draft ids to the same target id")
        if int(self.t2d.sum()) != n_draft or not bool(self.t2d[targets].all()):
            raise BadInputError(
                f"t2d marks {int(self.t2d.sum())} target ids but d2t maps {n_draft} draft ids; t2d must "
                "be True exactly at the target ids that d2t produces")

    # --- embeddings and fc -------------------------------------------------------------------
    def bind_embeddings(self, embedding: nn.Embedding) -> None:
        """Shares the target's token embedding (not copied, not saved with the draft).

        A draft with its own ``embed_tokens`` keeps using them when they differ from the
        target's (and exports them); when they are equal it drops its copy and shares.
        """
        width = embedding.weight.shape[-1]
        own = self.embed_tokens
        if own is not None:
            same = own.weight.shape == embedding.weight.shape and torch.equal(
                own.weight.detach().to(embedding.weight.device, embedding.weight.dtype), embedding.weight.detach())
            if not same:
                logger.info("Eagle3 draft: its own embed_tokens differ from the target's embedding; the draft keeps "
                            "using its own")
                object.__setattr__(self, "_embed", embedding)
                return
            logger.info("Eagle3 draft: its embed_tokens equal the target's embedding; sharing the target's")
            self.embed_tokens = None
            self.config.own_embeddings = False
        if width != self.config.hidden_size:
            raise BadInputError(f"target embedding width {width} differs from the draft hidden size "
                                f"{self.config.hidden_size}")
        object.__setattr__(self, "_embed", embedding)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens(input_ids)
        if self._embed is None:
            raise RuntimeError("Eagle3DraftModel: no token embedding bound; call "
                               "draft.bind_embeddings(target.get_input_embeddings()) first")
        return self._embed(input_ids)

    def project_aux(self, aux_hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """fc over the k captured target hidden states [B, T, H] each -> features [B, T, hidden],
        after the optional per-state (``fc_norm``) or joint (``norm_before_fc``) RMSNorm."""
        w = self.fc.weight
        aux = [a.to(w.dtype) for a in aux_hidden]
        if self.fc_norm is not None:
            aux = [norm(a) for norm, a in zip(self.fc_norm, aux)]
        elif self.input_norm is not None:
            aux = joint_rms_norm(aux, self.input_norm)
        return ops.fused_aux_fc(aux, w, self.fc.bias)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids for draft-vocabulary ids (target id = i + d2t[i])."""
        return draft_ids + self.d2t[draft_ids]

    # --- forward ---------------------------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int, device: Optional[torch.device] = None,
                  dtype: Optional[torch.dtype] = None, allocate: Optional[Allocate] = None) -> DraftKVCache:
        w = self.fc.weight
        return DraftKVCache(self.config.num_hidden_layers, batch_size, capacity, self.config.num_key_value_heads,
                            self.config.head_dim, dtype or w.dtype, device or w.device, allocate)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, position_ids: torch.Tensor,
                cache: Optional[DraftKVCache] = None, tree_mask: Optional[torch.Tensor] = None,
                output_index: Optional[torch.Tensor] = None) -> Eagle3DraftOutput:
        """One draft forward over n new tokens per request.

        Args:
            input_ids: [B, n] target-vocabulary ids (token t + 1 pairs with feature t).
            hidden_states: [B, n, hidden]: fc features (``project_aux``) or the previous step's
                ``hidden`` output.
            position_ids: [B, n] absolute positions.
            cache: the draft's KV cache; the n tokens are appended after its uncommitted tokens.
                None runs over these tokens alone.
            tree_mask: [B, n, t] bool, t = cache.tree_len + n: which uncommitted tokens each new
                token sees (ancestors and itself). None means causal.
            output_index: [B] int64: return the logits and hidden state of token
                ``output_index[b]`` of each request only ([B, 1, ...]); the lm_head then reads one
                row a request instead of n (all n tokens still reach the cache).
        """
        b, n = input_ids.shape
        if hidden_states.shape[:2] != (b, n) or hidden_states.shape[-1] != self.config.hidden_size:
            raise ValueError(f"hidden_states must be [{b}, {n}, {self.config.hidden_size}], got "
                             f"{list(hidden_states.shape)}")
        if position_ids.shape != (b, n):
            raise ValueError(f"position_ids must be [{b}, {n}], got {list(position_ids.shape)}")
        if cache is None:
            cache = self.new_cache(b, n, device=input_ids.device, dtype=hidden_states.dtype)
        total = cache.tree_len + n
        if tree_mask is None:
            tree_mask = torch.ones(n, total, dtype=torch.bool, device=input_ids.device).tril(total - n)
            tree_mask = tree_mask.expand(b, n, total)
        elif tree_mask.dtype != torch.bool or tree_mask.shape != (b, n, total):
            raise ValueError(f"tree_mask must be bool [{b}, {n}, {total}] (cache.tree_len + n), got "
                             f"{tree_mask.dtype} {list(tree_mask.shape)}")
        if not torch.compiler.is_compiling():  # a compiled draft loop checks the room of all its steps first
            cache.check_room(n)
        slots = cache.slots(n)

        def cached_attend(layer: int) -> Attend:
            def attend(q, k, v, scale):
                cache.write(layer, slots, k, v)
                return tree_attention_with_cache(q, cache.keys[layer], cache.values[layer], cache.prefix_lens,
                                                 tree_mask, scale)
            return attend

        hidden = self.run_layers(input_ids, hidden_states, position_ids, cached_attend)
        cache.tree_len += n
        if output_index is not None:
            hidden = torch.gather(hidden, 1, output_index.view(b, 1, 1).expand(b, 1, hidden.shape[-1]))
        logits, hidden = self.head(hidden)
        return Eagle3DraftOutput(logits=logits, hidden=hidden)

    def run_layers(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, position_ids: torch.Tensor,
                   attend_for_layer: Callable[[int], Attend]) -> torch.Tensor:
        """The decoder layers over [B, n] tokens; returns their output [B, n, hidden] (before the
        final norm; ``head`` turns it into logits and the next step's feature)."""
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, hidden_states.dtype)
        embeds = self.embed(input_ids).to(hidden_states.dtype)
        hidden = hidden_states
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, embeds if i == 0 else None, cos, sin, attend_for_layer(i))
        return hidden

    def head(self, hidden: torch.Tensor):
        """(logits [B, n, draft_vocab_size], the hidden state the next draft step reads) from the
        decoder layers' output, per the ``norm_output`` / ``final_norm`` convention."""
        head_in, hidden = self.head_input(hidden)
        return linear(self.lm_head, head_in), hidden

    def head_input(self, hidden: torch.Tensor):
        """(what ``lm_head`` reads, the hidden state the next draft step reads) from the decoder
        layers' output: ``head`` without the lm_head, for callers that need logits of some rows only."""
        if self.config.norm_output:
            normed = self.norm(hidden)
            return normed, normed
        if not self.config.final_norm:
            return hidden, hidden
        return self.norm(hidden), hidden

    # --- checkpoints -----------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str, target_config: Any = None) -> "Eagle3DraftModel":
        """Loads any supported checkpoint layout (EAGLE, SpecForge/SGLang, vLLM speculators,
        eagle3_ext); with ``target_config`` also resolves and validates against the target."""
        return load_draft(cls, path, target_config)

    def save_pretrained(self, path: str, format: str = "eagle3_ext", safe_serialization: bool = True,
                        verifier: Optional[dict] = None, speculative_tokens: int = 3) -> None:
        """Saves as ``format``: "eagle3_ext", "eagle", "specforge" (SGLang) or "vllm".

        ``verifier`` ({"name_or_path", "architectures"}) and ``speculative_tokens`` fill the vllm
        format's ``speculators_config`` block. A convention the format cannot express is a
        ValueError naming it and the formats that can.
        """
        save_draft(self, path, format, safe_serialization, verifier=verifier, speculative_tokens=speculative_tokens)
