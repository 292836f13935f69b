"""Checks of the values a user gives, shared by the API's configs and the command line.

Every error names the argument, says what was expected and what came, and is an
``errors.BadInput`` (the ``eagle3`` command's exit code 2): a ``BadInputTypeError`` (a TypeError)
for a value of the wrong kind, a ``BadInputError`` (a ValueError) for one out of range, a
``MissingPathError`` (a FileNotFoundError) for a path that does not exist. No check reads 0, an
empty string or an empty list as "not given": None is the only "use the default".
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, List, Optional, Sequence

from .errors import BadInputError, BadInputTypeError, MissingPathError, UnreadablePathError


def _bounds(low: Optional[float], high: Optional[float], low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}]"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"<= {high:g}"


def describe_integer(minimum: Optional[int] = None, maximum: Optional[int] = None) -> str:
    """What an integer argument takes, in words ("a positive integer", "an integer in [1, 64]")."""
    if maximum is None and minimum == 1:
        return "a positive integer"
    if maximum is None and minimum == 0:
        return "a non-negative integer"
    if minimum is None and maximum is None:
        return "an integer"
    return f"an integer {_bounds(minimum, maximum)}"


def describe_number(minimum: Optional[float] = None, maximum: Optional[float] = None,
                    exclusive_minimum: bool = False) -> str:
    if minimum == 0 and maximum is None:
        return "a positive number" if exclusive_minimum else "a number >= 0"
    if minimum is None and maximum is None:
        return "a finite number"
    return f"a number {_bounds(minimum, maximum, exclusive_minimum)}"


def _fault(name: str, expected: str, got: str) -> str:
    """"<name> must be <expected>, got <got>"; without a name (argparse adds the option's),
    "expected <expected>, got <got>"."""
    return f"{name} must be {expected}, got {got}" if name else f"expected {expected}, got {got}"


def in_range(value: float, minimum: Optional[float], maximum: Optional[float], exclusive_minimum: bool = False) -> bool:
    below = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
    return math.isfinite(value) and not below and (maximum is None or value <= maximum)


def integer(name: str, value: Any, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
    """``value`` if it is an int (not a bool) within [minimum, maximum]."""
    expected = describe_integer(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInputTypeError(_fault(name, expected, f"{value!r} ({type(value).__name__})"))
    if not in_range(value, minimum, maximum):
        raise BadInputError(_fault(name, expected, str(value)))
    return value


def number(name: str, value: Any, minimum: Optional[float] = None, maximum: Optional[float] = None,
           exclusive_minimum: bool = False) -> float:
    """``value`` as a float if it is a finite int or float within the bounds."""
    expected = describe_number(minimum, maximum, exclusive_minimum)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputTypeError(_fault(name, expected, f"{value!r} ({type(value).__name__})"))
    if not in_range(float(value), minimum, maximum, exclusive_minimum):
        raise BadInputError(_fault(name, expected, f"{value:g}"))
    return float(value)


def boolean(name: str, value: Any, allow_none: bool = False) -> Optional[bool]:
    """``value`` if it is a bool (1 and "yes" are not: a typo would pass as a switch), or None
    where ``allow_none`` (a switch left to a default chosen later)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        expected = "True, False or None" if allow_none else "True or False"
        raise BadInputTypeError(_fault(name, expected, f"{value!r} ({type(value).__name__})"))
    return value


def choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise BadInputError(_fault(name, "one of " + ", ".join(repr(c) for c in choices), repr(value)))
    return value


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str):
        raise BadInputTypeError(_fault(name, "a string", type(value).__name__))
    if not value.strip():
        raise BadInputError(_fault(name, "a non-empty string", repr(value)))
    return value


def distinct_items(name: str, values: Any, expected: str, check: Callable[[str, Any], Any], why: str = "") -> list:
    """A non-empty list or tuple (``expected`` says what it holds) of distinct items, each passing
    ``check(f"{name}[i]", item)``; ``why`` follows "must be distinct" in the error."""
    if not isinstance(values, (list, tuple)) or not values:
        raise BadInputTypeError(f"{name} must be {expected}, got {values!r}")
    for i, item in enumerate(values):
        check(f"{name}[{i}]", item)
    if len(set(values)) != len(values):
        raise BadInputError(f"{name} must be distinct{why}, got {list(values)}")
    return list(values)


def path(name: str, value: Any) -> str:
    """A non-empty path (str or os.PathLike) as a string; it need not exist."""
    if not isinstance(value, (str, os.PathLike)):
        raise BadInputTypeError(_fault(name, "a path (str or os.PathLike)", type(value).__name__))
    value = os.fspath(value)
    if not value.strip():
        raise BadInputError(_fault(name, "a non-empty path", repr(value)))
    return value


def _where(name: str, value: str) -> str:
    return f"{name}: {value}" if name else value


def existing_file(name: str, value: Any) -> str:
    """A path to a readable regular file."""
    value = path(name, value)
    if os.path.isdir(value):
        raise BadInputError(f"{_where(name, value)} is a directory, expected a file")
    if not os.path.exists(value):
        raise MissingPathError(f"{_where(name, value)} does not exist, expected a file")
    if not os.access(value, os.R_OK):
        raise UnreadablePathError(f"{_where(name, value)} is not readable")
    return value


def existing_files(name: str, value: Any) -> List[str]:
    """A non-empty list (or tuple) of paths to readable files; a single path is refused, not read
    as a list of its characters."""
    if isinstance(value, (str, os.PathLike)) or not isinstance(value, (list, tuple)) or not value:
        raise BadInputTypeError(f"{name} must be a non-empty list of file paths, got {value!r}")
    return [existing_file(f"{name}[{i}]", item) for i, item in enumerate(value)]


def existing_dir(name: str, value: Any) -> str:
    """A path to an existing directory."""
    value = path(name, value)
    if not os.path.exists(value):
        raise MissingPathError(f"{_where(name, value)} does not exist, expected a directory")
    if not os.path.isdir(value):
        raise BadInputError(f"{_where(name, value)} is a file, expected a directory")
    return value


def output_dir(name: str, value: Any) -> str:
    """A directory to write into: existing, or one that can be created (not a file)."""
    value = path(name, value)
    if os.path.exists(value) and not os.path.isdir(value):
        raise BadInputError(f"{_where(name, value)} is a file, expected a directory to write into")
    return value


def read_text_file(name: str, value: Any) -> str:
    """The content of a UTF-8 text file; a binary or otherwise undecodable file, or one with
    nothing but whitespace, is an error naming the file and the place."""
    value = existing_file(name, value)
    with open(value, "rb") as f:
        raw = f.read()
    where = _where(name, value)
    if b"\0" in raw:
        line = raw[:raw.index(b"\0")].count(b"\n") + 1
        raise BadInputError(f"{where}:{line}: a NUL byte: this is a binary file, expected UTF-8 text")
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise BadInputError(f"{where}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8; expected UTF-8 text") from None
    if not content.strip():
        raise BadInputError(f"{where} is empty")
    return content
