"""GPT-OSS (issue 44): what is particular to it, beyond the width and depth cases of its rows in
tests/arch_cases.py and tests/test_depth.py: attention sinks, the router's bias, the clamped GLU of
its experts, each against transformers' own function and each shown to bite."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.gpt_oss import modeling_gpt_oss as hf_oss  # noqa: E402

from growtool.io import checkpoint  # noqa: E402
from growtool.nn.attention import explicit  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.nn.model import LM  # noqa: E402
from growtool.nn.moe import clamped_glu  # noqa: E402

from arch_cases import CASES, hf_logits, make_source, rel  # noqa: E402
from arch_cases import FAMILY_X as X  # noqa: E402
from helpers import cli, make_text, perturbed, tiny_cfg, verify_json  # noqa: E402


def _qkv(B=2, H=4, K=2, T=10, hd=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, n, T, hd, generator=g) for n in (H, K, K)] + [3 * torch.randn(H, generator=g)]


@pytest.mark.parametrize("window", [None, 3])
def test_sink_attention_equals_transformers_eager(window):
    """Each head's softmax over its scores and its sink logit, the sink's share dropped: as
    transformers' eager GPT-OSS attention (an additive mask of finfo.min), on causal and sliding masks.
    Without the sinks (or with sinks of -inf) the output differs."""
    q, k, v, sinks = _qkv()
    T, hd = q.shape[2], q.shape[3]
    i = torch.arange(T)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep = keep & (i[:, None] - i[None, :] < window)
    add = torch.zeros(T, T).masked_fill(~keep, torch.finfo(torch.float32).min)[None, None]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=2, training=False)
    want, _ = hf_oss.eager_attention_forward(module, q, k, v, add, scaling=hd**-0.5)  # [B, T, H, hd]
    got = explicit(q, k, v, keep, hd**-0.5, sinks=sinks).transpose(1, 2)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    without = explicit(q, k, v, keep, hd**-0.5).transpose(1, 2)
    assert (without - want).abs().max() > 1e-2
    none = explicit(q, k, v, keep, hd**-0.5, sinks=torch.full_like(sinks, float("-inf"))).transpose(1, 2)
    assert torch.allclose(none, without, atol=1e-6)


def test_clamped_glu_equals_transformers_and_its_clamps_bite():
    """(clamp(up, +-limit) + 1) x g sigmoid(alpha g), g = min(gate, limit), on GPT-OSS's interleaved
    [g_0 u_0 g_1 u_1 ..] pairs, as transformers' GptOssExperts applies it; without the clamps (or the
    +1) it differs."""
    cfg = transformers.GptOssConfig(swiglu_alpha=1.702, swiglu_limit=1.5)
    experts = hf_oss.GptOssExperts(cfg)
    gate_up = 3 * torch.randn(5, 2 * 16, generator=torch.Generator().manual_seed(0))
    want = experts._apply_gate(gate_up)
    got = clamped_glu(gate_up[..., ::2], gate_up[..., 1::2], 1.702, 1.5)
    assert torch.allclose(got, want, atol=1e-6)
    loose = clamped_glu(gate_up[..., ::2], gate_up[..., 1::2], 1.702, 1e9)
    assert (loose - want).abs().max() > 1e-1
    zero = torch.zeros(3, 4)
    assert torch.equal(clamped_glu(zero, zero, 1.702, 1.5), zero)  # a zero neuron writes nothing


def _logits(cfg, tensors, x=X):
    with torch.no_grad():
        return LM.from_tensors(cfg, tensors)(x)


def test_gpt_oss_each_mechanism_bites(tmp_path):
    """GPT-OSS's forward equals transformers'; leaving out any of its mechanisms - the sinks (as -inf),
    the router's bias, the experts' biases, the GLU's clamps - changes the logits."""
    model = make_source("gpt_oss-window-yarn", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    want, t = hf_logits(model), {n: ck.get(n) for n in ck.names()}
    assert rel(_logits(ck.config, t), want) <= 1e-5
    changes = {
        "self_attn.sinks": lambda v: torch.full_like(v, float("-inf")),
        "mlp.router.bias": torch.zeros_like,
        "mlp.experts.gate_up_proj_bias": torch.zeros_like,
        "mlp.experts.down_proj_bias": torch.zeros_like,
    }
    for part, change in changes.items():
        names = [n for n in t if n.endswith(part)]
        assert len(names) == 2, part
        assert rel(_logits(ck.config, {**t, **{n: change(t[n]) for n in names}}), want) > 1e-3, part
    assert ck.config.swiglu_limit == 1.0 and ck.config.swiglu_alpha == 1.702
    assert rel(_logits(ck.config.replace(swiglu_limit=1e9), t), want) > 1e-3


def test_gpt_oss_width_growth_keeps_router_bias_and_grows_sinks_with_their_heads(tmp_path):
    """Width growth keeps the router's bias and every old head's sink bit for bit; a new query head's
    sink is made as its q/k/v are (the recipe's copy or mixture of old heads). Under ``copy`` (no gate:
    a copied head and its source split one output) the copy must attend as its source, so it takes
    its source's sink: the grown model computes the source's function, and with the new heads' sinks
    at 0 instead it would not. (Under a gate, a new head writes nothing at gate 0 whatever its sink.)"""
    model = make_source("gpt_oss-window-yarn", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 128, "--recipe", "copy", "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    g = checkpoint.load(tmp_path / "g")
    t = {n: g.get(n) for n in g.names()}
    assert g.config.heads == 8 and not g.config.gated
    for i in range(2):
        b = f"model.layers.{i}."
        assert torch.equal(t[b + "mlp.router.bias"], ck.get(b + "mlp.router.bias"))
        old, new = ck.get(b + "self_attn.sinks"), t[b + "self_attn.sinks"]
        assert torch.equal(new[:4], old) and all(bool((old == s).any()) for s in new[4:])
    want = hf_logits(model)
    assert rel(_logits(g.config, t), want) <= 1e-4
    zeroed = {n: torch.cat([v[:4], torch.zeros(4)]) for n, v in t.items() if n.endswith("sinks")}
    assert rel(_logits(g.config, {**t, **zeroed}), want) > 1e-3


def test_gpt_oss_configs_of_the_hub_read_as_transformers_reads_them(tmp_path):
    """The Hub's gpt-oss config.json also spells the experts per token ``experts_per_token``; a
    quantized (MXFP4) checkpoint is refused with one line."""
    hf = transformers.GptOssConfig(num_experts_per_tok=4, num_local_experts=8).to_dict()
    hub = {**{k: v for k, v in hf.items() if k != "num_experts_per_tok"}, "experts_per_token": 2}
    assert ModelConfig.from_hf(hub).top_k == 2 and ModelConfig.from_hf(hf).top_k == 4
    made = ModelConfig(
        "gpt_oss", vocab_size=64, width=32, layers=2, heads=4, kv_heads=2, head_dim=8, ffn=16, experts=2, top_k=1
    )
    assert (made.swiglu_alpha, made.swiglu_limit) == (1.702, 7.0)  # a config made in code: the family's defaults
    with pytest.raises(GrowError, match="MXFP4"):
        ModelConfig.from_hf({**hf, "quantization_config": {"quant_method": "mxfp4"}})


def _router_logits(model, x, alpha=None):
    """Each block's router logits (with its bias) on ``x``."""
    out = []
    hooks = [b.slot["router"].register_forward_hook(lambda m, i, o: out.append(o.detach())) for b in model.blocks]
    with torch.no_grad():
        model(x, alpha=alpha)
    for h in hooks:
        h.remove()
    return out


@pytest.mark.parametrize("ffn", [None, 96])
def test_gpt_oss_tokens_keep_their_experts_and_the_gated_folder_loads(ffn, tmp_path):
    """Gate 0: every block's router (its bias kept) sees the same logits, so every token goes to the
    same experts with the same weights; each expert's neurons grew (3/2, or ``--ffn``) as interleaved
    (gate, up) pairs behind the gate, with their biases, and each expert's writer bias [E, d] with the
    width. The gated folder loads through its own modeling code with the source's logits at gate 0."""
    model = make_source("gpt_oss-window-yarn", tmp_path / "src")
    src = checkpoint.load(tmp_path / "src")
    args = ("--ffn", ffn) if ffn else ()
    assert cli("expand", tmp_path / "src", "--width", 96, *args, "-q", "-o", tmp_path / "g").exit_code == 0
    g = checkpoint.load(tmp_path / "g")
    f = ffn or 72
    assert (g.config.ffn, g.config.base_ffn, g.config.experts) == (f, 48, 4)
    e = "model.layers.1.mlp.experts."
    shapes = {
        n: tuple(g.get(e + n).shape) for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
    }
    assert shapes == {
        "gate_up_proj": (4, 96, 2 * f),
        "gate_up_proj_bias": (4, 2 * f),
        "down_proj": (4, f, 96),
        "down_proj_bias": (4, 96),
    }
    assert torch.equal(g.get(e + "gate_up_proj_bias")[:, :96], src.get(e + "gate_up_proj_bias"))  # old pairs kept
    x = torch.randint(256, (4, 20), generator=torch.Generator().manual_seed(7))
    before, after = _router_logits(src.model(), x), _router_logits(g.model(), x, alpha=0.0)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a.topk(2).indices, b.topk(2).indices) and (a - b).abs().max() <= 1e-5
    assert len(set(torch.cat(before).topk(2).indices.flatten().tolist())) == 4  # every expert is used
    remote = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g", trust_remote_code=True).eval()
    with torch.no_grad():
        assert rel(remote(X, alpha=0.0).logits, hf_logits(model)) <= 1e-4


def test_gpt_oss_in_bf16_shards_grows_and_verifies_with_defaults(tmp_path):
    """GPT-OSS as its dequantized checkpoints ship (bf16, in shards): read with transformers' logits,
    grown 1.5x in bf16 with every default, and verify passes. Computed in float32, the grown model is
    within the source's own bf16-vs-float32 distance (measured 0.030 against 0.032 x logit scale: the
    rotation re-rounds every reader and writer to bf16 once, an error of the size of a bf16 forward
    pass); grown into float32 it is exact."""
    make, kw = CASES["gpt_oss-window-yarn"]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "src", max_shard_size="60KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").exists()
    ck = checkpoint.load(tmp_path / "src")
    assert ck.main_dtype() == torch.bfloat16
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.float32).eval()
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(ref)) <= 1e-5
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    assert checkpoint.load(tmp_path / "g").main_dtype() == torch.bfloat16
    code, rep = verify_json(tmp_path / "src", tmp_path / "g")
    assert code == 0, rep
    # the one more rounding of the grown weights (float32 math), against the source's own bf16 noise
    g, t = checkpoint.load(tmp_path / "g"), {n: ck.get(n) for n in ck.names()}
    with torch.no_grad():
        src32, src16 = ck.model()(X), LM.from_tensors(ck.config, t, dtype=torch.bfloat16)(X).float()
        growth_error, own_noise = rel(g.model()(X, alpha=0.0), src32), rel(src16, src32)
    assert growth_error <= own_noise and growth_error <= 5e-2, (growth_error, own_noise)
    # grown into float32 instead, nothing is rounded: exact at gate 0
    assert (
        cli("expand", tmp_path / "src", "--width", 96, "--dtype", "float32", "-q", "-o", tmp_path / "f").exit_code == 0
    )
    with torch.no_grad():
        assert rel(checkpoint.load(tmp_path / "f").model()(X, alpha=0.0), src32) <= 1e-5


