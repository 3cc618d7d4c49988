"""Does a BLOOM grown 1.5x by the embedding-norm refit train on well? (docs/architectures.md, BLOOM)

A tied BLOOM (width 48, 2 layers, 4 heads, byte level, ``growtool init``) is trained on real text
(default ../shared/data/docs.jsonl) for ``base`` steps; its final checkpoint is then trained on for
``grown`` steps several ways, each through the plain path a user takes (``expand``, then ``train``
with its defaults: wsd, the gate warm-up, the continued data stream):

* refit: ``expand --width 72 --untie`` (1.5x: untied, the embedding table refit);
* copy: ``expand --width 96`` (2x: the residual copied, tied: the map BLOOM had before);
* base: the source itself, continued at width 48;
* scratch: an untied width-72 BLOOM from ``growtool init``, trained for base + grown steps;
* scratch-flops: the same, trained (its own whole wsd run) for the FLOPs of the refit path;
* the control, GPT-2 (the same LayerNorm width map, no embedding norm, tied) at the same sizes:
  gpt2-grown (``expand --width 72``, base phase counted) and gpt2-scratch-flops at its FLOPs. If the
  refit hurt training, BLOOM's gap to scratch would be wider than GPT-2's.

It records each run's validation loss where it starts (a grown run's first evaluation: the source's
function, so the source's loss if growth is exact) and where it ends, its parameters and its
training FLOPs (6 x params x tokens, the base phase counted for the grown runs). Writes
``<out>/bloom_refit/results.json`` (every run of every seed, and the mean per run); each run's
trainer folder goes to ``<out>/tmp/bloom_refit/seed<N>/`` (git-ignored), and a run whose
``summary.json`` is there is reused. Seeds 0, 1, 2 (``--seeds``); each seed has its own init and
data order. ``--quick``: widths 24 -> 36 / 48, 8 steps a phase, seed 0 (the CI smoke run).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, parse_args, table, train_phase, write_json  # noqa: E402

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "docs.jsonl")  # ../shared/data
FULL = dict(width=48, heads=4, layers=2, base=600, grown=600, batch=16, seq=128, lr=3e-3, evals=10, eval_batches=16)
QUICK = dict(width=24, heads=2, layers=1, base=8, grown=8, batch=4, seq=32, lr=3e-3, evals=2, eval_batches=2)


def options(p):
    p.add_argument("--data", default=DATA, help="training text (default ../shared/data/docs.jsonl)")
    p.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; quick 0)")


def cached(work: Path, name: str, make) -> dict:
    """The run ``name``'s summary: read from its folder when a finished run is there, else made."""
    f = work / name / "summary.json"
    if f.exists():
        return json.loads(f.read_text())
    s = make(str(work / name))
    f.write_text(json.dumps(s, default=str))
    return s


def main():
    args = parse_args("bloom_refit", __doc__.splitlines()[0], options)
    S = QUICK if args.quick else FULL
    seeds = [int(x) for x in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    rows, bases = [], {}
    for seed in seeds:
        seed_rows, bases[seed] = one_seed(args, S, seed)
        rows += seed_rows
    means = []
    for name in dict.fromkeys(r["run"] for r in rows):
        vals = [r["val_loss"] for r in rows if r["run"] == name]
        means.append({"run": name, "seeds": len(vals), "val_loss_mean": statistics.mean(vals)})
        if len(vals) > 1:
            means[-1]["val_loss_sd"] = statistics.stdev(vals)
    print(table(means, f"mean over seeds {seeds}"))
    write_json(
        args.dir / "results.json",
        {"settings": {**S, "data": args.data, "seeds": seeds}, "bases": bases, "means": means, "rows": rows}
        | {"machine": machine()},
    )


def one_seed(args, S: dict, seed: int) -> tuple[list[dict], dict]:
    """The runs of one seed: (rows, {"bloom": base val loss, "gpt2": ...})."""
    work = Path(args.out) / "tmp" / "bloom_refit" / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    P = dict(S, data=args.data, work=str(work), schedule="wsd")
    tok = S["batch"] * S["seq"]
    d, h = S["width"], S["heads"]

    import growtool
    from growtool.io import checkpoint

    def init(width, heads, tie, name, family="bloom"):  # ``growtool init``, as a user makes one (no gated attention)
        path = work / f"{name}.safetensors"
        if not path.exists():
            opts = ["--width", width, "--layers", S["layers"], "--heads", heads, "--seed", seed]
            opts += ["--tie" if tie else "--no-tie", "--no-attn-gate", "--force", "-o", path]
            cmd = [str(Path(sys.executable).parent / "growtool"), "init", "--family", family, *map(str, opts)]
            subprocess.run(cmd, check=True, capture_output=True)
        return str(path)

    def phase(ckpt, steps):
        return lambda out: train_phase(P, ckpt, out, steps * tok, seed, schedule="wsd")[0]

    base = cached(work, "base-phase", phase(init(d, h, True, "init"), S["base"]))
    src = base["final"]
    grown = {
        "refit": (str(work / "refit.safetensors"), dict(width=d * 3 // 2, untie=True)),
        "copy": (str(work / "copy.safetensors"), dict(width=2 * d)),
    }
    for out, kw in grown.values():
        if not Path(out).exists():
            growtool.expand(src, out=out, force=True, **kw)
    runs = {name: cached(work, name, phase(path, S["grown"])) for name, (path, _) in grown.items()}
    runs["base"] = cached(work, "base", phase(src, S["grown"]))
    scratch = init(d * 3 // 2, h * 3 // 2, False, "scratch-init")
    runs["scratch"] = cached(work, "scratch", phase(scratch, S["base"] + S["grown"]))
    p0, p1 = checkpoint.load(src).config.n_params(), checkpoint.load(scratch).config.n_params()
    runs["scratch-flops"] = cached(work, "scratch-flops", phase(scratch, round(S["base"] * p0 / p1) + S["grown"]))
    # the control: GPT-2 (the same LayerNorm map, no embedding norm, tied) grown 1.5x, against scratch
    g_base = cached(work, "gpt2-base-phase", phase(init(d, h, True, "gpt2-init", "gpt2"), S["base"]))
    g_src, g_out = g_base["final"], str(work / "gpt2-grown.safetensors")
    if not Path(g_out).exists():
        growtool.expand(g_src, out=g_out, force=True, width=d * 3 // 2)
    runs["gpt2-grown"] = cached(work, "gpt2-grown", phase(g_out, S["grown"]))
    g_scratch = init(d * 3 // 2, h * 3 // 2, True, "gpt2-scratch-init", "gpt2")
    g0, g1 = checkpoint.load(g_src).config.n_params(), checkpoint.load(g_scratch).config.n_params()
    runs["gpt2-scratch-flops"] = cached(
        work, "gpt2-scratch-flops", phase(g_scratch, round(S["base"] * g0 / g1) + S["grown"])
    )
    rows = []
    for name, s in runs.items():
        before = 0 if "scratch" in name else 6 * (g0 if name.startswith("gpt2") else p0) * S["base"] * tok
        rows.append(
            {
                "run": name,
                "seed": seed,
                "params": s["params"],
                "tied": checkpoint.load(s["final"]).config.tie,
                "start_val_loss": s["first_val_loss"],
                "val_loss": s["val_loss"],
                "flops": before + 6 * s["params"] * s["tokens"],
            }
        )
    print(table(rows, f"seed {seed}: BLOOM base val loss {base['val_loss']:.4f}, GPT-2 {g_base['val_loss']:.4f}"))
    return rows, {"bloom": base["val_loss"], "gpt2": g_base["val_loss"]}


if __name__ == "__main__":
    main()
