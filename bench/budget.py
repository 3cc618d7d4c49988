"""Compute saved against budget: growth against an LR-tuned scratch baseline, per tokens per parameter.

On real text (byte level, or ``--vocab N``: a byte-level BPE of N ids trained on the text; default
../shared/data/docs.jsonl, its "text" fields, or any plain-text file), for each family, seed and
budget B (tokens per parameter of the *target* model):

  scratch     the target model from init, B x its parameters tokens, at every peak LR of ``--lrs``;
              the baseline at B is the LR with the lowest final validation loss (mean over seeds)
  <variant>   one ``growtool.train`` command from a d-wide base: ``--grow-at FRACTION:WIDTH`` (srio,
              the trainer's defaults: LR re-warm, AdamW moments carried, gate ramp 10%), with as
              many tokens as give the scratch run's FLOPs at B (the base phase counted):
              width1.5 (d -> 1.5d at 1/2), width2 (d -> 2d at 1/2), stages3 (d -> 1.5d at 1/3 -> 2d
              at 2/3); ``--sweep 1.25,1.5,2,3,4``: one growth d -> g d at 1/2 for each g, at the one
              budget ``--sweep-budget`` (the growth-factor ceiling).
  depth       variants that end at the model of --width x --layers itself (so they share one scratch
              baseline), from a smaller base grown at 1/2 by ``--grow-at 0.5:width=W,layers=L,method=M``
              (``DEPTH``): width (0.75d, same layers), width2x / 3x / 4x (d/2, d/3, d/4), stack2x /
              interleave2x (L/2 layers: G_stack, interposition), middle (L/2 -> 3L/4 at 1/3 -> L at
              2/3, each time copies of the middle block: MIDAS; one 2x step copies every block, the
              same as stack), stack4x (L/4 layers: G_stack's 4x), stages4x (L/4 -> L/2 at 1/4 -> L at
              1/2 by stacking), width+depth (0.75d x 3L/4). Each result records the shape it ended at.

FLOPs = 6 x parameters x tokens summed over steps (each step at its own size: metrics.jsonl's
``flops``). Compute saved (per seed) = 1 - (FLOPs at which the grown run's validation loss first
reaches the tuned scratch run's final loss, interpolated between evaluations) / (scratch's FLOPs);
"n.r." when it never does (growth then saves nothing at that budget: < 0). Under wsd most of a
run's loss falls in its final decay, so that first reach comes late and understates the saving; the
second measure (``frontier_*``) compares whole runs instead: 1 - (the grown run's FLOPs) / (the FLOPs
at which scratch, each budget a whole run at its best LR, would end at the grown run's final loss,
log FLOPs interpolated between the two budgets that bracket it; "> x" / "< x" beyond the budgets
run), negative when growth costs compute. Loss falls ever slower in log FLOPs, so that straight line
lies above scratch's curve and overstates the saving: by 3.5-11% of scratch's compute half-way
between two budgets, in six of seven held-out checks at d64 x 4 and d64 x 8 (seed means);
``--scratch-budgets 7,14,28`` adds scratch runs (no grown ones) where the grown runs end.
``--scratch-family F`` compares every grown run with family F's scratch runs instead of its own (in
the aggregation alone; ``--families F`` runs them): a growth that adds zero biases (``/addbias``) ends
in ``llama_bias``'s architecture, so F's scratch is the fair baseline for it.
Δ = grown final loss - tuned scratch final loss, paired by seed.
Each arm draws its own batches (data seed 3000 + seed for scratch, seed for grown runs), so
seed i pairs two independent runs; ``--paired 1`` makes scratch draw the grown runs' batches
(common random numbers: the data order's part of the seed spread cancels in Δ and saved) and
compares with those scratch runs alone. ``--schedule`` is the trainer's LR schedule for every run
(cosine here unless given; the trainer's own default is wsd).

``--families``: llama (the bench's Llama: SwiGLU, grouped KV heads, gated attention; ``--llama-*`` swap
its parts), gpt2 (``--gpt2-gate 1`` adds the gate), starcoder2 (the Llama layout with GPT-2's block:
LayerNorm, biases, GELU), starcoder2_nobias (without the linear biases), llama_bias (the Llama target
with a bias on every linear layer but the head), qwen2 (q, k and v's alone: with ``--llama-gate 0``
Qwen2's block); ``growth_pays._config`` builds each.

Every run's result is cached as one JSON file in ``<out>/budget/cached/`` (named by a hash of what
defines the run), so a full run can span sessions: a second invocation runs only what is missing, and
skips a run that another process sharing ``<out>`` has cached while it worked.
Writes ``<out>/budget/``: results.csv (per family, variant, budget), sweep.csv, results.json,
budget.png. ``--quick``: tiny models, one seed, two budgets, width1.5 and stack2x (the tests run it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import machine, parse_args, table, tokenizer, train_phase, write_csv, write_json
from growth_pays import FAMILIES, _config, _curve, _init, diag_series, flops_to_reach

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "docs.jsonl")  # ../shared/data

FULL = dict(
    width=64,
    layers=2,
    head_dim=8,
    batch=16,
    seq=64,
    seeds=3,
    budgets="2,5,10",
    lrs="0.003,0.006,0.012",
    grow_lr=0.006,
    grow_lrs="",
    variants="width1.5",
    families="llama",
    sweep="",
    sweep_budget=2.0,
    schedule="cosine",
    evals=16,
    eval_batches=8,
    gamma=0.5,
    llama_tie=0,
    llama_mha=0,  # 1: the Llama target's KV heads = its heads (no grouping); part of the cache key when 1
    llama_gate=1,  # 0: the Llama target without gated attention; part of the cache key when 0
    llama_mlp="swiglu",  # gelu (or relu2 ...): the Llama target's MLP plain, up -> act -> down (Arcee's layout)
    gpt2_gate=0,  # 1: the GPT-2 target with gated attention (as Llama's); part of the cache key when 1
    data_mb=8,
    paired=0,  # 1: scratch runs draw the grown runs' batches (data seed = seed; else 3000 + seed)
    scratch_budgets="",  # scratch alone at these budgets too: more points on its frontier (e.g. 14, 28)
    scratch_family="",  # aggregation only: the family whose scratch runs every grown run is compared with
    vocab=0,  # 0: bytes; N: a byte-level BPE of N ids trained on the text (cached; part of the cache key)
    decay=0.2,  # --schedule wsd: every phase's --decay-fraction (train's default; another joins the cache key)
    decay_shape="linear",  # every phase's --decay-shape: the cached study's (train's default is sqrt since)
)
QUICK = dict(
    FULL,
    width=32,
    layers=2,
    batch=4,
    seq=32,
    seeds=1,
    budgets="0.02,0.04",
    lrs="0.003,0.01",
    variants="width1.5,stack2x",
    sweep="2",
    sweep_budget=0.02,
    evals=4,
    eval_batches=2,
    data_mb=1,
)
VARIANTS = {  # name -> [(fraction of the run's tokens, width factor)], the growths of one command
    "width1.5": [(0.5, 1.5)],
    "width2": [(0.5, 2.0)],
    "stages3": [(1 / 3, 1.5), (2 / 3, 2.0)],
}
DEPTH = {  # name -> (base (width, layers factors of the target), [(fraction, width f., layers f., method)])
    "width": ((0.75, 1), [(0.5, 1, 1, None)]),
    "width2x": ((0.5, 1), [(0.5, 1, 1, None)]),
    "width3x": ((1 / 3, 1), [(0.5, 1, 1, None)]),  # needs --width a multiple of 3 KV groups (d96 with head_dim 8)
    "width4x": ((0.25, 1), [(0.5, 1, 1, None)]),
    "stack2x": ((1, 0.5), [(0.5, 1, 1, "stack")]),
    "interleave2x": ((1, 0.5), [(0.5, 1, 1, "interleave")]),
    "middle": ((1, 0.5), [(1 / 3, 1, 0.75, "middle"), (2 / 3, 1, 1, "middle")]),
    "stack4x": ((1, 0.25), [(0.5, 1, 1, "stack")]),
    "stages4x": ((1, 0.25), [(0.25, 1, 0.5, "stack"), (0.5, 1, 1, "stack")]),  # L/4 -> L/2 -> L by stacking
    "width+depth": ((0.75, 0.75), [(0.5, 1, 1, "stack")]),
    "width2x+depth2x": ((0.5, 0.5), [(0.5, 1, 1, "stack")]),
    "width2x_stack2x": ((0.5, 0.5), [(0.375, 1, 0.5, None), (1.0, 1, 1, "stack")]),  # d/2 x L/2 -> d x L/2 -> d x L
    "width2x_stack2x_w25": ((0.5, 0.5), [(0.25, 1, 0.5, None), (1.0, 1, 1, "stack")]),  # widened at 1/4 of T
    "width2x_stack2x_w50": ((0.5, 0.5), [(0.5, 1, 0.5, None), (1.0, 1, 1, "stack")]),  # widened at 1/2 of T
    "width2x_interleave2x": ((0.5, 0.5), [(0.375, 1, 0.5, None), (1.0, 1, 1, "interleave")]),  # 1 1 2 2, not 1 2 1 2
    "stack2x_width2x": ((0.5, 0.5), [(0.375, 0.5, 1, "stack"), (1.0, 1, 1, None)]),  # the same, stacked first
    "width4x_stack2x": ((0.25, 0.5), [(0.375, 1, 0.5, None), (1.0, 1, 1, "stack")]),  # d/4 x L/2 -> d x L/2 -> d x L
    "width2x_stack4x": ((0.5, 0.25), [(0.25, 1, 0.25, None), (0.5, 1, 0.5, "stack"), (1.0, 1, 1, "stack")]),
    "width2x_steps_stack2x": ((0.5, 0.5), [(0.125, 0.75, 0.5, None), (0.375, 1, 0.5, None), (1.0, 1, 1, "stack")]),
}
# "/name" after a variant: the growth's recipe (base, overrides) and train options (issue 40's breakers
# and optimizer treatments); the trainer's defaults otherwise (srio, --new-lr-mult 1; runs cached before
# that default changed in round 18 took x 2 re-warmed under the same key: the WRITEUP marks their rows †)
OPTIONS = {
    "paper": (None, {}, {"new_lr_mult": 1.0, "new_rewarm_steps": 0}),  # one LR for all (the papers' setting)
    "reset": (None, {}, {"grow_optimizer": "reset"}),  # a fresh AdamW at the growth (G_stack's code)
    "pairs": ("copy", {"pair_noise": 0.3}, {}),  # Net2Net copies + cancelling-pair noise
    "lemon": ("copy", {"split_alpha": 0.7}, {}),  # Net2Net copies, LEMON's unequal split
    "open": ("srio", {"ffn": {"new_units": "convex"}, "noise": 0.1}, {}),  # new FFN units read the old dims
    "tileheads": (None, {"attention": {"new_heads": "tile", "new_columns": "zero"}}, {}),  # heads as the FFN's units
    "noise1": (None, {"noise": 1.0}, {}),  # gated new units' reader rows + N(0, (1 x rms)^2): half re-initialised
    "noise3": (None, {"noise": 3.0}, {}),
    "eps1": (None, {"rotation": {"eps": 1.0}}, {}),  # no rotation: the old residual stays in its dims (RMSNorm)
    "eps09": (None, {"rotation": {"eps": 0.9}}, {}),  # SRIO's cos: auto is sqrt(d / D), 0.707 at 2x
    "eps05": (None, {"rotation": {"eps": 0.5}}, {}),
    "eps03": (None, {"rotation": {"eps": 0.3}}, {}),
    "eps0": (None, {"rotation": {"eps": 0.0}}, {}),  # the old residual's mean direction moved wholly onto the new dims
    "mult4": (None, {}, {"new_lr_mult": 4.0}),
    "mult05": (None, {}, {"new_lr_mult": 0.5}),  # the new entries at half the LR
    "mult025": (None, {}, {"new_lr_mult": 0.25}),
    "mup": (None, {}, {"grow_lr": "mup"}),  # hidden matrices at x first width / width after the growth (muP, Adam)
    "ramp1": (None, {}, {"gate_ramp_share": 0.01}),  # the gate ramp over 1% of the run's tokens (default 10%)
    "ramp3": (None, {}, {"gate_ramp_share": 0.03}),
    "ramp25": (None, {}, {"gate_ramp_share": 0.25}),
    "ramp0": (None, {}, {"gate_ramp_share": 0.0}),  # gates open at once (1 token): G_stack's ungated stack
    "continue": (None, {}, {"grow_schedule": "continue"}),  # no LR re-warm at the growth: one schedule (with
    # /branch: passed at every growth of the finished run, so one schedule from the base's first step)
    "hold": (None, {}, {"grow_warmup": 0}),  # a re-warm without its warm-up: the LR stays at the peak, the decay's
    # span restarts at the growth (with /branch: passed at every growth of the finished run)
    "drop1": (None, {}, {"grow_dropout": 0.1}),  # dropout on the MLP units and heads' outputs through each gate ramp
    "drop3": (None, {}, {"grow_dropout": 0.3}),
    "rww": (None, {}, {"grow_schedule": "rewarm-width"}),  # re-warm at growths in width only (with /branch: at a
    # stacking after a width growth; /branch without it re-warms there, the rule its cached runs had)
    "plain": (None, {}, {}),  # the plain path: train BASE, expand, train GROWN, all defaults (plain_path)
    "base2": (None, {}, {}),  # with /plain: the base phase at twice the run's LR (a smaller model's larger LR)
    "stable": (None, {}, {}),  # with /plain: the base phase without wsd's decay (a run's last checkpoint before it)
    "nowarm": (None, {}, {}),  # with /plain: the grown phase without a warm-up (train GROWN --warmup 0)
    "addbias": (None, {"add_biases": "all"}, {}),  # zero biases added on every linear layer but the head
    "addattn": (None, {"add_biases": "attention"}, {}),  # on q, k, v (and the gate's g) and o: attention_bias
    "addmlp": (None, {"add_biases": "mlp"}, {}),  # on the MLP's only (HF Llama's mlp_bias)
    "rerun": (None, {}, {}),  # the same computation under a new key: a same-host rerun of a reference
    "runfolder": (None, {}, {}),  # train BASE --stop-at K, expand RUN (moments grown), train --resume (run_folder_path)
    "branch": (None, {}, {}),  # train BASE to the end of its decay, expand RUN/pre-decay, train --resume (branch_path)
    "deflr": (None, {}, {}),  # with /plain or /branch: no --lr, each phase at train's default (the LR labels it)
}

BIASES = ("addbias", "addattn", "addmlp")  # recipe add_biases: with /plain, given to expand as --set


def options(p):
    p.add_argument("data", nargs="?", default=DATA, help=f"a .jsonl (its text fields) or text file (default {DATA})")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"default {v} (quick {QUICK[k]})")
    p.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. seeds-1 (run the LR sweeps on seed 0 alone)"
    )
    p.add_argument("--part", default="0/1", help="K/N: this process runs the K-th of every N runs (N share --out)")
    p.add_argument("--cached-only", action="store_true", help="run nothing: aggregate the cached runs")


def _width(P, g: float) -> int:
    """Width g x d, rounded to whole KV groups (multiples of 2 x head_dim: Llama's GQA 2:1)."""
    q = 2 * P["head_dim"]
    return max(q, round(P["width"] * g / q) * q)


def growths(P, variant: str) -> list[tuple[float, int]]:
    if variant.startswith("g"):  # the sweep: one growth to g x d at the middle
        return [(0.5, _width(P, float(variant[1:])))]
    return [(f, _width(P, g)) for f, g in VARIANTS[variant]]


def _shape(P, fw: float, fl: float) -> list[int]:
    """[width, layers]: fw x --width in whole KV groups (as ``_width``), fl x --layers (at least 1)."""
    return [_width(P, fw), max(1, round(P["layers"] * fl))]


def parse_variant(v: str) -> tuple[str, float | None, list[str]]:
    """``NAME[@T][/OPTION...]``: a DEPTH variant grown at T of the stable phase (under wsd the part of
    the run before its decay: a run fraction T x (1 - decay_fraction); the whole run otherwise) instead
    of its table's fractions (its last growth at T, earlier ones in proportion), with OPTIONS."""
    head, *opts = v.split("/")
    name, _, t = head.partition("@")
    return name, float(t) if t else None, opts


def depth_spec(P, variant: str) -> dict:
    """A depth variant's base [width, layers] and growths [fraction, width, layers, method]."""
    name, t, opts = parse_variant(variant)
    for o in ("base2", "stable", "nowarm"):
        if o in opts and "plain" not in opts:
            raise SystemExit(f"{variant}: /{o} sets a phase of the plain path; add /plain")
    if "deflr" in opts and not {"plain", "branch"} & set(opts):
        raise SystemExit(f"{variant}: /deflr leaves --lr to train's default in each phase; add /plain or /branch")
    (bw, bl), gs = DEPTH[name]
    if t is not None:
        stable = 1.0 - P.get("decay", 0.2) if P["schedule"] == "wsd" else 1.0  # the phases' --decay-fraction
        gs = [(round(f / gs[-1][0] * t * stable, 6), w, lf, m) for f, w, lf, m in gs]
    out = {"base": _shape(P, bw, bl), "growths": [[f, *_shape(P, w, lf), m] for f, w, lf, m in gs]}
    return {**out, "opts": opts} if opts else out


def grow_item(prev: list[int], g: list) -> str:
    """One ``--grow-at`` item from shape ``prev``: width= when it widens, layers= when it deepens."""
    f, w, L, m = g
    kv = ([f"width={w}"] if w != prev[0] else []) + ([f"layers={L}", f"method={m}"] if L != prev[1] else [])
    return f"{f:.6f}:" + (str(w) if kv == [f"width={w}"] else ",".join(kv))


def cfg(P, fam: str, width: int, layers: int | None = None):
    return _config(P if layers is None else {**P, "layers": layers}, fam, width)


def text_file(path: str, cache: Path, mb: int) -> str:
    """A text file of the data: a .jsonl's "text" fields (the first ``mb`` MB, documents in file
    order, separated by a blank line), written once into ``cache``; any other file as it is."""
    p = Path(path)
    if p.suffix != ".jsonl":
        return str(p)
    key = hashlib.sha256(f"{p.resolve()}:{p.stat().st_size}:{mb}".encode()).hexdigest()[:12]
    out = cache / f"{p.stem}-{mb}mb-{key}.txt"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        parts, size = [], 0
        with open(p) as fh:
            for line in fh:
                t = json.loads(line).get("text", "")
                parts.append(t)
                size += len(t.encode())
                if size >= mb << 20:
                    break
        tmp = out.with_suffix(f".{os.getpid()}.tmp")  # parts (--part) may write it at once
        tmp.write_text("\n\n".join(parts))
        tmp.replace(out)
    return str(out)


# ---- runs ----------------------------------------------------------------------------------------


def spec_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def scratch_data_seed(spec: dict) -> int:
    """The seed of a scratch run's batches: the grown runs' own (``--paired``), else 3000 + seed."""
    return spec.get("data_seed", 3000 + spec["seed"])


def run_one(P, spec: dict, work: Path) -> dict:
    """One training run (``spec``: kind scratch | grown, family, target, budget, lr, seed, growths)."""
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    seed = spec["seed"]
    run = work / spec_key(spec)
    run.mkdir(parents=True, exist_ok=True)
    Q = run_settings(P, spec, work)
    t0 = time.time()
    if spec["kind"] == "scratch":
        s, recs = train_phase(Q, *scratch_run(P, spec, run))
        curve = _curve(recs)
    else:
        base, grow_at, tokens = grown_run(P, spec, run)
        if "plain" in spec.get("opts", []):
            s, recs, curve = plain_path(Q, spec, base, run, tokens)
        elif "branch" in spec.get("opts", []):
            s, recs, curve = branch_path(Q, spec, base, run, tokens)
        elif "runfolder" in spec.get("opts", []):
            s, recs = run_folder_path(Q, spec, base, run, tokens)
            curve = _curve(recs)
        else:
            kw = option_kw(spec, run, tokens)
            s, recs = train_phase(Q, base, str(run / "out"), tokens, seed, grow_at=grow_at, **kw)
            curve = _curve(recs)
    import shutil

    from growtool.io import checkpoint

    final = checkpoint.load(run / "out" / "last.safetensors").config  # the shape the run ended at
    shutil.rmtree(run, ignore_errors=True)
    out = {"val": s["val_loss"], "curve": curve, "flops": curve[-1][0], "seconds": time.time() - t0}
    out["final"], out["final_params"] = [final.width, final.layers, final.heads], final.n_params()
    if Q["lr"] is None:  # /deflr: the peak LR train chose for the grown run
        out["peak_lr"] = max(r["lr"] for r in recs if "lr" in r)
    return {**out, "diag": diag_series(recs)} if spec["kind"] == "grown" else out


def scratch_run(P, spec: dict, run: Path) -> tuple[str, str, int, int]:
    """A scratch run's ``train_phase`` arguments after the settings: its init (written into ``run``; seed
    10,000 + the run's), its output folder, tokens (budget x n_t) and data seed."""
    n_t = _config(P, spec["family"], spec["target"]).n_params()
    init = _init(P, spec["family"], spec["target"], 10_000 + spec["seed"], run / "init.safetensors")
    return init, str(run / "out"), round(spec["budget"] * n_t), scratch_data_seed(spec)


def grown_run(P, spec: dict, run: Path) -> tuple[str, tuple[str, ...], int]:
    """A grown run's start: its base checkpoint (written into ``run``), its ``--grow-at`` items and its
    tokens, as many as give the scratch run's FLOPs (6 n_t x budget x n_t) with each shape's share counted."""
    fam, n_t = spec["family"], _config(P, spec["family"], spec["target"]).n_params()
    deep = "base" in spec  # a depth variant: shapes [width, layers]
    shapes = [spec["base"]] + [g[1:3] for g in spec["growths"]] if deep else None
    if not deep:
        shapes = [[w, P["layers"]] for w in [P["width"]] + [g[1] for g in spec["growths"]]]
    fracs = [g[0] for g in spec["growths"]]
    shares = [b - a for a, b in zip([0.0] + fracs, fracs + [1.0])]  # each shape's share of the tokens
    per_token = sum(cfg(P, fam, *sh).n_params() * x for sh, x in zip(shapes, shares))
    tokens = round(spec["budget"] * n_t * n_t / per_token)
    base = _init({**P, "layers": shapes[0][1]}, fam, shapes[0][0], spec["seed"], run / "base.safetensors")
    if deep:
        return base, tuple(grow_item(a, g) for a, g in zip(shapes, spec["growths"])), tokens
    return base, tuple(f"{f:.6f}:{w}" for f, w in spec["growths"]), tokens


def run_settings(P, spec: dict, work: Path) -> dict:
    """The phases' settings of run ``spec``: ``P`` at the spec's LR, or with ``/deflr`` no LR (each phase
    takes ``train``'s default; the spec's LR only labels the run)."""
    return {**P, "lr": None if "deflr" in spec.get("opts", []) else spec["lr"], "work": str(work)}


def expand_kw(prev: list[int], g: list) -> dict:
    """``expand``'s keywords for growth ``g`` ([fraction, width, layers, method]) from shape ``prev``
    ([width, layers]): only the sizes that change (``expand`` refuses a "growth" to the same size)."""
    _, w, L, m = g
    kw = {"layers": L, "depth_method": m} if L != prev[1] else {}
    return kw | ({"width": w} if w != prev[0] else {})


def plain_path(Q, spec: dict, base: str, run: Path, tokens: int) -> tuple[dict, list[dict], list]:
    """What a user types, every option at its default: ``train BASE`` for the growth's share of the
    tokens, ``expand`` its final checkpoint (the library's ``surgery.expand``), ``train GROWN`` for
    the rest. (summary, the grown run's records, the whole curve with the base phase's FLOPs)."""
    from growtool import surgery

    ((f, *_),) = spec["growths"]  # one growth
    first = round(f * tokens)
    Qb = {**Q, "lr": 2 * Q["lr"]} if "base2" in spec["opts"] else Q
    kb = {"decay_fraction": 0.0} if "stable" in spec["opts"] else {}
    s1, r1 = train_phase(Qb, base, str(run / "base-out"), first, spec["seed"], **kb)
    sets = [f"add_biases={OPTIONS[o][1]['add_biases']}" for o in spec["opts"] if o in BIASES]
    kw = expand_kw(spec["base"], spec["growths"][0]) | ({"sets": sets} if sets else {})
    grown = surgery.expand(s1["final"], out=str(run / "grown.safetensors"), **kw)
    kg = {"warmup": 0} if "nowarm" in spec["opts"] else {}
    s, recs = train_phase(Q, str(grown), str(run / "out"), tokens - first, spec["seed"], **kg)
    return s, recs, _curve(r1) + _curve(recs[1:], r1[-1]["flops"])


def run_folder_path(Q, spec: dict, base: str, run: Path, tokens: int) -> tuple[dict, list[dict]]:
    """The growth made on a run folder, every option at its default: ``train BASE`` for the whole run's
    length, stopped at the growth (``--stop-at``), ``expand RUN`` (model and AdamW moments grown into a
    new run folder), ``train --resume``. (summary, the records: the source's up to the growth, then the
    grown run's)."""
    from growtool import surgery

    ((f, *_),) = spec["growths"]  # one growth
    k = round(f * math.ceil(tokens / (Q["batch"] * Q["seq"])))  # train_phase's steps for these tokens
    train_phase(Q, base, str(run / "src"), tokens, spec["seed"], stop_at=k)
    surgery.expand(str(run / "src"), out=str(run / "out"), **expand_kw(spec["base"], spec["growths"][0]))
    return train_phase(Q, base, str(run / "out"), tokens, spec["seed"], resume=True)


def branch_path(Q, spec: dict, base: str, run: Path, tokens: int) -> tuple[dict, list[dict], list]:
    """A finished base run grown from the state where its decay began, every option at its default:
    ``train BASE`` for the length whose wsd decay begins at the growth's step (its decay run and
    counted: a user who did not plan the growth has paid for it), ``expand RUN/pre-decay`` (model and
    AdamW moments grown), ``train --resume --tokens`` the whole run's. With two or more growths each
    grown run but the last is itself trained to the end of a decay that begins at the next growth, and
    grown from its ``pre-decay/`` (every decay counted). (summary, the last run's records, the whole
    curve: the base run's, then each grown run's with the decays before it added)."""
    from growtool import surgery
    from growtool.training.schedule import decay_start
    from growtool.training.settings import next_grow_schedule, rewarms

    per_step, widened, since = Q["batch"] * Q["seq"], False, 0  # widened: a width growth has re-warmed the run
    done, sched = [], "rewarm"  # the growth records so far; the schedule of a run started without --grow-at
    rww = "rww" in spec["opts"]  # re-warm at width growths only, else at every growth once widened
    mode = {"grow_schedule": "rewarm-width" if rww else "rewarm"}  # a stacking after a width growth: /rww's,
    # else the rule the cached runs had (a re-warm)
    one = {"grow_schedule": "continue"} if "continue" in spec["opts"] else None  # /continue: one schedule throughout
    hold = {"grow_warmup": 0} if "hold" in spec["opts"] else {}  # /hold: each re-warm keeps the peak LR
    ks = [round(g[0] * math.ceil(tokens / per_step)) for g in spec["growths"]]  # the growths' steps
    nb = next(n for n in range(ks[0], 2 * ks[0] + 2) if decay_start(base_settings(n, Q.get("decay"))) == ks[0])
    folders = ["src"] + [f"src{i}" for i in range(1, len(ks))] + ["out"]  # each phase's run folder
    s, recs = train_phase(Q, base, str(run / folders[0]), nb * per_step, spec["seed"])
    curve, wasted, shape = _curve(recs), 0.0, spec["base"]
    for i, (k, g) in enumerate(zip(ks, spec["growths"])):
        wasted += recs[-1]["flops"] - next(r["flops"] for r in recs if r["step"] == k)  # this run's decay
        out, wide = run / folders[i + 1], g[1] != shape[0]
        surgery.expand(str(run / folders[i] / "pre-decay"), out=str(out), **expand_kw(shape, g))
        pinned = {**(one or (mode if widened and not wide else {})), **hold}
        done.append({"width": g[1], "from": shape[0], **({"layers": g[2]} if g[2] != shape[1] else {})})
        sched = pinned.get("grow_schedule") or next_grow_schedule("wsd", sched, done)  # train's run-folder rule
        since = k if rewarms(sched, done[-1]) else since  # where the schedule in force began
        widened, shape = widened or wide, g[1:3]
        if i < len(ks) - 1:  # a run whose decay begins at the next growth: its length found as train's rule
            saved = {**s["settings"], "schedule": "wsd", "decay_fraction": Q.get("decay") or 0.2, **hold}
            n = next(
                n for n in range(ks[i + 1], 4 * ks[i + 1]) if decay_start({**saved, "steps": n}, since) == ks[i + 1]
            )
            s, recs = train_phase(Q, base, str(out), n * per_step, spec["seed"], resume=True, **pinned)
        else:
            s, recs = train_phase(Q, base, str(out), tokens, spec["seed"], resume=True, **pinned)
        curve += _curve([r for r in recs if r["step"] > k], wasted)
    return s, recs, curve


def base_settings(steps: int, decay: float | None = None) -> dict:
    """The saved settings that decide where a default wsd run of ``steps`` (decay fraction ``decay``,
    else train's default) begins its decay."""
    from growtool.training.settings import Settings, default_warmup

    warm, decay = default_warmup(steps), Settings.decay_fraction if decay is None else decay
    return {"schedule": "wsd", "steps": steps, "warmup": warm, "decay_fraction": decay}


def option_kw(spec: dict, work: Path, tokens: int = 0) -> dict:
    """``train`` keywords of a grown run's OPTIONS (a recipe file for the recipe ones; a gate ramp's
    share of the run in tokens of a run of ``tokens``)."""
    from capacity import _recipe_file

    kw, base, over = {"grow_schedule": "rewarm"}, "srio", {}  # the cached runs' (the default before round 24)
    for o in spec.get("opts", []):
        b, ov, k = OPTIONS[o]  # "plain" adds nothing: its runs take every default
        base, over, kw = b or base, {**over, **ov}, {**kw, **k}
    if base != "srio" or over:
        kw["grow_recipe"] = _recipe_file(work, base, over)
    if "gate_ramp_share" in kw:
        kw["gate_warmup_tokens"] = max(1, round(kw.pop("gate_ramp_share") * tokens))
    return kw


def plan_runs(P) -> list[dict]:
    """Every run the settings ask for: scratch at each LR for each target and budget, the variants."""
    fams = [f for f in P["families"].split(",") if f]
    budgets = [float(b) for b in P["budgets"].split(",") if b]
    lrs = [float(x) for x in P["lrs"].split(",") if x]
    grow_lrs = [float(x) for x in P["grow_lrs"].split(",") if x] or [P["grow_lr"]]
    variants = [v for v in P["variants"].split(",") if v]
    cells = [(v, b) for v in variants for b in budgets]  # (variant, budget) pairs to grow
    cells += [(f"g{g}", P["sweep_budget"]) for g in P["sweep"].split(",") if g]
    out, targets = [], set()
    for fam in fams:
        for seed in range(P.get("first_seed", 0), P["seeds"]):
            for v, b in cells:
                if parse_variant(v)[0] in DEPTH:  # ends at --width x --layers: the width variants' base target
                    targets.add((P["width"], b))
                    d = depth_spec(P, v)
                    for lr in grow_lrs:
                        out.append(
                            dict(
                                kind="grown", family=fam, variant=v, target=P["width"], budget=b, lr=lr, seed=seed, **d
                            )
                        )
                    continue
                g = growths(P, v)
                targets.add((g[-1][1], b))
                out.append(
                    dict(
                        kind="grown",
                        family=fam,
                        variant=v,
                        target=g[-1][1],
                        budget=b,
                        lr=P["grow_lr"],
                        seed=seed,
                        growths=g,
                    )
                )
            widths = {t for t, _ in targets} or {P["width"]}  # scratch-only budgets: every target's frontier
            targets |= {(t, float(b)) for t in widths for b in P.get("scratch_budgets", "").split(",") if b}
            for target, b in sorted(targets):
                for lr in lrs:
                    s = dict(kind="scratch", family=fam, target=target, budget=b, lr=lr, seed=seed)
                    out.append({**s, "data_seed": seed} if P.get("paired") else s)
    return out


def cached_runs(P, cached: Path) -> list[tuple[dict, dict]]:
    """Every cached run made at P's sizes, data and schedule (any variant, LR or seed), so a study
    run in parts (LR sweeps on one seed, the other seeds at the chosen LRs) aggregates as one."""
    want = with_sizes(P, {})
    out = []
    for f in sorted(cached.glob("*.json")):
        c = json.loads(f.read_text())
        same = all(c["spec"].get(k, v) == P.get(k, v) for k, v in KEYED_OFF_DEFAULT.items())
        if same and all(c["spec"].get(k) == v for k, v in want.items()):
            out.append((c["spec"], c["result"]))
    return out


SIZES = ("width", "layers", "head_dim", "batch", "seq", "evals", "eval_batches", "gamma", "llama_tie", "schedule")
# in a run's key only away from these values, so the runs cached before each option keep their keys: byte-level
# runs (vocab 0), the decay's fraction and shape of every run cached before --decay / --decay-shape, and the
# Llama target's parts (--llama-mha / --llama-gate / --llama-mlp) and GPT-2's gate (--gpt2-gate) of every run
# cached before them
KEYED_OFF_DEFAULT = {
    "vocab": 0,
    "decay": 0.2,
    "decay_shape": "linear",
    "llama_mha": 0,
    "llama_gate": 1,
    "llama_mlp": "swiglu",
    "gpt2_gate": 0,
}


def with_sizes(P, spec: dict) -> dict:
    """What defines a run beyond its own fields: sizes (``SIZES``), data, and the BPE and decay options
    away from ``KEYED_OFF_DEFAULT`` (part of the cache key)."""
    off = {k: P[k] for k, v in KEYED_OFF_DEFAULT.items() if P.get(k, v) != v}
    return {**spec, **{k: P[k] for k in SIZES}, "data": P["data_id"], **off}


# ---- aggregation -----------------------------------------------------------------------------------


def _ms(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (None, None)


def best_lr(by_lr: dict) -> float:
    """The peak LR whose runs end lowest, mean over the seeds every LR was run at (all seeds, or the
    LR sweep's seed when the other seeds ran at the chosen LR only): the tuned arm."""
    common = set.intersection(*(set(runs) for runs in by_lr.values()))
    return min(by_lr, key=lambda lr: statistics.mean(by_lr[lr][s]["val"] for s in common or by_lr[lr]))


def scratch_compute_for(points: list[tuple[float, float]], val: float) -> tuple[float | None, str]:
    """FLOPs scratch needs for final loss ``val``, from its (FLOPs, final loss) points at several
    budgets (each a whole run with its own decay, at its best LR): log FLOPs interpolated linearly in
    the loss between the two budgets that bracket ``val``. Outside them: (the end point, ">" or "<"),
    a bound: ">" when ``val`` is below every scratch point (scratch needs more than the largest
    budget), "<" when above them all."""
    pts = sorted(points)
    for (c0, v0), (c1, v1) in zip(pts, pts[1:]):
        if min(v0, v1) <= val <= max(v0, v1) and v0 != v1:
            t = (val - v0) / (v1 - v0)
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0))), ""
    if val < min(v for _, v in pts):
        return pts[-1][0], ">"
    return pts[0][0], "<"


