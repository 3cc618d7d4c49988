"""Issue 40's symmetry breakers keep the function exact at gate 0, in every family and at any ratio.

* ``pair_noise``: writer-side cancelling pairs on split copies (copy v f + delta, source v f - delta);
* ``split_alpha``: LEMON's unequal split (alpha v and (1 - alpha) v);
* gated new units that read the old residual (``ffn.new_units: convex`` under srio / nrio) with
  reader ``noise``: not a zero-gradient saddle once the gate opens.

Each option must leave gate 0 exact (float32, 1e-4 x the logit scale, as tests/test_properties.py)
and must change the grown weights where it claims to (and nowhere else).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from growtool.check import compare, random_batches
from growtool.grow import ops, recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.model import LM

from helpers import random_tensors
from strategies import growth_cases

COPY_OPTIONS = [{"pair_noise": 0.3}, {"split_alpha": 0.7}, {"split_alpha": 0.3, "pair_noise": 0.1}]
GATED_OPTIONS = [{"ffn": {"new_units": "convex"}, "noise": 0.2}, {"ffn": {"new_units": "copy"}, "noise": 0.2}]


def _grow(cfg, src, recipe, over, D, seed):
    plan = build_plan(cfg, recipes.load(recipe, over), D, seed=seed)
    return plan, {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}


@st.composite
def breaker_cases(draw):
    cfg, D, recipe, seed = draw(growth_cases())
    if recipe == "copy":
        over = draw(st.sampled_from(COPY_OPTIONS))
    else:
        over = draw(st.sampled_from(GATED_OPTIONS))
    return cfg, D, recipe, over, seed


@settings(max_examples=40, deadline=None, derandomize=True)
@given(breaker_cases())
def test_every_breaker_keeps_gate_zero_exact(case):
    cfg, D, recipe, over, seed = case
    src = random_tensors(cfg, seed=seed)
    try:
        build_plan(cfg, recipes.load(recipe), D, seed=seed)
    except GrowError:  # a growth refused without the option (e.g. ungated copies under a shared q/k norm)
        with pytest.raises(GrowError):
            build_plan(cfg, recipes.load(recipe, over), D, seed=seed)
        return
    plan, grown = _grow(cfg, src, recipe, over, D, seed)
    assert plan.exact
    m_src, m_grown = LM.from_tensors(cfg, src), LM.from_tensors(plan.cfg, grown)
    x = random_batches(cfg.vocab_size, cfg.context, 4, seed)
    c0 = compare(m_src, m_grown, x, alpha=0.0)
    assert c0.logit_scale > 1e-3
    assert c0.rel <= 1e-4, (c0, case)


def _llama(ffn=128):
    return ModelConfig("llama", vocab_size=64, width=32, layers=2, heads=4, kv_heads=2, head_dim=8, ffn=ffn,
                       context=16, norm_eps=1e-5, tie=False)  # fmt: skip


def _down(plan, grown):
    name = "model.layers.0.mlp.down_proj.weight"
    return grown[name], plan.units[0]["ffn"]


@pytest.mark.parametrize("D", [48, 64, 96])
def test_pair_noise_moves_copies_and_sources_by_opposite_amounts(D):
    cfg = _llama()
    src = random_tensors(cfg, seed=1)
    plan0, plain = _grow(cfg, src, "copy", {}, D, 5)
    plan1, noisy = _grow(cfg, src, "copy", {"pair_noise": 0.5}, D, 5)
    w0, e = _down(plan0, plain)
    w1, _ = _down(plan1, noisy)
    delta = (w1 - w0)[:, e.n :]  # each copy's +delta
    assert delta.abs().max() > 1e-2
    back = torch.zeros_like(w0[:, : e.n]).index_add_(1, e.index[:, 0], delta)
    assert torch.allclose((w1 - w0)[:, : e.n], -back, atol=1e-6)  # sources take -delta: sums kept
    untouched = torch.ones(e.n, dtype=torch.bool)
    untouched[e.index[:, 0]] = False
    assert torch.equal(w1[:, : e.n][:, untouched], w0[:, : e.n][:, untouched])
    # delta is relative to the unit it splits: its rms over the unsplit column's is about pair_noise
    f = plan1.split[0]["ffn"]
    v = w0[:, e.index[:, 0]] / f[e.index[:, 0]]
    ratio = (delta.pow(2).mean(0).sqrt() / v.pow(2).mean(0).sqrt()).median()
    assert 0.3 < float(ratio) < 0.7


def test_split_alpha_is_lemon_and_half_is_net2net_bit_for_bit():
    e = ops.Expansion("copy", 4, 7, torch.tensor([[1], [1], [3]]), torch.ones(3, 1))
    assert torch.equal(ops.split_factors(e, 0.5), ops.split_factors(e))
    f = ops.split_factors(e, 0.8)
    assert f[0] == 1.0 and f[2] == 1.0  # units never copied keep their whole write
    assert f[3] == pytest.approx(0.8) and f[6] == pytest.approx(0.2)  # one copy: alpha, 1 - alpha
    assert float(f[1] + f[4] + f[5]) == pytest.approx(1.0)  # two copies: shares still sum to 1
    assert f[1] != f[4]
    cfg = _llama()
    src = random_tensors(cfg, seed=2)
    plan, grown = _grow(cfg, src, "copy", {"split_alpha": 0.7}, 64, 5)
    w, e = _down(plan, grown)
    once = torch.bincount(e.index[:, 0], minlength=e.n) == 1
    j = int(torch.nonzero(once[e.index[:, 0]])[0])
    i = int(e.index[j, 0])
    assert torch.allclose(w[:, i] * 0.3, w[:, e.n + j] * 0.7, atol=1e-6)


def _reader_gap(cfg, src, over, adam_steps):
    """After ``adam_steps`` AdamW steps on the copy-grown model, the largest difference between a copy's
    and its source's *direction* of reader gradient (0: they move as one)."""
    plan, grown = _grow(cfg, src, "copy", over, 64, 5)
    model = LM.from_tensors(plan.cfg, grown)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for k in range(adam_steps + 1):
        x = torch.randint(0, 64, (4, 16), generator=gen)
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        if k < adam_steps:
            opt.step()
            opt.zero_grad()
    e = plan.units[0]["ffn"]
    g = dict(model.named_parameters())["model.layers.0.mlp.up_proj.weight"].grad
    a, b = g[e.n :], g[e.index[:, 0]]
    return float((a / a.norm(dim=1, keepdim=True) - b / b.norm(dim=1, keepdim=True)).abs().max())


