"""Learned growth operators (growtool.learned): SRIO-LO (the angle learned) and the LiGO-style operator."""

import itertools

import pytest
import torch

from growtool.check import compare, random_batches
from growtool.grow import ops, recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.lab import learned
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import expected_shapes, tensor_specs, unit_count
from growtool.nn.model import LM

from helpers import perturbed

D = 36  # 24 -> 36: a non-integer ratio (1.5x), heads 4 -> 6, KV groups 2 -> 3


def llama(tie=False, **kw):
    return ModelConfig(
        family="llama",
        vocab_size=48,
        width=24,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=6,
        ffn=48,
        context=32,
        norm_eps=1e-6,
        tie=tie,
        attn_gate=True,
        **kw,
    )


def gpt2():
    return ModelConfig(
        family="gpt2",
        vocab_size=48,
        width=24,
        layers=2,
        heads=4,
        kv_heads=4,
        head_dim=6,
        ffn=48,
        context=32,
        norm_eps=1e-5,
        tie=True,
        attn_gate=True,
    )


def source(cfg, seed=1):
    """A source with large-ish random weights (gamma 0.5) and perturbed gains, so the angle matters."""
    return perturbed(init_model(cfg, gamma=0.5, seed=seed), seed=seed).tensors()


def batch(vocab=48, seed=0, n=4, T=24):
    x = torch.randint(vocab, (n, T + 1), generator=torch.Generator().manual_seed(seed))
    return x[:, :-1], x[:, 1:]


def grown_loss(cfg, tensors, eps, xy, alpha=1.0):
    plan = build_plan(cfg, recipes.load("srio", {"rotation": {"eps": eps}}), D, seed=0)
    t = {n: grow_tensor(n, plan, tensors.__getitem__) for n, _, _ in plan.outputs()}
    return float(learned.lm_loss(LM(plan.cfg), t, *xy, alpha=alpha))


# ---- SRIO-LO -------------------------------------------------------------------------------


def test_tensor_eps_grows_the_same_tensors_as_float_eps():
    cfg = llama()
    T = source(cfg)
    plan = build_plan(cfg, recipes.load("srio", {"rotation": {"eps": 0.6}}), D, seed=0)
    import dataclasses

    tplan = dataclasses.replace(plan, eps=torch.tensor(0.6, requires_grad=True))
    for n, _, _ in plan.outputs():
        a, b = grow_tensor(n, plan, T.__getitem__), grow_tensor(n, tplan, T.__getitem__)
        assert torch.allclose(a, b, atol=1e-6, rtol=0), n


def test_plain_loss_is_flat_in_the_angle_on_llama_so_lookahead_zero_is_refused():
    """Every eps < 1 is the same function (rotated basis), gates closed or open: nothing to learn."""
    cfg = llama()
    T = source(cfg)
    xy = batch()
    for alpha in (0.0, 0.5, 1.0):
        assert abs(grown_loss(cfg, T, 0.3, xy, alpha) - grown_loss(cfg, T, 0.95, xy, alpha)) < 1e-5
    with pytest.raises(GrowError, match="does not depend on the angle"):
        learned.learn_srio_eps(cfg, T, learned.SrioGrowth(D), itertools.repeat(xy), steps=1, inner=learned.Lookahead(0))


def test_srio_lo_learns_an_angle_that_lowers_the_lookahead_loss_and_stays_exact(tmp_path):
    cfg = llama()
    T = source(cfg)
    xy = batch()
    obj = learned.SrioObjective(cfg, T, learned.SrioGrowth(D), learned.Lookahead(steps=1, lr=3e-3))
    # the toy task: after one sign step the loss depends on the angle
    with torch.no_grad():
        assert abs(float(obj(0.3, xy, xy)) - float(obj(0.95, xy, xy))) > 1e-3
    res = learned.learn_srio_eps(
        cfg, T, learned.SrioGrowth(D), itertools.repeat(xy), steps=6, lr=0.3, inner=learned.Lookahead(1, lr=3e-3)
    )
    assert 0.0 < res.eps < 1.0
    assert res.eps0 == pytest.approx((24 / 36) ** 0.5)
    assert abs(res.eps - res.eps0) > 1e-2
    assert res.tokens == 6 * 2 * xy[1].numel() and res.passes == 12 and len(res.history) == 6
    with torch.no_grad():
        assert float(obj(res.eps, xy, xy)) < float(obj(res.eps0, xy, xy))

    out = learned.save_srio_lo(str(tmp_path / "lo.safetensors"), cfg, T, learned.SrioGrowth(D, seed=0), res)
    ck = checkpoint.load(out)
    assert ck.config.width == D and ck.config.gated
    assert ck.lineage[-1]["eps"] == pytest.approx(res.eps) and ck.lineage[-1]["learned"]["op"] == "srio-lo"
    src = LM.from_tensors(cfg, T)
    c = compare(src, ck.model(), random_batches(48, 32, 6, seed=3), alpha=0.0)
    assert c.rel <= 1e-4 and c.top1 == 1.0
    # the learned angle is really in the file: its weights differ from the closed-form angle's
    plan0 = build_plan(cfg, recipes.load("srio"), D, seed=0)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (grow_tensor(q, plan0, T.__getitem__) - ck.get(q)).abs().max() > 1e-3


