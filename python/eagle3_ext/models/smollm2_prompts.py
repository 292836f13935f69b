"""Training prompts for the SmolLM2-135M-Instruct draft, built offline from text that ships
with the Python interpreter (the standard library's docstrings and sources, and the language
reference in ``pydoc_data``) and with Debian (the descriptions of the installed packages).

No public benchmark's prompts enter (HumanEval, MBPP, MT-bench, GSM8K, AlpacaEval): the
prompts are templates of this module filled from those texts, and the reasoning problems are
generated from numbers drawn here. The held-out evaluation prompts (``smollm2/eval_prompts.jsonl``)
were written separately and share no template with these.

Each prompt is one chat record ``{"messages": [{"role": "user", ...}, {"role": "assistant",
"content": ""}], "category": ...}`` whose empty assistant turn ``eagle3 train regenerate``
fills with the target's own response.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import random
import re
import sysconfig
import textwrap
from typing import Dict, Iterator, List, Sequence, Tuple

SKIPPED_DIRS = {"test", "tests", "site-packages", "idlelib", "__pycache__", "lib2to3", "turtledemo", "tkinter",
                "ensurepip"}
DPKG_STATUS = "/var/lib/dpkg/status"
# Shares of the categories in the training set.
MIX = {"code": 0.30, "explain": 0.25, "chat": 0.10, "reasoning": 0.15, "summarise": 0.12, "prose": 0.08}

CODE_ASKS = ("Write a Python function that {}.", "Implement a Python function that {}.",
             "Can you write Python code that {}?", "I need a Python function that {}. Please write it.")
EXPLAIN_CODE_ASKS = ("Explain what this Python code does:\n\n```python\n{}\n```",
                     "What does the following function do?\n\n```python\n{}\n```",
                     "Review this Python code and suggest one improvement:\n\n```python\n{}\n```")
MODULE_ASKS = ("What is the Python module `{}` used for?", "Explain the `{}` module of Python's standard library.",
               "When would I use the `{}` module in Python? Give an example.")
TOPIC_ASKS = ("Explain {} in Python.", "How does {} work in Python? Give a short example.",
              "What should a beginner know about {} in Python?")
PACKAGE_ASKS = ("What is {} and what is it used for?", "Explain in simple words: {}.",
                "Tell me about the software package described as \"{}\".")
SUMMARY_ASKS = ("Summarize the following text in a few sentences:\n\n{}", "Give a short summary of this text:\n\n{}",
                "What are the main points of this passage?\n\n{}")
ACTIVITIES = ("learning a new language", "cooking rice", "keeping a plant alive", "running a first 5 km",
              "saving money", "writing a cover letter", "sleeping better", "studying for an exam",
              "organising a small office", "learning to play the guitar", "planning a trip by train",
              "speaking in public", "taking better photos", "starting to exercise", "working from home",
              "reading more books", "making new friends in a new city", "preparing for a job interview",
              "keeping a diary", "learning to draw", "baking bread", "fixing a flat bicycle tyre",
              "reducing screen time", "growing tomatoes", "teaching a child to swim", "writing clear emails")
CHAT_ASKS = ("Give me three tips for {}.", "What are common mistakes when {}?", "How should I get started with {}?",
             "Can you make a simple plan for {}?")
SUBJECTS = ("a lighthouse keeper", "a robot that learns to paint", "a lost cat", "the first day at a new school",
            "a small village in winter", "a journey across the sea", "a friendly dragon", "an old clock",
            "a city at night", "a garden in spring", "a forgotten letter", "a musician on the street",
            "a mountain climber", "a library after closing time", "a train that never stops", "the moon",
            "a rainy afternoon", "a market in the morning", "an astronaut's first walk", "a river")
PROSE_ASKS = ("Write a short story about {}.", "Write a short poem about {}.", "Describe {} in one paragraph.",
              "Write the opening paragraph of a novel about {}.")
NAMES = ("Ana", "Ben", "Chen", "Dina", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq")
ITEMS = (("apples", "kilogram"), ("pencils", "box"), ("notebooks", "pack"), ("eggs", "dozen"),
         ("tickets", "set"), ("plants", "tray"), ("cookies", "bag"), ("bottles of water", "crate"))


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", text)[0].rstrip(".")


def docstring_task(sentence: str) -> str:
    """"Return the sum of x." -> "returns the sum of x" (verb-first docstrings only)."""
    words = sentence.split()
    if len(words) < 4 or len(sentence) > 160 or not words[0].isalpha() or not words[0][0].isupper():
        return ""
    verb = words[0].lower()
    if verb.endswith("s") or verb in {"the", "this", "a", "an", "if", "deprecated", "internal", "helper", "see"}:
        return ""
    if verb.endswith(("y",)) and not verb.endswith(("ay", "ey", "oy")):
        verb = verb[:-1] + "ies"
    elif verb.endswith(("s", "sh", "ch", "x", "z")):
        verb += "es"
    else:
        verb += "s"
    return " ".join([verb] + words[1:])


def stdlib_functions(root: str) -> Iterator[Tuple[str, str, str]]:
    """(module, docstring, source) of every top-level or method function with a docstring."""
    for path, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(names):
            if not name.endswith(".py") or name.startswith("_"):
                continue
            full = os.path.join(path, name)
            module = os.path.relpath(full, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            try:
                with open(full, encoding="utf-8") as f:
                    source = f.read()
                tree = ast.parse(source)
            except (UnicodeDecodeError, SyntaxError, OSError, ValueError):
                continue
            lines = source.splitlines()
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield module, doc, textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))


def stdlib_modules(root: str) -> List[str]:
    mods = set()
    for name in sorted(os.listdir(root)):
        stem = name.removesuffix(".py")
        if stem.isidentifier() and not stem.startswith("_") and stem not in SKIPPED_DIRS and (
                name.endswith(".py") or os.path.exists(os.path.join(root, name, "__init__.py"))):
            mods.add(stem)
    return sorted(mods)


def reference_paragraphs() -> Tuple[List[str], List[str]]:
    """(topic names, paragraphs of 300-1200 characters) of the language reference in pydoc_data."""
    from pydoc_data.topics import topics

    names = sorted(k.replace("-", " ") for k in topics if k.isascii() and len(k) > 3)
    paragraphs = []
    for text in topics.values():
        for block in text.split("\n\n"):
            block = inspect.cleandoc(block)
            if 300 <= len(block) <= 1200 and not block.lstrip().startswith((">>>", "|", "*")) and block.count(
                    "\n   ") < 2:
                paragraphs.append(block)
    return names, paragraphs


def package_descriptions(status: str = DPKG_STATUS) -> Tuple[List[str], List[str]]:
    """(short descriptions, long descriptions of 300+ characters) of Debian's installed packages."""
    short, long = [], []
    if not os.path.exists(status):
        return short, long
    with open(status, encoding="utf-8", errors="replace") as f:
        for stanza in f.read().split("\n\n"):
            m = re.search(r"^Description: (.*)\n((?: .*\n?)*)", stanza, re.M)
            if not m:
                continue
            short.append(m.group(1).strip())
            body = "\n".join(" " + line[1:].strip() if line.strip() != "." else "\n" for line in
                             m.group(2).splitlines())
            body = re.sub(r"\s*\n\s*\n\s*", "\n\n", " ".join(body.split(" \n"))).strip()
            body = " ".join(body.split())
            if len(body) >= 300:
                long.append(body[:1200])
    return sorted(set(short)), sorted(set(long))