def frontier_saved(scratch: dict, fam: str, target: int, seed: int, r: dict) -> str | float | None:
    """Compute saved against scratch's loss-against-compute frontier: 1 - (the grown run's FLOPs) /
    (the FLOPs scratch needs to end at the grown run's final loss), through ``scratch_compute_for``
    over every budget run for this target and seed at that budget's best LR. A float, a bound
    ("> x" / "< x", x in %) outside the budgets run, or None with fewer than 2 budgets."""
    pts = []
    for (f, t, _b), by_lr in scratch.items():
        if (f, t) != (fam, target):
            continue
        best = best_lr(by_lr)
        if seed in by_lr[best]:
            pts.append((by_lr[best][seed]["flops"], by_lr[best][seed]["val"]))
    if len(pts) < 2:
        return None
    c, bound = scratch_compute_for(pts, r["val"])
    x = 1.0 - r["flops"] / c
    return x if not bound else f"{bound} {100 * x if abs(x) >= 5e-4 else 0.0:.1f}%"


def aggregate(P, results: list[tuple[dict, dict]]) -> list[dict]:
    scratch, grown = {}, {}
    for spec, r in results:
        if spec["kind"] == "scratch" and ("data_seed" in spec) != bool(P.get("paired")):
            continue  # --paired compares with the scratch runs that drew the grown runs' batches, else the others
        if spec["kind"] == "scratch":
            scratch.setdefault((spec["family"], spec["target"], spec["budget"]), {}).setdefault(spec["lr"], {})[
                spec["seed"]
            ] = r
        else:
            key = (spec["family"], spec["variant"], spec["budget"])
            grown.setdefault(key, {}).setdefault(spec["lr"], {})[spec["seed"]] = (spec, r)
    rows = []
    for (fam, variant, B), grown_by_lr in sorted(grown.items()):
        glr = best_lr({lr: {sd: r for sd, (_, r) in runs.items()} for lr, runs in grown_by_lr.items()})
        per_seed = grown_by_lr[glr]
        lr_sweep = " / ".join(
            f"{lr:g}: {statistics.mean(r['val'] for _, r in runs.values()):.4f}"
            for lr, runs in sorted(grown_by_lr.items())
        )
        spec0 = next(iter(per_seed.values()))[0]
        target = spec0["target"]
        bw, bl = spec0.get("base", [P["width"], P["layers"]])
        sfam = P.get("scratch_family") or fam  # the architecture the grown run is judged against
        by_lr = scratch.get((sfam, target, B), {})
        if not by_lr:
            continue
        best = best_lr(by_lr)
        ref = by_lr[best]
        saved, deltas, per, front = [], [], [], []
        for seed, (_, r) in sorted(per_seed.items()):
            if seed not in ref:
                continue
            f = flops_to_reach(r["curve"], ref[seed]["val"])
            x = None if f is None else 1.0 - f / ref[seed]["flops"]
            per.append("n.r." if x is None else f"{100 * x:.1f}%")
            if x is not None:
                saved.append(x)
            deltas.append(r["val"] - ref[seed]["val"])
            front.append(frontier_saved(scratch, sfam, target, seed, r))
        gv = _ms([r["val"] for _, r in per_seed.values()])
        sv = _ms([r["val"] for r in ref.values()])
        sm, ssd = _ms(saved) if len(saved) == len(per) else (None, None)
        dm, dsd = _ms(deltas)
        exact = [x for x in front if isinstance(x, float)]
        fm, fsd = _ms(exact) if front and len(exact) == len(front) else (None, None)
        lrs = sorted(by_lr)
        rows.append(
            {
                "family": fam,
                "variant": variant,
                "tokens_per_param": B,
                "width": f"{bw}->{target}",
                "layers": f"{bl}->{P['layers']}",
                "params_base": cfg(P, fam, bw, bl).n_params(),
                "params": _config(P, fam, target).n_params(),
                "seeds": len(per),
                "grown_best_lr": glr,
                "grown_lr_sweep": lr_sweep,
                "grown_val": gv[0],
                "grown_val_std": gv[1],
                "scratch_best_lr": best,
                "best_lr_at_edge": best in (lrs[0], lrs[-1]) and len(lrs) > 1,
                "scratch_val": sv[0],
                "scratch_val_std": sv[1],
                "d_val": dm,
                "d_val_std": dsd,
                "saved_per_seed": " / ".join(per),
                "saved_mean": sm,
                "saved_std": ssd,
                "not_reached": per.count("n.r."),
                "frontier_per_seed": " / ".join(
                    "-" if x is None else x if isinstance(x, str) else f"{100 * x:.1f}%" for x in front
                ),
                "frontier_mean": fm,
                "frontier_std": fsd,
            }
        )
    return rows


