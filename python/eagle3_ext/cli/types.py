"""argparse types for the ``eagle3`` command: each parses one option's text and checks it with
``validation`` at parse time, so a bad value is reported as "argument --depth: expected a
positive integer, got 0" with exit code 2 before any model loads. Only a ``BadInput`` error from
a check is a bad value; any other exception is a fault of the check and escapes argparse (which
would otherwise report a ValueError or TypeError as an invalid value)."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from .. import validation
from ..errors import BadInput
from ..models.gguf_target import GGUF_SUFFIX, resolve_target


def _adapt(check: Callable[[str, Any], Any], convert: Callable[[str], Any] = str,
           expected: str = "") -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, then ``check`` it (without a name: argparse
    prefixes the option); bad input becomes the ArgumentTypeError argparse prints."""

    def parse(raw: str) -> Any:
        try:
            value = convert(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {raw!r}") from None
        try:
            return check("", value)
        except BadInput as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        except (TypeError, ValueError) as e:  # argparse would print it as "invalid value"
            raise RuntimeError(f"checking {raw!r}: {type(e).__name__}: {e}") from e

    parse.__name__ = expected or check.__name__
    return parse


def integer(minimum: Optional[int] = None, maximum: Optional[int] = None) -> Callable[[str], int]:
    return _adapt(lambda name, v: validation.integer(name, v, minimum, maximum), int,
                  validation.describe_integer(minimum, maximum))


def number(minimum: Optional[float] = None, maximum: Optional[float] = None,
           exclusive_minimum: bool = False) -> Callable[[str], float]:
    return _adapt(lambda name, v: validation.number(name, v, minimum, maximum, exclusive_minimum), float,
                  validation.describe_number(minimum, maximum, exclusive_minimum))


text = _adapt(validation.text, expected="a non-empty value")
readable_file = _adapt(validation.existing_file, expected="a readable file")
directory = _adapt(validation.existing_dir, expected="a directory")
output_directory = _adapt(validation.output_dir, expected="a directory to write into")


def _target(name: str, value: str) -> str:
    """A target: a model directory, or a .gguf file (converted on first use)."""
    if value.endswith(GGUF_SUFFIX):
        return validation.existing_file(name, value)
    return validation.existing_dir(name, value)


target = _adapt(_target, expected="a model directory or a .gguf file")


def resolve_gguf_target(args: argparse.Namespace) -> None:
    """Replaces a ``.gguf`` ``args.target`` by its converted directory in ``args.dtype``."""
    if getattr(args, "target", None) is not None:
        args.target = resolve_target(args.target, getattr(args, "dtype", None) or "float32")
