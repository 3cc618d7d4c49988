"""Issue 11's growth options: symmetry breaking that keeps the function at gate 0 (recipe ``noise``),
a width-aware learning rate after growth (``--grow-lr mup``) and a re-warmed schedule at a growth
(``--grow-schedule rewarm``)."""

import pytest
import torch

from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.grow.steps import BreakSymmetry
from growtool.init import init_model
from growtool.nn.model import LM
from growtool.training.loop import train
from growtool.training.run_folder import STATE, read_metrics
from growtool.training.schedule import lr_at

from helpers import FIXTURES, cli, make_config, stages_world, strip
from helpers import STAGES_KW as KW


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return stages_world(tmp_path_factory.mktemp("stages"))


def _cfg(family):
    if family == "gpt2":  # LayerNorm, tied head: the exact angle is sqrt(d/D)
        return make_config("gpt2", 32, 2, 4, ffn=128, vocab=64, context=64, tie=True)
    return make_config("llama", 32, 2, 4, kv_heads=2, ffn=128, vocab=64, context=64)


def _grow(family, recipe, noise, over=None):
    cfg = _cfg(family)
    src = init_model(cfg, gamma=0.5, seed=0).eval()
    t = src.tensors()
    plan = build_plan(cfg, recipes.load(recipe, {"noise": noise, **(over or {})}), 48, seed=3)
    grown = {n: grow_tensor(n, plan, t.__getitem__) for n, _, _ in plan.outputs()}
    return src, plan, grown


def _logits(model, x):
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


DEAD = {"attention": {"new_heads": "zero"}, "ffn": {"new_units": "zero"}, "gate": False}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("recipe,over", [("srio", None), ("copy", None), ("srio", DEAD)], ids=["srio", "copy", "dead"])
def test_noise_keeps_the_function_at_gate_zero_and_changes_the_new_units(family, recipe, over):
    x = torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(1))
    src, plan, noisy = _grow(family, recipe, 0.5, over)
    _, _, plain = _grow(family, recipe, 0.0, over)
    model = LM.from_tensors(plan.cfg, noisy).eval()
    model.set_gates(0.0)
    ref = _logits(src, x)
    err = (_logits(model, x) - ref).abs().max() / ref.abs().max()
    assert plan.exact and err < 1e-5, err
    changed = [n for n in noisy if not torch.equal(noisy[n], plain[n])]
    if recipe == "copy":  # +/- pairs on the split writers only
        assert all(plan.specs[n][0].role == "writer" for n in changed) and changed
    else:  # the new units' readers only; old units untouched
        assert changed and all(plan.specs[n][0].role == "reader" for n in changed)
        for n in changed:
            spec, layer = plan.specs[n]
            if spec.units == ("ffn",):
                n_old = plan.src.ffn
                old = noisy[n].narrow(spec.unit_axis, 0, n_old)
                assert torch.equal(old, plain[n].narrow(spec.unit_axis, 0, n_old)), n


def test_noise_zero_is_byte_identical_to_a_recipe_without_it():
    _, _, a = _grow("llama", "srio", 0.0)
    cfg = _cfg("llama")
    src = init_model(cfg, gamma=0.5, seed=0)
    r = recipes.load("srio")
    plan = build_plan(cfg, r, 48, seed=3)
    b = {n: grow_tensor(n, plan, src.tensors().__getitem__) for n, _, _ in plan.outputs()}
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not any(isinstance(s, BreakSymmetry) for steps in plan.steps.values() for s in steps)


def test_noise_is_refused_out_of_range():
    from growtool.nn.errors import GrowError

    with pytest.raises(GrowError, match="noise"):
        recipes.load("srio", {"noise": -1})


def _copies_stay_identical(noise: float) -> float:
    """Train the copy-grown llama a few steps; the largest difference between a split copy's reader
    rows and its source's (0 when symmetric copies stay clones)."""
    torch.manual_seed(0)
    _, plan, grown = _grow("llama", "copy", noise)
    model = LM.from_tensors(plan.cfg, grown).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randint(0, 64, (4, 16), generator=g)
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    e = plan.units[0]["ffn"]
    w = dict(model.named_parameters())["model.layers.0.mlp.up_proj.weight"].detach()
    return float((w[e.n :] - w[e.index[:, 0]]).abs().max())


def test_copies_without_noise_stay_clones_and_noise_breaks_them():
    assert _copies_stay_identical(0.0) < 1e-6
    assert _copies_stay_identical(0.1) > 1e-3


def test_grow_lr_mup_scales_the_hidden_matrices_and_resumes_exactly(world):  # noqa: F811
    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=12, save_every=2, grow_at=("0.5:64",), gate_warmup_tokens=256, grow_lr="mup")
    a = train(base, [text], d / "mup", stop_at=8, **kw)
    state = torch.load(d / "mup" / STATE, weights_only=True)
    groups = state["optimizer"]["param_groups"]
    assert [g["width_scaled"] for g in groups] == [True, False, False]
    rec = read_metrics(d / "mup" / "metrics.jsonl")[-1]
    assert groups[0]["lr"] == pytest.approx(rec["lr"] * 32 / 64) and groups[1]["lr"] == rec["lr"]
    train(base, [text], d / "mup", resume=True, **kw)
    b = train(base, [text], d / "mup_once", **kw)
    assert strip(read_metrics(d / "mup" / "metrics.jsonl")) == strip(read_metrics(d / "mup_once" / "metrics.jsonl"))
    assert a["final"] is None and b["final"]
    same = train(base, [text], d / "same", **{**kw, "grow_lr": "same"})
    assert same["val_loss"] != b["val_loss"]  # the option changes training


