import json

import pytest

from eagle3_ext.cli import main as cli_main
from eagle3_ext.bench.suite import BenchConfig, sweep_configs
from tiny_models import make_trained_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    make_trained_pair(str(d), layers=4, steps=30)
    (d / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in
                                               ["def print return", "class value key", "for while if else"]) + "\n")
    return d


def test_bench_writes_json_markdown_and_plot(pair, capsys):
    out = pair / "out"
    rc = cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                   str(pair / "prompts.jsonl"), "--max-new-tokens", "12", "--batch-sizes", "1", "2",
                   "--tree", "3,1,4", "3,2,6", "--out", str(out), "--no-llama-cpp", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["batch_size"] for r in report["runs"]] == [1, 2]
    methods = [r["method"] for r in report["runs"][0]["results"]]
    assert methods == ["hf_generate", "hf_prompt_lookup", "hf_static_compile", "chain3", "tree3x2n6"]
    assert report["runs"][0]["left_out"] == {"llama_cpp": "not requested"}
    compiled = report["runs"][0]["results"][2]
    # One static cache length for the prompt set: compiled once before timing, never again.
    assert compiled["compile_s"] > 0 and compiled["recompiles"] == 0 and compiled["cache_length"] % 64 == 0
    assert "lossless" in compiled and "outputs" not in compiled  # checked for divergences like the others
    assert report["machine"]["bandwidth_gb_s"] > 0 and report["machine"]["matmul_gflop_s"] > 0
    for run in report["runs"]:
        for r in run["results"]:
            assert r["tokens_per_s"] > 0
            if r["method"].startswith(("chain", "tree")):
                cost = r["round_cost"]
                assert cost["r"] > 0 and cost["decode_step_ms"] > 0 and cost["draft_step_ms"] > 0
                parts = sum(cost[k] for k in ("draft", "tree", "verify", "accept", "compact", "other"))
                assert parts == pytest.approx(cost["r"])  # the parts account for the whole round
                assert r["roofline"]["r"] > 1.0  # a verify reads the target's weights once, as a decode step does
            if r["method"] not in ("hf_generate", "hf_static_compile"):
                # Greedy: the same tokens as plain generate (the compiled one may reorder fp32 sums).
                assert r["identical"] is True
            if r["method"].startswith(("chain", "tree")):
                assert r["acceptance_length"] >= 1.0 and len(r["depth_acceptance"]) == 3
    md = (out / "bench.md").read_text()
    assert md.count("| chain3 |") == 2 and "recompilations while timed" in md and "llama_cpp left out" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_names_the_fastest(pair, capsys):
    out = pair / "sweep"
    rc = cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                   str(pair / "prompts.jsonl"), "--max-new-tokens", "8", "--sweep", "--tree", "2,1,3", "2,2,4",
                   "--no-compiled-baseline", "--num-prompts", "2", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["prompts"] == 2
    assert report["best"]["method"] in ("chain2", "tree2x2n4")
    assert "fastest on this machine" in capsys.readouterr().out


def test_sweep_grid_covers_every_depth_and_width():
    grid = sweep_configs(depths=(2, 5), topks=(1, 2, 4), nodes=(4, 16, 64), lookups=(0,))
    # chains once per depth (depth + 1 nodes); depth 2 with topk 2 holds at most 1 + 2 + 4 = 7
    # nodes, so only the 4-node tree fits; depth 5 with topk 4 holds every node count.
    assert sorted(grid) == sorted(["chain2", "chain5", "tree2x2n4", "tree2x4n4", "tree2x4n16", "tree5x2n4",
                                   "tree5x2n16", "tree5x4n4", "tree5x4n16", "tree5x4n64"])
    assert grid["chain5"].num_draft_tokens == 6 and grid["chain5"].topk == 1
    # with lookup, the chain's nodes come on top of the draft's candidates
    hybrid = sweep_configs(depths=(2,), topks=(1, 2), nodes=(4, 16), lookups=(0, 10))
    assert sorted(hybrid) == sorted(["chain2", "tree2x2n4", "chain2+lookup10", "tree2x2n4+lookup10",
                                     "tree2x2n16+lookup10"])
    assert hybrid["chain2+lookup10"].num_draft_tokens == 13 and hybrid["chain2+lookup10"].lookup_tokens == 10


