"""Growth diagnostics (growtool.training.diagnostics): the unit map rebuilt from the lineage is the
plan's own; a grown model's metrics.jsonl carries per-block cosine of copies to their sources, the
new/old gradient ratio and the gates, at step 0 and while the gates ramp; inspect --metrics shows them."""

import json

import pytest
import torch

from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan, lineage_entry
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.io.stream import Producer
from growtool.training import diagnostics
from growtool.training.loop import train
from growtool.training.run_folder import read_metrics

from helpers import cli, make_text, tiny_cfg

KW = dict(batch=8, seq=32, eval_batches=2, device="cpu", progress=False, lr=1e-2)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("diag")
    text = d / "toy.txt"
    text.write_text(make_text(800))
    cfg = tiny_cfg(layers=2, heads=4, kv_heads=2)
    base = checkpoint.save_tensors(str(d / "base.safetensors"), cfg, [], init_model(cfg, seed=0).tensors())
    return {"dir": d, "text": text, "base": base}


def grow(world, recipe: str, name: str, **over) -> str:
    src = checkpoint.load(world["base"])
    plan = build_plan(src.config, recipes.load(recipe, over or None), 48, seed=3)
    return checkpoint.save(
        str(world["dir"] / name),
        plan.cfg,
        src.lineage + [lineage_entry(plan, src.sha256())],
        plan.outputs(),
        Producer(lambda n: grow_tensor(n, plan, src.get)),
        checkpoint.Output(force=True),
    )


@pytest.mark.parametrize("recipe", ["copy", "srio", "nrio"])
def test_unit_map_is_the_plans_own(world, recipe):
    path = grow(world, recipe, f"{recipe}.safetensors")
    ck = checkpoint.load(path)
    plan = build_plan(checkpoint.load(world["base"]).config, recipes.load(recipe), 48, seed=3)
    umap = diagnostics.unit_map(ck.config, ck.lineage)
    assert umap is not None and len(umap) == 2
    for m, units in zip(umap, plan.units):
        n, srcs = m["ffn"]
        e = units["ffn"]
        assert n == e.n == 128 and len(srcs) == e.added == 64
        if e.kind in ("copy", "tile"):
            assert torch.equal(srcs, e.index[:, 0])
        n, srcs = m["head"]
        assert n == 4 and len(srcs) == 2  # 4 -> 6 query heads
        assert ((srcs >= 0) & (srcs < 4)).all()


def test_copy_clones_are_exact_at_growth_and_noise_breaks_them(world):
    ck = checkpoint.load(grow(world, "copy", "copy.safetensors"))
    rec = diagnostics.checkpoint_record(ck)
    assert rec["recipe"] == "copy" and len(rec["blocks"]) == 2
    for b in rec["blocks"]:
        assert b["ffn_cos_mean"] == pytest.approx(1.0, abs=1e-5) and b["head_cos_mean"] == pytest.approx(1.0, abs=1e-5)
        assert b["gate"] is None  # copy is ungated
    noisy = checkpoint.load(grow(world, "copy", "copy-noise.safetensors", noise=0.5))
    rec = diagnostics.checkpoint_record(noisy)
    assert all(b["ffn_cos_mean"] < 0.999 and b["head_cos_mean"] < 0.999 for b in rec["blocks"])
    tiled = diagnostics.checkpoint_record(checkpoint.load(grow(world, "srio", "srio.safetensors")))
    assert all(abs(b["ffn_cos_mean"]) < 1e-5 for b in tiled["blocks"])  # tile: disjoint residual dims
    assert all(b["gate"] == 0.0 for b in tiled["blocks"])


def test_metrics_jsonl_has_the_diagnostics_while_the_gates_ramp(world):
    grown = grow(world, "srio", "srio.safetensors")
    out = world["dir"] / "run-srio"
    train(grown, [world["text"]], out, steps=16, gate_warmup_tokens=8 * 8 * 32, **KW)
    recs = read_metrics(out / "metrics.jsonl")
    diag = {r["step"]: r["growth"] for r in recs if "growth" in r}
    assert 0 in diag and 16 in diag  # at the start and at the end
    ramp = [s for s in diag if 0 < s <= 8]
    assert len(ramp) >= 4  # about 8 records over the 8-step ramp
    assert diag[0]["blocks"][0]["gate"] == 0.0 and diag[0]["ffn_grad_ratio"] is None
    for s in ramp:
        for b in diag[s]["blocks"]:
            assert b["gate"] == pytest.approx((s - 1) / 8)  # the gate update s - 1 (0-based) ran at
            for k in ("ffn_grad_ratio", "head_grad_ratio"):
                if s == 1:  # gate 0: a gated unit's gradient is exactly 0
                    assert b[k] == 0.0
                else:
                    assert b[k] is not None and 0 < b[k] < float("inf")
            assert -1.0 <= b["ffn_cos_mean"] <= b["ffn_cos_max"] <= 1.0 + 1e-6
    assert 1 in diag and diag[2]["ffn_grad_ratio"] < diag[8]["ffn_grad_ratio"]  # grows with the gate
    json.dumps(recs)  # JSON-clean (no NaN objects)


