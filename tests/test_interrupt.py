"""Ctrl-C (SIGINT) during `eagle3 generate`, `bench` and `train`: exit code 130, one line and no
traceback, and what was finished is kept: the streamed text, the finished bench rows, a training
checkpoint that `--resume` continues to the same weights as a run never interrupted."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from tiny_models import make_trained_pair, make_training_inputs

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("interrupt")
    make_trained_pair(str(d), layers=4)
    return d


class Cli:
    """``python -m eagle3_ext ...`` in a subprocess whose output lines are collected as they come."""

    def __init__(self, *args: str):
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p]))
        # A runner started in the background (nohup, `&` in a script) ignores SIGINT, and a child
        # inherits that: restore the default so the interrupt reaches the command under test.
        self.proc = subprocess.Popen([sys.executable, "-m", "eagle3_ext", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.out, self.err = [], []
        self._readers = [threading.Thread(target=self._read, args=(s, sink), daemon=True)
                         for s, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, sink):
        while True:
            chunk = stream.read(1)  # character by character: streamed text has no newline to wait for
            if not chunk:
                return
            sink.append(chunk)

    def wait_for(self, stream: str, needle: str, timeout: float = 120.0) -> None:
        sink = self.out if stream == "stdout" else self.err
        deadline = time.time() + timeout
        while needle not in "".join(sink):
            assert self.proc.poll() is None, f"exited ({self.proc.returncode}) before {needle!r}: {''.join(self.err)}"
            assert time.time() < deadline, f"no {needle!r} in {timeout} s: {''.join(self.err)[-2000:]}"
            time.sleep(0.01)

    def interrupt(self, timeout: float = 120.0):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=timeout)
        for r in self._readers:
            r.join(timeout=10)
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def finish(self, timeout: float = 300.0):
        self.proc.wait(timeout=timeout)
        for r in self._readers:
            r.join(timeout=10)
        return self.proc.returncode, "".join(self.out), "".join(self.err)


def test_ctrl_c_during_generate_keeps_the_streamed_text(pair):
    # --baseline decodes a second time after the speculative run, so the process is still busy
    # when the first streamed text arrives.
    cli = Cli("generate", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompt",
              "def print return", "--max-new-tokens", "400", "--baseline")
    cli.wait_for("stdout", " ")
    rc, out, err = cli.interrupt()
    assert rc == 130, err
    assert "Traceback" not in err, err
    assert err.rstrip().endswith("eagle3 generate: interrupted"), err
    assert out.strip()  # what was streamed before the interrupt stays on stdout


def test_ctrl_c_during_bench_keeps_the_finished_batch_sizes(pair, tmp_path):
    out_dir = tmp_path / "bench"
    cli = Cli("bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--num-prompts", "2",
              "--batch-sizes", "1", "2", "--max-new-tokens", "200", "--tree", "3,2,6", "--out", str(out_dir),
              "--no-compiled-baseline", "--no-llama-cpp")
    cli.wait_for("stderr", "batch 1 ")
    rc, _, err = cli.interrupt()
    assert rc == 130, err
    assert "Traceback" not in err, err
    assert f"the finished batch sizes are in {out_dir}/bench.json" in err
    report = json.loads((out_dir / "bench.json").read_text())
    assert report["interrupted"] is True
    assert [run["batch_size"] for run in report["runs"]] == [1]


@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory):
    return make_training_inputs(tmp_path_factory.mktemp("train_interrupt"))


def train_args(inputs, out, *extra):
    return ["train", "--target", str(inputs / "target"), "--data", str(inputs / "data.txt"), "--out", str(out),
            "--ttt-steps", "2", "--batch-tokens", "256", "--max-len", "32", "--max-steps", "12", "--eval-every", "1",
            "--val-examples", "4", "--lr", "1e-2", "--no-specforge-export", "--no-vllm-export", *extra]


def test_ctrl_c_during_train_saves_a_checkpoint_that_resumes_to_the_same_weights(train_inputs, tmp_path):
    whole = Cli(*train_args(train_inputs, tmp_path / "whole"))
    rc, _, err = whole.finish()
    assert rc == 0, err

    cut = Cli(*train_args(train_inputs, tmp_path / "cut"))
    cut.wait_for("stderr", "step 2:")
    rc, _, err = cut.interrupt()
    assert rc == 130, err
    assert "Traceback" not in err, err
    assert "continues with --resume" in err, err
    state = torch.load(tmp_path / "cut" / "checkpoint" / "trainer_state.pt", weights_only=False)
    stopped_at = state["state"]["step"]
    assert 2 <= stopped_at < 12, stopped_at  # the running step finished, the rest did not run

    resumed = Cli(*train_args(train_inputs, tmp_path / "cut", "--resume"))
    rc, _, err = resumed.finish()
    assert rc == 0, err
    assert f"step {stopped_at + 1}:" in err and "step 1:" not in err  # it continued, it did not restart
    want = load_file(str(tmp_path / "whole" / "model.safetensors"))
    got = load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
