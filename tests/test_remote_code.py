"""Folders no stock transformers class can run (gated attention, growth gates) load through the
modeling file growtool writes beside them, with equal logits, and never silently as a stock class."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402

from helpers import cli, perturbed  # noqa: E402

X = torch.randint(256, (2, 20), generator=torch.Generator().manual_seed(3))


def load_remote(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


def logits(model, alpha=None):
    with torch.no_grad():
        out = model(X) if alpha is None else model(X, alpha=alpha)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize(
    "family, extra",
    [("llama", []), ("gpt2", []), ("qwen3", ["--kv-heads", 2]), ("gpt_neox", ["--no-tie"]), ("phi3", ["--no-tie"])],
)
def test_gated_attention_folder_round_trips_with_equal_logits(family, extra, tmp_path):
    folder = tmp_path / "m"
    r = cli("init", "--family", family, "--width", 64, "--layers", 2, "--heads", 4, *extra, "-o", folder)
    assert r.exit_code == 0, r.stderr
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "growtool" and cfg["architectures"] == ["GrowtoolForCausalLM"]
    assert (folder / "modeling_growtool.py").exists()
    ours = checkpoint.load(folder).model()
    back = load_remote(folder)
    assert torch.allclose(logits(back), logits(ours), atol=1e-6, rtol=0)
    # without trust_remote_code it is refused, never loaded as a stock class minus g_proj
    with pytest.raises(ValueError, match="trust_remote_code"):
        transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)


def test_grown_gated_folder_loads_with_gates_and_the_source_function(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    )
    src_model = perturbed(transformers.Qwen2ForCausalLM(cfg)).eval()
    src_model.save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-q")  # a folder in, a folder out
    assert r.exit_code == 0, r.stderr
    grown = r.stdout.strip()
    assert json.loads(open(f"{grown}/config.json").read())["model_type"] == "growtool"
    back = load_remote(grown)
    assert back.config.growtool["model_type"] == "qwen2"
    ref = logits(src_model)
    assert (logits(back) - ref).abs().max() <= 1e-4 * ref.std()  # gates stored at 0
    gate_one = checkpoint.load(grown).model()(X, alpha=1.0).detach()
    assert torch.allclose(logits(back, alpha=1.0), gate_one, atol=1e-6, rtol=0)


def test_every_folder_output_is_stock_only_without_gates(tmp_path):
    """init, expand and fold: a folder claims a stock class exactly when the model has no gates."""
    for gate in ("--attn-gate", "--no-attn-gate"):
        out = tmp_path / f"init{gate}"
        assert (
            cli("init", "--family", "llama", "--width", 32, "--layers", 1, "--heads", 2, gate, "-o", out).exit_code == 0
        )
        grown, plain = tmp_path / f"g{gate}", tmp_path / f"p{gate}"
        assert cli("expand", out, "--width", 48, "-q", "-o", grown).exit_code == 0
        assert cli("fold", grown, "--alpha", 1, "-o", plain).exit_code == 0
        for folder in (out, grown, plain):
            ck = checkpoint.load(folder)
            stock = not (ck.config.attn_gate or ck.config.gated)
            cfg = json.loads((folder / "config.json").read_text())
            assert (cfg["model_type"] == "llama") == stock, folder
            assert (folder / "modeling_growtool.py").exists() == (not stock), folder
