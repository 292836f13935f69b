"""The capture convention: index i is Hugging Face's ``output_hidden_states[i]`` for 0 <= i < L;
index L is the raw output of the last decoder layer (before the final norm)."""

import pytest
import torch
import transformers

from eagle3_ext.api import AuxHiddenCapture, find_decoder_layers

L = 5
ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {}),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, {"head_dim": 16}),
    "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM, {}),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, {"pad_token_id": 0}),
}


def tiny(arch):
    config_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(0)
    cfg = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=128, **extra)
    return model_cls(cfg).eval()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_index_i_is_output_hidden_states_i(arch):
    model = tiny(arch)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        reference = model(input_ids=ids, output_hidden_states=True).hidden_states
        with AuxHiddenCapture(model, list(range(L + 1))) as capture:
            model(input_ids=ids)
            states = capture.take()
        last_layer = []
        handle = find_decoder_layers(model)[L - 1].register_forward_hook(
            lambda module, args, out: last_layer.append(out[0] if isinstance(out, tuple) else out))
        model(input_ids=ids)
        handle.remove()
    assert len(reference) == L + 1
    for i in range(L):
        torch.testing.assert_close(states[i], reference[i], msg=f"{arch}: index {i}")
    # Index L: the last decoder layer's own output. Hugging Face's entry L is after the final norm.
    torch.testing.assert_close(states[L], last_layer[0])
    assert not torch.allclose(states[L], reference[L])


def test_ids_outside_the_layers_are_refused():
    with pytest.raises(ValueError, match=r"include \[6\], outside \[0, 5\]"):
        AuxHiddenCapture(tiny("llama"), [1, 6])
