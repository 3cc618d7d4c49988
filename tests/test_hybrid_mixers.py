"""Hybrid families of issue 44, what is particular to their mixer layers (their rows of the architecture
table go through test_architectures' forward, round trip and test_depth's cases like every row):

* LFM2: gated short-convolution layers beside attention layers (``layer_types``); the conv channels are
  one per residual dim, so width growth adds channels behind the growth gate; depth growth keeps each
  copied block's kind; its MLP size rule and its Hub spelling.
* Qwen3-Next: Gated DeltaNet layers beside attention layers whose output passes a per-element sigmoid gate
  (q_proj holds [q | gate] per head); the delta rule, the zero-centred norms and the output gate each bite;
  width growth keeps the mixer's inner tensors and sizes (only the residual side of its projections grows);
  its layer types by ``full_attention_interval``.
* Qwen3.5 (``qwen3_5_text``, ``qwen3_5_moe_text``): Qwen3-Next's blocks with the mixer's projections split
  (in_proj_qkv / z / b / a), a dense MLP or Qwen3-Next's MoE with its top-k always renormalised.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402
from growtool.nn import deltanet, families  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import FAMILY_X as X  # noqa: E402
from arch_cases import GDN_ATTN, hf_logits, make_source, rel  # noqa: E402
from helpers import cli, verify_json  # noqa: E402

CONV = "model.layers.0.conv."  # lfm2-conv-attn: block 0 is a conv layer, block 1 attention


def test_lfm2_causal_short_convolution_bites(tmp_path):
    """The conv layer is read as transformers runs it: with its kernel reversed in time (another
    causal filter) or its gating projection C cleared, the logits differ."""
    model = make_source("lfm2-conv-attn", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    t = {n: ck.get(n) for n in ck.names()}
    with torch.no_grad():
        assert rel(LM.from_tensors(ck.config, t)(X), hf_logits(model)) <= 1e-5
        flipped = {**t, CONV + "conv.weight": t[CONV + "conv.weight"].flip(-1)}
        assert rel(LM.from_tensors(ck.config, flipped)(X), hf_logits(model)) > 1e-3
        w = t[CONV + "in_proj.weight"].clone()
        w[64:128] = 0  # C: the output gate of every channel
        assert rel(LM.from_tensors(ck.config, {**t, CONV + "in_proj.weight": w})(X), hf_logits(model)) > 1e-3


def test_lfm2_width_adds_conv_channels_behind_the_gate(tmp_path):
    """64 -> 96: in_proj [B|C|x] 192x64 -> 288x96, the depthwise kernel 64 -> 96 channels, out_proj 96x96;
    the 32 new channels write through the growth gate (base_conv 64): grown as mixtures of old channels,
    without the gate the logits differ."""
    model = make_source("lfm2-conv-attn", tmp_path / "src")
    g = tmp_path / "g.safetensors"
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", g).exit_code == 0
    ck = checkpoint.load(g)
    assert ck.get(CONV + "in_proj.weight").shape == (288, 96) and ck.get(CONV + "conv.weight").shape == (96, 1, 3)
    assert ck.get(CONV + "out_proj.weight").shape == (96, 96) and ck.config.base_conv == 64
    assert "model.layers.0.self_attn.q_proj.weight" not in ck.names()  # a conv layer has no attention
    code, rep = verify_json(tmp_path / "src", g)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    g = tmp_path / "convex.safetensors"  # new channels mixing old ones (srio tiles them into the new dims)
    assert cli("expand", tmp_path / "src", "--width", 96, "--set", "ffn.new_units=convex", "-q", "-o", g).exit_code == 0
    ck = checkpoint.load(g)
    t = {n: ck.get(n) for n in ck.names()}
    with torch.no_grad():
        assert rel(LM.from_tensors(ck.config, t)(X, alpha=0.0), hf_logits(model)) <= 1e-4
        ungated = ck.config.replace(base_conv=None)  # the conv channels open, everything else gated
        assert rel(LM.from_tensors(ungated, t)(X, alpha=0.0), hf_logits(model)) > 1e-3


def test_lfm2_depth_keeps_each_blocks_kind_in_the_hub_spelling(tmp_path):
    """A config as the Hub spells it (``full_attn_idxs``, ``block_ff_dim``, ``tie_embedding``) grows to 4
    blocks: layer_types and full_attn_idxs follow the copied blocks, each copy holds its source's tensors
    (conv or attention), and the folded folder loads in transformers with the source's logits."""
    model = make_source("lfm2-conv-attn", tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    del hf["layer_types"]
    hf.update(full_attn_idxs=[1], block_ff_dim=hf.pop("intermediate_size"), tie_embedding=False)
    (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    g = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--layers", 4, "--depth-method", "interleave", "-q", "-o", g)
    assert r.exit_code == 0, r.stderr
    ck = checkpoint.load(g)
    assert ck.config.block_types == ["conv", "conv", "full_attention", "full_attention"]
    assert ck.get("model.layers.1.conv.conv.weight").equal(ck.get("model.layers.0.conv.conv.weight"))
    assert "model.layers.3.self_attn.q_layernorm.weight" in ck.names()
    assert cli("fold", g, "--alpha", 0, "-o", tmp_path / "f").exit_code == 0
    out = json.loads((tmp_path / "f" / "config.json").read_text())
    assert out["full_attn_idxs"] == [2, 3] and out["block_ff_dim"] == out["intermediate_size"] == 112
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f").eval()
    assert back.config.layer_types == ck.config.block_types and back.model.layers[1].conv.conv.weight.shape[0] == 64
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"block_multiple_of": 16},
        {"block_multiple_of": 16, "block_ffn_dim_multiplier": 1.5},
        {"block_auto_adjust_ff_dim": False},
    ],
)
def test_lfm2_mlp_size_is_transformers_rule_and_written_as_is(over):
    """LFM2's MLP has 2/3 of intermediate_size neurons, times a multiplier, rounded up to a multiple
    (where block_auto_adjust_ff_dim): read as transformers builds it; written as the size itself."""
    kw = dict(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    hf = {**transformers.Lfm2Config(**kw, intermediate_size=160).to_dict(), **over}
    cfg = ModelConfig.from_hf(hf)
    built = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**hf))
    assert cfg.ffn == built.model.layers[0].feed_forward.w1.out_features
    out = cfg.to_hf()
    assert out["intermediate_size"] == cfg.ffn and out["block_auto_adjust_ff_dim"] is False
    assert ModelConfig.from_hf(out).ffn == cfg.ffn


