"""The ``eagle3`` command tells bad input from its own faults: an ``errors.BadInput`` (what the
user gave is wrong) is one line and exit code 2; any other exception, a plain ValueError or KeyError
from inside the library included, is an internal error: its traceback and exit code 1. The
sweep of bad values over every option is test_bad_input.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from eagle3_ext import cli
from eagle3_ext.cli import train as cli_train
from eagle3_ext.cli import types as T
from eagle3_ext import validation
from eagle3_ext.errors import (BadInput, BadInputError, BadInputTypeError, MissingPathError, PathExistsError,
                               UnreadablePathError)


def _run(argv, capsys):
    rc = cli.main(argv)
    return rc, capsys.readouterr().err


def _is_bad_input_line(rc, err, command):
    lines = err.strip().splitlines()
    return rc == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith(f"eagle3 {command}: error: ")


def _is_internal_error(rc, err, command, kind, message):
    last = err.strip().splitlines()[-1]
    return (rc == 1 and "Traceback (most recent call last)" in err
            and last == f"eagle3 {command}: internal error: {kind}: {message}")


def _planted(exc):
    def run(args):
        raise exc
    return run


@pytest.mark.parametrize("exc", [ValueError("planted"), KeyError("planted"), TypeError("planted"),
                                 OSError("planted"), RuntimeError("planted")], ids=lambda e: type(e).__name__)
def test_an_internal_error_is_a_traceback_and_exit_1(exc, monkeypatch, tmp_path, capsys):
    add, _ = cli.COMMANDS["convert"]
    monkeypatch.setitem(cli.COMMANDS, "convert", (add, _planted(exc)))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    rc, err = _run(["convert", str(gguf), str(tmp_path / "out")], capsys)
    assert _is_internal_error(rc, err, "convert", type(exc).__name__, str(exc)), err
    assert "raise exc" in err  # the traceback reaches the place that raised


def _convert_raising(exc, monkeypatch, tmp_path, capsys):
    """``eagle3 convert`` whose converter, deep in the library, raises ``exc``: (rc, stderr)."""
    from eagle3_ext.models import gguf_target

    def convert(*args):
        raise exc

    monkeypatch.setattr(gguf_target, "convert", convert)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    return _run(["convert", str(gguf), str(tmp_path / "out")], capsys)


def test_a_plain_value_error_from_deep_in_the_library_is_internal(monkeypatch, tmp_path, capsys):
    """The library's own ValueError (not a BadInputError) is a fault, wherever it comes from."""
    rc, err = _convert_raising(ValueError("shape mismatch in the converter"), monkeypatch, tmp_path, capsys)
    assert _is_internal_error(rc, err, "convert", "ValueError", "shape mismatch in the converter"), err


def test_bad_input_raised_by_the_library_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    rc, err = _convert_raising(BadInputError("m.gguf: not a model GGUF file"), monkeypatch, tmp_path, capsys)
    assert _is_bad_input_line(rc, err, "convert"), err
    assert err.strip() == "eagle3 convert: error: m.gguf: not a model GGUF file"
    gguf = tmp_path / "m.gguf"
    rc, err = _run(["-v", "convert", str(gguf), str(tmp_path / "out")], capsys)  # -v adds the traceback
    assert rc == 2 and "Traceback" in err and err.strip().endswith("error: m.gguf: not a model GGUF file")