def test_bench_errors(pair, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                     str(empty)]) == 2
    assert f"prompts: {empty} is empty" in capsys.readouterr().err
    assert cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                     str(pair / "prompts.jsonl"), "--tree", "3x2"]) == 2
    assert "--tree takes DEPTH,TOPK,NODES" in capsys.readouterr().err
    assert cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                     str(pair / "prompts.jsonl"), "--num-prompts", "0"]) == 2
    assert "argument --num-prompts: expected a positive integer, got 0" in capsys.readouterr().err


def test_draft_runs_in_its_own_dtype(pair, capsys):
    from eagle3_ext.bench.suite import BenchConfig, run_bench

    cfg = BenchConfig(target=str(pair / "target"), draft=str(pair / "draft"), prompts=["def print return"],
                      max_new_tokens=8, batch_sizes=(1,), out=str(pair / "bf16"), draft_dtype="bfloat16",
                      compiled_baseline=False, llama_cpp=False)
    cfg.configs = {"chain3": cfg.configs["chain5"].chain(3)}
    report = run_bench(cfg, progress=False)
    assert report["dtype"] == "float32" and report["draft_dtype"] == "bfloat16"
    assert all(r["identical"] for r in report["runs"][0]["results"])  # the target alone decides the tokens
    cfg.draft_dtype = "int8"
    with pytest.raises(ValueError, match="draft_dtype must be one of float32, bfloat16, float16, got 'int8'"):
        run_bench(cfg, progress=False)


def test_round_cost_is_counted_in_decode_steps():
    from eagle3_ext.bench.suite import round_cost
    from eagle3_ext.api.config import TreeConfig
    from eagle3_ext.api.stats import GenerationStats

    s = GenerationStats(rounds=10, draft_time_s=0.2, tree_build_time_s=0.01, verify_time_s=0.5, accept_time_s=0.02,
                        compact_time_s=0.03, guard_time_s=0.04, total_time_s=1.0)
    cost = round_cost(s, decode_step_s=0.02, tree=TreeConfig.chain(4))  # a round takes 0.1 s: five decode steps
    assert cost["r"] == pytest.approx(5.0)
    assert cost["verify"] == pytest.approx(2.5) and cost["draft"] == pytest.approx(1.0)
    assert cost["other"] == pytest.approx((1.0 - 0.76) / 10 / 0.02)  # all but the five timed parts
    assert cost["decode_step_ms"] == pytest.approx(20.0)
    assert cost["draft_step_ms"] == pytest.approx(0.2 / 10 / 4 * 1e3)  # four draft forwards a round


def test_compile_adds_a_compiled_row_per_configuration(pair, capsys, monkeypatch):
    # --compile is CompileOptions(); the environment's overrides make it the tests' FAST_COMPILE.
    for name in ("EAGLE3_COMPILE_AUTOTUNE", "EAGLE3_COMPILE_CPP_WRAPPER", "EAGLE3_COMPILE_PACKAGES"):
        monkeypatch.setenv(name, "0")
    rc = cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                   str(pair / "prompts.jsonl"), "--num-prompts", "1", "--max-new-tokens", "8", "--batch-sizes", "1",
                   "--tree", "3,1,4", "--compile", "--no-compiled-baseline", "--no-llama-cpp",
                   "--out", str(pair / "compiled"), "--json"])
    assert rc == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["runs"][0]["results"]}
    assert rows["chain3"]["compiled"] is False and rows["chain3+compiled"]["compiled"] is True
    assert rows["chain3+compiled"]["compile_s"] > 0 and rows["chain3+compiled"]["identical"] is True
    assert rows["chain3+compiled"]["timed_compile_s"] == 0  # every graph compiled in the warm-up


