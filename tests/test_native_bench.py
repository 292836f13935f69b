import json
import os
import subprocess
import sys

import pytest

import eagle3_ext

BINARY = os.path.join(os.path.dirname(eagle3_ext.__file__), "bin", "eagle3_bench")
HERE = os.path.dirname(os.path.abspath(__file__))

needs_binary = pytest.mark.skipif(not os.path.exists(BINARY), reason="eagle3_bench is installed by the package build")


@needs_binary
def test_tiny_preset_runs_on_cpu_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    run = subprocess.run([BINARY, "--preset", "tiny", "--repeat", "3", "--warmup", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["preset"] == "tiny"
    assert [r["op"] for r in report["results"]] == ["fused_aux_fc", "tree_attention", "verify_tree_greedy"]
    for r in report["results"]:
        assert r["op_ms"]["min"] <= r["op_ms"]["median"] <= r["op_ms"]["max"]
        assert r["baseline_ms"]["median"] > 0 and r["speedup"] > 0
    assert "fused_aux_fc" in run.stdout and "speedup" in run.stdout  # the human-readable table

    md = subprocess.run([sys.executable, os.path.join(HERE, "..", "benchmarks", "report_to_markdown.py"), str(out)],
                        capture_output=True, text=True, timeout=60)
    assert md.returncode == 0 and "| op |" in md.stdout and "verify_tree_greedy" in md.stdout


@needs_binary
@pytest.mark.parametrize("args, message", [
    (["--bogus", "1"], "unknown argument --bogus"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--repeat", "0"], "--repeat expects a positive integer"),
    (["--shape", "X=3"], "unknown shape key 'X'"),
    (["--op", "softmax"], "unknown --op 'softmax'"),
    (["--dtype"], "missing value after --dtype"),
])
def test_bad_arguments_print_usage_and_fail(args, message):
    run = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert message in run.stderr and "usage: eagle3_bench" in run.stderr


@needs_binary
@pytest.mark.parametrize("shape", ["W=4,Dv=32,sinks=1,softcap=5", "D=48,Dv=80"], ids=["window-sinks-softcap", "mla-dims"])
def test_tree_attention_feature_shapes(tmp_path, shape):
    out = tmp_path / "report.json"
    run = subprocess.run([BINARY, "--preset", "tiny", "--op", "tree_attention", "--shape", shape, "--repeat", "2",
                          "--warmup", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(out.read_text())["results"]
    for item in shape.split(","):
        key, value = item.split("=")
        if key in ("W", "Dv", "softcap"):
            assert f"{key}={value}" in result["shape"]
    assert result["speedup"] > 0


@needs_binary
@pytest.mark.parametrize("preset", ["decode-dsv3", "decode-kimi-k2", "decode-gpt-oss", "decode-mistral-swa"])
def test_modern_attention_presets_are_listed(preset):
    run = subprocess.run([BINARY, "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and preset in run.stdout
