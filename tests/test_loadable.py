"""A folder growtool writes must load in transformers (issue 44).

* Gemma 3 configs in the transformers 4.x spelling (``rope_theta``, ``rope_local_base_freq``, a global
  ``rope_scaling``): read as transformers reads them (the scaling on the full-attention layers only),
  grown 1.5x in width and 2x in depth, folded, and reloaded as Gemma3ForCausalLM with the source's
  logits; the written ``rope_parameters`` has one entry per layer type.
* ``expand`` / ``fold`` refuse, with one line and nothing written, a folder whose config transformers
  cannot build (config or model class), and skip the check where transformers is absent.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint, loadable  # noqa: E402
from growtool.nn import families  # noqa: E402

from helpers import cli, perturbed, verify_json  # noqa: E402

V = 128
X = torch.randint(V, (2, 24), generator=torch.Generator().manual_seed(1))  # longer than the window (8)


def rel(a, b):
    return float((a - b).abs().max() / b.std())


def logits(model, x=X):
    with torch.no_grad():
        return model(x).logits.float()


def _gemma3_legacy(path):
    """A Gemma 3 that transformers creates (linear RoPE scaling on its full layers), saved, its
    config.json then rewritten in the 4.x spelling the Hub's Gemma 3 configs use."""
    cfg = transformers.Gemma3TextConfig(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=160,
        max_position_embeddings=64,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
        },
    )
    torch.manual_seed(0)
    model = perturbed(transformers.Gemma3ForCausalLM(cfg)).eval()
    model.save_pretrained(path)
    hf = json.loads((path / "config.json").read_text())
    del hf["rope_parameters"], hf["layer_types"]  # 4.x: the layer types by a rule, every 2nd layer full
    hf.update(rope_theta=500.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
    hf["sliding_window_pattern"] = 2
    (path / "config.json").write_text(json.dumps(hf))
    legacy = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert rel(logits(legacy), logits(model)) == 0.0  # transformers reads the old spelling as the new
    return model


@pytest.mark.parametrize("args", [("--width", 96), ("--layers", 4), ("--width", 96, "--layers", 4)])
def test_gemma3_legacy_spelling_grows_folds_and_loads(args, tmp_path):
    model = _gemma3_legacy(tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.rope_scaling == {"full_attention": {"rope_type": "linear", "factor": 4.0}}
    with torch.no_grad():
        assert rel(ck.model()(X), logits(model)) <= 1e-5  # the scaling on the full layer only
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", *args, "-q", "-o", grown)
    assert r.exit_code == 0, r.stderr
    code, rep = verify_json(tmp_path / "src", grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    for alpha in (0, 1):
        f = tmp_path / f"f{alpha}"
        r = cli("fold", grown, "--alpha", alpha, "-o", f)
        assert r.exit_code == 0, r.stderr
        rp = json.loads((f / "config.json").read_text())["rope_parameters"]
        assert rp["full_attention"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}
        assert rp["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
        back = transformers.AutoModelForCausalLM.from_pretrained(f).eval()
        assert type(back) is transformers.Gemma3ForCausalLM
        with torch.no_grad():
            want = logits(model) if alpha == 0 else checkpoint.load(grown).model()(X, alpha=1.0)
        assert rel(logits(back), want) <= (1e-4 if alpha == 0 else 1e-5)


def _flat_rope_gemma3(monkeypatch):
    """Gemma 3 as growtool was before the fix: its rope_parameters written flat."""
    g3 = families.ARCHS["gemma3_text"]
    broken = dataclasses.replace(g3, features=dataclasses.replace(g3.features, rope_per_type=False))
    monkeypatch.setitem(families.ARCHS, "gemma3_text", broken)
    monkeypatch.setitem(families.BY_MODEL_TYPE, "gemma3_text", broken)


def test_a_config_transformers_cannot_load_is_refused_with_one_line(monkeypatch, tmp_path):
    _gemma3_legacy(tmp_path / "src")
    _flat_rope_gemma3(monkeypatch)  # a lone .safetensors file has no config.json: not checked
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g.safetensors").exit_code == 0
    for args, out in [
        (("fold", tmp_path / "g.safetensors", "--alpha", 0), tmp_path / "f"),
        (("expand", tmp_path / "src", "--width", 96, "-q"), tmp_path / "gdir"),
    ]:
        r = cli(*args, "-o", out)
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "cannot load the gemma3_text config this would write (KeyError: 'full_attention')" in r.stderr
        assert not out.exists() and not list(tmp_path.glob(".f*.tmp")) and not list(tmp_path.glob(".gdir*"))


def test_the_check_builds_the_model_class_too(monkeypatch, tmp_path):
    """A config that builds but whose class cannot be made from it (here: the class replaced by one that
    raises) is refused as well: the model is made on the meta device, so this costs no memory."""
    _gemma3_legacy(tmp_path / "src")

    class Broken(transformers.Gemma3ForCausalLM):
        def __init__(self, config):
            raise ValueError("no such layer kind")

    tf = SimpleNamespace(__version__=transformers.__version__, logging=transformers.logging, Gemma3ForCausalLM=Broken)
    monkeypatch.setattr(loadable, "_transformers", lambda: tf)
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and "(ValueError: no such layer kind)" in r.stderr, r.stderr
    assert not (tmp_path / "g").exists()


def test_the_check_is_skipped_without_transformers(monkeypatch, tmp_path):
    _gemma3_legacy(tmp_path / "src")
    _flat_rope_gemma3(monkeypatch)
    monkeypatch.setattr(loadable, "_transformers", lambda: None)
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0


def test_verify_against_transformers_own_forward(tmp_path, monkeypatch):
    """``verify --reference transformers``: the source folder's logits as transformers computes them,
    against growtool's source and the grown model (judged rows: a wrong reference fails the check)."""
    cfg = transformers.Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = perturbed(transformers.AutoModelForCausalLM.from_config(cfg))
    model.save_pretrained(tmp_path / "src")
    assert cli("expand", tmp_path / "src", "--width", 48, "-o", tmp_path / "g.safetensors").exit_code == 0
    code, rep = verify_json(tmp_path / "src", tmp_path / "g.safetensors", "--reference", "transformers")
    rows = {r["inputs"]: r for r in rep["results"]}
    assert code == 0 and rep["pass"], rep
    assert rows["random: source vs transformers"]["rel"] < 1e-5 and rows["random: grown vs transformers"]["rel"] < 1e-4
    from growtool.io import hf_reference

    real = hf_reference.Reference.__call__
    monkeypatch.setattr(hf_reference.Reference, "__call__", lambda self, x, alpha=None: real(self, x) * 1.01)
    code, rep = verify_json(tmp_path / "src", tmp_path / "g.safetensors", "--reference", "transformers")
    assert code == 1 and not rep["pass"]
    r = cli("verify", tmp_path / "g.safetensors", tmp_path / "g.safetensors", "--reference", "transformers")
    assert r.exit_code == 2 and "not a Hugging Face folder" in r.stderr and r.stderr.count("\n") == 1
