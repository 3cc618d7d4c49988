"""gamma-initialisation: every matrix drawn with std fan_in^-gamma, gains 1, biases 0; the CLI's
``init`` writes a loadable checkpoint with the defaults (gamma 0.5, eps 1e-12, gated attention).

fan_in is worked out here from the layer type, not from the family tables: nn.Linear (Llama, and
every lm_head) stores [out, in], GPT-2's Conv1D stores [in, out]; embeddings use the width.
"""

import math

import pytest
import torch

from growtool.init import init_model
from growtool.io import checkpoint

from helpers import cli, make_config

EMBEDS = ("wte.weight", "wpe.weight", "embed_tokens.weight")


def make_cfg(family, tie=False):
    kv = 4 if family == "gpt2" else 2
    return make_config(family, 64, 2, 4, kv, 16, 256, 256, 128, tie=tie, attn_gate=True, norm_eps=1e-12)


def fan_in(name, t, family):
    if family == "gpt2" and name != "lm_head.weight":
        return t.shape[0]  # Conv1D [in, out]
    return t.shape[1]  # nn.Linear [out, in]


def check_std(t, sigma, what):
    """std within 6 standard errors of sigma (SE of a sample std ~ sigma / sqrt(2n)), mean near 0."""
    n = t.numel()
    s = float(t.float().std())
    assert abs(s / sigma - 1) < 6 / math.sqrt(2 * n), f"{what}: std {s:.4g}, want {sigma:.4g} (n={n})"
    assert abs(float(t.float().mean())) < 6 * sigma / math.sqrt(n), f"{what}: mean {float(t.mean()):.3g}"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_every_tensor_follows_the_rule(family, gamma):
    cfg = make_cfg(family)
    tensors = init_model(cfg, gamma=gamma, seed=1).tensors()
    kinds = set()
    for name, t in tensors.items():
        if name.endswith(EMBEDS):
            check_std(t, cfg.width**-gamma, name)
            kinds.add("embedding")
        elif t.dim() == 2:
            check_std(t, fan_in(name, t, family) ** -gamma, name)
            kinds.add("matrix")
        elif name.endswith(".bias"):
            assert torch.all(t == 0), name
            kinds.add("bias")
        else:
            assert "norm" in name or "ln_" in name, f"unexpected 1-d tensor {name}"
            assert torch.all(t == 1), name
            kinds.add("gain")
    want = {"embedding", "matrix", "gain"} | ({"bias"} if family == "gpt2" else set())
    assert kinds == want
    assert "lm_head.weight" in tensors  # untied: the head is drawn too


def test_the_two_gammas_differ_by_sqrt_fan_in():
    """A cross-check that cannot pass by accident: the same seed, gamma 1 vs 0.5, ratio fan_in^-0.5."""
    cfg = make_cfg("llama")
    a = init_model(cfg, gamma=1.0, seed=3).tensors()
    b = init_model(cfg, gamma=0.5, seed=3).tensors()
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        ratio = float(a[name].std() / b[name].std())
        assert ratio == pytest.approx(a[name].shape[1] ** -0.5, rel=1e-5)


def test_embedding_gamma_is_a_separate_knob():
    cfg = make_cfg("gpt2", tie=True)
    t = init_model(cfg, gamma=1.0, embed_gamma=0.5, seed=2).tensors()
    check_std(t["transformer.wte.weight"], 64**-0.5, "wte")
    check_std(t["transformer.wpe.weight"], 64**-0.5, "wpe")
    check_std(t["transformer.h.0.mlp.c_fc.weight"], 64**-1.0, "c_fc")
    check_std(t["transformer.h.0.mlp.c_proj.weight"], 256**-1.0, "c_proj")


def test_seed_makes_it_reproducible():
    cfg = make_cfg("llama")
    a, b, c = (init_model(cfg, seed=s).tensors() for s in (5, 5, 6))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_cli_init_defaults_and_loadable(tmp_path):
    out = tmp_path / "base.safetensors"
    r = cli("init", "--family", "llama", "--width", 64, "--layers", 1, "--heads", 4, "-o", out)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == str(out)
    ck = checkpoint.load(out)
    cfg = ck.config
    assert cfg.norm_eps == 1e-12 and cfg.attn_gate and cfg.tie and not cfg.gated
    assert ck.lineage[0]["op"] == "init" and ck.lineage[0]["gamma"] == 0.5
    t = ck.tensors()  # the default gamma (0.5, bench/README.md) is in the weights, not only in the metadata
    check_std(t["model.layers.0.mlp.gate_proj.weight"], 64**-0.5, "gate_proj")
    check_std(t["model.layers.0.mlp.down_proj.weight"], 256**-0.5, "down_proj")
    check_std(t["model.embed_tokens.weight"], 64**-0.5, "embed")
    logits = ck.model()(torch.randint(256, (2, 16)))
    assert logits.shape == (2, 16, 256) and torch.isfinite(logits).all()


def test_cli_init_options(tmp_path):
    out = tmp_path / "g.safetensors"
    r = cli(
        "init",
        "--family",
        "gpt2",
        "--width",
        32,
        "--layers",
        1,
        "--heads",
        2,
        "--gamma",
        0.5,
        "--norm-eps",
        1e-5,
        "--no-attn-gate",
        "--no-tie",
        "--vocab",
        300,
        "--context",
        64,
        "-o",
        out,
    )
    assert r.exit_code == 0, r.stderr
    ck = checkpoint.load(out)
    cfg = ck.config
    assert (cfg.norm_eps, cfg.attn_gate, cfg.tie, cfg.vocab_size, cfg.context) == (1e-5, False, False, 300, 64)
    check_std(ck.get("transformer.h.0.mlp.c_fc.weight"), 32**-0.5, "c_fc")


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--width", 30, "--heads", 4], "do not divide"),
        (["--width", 32, "--heads", 4, "--gamma", 0], "--gamma"),
    ],
)
def test_cli_init_bad_input_exits_2(tmp_path, args, msg):
    out = tmp_path / "x.safetensors"
    r = cli("init", "--family", "llama", "--layers", 1, *args, "-o", out)
    assert r.exit_code == 2 and msg in r.stderr
    assert not out.exists()
