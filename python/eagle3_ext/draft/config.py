"""Configuration of an EAGLE-3 draft head."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from ..errors import BadInputError
from ..validation import integer

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass
class Eagle3DraftConfig:
    """Shape and numerics of an EAGLE-3 draft head (Llama-style decoder layer).

    Sizes are in elements. ``vocab_size`` is the target's vocabulary (length of t2d),
    ``draft_vocab_size`` the draft's own (rows of lm_head, length of d2t).
    ``aux_layer_ids`` are in the internal convention: indices into Hugging Face's
    ``output_hidden_states`` tuple (0 = embedding output, i = output of decoder layer i - 1);
    ``aux_layer_ids_source`` says which rule produced them. They stay None until a target's
    layer count is known when the checkpoint relies on EAGLE's default.

    Convention flags (each changes the computation; see docs/formats.md):

    - ``norm_before_residual``: the first layer's residual is RMSNorm(feature), not the raw feature.
    - ``fc_norm``: one RMSNorm per aux state before the fc (``fc_norm.{i}``).
    - ``norm_before_fc``: one RMSNorm over the concatenated aux states before the fc (``input_norm``).
    - ``norm_output``: the final RMSNorm's output is both what lm_head reads and the hidden state
      fed to the next draft step (EAGLE-3.1); otherwise the next step reads the pre-norm hidden.
    - ``final_norm``: lm_head reads RMSNorm(hidden); False (SpecForge's ``norm_output: false``)
      makes it read the hidden state directly.
    - ``own_embeddings``: the draft carries its own ``embed_tokens`` instead of sharing the target's.

    ``fingerprint`` is the activation fingerprint recorded at training (``fingerprint.Fingerprint``
    as a dict), or None.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    head_dim: Optional[int] = None
    num_hidden_layers: int = 1
    target_hidden_size: Optional[int] = None
    num_aux_layers: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    fc_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    final_norm: bool = True
    own_embeddings: bool = False
    aux_layer_ids: Optional[List[int]] = None
    aux_layer_ids_source: str = "unresolved"
    target_num_hidden_layers: Optional[int] = None
    fingerprint: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_attention_heads"):  # the defaults below derive from them
            integer(f"Eagle3DraftConfig.{name}", getattr(self, name), 1)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // max(1, self.num_attention_heads)
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.aux_layer_ids is not None:
            self.aux_layer_ids = [int(i) for i in self.aux_layer_ids]
            self.num_aux_layers = len(self.aux_layer_ids)
        self.validate()

    def validate(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "vocab_size", "draft_vocab_size", "head_dim", "num_hidden_layers",
                     "target_hidden_size", "num_aux_layers", "max_position_embeddings"):
            integer(f"Eagle3DraftConfig.{name}", getattr(self, name), 1)
        if self.num_attention_heads % self.num_key_value_heads:
            raise BadInputError(
                f"Eagle3DraftConfig: num_attention_heads={self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise BadInputError(
                f"Eagle3DraftConfig: draft_vocab_size={self.draft_vocab_size} is larger than the "
                f"target vocabulary vocab_size={self.vocab_size}")
        if self.fc_norm and self.norm_before_fc:
            raise BadInputError("Eagle3DraftConfig: fc_norm (one RMSNorm per aux state) and norm_before_fc (one "
                                "RMSNorm over their concatenation) exclude each other; set one")
        if self.norm_output and not self.final_norm:
            raise BadInputError("Eagle3DraftConfig: norm_output feeds the final RMSNorm's output back, which needs "
                                "final_norm=True")
        if self.hidden_act != "silu":
            raise BadInputError(f"Eagle3DraftConfig.hidden_act: only 'silu' is supported, got {self.hidden_act!r}")
        rope_type = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise BadInputError(
                f"Eagle3DraftConfig.rope_scaling: rope_type {rope_type!r} is not supported "
                f"(expected one of {', '.join(SUPPORTED_ROPE_TYPES)})")

    @property
    def fc_in_features(self) -> int:
        return self.num_aux_layers * self.target_hidden_size

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
