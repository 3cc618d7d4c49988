"""Surgery speed and memory: ``growtool expand`` of a ~1 GB Llama-shaped checkpoint to 1.5x width,
against a plain file copy of the output on the same disk.

For float32 and bfloat16 (same parameter count) it
  1. writes a random Llama checkpoint tensor by tensor (the generator holds one tensor at a time);
  2. runs ``growtool expand SRC --width 1.5d -o OUT`` as a subprocess: wall time and peak RSS
     (the child's own ru_maxrss from ``os.wait4``);
  3. copies OUT to a temporary name on the same disk (``shutil.copyfile`` + fsync, as expand fsyncs);
  4. repeats 1-3 (3; 1 with --quick) alternately and reports medians: ratio = expand / copy (target <= 1.5) and
     peak RSS against 3 x the largest output tensor + 0.5 GB (the memory target);
  5. runs the same expansion in-process with timers around each step (source hash for the lineage,
     reading, growing, writing + fsync) to show where the time goes; there the steps run one after
     another (``growtool expand`` itself produces the next tensor while writing the current one).

``--quick`` uses a ~120 MB checkpoint. ``--profile`` also writes a cProfile of the in-process run.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import struct
import sys
import time
from pathlib import Path

import torch
from common import MB, cpu_seconds, fsync_file, machine, parse_args, run_measured, table, write_csv, write_json

from growtool import checkpoint, growth, recipes
from growtool.cli import surgery_threading
from growtool.config import ModelConfig
from growtool.families import expected_shapes, tensor_specs

GROWTOOL = str(Path(sys.executable).with_name("growtool"))
GB = 1024**3


def llama_config(quick: bool) -> ModelConfig:
    """246M parameters (0.98 GB in float32) for the full run, 31M (123 MB) for --quick."""
    if quick:
        return ModelConfig(
            "llama",
            vocab_size=8000,
            width=512,
            layers=8,
            heads=8,
            kv_heads=2,
            head_dim=64,
            ffn=1408,
            context=2048,
            norm_eps=1e-5,
            tie=False,
        )
    return ModelConfig(
        "llama",
        vocab_size=32000,
        width=1024,
        layers=16,
        heads=16,
        kv_heads=4,
        head_dim=64,
        ffn=2816,
        context=2048,
        norm_eps=1e-5,
        tie=False,
    )


def write_random_checkpoint(path: Path, cfg: ModelConfig, dtype: torch.dtype, seed: int = 0) -> None:
    """A safetensors file written tensor by tensor: header first, then each random tensor in turn.
    Weights ~ N(0, 0.02^2), norm gains 1 + N(0, 0.1^2); the config goes in the metadata."""
    shapes = expected_shapes(cfg)
    specs = tensor_specs(cfg)
    header, off = {"__metadata__": checkpoint.metadata(cfg, [{"op": "bench-random", "seed": seed}])}, 0
    for name, shape in shapes.items():
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s
        header[name] = {
            "dtype": checkpoint.DTYPE_NAME[dtype],
            "shape": list(shape),
            "data_offsets": [off, off + nbytes],
        }
        off += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for name, shape in shapes.items():
            t = torch.randn(shape, generator=gen)
            t = 1 + 0.1 * t if specs[name].role == "norm_gain" else 0.02 * t
            f.write(t.to(dtype).reshape(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())


def timed_copy(src: Path, dst: Path) -> tuple[float, float]:
    """(wall, CPU) seconds to copy ``src`` to ``dst`` and fsync it (then ``dst`` is removed)."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    shutil.copyfile(src, dst)
    fsync_file(dst)
    dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
    dst.unlink()
    return dt, dc


