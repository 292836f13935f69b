"""The Python side of benchmarks/gpu_check.sh: what the check needs, where it finds it, which
tests it runs under compute-sanitizer, and the JSON report it writes.

    python benchmarks/gpu_check_support.py prereqs [--wheelhouse .whl] [--json F] [--env F] [--rehearsal]
    python benchmarks/gpu_check_support.py wheels [all | NAME ...]
    python benchmarks/gpu_check_support.py cuda-test-files
    python benchmarks/gpu_check_support.py sanitizer-runs
    python benchmarks/gpu_check_support.py report OUT_DIR

`prereqs` lists every tool, Python package, the GPU and the CUDA versions, says which missing
package a wheel in the wheelhouse provides, writes the findings as JSON and, with --env, the
paths the later steps use as shell assignments; it exits 1 when anything missing cannot come
from the wheelhouse. It imports nothing but the standard library and torch, so it answers in
seconds on a machine that lacks everything else. `wheels` prints the requirements
benchmarks/prepare_wheelhouse.sh downloads; `report` gathers a run's files into gpu_report.json.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Package:
    """A Python package the check needs: imported as `module`, installed as `dist`."""
    module: str
    dist: str
    wheel: str                    # key for prepare_wheelhouse.sh and the wheelhouse file prefix
    requirement: str              # what pip downloads
    minimum: Tuple[int, ...] = ()
    no_deps: bool = False         # download and install the wheel alone
    optional: bool = False        # reported, never fatal
    why: str = ""


# torch is no entry: it is too large for a wheelhouse and must come with the machine. The CUDA
# tests and the benchmarks gpu_check.sh runs import torch, pytest and eagle3_ext (which imports
# nothing else at import time); test_hf_attention.py also transformers, and skips without it.
PACKAGES = [
    Package("scikit_build_core", "scikit-build-core", "scikit-build-core", "scikit-build-core>=0.10", (0, 10),
            why="the build backend"),
    Package("pybind11", "pybind11", "pybind11", "pybind11>=2.12", (2, 12), why="the bindings"),
    Package("pytest", "pytest", "pytest", "pytest>=8", (8,), why="the CUDA tests"),
    Package("cutlass_library", "nvidia-cutlass", "cutlass", "nvidia-cutlass==4.2.0.0", no_deps=True,
            why="the CUTLASS/CuTe headers of fused_aux_fc's sm_90a wgmma kernel"),
    Package("numpy", "numpy", "numpy", "numpy", optional=True, why="torch's NumPy interop (no test needs it)"),
    Package("transformers", "transformers", "transformers", "transformers>=5.24,<6", (5, 24), optional=True,
            why="test_hf_attention.py's CUDA tests (skipped without it)"),
]

ALONE = {p.requirement for p in PACKAGES if p.no_deps}

# Tools that can also come from the wheelhouse (their PyPI wheels carry the binaries).
TOOL_WHEELS = {"cmake": "cmake>=3.26", "ninja": "ninja"}
CMAKE_MINIMUM = (3, 26)  # pyproject.toml's cmake.version

# The files whose tests carry the `cuda` marker (through conftest.DEVICES).
CUDA_TEST_FILES = ["tests/test_fused_aux_fc.py", "tests/test_tree_attention.py", "tests/test_tree_ops.py",
                   "tests/test_tree_sampling_draft_probs.py", "tests/test_hf_attention.py", "tests/test_regenerate.py",
                   "tests/test_acceptance_bound.py", "tests/test_compiled_verify.py"]

# One small CUDA test per op (fused_aux_fc: its sm_90a/prefill path and its split-K decode path),
# run under compute-sanitizer in a process of its own; racecheck too for tree_attention, whose
# 4 warps per CTA share the Q, K, V and P tiles in shared memory, and for the draft-probability
# sampler, whose whole block walks the tree and reuses its shared sums at every rejection.
SANITIZER_NODES: Dict[str, List[str]] = {
    "fused_aux_fc": [
        "tests/test_fused_aux_fc.py::test_prefill_tiles_hidden_multiple_of_64[bias-T300-H192-N256-k3-bf16-cuda]",
        "tests/test_fused_aux_fc.py::test_split_k_decode_shape[T17-cuda]",
    ],
    "tree_attention": ["tests/test_tree_attention.py::test_matches_reference[tree-bf16-cuda]"],
    "tree_attention_paged": ["tests/test_tree_attention.py::test_paged_matches_contiguous[page16-bf16-cuda]"],
    "build_tree": ["tests/test_tree_ops.py::test_build_random_trees_match_reference[bs3-N16-mode0-cuda]"],
    "verify_tree_greedy": ["tests/test_tree_ops.py::test_greedy_random_trees_match_reference[tree-cuda]"],
    "speculative_sampling": ["tests/test_tree_ops.py::test_sampling_random_trees_match_reference[tree-exact-cuda]"],
    "speculative_sampling_draft_probs": [
        "tests/test_tree_sampling_draft_probs.py::test_random_trees_match_reference[tree-mixed-cuda]",
    ],
}
RACECHECK_OPS = ["tree_attention", "speculative_sampling_draft_probs"]


@dataclass
class Item:
    """One prerequisite and what was found for it."""
    name: str
    kind: str                     # tool | python | gpu | cuda
    ok: bool
    detail: str
    path: str = ""
    install: str = ""             # the pip requirement the wheelhouse provides, when missing
    gpu_only: bool = False        # needed by the steps that run on the GPU, not by the build
    optional: bool = False


def version_tuple(text: str) -> Tuple[int, ...]:
    parts = re.match(r"(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in parts.group(1).split(".")) if parts else ()


def dotted(numbers: Sequence[int]) -> str:
    return ".".join(str(n) for n in numbers)


def run_text(cmd: List[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_in(wheelhouse: str, requirement: str) -> str:
    """The first wheel in `wheelhouse` named like the requirement's project ('' if none)."""
    project = normalized(re.split(r"[<>=!~\[ ;]", requirement, 1)[0])
    for path in sorted(glob.glob(os.path.join(wheelhouse, "*.whl"))):
        if normalized(os.path.basename(path).split("-", 1)[0]) == project:
            return path
    return ""


