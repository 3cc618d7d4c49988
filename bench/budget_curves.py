"""The budget study's cached runs, seed by seed and through the run (reads bench/budget.py's cache).

  (default)        each grown run's final loss minus scratch's at the same budget and seed, scratch at
                   its best LR there (``budget.best_lr``): per seed, mean ± sd, how many end below 0
  --curves         that gap through the run: grown minus scratch at equal FLOPs, at 1/8 .. 8/8 of
                   scratch's FLOPs (each curve interpolated between its evaluations), mean over seeds
  --minus="ARGS"   this study's runs minus another study's (the same options, then ARGS: e.g.
                   "--llama-gate 0"), run for run (kind, variant, budget, LR, seed), at evaluations
                   1/16, 1/8, 1/4, 1/2 of the run's tokens and at its end, mean over the seeds both ran

Only runs made at the study's sizes, data, schedule and options are read (``budget.cached_runs``): a
run with another decay or another Llama block never mixes in. ``--at B`` keeps budget B alone. Runs
nothing; reads ``<out>/budget/cached/``, as ``budget.py --cached-only`` with the same options does.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections import defaultdict

import numpy as np
from budget import best_lr, cached_runs, options, study
from common import make_parser, results_dir, table

FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)  # --minus: evaluations at these shares of the run's tokens


def _options(p) -> None:
    options(p)  # budget.py's: the study to read
    p.add_argument("--curves", action="store_true", help="the gap to scratch at equal FLOPs through the run")
    p.add_argument("--minus", default="", metavar="ARGS", help='another study to subtract: --minus="--llama-gate 0"')
    p.add_argument("--at", type=float, default=None, help="one budget (tokens / parameter) alone")


def parser() -> argparse.ArgumentParser:
    return make_parser("budget_curves", __doc__.splitlines()[0], _options)


def by_run(runs) -> dict:
    """{(family, budget, name, lr): {seed: result}}, name a grown run's variant or ``scratch``."""
    out = defaultdict(dict)
    for spec, result in runs:
        name = spec["variant"] if spec["kind"] == "grown" else "scratch"
        out[(spec["family"], spec["budget"], name, spec["lr"])][spec["seed"]] = result
    return out


def _scratch(g: dict, fam: str, budget: float) -> tuple[float, dict] | None:
    """Scratch at ``budget``: its best LR and that LR's runs, or None when scratch did not run there."""
    by_lr = {lr: r for (f, b, n, lr), r in g.items() if (f, b, n) == (fam, budget, "scratch")}
    if not by_lr:
        return None
    lr = best_lr(by_lr)
    return lr, by_lr[lr]


def _at(curve, x: float) -> float:
    c = np.asarray(curve, dtype=float)
    return float(np.interp(x, c[:, 0], c[:, 1]))


def gaps(runs, curves: bool = False) -> list[dict]:
    """Each grown (variant, budget, LR) against scratch at its best LR, paired by seed: the final loss
    gap per seed (or, with ``curves``, the mean gap at equal FLOPs through the run)."""
    g, rows = by_run(runs), []
    for (fam, b, name, lr), grown in sorted(g.items()):
        scratch = None if name == "scratch" else _scratch(g, fam, b)
        seeds = sorted(set(grown) & set(scratch[1])) if scratch else []
        if not seeds:
            continue
        ref_lr, ref = scratch
        row = {"family": fam, "budget": b, "variant": name, "lr": lr, "scratch_lr": ref_lr}
        row["seeds"] = ",".join(map(str, seeds))
        if curves:
            for q in range(1, 9):
                at = {s: q / 8 * ref[s]["flops"] for s in seeds}
                d = [_at(grown[s]["curve"], at[s]) - _at(ref[s]["curve"], at[s]) for s in seeds]
                row[f"{q}/8"] = f"{statistics.mean(d):+.3f}"
        else:
            d = [grown[s]["val"] - ref[s]["val"] for s in seeds]
            sd = statistics.stdev(d) if len(d) > 1 else 0.0
            row |= {
                "gap per seed": " / ".join(f"{x:+.3f}" for x in d),
                "mean ± sd": f"{statistics.mean(d):+.3f} ± {sd:.3f}",
                "below": f"{sum(x < 0 for x in d)} of {len(d)}",
            }
        rows.append(row)
    return rows


def minus(runs, other, evals: int) -> list[dict]:
    """Run for run, this study's loss minus the other's at evaluations FRACTIONS of the run and at its
    end, mean over the seeds both ran."""
    a, b, rows = by_run(runs), by_run(other), []
    idx = sorted({max(1, round(f * evals)) for f in FRACTIONS})
    for key in sorted(set(a) & set(b)):
        seeds = sorted(set(a[key]) & set(b[key]))
        if not seeds:
            continue
        fam, budget, name, lr = key
        row = {"family": fam, "budget": budget, "run": name, "lr": lr, "seeds": ",".join(map(str, seeds))}
        for i in idx:
            d = [a[key][s]["curve"][i][1] - b[key][s]["curve"][i][1] for s in seeds]
            row[f"{i}/{evals}"] = f"{statistics.mean(d):+.3f}"
        row["end"] = f"{statistics.mean(a[key][s]['val'] - b[key][s]['val'] for s in seeds):+.3f}"
        rows.append(row)
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    P = study(args)
    cached = results_dir(args.out, "budget") / "cached"

    def keep(P):
        fams = set(P["families"].split(","))
        runs = cached_runs(P, cached)
        return [(s, r) for s, r in runs if s["family"] in fams and (args.at is None or s["budget"] == args.at)]

    runs = keep(P)
    if args.minus:
        rest = [a for a in argv if not a.startswith("--minus")]
        Q = study(p.parse_args(rest + shlex.split(args.minus)))
        print(table(minus(runs, keep(Q), P["evals"]), f"this study minus the one with {args.minus}"))
    else:
        what = "at equal FLOPs, mean over seeds" if args.curves else "final loss"
        print(table(gaps(runs, args.curves), f"grown minus scratch at its best LR, {what}"))


if __name__ == "__main__":
    main()