def instrumented_expand(src: Path, out: Path, width: int, profile_to: Path | None = None) -> dict:
    """The same steps as ``growtool expand`` (load, hash, plan, stream, atomic write) in-process,
    with a timer around each step. Returns seconds per step."""
    t = {"sha256": 0.0, "read": 0.0, "nan_check": 0.0, "grow": 0.0}
    prof = cProfile.Profile() if profile_to else None
    if prof:
        prof.enable()
    t_all = time.perf_counter()
    ck = checkpoint.load(str(src))
    plan = growth.build_plan(ck.config, recipes.load("srio"), width, dtype=ck.main_dtype())
    t0 = time.perf_counter()
    lineage = ck.lineage + [growth.lineage_entry(plan, ck.sha256())]
    t["sha256"] = time.perf_counter() - t0

    raw = ck._get

    def timed_read(name):  # the file read alone
        t0 = time.perf_counter()
        x = raw(name)
        t["read"] += time.perf_counter() - t0
        return x

    ck._get = timed_read

    def get(name):  # read + the NaN / Inf check, as in growtool expand
        t0 = time.perf_counter()
        before = t["read"]
        x = ck.get(name)
        t["nan_check"] += time.perf_counter() - t0 - (t["read"] - before)
        return x

    work = growth.Workspace()

    def produce(name):
        t0 = time.perf_counter()
        before = t["read"] + t["nan_check"]
        y = growth.grow_tensor(name, plan, get, work)
        t["grow"] += time.perf_counter() - t0 - (t["read"] + t["nan_check"] - before)
        return y

    t0 = time.perf_counter()
    prefetch = checkpoint.prefetch  # the steps one after another (expand overlaps grow and write)
    checkpoint.prefetch = lambda names, fn: prefetch(names, fn, ahead=0)
    try:
        with surgery_threading():  # as growtool expand does
            checkpoint.save(str(out), plan.cfg, lineage, plan.outputs(), produce, force=True)
    finally:
        checkpoint.prefetch = prefetch
    t_save = time.perf_counter() - t0
    t["write_fsync"] = t_save - t["read"] - t["nan_check"] - t["grow"]
    t["total"] = time.perf_counter() - t_all
    t["other"] = t["total"] - sum(v for k, v in t.items() if k != "total")
    if prof:
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
        s.write("\n---- by own time ----\n")
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        profile_to.write_text(s.getvalue())
    return t


def bench_dtype(
    cfg: ModelConfig, dtype: torch.dtype, width: int, repeats: int, startup: dict, tmp: Path, args
) -> tuple[dict, dict]:
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    src, out, cp = tmp / f"src-{name}.safetensors", tmp / f"out-{name}.safetensors", tmp / f"copy-{name}.bin"
    t0 = time.perf_counter()
    write_random_checkpoint(src, cfg, dtype)
    t_gen = time.perf_counter() - t0
    plan = growth.build_plan(cfg, recipes.load("srio"), width, dtype=dtype)
    largest = max(dtype.itemsize * torch.Size(s).numel() for _, s, _ in plan.outputs())
    expands, copies = [], []
    for _ in range(repeats):
        if out.exists():
            out.unlink()
        m = run_measured([GROWTOOL, "expand", str(src), "--width", str(width), "-o", str(out), "--quiet"])
        if m["rc"] != 0:
            raise SystemExit(f"growtool expand failed (exit {m['rc']}): {m['stderr'].strip()[-2000:]}")
        expands.append(m)
        copies.append(timed_copy(out, cp))
    steps = instrumented_expand(
        src, tmp / f"inproc-{name}.safetensors", width, args.dir / f"profile-{name}.txt" if args.profile else None
    )
    src_b, out_b = src.stat().st_size, out.stat().st_size
    for p in (src, out, tmp / f"inproc-{name}.safetensors"):
        p.unlink(missing_ok=True)
    med = statistics.median
    t_exp, c_exp = med(m["wall_s"] for m in expands), med(m["cpu_s"] for m in expands)
    t_cp, c_cp = med(c[0] for c in copies), med(c[1] for c in copies)
    rss = max(m["peak_rss"] for m in expands)
    rss_target = 3 * largest + 0.5 * GB
    row = {
        "dtype": name,
        "params": cfg.n_params(),
        "grown_params": plan.cfg.n_params(),
        "src_MB": src_b / MB,
        "out_MB": out_b / MB,
        "generate_s": t_gen,
        "expand_s": t_exp,
        "copy_s": t_cp,
        "ratio": t_exp / t_cp,
        "ratio_ok": t_exp / t_cp <= 1.5,
        "peak_rss_MB": rss / MB,
        "largest_out_MB": largest / MB,
        "rss_target_MB": rss_target / MB,
        "rss_ok": rss <= rss_target,
        "startup_s": startup["wall_s"],
        "ratio_no_startup": (t_exp - startup["wall_s"]) / t_cp,
        "expand_cpu_s": c_exp,
        "copy_cpu_s": c_cp,
        "startup_cpu_s": startup["cpu_s"],
        "expand_runs_s": ";".join(f"{m['wall_s']:.2f}" for m in expands),
        "copy_runs_s": ";".join(f"{c[0]:.2f}" for c in copies),
    }
    return row, {"dtype": name, **{k: round(v, 3) for k, v in steps.items()}}