def test_copy_run_starts_at_cosine_one_and_inspect_shows_it(world):
    grown = grow(world, "copy", "copy.safetensors")
    out = world["dir"] / "run-copy"
    s = train(grown, [world["text"]], out, steps=8, **KW)
    recs = read_metrics(out / "metrics.jsonl")
    assert recs[0]["growth"]["ffn_cos_mean"] == pytest.approx(1.0, abs=1e-5)
    last = [r for r in recs if "growth" in r][-1]["growth"]
    assert last["ffn_grad_ratio"] > 0 and last["ffn_cos_mean"] <= 1.0
    r = cli("inspect", s["final"], "--metrics", "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["growth"]["recipe"] == "copy" and len(info["growth"]["blocks"]) == 2
    assert info["growth"]["ffn_cos_mean"] == pytest.approx(last["ffn_cos_mean"], abs=1e-4)  # the same model
    r = cli("inspect", grown, "--metrics")
    assert r.exit_code == 0 and "copies vs their sources" in r.stderr


def test_plain_model_has_no_growth_record(world):
    out = world["dir"] / "run-plain"
    train(world["base"], [world["text"]], out, steps=4, **KW)
    assert not any("growth" in r for r in read_metrics(out / "metrics.jsonl"))
    assert diagnostics.checkpoint_record(checkpoint.load(world["base"])) is None


def test_grow_at_run_records_from_its_growth(world):
    out = world["dir"] / "run-grow-at"
    train(world["base"], [world["text"]], out, steps=16, grow_at=("0.5:48",), grow_recipe="copy", **KW)
    recs = read_metrics(out / "metrics.jsonl")
    steps = [r["step"] for r in recs if "growth" in r]
    assert steps and min(steps) == 9 and 16 in steps  # none before the growth at step 8; the first update after
    first = recs[9]["growth"]
    assert first["since_step"] == 8 and first["recipe"] == "copy"
    assert 0.9 < first["ffn_cos_mean"] <= 1.0 + 1e-6  # one update away from exact copies


def test_cosine_distribution_and_update_rms_under_adam(world):
    """Issue 40: the median / 90th percentile of the copied-unit cosines, and per step the RMS of the
    update on new units against old ones. Copies start at cosine 1 (median and 90th percentile alike);
    at gate 0 a gated unit's update is only AdamW's weight decay (a zero gradient, zero moments);
    once the gate is open Adam moves new and old units by comparable amounts."""
    ck = checkpoint.load(grow(world, "copy", "copy.safetensors"))
    rec = diagnostics.checkpoint_record(ck)
    for k in ("cos_median", "cos_p90", "ffn_cos_median", "ffn_cos_p90", "head_cos_median", "head_cos_p90"):
        assert rec[k] == pytest.approx(1.0, abs=1e-5), k
    noisy = diagnostics.checkpoint_record(checkpoint.load(grow(world, "copy", "copy-n.safetensors", noise=0.5)))
    assert noisy["ffn_cos_median"] <= noisy["ffn_cos_p90"] < 0.999
    assert not any(k.startswith("_") for b in noisy["blocks"] for k in b)  # the per-unit tensors stay out

    grown = grow(world, "srio", "srio-u.safetensors")
    out = world["dir"] / "run-update"
    train(grown, [world["text"]], out, steps=16, gate_warmup_tokens=4 * 8 * 32, **KW)
    diag = {r["step"]: r["growth"] for r in read_metrics(out / "metrics.jsonl") if "growth" in r}
    first = diag[1]["blocks"][0]
    assert first["ffn_update_rms_new"] < 0.01 * first["ffn_update_rms_old"]  # gate 0: weight decay only
    last = diag[16]["blocks"][0]
    assert last["gate"] == 1.0
    for g in ("ffn", "head"):
        assert last[f"{g}_update_rms_old"] > 0 and 0.1 < last[f"{g}_update_ratio"] < 10, (g, last)
        assert last[f"{g}_update_ratio"] == pytest.approx(last[f"{g}_update_rms_new"] / last[f"{g}_update_rms_old"])
    assert diag[16]["ffn_update_ratio"] is not None and diag[16]["cos_median"] is not None
    r = cli("inspect", grown, "--metrics")
    assert r.exit_code == 0 and "90th percentile" in r.stderr


def test_new_units_share_of_each_blocks_output(world):
    """0 while the gate is 0 (gated new units write nothing), above 0 once it opens; an ungated copy
    writes from the first step. The share is of the writer's output on the batch being trained on."""
    import torch

    assert diagnostics.new_share(torch.ones(3, 4), torch.ones(2, 4), 2) == pytest.approx(0.5)
    assert diagnostics.new_share(torch.tensor([[1.0, 1.0, 0.0]]), torch.ones(2, 3), 2) == 0.0
    grown = grow(world, "srio", "srio-share.safetensors")
    out = world["dir"] / "run-share"
    train(grown, [world["text"]], out, steps=12, gate_warmup_tokens=4 * 8 * 32, **KW)
    diag = {r["step"]: r["growth"] for r in read_metrics(out / "metrics.jsonl") if "growth" in r}
    assert diag[1]["ffn_new_share"] == 0.0 and diag[1]["head_new_share"] == 0.0  # update 1 ran at gate 0
    assert 0.0 < diag[12]["ffn_new_share"] < 1.0 and 0.0 < diag[12]["head_new_share"] < 1.0
    assert all(b["ffn_new_share"] is not None for b in diag[12]["blocks"])
    copy = grow(world, "copy", "copy-share.safetensors")
    train(copy, [world["text"]], world["dir"] / "run-share-copy", steps=4, **KW)
    recs = read_metrics(world["dir"] / "run-share-copy" / "metrics.jsonl")
    first = [r["growth"] for r in recs if "growth" in r and r["step"] == 1][0]
    assert 0.1 < first["ffn_new_share"] < 0.9