def cuda_home_candidates() -> List[str]:
    homes = [os.environ.get(k, "") for k in ("CUDA_HOME", "CUDA_PATH")]
    if not any(homes):
        homes.append("/usr/local/cuda")
    return [h for h in homes if h]


def find_nvcc() -> str:
    for candidate in [os.environ.get("CUDACXX", ""), shutil.which("nvcc") or ""] + [
            os.path.join(h, "bin", "nvcc") for h in cuda_home_candidates()]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return ""


def find_sanitizer(nvcc: str) -> str:
    dirs = [os.path.join(h, sub) for h in cuda_home_candidates() for sub in ("bin", "compute-sanitizer")]
    if nvcc:  # the toolkit nvcc belongs to, also when nvcc is a wrapper script elsewhere
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        dirs += [os.path.join(home, "bin"), os.path.join(home, "compute-sanitizer")]
    for candidate in [shutil.which("compute-sanitizer") or ""] + [os.path.join(d, "compute-sanitizer") for d in dirs]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return ""


def pip_tool(module: str, attr: str, binary: str) -> str:
    """The binary a pip-installed `cmake` or `ninja` package carries ('' if not installed)."""
    if importlib.util.find_spec(module) is None:
        return ""
    try:
        path = os.path.join(getattr(__import__(module), attr), binary)
    except Exception:  # a broken install counts as none
        return ""
    return path if os.access(path, os.X_OK) else ""


def check_tools(wheelhouse: str) -> Tuple[List[Item], str, str]:
    items = []
    nvcc = find_nvcc()
    nvcc_version = ""
    if nvcc:
        found = re.search(r"release (\d+\.\d+)", run_text([nvcc, "--version"]))
        nvcc_version = found.group(1) if found else ""
        items.append(Item("nvcc", "tool", bool(found), f"CUDA {nvcc_version}" if found else "no version reported",
                          nvcc))
    else:
        items.append(Item("nvcc", "tool", False, "not found (CUDACXX, PATH, CUDA_HOME/bin)"))

    # scikit-build-core takes the first CMake that is new enough, the cmake package's first.
    cmakes = [p for p in (pip_tool("cmake", "CMAKE_BIN_DIR", "cmake"), shutil.which("cmake") or "") if p]
    seen = []
    for path in cmakes:
        version = version_tuple(run_text([path, "--version"]).replace("cmake version ", ""))
        seen.append(f"{dotted(version) or '?'} ({path})")
        if version >= CMAKE_MINIMUM:
            items.append(Item("cmake", "tool", True, dotted(version), path))
            break
    else:
        why = f"only {', '.join(seen)}, needs >= {dotted(CMAKE_MINIMUM)}" if seen else "not found"
        items.append(Item("cmake", "tool", False, why))

    ninja = pip_tool("ninja", "BIN_DIR", "ninja") or shutil.which("ninja") or ""
    items.append(Item("ninja", "tool", bool(ninja), run_text([ninja, "--version"]).strip() if ninja else "not found",
                      ninja))

    sanitizer = find_sanitizer(nvcc)
    items.append(Item("compute-sanitizer", "tool", bool(sanitizer),
                      "found" if sanitizer else "not found (PATH, the CUDA toolkit's bin/ and compute-sanitizer/)",
                      sanitizer, gpu_only=True))

    compilers = [os.environ.get("CXX", "")] + ["c++", "g++", "clang++"]
    cxx = next((shutil.which(c) for c in compilers if c and shutil.which(c)), "")
    items.append(Item("C++ compiler", "tool", bool(cxx),
                      run_text([cxx, "--version"]).splitlines()[0] if cxx else "not found (CXX, c++, g++, clang++)",
                      cxx or ""))

    for item in items:
        if not item.ok and item.name in TOOL_WHEELS:
            item.install = TOOL_WHEELS[item.name] if wheel_in(wheelhouse, TOOL_WHEELS[item.name]) else ""
    return items, nvcc, nvcc_version