def plot(rows: list[dict], steps: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    keys = ["sha256", "read", "nan_check", "grow", "write_fsync", "other"]
    labels, y = [], 0
    for i, (r, s) in enumerate(zip(rows, steps)):
        ax.barh(y, r["startup_s"], color="lightgrey", label="interpreter + torch import" if i == 0 else None)
        ax.barh(
            y,
            r["expand_s"] - r["startup_s"],
            left=r["startup_s"],
            color="tab:blue",
            label="growtool expand (rest)" if i == 0 else None,
        )
        left = 0.0
        for j, k in enumerate(keys):
            ax.barh(y + 1, s[k], left=left, color=f"C{j + 1}", label=k if i == 0 else None)
            left += s[k]
        ax.barh(y + 2, r["copy_s"], color="black", label="file copy + fsync" if i == 0 else None)
        labels += [f"{r['dtype']}: growtool expand", f"{r['dtype']}: in-process steps", f"{r['dtype']}: copy of output"]
        y += 3
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"expand {rows[0]['src_MB']:.0f} MB (float32) to 1.5x width, against a copy of the output", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    args = parse_args(
        "surgery",
        __doc__,
        lambda p: p.add_argument(
            "--profile", action="store_true", help="also write a cProfile of the in-process expansion"
        ),
    )
    torch.manual_seed(0)
    cfg = llama_config(args.quick)
    width = cfg.width * 3 // 2
    repeats = 1 if args.quick else 3
    tmp = Path(args.out) / "tmp" / "surgery"
    tmp.mkdir(parents=True, exist_ok=True)
    rows, steps = [], []
    startup = run_measured([sys.executable, "-c", "import growtool.cli"])  # interpreter + torch import
    try:
        for dt in (torch.float32, torch.bfloat16):
            row, st = bench_dtype(cfg, dt, width, repeats, startup, tmp, args)
            rows.append(row)
            steps.append(st)
            print(
                f"{row['dtype']}: expand {row['expand_s']:.2f}s, copy {row['copy_s']:.2f}s, "
                f"peak RSS {row['peak_rss_MB']:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    d = args.dir
    write_csv(d / "surgery.csv", rows)
    write_csv(d / "steps.csv", steps)
    write_json(
        d / "surgery.json",
        {
            "config": cfg.to_hf(),
            "width_to": width,
            "repeats": repeats,
            "quick": args.quick,
            "machine": machine(),
            "rows": rows,
            "steps": steps,
        },
    )
    plot(rows, steps, d / "surgery.png")
    show = [
        "dtype",
        "src_MB",
        "out_MB",
        "expand_s",
        "copy_s",
        "ratio",
        "ratio_ok",
        "startup_s",
        "ratio_no_startup",
        "expand_cpu_s",
        "copy_cpu_s",
        "peak_rss_MB",
        "largest_out_MB",
        "rss_target_MB",
        "rss_ok",
    ]
    print(
        table(
            [{k: r[k] for k in show} for r in rows],
            f"growtool expand d{cfg.width} -> d{width} (llama, {cfg.n_params():,} params), median of {repeats}",
        )
    )
    print()
    print(table(steps, "in-process steps (seconds)"))
    print(f"\nwrote {d}/surgery.csv, steps.csv, surgery.json, surgery.png")


if __name__ == "__main__":
    main()
