"""The budget benchmark's smoke run (``python bench/budget.py --quick``) on a small generated .jsonl:
FLOPs matched to scratch with the base phase counted, the LR-tuned baseline, every run cached; a
depth variant (stack2x: 1 -> 2 layers inside ``train``) ends at the width variants' scratch target;
the frontier measure; --part and --cached-only."""

import csv
import dataclasses
import json
import math
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from budget import DEPTH, QUICK, spec_key  # noqa: E402
from growth_pays import _config  # noqa: E402

from growtool.training.settings import Settings  # noqa: E402


def bench(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "budget.py"), *map(str, args)],
        capture_output=True,
        text=True,
    )


@pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow`
def test_bench_budget_quick(tmp_path):
    docs = tmp_path / "docs.jsonl"
    lines = [f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 11}." for i in range(900)]
    docs.write_text("".join(json.dumps({"text": " ".join(lines[i : i + 30])}) + "\n" for i in range(0, 900, 30)))
    p = bench(docs, "--quick", "--out", tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "budget"
    for f in ("results.csv", "sweep.csv", "results.json", "budget.png"):
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    rows = list(csv.DictReader(open(d / "results.csv")))
    got = [(r["variant"], float(r["tokens_per_param"]), r["width"], r["layers"]) for r in rows]
    assert got == [
        (v, b, w, "1->2" if v == "stack2x" else "2->2")
        for v, w in (("stack2x", "32->32"), ("width1.5", "32->48"))
        for b in (0.02, 0.04)
    ]
    sweep = list(csv.DictReader(open(d / "sweep.csv")))
    assert [(r["variant"], r["width"]) for r in sweep] == [("g2", "32->64")]
    cached = [json.loads(f.read_text()) for f in sorted((d / "cached").glob("*.json"))]
    assert len(cached) == 15  # targets d48, d32 (stack2x) at 2 budgets, d64 (sweep) at 1, 2 LRs = 10 scratch; 5 grown
    P = dict(QUICK)
    for c in cached:
        s, r = c["spec"], c["result"]
        assert (d / "cached" / f"{spec_key(s)}.json").exists()
        n_t = _config(P, "llama", s["target"]).n_params()
        want = 6 * n_t * s["budget"] * n_t  # every run, grown or not, at the scratch run's FLOPs
        assert abs(r["flops"] - want) <= 6 * n_t * P["batch"] * P["seq"], (s, r["flops"], want)  # to a whole step
        assert r["curve"][0][0] == 0.0 and r["curve"][-1][0] == r["flops"]
        assert r["final"][:2] == [s["target"], P["layers"]] and abs(r["final_params"] - n_t) <= P["layers"], (s, r)
    deep = [c for c in cached if c["spec"].get("variant") in DEPTH]
    assert len(deep) == 2 and all(c["spec"]["base"] == [32, 1] for c in deep)  # grew 1 -> 2 layers: the FLOPs
    for c in deep:  # of a run that stayed at 1 layer after the growth would miss the step bound above by half
        n_b = _config({**P, "layers": 1}, "llama", 32).n_params()
        first = next(f for f, _ in c["result"]["curve"] if f > 0)  # the base phase ran the 1-layer model
        assert first % (6 * n_b * P["batch"] * P["seq"]) == 0, (first, n_b)
    for row in rows + sweep:  # the baseline is scratch at its best LR, paired by seed
        B = float(row["tokens_per_param"])
        target = int(row["width"].split("->")[1])
        by_lr = {
            c["spec"]["lr"]: c["result"]["val"]
            for c in cached
            if c["spec"]["kind"] == "scratch" and c["spec"]["budget"] == B and c["spec"]["target"] == target
        }
        assert len(by_lr) == 2 and float(row["scratch_best_lr"]) == min(by_lr, key=by_lr.get)
        assert float(row["scratch_val"]) == min(by_lr.values())
        assert abs(float(row["d_val"]) - (float(row["grown_val"]) - float(row["scratch_val"]))) < 1e-9
        assert row["saved_per_seed"] == "n.r." or float(row["saved_mean"]) < 1.0
    # a second invocation runs nothing; a lost result is run again, alone
    p = bench(docs, "--quick", "--out", tmp_path)
    assert p.returncode == 0 and "15 cached, 0 to run" in p.stdout, p.stdout + p.stderr[-2000:]
    sorted((d / "cached").glob("*.json"))[0].unlink()
    p = bench(docs, "--quick", "--out", tmp_path)
    assert p.returncode == 0 and "14 cached, 1 to run" in p.stdout, p.stdout + p.stderr[-2000:]
    # the frontier measure: scratch's (FLOPs, final loss) at its budgets, interpolated in log FLOPs
    for row in rows:
        target = int(row["width"].split("->")[1])
        pts = {}
        for c in cached:
            s = c["spec"]
            if s["kind"] == "scratch" and s["target"] == target:
                pts.setdefault(s["budget"], {})[s["lr"]] = (c["result"]["flops"], c["result"]["val"])
        best = [min(v.values(), key=lambda fv: fv[1]) for _, v in sorted(pts.items())]  # one seed: best LR
        g = next(
            c["result"]
            for c in cached
            if c["spec"].get("variant") == row["variant"] and c["spec"]["budget"] == float(row["tokens_per_param"])
        )
        (c0, v0), (c1, v1) = best
        if min(v0, v1) <= g["val"] <= max(v0, v1):
            need = math.exp(math.log(c0) + (g["val"] - v0) / (v1 - v0) * (math.log(c1) - math.log(c0)))
            assert abs(float(row["frontier_mean"]) - (1 - g["flops"] / need)) < 1e-9, row
        else:
            assert row["frontier_per_seed"][0] in "<>" and row["frontier_mean"] == "", row
    # --part K/N: N processes share the missing runs by their place among all runs; --cached-only runs none
    for f in sorted((d / "cached").glob("*.json"))[:3]:
        f.unlink()
    p = bench(docs, "--quick", "--out", tmp_path, "--cached-only")
    assert (
        p.returncode == 0
        and "12 of 15 planned runs cached" in p.stdout
        and len(list((d / "cached").glob("*.json"))) == 12
    )
    ran = []
    for part in ("0/2", "1/2"):
        p = bench(docs, "--quick", "--out", tmp_path, "--part", part)
        assert p.returncode == 0, p.stderr[-2000:]
        ran.append(p.stdout.count(" val "))
    assert sum(ran) == 3 and len(list((d / "cached").glob("*.json"))) == 15, (ran, p.stdout)
    p = bench(docs, "--quick", "--out", tmp_path, "--part", "2/2")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--part" in p.stderr
    p = bench(docs, "--quick", "--out", tmp_path / "bad", "--layers", "1")  # stack2x cannot grow a 1-layer target
    assert p.returncode == 2 and "do not grow" in p.stderr and not (tmp_path / "bad" / "budget" / "cached").exists()
    for opt in ("--families", "--scratch-family"):  # a misspelt family: one line, not a Llama target or no baseline
        p = bench(docs, "--quick", "--out", tmp_path / "bad", opt, "lama")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown family 'lama'" in p.stderr, p.stderr
        assert not (tmp_path / "bad" / "budget" / "cached").exists()
    if "schedule" not in {f.name for f in fields(Settings)}:  # before the trainer has --schedule
        p = bench(docs, "--quick", "--out", tmp_path, "--schedule", "wsd")
        assert p.returncode != 0 and "no --schedule" in p.stderr


def test_scratch_compute_for_interpolates_log_flops_between_budgets():
    from budget import scratch_compute_for

    pts = [(4e6, 2.2), (1e6, 3.0), (2e6, 2.5)]
    c, b = scratch_compute_for(pts, 2.5)
    assert b == "" and abs(c - 2e6) < 1e-3
    c, b = scratch_compute_for(pts, 2.35)  # half-way in loss between 2e6 and 4e6: their geometric mean
    assert b == "" and abs(c - math.sqrt(2e6 * 4e6)) < 1e-3
    assert scratch_compute_for(pts, 2.0) == (4e6, ">")  # better than scratch's largest budget: a bound
    assert scratch_compute_for(pts, 3.2) == (1e6, "<")


def test_the_budget_plot_has_plain_log_ticks(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from budget import plot

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to read it back
    rows = [
        dict(family="gpt2", variant="srio", tokens_per_param=t, seeds=1, frontier_mean=0.2, frontier_std=0.01)
        for t in (2, 5, 10, 20)
    ]
    plot(rows, tmp_path / "b.png", "compute saved by growing, per budget: docs.jsonl (first 8 MB)")
    ax = kept[0].axes[0]
    assert ax.get_xscale() == "log" and (tmp_path / "b.png").stat().st_size > 1000
    kept[0].canvas.draw()
    labels = [t.get_text() for t in ax.xaxis.get_majorticklabels() + ax.xaxis.get_minorticklabels() if t.get_text()]
    assert {"2", "5", "10", "20"} <= set(labels) and not any("times" in s or "^" in s for s in labels), labels


def test_variants_take_a_growth_time_options_and_a_grown_lr_sweep(tmp_path):
    """``NAME@T/OPTION``: grown at T of the stable phase (wsd: T x 0.8 of the run), with the option's
    recipe and train keywords; every grown variant runs at each LR of --grow-lrs; seeds from --first-seed."""
    import yaml
    from budget import FULL, option_kw, plan_runs

    P = dict(FULL, width=64, layers=4, seeds=2, first_seed=1, budgets="10", lrs="0.003", grow_lrs="0.003,0.006")
    P.update(schedule="wsd", variants="width2x@0.15/paper,stack2x/pairs")
    runs = plan_runs(P)
    grown = [r for r in runs if r["kind"] == "grown"]
    assert {r["seed"] for r in runs} == {1} and sorted({r["lr"] for r in grown}) == [0.003, 0.006]
    w = next(r for r in grown if r["variant"].startswith("width2x"))
    assert w["base"] == [32, 4] and w["growths"] == [[0.12, 64, 4, None]] and w["opts"] == ["paper"]
    s = next(r for r in grown if r["variant"].startswith("stack2x"))
    assert s["base"] == [64, 2] and s["growths"][0][0] == 0.5 and s["opts"] == ["pairs"]
    rewarm = {"grow_schedule": "rewarm"}  # pinned: what every cached run without /continue ran with
    assert option_kw(w, tmp_path) == {**rewarm, "new_lr_mult": 1.0, "new_rewarm_steps": 0}
    kw = option_kw(s, tmp_path)
    assert set(kw) == {"grow_recipe", "grow_schedule"} and yaml.safe_load(open(kw["grow_recipe"]))["pair_noise"] == 0.3
    assert option_kw({"opts": []}, tmp_path) == rewarm  # the trainer's defaults, its LR at the growth pinned
    assert option_kw({"opts": ["paper", "mup"]}, tmp_path)["grow_lr"] == "mup"
    assert option_kw({"opts": ["ramp1"]}, tmp_path, tokens=250_000) == {**rewarm, "gate_warmup_tokens": 2500}
    assert option_kw({"opts": ["ramp25"]}, tmp_path, tokens=250_000) == {**rewarm, "gate_warmup_tokens": 62500}
    assert option_kw({"opts": ["ramp0"]}, tmp_path, tokens=250_000) == {**rewarm, "gate_warmup_tokens": 1}
    assert option_kw({"opts": ["paper", "continue"]}, tmp_path)["grow_schedule"] == "continue"
    assert option_kw({"opts": ["hold"]}, tmp_path) == {**rewarm, "grow_warmup": 0}  # a re-warm at the peak LR


def test_each_arm_takes_its_best_lr_on_the_seeds_every_lr_ran():
    """The LR sweep on seed 0, the other seeds at the chosen LR: LRs compare on seed 0 alone, and the
    grown arm's row reports its own best LR and the sweep."""
    from budget import FULL, aggregate, best_lr

    by_lr = {0.003: {0: {"val": 2.0}, 1: {"val": 1.0}, 2: {"val": 1.0}}, 0.006: {0: {"val": 1.9}}}
    assert best_lr(by_lr) == 0.006  # on seed 0 (a mean over all seeds would pick 0.003)
    P = dict(FULL, width=64, layers=4)

    def res(val, flops):
        return {"val": val, "flops": flops, "curve": [[0.0, 5.0], [flops, val]]}

    results = [
        ({"kind": "scratch", "family": "llama", "target": 64, "budget": 10.0, "lr": 0.003, "seed": 0}, res(2.0, 100.0)),
        ({"kind": "scratch", "family": "llama", "target": 64, "budget": 20.0, "lr": 0.003, "seed": 0}, res(1.8, 200.0)),
    ]
    for lr, val in ((0.003, 1.95), (0.006, 1.9), (0.012, 2.1)):
        spec = {"kind": "grown", "family": "llama", "variant": "width2x", "target": 64, "budget": 10.0, "lr": lr}
        results.append(({**spec, "seed": 0, "base": [32, 4]}, res(val, 100.0)))
    (row,) = aggregate(P, results)
    assert row["grown_best_lr"] == 0.006 and row["grown_lr_sweep"] == "0.003: 1.9500 / 0.006: 1.9000 / 0.012: 2.1000"
    assert abs(row["d_val"] - (1.9 - 2.0)) < 1e-12
    assert abs(row["frontier_mean"] - (1 - 100.0 / (100.0 * 2**0.5))) < 1e-9  # 1.9: half-way to 1.8 in loss


@pytest.mark.slow  # a bench smoke run
def test_the_plain_path_grows_depth_alone(tmp_path):
    """``/plain`` on a depth variant: ``train BASE``, ``expand --layers`` (no width: expand refuses a
    growth to the same width), ``train GROWN``, each with the trainer's defaults; the run ends at
    the target's shape and FLOPs, base phase counted."""
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"the quick brown fox {i % 7} jumps over the lazy dog {i % 11}." for i in range(900)))
    args = ("--variants", "stack2x@0.15/plain", "--sweep", "", "--budgets", "0.04")
    p = bench(text, "--quick", "--out", tmp_path, *args)
    assert p.returncode == 0, p.stderr[-2000:]
    (c,) = [json.loads(f.read_text()) for f in (tmp_path / "budget" / "cached").glob("*.json")
            if json.loads(f.read_text())["spec"]["kind"] == "grown"]  # fmt: skip
    P = dict(QUICK)
    n_t = _config(P, "llama", 32).n_params()
    assert c["spec"]["opts"] == ["plain"] and c["result"]["final"][:2] == [32, 2]
    assert abs(c["result"]["flops"] - 6 * n_t * 0.04 * n_t) <= 2 * 6 * n_t * P["batch"] * P["seq"]  # two phases


def test_a_staged_variant_at_T_ends_at_T_and_grows_earlier_in_proportion():
    from budget import depth_spec

    P = {**QUICK, "layers": 4, "schedule": "wsd"}  # wsd: T of the stable phase, 80% of the run
    assert depth_spec(P, "stack2x@0.15")["growths"] == [[0.12, 32, 4, "stack"]]
    assert depth_spec(P, "stages4x@0.15")["growths"] == [[0.06, 32, 2, "stack"], [0.12, 32, 4, "stack"]]
    assert depth_spec(P, "stages4x")["base"] == [32, 1]


def test_width_then_stack_widens_the_half_depth_base_then_stacks_it():
    """``width2x_stack2x@T``: d/2 x L/2 widened to d x L/2 at 3/8 of T, stacked to d x L at T (12% and
    32% of the run at T = 0.4 under wsd: where each growth alone saved most); one --grow-at item each."""
    from budget import depth_spec, grow_item

    P = {**QUICK, "width": 64, "layers": 4, "head_dim": 8, "schedule": "wsd"}
    spec = depth_spec(P, "width2x_stack2x@0.4/continue")
    assert spec == {"base": [32, 2], "growths": [[0.12, 64, 2, None], [0.32, 64, 4, "stack"]], "opts": ["continue"]}
    shapes = [spec["base"]] + [g[1:3] for g in spec["growths"]]
    assert [grow_item(a, g) for a, g in zip(shapes, spec["growths"])] == [
        "0.120000:64",
        "0.320000:layers=4,method=stack",
    ]


def test_the_width_then_stack_variants_move_one_thing_each():
    """The two-growth variant's neighbours: the widening at 1/4 or 1/2 of T (not 3/8), a d/4 base
    widened 4x, the stacking first, a one-layer base widened then stacked twice (three --grow-at
    items), the widening in two steps, and the stacking as interleaving."""
    from budget import depth_spec, grow_item

    P = {**QUICK, "width": 64, "layers": 4, "head_dim": 8, "schedule": "wsd"}
    stacked = [0.48, 64, 4, "stack"]  # T = 0.6 of the stable phase: 48% of the run
    assert depth_spec(P, "width2x_stack2x_w25@0.6")["growths"] == [[0.12, 64, 2, None], stacked]
    assert depth_spec(P, "width2x_stack2x_w50@0.6")["growths"] == [[0.24, 64, 2, None], stacked]
    assert depth_spec(P, "width4x_stack2x@0.6") == {"base": [16, 2], "growths": [[0.18, 64, 2, None], stacked]}
    assert depth_spec(P, "stack2x_width2x@0.6")["growths"] == [[0.18, 32, 4, "stack"], [0.48, 64, 4, None]]
    spec = depth_spec(P, "width2x_stack4x@0.6")
    assert spec == {"base": [32, 1], "growths": [[0.12, 64, 1, None], [0.24, 64, 2, "stack"], stacked]}
    shapes = [spec["base"]] + [g[1:3] for g in spec["growths"]]
    assert [grow_item(a, g) for a, g in zip(shapes, spec["growths"])] == [
        "0.120000:64",
        "0.240000:layers=2,method=stack",
        "0.480000:layers=4,method=stack",
    ]
    spec = depth_spec(P, "width2x_steps_stack2x@0.6")  # widened in two steps, 1.5x then 1.33x, the last at 18%
    assert spec["growths"] == [[0.06, 48, 2, None], [0.18, 64, 2, None], stacked]  # 12% apart: the gate ramp is 10%
    assert [grow_item(a, g) for a, g in zip([spec["base"], [48, 2]], spec["growths"])] == ["0.060000:48", "0.180000:64"]
    spec = depth_spec(P, "width2x_interleave2x@0.6")  # the best row's stacking as 1 1 2 2
    assert spec["growths"] == [[0.18, 64, 2, None], [0.48, 64, 4, "interleave"]]
    assert grow_item([64, 2], spec["growths"][1]) == "0.480000:layers=4,method=interleave"


def test_the_plot_draws_the_3_seed_and_multi_budget_series():
    from budget import plotted

    def row(v, b, seeds):
        return {"family": "llama", "variant": v, "tokens_per_param": b, "seeds": seeds}

    rows = [row("a", 10, 3), row("b", 10, 1), row("c", 5, 1), row("c", 10, 1), row("g2", 0.02, 1)]
    assert plotted(rows) == [("llama", "a"), ("llama", "c")]
    assert plotted([row("b", 10, 1)]) == [("llama", "b")]  # nothing qualifies: every series


def test_base2_trains_the_plain_paths_base_at_twice_the_lr_and_needs_plain(tmp_path, monkeypatch):
    """``/plain/base2``: the base phase at 2x the run's LR, the grown phase at the run's LR; ``/base2``
    without ``/plain`` is refused (``--grow-at`` has no base phase of its own to set)."""
    import budget

    lrs = []

    def phase(Q, ckpt, out, tokens, seed, **kw):
        lrs.append(Q["lr"])
        return {"final": ckpt}, [{"flops": 1.0}]

    monkeypatch.setattr(budget, "train_phase", phase)
    monkeypatch.setattr(budget, "_curve", lambda recs, start=0.0: [])
    monkeypatch.setattr("growtool.surgery.expand", lambda src, out, **kw: out)
    spec = {"seed": 0, "base": [32, 2], "growths": [[0.12, 32, 4, "stack"]], "opts": ["plain", "base2"]}
    budget.plain_path({"lr": 0.003}, spec, "base.safetensors", tmp_path, 1000)
    budget.plain_path({"lr": 0.003}, {**spec, "opts": ["plain"]}, "base.safetensors", tmp_path, 1000)
    assert lrs == [0.006, 0.003, 0.003, 0.003]
    with pytest.raises(SystemExit, match="add /plain"):
        budget.depth_spec({**QUICK, "layers": 4, "schedule": "wsd"}, "stack2x@0.15/base2")


def test_stable_and_nowarm_set_one_phase_of_the_plain_path_each(tmp_path, monkeypatch):
    """``/plain/stable``: the base phase without wsd's decay (what a run's checkpoint from before its
    decay holds); ``/plain/nowarm``: ``train GROWN --warmup 0``. Each touches its own phase only, and
    neither is accepted without ``/plain``."""
    import budget

    kws = []

    def phase(Q, ckpt, out, tokens, seed, **kw):
        kws.append(kw)
        return {"final": ckpt}, [{"flops": 1.0}]

    monkeypatch.setattr(budget, "train_phase", phase)
    monkeypatch.setattr(budget, "_curve", lambda recs, start=0.0: [])
    monkeypatch.setattr("growtool.surgery.expand", lambda src, out, **kw: out)
    spec = {"seed": 0, "base": [32, 2], "growths": [[0.2, 32, 4, "stack"]]}
    for opts in (["plain"], ["plain", "stable"], ["plain", "nowarm"]):
        budget.plain_path({"lr": 0.003}, {**spec, "opts": opts}, "base.safetensors", tmp_path, 1000)
    assert kws == [{}, {}, {"decay_fraction": 0.0}, {}, {}, {"warmup": 0}]
    P = {**QUICK, "layers": 4, "schedule": "wsd"}
    for o in ("stable", "nowarm"):
        with pytest.raises(SystemExit, match="add /plain"):
            budget.depth_spec(P, f"stack2x@0.25/{o}")
        assert budget.depth_spec(P, f"stack2x@0.25/plain/{o}")["opts"] == ["plain", o]


def test_paired_scratch_draws_the_grown_runs_batches_and_is_compared_alone(tmp_path):
    """``--paired 1``: scratch specs carry data_seed = seed (the grown runs' batches; a cache key of
    their own), and aggregation compares grown runs with paired scratch runs only; without it, with
    the unpaired ones only (data seed 3000 + seed), so neither study's rows mix the two."""
    from budget import FULL, aggregate, plan_runs, scratch_data_seed

    P = dict(FULL, width=64, layers=4, seeds=2, budgets="10", lrs="0.003", grow_lrs="0.003", variants="stack2x@0.15")
    assert all("data_seed" not in r for r in plan_runs(P))
    paired = [r for r in plan_runs({**P, "paired": 1}) if r["kind"] == "scratch"]
    assert [r["data_seed"] for r in paired] == [r["seed"] for r in paired] == [0, 1]
    assert [scratch_data_seed(r) for r in paired] == [0, 1]  # what run_one trains scratch with
    assert scratch_data_seed({"kind": "scratch", "seed": 1}) == 3001

    def res(val, flops):
        return {"val": val, "flops": flops, "curve": [[0.0, 5.0], [flops, val]]}

    s = {"kind": "scratch", "family": "llama", "target": 64, "budget": 10.0, "lr": 0.003, "seed": 0}
    g = {"kind": "grown", "family": "llama", "variant": "stack2x@0.15", "target": 64, "budget": 10.0}
    results = [(s, res(2.0, 100.0)), ({**s, "data_seed": 0}, res(1.9, 100.0))]
    results.append(({**g, "lr": 0.003, "seed": 0, "base": [64, 2]}, res(1.95, 100.0)))
    assert abs(aggregate(P, results)[0]["d_val"] - (1.95 - 2.0)) < 1e-12
    assert abs(aggregate({**P, "paired": 1}, results)[0]["d_val"] - (1.95 - 1.9)) < 1e-12


def test_scratch_budgets_add_scratch_runs_alone_and_points_on_its_frontier():
    """``--scratch-budgets 14``: scratch at 14 tokens / parameter at every LR and seed, no grown run
    there and no row of its own; the frontier then interpolates between 10 and 14, not 10 and 20."""
    from budget import FULL, aggregate, plan_runs

    P = dict(FULL, width=64, layers=4, seeds=2, budgets="10,20", lrs="0.003", grow_lrs="0.003")
    P.update(variants="stack2x@0.15", paired=1, scratch_budgets="14")
    runs = plan_runs(P)
    at14 = [r for r in runs if r["budget"] == 14.0]
    assert [(r["kind"], r["target"], r["seed"], r["data_seed"]) for r in at14] == [
        ("scratch", 64, 0, 0),
        ("scratch", 64, 1, 1),
    ]
    assert {r["budget"] for r in runs if r["kind"] == "grown"} == {10.0, 20.0}
    alone = plan_runs({**P, "budgets": "", "variants": ""})  # scratch at the extra budgets only
    assert [(r["kind"], r["budget"], r["target"]) for r in alone] == [("scratch", 14.0, 64)] * 2

    def res(val, flops):
        return {"val": val, "flops": flops, "curve": [[0.0, 5.0], [flops, val]]}

    s = {"kind": "scratch", "family": "llama", "target": 64, "lr": 0.003, "seed": 0, "data_seed": 0}
    results = [({**s, "budget": b}, res(v, c)) for b, v, c in ((10.0, 2.0, 100.0), (20.0, 1.8, 200.0))]
    g = {"kind": "grown", "family": "llama", "variant": "stack2x@0.15", "target": 64, "budget": 10.0, "lr": 0.003}
    results.append(({**g, "seed": 0, "base": [64, 2]}, res(1.95, 100.0)))
    (row,) = aggregate(P, results)
    assert abs(row["frontier_mean"] - (1 - 1 / 2**0.25)) < 1e-9  # a quarter of the way from 10 to 20 in loss
    results.append(({**s, "budget": 14.0}, res(1.9, 140.0)))
    (row,) = aggregate(P, results)  # no row at 14: it has no grown run
    assert abs(row["frontier_mean"] - (1 - 1 / 1.4**0.5)) < 1e-9  # half-way from 10 to 14 in loss


def test_vocab_makes_bpe_runs_a_study_of_their_own(tmp_path):
    """``--vocab N``: a BPE tokenizer of N ids trained on the text, models of N ids, and "vocab" in
    every run's cache key, so BPE and byte-level runs never share a key or a table; at the default
    (0, bytes) the keys are the ones every cached byte-level run was saved under."""
    from budget import FULL, SIZES, cached_runs, with_sizes
    from common import tokenizer

    saved = sorted((ROOT / "bench" / "results" / "budget_d64" / "cached").glob("*.json"))[0]
    old = json.loads(saved.read_text())["spec"]  # a byte-level run cached before the option existed
    P = dict(FULL, **{k: old[k] for k in SIZES}, data_id=old["data"])
    assert spec_key(with_sizes(P, {k: v for k, v in old.items() if k not in (*SIZES, "data")})) == saved.stem
    byte = with_sizes(P, {"kind": "scratch", "seed": 0})
    assert "vocab" not in byte
    bpe = with_sizes({**P, "vocab": 300}, {"kind": "scratch", "seed": 0})
    assert bpe == {**byte, "vocab": 300} and spec_key(bpe) != spec_key(byte)
    assert _config({**P, "vocab": 300}, "llama", 64).vocab_size == 300
    assert _config(P, "llama", 64).vocab_size == 256
    cached = tmp_path / "cached"
    cached.mkdir()
    for s in (byte, bpe):
        (cached / f"{spec_key(s)}.json").write_text(json.dumps({"spec": s, "result": {}}))
    assert [s for s, _ in cached_runs(P, cached)] == [byte]
    assert [s for s, _ in cached_runs({**P, "vocab": 300}, cached)] == [bpe]
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"the quick brown fox {i % 13} jumps" for i in range(400)))
    tok = json.loads(Path(tokenizer(str(text), 300, tmp_path / "cache")).read_text())
    assert 256 < len(tok["model"]["vocab"]) <= 300  # the byte alphabet and merges learned on the text


def each_a_study_of_its_own(tmp_path, P, studies):
    """Cache one run per (options, spec) of ``studies``; each options' ``cached_runs`` finds its own alone."""
    import budget

    cached = tmp_path / "cached"
    cached.mkdir()
    for _, sp in studies:
        (cached / f"{spec_key(sp)}.json").write_text(json.dumps({"spec": sp, "result": {}}))
    for opts, sp in studies:
        assert [c for c, _ in budget.cached_runs({**P, **opts}, cached)] == [sp]


def test_decay_makes_runs_at_another_decay_fraction_a_study_of_their_own(tmp_path, monkeypatch):
    """``--decay D`` / ``--decay-shape S``: every wsd phase trains with --decay-fraction D and
    --decay-shape S, each joins the cache key away from train's default (at 0.2 and linear the keys stay
    those of every cached run), a variant's @T is T of the stable phase 1 - D, and ``/branch``'s base
    is as long as puts its decay's start at the growth."""
    import budget
    from common import train_phase

    from growtool.training.schedule import decay_start

    P = dict(budget.FULL, schedule="wsd", data_id="x")
    plain = budget.with_sizes(P, {"kind": "scratch", "seed": 0})
    short = budget.with_sizes({**P, "decay": 0.1}, {"kind": "scratch", "seed": 0})
    sqrt = budget.with_sizes({**P, "decay_shape": "sqrt"}, {"kind": "scratch", "seed": 0})
    assert "decay" not in plain and "decay_shape" not in plain and short == {**plain, "decay": 0.1}
    assert sqrt == {**plain, "decay_shape": "sqrt"} and len({spec_key(x) for x in (plain, short, sqrt)}) == 3
    each_a_study_of_its_own(tmp_path, P, [({}, plain), ({"decay": 0.1}, short), ({"decay_shape": "sqrt"}, sqrt)])
    assert budget.depth_spec(P, "stack2x@0.5")["growths"][0][0] == 0.4
    assert budget.depth_spec({**P, "decay": 0.1}, "stack2x@0.5")["growths"][0][0] == 0.45
    assert decay_start(budget.base_settings(100, 0.1)) == 90 and decay_start(budget.base_settings(100)) == 80
    seen = []
    monkeypatch.setattr("growtool.training.loop.train", lambda *a, **kw: seen.append(kw) or {})
    monkeypatch.setattr("growtool.training.run_folder.read_metrics", lambda path: [])
    Q = {"data": "d", "batch": 2, "seq": 4, "lr": 1e-3, "evals": 1, "eval_batches": 1, "work": str(tmp_path)}
    train_phase({**Q, "schedule": "wsd", "decay": 0.1, "decay_shape": "sqrt"}, "c", "o", 80, 0)
    train_phase({**Q, "schedule": "wsd", "decay": 0.1}, "c", "o", 80, 0, decay_fraction=0.0)  # /stable's base
    train_phase({**Q, "schedule": "cosine", "decay": 0.1}, "c", "o", 80, 0)
    train_phase({**Q, "schedule": "wsd"}, "c", "o", 80, 0)
    assert [kw.get("decay_fraction") for kw in seen] == [0.1, 0.0, None, None]
    assert [kw.get("decay_shape") for kw in seen] == ["sqrt", "linear", None, None]


def test_llama_mha_gate_and_mlp_change_the_llama_target_and_join_the_key_off_default(tmp_path):
    """``--llama-mha 1`` gives the Llama target one KV head per head, ``--llama-gate 0`` drops its
    attention gate, ``--llama-mlp gelu`` makes its MLP plain (Arcee's layout); each joins the cache key
    only away from the default (the cached runs keep theirs) and makes a study of its own; GPT-2's
    target is the same either way."""
    import budget
    from growth_pays import _config

    P = dict(budget.FULL, schedule="wsd", data_id="x")
    base = _config(P, "llama", 64)
    assert (base.kv_heads, base.attn_gate) == (4, True)
    assert (
        _config({**P, "llama_mha": 1}, "llama", 64).kv_heads,
        _config({**P, "llama_gate": 0}, "llama", 64).attn_gate,
    ) == (8, False)
    arcee = _config({**P, "llama_mlp": "gelu"}, "llama", 64)
    assert (arcee.family, arcee.activation, arcee.kv_heads, arcee.ffn) == ("arcee", "gelu", 4, 256)
    assert arcee.n_params() == base.n_params() - P["layers"] * 64 * 256  # no gate_proj
    assert _config({**P, "llama_mha": 1, "llama_gate": 0, "llama_mlp": "gelu"}, "gpt2", 64) == _config(P, "gpt2", 64)
    plain = budget.with_sizes(P, {"kind": "scratch", "seed": 0})
    mha = budget.with_sizes({**P, "llama_mha": 1}, {"kind": "scratch", "seed": 0})
    nogate = budget.with_sizes({**P, "llama_gate": 0}, {"kind": "scratch", "seed": 0})
    gelu = budget.with_sizes({**P, "llama_mlp": "gelu"}, {"kind": "scratch", "seed": 0})
    assert not {"llama_mha", "llama_gate", "llama_mlp"} & set(plain)
    assert mha == {**plain, "llama_mha": 1} and nogate == {**plain, "llama_gate": 0}
    assert gelu == {**plain, "llama_mlp": "gelu"}
    studies = [({}, plain), ({"llama_mha": 1}, mha), ({"llama_gate": 0}, nogate), ({"llama_mlp": "gelu"}, gelu)]
    each_a_study_of_its_own(tmp_path, P, studies)


def test_starcoder2_is_a_target_of_gpt2s_block_with_llamas_positions_and_grows_exactly(tmp_path):
    """``--families starcoder2``: the Llama layout (RoPE, an untied head) with GPT-2's block (LayerNorm,
    biases, a plain GELU MLP, one KV head per head); ``starcoder2_nobias`` without the linear layers'
    biases, ``llama_bias`` the Llama target with them, ``qwen2`` with q, k and v's alone (Qwen2's).
    Width 2x at gate 0 keeps the function."""
    from budget import _init

    from growtool import check, surgery
    from growtool.nn.families import arch_of

    P = dict(QUICK)
    c, g = _config(P, "starcoder2", 64), _config(P, "gpt2", 64)
    f = arch_of(c).features
    assert (f.norm, f.mlp, f.positions, c.tie, g.tie) == ("layernorm", "plain", "rope", False, True)
    assert (c.kv_heads, c.heads, c.qkv_bias, c.o_bias, c.mlp_bias, c.activation) == (
        8,
        8,
        True,
        True,
        True,
        "gelu_pytorch_tanh",
    )
    bare, llama = _config(P, "starcoder2_nobias", 64), _config(P, "llama_bias", 64)
    assert (bare.family, bare.qkv_bias, bare.o_bias, bare.mlp_bias) == ("starcoder2", False, False, False)
    assert (llama.family, llama.qkv_bias, llama.o_bias, llama.mlp_bias) == ("llama", True, True, True)
    plain = _config(P, "llama", 64)
    assert not plain.qkv_bias and llama == dataclasses.replace(plain, qkv_bias=True, o_bias=True, mlp_bias=True)
    assert _config(P, "qwen2", 64) == dataclasses.replace(plain, family="qwen2", qkv_bias=True)  # q, k, v biases alone
    for fam in ("starcoder2", "qwen2"):
        src = _init(P, fam, 32, 0, tmp_path / f"{fam}.safetensors")
        grown = surgery.expand(str(src), width=64, out=str(tmp_path / f"{fam}-grown.safetensors"))
        report = check.verify(str(src), str(grown), samples=4)
        assert report.passed and report.limit <= 1e-4, (fam, report)


def test_gpt2_gate_gives_the_gpt2_target_gated_attention_and_joins_the_key_only_when_set():
    """``--gpt2-gate 1``: the GPT-2 target with the Llama target's gated attention (one more reader per
    block); off (the default), the runs cached before the option keep their keys."""
    import budget

    P = {**QUICK, "data_id": "d"}
    plain, gated = _config(P, "gpt2", 64), _config({**P, "gpt2_gate": 1}, "gpt2", 64)
    assert (plain.attn_gate, gated.attn_gate) == (False, True)
    assert gated.n_params() - plain.n_params() == P["layers"] * gated.heads * (64 + 1)  # g: [heads, width] + bias
    assert _config({**P, "gpt2_gate": 1}, "llama", 64) == _config(P, "llama", 64)
    off = budget.with_sizes(P, {"kind": "scratch", "seed": 0})
    assert "gpt2_gate" not in off and budget.with_sizes({**P, "gpt2_gate": 1}, {"kind": "scratch", "seed": 0}) == {
        **off,
        "gpt2_gate": 1,
    }


def test_every_recipe_option_writes_a_recipe_the_schema_accepts(tmp_path):
    """Each OPTION that changes the recipe (``/open``, ``/noise1``, ``/eps1`` ...) writes a file that
    ``recipes.load`` takes (a misspelt key fails there), with the option's values in it."""
    import budget

    from growtool.grow import recipes

    changed = {name: over for name, (base, over, _) in budget.OPTIONS.items() if base or over}
    assert {"open", "noise1", "eps1", "eps05", "eps0", "pairs", "lemon", "tileheads"} <= set(changed)
    for name, over in changed.items():
        path = budget.option_kw({"opts": [name]}, tmp_path)["grow_recipe"]
        r = recipes.load(path)
        for k, v in over.items():
            assert (r[k] | v if isinstance(v, dict) else v) == r[k], (name, k)
    assert recipes.load(budget.option_kw({"opts": ["eps1"]}, tmp_path)["grow_recipe"])["rotation"]["eps"] == 1.0


def test_bias_options_grow_through_recipe_add_biases_and_keep_the_function(tmp_path, monkeypatch):
    """``/plain/addbias``, ``/addattn``, ``/addmlp``: the plain path's ``expand`` gets the recipe's
    ``add_biases`` (all, attention, mlp): zero biases on those linear layers, the config says so, ``verify``
    passes against the source; under ``--grow-at`` the same options are recipe overrides."""
    import budget

    from growtool import check, surgery
    from growtool.grow import recipes
    from growtool.io import checkpoint

    src = budget._init(dict(QUICK), "llama", 32, 0, tmp_path / "s.safetensors")
    plain = checkpoint.load(surgery.expand(str(src), width=64, out=str(tmp_path / "g.safetensors")))
    parts = {  # g_proj: the bench Llama's attention gate, whose bias is qkv_bias's (as Qwen2's)
        "addbias": {"q_proj", "k_proj", "v_proj", "g_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
        "addattn": {"q_proj", "k_proj", "v_proj", "g_proj", "o_proj"},
        "addmlp": {"gate_proj", "up_proj", "down_proj"},
    }
    expands = []
    real_expand = surgery.expand
    monkeypatch.setattr(surgery, "expand", lambda *a, **kw: expands.append(kw) or real_expand(*a, **kw))
    monkeypatch.setattr(budget, "train_phase", lambda Q, init, out, *a, **kw: ({"final": init}, [{"flops": 0}]))
    for option, kinds in parts.items():
        spec = {"opts": ["plain", option], "growths": [[0.5, 64, 4, None]], "base": [32, 4], "seed": 0}
        (tmp_path / option).mkdir()
        budget.plain_path(dict(QUICK), spec, str(src), tmp_path / option, 100)
        one = checkpoint.load(tmp_path / option / "grown.safetensors")
        added = set(one.names()) - set(plain.names())
        assert {n.split(".")[-2] for n in added} == kinds and all(n.endswith(".bias") for n in added), option
        assert not any(one.get(n).any() for n in added)
        assert check.verify(str(src), one, samples=4).passed
        want = budget.OPTIONS[option][1]["add_biases"]
        assert expands[-1]["sets"] == [f"add_biases={want}"]
        assert recipes.load(budget.option_kw({"opts": [option]}, tmp_path)["grow_recipe"])["add_biases"] == want
    assert "sets" not in budget.expand_kw([32, 4], [0.5, 64, 4, None])


def test_runfolder_stops_the_base_run_at_the_growth_grows_its_folder_and_resumes(tmp_path, monkeypatch):
    """``/runfolder``: ``train BASE`` for the whole run's steps, stopped at the growth's step; ``expand`` of
    that run folder (model and moments) into the run's folder; ``train --resume`` there to the end."""
    import budget

    calls = []

    def phase(Q, ckpt, out, tokens, seed, **kw):
        calls.append(("train", Path(out).name, tokens, kw))
        return {"final": ckpt}, [{"flops": 1.0}]

    def expand(src, out, **kw):
        calls.append(("expand", Path(src).name, Path(out).name, kw))

    monkeypatch.setattr(budget, "train_phase", phase)
    monkeypatch.setattr("growtool.surgery.expand", expand)
    spec = {"seed": 0, "base": [32, 2], "growths": [[0.2, 32, 4, "stack"]], "opts": ["runfolder"]}
    budget.run_folder_path({"lr": 0.003, "batch": 4, "seq": 25}, spec, "base.safetensors", tmp_path, 10_000)
    assert calls == [
        ("train", "src", 10_000, {"stop_at": 20}),  # 100 steps of 4 x 25 tokens; the growth at 20% of them
        ("expand", "src", "out", {"layers": 4, "depth_method": "stack"}),
        ("train", "out", 10_000, {"resume": True}),
    ]


def test_branch_trains_a_base_whose_decay_begins_at_the_growth_and_counts_the_decay(tmp_path, monkeypatch):
    """``/branch``: ``train BASE`` for the length whose wsd decay begins at the growth's step (default
    warm-up and decay), ``expand RUN/pre-decay`` into the run's folder, ``train --resume`` to the end; the
    curve is the base run's, then the grown run's after the growth with the base's decay FLOPs added."""
    import budget

    from growtool.training.schedule import decay_start

    calls = []

    def phase(Q, ckpt, out, tokens, seed, **kw):
        calls.append(("train", Path(out).name, tokens, kw))
        n = tokens // 100
        if Path(out).name == "src":  # the base: 1 FLOP a step, validated at its growth step and its end
            recs = [{"step": t, "flops": float(t)} for t in range(n + 1)]
            return {}, [{**r, "val_loss": 3.0} if r["step"] in (20, n) else r for r in recs]
        return {}, [{"step": t, "flops": 10.0 * t, "val_loss": 2.0} for t in (20, 60, 100)]

    def expand(src, out, **kw):
        calls.append(("expand", Path(src).parent.name + "/" + Path(src).name, Path(out).name, kw))

    monkeypatch.setattr(budget, "train_phase", phase)
    monkeypatch.setattr("growtool.surgery.expand", expand)
    spec = {"seed": 0, "base": [32, 2], "growths": [[0.2, 32, 4, "stack"]], "opts": ["branch"]}
    _, _, curve = budget.branch_path({"lr": 0.003, "batch": 4, "seq": 25}, spec, "b.safetensors", tmp_path, 10_000)
    assert calls == [
        ("train", "src", 2_500, {}),  # 25 steps: warm-up 1, decay over the last 5, so it begins after 20
        ("expand", "src/pre-decay", "out", {"layers": 4, "depth_method": "stack"}),
        ("train", "out", 10_000, {"resume": True}),
    ]
    assert decay_start(budget.base_settings(25)) == 20 != decay_start(budget.base_settings(24))
    assert curve == [(20.0, 3.0), (25.0, 3.0), (605.0, 2.0), (1005.0, 2.0)]  # + the 5 decay steps' FLOPs


def test_branch_with_two_growths_trains_each_grown_run_to_a_decay_that_begins_at_the_next(tmp_path, monkeypatch):
    """``/branch`` of a two-growth variant: the base as above; the first grown run resumed for the length
    whose decay begins at the second growth (re-warmed at the width growth: train's default, so its
    schedule starts at the growth), grown from its ``pre-decay/``, and the last run to the end; the
    curve carries both decays' FLOPs. The stacking after the width growth re-warms as ``train``'s
    run-folder rule did when these runs were cached (``--grow-schedule rewarm`` passed); with ``/rww`` it
    continues the schedule the width growth began (``--grow-schedule rewarm-width``); with ``/continue``
    every growth continues the base's schedule (62 updates from step 0, the last 12 the decay, after 50); with
    ``/hold`` every growth passes ``--grow-warmup 0``."""
    import budget

    calls = []

    def phase(Q, ckpt, out, tokens, seed, **kw):
        calls.append(("train", Path(out).name, tokens, kw))
        name = Path(out).name
        if name == "src":  # the base: 1 FLOP a step, validated at its growth step and its end
            recs = [{"step": t, "flops": float(t)} for t in range(26)]
            return {"settings": {"warmup": 1}}, [{**r, "val_loss": 3.0} if r["step"] in (20, 25) else r for r in recs]
        if name == "src1":  # 10 FLOPs a step, validated at the second growth and the end
            recs = [{"step": t, "flops": 10.0 * t} for t in range(21, 58)]
            return {"settings": {"warmup": 1}}, [{**r, "val_loss": 2.5} if r["step"] in (50, 57) else r for r in recs]
        return {}, [{"step": t, "flops": 20.0 * t, "val_loss": 2.0} for t in (50, 80, 100)]

    def expand(src, out, **kw):
        calls.append(("expand", Path(src).parent.name + "/" + Path(src).name, Path(out).name, kw))

    monkeypatch.setattr(budget, "train_phase", phase)
    monkeypatch.setattr("growtool.surgery.expand", expand)
    spec = {"seed": 0, "base": [32, 2], "growths": [[0.2, 64, 2, None], [0.5, 64, 4, "stack"]], "opts": ["branch"]}
    for opts, mode in ((["branch"], "rewarm"), (["branch", "rww"], "rewarm-width")):
        calls.clear()
        Q = {"lr": 0.003, "batch": 4, "seq": 25}
        _, _, curve = budget.branch_path(Q, {**spec, "opts": opts}, "b.safetensors", tmp_path, 10_000)
        assert calls == [
            ("train", "src", 2_500, {}),
            ("expand", "src/pre-decay", "src1", {"width": 64}),
            ("train", "src1", 5_700, {"resume": True}),  # from step 20: 37 updates, the last 7 the decay, after 50
            ("expand", "src1/pre-decay", "out", {"layers": 4, "depth_method": "stack"}),
            ("train", "out", 10_000, {"resume": True, "grow_schedule": mode}),
        ]
        assert curve == [(20.0, 3.0), (25.0, 3.0), (505.0, 2.5), (575.0, 2.5), (1675.0, 2.0), (2075.0, 2.0)]
    calls.clear()  # /continue: one schedule from the base's first step, so the first grown run is longer
    budget.branch_path(Q, {**spec, "opts": ["branch", "continue"]}, "b.safetensors", tmp_path, 10_000)
    one = {"resume": True, "grow_schedule": "continue"}
    assert [c for c in calls if c[0] == "train"][1:] == [("train", "src1", 6_200, one), ("train", "out", 10_000, one)]
    calls.clear()  # /hold: --grow-warmup 0 at every growth (the re-warm at the width growth keeps the peak LR)
    budget.branch_path(Q, {**spec, "opts": ["branch", "hold", "rww"]}, "b.safetensors", tmp_path, 10_000)
    hold = {"resume": True, "grow_warmup": 0}
    assert [c for c in calls if c[0] == "train"][1:] == [
        ("train", "src1", 5_700, hold),
        ("train", "out", 10_000, {**hold, "grow_schedule": "rewarm-width"}),
    ]


def test_branch_needs_wsd(tmp_path):
    (tmp_path / "x.txt").write_text("some text\n" * 50)
    args = [sys.executable, str(ROOT / "bench" / "budget.py"), str(tmp_path / "x.txt"), "--out", str(tmp_path / "o")]
    r = subprocess.run([*args, "--variants", "stack2x/branch", "--schedule", "cosine"], capture_output=True, text=True)
    assert r.returncode != 0 and "/branch grows the state where a wsd run's decay begins" in r.stderr, r.stderr


def test_deflr_leaves_each_phase_at_trains_default_lr(tmp_path):
    """``/deflr`` (with ``/plain`` or ``/branch``): no --lr reaches ``train`` in any phase, so each takes
    its default (settings.default_lr: by family and the run's tokens per parameter); the spec's LR only
    labels the run. Without a path of its own (``--grow-at``) it is refused."""
    import budget

    spec = {"lr": 0.003, "opts": ["branch", "deflr"]}
    assert budget.run_settings({"batch": 4}, spec, tmp_path)["lr"] is None
    assert budget.run_settings({"batch": 4}, {**spec, "opts": ["branch"]}, tmp_path)["lr"] == 0.003
    P = {**QUICK, "layers": 4, "schedule": "wsd"}
    assert budget.depth_spec(P, "stack2x@0.25/plain/deflr")["opts"] == ["plain", "deflr"]
    with pytest.raises(SystemExit, match="add /plain or /branch"):
        budget.depth_spec(P, "stack2x@0.25/deflr")


def test_a_run_another_process_cached_meanwhile_is_not_run_again(tmp_path, monkeypatch):
    """Two processes sharing ``--out`` (or a queue of invocations) each make their list of missing runs
    at the start; a run the other one has cached since is skipped, not run twice."""
    import budget

    a, b, c = (
        {"kind": "scratch", "family": "llama", "target": 64, "budget": x, "lr": 3e-3, "seed": 0} for x in (5, 10, 20)
    )
    ran = []

    def run_one(P, s, work):
        ran.append(s["budget"])
        if s is a:  # meanwhile, another process caches b
            (tmp_path / f"{spec_key(b)}.json").write_text(json.dumps({"spec": b, "result": {"val": 2.0}}))
        return {"val": 1.0, "seconds": 0.0}

    monkeypatch.setattr(budget, "run_one", run_one)
    budget.run_missing({}, [a, b, c], tmp_path)
    assert ran == [5, 20] and json.loads((tmp_path / f"{spec_key(b)}.json").read_text())["result"]["val"] == 2.0
    assert all((tmp_path / f"{spec_key(s)}.json").exists() for s in (a, c))
    assert not list(tmp_path.glob("*.tmp"))


def test_scratch_family_judges_every_grown_run_against_another_familys_scratch():
    """``--scratch-family llama_bias``: a Llama grown with zero biases added (/addbias) is compared with
    the scratch runs of the architecture it ends in, not with its own family's; the cache keys ignore it."""
    from budget import FULL, aggregate, spec_key, with_sizes

    P = dict(FULL, width=64, layers=4, paired=1, data_id="docs.jsonl:1:8mb")

    def res(val, flops):
        return {"val": val, "flops": flops, "curve": [[0.0, 5.0], [flops, val]]}

    s = {"kind": "scratch", "target": 64, "lr": 0.003, "seed": 0, "data_seed": 0}
    results = []
    for fam, d in (("llama", 0.1), ("llama_bias", 0.0)):  # llama_bias's scratch ends 0.1 lower at every budget
        for b, v, c in ((5.0, 2.1, 50.0), (10.0, 1.9, 100.0), (20.0, 1.7, 200.0)):
            results.append(({**s, "family": fam, "budget": b}, res(v + d, c)))
    g = {"kind": "grown", "family": "llama", "variant": "width2x@0.15/plain/addbias", "target": 64, "budget": 10.0}
    results.append(({**g, "lr": 0.006, "seed": 0, "base": [32, 4]}, res(1.95, 100.0)))
    (own,) = aggregate(P, results)
    (fair,) = aggregate({**P, "scratch_family": "llama_bias"}, results)
    assert abs(own["d_val"] - (1.95 - 2.0)) < 1e-12
    assert abs(own["frontier_mean"] - (1 - 1 / 2**0.25)) < 1e-9  # a quarter of the way from 10 to 20, in loss
    assert abs(fair["d_val"] - (1.95 - 1.9)) < 1e-12
    assert abs(fair["frontier_mean"] - (1 - 2**0.25)) < 1e-9  # three quarters of the way from 5 to 10: < 0
    spec = {**g, "lr": 0.006, "seed": 0}
    assert spec_key(with_sizes({**P, "scratch_family": "llama_bias"}, spec)) == spec_key(with_sizes(P, spec))