def check_packages(wheelhouse: str, archs: str) -> List[Item]:
    items = []
    for pkg in PACKAGES:
        # CUTLASS matters only where the sm_90a kernel is built.
        optional = pkg.optional or (pkg.dist == "nvidia-cutlass" and bool(archs) and "90a" not in archs)
        if importlib.util.find_spec(pkg.module) is None:
            ok, detail = False, f"not installed; needed for {pkg.why}"
        else:
            try:
                version = importlib.metadata.version(pkg.dist)
            except importlib.metadata.PackageNotFoundError:
                version = "?"
            ok = not pkg.minimum or version_tuple(version) >= pkg.minimum
            detail = version if ok else f"{version} installed, needs >= {dotted(pkg.minimum)}"
        item = Item(pkg.dist, "python", ok, detail, optional=optional)
        if not ok and wheel_in(wheelhouse, pkg.requirement):
            item.install = pkg.requirement
        items.append(item)
    return items


def check_torch(nvcc_version: str) -> Tuple[List[Item], Dict[str, object]]:
    """torch with CUDA, a visible GPU, and nvcc's CUDA against the one torch was built with."""
    facts: Dict[str, object] = {}
    try:
        import torch
    except Exception as error:  # no torch, or a broken one: everything below is missing too
        return [Item("torch with CUDA", "python", False, f"cannot import torch: {error}"),
                Item("GPU", "gpu", False, "no torch to ask", gpu_only=True),
                Item("CUDA versions", "cuda", False, f"nvcc {nvcc_version or '?'}, torch ?")], facts
    facts["torch"] = torch.__version__
    facts["torch_cuda"] = torch.version.cuda
    facts["torch_lib"] = os.path.join(os.path.dirname(torch.__file__), "lib")
    items = [Item("torch with CUDA", "python", bool(torch.version.cuda),
                  f"{torch.__version__}, CUDA {torch.version.cuda}" if torch.version.cuda
                  else f"{torch.__version__} is a CPU-only build")]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        facts["gpu"] = torch.cuda.get_device_name()
        facts["capability"] = f"{major}.{minor}"
        facts["gpu_archs"] = f"{major}{minor}a" if major >= 9 else f"{major}{minor}"
        items.append(Item("GPU", "gpu", True, f"{facts['gpu']} (sm_{major}{minor})", gpu_only=True))
    else:
        items.append(Item("GPU", "gpu", False, "no GPU visible (torch.cuda.is_available() is False)", gpu_only=True))
    nvcc_major = nvcc_version.split(".")[0]
    torch_major = (torch.version.cuda or "").split(".")[0]
    same = bool(nvcc_major) and nvcc_major == torch_major
    detail = f"nvcc {nvcc_version or '?'}, torch {torch.version.cuda or 'none'}"
    if not nvcc_version:
        detail += ": no nvcc to compare"
    elif not same:
        detail += ": the major versions must match"
    elif nvcc_version != torch.version.cuda:
        detail += ": same major version, minor differs (works)"
    items.append(Item("CUDA versions", "cuda", same, detail))
    return items, facts


def cudart_dirs(torch_lib: str) -> List[str]:
    """Directories holding the CUDA runtime torch came with (the nvidia-* wheels' or torch/lib)."""
    site = os.path.dirname(os.path.dirname(torch_lib))
    patterns = [os.path.join(site, "nvidia", "*", "lib", "libcudart.so*"), os.path.join(torch_lib, "libcudart*.so*")]
    found = [os.path.dirname(p) for pattern in patterns for p in sorted(glob.glob(pattern))]
    return list(dict.fromkeys(found))


