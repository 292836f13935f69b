"""The package's import discipline: modules import the package at their top, never inside a
function to dodge a cycle (the command-line modules may, for a fast start), and every module
imports on its own in a fresh interpreter, so no cycle hides behind an import order."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

import eagle3_ext

PACKAGE = pathlib.Path(eagle3_ext.__file__).parent
LAZY_ALLOWED = re.compile(r"^cli/")  # the eagle3 command: imports what a subcommand needs


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if "hub" in rel.parts:  # the custom_generate folder Hugging Face loads by path, not a module of ours
            continue
        parts = ("eagle3_ext",) + rel.with_suffix("").parts
        yield path, rel, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_the_package(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "eagle3_ext"
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "eagle3_ext" for alias in node.names)
    return False


def in_function_imports(source: str):
    """(line, function) of every import of the package inside a function of ``source``."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [(node.lineno, fn.name) for node in ast.walk(fn) if _imports_the_package(node)]
    return sorted(set(found))


def test_the_scan_finds_an_import_inside_a_function():
    source = "import os\nfrom . import ops\n\ndef f():\n    from .bench import suite\n    import eagle3_ext.decoding.tree\n"
    assert in_function_imports(source) == [(5, "f"), (6, "f")]
    assert in_function_imports("def f():\n    import json\n    from torch import nn\n") == []


def test_no_module_imports_the_package_inside_a_function():
    found = [f"{rel}:{line} in {fn}()" for path, rel, _ in _modules() if not LAZY_ALLOWED.match(str(rel))
             for line, fn in in_function_imports(path.read_text())]
    assert not found, "imports of the package inside a function (move them to the top):\n" + "\n".join(found)


# Run in a fresh interpreter that loads torch and transformers once, then forks a child per
# module (so each child skips those imports) and reports the modules that failed to import.
_IMPORT_EACH = """
import multiprocessing, sys, traceback
import torch, transformers  # noqa: F401
def one(name):
    try:
        __import__(name)
    except BaseException:
        traceback.print_exc()
        sys.exit(3)
context = multiprocessing.get_context("fork")
failed = []
for name in sys.argv[1:]:
    child = context.Process(target=one, args=(name,))
    child.start()
    child.join(300)
    if child.exitcode != 0:
        failed.append(name)
print("FAILED", " ".join(failed))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="forks the interpreter (Linux)")
def test_every_module_imports_alone():
    """Each module imported first in a fresh process: a cycle fails whichever module enters it first."""
    names = [name for _, rel, name in _modules() if rel.name != "__main__.py"]  # __main__ runs the command
    assert len(names) > 50 and "eagle3_ext.api.generator" in names
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    failed = done.stdout.strip().splitlines()[-1].split()[1:]
    assert not failed, f"modules that fail to import alone: {failed}\n{done.stderr}"
