"""benchmarks/gpu_check.sh's parts that run without a GPU: the prerequisite check, the
wheelhouse lookup and download commands, the sanitizer test list and the report writer."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.sh")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_check_support as support  # noqa: E402
import report_to_markdown  # noqa: E402

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what is reported when no GPU is visible")


def check_only(tmp_path, **env):
    """Run `gpu_check.sh --check-only`; return (exit code, seconds, output, prereqs.json)."""
    full = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"),
                EAGLE3_WHEELHOUSE=str(tmp_path / "no-wheelhouse"), **env)
    full.pop("EAGLE3_CUDA_ARCHS", None)
    start = time.monotonic()
    run = subprocess.run(["bash", SCRIPT, "--check-only"], cwd=ROOT, env=full, capture_output=True, text=True,
                         timeout=120)
    seconds = time.monotonic() - start
    with open(tmp_path / "out" / "prereqs.json") as f:
        return run.returncode, seconds, run.stdout + run.stderr, json.load(f)


def missing_line(output):
    return next(line for line in output.splitlines() if line.startswith("missing:"))


@no_gpu
def test_check_only_fails_fast_listing_the_gpu(tmp_path):
    rc, seconds, output, found = check_only(tmp_path)
    assert rc == 1, output
    assert seconds < 30, f"the prerequisite check took {seconds:.0f} s"
    assert "GPU" in missing_line(output).split(": ", 1)[1].split(", ")
    assert "no GPU visible" in output
    assert "GPU" in found["blocking"] and found["versions"]["torch"] == torch.__version__


@no_gpu
def test_a_path_without_nvcc_lists_nvcc(tmp_path):
    # Only the commands the script itself runs before the check ends; no CUDA toolkit anywhere.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ["bash", "dirname", "mkdir", "timeout", "tail", "tr", "cut", "cat"]:
        os.symlink(shutil.which(tool), bin_dir / tool)
    empty = tmp_path / "no-cuda"
    empty.mkdir()
    rc, _, output, found = check_only(tmp_path, PATH=str(bin_dir), CUDA_HOME=str(empty), CUDACXX="")
    missing = missing_line(output)
    assert rc == 1 and "nvcc" in missing and "GPU" in missing, output
    assert "CUDA versions" in missing and "compute-sanitizer" in missing
    assert {i["name"]: i["ok"] for i in found["items"]}["nvcc"] is False


def test_missing_packages_come_from_the_wheelhouse_by_project_name(tmp_path):
    for name in ["scikit_build_core-1.1.2-py3-none-any.whl", "nvidia_cutlass-4.2.0.0-py3-none-any.whl",
                 "cmake-4.1.0-py3-none-manylinux2014_x86_64.whl"]:
        (tmp_path / name).touch()
    found = support.wheel_in(str(tmp_path), "scikit-build-core>=0.10")
    assert found.endswith("scikit_build_core-1.1.2-py3-none-any.whl")
    assert support.wheel_in(str(tmp_path), "nvidia-cutlass==4.2.0.0")
    assert support.wheel_in(str(tmp_path), "cmake>=3.26")
    assert not support.wheel_in(str(tmp_path), "pybind11>=2.12")
    assert not support.wheel_in(str(tmp_path / "absent"), "cmake")


def test_prepare_wheelhouse_downloads_binary_cp312_wheels(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "prepare_wheelhouse.sh")
    env = dict(os.environ, PYTHON=sys.executable)
    run = subprocess.run(["bash", script, "--dry-run", "--dest", str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    commands = [line for line in run.stdout.splitlines() if line.startswith("+ ")]
    for command in commands:
        assert "--only-binary=:all: --python-version 3.12" in command and "manylinux2014_x86_64" in command
        assert f"-d {tmp_path}" in command
    cutlass = [c for c in commands if "nvidia-cutlass==4.2.0.0" in c]
    assert len(cutlass) == 1 and cutlass[0].endswith("--no-deps")
    requirements = [c.split()[-1] for c in commands]
    assert "pytest>=8" in requirements and "cmake>=3.26" in requirements  # with their dependencies
    assert not any(r.startswith(("numpy", "transformers")) for r in requirements)  # only when asked for

    chosen = subprocess.run(["bash", script, "--dry-run", "pytest", "numpy"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert [c.split()[-1] for c in chosen.stdout.splitlines()] == ["pytest>=8", "numpy"]
    bad = subprocess.run(["bash", script, "--dry-run", "torch"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown package torch" in bad.stderr


def test_cuda_test_files_hold_every_cuda_test():
    tests = os.path.join(ROOT, "tests")
    with_cuda = set()
    for name in os.listdir(tests):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(tests, name)) as f:
                text = f.read()
            if re.search(r"^from conftest import .*\bDEVICES\b|@pytest\.mark\.cuda\b", text, re.M):
                with_cuda.add(f"tests/{name}")
    assert with_cuda <= set(support.CUDA_TEST_FILES)


def test_sanitizer_nodes_name_existing_cuda_tests():
    nodes = [n for ns in support.SANITIZER_NODES.values() for n in ns]
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *nodes],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for node in nodes:
        assert node in run.stdout and node.endswith("cuda]")
    assert set(support.RACECHECK_OPS) <= set(support.SANITIZER_NODES)


def write(path, text):
    path.write_text(text)


def test_report_gathers_steps_tests_sanitizer_and_benchmarks(tmp_path):
    rows = [("prerequisites", "ok", 0, 4, "prereqs.log", "missing: nothing"),
            ("install", "ok", 0, 6, "install.log", ""),
            ("build", "ok", 0, 95, "build.log", ""),
            ("cuda_tests", "failed", 1, 80, "cuda_tests.log", "1 failed, 479 passed"),
            ("bench_tree_ops", "timeout", 124, 60, "bench_tree_ops.log", "")]
    write(tmp_path / "steps.tsv", "".join("\t".join(map(str, r)) + "\n" for r in rows))
    write(tmp_path / "run.tsv", "rehearsal\t0\narchs\t90a\ntotal_seconds\t300\n")
    write(tmp_path / "installed.tsv", "pytest>=8\tok\n")
    prereqs = {"found": ["nvcc", "GPU"], "missing": [], "blocking": [], "optional_missing": ["numpy"], "items": [],
               "versions": {"torch": "2.11.0", "nvcc_cuda": "13.0", "torch_cuda": "13.0"}, "archs": "90a"}
    write(tmp_path / "prereqs.json", json.dumps(dict(prereqs, missing=["pytest"])))
    write(tmp_path / "prereqs_after_install.json", json.dumps(prereqs))
    write(tmp_path / "build_info.json", json.dumps({"cuda_compiled": True, "cuda_archs": ["90a"]}))
    write(tmp_path / "cuda_tests.xml", '<testsuites><testsuite tests="480" failures="1" errors="0" skipped="3"/>'
                                       "</testsuites>")
    write(tmp_path / "sanitizer.tsv", "build_tree\tmemcheck\tok\t20\tsanitizer_build_tree_memcheck.log\n"
                                      "tree_attention\tmemcheck\tfailed\t25\tsanitizer_tree_attention_memcheck.log\n"
                                      "tree_attention\tracecheck\tok\t40\tsanitizer_tree_attention_racecheck.log\n")
    write(tmp_path / "sanitizer_build_tree_memcheck.log", "1 passed in 3.1s\n========= ERROR SUMMARY: 0 errors\n")
    write(tmp_path / "sanitizer_tree_attention_memcheck.log", "1 passed\n========= ERROR SUMMARY: 2 errors\n")
    write(tmp_path / "sanitizer_tree_attention_racecheck.log", "1 skipped in 0.1s\n")
    bench = {"benchmark": "fused_aux_fc", "device": "cuda", "results": [{"T": 1, "speedup": 1.5}]}
    write(tmp_path / "fused_aux_fc_cuda.json", json.dumps(bench))

    assert support.main(["report", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["status"] == "failed" and report["failed_steps"] == ["cuda_tests", "bench_tree_ops"]
    assert report["prerequisites"]["installed"] == ["pytest>=8"]
    assert report["prerequisites"]["missing_before_install"] == ["pytest"] and report["prerequisites"]["missing"] == []
    assert report["build"]["seconds"] == 95 and report["build"]["info"]["cuda_compiled"]
    assert report["cuda_tests"] == {"tests": 480, "failures": 1, "errors": 0, "skipped": 3, "passed": 476}
    assert report["cuda_tests_exit_code"] == 1
    sanitizer = report["sanitizer"]
    assert sanitizer["build_tree"]["memcheck"]["status"] == "passed"
    assert sanitizer["tree_attention"]["memcheck"]["status"] == "sanitizer errors"
    assert sanitizer["tree_attention"]["memcheck"]["sanitizer_errors"] == 2
    assert sanitizer["tree_attention"]["racecheck"]["status"] == "skipped"
    assert report["benchmarks"] == {"fused_aux_fc_cuda": bench}
    assert [s["name"] for s in report["steps"]][:3] == ["prerequisites", "install", "build"]
    assert "fused_aux_fc_cuda" in report_to_markdown.render(report)  # the Markdown tables still read it


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_scripts_pass_shellcheck():
    scripts = [SCRIPT, os.path.join(ROOT, "benchmarks", "prepare_wheelhouse.sh")]
    run = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout
