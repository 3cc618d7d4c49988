"""Growth recipes side by side (DESIGN.md section 6): the SRIO paper's comparison at CPU scale.

On real text (byte level; default ../shared/data/tinyshakespeare.txt), for each seed:

  1. base: a Llama model (gamma init, gated attention, RMSNorm eps 1e-12, untied head) trained
     for ``--tokens`` tokens with ``growtool.train``;
  2. grown to ``--grow-to`` width by each recipe, then trained ``--tokens`` more tokens with
     ``growtool.train`` (gates ramp 0 -> 1 over the first 10% of the phase; learning rate re-warms):
       nrio            no operator (eps = 1: zero padding), convex attention, tiled FFN, gates
       srio            the full recipe at the closed-form angle eps = sqrt(d/D)
       srio_eps0.5/0.95  srio at two other angles (--set rotation.eps=...): exact on Llama
                       (RMSNorm), lossy on GPT-2 (LayerNorm absorbs only sqrt(d/D))
       srio_lo         SRIO-LO: the angle learned (growtool.lab.learned.learn_srio_eps), then srio at it
       srio_noconvex   --set attention.new_heads=zero attention.new_columns=zero
       srio_notile     --set ffn.new_units=zero ffn.new_columns=zero
       copy            Net2Net-style duplicated units with split outputs, no gate
       ligo            LiGO-style learned linear operator (growtool.lab.learned.LiGO), no gate
  3. scratch: the wide model from gamma init, trained on as many tokens as give the same FLOPs
     as base + growth phase (FLOPs = 6 x parameters x tokens per phase).

Seeds vary the base init, the base and growth-phase data order and the growth expansions. The
learned operators' own steps are extra compute (6 x wide parameters x their tokens per pass),
added to their curves' FLOPs and reported, not given to scratch.

Writes into ``<out>/recipes/``: results.csv (per recipe: mean / std / min / max final validation
loss and more), runs.csv (per run), results.json (settings, machine, rows, curves), curves.png.
``--quick``: tiny model, one seed, a few steps, five recipes (CI smoke run).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from common import machine, parse_args, table, train_phase, write_csv, write_json

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt")  # ../shared/data

# name -> (how it is made, recipe, --set overrides)
RECIPES = {
    "nrio": ("static", "nrio", []),
    "srio": ("static", "srio", []),
    "srio_eps0.5": ("static", "srio", ["rotation.eps=0.5"]),
    "srio_eps0.95": ("static", "srio", ["rotation.eps=0.95"]),
    "srio_lo": ("srio_lo", "srio", []),
    "srio_noconvex": ("static", "srio", ["attention.new_heads=zero", "attention.new_columns=zero"]),
    "srio_notile": ("static", "srio", ["ffn.new_units=zero", "ffn.new_columns=zero"]),
    "copy": ("static", "copy", []),
    "ligo": ("ligo", "srio", []),
    "scratch": ("scratch", None, []),
}
QUICK_RECIPES = ["nrio", "srio", "srio_lo", "ligo", "scratch"]

FULL = dict(
    width=64,
    grow_to=96,
    layers=4,
    head_dim=16,
    kv_ratio=2,
    batch=16,
    seq=64,
    tokens=131_072,
    seeds=3,
    op_steps=100,
    lr=3e-3,
    evals=8,
    eval_batches=8,
    jobs=2,
)
QUICK = dict(
    width=32,
    grow_to=48,
    layers=2,
    head_dim=8,
    kv_ratio=2,
    batch=8,
    seq=32,
    tokens=4096,
    seeds=1,
    op_steps=4,
    lr=3e-3,
    evals=4,
    eval_batches=2,
    jobs=1,
)


def options(p):
    p.add_argument("data", nargs="?", default=DATA, help=f"text file (byte level; default {DATA})")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"default {v} (quick {QUICK[k]})")
    p.add_argument("--recipes", default=None, help="comma-separated subset of: " + ", ".join(RECIPES))
    p.add_argument(
        "--work", default=None, help="folder for checkpoints and training runs (default: a temp dir, removed)"
    )
    p.add_argument(
        "--reuse",
        default=None,
        metavar="RESULTS_JSON",
        help="re-aggregate a finished run's results.json (tables, plot) without training",
    )


# ---- the jobs (run in worker processes) -----------------------------------------------------


def _setup():
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def _config(P, width):
    from growtool.nn.config import ModelConfig

    heads = width // P["head_dim"]
    return ModelConfig(
        family="llama",
        vocab_size=256,
        width=width,
        layers=P["layers"],
        heads=heads,
        kv_heads=heads // P["kv_ratio"],
        head_dim=P["head_dim"],
        ffn=4 * width,
        context=max(256, P["seq"]),
        norm_eps=1e-12,
        tie=False,
        attn_gate=True,
    )


def _train(P, ckpt, out, tokens, seed, gated):
    steps = max(1, math.ceil(tokens / (P["batch"] * P["seq"])))
    ramp = max(1, round(0.1 * steps * P["batch"] * P["seq"])) if gated else None
    s, recs = train_phase(P, ckpt, out, tokens, seed, gate_warmup_tokens=ramp)
    curve = [(r["tokens"], r["val_loss"]) for r in recs if "val_loss" in r]
    losses = [r["loss"] for r in recs if "loss" in r]
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "final": s["final"],
        "steps": s["steps"],
        "tokens": s["tokens"],
        "val": s["val_loss"],
        "start_val": curve[0][1],
        "train_tail": sum(tail) / len(tail),
        "curve": curve,
        "seconds": s["seconds"],
        "params": s["params"],
    }


def job_base(P, seed):
    _setup()
    from growtool.init import init_model
    from growtool.io import checkpoint

    cfg = _config(P, P["width"])
    run = Path(P["work"]) / f"s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    init = checkpoint.save_tensors(
        str(run / "base-init.safetensors"),
        cfg,
        [{"op": "init", "gamma": 1.0, "seed": seed}],
        init_model(cfg, gamma=1.0, seed=seed).tensors(),
        force=True,
    )
    r = _train(P, init, str(run / "base"), P["tokens"], seed, gated=False)
    return {"kind": "base", "seed": seed, **r}


def job_scratch(P, seed, tokens):
    _setup()
    from growtool.init import init_model
    from growtool.io import checkpoint

    cfg = _config(P, P["grow_to"])
    run = Path(P["work"]) / f"s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    init = checkpoint.save_tensors(
        str(run / "scratch-init.safetensors"),
        cfg,
        [{"op": "init", "gamma": 1.0}],
        init_model(cfg, gamma=1.0, seed=10_000 + seed).tensors(),
        force=True,
    )
    r = _train(P, init, str(run / "scratch"), tokens, 3000 + seed, gated=False)
    return {"kind": "scratch", "recipe": "scratch", "seed": seed, "op_flops": 0.0, **r}


def _batches(P, seed):
    from growtool.tokenizer import get_tokenizer
    from growtool.training import data

    tok = get_tokenizer("byte")
    ds = data.Dataset(data.load_tokens([P["data"]], tok, P["work"] + "/cache", 256), P["seq"], P["batch"])
    step = 0
    while True:
        yield ds.train_batch(step, seed)
        step += 1


def _new_units_zero(src, ck) -> float:
    """Fraction of the new units (query heads, FFN neurons) whose reader rows are all exactly zero."""
    cfg, dead, total = ck.config, 0, 0
    for i in range(cfg.layers):
        q = ck.get(f"model.layers.{i}.self_attn.q_proj.weight").view(cfg.heads, -1)[src.heads :]
        u = ck.get(f"model.layers.{i}.mlp.up_proj.weight")[src.ffn :]
        dead += int((q.abs().sum(1) == 0).sum()) + int((u.abs().sum(1) == 0).sum())
        total += q.shape[0] + u.shape[0]
    return dead / max(1, total)


def job_grow(P, name, seed, base_final):
    _setup()
    from growtool.grow import recipes
    from growtool.grow.engine import grow_tensor
    from growtool.grow.plan import build_plan, lineage_entry
    from growtool.io import checkpoint
    from growtool.io.stream import Producer
    from growtool.lab import learned

    how, recipe, sets = RECIPES[name]
    run = Path(P["work"]) / f"s{seed}"
    src = checkpoint.load(base_final)
    out = str(run / f"{name}.safetensors")
    op, t0 = {}, time.time()
    n_wide = _config(P, P["grow_to"]).n_params()
    if how == "static":
        r = recipes.load(recipe, recipes.parse_set(sets))
        plan = build_plan(src.config, r, P["grow_to"], seed=seed)
        checkpoint.save(
            out,
            plan.cfg,
            src.lineage + [lineage_entry(plan, src.sha256())],
            plan.outputs(),
            Producer(lambda n: grow_tensor(n, plan, src.get)),
            checkpoint.Output(force=True),
        )
        op = {"eps": plan.eps}
    elif how == "srio_lo":
        growth = learned.SrioGrowth(P["grow_to"], seed=seed)
        res = learned.learn_srio_eps(
            src.config,
            src.tensors(),
            growth,
            _batches(P, 7000 + seed),
            steps=max(1, P["op_steps"] // 2),
            inner=learned.Lookahead(1, lr=P["lr"]),
        )
        learned.save_srio_lo(
            out,
            src.config,
            src.tensors(),
            growth,
            res,
            lineage=src.lineage,
            source_sha256=src.sha256(),
            force=True,
        )
        op = {
            "eps": res.eps,
            "eps0": res.eps0,
            "op_tokens": res.tokens,
            "op_flops": 6.0 * n_wide * res.tokens,
            "eps_path": [h["eps"] for h in res.history],
        }
    elif how == "ligo":
        lg = learned.LiGO(src.config, src.tensors(), P["grow_to"], recipe=recipe, seed=seed)
        hist = lg.fit(_batches(P, 7000 + seed), steps=P["op_steps"], lr=P["lr"])
        lg.save(out, lineage=src.lineage, source_sha256=src.sha256(), force=True)
        toks = P["op_steps"] * P["batch"] * P["seq"]
        op = {"op_tokens": toks, "op_flops": 6.0 * n_wide * toks, "op_loss": [hist[0]["loss"], hist[-1]["loss"]]}
    op["op_seconds"] = time.time() - t0
    grown = checkpoint.load(out)
    r = _train(P, out, str(run / name), P["tokens"], 1000 + seed, gated=grown.config.gated)
    dead = _new_units_zero(src.config, checkpoint.load(r["final"]))
    return {"kind": "grown", "recipe": name, "seed": seed, "op_flops": 0.0, **op, "new_units_zero": dead, **r}


# ---- the driver -----------------------------------------------------------------------------


class InProcess:
    """The executor interface, running each job at submit time in this process (``--jobs 1``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        fut = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - re-raised by fut.result()
            fut.set_exception(e)
        return fut


def mean_curve(runs, x0=0.0):
    """(flops, mean val, sample std val, tokens) per eval point over seeds (same schedule in every run)."""
    n = min(len(r["curve"]) for r in runs)
    out = []
    for i in range(n):
        vals = [r["curve"][i][1] for r in runs]
        flops = statistics.mean(x0 + r["op_flops"] + 6.0 * r["params"] * r["curve"][i][0] for r in runs)
        out.append(
            (flops, statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, runs[0]["curve"][i][0])
        )
    return out


def flops_to_reach(curve, target):
    """First FLOPs at which a (flops, val, ...) curve reaches ``target`` (linear interpolation), or None."""
    for (f0, v0, *_), (f1, v1, *_) in zip(curve, curve[1:]):
        if v1 <= target:
            if v0 <= target:
                return f0
            return f0 + (f1 - f0) * (v0 - target) / (v0 - v1)
    return None


def plot(curves, base_curve, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    f, v, s, _ = zip(*base_curve)
    ax.plot([x / 1e12 for x in f], v, color="black", lw=1.2, label="base (narrow)")
    starts = []
    for name, c in curves.items():
        f, v, s, t = zip(*c)
        style = dict(ls="--", color="grey") if name == "scratch" else {}
        ax.plot([x / 1e12 for x in f], v, lw=1.2, label=name, **style)
        if name != "scratch":
            starts.append(max(v))
            (line,) = bx.plot(t, v, lw=1.2, marker="o", ms=3, label=name)
            bx.fill_between(
                t, [a - b for a, b in zip(v, s)], [a + b for a, b in zip(v, s)], color=line.get_color(), alpha=0.12
            )
    lo = min(min(c[i][1] for i in range(len(c))) for c in curves.values())
    if starts:
        ax.set_ylim(lo - 0.05, max(starts) + 2 * (max(starts) - lo))
    ax.set_xlabel("training TFLOPs (6 x params x tokens, cumulative; learned operators' steps included)")
    ax.set_ylabel("validation loss (nats/byte), mean over seeds")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    bx.set_xlabel("tokens since growth")
    bx.set_ylabel("validation loss, mean +- std over seeds")
    bx.set_title("growth phase", fontsize=9)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_all(P, names, seeds, scratch_tokens):
    """Train everything; returns (bases by seed, runs, wall seconds)."""
    t_start = time.time()
    runs, bases = [], {}
    pool = ProcessPoolExecutor(max_workers=P["jobs"], mp_context=get_context("spawn")) if P["jobs"] > 1 else InProcess()
    with pool:
        pending = {pool.submit(job_base, P, s): ("base", s) for s in seeds}
        if "scratch" in names:
            pending.update({pool.submit(job_scratch, P, s, scratch_tokens): ("scratch", s) for s in seeds})
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                what, s = pending.pop(fut)
                r = fut.result()
                print(
                    f"  [{time.time() - t_start:6.0f} s] {what:>14} seed {s}: val {r['val']:.4f} "
                    f"({r['seconds']:.0f} s)",
                    flush=True,
                )
                if what == "base":
                    bases[s] = r
                    for n in names:
                        if RECIPES[n][0] != "scratch":
                            pending[pool.submit(job_grow, P, n, s, r["final"])] = (n, s)
                else:
                    runs.append(r)
    return bases, runs, time.time() - t_start


def aggregate(names, seeds, bases, runs, n_small):
    """Per-recipe rows, mean curves (FLOPs), the scratch target and the best recipe."""
    x0 = statistics.mean(6.0 * n_small * bases[s]["tokens"] for s in seeds)
    base_curve = mean_curve([{**bases[s], "op_flops": 0.0} for s in seeds])
    by = {n: sorted((r for r in runs if r["recipe"] == n), key=lambda r: r["seed"]) for n in names}
    curves = {n: mean_curve(rs, 0.0 if n == "scratch" else x0) for n, rs in by.items()}
    scratch_final = statistics.mean(r["val"] for r in by["scratch"]) if "scratch" in by else None
    scratch_flops = curves["scratch"][-1][0] if "scratch" in by else None
    ref = {r["seed"]: r["val"] for r in by.get("srio", [])}
    rows = []
    for n, rs in by.items():
        vals = [r["val"] for r in rs]
        row = {
            "recipe": n,
            "seeds": len(rs),
            "val_mean": statistics.mean(vals),
            "val_std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "val_min": min(vals),
            "val_max": max(vals),
        }
        diffs = [r["val"] - ref[r["seed"]] for r in rs if r["seed"] in ref]
        if diffs:  # paired by seed: same base model, same data order
            row["d_vs_srio"] = statistics.mean(diffs)
            row["d_vs_srio_std"] = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        row.update(
            {
                "train_tail_mean": statistics.mean(r["train_tail"] for r in rs),
                "start_val_mean": statistics.mean(r["start_val"] for r in rs),
                "total_tflops": curves[n][-1][0] / 1e12,
                "op_tflops": statistics.mean(r["op_flops"] for r in rs) / 1e12,
            }
        )
        if n != "scratch":
            row["eps_mean"] = statistics.mean(r["eps"] for r in rs) if "eps" in rs[0] else None
            row["new_units_zero"] = statistics.mean(r["new_units_zero"] for r in rs)
        if scratch_final is not None and n != "scratch":
            f = flops_to_reach(curves[n], scratch_final)
            row["tflops_to_scratch_final"] = None if f is None else f / 1e12
            row["compute_saving"] = None if f is None else 1.0 - f / scratch_flops
            row["saving_without_op"] = None if f is None else 1.0 - (f - row["op_tflops"] * 1e12) / scratch_flops
        rows.append(row)
    grown = [r for r in rows if r["recipe"] != "scratch"]
    best = min(grown, key=lambda r: r["val_mean"]) if grown else None
    return rows, curves, base_curve, scratch_final, best


def main():
    args = parse_args("recipes", __doc__.splitlines()[0], options)
    d = args.dir
    if args.reuse:  # re-aggregate a finished run (same rows, plot, files) without training
        old = json.loads(Path(args.reuse).read_text())
        st = old["settings"]
        P, names, seeds = st, list(st["recipes"]), list(range(st["seeds"]))
        bases = {b["seed"]: b for b in old["base"]}
        runs, wall, mach = old["runs"], old["wall_seconds"], old["machine"]
        n_small, phase_tokens, scratch_tokens = st["params_small"], st["phase_tokens"], st["scratch_tokens"]
        data_name = st["data"]
    else:
        P = dict(QUICK if args.quick else FULL)
        for k in FULL:
            if getattr(args, k) is not None:
                P[k] = getattr(args, k)
        names = args.recipes.split(",") if args.recipes else (QUICK_RECIPES if args.quick else list(RECIPES))
        bad = [n for n in names if n not in RECIPES]
        if bad:
            raise SystemExit(f"bench/recipes.py: unknown recipe(s) {', '.join(bad)} (known: {', '.join(RECIPES)})")
        if not Path(args.data).is_file():
            raise SystemExit(f"bench/recipes.py: {args.data}: no such file")
        work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="growtool-recipes-"))
        work.mkdir(parents=True, exist_ok=True)
        P.update(data=str(Path(args.data).resolve()), work=str(work.resolve()))
        data_name = P["data"]
        n_small, n_wide = _config(P, P["width"]).n_params(), _config(P, P["grow_to"]).n_params()
        per_step = P["batch"] * P["seq"]
        phase_tokens = math.ceil(P["tokens"] / per_step) * per_step
        scratch_tokens = round(phase_tokens * (n_small + n_wide) / n_wide)
        seeds = list(range(P["seeds"]))
        print(
            f"recipes bench: llama d{P['width']} ({n_small:,} params) -> d{P['grow_to']} ({n_wide:,}), "
            f"{P['layers']} layers, {phase_tokens:,} tokens per phase, scratch {scratch_tokens:,} tokens, "
            f"seeds {seeds}, recipes {', '.join(names)}, {P['jobs']} worker(s)",
            flush=True,
        )
        bases, runs, wall = run_all(P, names, seeds, scratch_tokens)
        mach = machine()
        P = {
            **{k: v for k, v in P.items() if k != "work"},
            "phase_tokens": phase_tokens,
            "scratch_tokens": scratch_tokens,
            "params_small": n_small,
            "params_wide": n_wide,
            "recipes": {n: RECIPES[n] for n in names},
            "quick": args.quick,
        }
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    rows, curves, base_curve, scratch_final, best = aggregate(names, seeds, bases, runs, n_small)
    write_csv(d / "results.csv", rows)
    write_csv(
        d / "runs.csv",
        [
            {k: v for k, v in r.items() if k not in ("curve", "eps_path", "final")}
            for r in sorted(runs, key=lambda r: (r["recipe"], r["seed"]))
        ],
    )
    plot(
        curves,
        base_curve,
        d / "curves.png",
        f"llama d{P['width']} -> d{P['grow_to']}, {phase_tokens:,} tokens "
        f"per phase, {len(seeds)} seed(s), {Path(data_name).name}",
    )
    summary = {
        "settings": P,
        "machine": mach,
        "wall_seconds": wall,
        "base": [{k: v for k, v in bases[s].items() if k != "final"} for s in seeds],
        "rows": rows,
        "best_recipe": best["recipe"] if best else None,
        "best_compute_saving": best.get("compute_saving") if best else None,
        "scratch_final_val": scratch_final,
        "curves": {
            n: [{"tflops": f / 1e12, "tokens": t, "val": v, "std": sd} for f, v, sd, t in c] for n, c in curves.items()
        },
        "runs": [{k: v for k, v in r.items() if k != "final"} for r in runs],
    }
    write_json(d / "results.json", summary)
    print(table(rows, f"final validation loss by recipe ({wall:.0f} s)"))
    if best:
        cs = best.get("compute_saving")
        print(
            f"best recipe: {best['recipe']} ({best['val_mean']:.4f}); compute saved to reach scratch's final "
            f"val loss {scratch_final if scratch_final is None else round(scratch_final, 4)}: "
            f"{'not reached' if cs is None else f'{cs:.1%}'}"
        )
    print(f"wrote {d}/results.csv, runs.csv, results.json, curves.png")


if __name__ == "__main__":
    main()