def test_a_gpt_oss_run_grows_mid_run_with_its_optimizer_state_and_resumes_exactly(tmp_path):
    """``train --grow-at 0.5:width=48,layers=3`` on a GPT-OSS: the sinks, the router's bias and the biased
    fused experts grow with their AdamW moments (a run stopped and resumed around the growth ends bit for
    bit where the straight run does), and the loss does not jump at the growth."""
    from growtool.init import init_model
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    (tmp_path / "toy.txt").write_text(make_text(1500))
    cfg = tiny_cfg(layers=2, family="gpt_oss", experts=3, top_k=2, ffn=24)
    base = checkpoint.save_tensors(str(tmp_path / "base.safetensors"), cfg, [], init_model(cfg, seed=0).tensors())
    kw = dict(batch=8, seq=32, eval_batches=1, device="cpu", progress=False, lr=1e-2, steps=8, save_every=2)
    kw.update(grow_at=("0.5:width=48,layers=3",), gate_warmup_tokens=512)
    a = train(base, [tmp_path / "toy.txt"], tmp_path / "a", **kw)
    train(base, [tmp_path / "toy.txt"], tmp_path / "b", stop_at=3, **kw)
    b = train(base, [tmp_path / "toy.txt"], tmp_path / "b", resume=True, **kw)
    ra, rb = (read_metrics(tmp_path / r / "metrics.jsonl") for r in "ab")
    assert [{k: v for k, v in r.items() if k != "tok_s"} for r in ra] == [
        {k: v for k, v in r.items() if k != "tok_s"} for r in rb
    ]
    final = checkpoint.load(a["final"])
    assert final.sha256() == checkpoint.load(b["final"]).sha256()
    assert (final.config.width, final.config.layers, final.config.ffn) == (48, 3, 36)
    assert final.get("model.layers.2.self_attn.sinks").abs().sum() > 0  # the sinks trained
    assert ra[5]["loss"] < ra[4]["loss"] + 0.05
