"""Growth inside training (growtool.stages): a run folder grown with its optimizer resumes at the source's
loss and learning rate; `train --grow-at` runs a 3-stage schedule end to end, resumes across a growth
exactly, logs stage / width / FLOPs, marks the plot and lists every stage in the lineage."""

import json
import shutil

import pytest
import torch

from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.training.loop import train
from growtool.training.run_folder import MODEL, STATE, read_metrics
from growtool.training.schedule import lr_at

from helpers import STAGES_KW, cli, stages_world, strip, tiny_cfg

KW = STAGES_KW


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return stages_world(tmp_path_factory.mktemp("stages"))


def test_grown_run_folder_resumes_at_the_sources_loss_without_rewarm(world):
    d, text, base = world["dir"], world["text"], world["base"]
    opts = ["--steps", 20, "--batch", 8, "--seq", 32, "--eval-batches", 2, "--lr", 0.01, "--device", "cpu", "-q"]
    opts += ["--grow-schedule", "continue"]  # no re-warm after the growth (the default re-warms)
    r = cli("train", base, "--data", text, "--out", d / "src", "--stop-at", 10, *opts)
    assert r.exit_code == 0, r.stderr
    shutil.copytree(d / "src", d / "src_on")
    r = cli("expand", d / "src", "--width", 48, "-o", d / "grown", "-q")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == str(d / "grown")
    state = torch.load(d / "grown" / STATE, weights_only=True)
    assert state["step"] == 10 and state["growths"] == [{"step": 10, "width": 48, "recipe": "srio", "from": 32}]
    assert all(float(v["step"]) == 10 for v in state["optimizer"]["state"].values())  # Adam's count carried
    for folder in ("src_on", "grown"):
        r = cli("train", base, "--data", text, "--out", d / folder, "--resume", *opts)
        assert r.exit_code == 0, r.stderr
    on, grown = read_metrics(d / "src_on" / "metrics.jsonl"), read_metrics(d / "grown" / "metrics.jsonl")
    assert strip(on[:11]) == strip(grown[:11])  # the history up to the growth is the source's
    first = grown[11]  # update 10: the first after the growth, gates at 0
    assert first["gate"] == 0.0 and first["width"] == 48 and first["stage"] == 1
    assert abs(first["loss"] - on[11]["loss"]) < 1e-5 * abs(on[11]["loss"])
    assert first["lr"] == on[11]["lr"]  # no re-warm: the schedule continues
    assert [r["lr"] for r in grown[1:]] == [lr_at(s, state["settings"]) for s in range(20)]
    assert grown[-1]["gate"] == 1.0 and grown[-1]["flops"] > on[-1]["flops"]
    lineage = checkpoint.load(d / "grown" / "final.safetensors").lineage
    assert [(e["op"], e.get("step")) for e in lineage] == [("train", 10), ("expand", 10), ("train", None)]