def test_lfm2_unknown_layer_type_is_refused_with_one_line():
    hf = transformers.Lfm2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2).to_dict()
    hf.update(num_hidden_layers=2, layer_types=["conv", "sliding_attention"])
    with pytest.raises(GrowError, match=r"^lfm2 block type .sliding_attention. is not supported \(supported: conv,"):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize("name, module", [("lfm2-tied-bias-kernel4", "shortconv"), ("qwen3_next-gdn-moe", "deltanet")])
def test_a_gated_hybrid_folder_runs_through_the_remote_code_with_the_source_function(name, module, tmp_path):
    """A grown, unfolded hybrid folder (gated units and a new block) loads through the modeling file
    growtool writes beside it, the mixer's module included, with the source's logits at gate 0."""
    model = make_source(name, tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "--layers", 3, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "g" / f"{module}.py").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g", trust_remote_code=True).eval()
    with torch.no_grad():
        assert rel(back(X).logits, hf_logits(model)) <= 1e-4


GDN = "model.layers.0.linear_attn."  # qwen3_next-gdn-moe: block 0 is a Gated DeltaNet layer, block 1 attention


def _plain_linear_attention(q, k, v, g, beta):
    """The gated delta rule without its delta correction: S <- exp(g) S + beta k v^T."""
    S = torch.zeros(*k.shape[:1], k.shape[2], k.shape[3], v.shape[-1], dtype=v.dtype)
    out = []
    for t in range(k.shape[1]):
        S = S * g[:, t].exp()[..., None, None] + beta[:, t, :, None, None] * k[:, t, ..., None] * v[:, t, :, None]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, 1)


