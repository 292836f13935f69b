"""``torchrun -m eagle3_ext train`` with data parallelism (gloo, 2 CPU processes): the same losses
per step and the same final draft as one process on the same global batches, also when a batch
has fewer examples than ranks."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tiny_models import make_training_inputs
from torchrun import torchrun_command

COMMON = ["--max-len", "32", "--ttt-steps", "3", "--no-specforge-export", "--no-vllm-export", "--json"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return make_training_inputs(tmp_path_factory.mktemp("dp"), lines=120, seed=1)


def _train(setup, out, nproc, extra):
    args = ["-m", "eagle3_ext", "train", "--target", str(setup / "target"), "--data", str(setup / "data.txt"),
            "--out", str(out), *COMMON, *extra]
    launcher = [sys.executable] if nproc == 1 else torchrun_command(nproc)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # gloo: CPU processes
    run = subprocess.run(launcher + args, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, run.stdout  # rank 0 alone reports
    final = json.loads(lines[0])
    assert final["world_size"] == nproc and final["train_tokens_per_s"] > 0
    assert len(final["peak_memory_mib_per_rank"]) == nproc and min(final["peak_memory_mib_per_rank"]) > 0
    with open(out / "metrics.json") as f:
        return json.load(f), load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("batch_tokens", ["256", "32"], ids=["8-per-batch", "fewer-than-ranks"])
def test_two_ranks_match_one_process(setup, tmp_path, batch_tokens):
    extra = ["--max-steps", "6", "--eval-every", "3", "--batch-tokens", batch_tokens]
    one, w1 = _train(setup, tmp_path / "one", 1, extra)
    two, w2 = _train(setup, tmp_path / "two", 2, extra)
    assert two["world_size"] == 2 and one["world_size"] == 1
    steps1 = [s["loss"] for s in one["train_loss"]]
    steps2 = [s["loss"] for s in two["train_loss"]]
    assert len(steps1) == len(steps2) == 6
    assert max(abs(a - b) for a, b in zip(steps1, steps2)) < 1e-5
    assert [e["val_loss"] for e in two["evals"]] == pytest.approx([e["val_loss"] for e in one["evals"]], abs=1e-5)
    assert steps1[0] != steps1[-1]  # training moved the draft
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=1e-5)


def test_resume_at_another_world_size(setup, tmp_path):
    """Three steps on two processes, then --resume on one, equals the same on one process throughout."""
    first = ["--max-steps", "3", "--eval-every", "3", "--batch-tokens", "256"]
    then = ["--max-steps", "6", "--eval-every", "3", "--batch-tokens", "256", "--resume"]
    _train(setup, tmp_path / "ref", 1, first)
    ref, w_ref = _train(setup, tmp_path / "ref", 1, then)
    _train(setup, tmp_path / "mixed", 2, first)
    mixed, w_mixed = _train(setup, tmp_path / "mixed", 1, then)
    assert [s["step"] for s in mixed["train_loss"]] == list(range(1, 7))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(ref["train_loss"], mixed["train_loss"])) < 1e-5
    for name in w_ref:
        torch.testing.assert_close(w_mixed[name], w_ref[name], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("nproc,tp", [(2, 2), (4, 2)], ids=["tp2", "tp2xdp2"])
def test_tensor_parallel_target_matches_one_process(setup, tmp_path, nproc, tp):
    """The target sharded over 2 ranks (alone, or as 2 replicas of TP 2 with the draft data
    parallel over them) trains the draft as one process does."""
    extra = ["--max-steps", "4", "--eval-every", "2", "--batch-tokens", "256"]
    one, w1 = _train(setup, tmp_path / "one", 1, extra)
    many, w2 = _train(setup, tmp_path / "many", nproc, extra + ["--tp-size", str(tp)])
    assert many["layout"] == f"TP {tp} x DP {nproc // tp}"
    a, b = [s["loss"] for s in one["train_loss"]], [s["loss"] for s in many["train_loss"]]
    assert len(a) == len(b) == 4 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=1e-5)


def _capture(setup, out, nproc, extra=()):
    args = ["-m", "eagle3_ext", "train", "capture", "--target", str(setup / "target"), "--data",
            str(setup / "data.txt"), "--out", str(out), "--max-len", "32", "--batch-tokens", "256", "--json", *extra]
    launcher = [sys.executable] if nproc == 1 else torchrun_command(nproc)
    run = subprocess.run(launcher + args, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
    assert run.returncode == 0, run.stderr[-3000:]
    with open(out / "manifest.json") as f:
        manifest = json.load(f)
    tensors = {}
    for entry in manifest["examples"]:
        shard = load_file(str(out / entry["shard"]))
        tensors.update({f"{entry['key']}.{k.split('.', 1)[1]}": v for k, v in shard.items()
                        if k.startswith(entry["key"] + ".")})
    return manifest, tensors


@pytest.mark.parametrize("nproc,extra", [(2, ["--tp-size", "2"]), (2, [])], ids=["tp2", "dp2"])
def test_distributed_capture_matches_one_process(setup, tmp_path, nproc, extra):
    """The captured states and logits are the same with the target sharded (TP 2) or the data
    split (DP 2) as in one process."""
    m1, t1 = _capture(setup, tmp_path / "one", 1)
    m2, t2 = _capture(setup, tmp_path / "many", nproc, extra)
    assert [(e["key"], e["split"], e["length"]) for e in m1["examples"]] == \
        [(e["key"], e["split"], e["length"]) for e in m2["examples"]]
    if not extra:
        assert len({e["shard"] for e in m2["examples"]}) == 2  # one shard file per replica
    assert t1.keys() == t2.keys()
    for key in t1:
        torch.testing.assert_close(t2[key], t1[key], atol=1e-5, rtol=1e-5)
