"""The ``eagle3`` command (also ``python -m eagle3_ext``). Each subcommand maps its flags to a
configuration dataclass and calls the library; with --json it prints one JSON object on stdout
and sends progress to stderr.

Exit codes, for every subcommand:

* 0: done (``doctor``: HEALTHY).
* 1: ``generate``: the output failed its check (under torchrun: the ranks disagree); ``doctor``:
  FAULT. Also any internal error: an exception that is not bad input (a bug of eagle3_ext, or of
  the machine: out of memory, a full disk, a CUDA error) prints its traceback on stderr, then a
  last line ``eagle3 <command>: internal error: <type>: <message>``. (For ``doctor`` the
  traceback tells an internal error from a FAULT verdict.)
* 2: bad input: an argument argparse rejects (usage error), or an ``errors.BadInput`` the
  library raised for what the user gave (a value out of range, a missing or unreadable file, a
  directory holding the wrong kind of model, a draft trained for another target, data in the
  wrong format...). Reported as one line on stderr, ``eagle3 <command>: error: <message>``
  (argparse prints its usage line before it), with no traceback (``-v`` prints it too). A plain
  ValueError / TypeError / OSError raised inside the library is not bad input: it is reported as
  an internal error (exit 1).
* 3: ``doctor``: INCONCLUSIVE.
* 130: interrupted (Ctrl-C); what was done is kept.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from typing import List, Optional

from ..errors import BadInput
from . import bench, convert, doctor, generate, train

COMMANDS = {"bench": (bench.add_parser, bench.run), "convert": (convert.add_parser, convert.run),
            "doctor": (doctor.add_parser, doctor.run), "generate": (generate.add_parser, generate.run),
            "train": (train.add_parser, train.run)}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    nested = _train_subcommand(argv)
    if nested is not None:  # `eagle3 [-v] train capture|regenerate|shrink-vocab|ngrams ...`
        return _run_guarded(f"train {nested[0]}", nested[2], lambda: train.run_subcommand(nested[0], nested[1]))
    parser = argparse.ArgumentParser(prog="eagle3", description="EAGLE-3 speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level on stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in COMMANDS.values():
        add(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's usage error (2) or --help (0): returned, as every other outcome
        return int(e.code or 0)
    except Exception:  # a fault of an argument check itself (cli/types.py), not of the value
        return _internal_error("eagle3")
    return _run_guarded(args.command, args.verbose, lambda: COMMANDS[args.command][1](args))


def _train_subcommand(argv: List[str]):
    """(name, its arguments, verbose) for `eagle3 [-v] train capture|regenerate|shrink-vocab|ngrams ...`, else None."""
    verbose = bool(argv) and argv[0] in ("-v", "--verbose")
    rest = argv[1:] if verbose else argv
    if len(rest) >= 2 and rest[0] == "train" and rest[1] in train.SUBCOMMANDS:
        return rest[1], rest[2:], verbose
    return None


def _run_guarded(command: str, verbose: bool, run) -> int:
    """Runs a command: bad input (a BadInput) becomes one line and exit 2, Ctrl-C exit 130,
    any other exception its traceback and exit 1 (see the module's docstring)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return run()
    except BadInput as e:  # bad input: one line (the traceback with -v)
        if verbose:
            traceback.print_exc()
        print(f"eagle3 {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # What was done is kept: streamed text, a training checkpoint, finished bench rows.
        detail = f": {e}" if str(e) else ""
        print(f"\neagle3 {command}: interrupted{detail}", file=sys.stderr)
        return 130
    except Exception:
        return _internal_error(f"eagle3 {command}")


def _internal_error(prefix: str) -> int:
    """An exception that is not bad input: its traceback, then one line naming it; exit 1."""
    traceback.print_exc()
    e = sys.exc_info()[1]
    print(f"{prefix}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