def reasoning_problem(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    item, unit = rng.choice(ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        price, count, paid = rng.randint(2, 9), rng.randint(3, 12), rng.choice((50, 100, 200))
        return (f"{a} buys {count} {item} at {price} dollars each and pays with a {paid} dollar note. How much "
                "change does {a} get? Explain step by step.").replace("{a}", a)
    if kind == 1:
        per, units, eaten = rng.randint(6, 24), rng.randint(2, 6), rng.randint(1, 10)
        return (f"A {unit} holds {per} {item}. {a} has {units} of them and gives {eaten} {item} to {b}. How "
                f"many {item} does {a} have left? Show your reasoning.")
    if kind == 2:
        speed, hours, minutes = rng.randint(30, 90), rng.randint(1, 4), rng.choice((15, 20, 30, 45))
        return (f"A train travels at {speed} km per hour for {hours} hours and {minutes} minutes. How far does it "
                "go? Think it through step by step.")
    x, y = rng.randint(2, 15), rng.randint(2, 15)
    total = 2 * y + x + 2 * rng.randint(5, 30)  # so that the younger one's age is a whole number
    return (f"{a} is {x} years older than {b}. In {y} years the sum of their ages will be {total}. "
            f"How old is {b} now? Explain your answer.")


def build(count: int, seed: int = 0, stdlib: str | None = None, status: str = DPKG_STATUS) -> List[Dict]:
    """``count`` chat records in the MIX of categories, deterministic for a given seed and
    source texts."""
    rng = random.Random(seed)
    root = stdlib or sysconfig.get_paths()["stdlib"]
    functions = list(stdlib_functions(root))
    tasks = sorted({t for t in (docstring_task(_first_sentence(d)) for _, d, _ in functions) if t})
    snippets = sorted({s for _, _, s in functions if 4 <= s.count("\n") <= 18 and len(s) <= 900})
    modules = stdlib_modules(root)
    topics, paragraphs = reference_paragraphs()
    short, long = package_descriptions(status)
    pools: Dict[str, List[str]] = {
        "code": [a.format(t) for t in tasks for a in CODE_ASKS[:1]] + [a.format(s) for s in snippets
                                                                       for a in EXPLAIN_CODE_ASKS[:1]],
        "explain": [a.format(m) for m in modules for a in MODULE_ASKS] + [a.format(t) for t in topics
                                                                         for a in TOPIC_ASKS]
                   + [a.format(d) for d in short for a in PACKAGE_ASKS[:2]],
        "chat": [a.format(x) for x in ACTIVITIES for a in CHAT_ASKS],
        "summarise": [a.format(p) for p in paragraphs + long for a in SUMMARY_ASKS[:1]],
        "prose": [a.format(s) for s in SUBJECTS for a in PROSE_ASKS],
    }
    records = []
    for category, share in MIX.items():
        n = round(count * share)
        if category == "reasoning":
            prompts = [reasoning_problem(rng) for _ in range(n)]
        else:
            pool = pools[category]
            if not pool:
                raise ValueError(f"no source text for the {category} prompts (stdlib {root}, dpkg {status})")
            prompts = rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
            if category == "code":  # vary the phrasing beyond the first template
                prompts = [_rephrase(p, rng) for p in prompts]
        records += [{"category": category, "messages": [{"role": "user", "content": p},
                                                        {"role": "assistant", "content": ""}]} for p in prompts]
    rng.shuffle(records)
    return records[:count]


def _rephrase(prompt: str, rng: random.Random) -> str:
    for first, others in ((CODE_ASKS[0], CODE_ASKS), (EXPLAIN_CODE_ASKS[0], EXPLAIN_CODE_ASKS)):
        head = first.split("{}")[0]
        if prompt.startswith(head):
            body = prompt[len(head):len(prompt) - len(first.split("{}")[1])]
            return rng.choice(others).format(body)
    return prompt


def write(records: Sequence[Dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