@pytest.mark.parametrize("argv, expected", [
    (["convert", "{tmp}/missing.gguf", "{tmp}/out"], "{tmp}/missing.gguf does not exist"),  # a missing file
    (["convert", "{tmp}/a.txt", "{tmp}/out"], "is not a file named *.gguf"),                # the library's check
    (["generate", "--depth", "0"], "--depth: expected an integer in [1, 64], got 0"),         # argparse's
    (["generate", "--pair", "toy", "--target", "{tmp}"], "--pair names both models"),        # the CLI's own
    (["bench", "--tree", "5,4"], "--tree takes DEPTH,TOPK,NODES"),
    (["train", "--out", "{tmp}/x"], "--target and --data are required"),
])
def test_bad_input_stays_one_line_and_exit_2(argv, expected, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("x")
    rc, err = _run([a.format(tmp=tmp_path) for a in argv], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert expected.format(tmp=tmp_path) in err.strip().splitlines()[-1]


def test_a_fault_of_an_argument_check_is_internal(monkeypatch, tmp_path, capsys):
    """argparse reports a type function's ValueError as an invalid value; a check's own fault
    must not pass for one."""
    def broken_check(name, value):
        raise ValueError("a bug in the check")

    def add(sub):
        sub.add_parser("convert").add_argument("gguf", type=T._adapt(broken_check, expected="a file"))

    monkeypatch.setitem(cli.COMMANDS, "convert", (add, _planted(AssertionError("not reached"))))
    rc, err = _run(["convert", "x.gguf"], capsys)
    assert rc == 1 and "Traceback" in err and "a bug in the check" in err
    assert err.strip().splitlines()[-1].startswith("eagle3: internal error: RuntimeError: checking 'x.gguf'")


def test_the_train_subcommands_tell_them_apart_too(monkeypatch, tmp_path, capsys):
    def load():
        def add(parser):
            parser.add_argument("--what")

        def run(args):
            raise (BadInputError if args.what == "bad" else KeyError)(args.what)
        return add, run

    monkeypatch.setitem(cli_train.SUBCOMMANDS, "capture", ("planted", *load()))
    rc, err = _run(["train", "capture", "--what", "bad"], capsys)
    assert _is_bad_input_line(rc, err, "train capture"), err
    rc, err = _run(["train", "capture", "--what", "bug"], capsys)
    assert _is_internal_error(rc, err, "train capture", "KeyError", "'bug'"), err


def test_bad_input_errors_are_the_builtin_errors_callers_catch(tmp_path):
    """Each kind of BadInput is the built-in exception the API raised before, and only that: a
    wrong type is not caught by ``except ValueError``, nor a missing file."""
    for cls, builtin in ((BadInputError, ValueError), (BadInputTypeError, TypeError),
                         (MissingPathError, FileNotFoundError), (PathExistsError, FileExistsError),
                         (UnreadablePathError, PermissionError)):
        assert issubclass(cls, BadInput) and issubclass(cls, builtin)
        assert cls is BadInputError or not issubclass(cls, ValueError)
    with pytest.raises(BadInputTypeError):  # a wrapper catching ValueError does not swallow it
        try:
            validation.integer("n", None, 1)
        except ValueError:
            pass
    with pytest.raises(MissingPathError, match="does not exist"):
        validation.existing_file("data", str(tmp_path / "missing"))
    with pytest.raises(BadInputTypeError, match="n must be a positive integer"):
        validation.integer("n", "3", 1)
    with pytest.raises(BadInputError, match="got 0"):
        validation.integer("n", 0, 1)
    with pytest.raises(FileNotFoundError):  # what callers of the API catch keeps working
        validation.existing_dir("target", str(tmp_path / "missing"))


def test_exit_codes_of_the_real_process(tmp_path):
    """``python -m eagle3_ext``: bad input exits 2 with one line; an internal error exits 1 with
    its traceback (the planted fault runs in the child process)."""
    env = dict(os.environ)
    (tmp_path / "a.txt").write_text("x")
    bad = subprocess.run([sys.executable, "-m", "eagle3_ext", "convert", str(tmp_path / "a.txt"),
                          str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip() == (f"eagle3 convert: error: gguf file {tmp_path}/a.txt is "
                                                          "not a file named *.gguf"), bad.stderr
    plant = ("import sys; from eagle3_ext import cli\n"
             "def boom(args): raise KeyError('planted')\n"
             "cli.COMMANDS['convert'] = (cli.COMMANDS['convert'][0], boom)\n"
             "sys.exit(cli.main(sys.argv[1:]))\n")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    internal = subprocess.run([sys.executable, "-c", plant, "convert", str(tmp_path / "m.gguf"),
                               str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert internal.returncode == 1 and "Traceback (most recent call last)" in internal.stderr, internal.stderr
    assert internal.stderr.strip().splitlines()[-1] == "eagle3 convert: internal error: KeyError: 'planted'"
