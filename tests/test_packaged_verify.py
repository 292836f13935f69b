"""A float32 target's compiled verify on CPU as AOTInductor packages on disk: token-identical to
greedy decoding, built once and loaded by a later generator with the same weights, rebuilt
for other weights, keyed by everything it was built from."""

import copy
import dataclasses

import pytest
import torch

from eagle3_ext.api import CompileOptions, SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate
from eagle3_ext.bench.generate_job import GenerateRequest, compile_choice
from eagle3_ext.api.inputs import encode_prompt
from eagle3_ext.compiled.verify import packaged, verify_on_disk
from eagle3_ext.compiled.packages import package_dir, package_key, weights_digest
from conftest import FAST_COMPILE
from tiny_models import loaded_trained_pair

PROMPTS = ["def value key item value key item value key", "class index count index count"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return loaded_trained_pair(str(tmp_path_factory.mktemp("packaged")), layers=4, steps=20)


def packages_in(folder) -> CompileOptions:
    """The tests' fast options (ATen's GEMMs, Python wrapper) with packages, kept in ``folder``."""
    return dataclasses.replace(FAST_COMPILE, packages=True, package_dir=folder)


@pytest.mark.slow
def test_a_float32_verify_is_built_once_and_loaded_by_the_next_generator(pair, tmp_path):
    """Identical to greedy decoding over consecutive calls; a second generator with the same
    weights loads the package (nothing built, the same outputs); a target of the same shape with
    other weights gets a package of its own and decodes with its weights. (ATen's GEMMs, the
    tests' default, keep the builds short; the packages store them as they store the GEMM
    template's.)"""
    target, tok, draft = pair
    other = copy.deepcopy(target)
    with torch.no_grad():
        for p in other.model.layers[-1].mlp.parameters():
            p.mul_(1.5)
    options, tree = packages_in(tmp_path), TreeConfig.chain(3)
    longest = max(len(encode_prompt(p, tok)) for p in PROMPTS)

    def on_disk(model, batch=1, new_tokens=16):
        return verify_on_disk(model, options, tree, draft.aux_layer_ids, batch, longest, new_tokens)

    runs = []
    for model in (target, target, other):
        before = on_disk(model)
        gen = SpeculativeGenerator(model, draft, tree, tokenizer=tok, compile=options)
        assert gen.compiled.verify.packages is not None
        outputs = [gen.generate(p, max_new_tokens=16, return_dict_in_generate=True).new_tokens for p in PROMPTS]
        assert outputs == [hf_generate(model, tok, [p], 16)[0] for p in PROMPTS]
        runs.append((before, gen.compiled.verify.packages.builds, sorted(p.name for p in tmp_path.glob("*.pt2")),
                     outputs))
    (found, built, files, first), (found_again, loaded, same_files, again), (found_other, rebuilt, more_files,
                                                                             theirs) = runs
    assert not found and built == 1 and len(files) == 1          # one shape: batch 1, chain 3, 512 slots
    assert found_again and loaded == 0 and same_files == files and again == first
    assert not found_other and rebuilt == 1 and len(more_files) == 2 and theirs != first
    assert sorted(p.name for p in tmp_path.iterdir()) == more_files   # no partial file left behind
    # verify_on_disk (what `--compile auto` asks) says no for a call of another shape: another
    # batch size, or a cache of another capacity (longer than 512 slots).
    assert on_disk(target) and not on_disk(target, batch=2) and not on_disk(target, new_tokens=600)
    # `eagle3 generate --compile auto`: compiled where the package is on disk, else eager with a note.
    auto = GenerateRequest(compile=options, compile_if_on_disk=True, max_new_tokens=16, depth=3, chain=True,
                           lookup_tokens=0)
    assert compile_choice(auto, target, draft, tok, PROMPTS[0]) == (options, "compiled: the verify's compiled form "
                                                                             "was on disk")
    unseen = copy.deepcopy(other)
    with torch.no_grad():
        unseen.lm_head.weight.mul_(2.0)
    chosen, note = compile_choice(auto, unseen, draft, tok, PROMPTS[0])
    assert chosen is None and note.startswith("eager: no compiled verify of this target, tree and length on disk")


def test_compile_auto_runs_eager_without_packages_and_is_off_unless_asked(pair, tmp_path):
    """Only a float32 CPU target's verify is kept on disk: a bfloat16 one runs eager under
    ``--compile auto``. Without auto the choice is the request's own, with no note."""
    target, tok, draft = pair
    options = packages_in(tmp_path)
    half = copy.deepcopy(target).to(torch.bfloat16)
    assert not verify_on_disk(half, options, TreeConfig.chain(3), draft.aux_layer_ids, 1, 8, 16)
    auto = GenerateRequest(compile=options, compile_if_on_disk=True)
    assert compile_choice(auto, half, draft, tok, PROMPTS[0])[0] is None
    assert compile_choice(GenerateRequest(compile=options), target, draft, tok, PROMPTS[0]) == (options, None)
    assert compile_choice(GenerateRequest(compile_if_on_disk=True), target, draft, tok, PROMPTS[0]) == (None, None)
    assert not list(tmp_path.iterdir())     # asking builds nothing


@pytest.mark.slow
def test_a_verify_that_cannot_be_exported_is_compiled_with_a_warning(pair, tmp_path, monkeypatch):
    """A target whose forward ``torch.export`` cannot trace still decodes compiled: with
    a warning that names the cause, through ``torch.compile``, identical to greedy decoding."""
    target, tok, draft = pair

    def unsupported(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("a construct export does not trace")

    monkeypatch.setattr(torch.export, "export", unsupported)
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=packages_in(tmp_path))
    with pytest.warns(UserWarning, match=r"no AOTInductor package of the float32 verify forward of LlamaForCausalLM "
                                         r"\(torch.export failed: Unsupported: a construct export does not trace\); "
                                         r"it is compiled with torch.compile instead"):
        out = gen.generate(PROMPTS[0], max_new_tokens=12, return_dict_in_generate=True)
    assert out.new_tokens == hf_generate(target, tok, PROMPTS[:1], 12)[0]
    assert gen.compiled.verify.packages is None and not list(tmp_path.iterdir())


def test_the_package_key_names_weights_shapes_layers_and_settings(pair):
    target, _, _ = pair
    digest = weights_digest(target)
    assert digest == weights_digest(copy.deepcopy(target))
    nudged = copy.deepcopy(target)
    with torch.no_grad():
        nudged.model.layers[0].self_attn.q_proj.weight[0, 0] += 1e-6
    assert weights_digest(nudged) != digest
    config = target.config.to_json_string()
    base = (digest, config, ((1, 4), 512), [0, 1, 2], {"freezing": True})
    keys = {package_key(*base),
            package_key(weights_digest(nudged), *base[1:]),
            package_key(digest, config.replace("}", ', "x": 1}', 1), *base[2:]),
            package_key(digest, config, ((1, 6), 512), *base[3:]),
            package_key(digest, config, ((2, 4), 512), *base[3:]),
            package_key(digest, config, ((1, 4), 1024), *base[3:]),
            package_key(*base[:3], [1, 2, 3], base[4]),
            package_key(*base[:4], {"freezing": True, "max_autotune": True})}
    assert len(keys) == 8
    assert package_key(*base) == package_key(*base)


def test_packages_are_for_float32_on_cpu_and_can_be_turned_off(pair, monkeypatch, tmp_path):
    default = CompileOptions()
    assert packaged(torch.zeros(1), default)
    assert not packaged(torch.zeros(1, dtype=torch.bfloat16), default)
    assert not packaged(torch.zeros(1, dtype=torch.float16), default)
    assert not packaged(torch.zeros(1), CompileOptions(packages=False))
    assert package_dir(tmp_path / "here") == tmp_path / "here"
    assert package_dir().name == "eagle3_verify"
    # A generator's options: EAGLE3_COMPILE_PACKAGES / EAGLE3_PACKAGE_DIR, when set, override them.
    target, tok, draft = pair
    monkeypatch.setenv("EAGLE3_COMPILE_PACKAGES", "0")
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=packages_in(tmp_path))
    assert gen.compiled.verify.packages is None and not gen.compiled.options.packages
    monkeypatch.setenv("EAGLE3_COMPILE_PACKAGES", "1")
    monkeypatch.setenv("EAGLE3_PACKAGE_DIR", str(tmp_path / "there"))
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=FAST_COMPILE)
    assert gen.compiled.verify.packages.directory == tmp_path / "there"
    monkeypatch.setenv("EAGLE3_COMPILE_PACKAGES", "on")
    with pytest.raises(ValueError, match=r"EAGLE3_COMPILE_PACKAGES \(it overrides CompileOptions.packages\) must be "
                                         r"0 or 1, got 'on'"):
        SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=FAST_COMPILE)
