"""nanoGPT checkpoints in: grown, verified against nanoGPT's own arithmetic (written out here the
way nanoGPT's model.py computes it), folded to a GPT-2 folder that transformers loads."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from growtool.io import checkpoint

from helpers import cli

ARGS = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=96, dropout=0.0)
X = torch.randint(96, (2, 24), generator=torch.Generator().manual_seed(5))


def nanogpt_state(bias: bool, seed: int = 0) -> dict:
    """A state dict with nanoGPT's keys and layouts (nn.Linear [out, in], mask buffers, compile prefix)."""
    g = torch.Generator().manual_seed(seed)
    d, L = ARGS["n_embd"], ARGS["n_layer"]

    def r(*shape, s=0.05):
        return torch.randn(*shape, generator=g) * s

    sd = {"transformer.wte.weight": r(96, d, s=0.3), "transformer.wpe.weight": r(32, d, s=0.1)}
    for i in range(L):
        p = f"transformer.h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_2.weight"] = 1 + r(d, s=0.2), 1 + r(d, s=0.2)
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_proj.weight"] = r(3 * d, d, s=0.15), r(d, d, s=0.15)
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_proj.weight"] = r(4 * d, d, s=0.15), r(d, 4 * d, s=0.1)
        sd[p + "attn.bias"] = torch.tril(torch.ones(32, 32)).view(1, 1, 32, 32)  # the causal-mask buffer
        if bias:
            for n, k in (
                ("ln_1", d),
                ("ln_2", d),
                ("attn.c_attn", 3 * d),
                ("attn.c_proj", d),
                ("mlp.c_fc", 4 * d),
                ("mlp.c_proj", d),
            ):
                sd[p + n + ".bias"] = r(k, s=0.1)
    sd["transformer.ln_f.weight"] = 1 + r(d, s=0.2)
    if bias:
        sd["transformer.ln_f.bias"] = r(d, s=0.1)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # nanoGPT ties the head to wte
    return {"_orig_mod." + k: v for k, v in sd.items()}  # as saved after torch.compile


def nanogpt_forward(sd: dict, idx: torch.Tensor) -> torch.Tensor:
    """nanoGPT's GPT.forward (eval mode), line for line in functional form."""
    sd = {k.removeprefix("_orig_mod."): v for k, v in sd.items()}
    d, H = ARGS["n_embd"], ARGS["n_head"]
    B, T = idx.shape

    def ln(x, name):
        return F.layer_norm(x, (d,), sd[name + ".weight"], sd.get(name + ".bias"), 1e-5)

    def lin(x, name):
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][torch.arange(T)]
    for i in range(ARGS["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = lin(ln(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, d)
        x = x + lin(y, p + "attn.c_proj")
        x = x + lin(F.gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return F.linear(ln(x, "transformer.ln_f"), sd["lm_head.weight"])


def save_ckpt(path, bias: bool):
    sd = nanogpt_state(bias)
    torch.save(
        {
            "model": sd,
            "model_args": {**ARGS, "bias": bias},
            "iter_num": 1234,
            "best_val_loss": 1.5,
            "optimizer": {"state": {}, "param_groups": []},
            "config": {"dataset": "shakespeare_char"},
        },
        path,
    )
    return sd


def rel(a, b):
    return float((a - b).abs().max() / b.std())


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_checkpoint_grows_verifies_and_folds_to_gpt2(bias, tmp_path):
    ck_path = tmp_path / "ckpt.pt"
    sd = save_ckpt(ck_path, bias)
    ref = nanogpt_forward(sd, X)
    ck = checkpoint.load(ck_path)
    assert ck.config.family == "gpt2" and ck.config.activation == "gelu" and ck.lineage[0]["iter_num"] == 1234
    with torch.no_grad():
        assert rel(ck.model()(X), ref) <= 1e-5
    grown = tmp_path / "g.safetensors"
    r = cli("expand", ck_path, "--width", 96, "-o", grown, "-q")
    assert r.exit_code == 0, r.stderr
    with torch.no_grad():
        assert rel(checkpoint.load(grown).model()(X, alpha=0.0), ref) <= 1e-4
    transformers = pytest.importorskip("transformers")
    folded = tmp_path / "gpt2"
    assert cli("fold", grown, "--alpha", 0, "-o", folded).exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(folded).eval()
    assert type(back).__name__ == "GPT2LMHeadModel" and back.config.n_embd == 96
    with torch.no_grad():
        assert rel(back(X).logits, ref) <= 1e-4


def test_nanogpt_default_output_and_verify_cli(tmp_path):
    ck_path = tmp_path / "ckpt.pt"
    save_ckpt(ck_path, True)
    r = cli("expand", ck_path, "--width", 96, "-q")
    assert r.exit_code == 0 and r.stdout.strip().endswith("ckpt-d96.safetensors"), r.stderr
    assert cli("verify", ck_path, r.stdout.strip(), "--samples", 4).exit_code == 0


def test_unsafe_or_foreign_torch_files_are_refused_in_one_line(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    evil = tmp_path / "evil.pt"
    torch.save({"model": Evil(), "model_args": {}}, evil)
    r = cli("expand", evil, "--width", 96)
    assert r.exit_code == 2 and "weights_only" in r.stderr and "this must never run" not in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, other)
    r = cli("inspect", other)
    assert r.exit_code == 2 and "not a nanoGPT checkpoint" in r.stderr