class _RecordingGenerator:
    """Stands in for a generator in ``_warm_up``: records each call's prompts and length."""

    def __init__(self, compiled: bool):
        self.compiled = object() if compiled else None
        self.calls = []

    def generate(self, prompts, max_new_tokens, return_dict_in_generate, **kwargs):
        from eagle3_ext.api.stats import GenerationStats

        self.calls.append((list(prompts), max_new_tokens, kwargs))
        return type("Out", (), {"stats": GenerationStats()})()


def test_compiled_warm_up_runs_every_group_then_every_smaller_batch():
    from eagle3_ext.bench.suite import _warm_up

    groups = [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    gen = _RecordingGenerator(compiled=True)
    _warm_up(gen, groups, 16, seed=0)
    # Every group at full length (its lookup trees and cache size), then the sizes a batch of 3 shrinks through.
    assert [(p, n) for p, n, _ in gen.calls] == [(["a", "b", "c"], 16), (["d", "e", "f"], 16), (["g"], 16),
                                                  (["a", "b"], 16), (["a"], 16)]
    assert all(kw == {"seed": 0} for _, _, kw in gen.calls)
    eager = _RecordingGenerator(compiled=False)
    _warm_up(eager, groups, 16)
    assert [(p, n) for p, n, _ in eager.calls] == [(["a", "b", "c"], 4)]  # eager: nothing to compile


def test_by_category_runs_each_category_as_its_own_set(pair, capsys):
    """--by-category: each category's prompts are a run of their own (every method, its own
    baseline), greedy and sampled, and the markdown adds one row per category and configuration."""
    prompts = pair / "categorized.jsonl"
    records = [("code", "def print return"), ("chat", "class value key"), ("code", "for while if else")]
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for c, p in records))
    out = pair / "by_category"
    rc = cli_main(["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts", str(prompts),
                   "--by-category", "--max-new-tokens", "8", "--batch-sizes", "1", "--tree", "3,1,4",
                   "--temperature", "0", "1.0", "--no-compiled-baseline", "--no-llama-cpp", "--out", str(out),
                   "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    runs = [(r["category"], r["prompts"], r["temperature"]) for r in report["runs"]]
    assert runs == [("code", 2, 0.0), ("code", 2, 1.0), ("chat", 1, 0.0), ("chat", 1, 1.0)]
    for run in report["runs"]:
        methods = {r["method"]: r for r in run["results"]}
        assert methods["chain3"]["acceptance_length"] >= 1.0
        if not run["temperature"]:
            assert methods["chain3"]["identical"] is True and "hf_prompt_lookup" in methods
    md = (out / "bench.md").read_text()
    assert "**Per category, batch 1**" in md and "T = 1: vs HF sampling (acceptance length)" in md
    rows = [line for line in md.splitlines() if line.startswith(("| code | chain3 |", "| chat | chain3 |"))]
    assert len(rows) == 2 and all(row.count("|") == 10 for row in rows), rows
    assert "**code (2 prompts), batch 1**" in md and "**chat (1 prompts), batch 1, sampling at temperature 1" in md


def test_by_category_needs_categories(pair, tmp_path, capsys):
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "def print return"}) + "\n")
    base = ["bench", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--by-category",
            "--no-llama-cpp", "--out", str(tmp_path / "o")]
    assert cli_main(base + ["--prompts", str(plain)]) == 2
    assert 'prompt 1 has no "category"' in capsys.readouterr().err
    assert cli_main(base) == 2
    assert "--by-category needs --prompts" in capsys.readouterr().err
    with pytest.raises(TypeError, match="categories must be None or a list of one category name per prompt"):
        BenchConfig(prompts=["a", "b"], categories=["chat"]).validate()
