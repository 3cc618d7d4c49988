"""Issue 40's optimizer treatment of new parameters (growtool/training/newparams.py): which entries are
new, their own step multiplier, fresh moments and a re-warm for them only."""

import pytest
import torch

from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan, lineage_entry
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.io.stream import Producer
from growtool.nn.families import tensor_specs
from growtool.training import newparams
from growtool.training.loop import train
from growtool.training.run_folder import read_metrics

from helpers import make_text, tiny_cfg

KW = dict(batch=4, seq=32, eval_batches=1, device="cpu", progress=False, lr=1e-2, save_every=1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("newparams")
    text = d / "toy.txt"
    text.write_text(make_text(400))
    cfg = tiny_cfg(layers=2, heads=4, kv_heads=2)
    src = init_model(cfg, seed=0)
    base = checkpoint.save_tensors(str(d / "base.safetensors"), cfg, [], src.tensors())
    ck = checkpoint.load(base)
    plan = build_plan(cfg, recipes.load("srio"), 48, seed=3)
    grown = checkpoint.save(
        str(d / "grown.safetensors"),
        plan.cfg,
        [lineage_entry(plan, ck.sha256())],
        plan.outputs(),
        Producer(lambda n: grow_tensor(n, plan, ck.get)),
        checkpoint.Output(force=True),
    )
    return {"dir": d, "text": text, "base": base, "grown": grown, "plan": plan}


def test_masks_are_the_new_units_and_the_new_residual_dims(world):
    plan = world["plan"]
    ms = newparams.masks(plan.cfg, checkpoint.load(world["grown"]).lineage)
    specs = tensor_specs(plan.cfg)
    up = "model.layers.0.mlp.up_proj.weight"  # [ffn, width]: rows of new neurons, columns of new dims
    m = ms[up]
    assert m.shape == (plan.cfg.ffn, 48)
    assert not m[: plan.src.ffn, :32].any() and m[plan.src.ffn :].all() and m[:, 32:].all()
    q = "model.layers.1.self_attn.q_proj.weight"  # 4 -> 6 query heads of head_dim 8
    assert not ms[q][:32, :32].any() and ms[q][32:].all()
    assert ms["model.embed_tokens.weight"][:, 32:].all() and not ms["model.embed_tokens.weight"][:, :32].any()
    assert "model.layers.0.growth_gate" not in ms
    for name, mask in ms.items():
        assert specs[name].role in ("reader", "writer", "embedding", "head", "norm_gain", "norm_bias", "unit_bias")
        assert 0 < mask.sum() < mask.numel()
    assert newparams.masks(plan.src, []) is None  # no growth: nothing is new


def _delta(world, name, out, **kw):
    train(world["grown"], [world["text"]], world["dir"] / out, steps=1, **KW, **kw)
    after = checkpoint.load(world["dir"] / out / "last.safetensors").get(name)
    return after - checkpoint.load(world["grown"]).get(name)


def test_lr_multiplier_scales_the_new_entries_step_only(world):
    """The plain path (a grown checkpoint trained with --new-lr-mult 0.5): the first update of every new
    entry is half the untreated one (--new-lr-mult 1); old entries move exactly as without it."""
    name = "model.layers.0.mlp.down_proj.weight"
    g = 1.0  # past the gate ramp: new units get a gradient on the first update
    plain = _delta(world, name, "plain", gate_warmup_tokens=1, new_lr_mult=1.0)
    half = _delta(world, name, "half", gate_warmup_tokens=1, new_lr_mult=0.5)
    m = newparams.masks(world["plan"].cfg, checkpoint.load(world["grown"]).lineage)[name]
    assert torch.equal(half[~m], plain[~m])
    assert plain[m].abs().max() > 0
    assert torch.allclose(half[m], 0.5 * g * plain[m], atol=1e-7)


def test_rewarm_ramps_the_new_entries_and_fresh_moments_at_a_grow_at_growth(world):
    assert newparams.factor({"new_lr_mult": 2.0, "new_rewarm_steps": 4}, 0) == pytest.approx(0.5)
    assert newparams.factor({"new_lr_mult": 2.0, "new_rewarm_steps": 4}, 9) == pytest.approx(2.0)
    assert newparams.factor({}, 3) == 1.0
    out = world["dir"] / "grow-at"
    kw = dict(KW, steps=8, grow_at=("0.5:48",), gate_warmup_tokens=1)
    train(world["base"], [world["text"]], out, new_rewarm_steps=4, new_lr_mult=1.0, **kw)
    train(world["base"], [world["text"]], world["dir"] / "grow-at-plain", new_lr_mult=1.0, **kw)
    a = read_metrics(out / "metrics.jsonl")
    b = read_metrics(world["dir"] / "grow-at-plain" / "metrics.jsonl")
    la, lb = ([r["loss"] for r in x if "loss" in r] for x in (a, b))
    assert la[:4] == lb[:4] and la[4:] != lb[4:]  # the same run before the growth, another after
    ga = {r["step"]: r["growth"] for r in a if "growth" in r}
    gb = {r["step"]: r["growth"] for r in b if "growth" in r}
    first = min(ga)  # the first update after the growth: new entries at 1/4 of their step
    ratio = ga[first]["ffn_update_ratio"] / gb[first]["ffn_update_ratio"]
    assert 0.1 < ratio < 0.6, ratio


def test_fresh_moments_zero_the_new_entries_only(world):
    from types import SimpleNamespace

    from growtool.training.optim import make_optimizer

    ck = checkpoint.load(world["grown"])
    model = ck.model()
    s = {"lr": 1e-2, "weight_decay": 0.1, "new_rewarm_steps": 3}
    opt = make_optimizer(model, s)
    x = torch.randint(0, 256, (2, 16))
    model.set_gates(1.0)
    model(x, torch.roll(x, -1, 1))[1].backward()
    opt.step()
    run = SimpleNamespace(model=model, opt=opt, s=s, lineage=ck.lineage, growths=[], ck=ck)
    newparams.fresh_moments(run)
    ms = newparams.masks(model.cfg, ck.lineage)
    p = dict(model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    m = ms["model.layers.0.mlp.down_proj.weight"]
    for k in ("exp_avg", "exp_avg_sq"):
        st = opt.state[p][k]
        assert (st[m] == 0).all() and (st[~m] != 0).any()
    run.s = {**s, "new_rewarm_steps": 0}  # off: nothing is zeroed
    before = opt.state[p]["exp_avg"].clone()
    model(x, torch.roll(x, -1, 1))[1].backward()
    opt.step()
    after = opt.state[p]["exp_avg"].clone()
    newparams.fresh_moments(run)
    assert torch.equal(opt.state[p]["exp_avg"], after) and not torch.equal(before, after)


def test_masks_of_an_ungated_copy_growth(world):
    """copy (ungated): new units are not behind a gate, the masks are the same slices."""
    ck = checkpoint.load(world["base"])
    plan = build_plan(ck.config, recipes.load("copy"), 48, seed=3)
    ms = newparams.masks(plan.cfg, [lineage_entry(plan, ck.sha256())])
    m = ms["model.layers.0.mlp.down_proj.weight"]  # [width, ffn]
    assert m[:, plan.src.ffn :].all() and m[32:].all() and not m[:32, : plan.src.ffn].any()