def test_grow_at_three_stages_end_to_end_and_resume_across_a_growth(world):
    d, text, base = world["dir"], world["text"], world["base"]
    kw = dict(KW, steps=30, save_every=3, grow_at=("0.3:48", "0.6:64"), gate_warmup_tokens=512)
    kw["grow_schedule"] = "continue"  # the LR checked below is one schedule (rewarm: test_growth_options.py)
    a = train(base, [text], d / "ms", **kw)
    b1 = train(base, [text], d / "ms_stopped", stop_at=9, **kw)  # stops right before the first growth
    assert b1["final"] is None
    b = train(base, [text], d / "ms_stopped", resume=True, stop_at=20, **kw)  # grows, and stops after the second
    b = train(base, [text], d / "ms_stopped", resume=True, **kw)
    ra, rb = read_metrics(d / "ms" / "metrics.jsonl"), read_metrics(d / "ms_stopped" / "metrics.jsonl")
    assert strip(ra) == strip(rb)
    assert checkpoint.load(a["final"]).sha256() == checkpoint.load(b["final"]).sha256()
    widths = {r["step"]: (r["stage"], r["width"]) for r in ra}
    assert widths[9] == (0, 32) and widths[10] == (1, 48) and widths[18] == (1, 48) and widths[19] == (2, 64)
    assert [r["gate"] for r in ra if r["step"] in (9, 10, 11, 12, 19, 20, 21)] == [None, 0.0, 0.5, 1.0, 0.0, 0.5, 1.0]
    assert ra[10]["loss"] < ra[9]["loss"] + 0.05  # no bump at the growth: same function, carried optimizer
    flops = [r["flops"] for r in ra]
    assert all(b > a for a, b in zip(flops, flops[1:]))
    n32, n64 = tiny_cfg().n_params(), checkpoint.load(a["final"]).config.n_params()
    assert flops[1] == pytest.approx(6 * n32 * 256) and flops[-1] - flops[-2] == pytest.approx(
        6 * n64 * 256, rel=1e-4
    )  # (+ the gates)
    assert [r["lr"] for r in ra[1:]] == [lr_at(s, a["settings"]) for s in range(30)]  # one schedule, no re-warm
    lineage = checkpoint.load(a["final"]).lineage
    assert [(e["op"], e.get("step"), e.get("width_to")) for e in lineage] == [
        ("train", 9, None),
        ("expand", 9, 48),
        ("train", 18, None),
        ("expand", 18, 64),
        ("train", None, None),
    ]
    ck = checkpoint.load(a["final"])
    assert ck.config.width == 64 and not ck.config.gated and a["val_loss"] < a["first_val_loss"] - 1.0
    assert (d / "ms" / "loss.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--grow-at", "half:48"], "--grow-at 'half:48': expected FRACTION:WIDTH"),
        (["--grow-at", "1.5:48"], "0 < FRACTION < 1"),
        (["--grow-at", "0.5:64", "--grow-at", "0.3:48"], "increasing order"),
        (["--grow-at", "0.5:24"], "not larger than the model's width 32"),
        (["--grow-at", "0.3:48", "--grow-at", "0.35:64"], "shorter than the gate ramp"),
        (["--grow-at", "0.5:48", "--grow-recipe", "nope"], "unknown recipe 'nope'"),
        (["--grow-at", "0.5:48", "--fsdp"], "--grow-at does not work with --fsdp"),
    ],
)
def test_bad_schedules_are_one_line_exit_2_without_output(world, tmp_path, extra, msg):
    r = cli("train", world["base"], "--data", world["text"], "--steps", 20, "--out", tmp_path / "run", "-q", *extra)
    assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "run").exists()


def test_expand_run_folder_bad_input(world, tmp_path):
    r = cli("expand", tmp_path, "--width", 48, "-o", tmp_path / "x")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    run = tmp_path / "run"
    assert (
        cli("train", world["base"], "--data", world["text"], "--steps", 4, "--stop-at", 2, "--out", run, "-q").exit_code
        == 0
    )
    r = cli("expand", run, "--width", 48)
    assert r.exit_code == 2 and "give -o NEW_RUN_DIR" in r.stderr, r.stderr
    r = cli("expand", run, "--width", 16, "-o", tmp_path / "g")
    assert r.exit_code == 2 and "not larger" in r.stderr and not (tmp_path / "g").exists(), r.stderr
    r = cli("expand", run, "--width", 48, "-o", tmp_path / "g", "--dry-run")
    assert r.exit_code == 2 and "do not apply" in r.stderr, r.stderr
    done = tmp_path / "done"
    assert cli("train", world["base"], "--data", world["text"], "--steps", 2, "--out", done, "-q").exit_code == 0
    r = cli("expand", done, "--width", 48, "-o", tmp_path / "g")
    assert r.exit_code == 2 and "the run is finished" in r.stderr, r.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_runs_saved_before_the_growth_settings_still_resume(world, tmp_path):
    kw = dict(KW, steps=6)
    train(world["base"], [world["text"]], tmp_path / "run", stop_at=3, **kw)
    state = torch.load(tmp_path / "run" / STATE, weights_only=True)
    for k in ("grow_at", "grow_recipe", "grow_optimizer", "grow_schedule", "grow_warmup"):
        del state["settings"][k]
    del state["growths"]
    torch.save(state, tmp_path / "run" / STATE)
    r = train(world["base"], [world["text"]], tmp_path / "run", resume=True, **kw)
    assert r["steps"] == 6 and r["final"]