@pytest.mark.parametrize("cfg", [gpt2(), llama(tie=True)], ids=["gpt2-layernorm", "llama-tied"])
def test_srio_lo_refuses_families_where_the_angle_is_not_free(cfg):
    with pytest.raises(GrowError, match="untied head"):
        learned.learn_srio_eps(cfg, source(cfg), learned.SrioGrowth(D), itertools.repeat(batch()), steps=1)


def test_srio_lo_refuses_a_closed_gate():
    with pytest.raises(GrowError, match="alpha"):
        learned.learn_srio_eps(
            llama(),
            source(llama()),
            learned.SrioGrowth(D),
            itertools.repeat(batch()),
            steps=1,
            inner=learned.Lookahead(alpha=0.0),
        )


# ---- LiGO ----------------------------------------------------------------------------------


def static_expansion(cfg, T, seed):
    """The static growth LiGO starts from, built with ops.expand_axis from the plan's expansions."""
    r = recipes.load("srio", {"gate": False, "rotation": {"eps": 1.0}})
    plan = build_plan(cfg, r, D, seed=seed, allow_lossy=True)
    out = {}
    for name, spec in tensor_specs(cfg).items():
        t = T[name].float()
        layer = plan.specs[name][1]
        if spec.units:
            sizes = [n * b for n, b in (unit_count(cfg, k) for k in spec.units)]
            t = torch.cat(
                [
                    ops.expand_axis(seg, spec.unit_axis, plan.units[layer][k], unit_count(cfg, k)[1])
                    for k, seg in zip(spec.units, t.split(sizes, spec.unit_axis))
                ],
                spec.unit_axis,
            )
        if spec.res_axis is not None:
            t = ops.expand_axis(t, spec.res_axis, plan.res["attn"])
        elif spec.role in ("norm_gain", "norm_bias"):
            t = ops.expand_axis(t, 0, plan.res["attn"])
        out[name] = t
    return out


@pytest.mark.parametrize("make", [llama, gpt2], ids=["llama", "gpt2"])
def test_ligo_at_init_is_the_static_expansion(make):
    cfg = make()
    T = source(cfg)
    op = learned.LiGO(cfg, T, D, seed=5)
    want = static_expansion(cfg, T, seed=5)
    got = op.grown()
    assert set(got) == set(want) == set(expected_shapes(op.cfg))
    for n in want:
        assert got[n].shape == want[n].shape == expected_shapes(op.cfg)[n], n
        assert torch.allclose(got[n], want[n], atol=1e-6, rtol=1e-5), n
    assert not op.cfg.gated and op.cfg.width == D and op.cfg.heads == 6


def test_ligo_training_lowers_the_loss_and_touches_only_the_operator():
    cfg = llama()
    T = source(cfg)
    op = learned.LiGO(cfg, T, D, seed=0)
    xy = batch(seed=2)
    model = LM(op.cfg)
    before = float(learned.lm_loss(model, op.fold(), *xy))
    B0 = op.B.detach().clone()
    hist = op.fit(itertools.repeat(xy), steps=5, lr=1e-2)
    after = float(learned.lm_loss(model, op.fold(), *xy))
    assert len(hist) == 5 and hist[0]["loss"] == pytest.approx(before, rel=1e-5)
    assert after < before - 1e-3
    assert not torch.equal(op.B.detach(), B0)
    assert all(torch.equal(op.source[n], T[n].float()) for n in T)


def test_ligo_folded_checkpoint_loads_with_the_target_shapes(tmp_path):
    cfg = llama()
    T = source(cfg)
    op = learned.LiGO(cfg, T, D, seed=0)
    op.fit(itertools.repeat(batch()), steps=2, lr=1e-2)
    path = op.save(str(tmp_path / "ligo.safetensors"))
    ck = checkpoint.load(path)
    assert ck.config.width == D and not ck.config.gated
    assert {n: ck.shape(n) for n in ck.names()} == expected_shapes(op.cfg)
    assert ck.lineage[-1]["recipe"] == "ligo" and ck.lineage[-1]["learned"]["steps"] == 2
    folded = op.fold()
    assert all(torch.equal(ck.get(n), folded[n]) for n in folded)
    x, y = batch()
    _, loss = ck.model()(x, y)
    assert torch.isfinite(loss)


def test_ligo_refuses_a_gated_source():
    cfg = llama()
    plan = build_plan(cfg, recipes.load("srio"), D)
    T = source(cfg)
    grown = {n: grow_tensor(n, plan, T.__getitem__) for n, _, _ in plan.outputs()}
    with pytest.raises(GrowError, match="fold"):
        learned.LiGO(plan.cfg, grown, 48)
