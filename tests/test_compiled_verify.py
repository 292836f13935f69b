"""compile=True: the verify forward as one compiled graph over a static cache. Token-identical
to the target's greedy decoding with hybrid drafting (trees of varying size, padded to a few
sizes) and with requests leaving a batch; the shapes compile once and not again."""

import copy

import pytest
import torch

from eagle3_ext.api import CompileOptions, SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate
from eagle3_ext.bench.divergence import first_divergence, fp32_reference
from eagle3_ext.compiled.verify import (CAPACITY_MULTIPLE, autotunes, cuda_graphs, inductor_settings, node_buckets,
                                                 static_capacity)
from conftest import FAST_COMPILE, HAS_CUDA, calls_after_a_first
from tiny_models import loaded_trained_pair

PROMPTS = ["def value key item value key item value key", "class index count index count",
           "for while if else for while if"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return loaded_trained_pair(str(tmp_path_factory.mktemp("compiled")), layers=4, steps=20)


def test_buckets_and_capacity():
    assert node_buckets(16, 0) == [16]                 # without lookup every tree is full
    assert node_buckets(16, 10) == [6, 11, 16]         # a round without a lookup match has 6 nodes
    assert node_buckets(4, 10) == [1, 3, 4]
    assert static_capacity(100, 128, 16) == CAPACITY_MULTIPLE
    assert static_capacity(CAPACITY_MULTIPLE, 1, 16) == 2 * CAPACITY_MULTIPLE


def test_linears_of_one_input_are_one_gemm_in_a_cpu_graph():
    """A float32 target's q, k and v (and gate and up) read one input: in the compiled graph they
    are one GEMM over the concatenated weights, and compute the same."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(64, out, bias=False) for out in (64, 32, 32)).eval()
    x = torch.randn(6, 64)

    def gemms(settings):
        fn = torch.compile(lambda x: [layer(x) for layer in layers], dynamic=False)
        with torch.no_grad(), torch._inductor.config.patch(settings):
            return calls_after_a_first(fn, (x,), ("mkl::_mkl_linear", "aten::mm", "aten::addmm"))

    torch._dynamo.reset()
    settings = inductor_settings(torch.device("cpu"), FAST_COMPILE)  # ATen's packed GEMM: countable, fast to build
    concatenated, one = gemms(settings)
    torch._dynamo.reset()
    separate, three = gemms({**settings, "cpp.enable_concat_linear": False})
    assert (one, three) == (1, 3)
    with torch.no_grad():
        for layer, a, b in zip(layers, concatenated, separate):
            torch.testing.assert_close(a, layer(x))
            torch.testing.assert_close(b, layer(x))


def test_inductor_settings():
    frozen = {"freezing": True, "cpp.enable_concat_linear": True}
    autotuned = {**frozen, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                 "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    default = CompileOptions()
    # The C++ wrapper by default; autotuning by default where the CPU lacks AVX-512 (autotunes).
    assert autotunes(default) == (torch.backends.cpu.get_cpu_capability() != "AVX512")
    assert autotunes(CompileOptions(autotune=True)) and not autotunes(CompileOptions(autotune=False))
    assert inductor_settings(cpu, default) == {**(autotuned if autotunes(default) else frozen), "cpp_wrapper": True}
    assert inductor_settings(cuda, default) == {"triton.cudagraphs": True}   # CUDA graphs by default
    assert inductor_settings(cpu, CompileOptions(autotune=True, cpp_wrapper=False)) == autotuned
    assert inductor_settings(cpu, CompileOptions(autotune=False)) == {**frozen, "cpp_wrapper": True}
    assert inductor_settings(cpu, FAST_COMPILE) == frozen
    no_graphs = CompileOptions(cuda_graphs=False)
    assert inductor_settings(cuda, no_graphs) == {} and not cuda_graphs(cuda, no_graphs)
    assert not cuda_graphs(cpu, default) and cuda_graphs(cuda, default)


def test_environment_variables_override_the_options(monkeypatch, tmp_path):
    """Each EAGLE3_COMPILE_* variable, when set, replaces its field (the code's value too); a
    generator reads them once, when it is built."""
    switches = {"autotune": "EAGLE3_COMPILE_AUTOTUNE", "cpp_wrapper": "EAGLE3_COMPILE_CPP_WRAPPER",
                "cuda_graphs": "EAGLE3_COMPILE_CUDA_GRAPHS", "packages": "EAGLE3_COMPILE_PACKAGES"}
    for name in (*switches.values(), "EAGLE3_PACKAGE_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert CompileOptions().with_environment() == CompileOptions()
    for field, name in switches.items():
        monkeypatch.setenv(name, "0")
        assert getattr(CompileOptions().with_environment(), field) is False
        monkeypatch.setenv(name, "1")
        assert getattr(CompileOptions(**{field: False}).with_environment(), field) is True
        monkeypatch.setenv(name, "")   # empty: not set
        assert getattr(CompileOptions(**{field: False}).with_environment(), field) is False
        monkeypatch.setenv(name, "yes")
        with pytest.raises(ValueError, match=f"{name} \\(it overrides CompileOptions.{field}\\) must be 0 or 1, "
                                             "got 'yes'"):
            CompileOptions().with_environment()
        monkeypatch.delenv(name)
    monkeypatch.setenv("EAGLE3_PACKAGE_DIR", str(tmp_path / "here"))
    assert CompileOptions(package_dir="elsewhere").with_environment().package_dir == tmp_path / "here"


def test_compiled_greedy_is_token_identical_and_compiles_once(pair):
    target, tok, draft = pair
    gen = SpeculativeGenerator(target, draft, TreeConfig(3, 2, 8, lookup_tokens=4), tokenizer=tok,
                               compile=FAST_COMPILE)
    # A stop token the first row emits early: rows finish at different rounds and the batch
    # shrinks (a smaller batch is another shape). Two requests: each batch size compiles its own
    # graphs, and a third request added about two minutes.
    prompts = PROMPTS[:2]
    stop = hf_generate(target, tok, prompts[:1], 24, stop_at_eos=False)[0][0][5]
    expected = hf_generate(target, tok, prompts, 24, eos_token_id=stop)[0]
    assert len({len(e) for e in expected}) > 1
    first = gen.generate(prompts, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
    assert first.new_tokens == expected
    assert first.stats.compile_time_s > 0
    again = gen.generate(prompts, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
    assert again.new_tokens == expected
    assert again.stats.compile_time_s == 0  # the same shapes: nothing compiled a second time


def test_autotuned_frozen_graphs_follow_each_call_and_each_model(pair):
    """The CPU graphs with every option on (weights frozen, GEMMs autotuned as on CPUs without
    AVX-512, C++ wrapper; the float32 verify's package is test_packaged_verify's): token-identical
    to greedy decoding over consecutive calls (on the cache buffers the generator keeps) and for a
    second target of the same shape but other weights (frozen constants belong to one generator)."""
    target, tok, draft = pair
    other = copy.deepcopy(target)
    with torch.no_grad():
        for p in other.model.layers[-1].mlp.parameters():
            p.mul_(1.5)
    for model in (target, other):
        gen = SpeculativeGenerator(model, draft, TreeConfig.chain(3), tokenizer=tok,
                                   compile=CompileOptions(autotune=True, packages=False))
        assert gen.compiled.options == CompileOptions(autotune=True, packages=False).with_environment()
        for prompt in PROMPTS[:2]:
            expected = hf_generate(model, tok, [prompt], 16)[0]
            assert gen.generate(prompt, max_new_tokens=16, return_dict_in_generate=True).new_tokens == expected
    assert hf_generate(other, tok, PROMPTS[:2], 16)[0] != hf_generate(target, tok, PROMPTS[:2], 16)[0]


def test_a_half_precision_verify_graph_is_stored_and_loaded_with_each_models_weights(pair):
    """A bfloat16 target's verify graph runs its projections through the streaming kernel
    (no oneDNN-packed weights), so Inductor's on-disk cache stores it: a second generator whose
    target has the same shapes but other weights loads the graph instead of compiling it, and
    decodes with its own weights."""
    from torch._dynamo.utils import counters

    target, tok, draft = pair
    first = copy.deepcopy(target).to(torch.bfloat16)
    second = copy.deepcopy(first)
    with torch.no_grad():
        for p in second.model.layers[-1].mlp.parameters():
            p.mul_(1.5)
    half_draft = copy.deepcopy(draft).to(torch.bfloat16)
    outputs = []
    for model in (first, second):
        counters.clear()
        gen = SpeculativeGenerator(model, half_draft, TreeConfig.chain(3), tokenizer=tok, compile=FAST_COMPILE)
        out = gen.generate(PROMPTS[:2], max_new_tokens=12, return_dict_in_generate=True)
        assert counters["inductor"]["fxgraph_cache_bypass"] == 0, dict(counters["inductor"])
        outputs.append(out.new_tokens)
        # bf16: greedy decoding's tokens, or a divergence at a near-tie of the target's top two
        reference = fp32_reference(model)
        for prompt, ours, theirs in zip(PROMPTS[:2], out.new_tokens, hf_generate(model, tok, PROMPTS[:2], 12)[0]):
            divergence = first_divergence(model, tok(prompt).input_ids, ours, theirs, reference)
            assert divergence is None or divergence["near_tie"], divergence
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1  # the second target's graph was loaded
    assert outputs[0] != outputs[1]


def test_compiled_batch_shrinks_to_powers_of_two_with_mirrors(pair, monkeypatch):
    """Four requests, one finishing first: the three left run as four rows, one a mirror of a
    running request whose tokens are dropped; outputs stay identical to plain greedy decoding."""
    from eagle3_ext.decoding.batch import Batch

    target, tok, draft = pair
    prompts = PROMPTS + ["return value key item value"]
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=FAST_COMPILE)
    stop = hf_generate(target, tok, prompts[:1], 24, stop_at_eos=False)[0][0][3]
    expected = hf_generate(target, tok, prompts, 24, eos_token_id=stop)[0]
    sizes = []
    drop = Batch._drop_finished

    def spy(self):
        drop(self)
        sizes.append((len(self.rows), sum(self.rows.mirror)))

    monkeypatch.setattr(Batch, "_drop_finished", spy)
    out = gen.generate(prompts, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
    assert out.new_tokens == expected
    assert {size for size, _ in sizes} <= {4, 2, 1}
    assert any(mirrors for _, mirrors in sizes), sizes
    # Mirrors are not counted: the same rounds and accepted tokens as the eager generator's.
    eager = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok)
    want = eager.generate(prompts, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True).stats
    assert (out.stats.request_rounds, out.stats.accepted_drafts) == (want.request_rounds, want.accepted_drafts)


def test_compile_is_checked(pair):
    target, tok, draft = pair
    with pytest.raises(TypeError, match="compile must be True, False, None or a CompileOptions, got 'yes'"):
        SpeculativeGenerator(target, draft, tokenizer=tok, compile="yes")
    with pytest.raises(ValueError, match="compile=True needs attention='tree'"):
        SpeculativeGenerator(target, draft, tokenizer=tok, attention="sdpa", compile=True)
    with pytest.raises(ValueError, match=r"compile=CompileOptions\(autotune=False, .*\) needs attention='tree'"):
        SpeculativeGenerator(target, draft, tokenizer=tok, attention="sdpa", compile=FAST_COMPILE)
    assert SpeculativeGenerator(target, draft, tokenizer=tok, compile=None).compiled is None
    assert torch.compiler.is_compiling() is False


def _cache_addresses(batch):
    """The data pointers of a batch's caches: the target's (every layer) and the draft's."""
    rows = batch.rows
    target = [t.data_ptr() for layer in rows.target.cache.layers for t in (layer.keys, layer.values)]
    draft = [t.data_ptr() for t in rows.draft_cache.keys + rows.draft_cache.values + [rows.draft_cache.prefix_lens]]
    return tuple(target), tuple(draft)


def test_compiled_calls_keep_their_cache_addresses(pair, monkeypatch):
    """The caches are the generator's kept buffers: every round of every call, the batch
    shrinking included, sees the same addresses (what CUDA graphs replay on), with outputs
    identical to plain greedy decoding call after call."""
    from eagle3_ext.decoding.batch import Batch

    target, tok, draft = pair
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=FAST_COMPILE)
    seen = []
    run_round = Batch.round

    def spy(self):
        run_round(self)
        seen.append(_cache_addresses(self))

    monkeypatch.setattr(Batch, "round", spy)
    stop = hf_generate(target, tok, PROMPTS[:1], 24, stop_at_eos=False)[0][0][5]
    calls = [(PROMPTS, stop), (PROMPTS[1:], None), (PROMPTS[2:], None), (PROMPTS, stop)]
    held = []
    for prompts, eos in calls:
        kwargs = {} if eos is None else {"eos_token_id": eos}
        expected = hf_generate(target, tok, prompts, 24, **kwargs)[0]
        assert gen.generate(prompts, max_new_tokens=24, return_dict_in_generate=True, **kwargs).new_tokens == expected
        held.append(gen.compiled.pool.nbytes)
    assert len(seen) > len(calls) and len(set(seen)) == 1, "a round saw other cache addresses"
    assert held[1:] == held[:-1]   # the buffers of the first call (the largest batch) served every call


def test_a_compiled_generator_runs_one_call_at_a_time(pair):
    """A second call while one runs (here from a streamer) would share its cache buffers: an error
    that names the cause; the generator works again afterwards."""
    target, tok, draft = pair
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=FAST_COMPILE)

    class Reentrant:
        def put(self, tokens):
            if tokens.numel() == 1:   # a new token, not the prompt's echo
                gen.generate(PROMPTS[1], max_new_tokens=4)

        def end(self):
            pass

    with pytest.raises(RuntimeError, match="generate is already running on this generator"):
        gen.generate(PROMPTS[0], max_new_tokens=8, streamer=Reentrant())
    expected = hf_generate(target, tok, PROMPTS[:1], 8)[0]
    assert gen.generate(PROMPTS[0], max_new_tokens=8, return_dict_in_generate=True).new_tokens == expected


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and the CUDA kernels")
def test_cuda_graphs_replay_every_round_token_identical(pair):
    """On CUDA the compiled rounds run as CUDA graphs: none of the graphs is skipped (a cache that
    is not a static address, a CPU tensor or a host sync in a graph would skip it), the recordings
    replay over later calls, and the tokens equal plain greedy decoding's."""
    from torch._dynamo.utils import counters

    target, tok, draft = pair
    cuda_target, cuda_draft = copy.deepcopy(target).cuda(), copy.deepcopy(draft).cuda()
    stop = hf_generate(cuda_target, tok, PROMPTS[:1], 24, stop_at_eos=False)[0][0][5]
    expected = hf_generate(cuda_target, tok, PROMPTS, 24, eos_token_id=stop)[0]   # on the same device
    counters.clear()
    gen = SpeculativeGenerator(cuda_target, cuda_draft, TreeConfig(3, 2, 8, lookup_tokens=4), tokenizer=tok,
                               compile=FAST_COMPILE)
    for _ in range(2):   # the batch shrinks as rows stop; trees of three sizes
        out = gen.generate(PROMPTS, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
        assert out.new_tokens == expected
    # A sampled chain (its draws read after the verify): the same seed, the same tokens, replayed.
    gen = SpeculativeGenerator(cuda_target, cuda_draft, TreeConfig.chain(3, sampled=True), tokenizer=tok,
                               compile=FAST_COMPILE)
    sampled = [gen.generate(PROMPTS[0], max_new_tokens=24, do_sample=True, temperature=0.8, seed=3,
                            return_dict_in_generate=True).new_tokens for _ in range(3)]
    assert sampled[0] == sampled[1] == sampled[2] and 0 < len(sampled[0][0]) <= 24
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] > 0, "no CUDA graph was recorded"