def prereqs(args: argparse.Namespace) -> int:
    requested = os.environ.get("EAGLE3_CUDA_ARCHS", "")
    tools, nvcc, nvcc_version = check_tools(args.wheelhouse)
    torch_items, facts = check_torch(nvcc_version)
    archs = requested or str(facts.get("gpu_archs", ""))
    items = tools + torch_items + check_packages(args.wheelhouse, archs)
    if any(i.install for i in items) and importlib.util.find_spec("pip") is None:
        items.append(Item("pip", "python", False, "needed to install from the wheelhouse"))

    rehearsal = args.rehearsal and "gpu" not in facts  # with a GPU, all of it is needed

    def fatal(item: Item) -> bool:
        return not item.ok and not item.install and not item.optional and not (rehearsal and item.gpu_only)

    missing = [i.name for i in items if not i.ok and not i.optional]
    blocking = [i.name for i in items if fatal(i)]
    print(f"prerequisites (Python {sys.version.split()[0]} at {sys.executable}):")
    for item in items:
        state = "ok" if item.ok else "install" if item.install else "optional" if item.optional else "MISSING"
        where = f" [{item.path}]" if item.path else ""
        plan = f"; {item.install} from {args.wheelhouse}/" if item.install else ""
        print(f"  {state:8} {item.name}: {item.detail}{where}{plan}")
    to_install = list(dict.fromkeys(i.install for i in items if i.install))
    if to_install:
        print(f"to install from {args.wheelhouse}/: {', '.join(to_install)}")
    print(f"missing: {', '.join(missing)}" if missing else "missing: nothing")
    if blocking:
        print(f"not in the wheelhouse: {', '.join(blocking)}")
    if rehearsal:
        print("rehearsal: no GPU visible, the steps that need one will be skipped")

    result = {
        "python": sys.version.split()[0], "python_executable": sys.executable, "rehearsal": rehearsal,
        "items": [asdict(i) for i in items], "found": [i.name for i in items if i.ok], "missing": missing,
        "blocking": blocking, "to_install": to_install,
        "optional_missing": [i.name for i in items if not i.ok and i.optional],
        "versions": {"nvcc_cuda": nvcc_version, **{k: v for k, v in facts.items() if k != "torch_lib"},
                     **{i.name: i.detail for i in items if i.ok and i.kind in ("python", "tool")}},
        "archs": archs,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.env:
        paths = {i.name: i.path for i in items}
        values = {
            "CUDACXX": nvcc, "COMPUTE_SANITIZER": paths.get("compute-sanitizer", ""), "BUILD_ARCHS": archs,
            "GPU_VISIBLE": "1" if "gpu" in facts else "0", "TORCH_LIB": str(facts.get("torch_lib", "")),
            "CUDART_DIRS": ":".join(cudart_dirs(str(facts["torch_lib"]))) if "torch_lib" in facts else "",
            "INSTALL_DEPS": " ".join(r for r in to_install if r not in ALONE),
            "INSTALL_NO_DEPS": " ".join(r for r in to_install if r in ALONE),
        }
        with open(args.env, "w") as f:
            f.writelines(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
    return 1 if blocking else 0


def wheels(names: Sequence[str]) -> int:
    """Print `requirement<TAB>deps|nodeps` for prepare_wheelhouse.sh: the named packages, all of them,
    or by default all but the optional ones."""
    table = {p.wheel: (p.requirement, p.no_deps) for p in PACKAGES}
    table.update({name: (req, False) for name, req in TOOL_WHEELS.items()})
    default = [name for name in table if name not in {p.wheel for p in PACKAGES if p.optional}]
    chosen = default if not names else list(table) if list(names) == ["all"] else list(names)
    unknown = [n for n in chosen if n not in table]
    if unknown:
        print(f"unknown package {', '.join(unknown)}; choose from: {', '.join(table)} or all", file=sys.stderr)
        return 2
    for name in chosen:
        requirement, no_deps = table[name]
        print(f"{requirement}\t{'nodeps' if no_deps else 'deps'}")
    return 0


def junit_counts(path: str) -> Dict[str, int]:
    """Counts from pytest's JUnit XML: tests, passed, failed, errors, skipped."""
    if not os.path.exists(path):
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return {}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {}
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def read_rows(path: str) -> List[List[str]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def read_json(path: str) -> Optional[object]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def sanitizer_outcome(status: str, log: str) -> Dict[str, object]:
    """One sanitizer run: the step's status refined by what compute-sanitizer and pytest printed."""
    text = ""
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            text = f.read()
    errors = re.search(r"ERROR SUMMARY: (\d+) error", text)
    outcome: Dict[str, object] = {"status": status, "log": os.path.basename(log),
                                  "sanitizer_errors": int(errors.group(1)) if errors else None}
    if status == "ok":
        outcome["status"] = "skipped" if re.search(r"\d+ skipped", text) and " passed" not in text else "passed"
    elif errors and int(errors.group(1)) > 0:
        outcome["status"] = "sanitizer errors"
    elif status == "failed":
        outcome["status"] = "test failed" if re.search(r"\d+ failed", text) else "failed"
    return outcome


def report(out_dir: str) -> int:
    """Write OUT_DIR/gpu_report.json from the files the steps left there; print its path."""
    steps = [{"name": r[0], "status": r[1], "exit_code": int(r[2]), "seconds": int(r[3]), "log": r[4],
              "note": r[5] if len(r) > 5 else ""} for r in read_rows(os.path.join(out_dir, "steps.tsv"))]
    first = read_json(os.path.join(out_dir, "prereqs.json")) or {}
    final = read_json(os.path.join(out_dir, "prereqs_after_install.json")) or first
    installed = [r[0] for r in read_rows(os.path.join(out_dir, "installed.tsv"))]
    by_name = {s["name"]: s for s in steps}
    sanitizer: Dict[str, Dict[str, object]] = {}
    for op, tool, status, seconds, log in read_rows(os.path.join(out_dir, "sanitizer.tsv")):
        outcome = sanitizer_outcome(status, os.path.join(out_dir, log))
        outcome["seconds"] = int(seconds)
        outcome["tests"] = SANITIZER_NODES.get(op, [])
        sanitizer.setdefault(op, {})[tool] = outcome
    benchmarks = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*_cuda.json"))):
        loaded = read_json(path)
        if isinstance(loaded, dict):
            benchmarks[os.path.basename(path)[:-5]] = loaded
    tests = by_name.get("cuda_tests", {})
    meta = dict(read_rows(os.path.join(out_dir, "run.tsv")))
    failed = [s["name"] for s in steps if s["status"] in ("failed", "timeout")]
    result = {
        "status": "failed" if failed or final.get("blocking") else "rehearsal" if meta.get("rehearsal") == "1"
        else "passed",
        "failed_steps": failed,
        "rehearsal": meta.get("rehearsal") == "1",
        "archs": meta.get("archs", final.get("archs", "")),
        "total_seconds": int(meta.get("total_seconds", 0)),
        "prerequisites": {"found": final.get("found", []), "missing": final.get("missing", []),
                          "missing_before_install": first.get("missing", []), "installed": installed,
                          "optional_missing": final.get("optional_missing", []), "items": final.get("items", [])},
        "versions": final.get("versions", {}),
        "steps": steps,
        "build": {"seconds": by_name.get("build", {}).get("seconds"), "status": by_name.get("build", {}).get("status"),
                  "info": read_json(os.path.join(out_dir, "build_info.json"))},
        "cuda_tests": junit_counts(os.path.join(out_dir, "cuda_tests.xml")),
        "cuda_tests_exit_code": tests.get("exit_code"),
        "sanitizer": sanitizer,
        "benchmarks": benchmarks,
    }
    path = os.path.join(out_dir, "gpu_report.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(path)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prereqs", help="check the prerequisites; exit 1 when one is missing")
    p.add_argument("--wheelhouse", default=".whl", help="directory of wheels to install missing packages from")
    p.add_argument("--json", default="", help="write the findings here")
    p.add_argument("--env", default="", help="write the paths the later steps use here, as shell assignments")
    p.add_argument("--rehearsal", action="store_true", help="no GPU: what only the GPU steps need is not fatal")
    w = sub.add_parser("wheels", help="the requirements prepare_wheelhouse.sh downloads")
    w.add_argument("names", nargs="*")
    sub.add_parser("cuda-test-files", help="the test files with CUDA-marked tests")
    sub.add_parser("sanitizer-runs", help="op<TAB>tool<TAB>node ids, one line per compute-sanitizer run")
    r = sub.add_parser("report", help="write OUT_DIR/gpu_report.json")
    r.add_argument("out_dir")
    args = parser.parse_args(argv)
    if args.command == "prereqs":
        return prereqs(args)
    if args.command == "wheels":
        return wheels(args.names)
    if args.command == "cuda-test-files":
        print(" ".join(CUDA_TEST_FILES))
        return 0
    if args.command == "sanitizer-runs":
        for op, nodes in SANITIZER_NODES.items():
            for tool in ["memcheck"] + (["racecheck"] if op in RACECHECK_OPS else []):
                print(f"{op}\t{tool}\t{' '.join(nodes)}")
        return 0
    return report(args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
