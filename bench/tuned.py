"""Growth against scratch with each at its own best learning rate: reads the ``results.json`` files
of several ``bench/growth_pays.py`` runs made at different ``--lr`` (same sizes, seeds and data), picks
for every (family, variant) the peak LR with the lowest mean final validation loss, and reports the
compute saved by each grown variant at its best LR against scratch at *its* best LR (per seed, base
phase counted; 1.5x variants against ``scratch``, 2x ones against ``scratch_2x``).

    python bench/tuned.py bench/results/growth_pays/lr1.5e-3/growth_pays/results.json \\
        bench/results/growth_pays/results.json bench/results/growth_pays/lr6e-3/growth_pays/results.json \\
        bench/results/growth_pays/lr/growth_pays/results.json

Writes ``<out>/tuned/``: results.csv (per family, variant and LR: final val mean / std, per-seed
compute saved against the tuned scratch; ``best`` marks each variant's best LR) and results.json.
A test runs it on two ``--quick`` runs.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from common import parse_args, table, write_csv, write_json
from growth_pays import _two_x, flops_to_reach

SIZE_KEYS = ("width", "grow_to", "to_2x", "layers", "head_dim", "batch", "seq", "tokens", "gamma")


def options(p):
    p.add_argument("results", nargs="+", help="results.json of growth_pays runs at different --lr")


def load(paths: list[str]) -> list[dict]:
    """Every run of every file, tagged with its file's LR; the files must agree on everything else."""
    runs, sizes = [], None
    for path in paths:
        res = json.loads(Path(path).read_text())
        s = res["settings"]
        mine = {k: s.get(k) for k in SIZE_KEYS}
        if sizes is not None and mine != sizes:
            raise SystemExit(f"bench/tuned.py: {path}: other sizes than the first file ({mine} vs {sizes})")
        sizes = mine
        runs += [{**r, "lr": s["lr"]} for r in res["runs"]]
    return runs


def aggregate(runs: list[dict]) -> list[dict]:
    by: dict = {}
    for r in runs:
        by.setdefault((r["family"], r["variant"]), {}).setdefault(r["lr"], {})[r["seed"]] = r
    best = {k: min(v, key=lambda lr: statistics.mean(r["val"] for r in v[lr].values())) for k, v in by.items()}
    rows = []
    for (family, variant), per_lr in sorted(by.items()):
        ref_name = "scratch_2x" if _two_x(variant) else "scratch"
        ref = by.get((family, ref_name), {}).get(best.get((family, ref_name)), {})
        for lr, rs in sorted(per_lr.items()):
            vals = [r["val"] for r in rs.values()]
            saved = {}
            if not variant.startswith("scratch"):
                for seed, r in sorted(rs.items()):
                    if seed in ref:
                        f = flops_to_reach(r["curve"], ref[seed]["val"])
                        saved[seed] = None if f is None else 1.0 - f / ref[seed]["flops"]
            got = [x for x in saved.values() if x is not None]
            rows.append(
                {
                    "family": family,
                    "variant": variant,
                    "lr": lr,
                    "best": lr == best[(family, variant)],
                    "seeds": len(rs),
                    "val_mean": statistics.mean(vals),
                    "val_std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                    "vs": f"{ref_name} @ {best.get((family, ref_name))}" if saved else "",
                    "saved_per_seed": " ".join("n.r." if x is None else f"{100 * x:.1f}%" for x in saved.values()),
                    "saved_mean": statistics.mean(got) if got and len(got) == len(saved) else None,
                    "saved_std": statistics.stdev(got) if len(got) > 1 and len(got) == len(saved) else None,
                    "not_reached": sum(x is None for x in saved.values()),
                }
            )
    return rows


def main():
    args = parse_args("tuned", __doc__.splitlines()[0], options)
    rows = aggregate(load(args.results))
    write_csv(args.dir / "results.csv", rows)
    write_json(args.dir / "results.json", {"inputs": args.results, "rows": rows})
    print(table(rows, "growth vs scratch, each at its best LR"))
    print(f"wrote {args.dir}/results.csv, results.json")


if __name__ == "__main__":
    main()