def test_grow_dropout_runs_from_the_growth_through_the_gate_ramp_and_resumes_exactly(world):  # noqa: F811
    """``--grow-dropout``: off before the growth (the first 6 updates match a run without it), on for the
    gate ramp's 3 updates after it (the losses differ), off after (the rate, ``dropout_at``); twin units'
    masks differ; a run stopped inside the window and resumed matches one run; the evaluation has no dropout."""
    from growtool.nn.errors import GrowError
    from growtool.nn.model import drop_units
    from growtool.training.schedule import dropout_at
    from growtool.training.settings import Settings

    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=12, save_every=1, grow_at=("0.5:48",), gate_warmup_tokens=3 * 8 * 32)
    off = train(base, [text], d / "drop-off", **kw)
    on = train(base, [text], d / "drop", grow_dropout=0.3, stop_at=8, **kw)
    assert on["final"] is None
    train(base, [text], d / "drop", grow_dropout=0.3, resume=True, **kw)
    once = train(base, [text], d / "drop-once", grow_dropout=0.3, **kw)
    assert strip(read_metrics(d / "drop" / "metrics.jsonl")) == strip(read_metrics(d / "drop-once" / "metrics.jsonl"))
    s, growths = once["settings"], [{"step": 6}]
    assert [dropout_at(i, s, growths) for i in range(12)] == [0.0] * 6 + [0.3] * 3 + [0.0] * 3
    assert [dropout_at(i, s, []) for i in range(12)] == [0.0] * 12
    loss = {k: [r["loss"] for r in read_metrics(d / k / "metrics.jsonl")[1:]] for k in ("drop-off", "drop-once")}
    assert loss["drop-off"][:6] == loss["drop-once"][:6]
    assert all(a != b for a, b in zip(loss["drop-off"][6:9], loss["drop-once"][6:9]))
    assert once["val_loss"] != off["val_loss"]
    h = torch.ones(2, 5, 8)
    m = drop_units(h, (0.5, 7), 1)
    assert set(m.unique().tolist()) <= {0.0, 2.0} and not torch.equal(m[..., :4], m[..., 4:])  # twins differ
    assert torch.equal(m, drop_units(h, (0.5, 7), 1)) and not torch.equal(m, drop_units(h, (0.5, 8), 1))
    for bad in (dict(grow_dropout=0.1, compile=True), dict(grow_dropout=0.95)):
        with pytest.raises(GrowError, match="--grow-dropout"):
            Settings(**bad).check()
    model, x = init_model(_cfg("llama"), gamma=0.5, seed=0).eval(), torch.arange(8).view(1, 8)
    plain = model(x)
    model.set_dropout(0.5, 1)
    assert torch.equal(model(x), plain) and not torch.equal(model.train()(x), plain)  # training mode alone


def test_grow_schedule_rewarm_restarts_the_lr_at_the_growth(world):  # noqa: F811
    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=12, grow_at=("0.5:48",), gate_warmup_tokens=256, warmup=2, schedule="cosine")  # rewarm: default
    s = train(base, [text], d / "rewarm", **kw)
    lrs = [r["lr"] for r in read_metrics(d / "rewarm" / "metrics.jsonl")[1:]]
    assert lrs[:6] == [lr_at(i, s["settings"]) for i in range(6)]
    assert lrs[6:] == [lr_at(i, s["settings"], 6) for i in range(6, 12)]
    assert lrs[6] == pytest.approx(KW["lr"] / 2) and lrs[7] == pytest.approx(KW["lr"])  # warm-up again to the peak
    assert lrs[-1] < 0.25 * KW["lr"]  # and a second cosine down towards the floor


def test_grow_schedule_rewarm_width_rewarms_at_the_width_growth_alone(world):  # noqa: F811
    """``--grow-schedule rewarm-width``: widened at step 4, the LR warms up again from there; stacked at
    step 8, it continues that schedule (``rewarm`` would warm up a second time, ``continue`` not at all)."""
    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=16, grow_at=("0.25:48", "0.5:layers=4,method=stack"), gate_warmup_tokens=256, warmup=2)
    lrs = {}
    for mode in ("rewarm-width", "rewarm", "continue"):
        s = train(base, [text], d / f"rw-{mode}", **kw, grow_schedule=mode)
        lrs[mode] = [r["lr"] for r in read_metrics(d / f"rw-{mode}" / "metrics.jsonl")[1:]]
        assert s["settings"]["grow_schedule"] == mode
    rw = lrs["rewarm-width"]
    assert rw == [lr_at(i, s["settings"] | {"grow_schedule": "rewarm-width"}, 4 if i >= 4 else 0) for i in range(16)]
    assert rw[:8] == lrs["rewarm"][:8] and rw[4] == pytest.approx(KW["lr"] / 2)  # the width growth re-warms
    assert rw[8] == KW["lr"] and lrs["rewarm"][8] == pytest.approx(KW["lr"] / 2)  # the stacking does not
    assert lrs["continue"][4] == KW["lr"]