def test_gpt2_run_folder_grows_and_resumes_at_the_sources_loss(world, tmp_path):
    """LayerNorm, tied head: the residual rotated by R(sqrt(d/D)), the embedding mean-filled; the moments
    follow (rotated m, (R o R) v) and the first update after the growth sees the source's function."""
    from growtool.grow import recipes
    from growtool.training.stages import Growth, expand_run

    cfg = tiny_cfg(family="gpt2", kv_heads=4, tie=True, norm_eps=1e-5, attn_gate=False)
    base = checkpoint.save_tensors(str(tmp_path / "b.safetensors"), cfg, [], init_model(cfg, seed=1).tensors())
    kw = dict(KW, steps=12, grow_schedule="continue")  # no re-warm: the first update after growth is the source's
    train(base, [world["text"]], tmp_path / "src", stop_at=6, **kw)
    shutil.copytree(tmp_path / "src", tmp_path / "on")
    plan, step = expand_run(tmp_path / "src", tmp_path / "grown", Growth(48, recipes.load("srio"), seed=0))
    assert step == 6 and plan.eps == pytest.approx((32 / 48) ** 0.5) and plan.exact
    on = train(base, [world["text"]], tmp_path / "on", resume=True, stop_at=7, **kw)
    grown = train(base, [world["text"]], tmp_path / "grown", resume=True, stop_at=7, **kw)
    a, b = read_metrics(tmp_path / "on" / "metrics.jsonl"), read_metrics(tmp_path / "grown" / "metrics.jsonl")
    assert on["steps"] == grown["steps"] == 7 and b[7]["width"] == 48 and b[7]["gate"] == 0.0
    assert b[7]["loss"] == pytest.approx(a[7]["loss"], rel=1e-5) and b[7]["lr"] == a[7]["lr"]


def test_inspect_takes_a_run_folder_as_expand_does(world, tmp_path):
    run = tmp_path / "run"
    args = ("train", world["base"], "--data", world["text"], "--steps", 4, "--stop-at", 2, "--out", run, "-q")
    assert cli(*args).exit_code == 0
    r = cli("inspect", run, "--json")
    assert r.exit_code == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["run_folder"] == str(run) and facts["path"] == str(run / "last.safetensors")
    assert facts["width"] == tiny_cfg().width and facts["parameters"] == tiny_cfg().n_params()
    r = cli("inspect", run)
    assert r.exit_code == 0 and "a training run folder" in r.stderr and "last.safetensors" in r.stderr, r.stderr
    assert json.loads(cli("inspect", world["base"], "--json").stdout)["run_folder"] is None


def test_library_expand_grows_a_run_folder_as_the_cli_does(world, tmp_path):
    """``growtool.expand(RUN_DIR, ...)`` (the library, not only the command line) grows a run folder
    into a new one: the same model bytes and state as ``growtool expand RUN_DIR``; without ``out``,
    or with an option for files (``dtype``), it is refused with one line and writes nothing."""
    import growtool
    from growtool.nn.errors import GrowError

    train(world["base"], [world["text"]], tmp_path / "run", steps=4, stop_at=2, **KW)
    lib = growtool.expand(tmp_path / "run", width=48, out=tmp_path / "lib")
    assert lib == tmp_path / "lib"
    assert cli("expand", tmp_path / "run", "--width", 48, "-o", tmp_path / "cli", "-q").exit_code == 0
    assert (lib / MODEL).read_bytes() == (tmp_path / "cli" / MODEL).read_bytes()
    a, b = (torch.load(p / STATE, weights_only=True) for p in (lib, tmp_path / "cli"))
    assert a["step"] == b["step"] == 2 and a["growths"] == b["growths"] == [
        {"step": 2, "width": 48, "recipe": "srio", "from": 32}
    ]
    for kw, msg in (({}, "give -o NEW_RUN_DIR"), ({"out": tmp_path / "x", "dtype": "bfloat16"}, "do not apply")):
        with pytest.raises(GrowError, match=msg):
            growtool.expand(tmp_path / "run", width=48, **kw)
    assert not (tmp_path / "x").exists()


def lrs_of(run) -> dict:
    return {r["step"]: r["lr"] for r in read_metrics(run / "metrics.jsonl") if "lr" in r}


