"""Interoperability with Hugging Face transformers: its checkpoints in, loadable checkpoints out."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402

from helpers import cli, perturbed  # noqa: E402

V = 128


def gpt2(tie=True):
    cfg = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=V,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
    )
    return transformers.GPT2LMHeadModel(cfg)


def llama(tie=False):
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
    )
    return transformers.LlamaForCausalLM(cfg)


MODELS = {"gpt2": gpt2, "gpt2-untied": lambda: gpt2(False), "llama": llama, "llama-tied": lambda: llama(True)}


@pytest.fixture(params=sorted(MODELS))
def hf_folder(request, tmp_path):
    torch.manual_seed(0)
    model = perturbed(MODELS[request.param]()).eval()
    path = tmp_path / request.param
    model.save_pretrained(path)
    return path, model


def hf_logits(model, x):
    with torch.no_grad():
        return model(x).logits


X = torch.randint(V, (2, 24), generator=torch.Generator().manual_seed(1))


def test_our_forward_equals_transformers(hf_folder):
    path, model = hf_folder
    ours = checkpoint.load(path).model()
    with torch.no_grad():
        assert torch.allclose(ours(X), hf_logits(model, X), atol=1e-5)


def test_grown_and_folded_at_zero_loads_in_transformers_with_same_logits(hf_folder, tmp_path):
    path, model = hf_folder
    r = cli("expand", path, "--width", 96, "-q")  # default output: a folder next to the input
    assert r.exit_code == 0, r.stderr
    grown = r.stdout.strip()
    assert grown.endswith("-d96") and json.loads((tmp_path / grown / "config.json").read_text())
    folded = tmp_path / "folded0"
    assert cli("fold", grown, "--alpha", 0, "-o", folded).exit_code == 0
    back = type(model).from_pretrained(folded).eval()
    assert back.config.hidden_size == 96 if hasattr(back.config, "hidden_size") else back.config.n_embd == 96
    src = hf_logits(model, X)
    assert (hf_logits(back, X) - src).abs().max() <= 1e-4 * src.std()


def test_folded_at_one_loads_in_transformers_equal_to_our_open_gate(hf_folder, tmp_path):
    path, model = hf_folder
    grown = tmp_path / "g.safetensors"
    assert cli("expand", path, "--width", 96, "-o", grown, "-q").exit_code == 0
    folded = tmp_path / "folded1"
    assert cli("fold", grown, "--alpha", 1, "-o", folded).exit_code == 0
    back = type(model).from_pretrained(folded).eval()
    with torch.no_grad():
        ours = checkpoint.load(grown).model()(X, alpha=1.0)
    assert torch.allclose(hf_logits(back, X), ours, atol=1e-5)
