"""Does a BLOOM grown 1.5x by the embedding-norm refit train on well? (docs/architectures.md, BLOOM)

A tied BLOOM (width 48, 2 layers, 4 heads, byte level, ``growtool init``) is trained on real text
(default ../shared/data/docs.jsonl) for ``base`` steps; its final checkpoint is then trained on for
``grown`` steps four ways, each through the plain path a user takes (``expand``, then ``train``
with its defaults: wsd, the gate warm-up, the continued data stream):

* refit: ``expand --width 72 --untie`` (1.5x: untied, the embedding table refit);
* copy: ``expand --width 96`` (2x: the residual copied, tied: the map BLOOM had before);
* base: the source itself, continued at width 48;
* scratch: an untied width-72 BLOOM from ``growtool init``, trained for base + grown steps.

It records each run's validation loss where it starts (a grown run's first evaluation: the source's
function, so the source's loss if growth is exact) and where it ends, its parameters and its
training FLOPs (6 x params x tokens, the base phase counted for the grown runs). Writes
``<out>/bloom_refit/results.json``; each run's trainer folder goes to ``<out>/tmp/bloom_refit/``
(git-ignored) and a run whose ``summary.json`` is there is reused. ``--quick``: widths 24 -> 36 / 48,
8 steps a phase (the CI smoke run).
"""

from __future__ import annotations

import json
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
    p.add_argument("--seed", type=int, default=0)


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
    work = Path(args.out) / "tmp" / "bloom_refit"
    work.mkdir(parents=True, exist_ok=True)
    P = dict(S, data=args.data, work=str(work), schedule="wsd")
    tok = S["batch"] * S["seq"]
    d, h = S["width"], S["heads"]

    import growtool
    from growtool.io import checkpoint

    def init(width, heads, tie, name):  # ``growtool init``, as a user makes one (no gated attention: BLOOM's own)
        path = work / f"{name}.safetensors"
        if not path.exists():
            opts = ["--width", width, "--layers", S["layers"], "--heads", heads, "--seed", args.seed]
            opts += ["--tie" if tie else "--no-tie", "--no-attn-gate", "--force", "-o", path]
            cmd = [str(Path(sys.executable).parent / "growtool"), "init", "--family", "bloom", *map(str, opts)]
            subprocess.run(cmd, check=True, capture_output=True)
        return str(path)

    def phase(ckpt, steps):
        return lambda out: train_phase(P, ckpt, out, steps * tok, args.seed, schedule="wsd")[0]

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
    p0 = checkpoint.load(src).config.n_params()
    rows = []
    for name, s in runs.items():
        before = 0 if name == "scratch" else 6 * p0 * S["base"] * tok
        rows.append(
            {
                "run": name,
                "params": s["params"],
                "tied": checkpoint.load(s["final"]).config.tie,
                "start_val_loss": s["first_val_loss"],
                "val_loss": s["val_loss"],
                "flops": before + 6 * s["params"] * s["tokens"],
            }
        )
    print(table(rows, f"BLOOM d{d}: base val loss {base['val_loss']:.4f} after {S['base']} steps"))
    write_json(
        args.dir / "results.json",
        {"settings": {**S, "data": args.data, "seed": args.seed}, "base": base["val_loss"], "rows": rows}
        | {"machine": machine()},
    )


if __name__ == "__main__":
    main()