def test_a_run_folder_grown_in_depth_under_wsd_continues_its_schedule(world, tmp_path):
    """``expand RUN --layers 2x`` then ``train --resume``, no --grow-schedule anywhere: under wsd a growth in
    depth alone continues the run's LR schedule, as ``--grow-at`` does by default (re-warming after a
    stacking cost 6.8 and 3.9 points of compute on BPE, 3 of 3 seeds each: bench/results/budget_d64/
    WRITEUP.md, thirteenth session). A width growth re-warms, as with --grow-at; and ``--resume
    --grow-schedule rewarm`` re-warms the depth growth too. A stacking after a width growth that re-warmed
    the run continues the schedule the width growth began (``rewarm-width``; a second re-warm ended higher
    on 10 of 10 seeds at 10 tokens / parameter and 3 of 3 at 5 and 20, the WRITEUP's twenty-eighth session): the updates
    since the width growth keep their LRs, so the run can still be extended, and a --grow-schedule that
    would change one of them is refused."""
    d, text, base = tmp_path, world["text"], world["base"]
    kw = dict(KW, steps=20, schedule="wsd", warmup=4)
    train(base, [text], d / "src", stop_at=10, **kw)
    shutil.copytree(d / "src", d / "on")
    train(base, [text], d / "on", resume=True, **kw)
    ref = lrs_of(d / "on")
    for name, args in (("deep", ["--layers", "2x"]), ("deep2", ["--layers", "2x"]), ("wide", ["--width", 48])):
        r = cli("expand", d / "src", *args, "-o", d / name, "-q")
        assert r.exit_code == 0, r.stderr
    saved = {n: torch.load(d / n / STATE, weights_only=True)["settings"]["grow_schedule"] for n in ("deep", "wide")}
    assert saved == {"deep": "continue", "wide": "rewarm"}
    lrs = {}
    for name, extra in (("deep", {}), ("deep2", {"grow_schedule": "rewarm"}), ("wide", {})):
        train(base, [text], d / name, resume=True, **kw, **extra)
        lrs[name] = lrs_of(d / name)
    after = range(11, 21)  # records of updates 10..19 (a record's step counts the updates done)
    assert [lrs["deep"][s] for s in after] == [ref[s] for s in after]  # one schedule
    assert lrs["deep"][11] == ref[11] == kw["lr"]  # at the peak, stable phase
    for name in ("deep2", "wide"):
        assert lrs[name][11] == kw["lr"] / 4, (name, lrs[name][11])  # warming up again from the growth
    assert cli("expand", d / "src", "--width", 48, "-o", d / "w2", "-q").exit_code == 0  # widened, trained, stacked,
    train(base, [text], d / "w2", resume=True, stop_at=17, **kw)  # past where one schedule would decay
    assert cli("expand", d / "w2", "--layers", "2x", "-o", d / "w3", "-q").exit_code == 0
    assert torch.load(d / "w3" / STATE, weights_only=True)["settings"]["grow_schedule"] == "rewarm-width"
    shutil.copytree(d / "w3", d / "w3b")  # --grow-schedule on resuming it: taken only if no update done changes LR
    with pytest.raises(GrowError, match="update 10 of this run had its learning rate under rewarm-width"):
        train(base, [text], d / "w3b", resume=True, **kw, grow_schedule="continue")
    train(base, [text], d / "w3b", resume=True, **kw, grow_schedule="rewarm")
    assert lrs_of(d / "w3b")[18] < kw["lr"] / 2  # the stacking at update 17 warms up again (the rule before)
    train(base, [text], d / "w3", resume=True, **{**kw, "steps": 24})  # then extended: its past LRs are kept
    w3 = lrs_of(d / "w3")
    assert w3[11] == kw["lr"] / 4 and w3[14] == w3[17] == w3[18] == kw["lr"]  # re-warmed at 10, none at 17


def test_a_run_folder_widened_takes_grow_warmup_until_an_update_has_used_it(world, tmp_path):
    """``train --resume --grow-warmup 0`` on a run folder that ``expand RUN`` just widened: the re-warm keeps
    the peak LR (and is kept on a later resume); once an update has run under the re-warm, a new value would
    change that update's LR and is refused in one line, also after a later growth."""
    d, text, base = tmp_path, world["text"], world["base"]
    kw = dict(KW, steps=20, schedule="wsd", warmup=4)
    train(base, [text], d / "src", stop_at=10, **kw)
    for name in ("hold", "warm"):
        assert cli("expand", d / "src", "--width", 48, "-o", d / name, "-q").exit_code == 0
    train(base, [text], d / "hold", resume=True, stop_at=14, grow_warmup=0, **kw)
    train(base, [text], d / "hold", resume=True, **kw)  # not given: kept
    assert lrs_of(d / "hold")[11] == lrs_of(d / "hold")[17] == kw["lr"]  # no second warm-up
    assert torch.load(d / "hold" / STATE, weights_only=True)["settings"]["grow_warmup"] == 0
    train(base, [text], d / "warm", resume=True, stop_at=14, **kw)
    assert lrs_of(d / "warm")[11] == kw["lr"] / 4
    with pytest.raises(GrowError, match="--grow-warmup 0 differs from the run's"):  # updates ran since the growth
        train(base, [text], d / "warm", resume=True, grow_warmup=0, **kw)
    assert cli("expand", d / "warm", "--layers", "2x", "-o", d / "deep", "-q").exit_code == 0  # grown again: free,
    msg = "--grow-warmup 0: update 10 of this run had its learning rate under --warmup .* resume without --grow-warmup"
    with pytest.raises(GrowError, match=msg):  # but update 10 re-warmed
        train(base, [text], d / "deep", resume=True, grow_warmup=0, **kw)


