import json
import os
import subprocess
import time

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from tiny_models import make_trained_pair
from torchrun import torchrun_command

HERE = os.path.dirname(os.path.abspath(__file__))
pytest.importorskip("accelerate")  # transformers' tensor parallelism needs it


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp")
    make_trained_pair(str(d), layers=4)
    return d


def torchrun(args, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run(torchrun_command(2) + list(args),
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_tp2_matches_plain_greedy_and_tp1(pair, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import tp_worker

    run = torchrun([os.path.join(HERE, "tp_worker.py"), str(tmp_path), str(pair / "target"), str(pair / "draft"),
                    "ok"], timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weight_type"] == "DTensor"  # the target really is sharded
    assert ranks[0] == ranks[1]  # every rank agrees (the worker also checked with an all-gather)
    assert ranks[0]["spec"] == ranks[0]["plain"]  # speculative == plain greedy under TP=2
    assert ranks[0]["acceptance_length"] > 1.0
    # ... and == TP=1, one process.
    tok = AutoTokenizer.from_pretrained(pair / "target")
    target = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).eval()
    draft = Eagle3DraftModel.from_pretrained(str(pair / "draft"), target_config=target.config)
    single = SpeculativeGenerator(target, draft, TreeConfig(depth=3, topk=2, num_draft_tokens=6), tokenizer=tok)
    assert single.generate(tp_worker.PROMPTS, max_new_tokens=16, eos_token_id=[],
                           return_dict_in_generate=True).new_tokens == ranks[0]["spec"]


def test_cli_under_torchrun_prints_once(pair):
    run = torchrun(["-m", "eagle3_ext", "generate", "--target", str(pair / "target"), "--draft", str(pair / "draft"),
                    "--prompt", "def print return", "--max-new-tokens", "8", "--json", "--check-ranks", "--baseline"],
                   timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # only rank 0 prints
    report = json.loads(lines[0])
    assert report["world_size"] == 2 and report["identical"] is True


def test_hung_rank_is_an_error_in_bounded_time(pair, tmp_path):
    started = time.time()
    run = torchrun([os.path.join(HERE, "tp_worker.py"), str(tmp_path), str(pair / "target"), str(pair / "draft"),
                    "hang"], timeout=300)
    elapsed = time.time() - started
    assert run.returncode != 0
    assert elapsed < 120, f"took {elapsed:.0f} s"
    assert "timed out" in run.stderr.lower() or "timeout" in run.stderr.lower(), run.stderr[-3000:]