def plotted(rows) -> list[tuple[str, str]]:
    """The (family, variant) series the plot draws: those run on 3 or more seeds or at more than one
    budget (a study's one-seed probes at one budget would bury them; they stay in results.csv), or every
    series when none is."""
    series = sorted({(r["family"], r["variant"]) for r in rows if not r["variant"].startswith("g")})
    of = {s: [r for r in rows if (r["family"], r["variant"]) == s] for s in series}
    kept = [s for s in series if max(r["seeds"] for r in of[s]) >= 3 or len({r["tokens_per_param"] for r in of[s]}) > 1]
    return kept or series


def plot(rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # scratch's frontier when there is one (right under wsd: each budget its own decay), else first reach
    key = "frontier_mean" if any(r["frontier_mean"] is not None for r in rows) else "saved_mean"
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for fam, v in plotted(rows):
        rs = sorted((r for r in rows if (r["family"], r["variant"]) == (fam, v)), key=lambda r: r["tokens_per_param"])
        xs = [r["tokens_per_param"] for r in rs]
        ys = [100 * r[key] if r[key] is not None else float("nan") for r in rs]
        es = [100 * (r[key.replace("mean", "std")] or 0) for r in rs]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"{fam} {v}")
    if any(r[key] is not None for r in rows):
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")  # 2, 5, 10, not 2x10^0
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(25, color="tab:red", lw=0.8, ls=":", label="issue 40's target at 10: 25%")
    ax.set_xlabel("budget (tokens per parameter of the target model)")
    what = "scratch's loss-compute frontier" if key == "frontier_mean" else "first reach of scratch's loss"
    ax.set_ylabel(f"compute saved vs LR-tuned scratch (%)\n({what})", fontsize=8)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the axes, off the points
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_missing(P, todo: list[dict], cached: Path):
    """Run each spec of ``todo`` and cache its result at once (an interrupted sweep keeps it), skipping
    any that another process sharing ``--out`` has cached since ``todo`` was made."""
    work = Path(tempfile.mkdtemp(prefix="growtool-budget-"))
    t_start = time.time()
    try:
        for i, s in enumerate(todo):
            if (cached / f"{spec_key(s)}.json").exists():
                continue
            r = run_one(P, s, work)
            tmp = cached / f"{spec_key(s)}.tmp"
            tmp.write_text(json.dumps({"spec": s, "result": r}) + "\n")
            tmp.replace(cached / f"{spec_key(s)}.json")
            what = s.get("variant", "scratch") + f" lr {s['lr']:g}"
            print(
                f"  [{time.time() - t_start:6.0f} s] {i + 1}/{len(todo)} {s['family']} d{s['target']} {what} "
                f"B {s['budget']:g} seed {s['seed']}: val {r['val']:.4f} ({r['seconds']:.0f} s)",
                flush=True,
            )
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def die(msg: str):
    """Bad input: one line on stderr, exit 2, nothing written."""
    print(f"bench/budget.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


def study(args) -> dict:
    """The study's settings from parsed ``options``: FULL (QUICK with --quick), each option given, and
    the id of its data (name, size, MB read) that every run's cache key carries."""
    P = dict(QUICK if args.quick else FULL)
    for k in FULL:
        if getattr(args, k) is not None:
            P[k] = getattr(args, k)
    if not Path(args.data).is_file():
        die(f"{args.data}: no such file")
    P["first_seed"] = args.first_seed
    P["data_id"] = f"{Path(args.data).name}:{Path(args.data).stat().st_size}:{P['data_mb']}mb"
    return P


def main():
    args = parse_args("budget", __doc__.splitlines()[0], options)
    P = study(args)
    for f in [*P["families"].split(","), P.get("scratch_family") or ""]:
        if f and f not in FAMILIES:
            die(f"unknown family {f!r} (known: {', '.join(FAMILIES)})")
    for v in P["variants"].split(","):
        name, t, opts = parse_variant(v)
        if v and v not in VARIANTS and name not in DEPTH:
            die(f"unknown variant {v!r} (known: {', '.join([*VARIANTS, *DEPTH])}, each [@T][/OPTION...])")
        if name in DEPTH and any(o not in OPTIONS for o in opts):
            die(f"variant {v!r}: unknown option (known: {', '.join(OPTIONS)})")
        if "branch" in opts and (P.get("schedule") or "cosine") != "wsd":
            die(f"variant {v!r}: /branch grows the state where a wsd run's decay begins (give --schedule wsd)")
        if name in DEPTH and t is not None and not 0 < t < 1:
            die(f"variant {v!r}: @T needs 0 < T < 1")
        if name in DEPTH:  # every growth must change the shape: a base of the target's shape cannot grow
            d = depth_spec(P, v)
            shapes = [d["base"]] + [g[1:3] for g in d["growths"]]
            if any(a[0] > b[0] or a[1] > b[1] or a == b for a, b in zip(shapes, shapes[1:])):
                die(f"variant {v}: at --width {P['width']} --layers {P['layers']} its shapes {shapes} do not grow")
    d = args.dir
    cached = d / "cached"
    cached.mkdir(exist_ok=True)
    P["data"] = text_file(args.data, d / "cache", P["data_mb"])
    if P["vocab"]:
        P["tokenizer"] = tokenizer(P["data"], P["vocab"], d / "cache")
    specs = [with_sizes(P, s) for s in plan_runs(P)]
    todo = [s for s in specs if not (cached / f"{spec_key(s)}.json").exists()]
    try:  # a part is fixed by each run's place among all runs, not among the missing ones (they change)
        k, n = (int(x) for x in args.part.split("/"))
    except ValueError:
        k, n = -1, 0
    if not 0 <= k < n:
        die(f"--part {args.part!r}: expected K/N with 0 <= K < N")
    print(f"budget: {len(specs)} runs, {len(specs) - len(todo)} cached, {len(todo)} to run", flush=True)
    todo = [] if args.cached_only else [s for s in todo if specs.index(s) % n == k]
    run_missing(P, todo, cached)
    done = [s for s in specs if (cached / f"{spec_key(s)}.json").exists()]
    if len(done) < len(specs):  # another --part still running, or --cached-only
        print(f"budget: {len(done)} of {len(specs)} planned runs cached ({len(specs) - len(done)} not)")
    results = cached_runs(P, cached)  # every cached run of these sizes: earlier invocations' too
    rows = aggregate(P, results)
    main_rows = [r for r in rows if not r["variant"].startswith("g")]
    sweep_rows = [r for r in rows if r["variant"].startswith("g")]
    write_csv(d / "results.csv", main_rows)
    if sweep_rows:
        write_csv(d / "sweep.csv", sweep_rows)
    settings = {k: v for k, v in P.items() if k not in ("data", "tokenizer")}  # local paths
    write_json(d / "results.json", {"settings": settings, "machine": machine(), "rows": rows})
    name, _, mb = P["data_id"].rsplit(":", 2)
    title = (
        f"compute saved by growing, per budget: {name} (first {mb.removesuffix('mb')} MB), "
        f"{P['layers']} layers, {P['seeds']} seed(s), {P['schedule']} schedule"
    )
    plot(main_rows, d / "budget.png", title)
    show = (
        "family",
        "variant",
        "tokens_per_param",
        "width",
        "layers",
        "scratch_best_lr",
        "grown_lr_sweep",
        "d_val",
        "saved_per_seed",
        "saved_mean",
        "frontier_per_seed",
    )
    print(table([{k: r[k] for k in show} for r in rows], "compute saved against budget"))
    print(f"wrote {d}/results.csv, results.json, budget.png" + (", sweep.csv" if sweep_rows else ""))


if __name__ == "__main__":
    main()
