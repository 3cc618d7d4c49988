"""What the default eval / save / metrics cadences cost a run (issue 43).

A Llama (``--width`` 128, ``--layers`` 4, byte vocabulary, context 64) is trained on a generated
corpus (growtool.demo.make_corpus, 2 MB) for 20 and for 2,000 steps (batch 8 x 64 tokens, one torch
thread), each twice: with the default cadences (settings.default_every: 5% / 10% / 10% of the run,
at least 25 / 50 / 50 steps) and with each once per run (``--eval-every``, ``--save-every``,
``--metrics-every`` = the run's steps: validation and metrics at step 0 and at the end, one save).
The overhead of the defaults is (t_default - t_once) / t_default, from the faster of ``--repeats``
timings of each (5 for the 20-step runs; the machine is shared). The 20-step run is also timed with the cadences the
defaults gave before the floors (every 1 / 2 / 2 steps).

    python bench/intervals.py                 # 20 and 2,000 steps (bench/README.md); a few minutes
    python bench/intervals.py --quick         # 20 and 200 steps, smaller model
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_args, table, write_csv, write_json  # noqa: E402


def extra(p) -> None:
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--long", type=int, default=2000, help="steps of the long run")
    p.add_argument("--repeats", type=int, default=2)


def timed(ckpt, text, out: Path, cache: Path, **kw) -> float:
    from growtool.training.loop import train

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    train(ckpt, [text], out, cache_dir=cache, progress=False, device="cpu", batch=8, seq=64, **kw)
    return time.perf_counter() - t0


def main() -> None:
    import torch

    from growtool.demo import demo_config, make_corpus
    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.training.settings import default_every

    args = parse_args("intervals", __doc__, extra)
    torch.set_num_threads(1)
    width, layers, long = (64, 2, 200) if args.quick else (args.width, args.layers, args.long)
    work = Path(tempfile.mkdtemp(prefix="intervals-"))
    try:
        text = work / "corpus.txt"
        text.write_text(make_corpus(200_000 if args.quick else 2_000_000))
        cfg = demo_config({"width": width, "layers": layers, "heads": 4, "seq": 64})
        cfg.attn_gate = False
        ckpt = checkpoint.save_tensors(str(work / "a.safetensors"), cfg, [], init_model(cfg).tensors())
        cache = work / "cache"
        timed(ckpt, text, work / "warm", cache, steps=2)  # tokenise once: every timed run reads the cache
        rows = []
        for steps in (20, long):
            once = dict(eval_every=steps, save_every=steps, metrics_every=steps)
            reps = args.repeats if steps > 20 else max(args.repeats, 5)  # short runs: noise, so more of them
            kinds = {"default": {}, "once per run": once}
            if steps == 20:
                kinds["before the floors"] = dict(eval_every=1, save_every=2, metrics_every=2)
            best = {
                k: min(timed(ckpt, text, work / "run", cache, steps=steps, **kw) for _ in range(reps))
                for k, kw in kinds.items()
            }
            for k, t in best.items():
                cad = [default_every(n, steps) for n in ("eval_every", "save_every", "metrics_every")]
                cad = cad if k == "default" else [kinds[k][n] for n in ("eval_every", "save_every", "metrics_every")]
                rows.append(
                    {
                        "steps": steps,
                        "cadences": k,
                        "eval/save/metrics every": "/".join(map(str, cad)),
                        "seconds": round(t, 2),
                        "overhead vs once": round((t - best["once per run"]) / t, 3),
                    }
                )
        print(table(rows, f"cadence overhead: llama d{width} x{layers}, batch 8 x 64, 1 thread"))
        write_csv(args.dir / "intervals.csv", rows)
        write_json(args.dir / "intervals.json", {"rows": rows, "machine": machine(), "quick": args.quick})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
