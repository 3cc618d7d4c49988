"""A wsd run keeps its resumable state where its decay begins (``OUT/pre-decay``, loop.keep_pre_decay):
a copy resumed with a longer --steps equals the longer run, and ``expand OUT/pre-decay`` resumed to a
longer run equals ``--grow-at`` at that step (one LR schedule, the AdamW moments grown). Runs without
a decay, with --grow-at or with --no-pre-decay keep none; a link planted there is never written
through; the refusal to extend a decayed run names the folder."""

from __future__ import annotations

import shutil

import pytest
import torch

from growtool import surgery
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.training.loop import train
from growtool.training.run_folder import PRE_DECAY, STATE, read_metrics

from helpers import cli, make_text, tiny_cfg

# wsd over 20 steps: warm-up 2, decay over the last round(0.2 * 20) = 4, so the state after 16 updates
KW = dict(batch=4, seq=16, eval_batches=2, device="cpu", progress=False, lr=3e-3, warmup=2, gate_warmup_tokens=256)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("predecay")
    (d / "t.txt").write_text(make_text(600, seed=1))
    cfg = tiny_cfg(context=16, layers=2)
    base = checkpoint.save_tensors(str(d / "a.safetensors"), cfg, [], init_model(cfg, seed=3).tensors())
    run = train(base, [d / "t.txt"], d / "run", steps=20, **KW)
    return {"dir": d, "data": [d / "t.txt"], "base": base, "run": run}


def tensors_equal(a, b) -> bool:
    ta, tb = checkpoint.load(a).tensors(), checkpoint.load(b).tensors()
    return ta.keys() == tb.keys() and all(torch.equal(ta[n], tb[n]) for n in ta)


def test_a_finished_wsd_run_keeps_the_state_where_its_decay_begins(world):
    pre = world["dir"] / "run" / PRE_DECAY
    assert world["run"]["pre_decay"] == str(pre)
    state = torch.load(pre / STATE, weights_only=False)
    assert state["step"] == 16 and state["settings"]["steps"] == 20
    recs = read_metrics(pre / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(17))
    full = read_metrics(world["dir"] / "run" / "metrics.jsonl")
    assert recs == full[:17] and {r["lr"] for r in recs[2:]} == {3e-3}
    assert full[17]["lr"] == 3e-3 > full[18]["lr"]  # update 16 decays from the peak
    assert not (world["dir"] / "run" / (PRE_DECAY + ".tmp")).exists()


def test_a_copy_of_it_extended_equals_the_longer_run(world):
    d = world["dir"]
    shutil.copytree(d / "run" / PRE_DECAY, d / "ext")
    ext = train(world["base"], world["data"], d / "ext", resume=True, steps=40, **KW)
    full = train(world["base"], world["data"], d / "full40", steps=40, **KW)
    assert ext["history"] == [{"step": 16, "changed": {"steps": [20, 40]}}]
    assert ext["val_loss"] == full["val_loss"] and tensors_equal(ext["final"], full["final"])
    assert torch.load(d / "ext" / PRE_DECAY / STATE, weights_only=False)["step"] == 32  # the new decay's start


def test_it_grown_and_resumed_equals_grow_at_that_step(world):
    d = world["dir"]
    surgery.expand(str(d / "run" / PRE_DECAY), out=str(d / "grown"), layers=4, depth_method="stack")
    kw = {k: v for k, v in KW.items() if k != "gate_warmup_tokens"}  # the grown run's: 10% of the source's 20 steps
    grown = train(world["base"], world["data"], d / "grown", resume=True, steps=40, **kw)
    at = train(
        world["base"],
        world["data"],
        d / "at",
        steps=40,
        grow_at=("0.4:layers=4,method=stack",),
        **KW | {"gate_warmup_tokens": 128},
    )
    assert grown["params"] == at["params"] > world["run"]["params"]
    assert grown["val_loss"] == at["val_loss"] and tensors_equal(grown["final"], at["final"])
    assert at["pre_decay"] is None  # a --grow-at run keeps its length: nothing to extend


@pytest.mark.parametrize("kw", [{"schedule": "cosine"}, {"no_pre_decay": True}, {"decay_fraction": 0.0}])
def test_runs_without_a_decay_to_keep_write_none(world, kw, tmp_path):
    r = train(world["base"], world["data"], tmp_path / "r", steps=20, **{**KW, **kw})
    assert r["pre_decay"] is None and not (tmp_path / "r" / PRE_DECAY).exists()