def test_grow_warmup_0_keeps_the_peak_and_restarts_only_the_decay(world):  # noqa: F811
    """``--grow-warmup 0``: a growth that re-warms keeps the LR at its peak (no second warm-up) and the wsd
    decay is a --decay-fraction of the steps after the growth (here 2 of 10, against one schedule's 4 of 20);
    the default warms up again over --warmup."""
    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=20, grow_at=("0.5:48",), gate_warmup_tokens=256, warmup=2, schedule="wsd")
    kw |= dict(grow_schedule="rewarm", decay_fraction=0.2, decay_shape="linear")
    lrs = {}
    for name, extra in (("hold", {"grow_warmup": 0}), ("rewarm", {}), ("continue", {"grow_schedule": "continue"})):
        s = train(base, [text], d / f"gw-{name}", **{**kw, **extra})
        lrs[name] = [r["lr"] for r in read_metrics(d / f"gw-{name}" / "metrics.jsonl")[1:]]
        assert lrs[name] == [lr_at(i, s["settings"], 10 if i >= 10 and name != "continue" else 0) for i in range(20)]
    peak, hold = KW["lr"], lrs["hold"]
    assert hold[:10] == lrs["rewarm"][:10] and hold[10:19] == [peak] * 9 and hold[19] < peak  # decay: updates 18, 19
    assert lrs["rewarm"][10] == pytest.approx(peak / 2) and lrs["rewarm"][19] < peak  # warmed up again
    assert lrs["continue"][17] < peak  # one schedule decays over the run's last 4


def test_grow_schedule_default_follows_the_growth_and_the_schedule(world):  # noqa: F811
    """--grow-schedule's default (settings.default_grow_schedule): one schedule under wsd when a growth is
    in depth alone (stacking ended lower without the re-warm in 17 of 20 seed pairs, a width growth then
    stacking in 10 of 10, stacking then a width growth in 7 of 7: bench/results/budget_d64/WRITEUP.md), a
    re-warm when every growth is in width or under another schedule; a value given wins. End to end: a
    stacked run under wsd keeps its LR through the growth."""
    from growtool.training.settings import Settings

    def resolved(**kw):
        return Settings(steps=20, **kw).resolve(10**4, 64, True, "byte", {})["grow_schedule"]

    depth = ("0.2:layers=4,method=stack",)
    assert resolved(grow_at=depth) == "continue" and Settings().schedule == "wsd"
    assert resolved(grow_at=depth, schedule="cosine") == resolved(grow_at=depth, schedule="constant") == "rewarm"
    for widths in (("0.2:96",), ("0.2:width=96,layers=4",), ("0.2:96", "0.6:128")):
        assert resolved(grow_at=widths) == "rewarm", widths
    assert resolved(grow_at=("0.1:96", "0.3:layers=4,method=stack")) == "continue"  # widened, then stacked
    assert resolved(grow_at=(*depth, "0.6:96")) == "continue"  # stacked, then widened
    assert resolved() == "rewarm" and resolved(grow_at=depth, grow_schedule="rewarm") == "rewarm"
    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=12, grow_at=("0.5:layers=4",), gate_warmup_tokens=256, warmup=2)  # wsd: the default
    s = train(base, [text], d / "stacked", **kw)
    lrs = [r["lr"] for r in read_metrics(d / "stacked" / "metrics.jsonl")[1:]]
    assert s["settings"]["grow_schedule"] == "continue" and lrs == [lr_at(i, s["settings"]) for i in range(12)]
    assert lrs[5:8] == [KW["lr"]] * 3  # the peak through the growth at step 6: no second warm-up


def test_width_and_layers_take_ratios_of_the_source(tmp_path):
    src = FIXTURES["llama-gqa"]  # width 64, 2 layers
    by_ratio, by_number = tmp_path / "r.safetensors", tmp_path / "n.safetensors"
    r = cli("expand", src, "--width", "1.5x", "--layers", "2X", "-q", "-o", by_ratio)
    assert r.exit_code == 0, r.stderr
    assert cli("expand", src, "--width", 96, "--layers", 4, "-q", "-o", by_number).exit_code == 0
    assert by_ratio.read_bytes() == by_number.read_bytes()
    for width, msg in [("1.1x", "--width 1.1x of 64 is 70.4, not a whole number"), ("0x", "--width must be positive")]:
        r = cli("expand", src, "--width", width, "-q", "-o", tmp_path / "x.safetensors")
        assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("expand", "-", "--width", "2x", "-o", tmp_path / "x.safetensors", input=src.read_bytes())
    assert r.exit_code == 2 and "give numbers when reading standard input" in r.stderr, r.stderr
    assert not (tmp_path / "x.safetensors").exists()