def test_a_run_folder_stacked_then_widened_keeps_one_schedule(world, tmp_path):
    """``expand RUN --layers 2x``, train on, then ``expand RUN --width``, no --grow-schedule anywhere: under
    wsd a run that has grown in depth alone keeps one schedule, so the width growth does not re-warm
    (inside one run, stacking then widening ended lower without the re-warm on 7 of 7 seeds: bench/results/
    budget_d64/WRITEUP.md, twenty-ninth session), and the run can still be extended. The rule says so
    itself (``settings.next_grow_schedule``); it once kept the stacking's ``continue`` as if given on the
    command line. Without the stacking, the same width growth re-warms."""
    d, text, base = tmp_path, world["text"], world["base"]
    kw = dict(KW, steps=20, schedule="wsd", warmup=4)
    train(base, [text], d / "src", stop_at=10, **kw)
    assert cli("expand", d / "src", "--layers", "2x", "-o", d / "deep", "-q").exit_code == 0
    train(base, [text], d / "deep", resume=True, stop_at=17, **kw)
    for src, name in ((d / "deep", "wide"), (d / "src", "wide_only")):
        r = cli("expand", src, "--width", 48, "-o", d / name, "-q")
        assert r.exit_code == 0, r.stderr
    names = ("wide", "wide_only")
    saved = {n: torch.load(d / n / STATE, weights_only=True)["settings"]["grow_schedule"] for n in names}
    assert saved == {"wide": "continue", "wide_only": "rewarm"}
    train(base, [text], d / "wide", resume=True, **{**kw, "steps": 24})  # extended: no update done changes its LR
    lrs = lrs_of(d / "wide")
    assert [lrs[s] for s in range(11, 20)] == [kw["lr"]] * 9  # the peak through both growths (at 10 and 17)
    assert lrs[24] < kw["lr"]  # and one decay at the end


def test_the_run_folder_rule_keeps_every_done_updates_lr():
    """``settings.grow_schedule_after`` on growth records alone: an ``expand RUN`` after --grow-at's own
    growths (widened at 4, stacked at 8, one schedule: the default) keeps that schedule, since re-warming at
    the new width growth would re-warm the planned one too (the rule once returned ``rewarm`` here); a
    value given on the command line is kept; cosine re-warms."""
    from growtool.training.settings import grow_schedule_after

    wide, deep = {"step": 4, "width": 64, "from": 32}, {"step": 8, "width": 64, "layers": 4, "layers_from": 2}
    planned = {"schedule": "wsd", "grow_at": [[4, 64], [8, {"layers": 4}]], "grow_schedule": "continue"}
    later_wide, later_deep = {"step": 12, "width": 96, "from": 64}, {"step": 12, "width": 96, "layers": 8, "from": 96}
    assert grow_schedule_after(planned, [wide, deep, later_wide]) == "continue"
    assert grow_schedule_after({**planned, "grow_schedule": "rewarm"}, [wide, deep, later_wide]) == "rewarm"  # given
    fresh = {"schedule": "wsd", "grow_at": [], "grow_schedule": "rewarm"}  # a run started without --grow-at
    assert grow_schedule_after(fresh, [wide]) == "rewarm"
    assert grow_schedule_after(fresh, [wide, later_deep]) == "rewarm-width"  # the width growth's re-warm kept
    assert grow_schedule_after({**fresh, "schedule": "cosine"}, [deep]) == "rewarm"