def test_a_link_planted_there_is_replaced_not_written_through(world, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / PRE_DECAY).symlink_to(outside)
    (tmp_path / "r" / (PRE_DECAY + ".tmp")).symlink_to(outside)
    r = train(world["base"], world["data"], tmp_path / "r", steps=20, **KW)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "r" / PRE_DECAY).is_symlink() and r["pre_decay"]


def test_the_cli_names_it_and_the_refusal_to_extend_a_decayed_run_points_to_it(world, tmp_path):
    args = [world["base"], "--data", world["data"][0], "--out", tmp_path / "c", "--steps", 20, "-q"]
    args += ["--batch", 4, "--seq", 16, "--eval-batches", 2, "--device", "cpu", "--warmup", 2, "--lr", 3e-3]
    r = cli("train", *args)
    assert r.exit_code == 0, r.stderr
    assert f"the state before the decay (to extend or grow): {tmp_path / 'c' / PRE_DECAY}" in r.stderr
    with pytest.raises(GrowError, match=r"already in its decay at step 20 .*resume a copy of its pre-decay folder"):
        train(world["base"], world["data"], tmp_path / "c", resume=True, steps=40, **KW)
    r = cli("expand", tmp_path / "c", "--layers", "2x", "-o", tmp_path / "g")  # the finished run itself: refused
    assert r.exit_code == 2 and f"grow {tmp_path / 'c' / PRE_DECAY} (the state before its decay)" in r.stderr, r.stderr


def test_a_full_disk_while_it_is_written_leaves_nothing_pending_and_the_run_resumes(world, tmp_path, monkeypatch):
    import errno

    from growtool.training import loop
    from growtool.training.run_folder import save_bytes as real

    calls = []

    def full_disk(path, obj):  # the second state written: the one where the decay begins (the first: step 10)
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, obj)

    monkeypatch.setattr(loop, "save_bytes", full_disk)
    with pytest.raises(OSError, match="No space left"):
        train(world["base"], world["data"], tmp_path / "r", steps=20, save_every=10, **KW)
    assert sorted(p.name for p in (tmp_path / "r").iterdir() if "pre-decay" in p.name) == []
    assert torch.load(tmp_path / "r" / STATE, weights_only=False)["step"] == 10  # the run's own pair, as saved
    monkeypatch.setattr(loop, "save_bytes", real)
    r = train(world["base"], world["data"], tmp_path / "r", resume=True, **KW)
    assert r["pre_decay"] and tensors_equal(r["final"], world["run"]["final"])


SPANS = [(20, 2, 0.2, 0), (7, 3, 0.5, 0), (100, 5, 0.1, 40), (9, 9, 0.3, 0)]  # steps, warm-up, decay share, start


@pytest.mark.parametrize("steps,warmup,frac,start", SPANS)
def test_decay_start_is_where_the_learning_rate_first_falls(steps, warmup, frac, start):
    from growtool.training.schedule import decay_start, lr_at

    s = {"schedule": "wsd", "steps": steps, "warmup": warmup, "decay_fraction": frac, "lr": 1.0, "min_lr_ratio": 0.1}
    k = decay_start(s, start)
    lrs = [lr_at(t, s, start) for t in range(start, steps)]
    if k is None:  # the warm-up leaves no room for a decay
        assert lrs[-1] == 1.0
    else:
        assert lrs[k - start] == 1.0 and all(x < 1.0 for x in lrs[k - start + 1 :]) and lrs[k - start - 1] == 1.0


def test_expand_of_a_finished_runs_checkpoint_points_to_its_pre_decay(world, tmp_path):
    """The plain path's ``expand RUN/final.safetensors`` grows a decayed model; when the run kept
    ``pre-decay/``, expand says so, as it says a tokenizer note, even with ``-q`` (growing that and
    resuming ended 0.017 lower at 10 tokens / parameter, 9 of 10 seeds: WRITEUP, seventeenth session). It
    still writes what was asked; a checkpoint outside a run folder says nothing."""
    final = world["dir"] / "run" / "final.safetensors"
    r = cli("expand", final, "--layers", "2x", "-o", tmp_path / "g.safetensors")
    assert r.exit_code == 0 and (tmp_path / "g.safetensors").is_file(), r.stderr
    assert f"{world['dir'] / 'run' / PRE_DECAY} holds the run before its decay" in r.stderr.replace("\n", " ")
    r = cli("expand", final, "--layers", "2x", "-o", tmp_path / "q.safetensors", "-q")
    assert r.exit_code == 0 and "holds the run before its decay" in r.stderr.replace("\n", " ")
    r = cli("expand", world["base"], "--layers", "2x", "-o", tmp_path / "b.safetensors")
    assert r.exit_code == 0 and "before its decay" not in r.stderr
