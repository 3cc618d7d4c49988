"""A resumed run may be extended and re-paced (growtool/training/resume.py): a wsd run stopped before
its decay and resumed with a larger --steps equals an uninterrupted run of that length; changed
eval/save/metrics cadences are accepted and recorded; what would alter the math already done is
refused in the command line's words. Plus the default cadences' floors (settings.py)."""

from __future__ import annotations

import json

import pytest
import torch

from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.training.loop import train
from growtool.training.run_folder import STATE
from growtool.training.settings import Settings

from helpers import cli, listing, make_text, tiny_cfg

KW = dict(batch=4, seq=16, eval_batches=2, device="cpu", progress=False, lr=3e-3, warmup=2, gate_warmup_tokens=256)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A grown (gated) model, a training text and a held-out text."""
    d = tmp_path_factory.mktemp("extend")
    (d / "t.txt").write_text(make_text(600, seed=1))
    (d / "v.txt").write_text(make_text(100, seed=2))
    cfg = tiny_cfg(context=16)
    ck = checkpoint.load(checkpoint.save_tensors(str(d / "a.safetensors"), cfg, [], init_model(cfg).tensors()))
    plan = build_plan(cfg, recipes.load("srio"), 48)
    tensors = {n: grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()}
    grown = checkpoint.save_tensors(str(d / "g.safetensors"), plan.cfg, [], tensors)
    return {"dir": d, "text": d / "t.txt", "val": d / "v.txt", "grown": grown}


def records(summary) -> list[dict]:
    return [json.loads(line) for line in open(summary["metrics"])]


def test_wsd_run_stopped_before_its_decay_and_extended_equals_the_longer_run(world):
    d, data = world["dir"], [world["text"]]
    full = train(world["grown"], data, d / "full32", steps=32, **KW)
    # started as a 16-step run (decay over its last 3 steps, from step 13), stopped at step 10
    part = train(world["grown"], data, d / "ext", steps=16, stop_at=10, save_every=5, eval_every=4, **KW)
    assert part["final"] is None and part["steps"] == 10 and part["history"] == []
    # resumed with twice the steps and other cadences: accepted, recorded
    cadences = dict(save_every=3, eval_every=7, metrics_every=6)
    mid = train(world["grown"], data, d / "ext", resume=True, steps=32, stop_at=20, **cadences, **KW)
    changed = {"steps": [16, 32], "eval_every": [4, 7], "save_every": [5, 3], "metrics_every": [16, 6]}
    assert mid["history"] == [{"step": 10, "changed": changed}]
    assert torch.load(d / "ext" / STATE, weights_only=True)["history"] == mid["history"]
    # resumed again without --steps or cadences: the extended length and the last cadences are kept
    done = train(world["grown"], data, d / "ext", resume=True, **KW)
    assert done["total_steps"] == 32 and done["final"] is not None
    assert done["history"] == mid["history"]
    a, b = records(full), records(done)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(33))
    for x, y in zip(a, b):
        for k in ("loss", "lr", "gate", "grad_norm"):
            if k in x:
                assert x[k] == y[k], (x["step"], k, x[k], y[k])
    assert a[-1]["val_loss"] == b[-1]["val_loss"]
    assert [r["step"] for r in b if "val_loss" in r] == [0, 4, 8, 14, 21, 28, 32]  # each invocation's cadence
    assert [r["step"] for r in b if "matrix" in r] == [0, 12, 18, 24, 30, 32]
    ta, tb = checkpoint.load(full["final"]).tensors(), checkpoint.load(done["final"]).tensors()
    assert all(torch.equal(ta[n], tb[n]) for n in ta)
    # the decay really moved: the 16-step run would have decayed at step 13, the 32-step run did not
    assert b[14]["lr"] == 3e-3 and a[-1]["lr"] < 3e-3


def test_a_run_in_its_decay_is_not_extended(world):
    d, data = world["dir"], [world["text"]]
    train(world["grown"], data, d / "decay", steps=16, stop_at=15, **KW)  # decay from update 13 (its lr: the peak)
    before = listing(d / "decay")
    with pytest.raises(GrowError, match=r"^--steps 32: the run is already in its decay at step 15 .*--steps 16"):
        train(world["grown"], data, d / "decay", resume=True, steps=32, **KW)
    with pytest.raises(GrowError, match="already done 15 steps"):
        train(world["grown"], data, d / "decay", resume=True, steps=12, **KW)
    assert listing(d / "decay") == before


def test_changes_to_the_math_are_refused_in_the_command_lines_words(world, tmp_path):
    d, data = world["dir"], [world["text"]]
    train(world["grown"], data, d / "val", val_data=[world["val"]], steps=16, stop_at=4, **KW)
    args = [world["grown"], "--data", world["text"], "--out", d / "val", "--steps", 16, "--resume", "-q"]
    args += ["--batch", 4, "--seq", 16, "--eval-batches", 2, "--device", "cpu", "--lr", 3e-3, "--warmup", 2]
    args += ["--gate-warmup-tokens", 256]
    r = cli("train", *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == f"growtool: error: --val-data missing: the run was started with --val-data {world['val']}\n"
    r = cli("train", *args, "--val-data", world["val"], "--lr", 1e-3)
    assert r.exit_code == 2 and "--lr 0.001 differs from the run's 0.003" in r.stderr and "sha256" not in r.stderr
    other = tmp_path / "o.txt"
    other.write_text(make_text(600, seed=3))
    with pytest.raises(GrowError, match="^--data: not the data the run was started with"):
        train(world["grown"], [other], d / "val", val_data=[world["val"]], resume=True, steps=16, **KW)
    train(world["grown"], data, d / "no-val", steps=16, stop_at=2, **KW)
    with pytest.raises(GrowError, match="^--val-data: the run was started without it"):
        train(world["grown"], data, d / "no-val", val_data=[world["val"]], resume=True, steps=16, **KW)


def test_a_run_with_growths_scheduled_keeps_its_length(world):
    d, data = world["dir"], [world["text"]]
    kw = {**KW, "gate_warmup_tokens": 64}
    train(world["grown"], data, d / "grow", steps=16, stop_at=2, grow_at=("0.5:64",), **kw)
    with pytest.raises(GrowError, match="a run with --grow-at keeps its length"):
        train(world["grown"], data, d / "grow", resume=True, steps=32, grow_at=("0.5:64",), **kw)


@pytest.mark.parametrize(
    "steps, expect",
    [(6, (6, 6, 6)), (20, (20, 20, 20)), (100, (25, 50, 50)), (600, (30, 60, 60)), (2000, (100, 200, 200))],
)
def test_default_cadences_have_floors(steps, expect):
    s = Settings(steps=steps).resolve(10**6, 128, False, "byte", {})
    assert (s["eval_every"], s["metrics_every"], s["save_every"]) == expect
    given = Settings(steps=steps, eval_every=3, metrics_every=4, save_every=5).resolve(10**6, 128, False, "byte", {})
    assert (given["eval_every"], given["metrics_every"], given["save_every"]) == (3, 4, 5)


def test_a_resumed_run_keeps_its_lr_unless_given():
    """--lr's default depends on the family (settings.LR_LADDER): a run resumed without --lr keeps the LR
    it started with (so a changed default never refuses an old run); a different --lr is refused."""
    from growtool.training.resume import merge

    ident = {"data_sha256": "d", "val_sha256": [], "source_sha256": "s"}
    saved = Settings(steps=16, lr=1e-3).resolve(1000, 64, False, "byte", ident, "gpt2")
    opts = Settings(steps=16)
    s, changes = merge(saved, opts.resolve(1000, 64, False, "byte", ident, "gpt2"), opts)
    assert (s["lr"], changes) == (1e-3, {})
    given = Settings(steps=16, lr=6e-3)
    with pytest.raises(GrowError, match="--lr 0.006 differs from the run's 0.001"):
        merge(saved, given.resolve(1000, 64, False, "byte", ident, "gpt2"), given)


def test_a_resumed_run_keeps_its_grow_schedule_unless_given():
    """--grow-schedule's default depends on the growths and changed in round 24 (rewarm -> continue for
    depth alone under wsd): a run started under the old default resumes with its re-warm; a different
    value given is refused."""
    from growtool.training.resume import merge

    ident = {"data_sha256": "d", "val_sha256": [], "source_sha256": "s"}
    depth = ("0.5:layers=4",)
    saved = Settings(steps=16, grow_at=depth, grow_schedule="rewarm").resolve(1000, 64, True, "byte", ident)
    opts = Settings(steps=16, grow_at=depth)
    assert opts.resolve(1000, 64, True, "byte", ident)["grow_schedule"] == "continue"  # today's default
    s, changes = merge(saved, opts.resolve(1000, 64, True, "byte", ident), opts)
    assert (s["grow_schedule"], changes) == ("rewarm", {})
    given = Settings(steps=16, grow_at=depth, grow_schedule="continue")
    with pytest.raises(GrowError, match="--grow-schedule continue differs from the run's rewarm"):
        merge(saved, given.resolve(1000, 64, True, "byte", ident), given)