def test_breakers_make_copies_and_sources_get_different_gradients():
    """Even split: copy and source get the same reader gradient direction, before and after Adam steps.
    Cancelling pairs: different from the first step (their writer columns differ). Unequal split: the
    first gradients differ only in scale (alpha : 1 - alpha), which Adam's normalised step erases, so
    both move by the same update; their writer columns then differ by more than a factor, and the
    directions part from the second step on."""
    cfg = _llama()
    src = random_tensors(cfg, seed=3)
    assert _reader_gap(cfg, src, {}, 0) < 1e-5 and _reader_gap(cfg, src, {}, 3) < 1e-4
    assert _reader_gap(cfg, src, {"pair_noise": 0.3}, 0) > 1e-2
    assert _reader_gap(cfg, src, {"split_alpha": 0.7}, 0) < 1e-5
    assert _reader_gap(cfg, src, {"split_alpha": 0.7}, 1) > 1e-2


def test_gated_copies_reading_the_old_residual_get_gradient_once_the_gate_opens():
    """srio with new FFN units that read the old residual (convex) against srio's tile: at gate 0.5
    the new neurons' reader gradient is a real share of the old ones' (tile: a small one)."""
    cfg = _llama()
    src = random_tensors(cfg, seed=4)
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))

    def share(over):
        plan, grown = _grow(cfg, src, "srio", over, 64, 5)
        model = LM.from_tensors(plan.cfg, grown)
        model.set_gates(0.5)
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        n = plan.units[0]["ffn"].n
        g = dict(model.named_parameters())["model.layers.0.mlp.up_proj.weight"].grad
        return float(g[n:].pow(2).mean().sqrt() / g[:n].pow(2).mean().sqrt())

    tile, convex = share({}), share({"ffn": {"new_units": "convex"}, "noise": 0.2})
    assert convex > 0.2 and convex > 3 * tile, (tile, convex)


@pytest.mark.parametrize(
    "bad", [{"split_alpha": 0.0}, {"split_alpha": 1.0}, {"pair_noise": -0.1}, {"split_alpha": True}]
)
def test_breaker_values_out_of_range_are_refused(bad):
    with pytest.raises(GrowError, match=next(iter(bad))):
        recipes.load("copy", bad)


def test_defaults_leave_the_lineage_as_before():
    """A growth that does not set the new keys records the recipe without them (byte identity)."""
    r = recipes.load("copy")
    assert "pair_noise" not in recipes.stored(r) and "split_alpha" not in recipes.stored(r)
    assert recipes.stored(recipes.load("copy", {"pair_noise": 0.1}))["pair_noise"] == 0.1
