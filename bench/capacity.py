"""Issue 40's pilot: which width-growth start adds capacity that trains (symmetry breakers, the
optimizer treatment of new parameters), against scratch at equal FLOPs.

On real text (byte level; default ../shared/data/docs.jsonl, the first ``--data-mb`` MB of its
"text" fields, read at run time), for one family and seed:

  scratch      the target (--width-to) from init, trained with the grown runs' FLOPs, at every LR of --lrs
  <variant>    one ``growtool.train`` command from a --width base: ``--grow-at FRACTION:WIDTH-TO`` with
               the variant's recipe and train options (VARIANTS), at every LR of --grow-lrs; the base
               phase counted in its FLOPs. Tokens: --steps x batch x seq.

Per run: final validation loss, FLOPs, and the growth diagnostics of its last record (median /
90th percentile copied-unit cosine, new/old update RMS; growtool.training.diagnostics). Each run is
cached as a JSON file under ``<out>/capacity/cached/`` (a hash of what defines it), so the study
runs in parts. Writes ``<out>/capacity/results.json`` and ``results.csv``. ``--quick``: tiny
sizes (the tests run it).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

from budget import text_file
from common import machine, parse_args, table, train_phase, write_csv, write_json
from growth_pays import _config, _init

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "docs.jsonl")

# name -> (recipe base, recipe overrides, train keywords)
VARIANTS = {
    "srio": ("srio", {}, {}),  # today's default
    "srio_noise": ("srio", {"noise": 0.1}, {}),
    "srio_open": ("srio", {"ffn": {"new_units": "convex"}, "noise": 0.1}, {}),  # new FFN units read the old dims
    "copy": ("copy", {}, {}),
    "copy_pairs": ("copy", {"pair_noise": 0.3}, {}),
    "copy_lemon": ("copy", {"split_alpha": 0.7}, {}),
    "srio_newopt": ("srio", {}, {"new_lr_mult": 2.0, "new_rewarm_steps": 20}),
    "copy_pairs_newopt": ("copy", {"pair_noise": 0.3}, {"new_lr_mult": 2.0, "new_rewarm_steps": 20}),
    "srio_mult2": ("srio", {}, {"new_lr_mult": 2.0}),
    "srio_mult4_rw": ("srio", {}, {"new_lr_mult": 4.0, "new_rewarm_steps": 20}),
    "srio_rw": ("srio", {}, {"new_rewarm_steps": 20}),
    "srio_open_newopt": (
        "srio",
        {"ffn": {"new_units": "convex"}, "noise": 0.1},
        {"new_lr_mult": 2.0, "new_rewarm_steps": 20},
    ),
}

FULL = dict(
    family="llama",
    width=64,
    width_to=128,
    layers=2,
    head_dim=8,
    batch=16,
    seq=64,
    steps=600,
    grow_frac=0.3,
    seed=0,
    lrs="0.003,0.006,0.012",
    grow_lrs="0.0015,0.003,0.006",
    variants="srio,srio_open,copy,copy_pairs,copy_lemon,srio_newopt",
    evals=10,
    eval_batches=8,
    gamma=0.5,
    data_mb=4,
    schedule="wsd",
)
QUICK = dict(
    FULL, width=16, width_to=32, batch=2, seq=16, steps=12, lrs="0.006", grow_lrs="0.006", variants="srio,copy_pairs",
    evals=2, eval_batches=1, data_mb=1,
)  # fmt: skip


def options(p):
    p.add_argument("data", nargs="?", default=DATA, help=f"a .jsonl (its text fields) or a text file (default {DATA})")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None)


def _recipe_file(work: Path, base: str, over: dict) -> str:
    """The variant's recipe as a YAML file (``--grow-recipe`` takes a name or a file)."""
    import yaml

    from growtool.grow import recipes

    r = recipes.load(base, over)
    if not over:
        return base
    path = work / f"recipe-{hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()[:10]}.yaml"
    path.write_text(yaml.safe_dump({**r, "name": f"{base}+"}))
    return str(path)


