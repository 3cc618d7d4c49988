"""AdamW moments grown with the model (growtool.grow.moments): the first-moment rule is the gradient's
own transformation (checked against the grown model's real gradient at gate 0), copied and padded
units take the source's moments by the stated rule, and the second-moment rotation rule is
(R o R) v."""

import pytest
import torch

from growtool.grow import ops, recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.moments import grow_moment, rotate_sq_
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.nn.model import LM

from helpers import make_config

WRITES_RESIDUAL = ("writer", "embedding", "writer_bias")


def grads(model: LM, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    return {
        n: p.grad.detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None and not n.endswith("growth_gate")
    }


def grown_pair(cfg, recipe, width=48, seed=0):
    src = init_model(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial norm gains, so folding and rescaling matter
        for n, p in src.named_parameters():
            if p.dim() == 1 and "growth_gate" not in n:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    t = {n: v.detach().clone() for n, v in src.tensors().items()}
    plan = build_plan(cfg, recipe, width, seed=seed)
    grown = LM.from_tensors(plan.cfg, {n: grow_tensor(n, plan, t.__getitem__) for n, _, _ in plan.outputs()})
    grown.set_gates(0.0)
    return src.train(), grown.train(), plan, t


def exact_mask(plan, name, shape):
    """Entries where the rule claims the grown gradient exactly: all but the new residual coordinates of
    tensors that write into the residual (their gradient there depends on readers' new columns)."""
    spec, _ = plan.specs[name]
    mask = torch.ones(shape, dtype=torch.bool)
    if spec.role in WRITES_RESIDUAL and spec.res_axis is not None:
        mask.narrow(spec.res_axis, plan.src.width, plan.cfg.width - plan.src.width).fill_(False)
    return mask


@pytest.mark.parametrize(
    "kv_heads,recipe",
    [
        (4, recipes.load("nrio")),  # zero padding, gated convex / tiled new units
        (4, recipes.load("copy", recipes.parse_set(["rotation.eps=1"]))),  # ungated Net2Net split copies
        (2, recipes.load("copy", recipes.parse_set(["rotation.eps=1"]))),  # GQA: KV groups copied with their heads
        (2, recipes.load("copy", recipes.parse_set(["rotation.eps=1", "split_alpha=0.7"]))),  # LEMON's unequal split
    ],
    ids=["nrio", "copy", "gqa-copy", "gqa-copy-unequal"],
)
def test_first_moment_rule_is_the_grown_models_gradient(kv_heads, recipe):
    cfg = make_config(width=32, layers=2, heads=4, kv_heads=kv_heads, vocab=64, attn_gate=True)
    src, grown, plan, t = grown_pair(cfg, recipe, width=64 if kv_heads == 2 else 48)
    x = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(3))
    gs, gg = grads(src, x), grads(grown, x)
    checked = 0
    for name, true in gg.items():
        m = grow_moment(name, plan, t.__getitem__, gs[name], second=False)
        v = grow_moment(name, plan, t.__getitem__, gs[name] ** 2, second=True)
        assert m.shape == true.shape, name
        mask = exact_mask(plan, name, true.shape)
        scale = true.abs().max().clamp_min(1e-12)
        assert ((m - true)[mask].abs().max() / scale) < 1e-4, name
        # v from a single gradient: the rule gives the square of the grown gradient (padding, copies, scales)
        assert ((v - true**2)[mask].abs().max() / scale**2) < 1e-4, name
        checked += int(mask.sum())
    assert checked > 0.5 * sum(p.numel() for p in grown.parameters())


def test_copied_and_padded_units_take_the_sources_moments():
    cfg = make_config(width=32, layers=1, heads=4, vocab=64)
    recipe = recipes.load("copy", recipes.parse_set(["rotation.eps=1"]))
    plan = build_plan(cfg, recipe, 48, seed=0)
    src = {n: v.detach() for n, v in init_model(cfg, seed=0).tensors().items()}
    e = plan.units[0]["ffn"]
    split = plan.split[0]["ffn"]
    for name, writer in (("model.layers.0.mlp.up_proj.weight", False), ("model.layers.0.mlp.down_proj.weight", True)):
        spec, _ = plan.specs[name]
        m, v = torch.randn(src[name].shape), torch.rand(src[name].shape)
        gm = grow_moment(name, plan, src.__getitem__, m, second=False)
        gv = grow_moment(name, plan, src.__getitem__, v, second=True)
        old = [slice(None)] * 2
        old[spec.res_axis] = slice(0, cfg.width)
        for j in range(e.added):
            k = int(e.index[j, 0])  # new unit n + j copies old unit k
            f = 1.0 if writer else float(split[k])
            new_u = gm.select(spec.unit_axis, e.n + j)[old[spec.res_axis]]
            src_u = m.select(spec.unit_axis, k)
            assert torch.allclose(new_u, f * src_u) and torch.allclose(
                gm.select(spec.unit_axis, k)[: cfg.width], f * src_u
            )
            assert torch.allclose(gv.select(spec.unit_axis, e.n + j)[: cfg.width], f * f * v.select(spec.unit_axis, k))
        # padded residual coordinates start at zero
        assert gm.narrow(spec.res_axis, cfg.width, 16).abs().max() == 0
    # gated (srio/nrio) new units: zero moments; old units' moments kept bit for bit (no rotation)
    plan = build_plan(cfg, recipes.load("nrio"), 48, seed=0)
    name = "model.layers.0.mlp.up_proj.weight"
    m = torch.randn(src[name].shape)
    gm = grow_moment(name, plan, src.__getitem__, m, second=False)
    assert torch.equal(gm[: cfg.ffn, : cfg.width], m) and gm[cfg.ffn :].abs().max() == 0


@pytest.mark.parametrize("eps", [0.3, 0.8165, 0.99])
def test_rotation_rules(eps):
    d, D = 5, 9
    R = ops.rotate(torch.eye(D, dtype=torch.float64), d, eps, axis=0)  # column j = R e_j
    assert torch.allclose(R @ R.T, torch.eye(D, dtype=torch.float64), atol=1e-12)
    v = torch.rand(3, D, dtype=torch.float64)
    assert torch.allclose(rotate_sq_(v.clone(), d, eps, axis=1), v @ (R**2).T, atol=1e-12)
    m = torch.randn(3, D, dtype=torch.float64)
    assert torch.allclose(ops.rotate(m, d, eps, axis=1), m @ R.T, atol=1e-12)
    assert torch.allclose(rotate_sq_(v.clone(), d, eps, axis=1).sum(), v.sum())  # R o R is doubly stochastic


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
@pytest.mark.parametrize("recipe", ["nrio", "copy"])
def test_first_moment_rule_holds_for_latent_attention_and_its_moe(family, recipe):
    """MLA (latent readers as routers, kept latent norms, heads as rows of q_b_proj / kv_b_proj) with a
    dense block and an MoE block: the first-moment rule is the grown model's gradient there too."""
    from growtool.nn.config import ModelConfig

    mla = dict(q_lora_rank=12 if family == "deepseek_v3" else None, kv_lora_rank=8, qk_nope_head_dim=8, v_head_dim=6)
    moe = dict(experts=4, top_k=2, n_group=2, topk_group=1, shared_experts=1, shared_ffn=24, moe_layers=[0, 1])
    cfg = ModelConfig(family, 64, 32, 2, 4, 4, 4, 24, context=32, dense_ffn=40, **mla, **moe)
    r = recipes.load(recipe, recipes.parse_set(["rotation.eps=1"]) if recipe == "copy" else None)
    src, grown, plan, t = grown_pair(cfg, r, width=48)
    assert plan.cfg.heads == 6 and plan.cfg.q_lora_rank == cfg.q_lora_rank
    x = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(3))
    gs, gg = grads(src, x), grads(grown, x)
    assert any("kv_b_proj" in n for n in gg) and any("experts" in n for n in gg)
    for name, true in gg.items():
        m = grow_moment(name, plan, t.__getitem__, gs[name], second=False)
        mask = exact_mask(plan, name, true.shape)
        assert ((m - true)[mask].abs().max() / true.abs().max().clamp_min(1e-12)) < 1e-4, name