def test_qwen3_next_mechanisms_bite(tmp_path, monkeypatch):
    """Our forward equals transformers' (its chunked delta rule, ours token by token); read without the
    delta correction, with the norms' gains as w instead of 1 + w, or with the attention's output gate
    open (its bias at +1e4: sigmoid 1), the logits differ."""
    model = make_source("qwen3_next-tied-bias-interval2", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    t = {n: ck.get(n) for n in ck.names()}
    want = hf_logits(model)
    with torch.no_grad():
        assert rel(LM.from_tensors(ck.config, t)(X), want) <= 1e-5
        b = t["model.layers.1.self_attn.q_proj.bias"].clone().view(ck.config.heads, 2, -1)
        b[:, 1] = 1e4
        opened = {**t, "model.layers.1.self_attn.q_proj.bias": b.reshape(-1)}
        assert rel(LM.from_tensors(ck.config, opened)(X), want) > 1e-3
        a = families.ARCHS["qwen3_next"]
        plain = dataclasses.replace(a, features=dataclasses.replace(a.features, norm_offset=0.0))
        monkeypatch.setitem(families.ARCHS, "qwen3_next", plain)
        assert rel(LM.from_tensors(ck.config, t)(X), want) > 1e-3
        monkeypatch.setitem(families.ARCHS, "qwen3_next", a)
        monkeypatch.setattr(deltanet, "delta_rule", _plain_linear_attention)
        assert rel(LM.from_tensors(ck.config, t)(X), want) > 1e-3


def test_qwen3_next_width_keeps_the_mixers_inner_tensors(tmp_path):
    """64 -> 96: the Gated DeltaNet's conv kernel, A_log, dt_bias and inner norm are kept bit for bit, its
    projections keep their inner sizes (in_proj_qkvz 128 x 64 -> 128 x 96, out_proj 64 x 32 -> 96 x 32);
    rms_norm_eps is kept (the residual is scaled by sqrt(D/d) instead) and verify passes."""
    make_source("qwen3_next-gdn-moe", tmp_path / "src")
    src = checkpoint.load(tmp_path / "src")
    g = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", g)
    assert r.exit_code == 0 and "inner units kept" in r.stderr, r.stderr
    ck = checkpoint.load(g)
    for n in ("conv1d.weight", "A_log", "dt_bias", "norm.weight"):
        assert torch.equal(ck.get(GDN + n), src.get(GDN + n)), n
    assert src.get(GDN + "in_proj_qkvz.weight").shape == (128, 64)
    assert ck.get(GDN + "in_proj_qkvz.weight").shape == (128, 96)
    assert ck.get(GDN + "in_proj_ba.weight").shape == (8, 96) and ck.get(GDN + "out_proj.weight").shape == (96, 32)
    assert ck.config.norm_eps == src.config.norm_eps == 1e-6
    assert ck.get("model.layers.1.self_attn.q_proj.weight").shape == (192, 96)  # 6 heads x [q | gate] x 16
    code, rep = verify_json(tmp_path / "src", g)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep


def test_qwen3_next_layer_types_by_interval_and_depth_keeps_each_kind(tmp_path):
    """Without layer_types, every full_attention_interval-th layer is attention (as transformers reads it);
    depth growth writes the list out with each copied block's kind, and the folded folder loads."""
    model = make_source("qwen3_next-gdn-moe", tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    del hf["layer_types"]
    hf["full_attention_interval"] = 2
    (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    assert checkpoint.load(tmp_path / "src").config.block_types == ["linear_attention", "full_attention"]
    g = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--layers", 4, "--depth-method", "stack", "-q", "-o", g)
    assert r.exit_code == 0, r.stderr
    ck = checkpoint.load(g)
    assert ck.config.block_types == ["linear_attention", "full_attention"] * 2
    assert torch.equal(ck.get("model.layers.2.linear_attn.A_log"), ck.get(GDN + "A_log"))
    assert cli("fold", g, "--alpha", 0, "-o", tmp_path / "f").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f").eval()
    assert back.config.layer_types == ck.config.block_types
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


def test_qwen3_5_split_projections_grow_on_the_residual_side_only(tmp_path):
    """Qwen3.5's text decoder: the mixer's four projections (in_proj_qkv 96, z 32, b 4, a 4 outputs) keep
    their inner sizes and grow their residual side; the inner tensors are kept bit for bit; verify passes."""
    make_source("qwen3_5_text-gdn", tmp_path / "src")
    src = checkpoint.load(tmp_path / "src")
    g = tmp_path / "g.safetensors"
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", g).exit_code == 0
    ck = checkpoint.load(g)
    sizes = {"qkv": 96, "z": 32, "b": 4, "a": 4}
    assert all(ck.get(f"{GDN}in_proj_{n}.weight").shape == (k, 96) for n, k in sizes.items())
    assert all(src.get(f"{GDN}in_proj_{n}.weight").shape == (k, 64) for n, k in sizes.items())
    assert all(torch.equal(ck.get(GDN + n), src.get(GDN + n)) for n in ("conv1d.weight", "A_log", "dt_bias"))
    code, rep = verify_json(tmp_path / "src", g)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep


def test_qwen3_5_moe_always_renormalises_its_top_k(tmp_path, monkeypatch):
    """Qwen3.5-MoE's router renormalises the top-k weights whatever the config says (no norm_topk_prob key):
    read without it, the logits differ."""
    model = make_source("qwen3_5_moe_text-tied", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.norm_topk and "norm_topk_prob" not in json.loads((tmp_path / "src" / "config.json").read_text())
    t = {n: ck.get(n) for n in ck.names()}
    with torch.no_grad():
        assert rel(LM.from_tensors(ck.config, t)(X), hf_logits(model)) <= 1e-5
        a = families.ARCHS["qwen3_5_moe_text"]
        monkeypatch.setitem(families.ARCHS, a.name, dataclasses.replace(a, fixed={**a.fixed, "norm_topk": False}))
        assert rel(LM.from_tensors(ck.config.replace(), t)(X), hf_logits(model)) > 1e-3


@pytest.mark.parametrize(
    "over, match",
    [
        ({"linear_num_value_heads": 3}, "linear_num_key_heads must divide linear_num_value_heads"),
        ({"linear_key_head_dim": None}, "needs config linear_key_head_dim, a positive integer, got None"),
        ({"linear_conv_kernel_dim": 0}, "needs config linear_conv_kernel_dim, a positive integer, got 0"),
    ],
)
def test_bad_gated_deltanet_sizes_are_refused_with_one_line(over, match):
    hf = transformers.Qwen3_5TextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    with pytest.raises(GrowError, match=f"^qwen3_5_text's Gated DeltaNet.*{match}"):
        ModelConfig.from_hf({**hf.to_dict(), "linear_num_key_heads": 2, "linear_num_value_heads": 4, **over})


GDN_SIZES = dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)


@pytest.mark.parametrize(
    "family, kinds, extra",
    [("lfm2", ["conv", "full_attention"], {"conv_L_cache": 3}), ("qwen3_5_text", GDN_ATTN, GDN_SIZES)],
)
def test_a_hybrid_trains_through_a_growth_in_the_run(family, kinds, extra, tmp_path):
    """train --grow-at 0.5:width=48,layers=4 on an LFM2 / Qwen3.5 model made here: its blocks, their kinds and
    the AdamW moments grow inside the run (no loss bump at the growth), and the final model is the grown one."""
    from growtool.init import init_model
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    from helpers import make_text

    (tmp_path / "toy.txt").write_text(make_text(1500))
    cfg = ModelConfig(family, 256, 32, 2, 2, 2, 16, 64, context=64, tie=False, block_types=kinds, extra=extra)
    base = checkpoint.save_tensors(str(tmp_path / "base.safetensors"), cfg, [], init_model(cfg, seed=0).tensors())
    kw = dict(batch=8, seq=32, eval_batches=1, device="cpu", progress=False, lr=1e-2, gate_warmup_tokens=512)
    out = train(base, [tmp_path / "toy.txt"], tmp_path / "run", steps=8, grow_at=("0.5:width=48,layers=4",), **kw)
    final = checkpoint.load(out["final"]).config
    assert (final.width, final.layers, final.block_types) == (48, 4, kinds * 2)  # stacked copies keep their kinds
    loss = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert loss[5] < loss[4] + 0.05