def run_one(P, spec: dict, cache: Path) -> dict:
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    hit = cache / f"{key}.json"
    if hit.exists():
        return {k: v for k, v in json.loads(hit.read_text()).items() if k != "spec"}
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        Q = {**P, "lr": spec["lr"], "work": str(work), "data": spec["data"]}
        tokens = spec["tokens"]
        if spec["kind"] == "scratch":
            init = _init(P, P["family"], P["width_to"], 10_000 + P["seed"], work / "init.safetensors")
            s, recs = train_phase(Q, init, str(work / "out"), tokens, 3000 + P["seed"])
        else:
            base, over, kw = VARIANTS[spec["variant"]]
            base_ck = _init(P, P["family"], P["width"], P["seed"], work / "base.safetensors")
            grow_at = (f"{P['grow_frac']:.6f}:{P['width_to']}",)
            recipe = _recipe_file(work, base, over)
            s, recs = train_phase(Q, base_ck, str(work / "out"), tokens, P["seed"], grow_at=grow_at,
                                  grow_recipe=recipe, **kw)  # fmt: skip
    diag = [r["growth"] for r in recs if r.get("growth")]
    last = diag[-1] if diag else {}
    keep = ("cos_median", "cos_p90", "ffn_cos_median", "head_cos_median", "ffn_update_ratio", "head_update_ratio")
    out = {
        "val": s["val_loss"],
        "flops": [r["flops"] for r in recs if "flops" in r][-1],
        "seconds": round(time.time() - t0, 1),
        **{k: last.get(k) for k in keep},
    }
    cache.mkdir(parents=True, exist_ok=True)
    hit.write_text(json.dumps({**out, "spec": spec}))
    return out


def plan(P) -> list[dict]:
    n_small = _config(P, P["family"], P["width"]).n_params()
    n_big = _config(P, P["family"], P["width_to"]).n_params()
    T = P["steps"] * P["batch"] * P["seq"]
    f = P["grow_frac"]
    scratch_tokens = round(T * (f * n_small + (1 - f) * n_big) / n_big)  # the grown run's FLOPs
    common = {"data": P["data"], "family": P["family"], "width": P["width"], "width_to": P["width_to"],
              "layers": P["layers"], "seed": P["seed"], "batch": P["batch"], "seq": P["seq"],
              "schedule": P["schedule"], "gamma": P["gamma"], "evals": P["evals"]}  # fmt: skip
    runs = [{**common, "kind": "scratch", "lr": float(lr), "tokens": scratch_tokens} for lr in P["lrs"].split(",")]
    for v in P["variants"].split(","):
        for lr in P["grow_lrs"].split(","):
            runs.append({**common, "kind": "grown", "variant": v, "lr": float(lr), "tokens": T,
                         "grow_frac": f, "def": repr(VARIANTS[v])})  # fmt: skip
    return runs


def main():
    args = parse_args("capacity", __doc__.split("\n\n")[0], options)
    P = dict(QUICK if args.quick else FULL)
    for k in FULL:
        if getattr(args, k) is not None:
            P[k] = getattr(args, k)
    cache_root = args.dir / "cached"
    P["data"] = text_file(args.data, Path(tempfile.gettempdir()) / "growtool-bench-data", P["data_mb"])
    rows = []
    for spec in plan(P):
        r = run_one(P, spec, cache_root)
        name = "scratch" if spec["kind"] == "scratch" else spec["variant"]
        rows.append({"run": name, "seed": P["seed"], "lr": spec["lr"], **r})
        print(json.dumps(rows[-1]), flush=True)
    best = min((r for r in rows if r["run"] == "scratch"), key=lambda r: r["val"])
    for r in rows:
        r["delta_vs_scratch"] = round(r["val"] - best["val"], 4)
    write_csv(args.dir / "results.csv", rows)
    write_json(args.dir / "results.json", {"settings": P, "machine": machine(), "rows": rows})
    print(table(rows, f"capacity pilot: {P['family']} d{P['width']} -> d{P['width_to']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
