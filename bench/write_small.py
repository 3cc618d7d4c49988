"""Small outputs: ``expand`` of Llama checkpoints of 0.2-31 MB to 1.5x width, the tensors produced
on the writer's own thread against on the producing threads: the measurement behind
``stream.INLINE_BELOW``.

Each size is a random float32 Llama (vocabulary 512) grown in-process by ``growtool.expand`` into
the results folder, the two ways alternating (``stream.INLINE_BELOW`` set above the output's size,
then to 0), ``--repeats`` times each after one untimed expand of each; the producing threads are
the default (every core, up to 8). Reports the median wall of each way and their ratio; writes
``<out>/write_small/results.csv`` and ``results.json``.
"""

from __future__ import annotations

import statistics
import time

import torch
from common import machine, parse_args, table, write_csv, write_json
from surgery import write_random_checkpoint

import growtool
from growtool.io import stream
from growtool.nn.config import ModelConfig

SIZES = ((32, 2), (64, 2), (128, 4), (256, 4), (512, 4), (768, 8))  # (width, layers)


def random_llama(path, width: int, layers: int) -> None:
    cfg = ModelConfig(
        family="llama", vocab_size=512, width=width, layers=layers, heads=4, kv_heads=4, head_dim=width // 4,
        ffn=2 * width, context=64,
    )  # fmt: skip
    write_random_checkpoint(path, cfg, torch.float32)


def main():
    args = parse_args(
        "write_small", __doc__.splitlines()[0], lambda p: p.add_argument("--repeats", type=int, default=15)
    )
    sizes, repeats = (SIZES[1:3], 3) if args.quick else (SIZES, args.repeats)
    rows, default = [], stream.INLINE_BELOW
    try:
        for width, layers in sizes:
            src, out = args.dir / "tmp-src.safetensors", args.dir / "tmp-out.safetensors"
            random_llama(src, width, layers)
            ways = {"writer's thread": 1 << 62, "producing threads": 0}  # INLINE_BELOW for each way
            times = {w: [] for w in ways}
            for k in range(repeats + 1):
                for way, below in ways.items():
                    stream.INLINE_BELOW = below
                    t0 = time.perf_counter()
                    growtool.expand(str(src), width=width * 3 // 2, out=str(out), force=True)
                    if k:  # the first of each way warms up
                        times[way].append(time.perf_counter() - t0)
            inline, threads = (statistics.median(times[w]) * 1e3 for w in ways)
            rows.append(
                {
                    "width": width,
                    "layers": layers,
                    "output_MB": out.stat().st_size / 2**20,
                    "writer_thread_ms": inline,
                    "producers_ms": threads,
                    "producers/writer": threads / inline,
                }
            )
    finally:
        stream.INLINE_BELOW = default
        for p in (args.dir / "tmp-src.safetensors", args.dir / "tmp-out.safetensors"):
            p.unlink(missing_ok=True)
    write_csv(args.dir / "results.csv", rows)
    write_json(
        args.dir / "results.json",
        {"repeats": repeats, "inline_below_MB": default / 2**20, "machine": machine(), "rows": rows},
    )
    print(table(rows, f"expand to 1.5x width, median of {repeats} (ms); stream.INLINE_BELOW = {default / 2**20:g} MB"))
    print(f"wrote {args.dir}/results.csv, results.json")


if __name__ == "__main__":
    main()
