"""Surgery speed and memory: ``growtool expand`` of a ~1 GB Llama-shaped checkpoint to 1.5x width,
against a plain file copy of the output on the same disk.

For float32 and bfloat16 (same parameter count) it
  1. writes a random Llama checkpoint tensor by tensor (the generator holds one tensor at a time);
  2. runs ``growtool expand SRC --width 1.5d -o OUT`` as a subprocess: wall time and peak RSS
     (the child's own ru_maxrss from ``os.wait4``), growtool's modules compiled to bytecode first
     as ``pip install`` does (``compile_growtool``);
  3. right after it, copies OUT to a temporary name on the same disk (``shutil.copyfile`` + fsync,
     as expand fsyncs): each expand is paired with a copy of its output (every other pair copies
     first, the previous identical output, then expands: the order alternates);
  4. calls ``os.sync()`` before each timed expand and each timed copy, so that the writeback of the
     previous file does not land in the next measurement;
  5. repeats 2-4 (3 pairs; 1 with --quick) and reports medians and the median of the per-pair
     ratios: expand / copy, and (expand - start-up) / copy with start-up = ``python -c "import
     torch"`` timed in the same environment (median of 3; once with --quick; issue 10's targets: <= 1.2 float32,
     <= 1.3 bfloat16) and, checked against the targets, with start-up = the same import ended by
     ``os._exit`` (that run spends 0.3-0.5 s after the import collecting torch's objects at exit,
     which growtool does not pay), timed in each pair just before its expand (and, as
     ``pair_ratio_no_start_import``, once at the start of the run), and peak RSS against 3 x the
     largest output tensor + 0.5 GB (beside the peak RSS of the import alone, the floor under it:
     larger for a CUDA build of torch);
  6. runs the same expansion in-process through the library's ``expand`` pipeline with its
     ``timings`` hook to show where the time goes: reading and growing (summed over the producing
     threads, which overlap the writing), the wall of the streaming save and, inside it, the wait
     for the source hash, which a background thread computes meanwhile.

``--quick`` uses a ~120 MB checkpoint. ``--profile`` also writes a cProfile of the in-process run.

``--sharded-gb N`` instead generates a bfloat16 Hugging Face folder of about N GB (config.json,
model-0000i-of-0000K.safetensors shards of at most 2 GB, model.safetensors.index.json; d2048, as
many layers as it takes), expands it to 1.5x width into a folder (``--shard-size 2GB``), copies the
output folder (every file copied and fsynced) right after, and reports expand / copy with start-up
included (issue 10: <= 1.3) and peak RSS (``--repeats`` pairs, default 1). Files: sharded.csv,
sharded.json. Every generated file is deleted at the end.

``--against PROGRAM`` instead alternates bf16 expands of the 1 GB checkpoint by this environment's
growtool and by PROGRAM (another install's ``growtool``, e.g. an older commit's in its own venv),
then folds (``--alpha 0.5``) of the expansion, writing to tmpfs so that the disk is out of it:
per command, medians of wall, CPU and page faults per arm, the per-pair gains, and whether both
wrote the same bytes (``--repeats`` pairs, default 10). Files: against.csv, against.json.
"""

from __future__ import annotations

import cProfile
import hashlib
import io
import json
import os
import pstats
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import MB, cpu_seconds, fsync_file, machine, parse_args, run_measured, table, write_csv, write_json

from growtool import surgery
from growtool.grow import recipes
from growtool.grow.plan import build_plan
from growtool.io import checkpoint
from growtool.io.header import DTYPE_NAME
from growtool.nn.config import ModelConfig
from growtool.nn.families import expected_shapes, tensor_specs

GROWTOOL = str(Path(sys.executable).with_name("growtool"))
GB = 1024**3
TARGET = {"float32": 1.2, "bfloat16": 1.3}  # issue 10: (expand - start-up) / copy
SHARDED_TARGET = 1.3  # issue 10: expand / copy, start-up included, >= 4 GB bf16 folder


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


def sharded_config(gb: float) -> ModelConfig:
    """A d2048 Llama (16 heads / 4 KV heads, FFN 5632, vocab 32000) with enough layers for ``gb``
    GB (10^9 bytes) of bfloat16 weights."""
    base = ModelConfig(
        "llama",
        vocab_size=32000,
        width=2048,
        layers=1,
        heads=16,
        kv_heads=4,
        head_dim=128,
        ffn=5632,
        context=4096,
        norm_eps=1e-5,
        tie=False,
    )
    two = base.replace(layers=2)
    per_layer = two.n_params() - base.n_params()
    fixed = base.n_params() - per_layer
    layers = max(1, -(-int(gb * 1e9 / 2 - fixed) // per_layer))
    return base.replace(layers=layers)


def compile_growtool() -> bool:
    """Compile growtool's modules to bytecode, as ``pip install`` does for an installed package (an
    editable install is compiled at its first import instead). Where PYTHONDONTWRITEBYTECODE is set,
    as on the machine of bench/README's figures, an editable install is never compiled and every
    start compiles its 14 modules from source: 35 ms that no installed growtool pays."""
    import compileall

    import growtool

    return bool(compileall.compile_dir(Path(growtool.__file__).parent, quiet=1))


def startup(repeats: int = 3) -> dict:
    """Start-up in this environment (medians of ``repeats``): the interpreter plus ``import torch``
    (issue 10's start-up) and ``growtool --help`` (growtool's own, imports included), growtool's
    bytecode compiled first (``compile_growtool``)."""
    compiled = compile_growtool()
    torch_ = [run_measured([sys.executable, "-c", "import torch"]) for _ in range(repeats)]
    # the same without the interpreter's exit: `python -c "import torch"` spends 0.3-0.4 s here
    # after the import, collecting torch's objects at shutdown; growtool freezes them (cli.py) and
    # does not pay it, so subtracting that run flatters expand by as much
    import_only = [run_measured(IMPORT_ONLY) for _ in range(repeats)]
    tool = [run_measured([GROWTOOL, "--help"]) for _ in range(repeats)]
    med = statistics.median
    return {
        "wall_s": med(m["wall_s"] for m in torch_),
        "cpu_s": med(m["cpu_s"] for m in torch_),
        "growtool_wall_s": med(m["wall_s"] for m in tool),
        "import_only_wall_s": med(m["wall_s"] for m in import_only),
        "import_only_rss_MB": med(m["peak_rss"] for m in import_only) / MB,  # the floor of expand's peak
        "runs_s": ";".join(f"{m['wall_s']:.2f}" for m in torch_),
        "growtool_runs_s": ";".join(f"{m['wall_s']:.2f}" for m in tool),
        "growtool_module": which_growtool(),
        "bytecode_compiled": compiled,
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
    }


def which_growtool() -> str:
    """The growtool module this environment runs (a note is printed when it is not this checkout's)."""
    where = run_measured([sys.executable, "-c", "import growtool; print(growtool.__file__)"])["stdout"].strip()
    if where and not where.startswith(str(Path(__file__).resolve().parent.parent)):
        print(f"note: the growtool run is {where}", file=sys.stderr)
    return where


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
            "dtype": DTYPE_NAME[dtype],
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


def warm(path: Path) -> None:
    """Read ``path`` (a file, or a folder's files) once, so that the timed copy reads it from the
    page cache: expand writes past the cache (O_DIRECT), and a copy reading from the disk would
    take longer than the copy of a file just written through the cache (this benchmark's baseline
    until then)."""
    for f in sorted(path.iterdir()) if path.is_dir() else [path]:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(1 << 24):
                pass


def timed_copy(src: Path, dst: Path) -> tuple[float, float]:
    """(wall, CPU) seconds to copy ``src`` (a file, or a folder file by file) to ``dst`` and fsync
    it, after an ``os.sync()``, with ``src`` in the page cache (``warm``; then ``dst`` is removed)."""
    warm(src)
    os.sync()
    t0, c0 = time.perf_counter(), cpu_seconds()
    if src.is_dir():
        dst.mkdir()
        for f in sorted(src.iterdir()):
            shutil.copyfile(f, dst / f.name)
            fsync_file(dst / f.name)
        fsync_file(dst)
    else:
        shutil.copyfile(src, dst)
        fsync_file(dst)
    dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
    shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    return dt, dc


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


IMPORT_ONLY = [sys.executable, "-c", "import os, torch; os._exit(0)"]  # the start-up subtracted (see ``startup``)


def timed_pairs(cmd: list[str], out: Path, copy_to: Path, repeats: int) -> list[tuple[dict, tuple, float]]:
    """``repeats`` x (an expand subprocess and a copy of its output, one right after the other),
    each timed after an ``os.sync()``, and the import-only start-up timed just before the expand
    (the same import took 1.09-1.61 s from one minute to the next here: a start-up measured once
    at the start would be minutes stale). The order alternates: expand then copy in the 1st, 3rd,
    ... pair, copy (of the previous, identical output) then expand in the 2nd, 4th, ... - the disk
    of this machine writes at very different speeds from one minute to the next (a 1.9 GB copy took
    1.1-5.6 s in a row), and whichever goes second would otherwise always meet the state the first
    left. Returns (expand, copy (wall, CPU), import-only wall) per pair."""
    pairs = []
    for i in range(repeats):
        copy_first = i % 2 == 1 and out.exists()
        c = timed_copy(out, copy_to) if copy_first else None
        remove(out)
        os.sync()
        imp = run_measured(IMPORT_ONLY)["wall_s"]
        m = run_measured(cmd)
        if m["rc"] != 0:
            raise SystemExit(f"growtool expand failed (exit {m['rc']}): {m['stderr'].strip()[-2000:]}")
        pairs.append((m, c if copy_first else timed_copy(out, copy_to), imp))
    return pairs


def pair_summary(pairs, start: dict) -> dict:
    """Medians over the pairs: expand, copy, the ratio of the medians and the median of the per-pair
    ratios, with and without the start-up (``pair_ratio_no_import``: each pair's own import-only
    time subtracted, what the targets are checked against; ``..._start_import``: the import timed
    at the start of the run instead)."""
    med = statistics.median
    t_exp, t_cp = med(m["wall_s"] for m, _, _ in pairs), med(c[0] for _, c, _ in pairs)
    su = start["wall_s"]
    return {
        "expand_s": t_exp,
        "copy_s": t_cp,
        "ratio": t_exp / t_cp,
        "pair_ratio": med(m["wall_s"] / c[0] for m, c, _ in pairs),
        "startup_s": su,
        "growtool_startup_s": start["growtool_wall_s"],
        "ratio_no_startup": (t_exp - su) / t_cp,
        "pair_ratio_no_startup": med((m["wall_s"] - su) / c[0] for m, c, _ in pairs),
        "import_only_s": med(i for _, _, i in pairs),
        "pair_ratio_no_import": med((m["wall_s"] - i) / c[0] for m, c, i in pairs),
        "pair_ratio_no_start_import": med((m["wall_s"] - start["import_only_wall_s"]) / c[0] for m, c, _ in pairs),
        "expand_cpu_s": med(m["cpu_s"] for m, _, _ in pairs),
        "copy_cpu_s": med(c[1] for _, c, _ in pairs),
        "startup_cpu_s": start["cpu_s"],
        "peak_rss_MB": max(m["peak_rss"] for m, _, _ in pairs) / MB,
        "import_only_rss_MB": start["import_only_rss_MB"],
        "expand_runs_s": ";".join(f"{m['wall_s']:.2f}" for m, _, _ in pairs),
        "copy_runs_s": ";".join(f"{c[0]:.2f}" for _, c, _ in pairs),
        "import_runs_s": ";".join(f"{i:.2f}" for _, _, i in pairs),
    }


def instrumented_expand(src: Path, out: Path, width: int, profile_to: Path | None = None) -> dict:
    """The library's own ``expand`` (``growtool.surgery.run_expand``: the pipeline ``growtool
    expand`` runs, producers, write path and all) in-process, with its ``timings`` hook: seconds
    spent reading (with the NaN / Inf check) and growing, summed over the ``producers`` threads
    (they overlap each other and the writing); the wall of the streaming save (``save``, which
    includes ``sha256_wait``, the wait for the source hash at its end); ``setup`` = ``total`` -
    ``save`` (reading the header, the plan)."""
    t: dict = {}
    prof = cProfile.Profile() if profile_to else None
    if prof:
        prof.enable()
    job = surgery.prepare_expand(str(src), surgery.Request(width=width, out=str(out), recipe="srio", force=True))
    surgery.run_expand(job, timings=t)
    t["setup"] = t["total"] - t["save"]
    if prof:
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
        s.write("\n---- by own time ----\n")
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        profile_to.write_text(s.getvalue())
    return t


def bench_dtype(
    cfg: ModelConfig, dtype: torch.dtype, width: int, repeats: int, start: dict, tmp: Path, args
) -> tuple[dict, dict]:
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    src, out, cp = tmp / f"src-{name}.safetensors", tmp / f"out-{name}.safetensors", tmp / f"copy-{name}.bin"
    t0 = time.perf_counter()
    write_random_checkpoint(src, cfg, dtype)
    t_gen = time.perf_counter() - t0
    plan = build_plan(cfg, recipes.load("srio"), width, dtype=dtype)
    largest = max(dtype.itemsize * torch.Size(s).numel() for _, s, _ in plan.outputs())
    cmd = [GROWTOOL, "expand", str(src), "--width", str(width), "-o", str(out), "--quiet"]
    pairs = timed_pairs(cmd, out, cp, repeats)
    os.sync()
    steps = instrumented_expand(
        src, tmp / f"inproc-{name}.safetensors", width, args.dir / f"profile-{name}.txt" if args.profile else None
    )
    src_b, out_b = src.stat().st_size, out.stat().st_size
    for p in (src, out, tmp / f"inproc-{name}.safetensors"):
        p.unlink(missing_ok=True)
    summary = pair_summary(pairs, start)
    rss_target = 3 * largest + 0.5 * GB
    row = {
        "dtype": name,
        "params": cfg.n_params(),
        "grown_params": plan.cfg.n_params(),
        "src_MB": src_b / MB,
        "out_MB": out_b / MB,
        "generate_s": t_gen,
        **summary,
        "target": TARGET[name],
        "target_ok": summary["pair_ratio_no_import"] <= TARGET[name],  # the import-only start-up of each pair
        "largest_out_MB": largest / MB,
        "rss_target_MB": rss_target / MB,
        "rss_ok": summary["peak_rss_MB"] * MB <= rss_target,
    }
    return row, {"dtype": name, **{k: round(v, 3) for k, v in steps.items()}}


# ---- two growtools, alternating, with the disk taken out ---------------------------------------


def compile_other(program: str) -> None:
    """Compile the other growtool's modules to bytecode, as ``compile_growtool`` does this one's:
    an editable install where PYTHONDONTWRITEBYTECODE is set compiles them from source at every
    start. In round 9's null comparison (fold, the same code in both arms) the uncompiled arm
    took 0.17 s of wall and 0.26 s of CPU more per pair (medians, 10 pairs); compiled, 0.04 s and
    0.05 s (20 pairs)."""
    python = Path(program).with_name("python")
    code = "import compileall, os, growtool; compileall.compile_dir(os.path.dirname(growtool.__file__), quiet=1)"
    subprocess.run([str(python), "-c", code], cwd="/", check=True)  # cwd /: not this checkout's growtool


def bench_against(other: str, cfg: ModelConfig, width: int, repeats: int, tmp: Path) -> list[dict]:
    """``repeats`` pairs of bf16 expands of the same source, one by this environment's growtool and
    one by ``other`` (another install's ``growtool``, e.g. an older commit's), the order alternating,
    the output written to tmpfs (/dev/shm where there is one): with no disk to wait for, the stream
    is as CPU-bound as on a disk faster than the growth, so what one version saves shows. Then the
    same for ``fold --alpha 0.5`` of this growtool's expansion (a gated model: its writers are
    scaled). Reports per command and arm the medians of wall, CPU seconds and minor page faults,
    the medians of the per-pair differences (other - this), and whether both wrote the same bytes
    (sha256)."""
    src, grown = tmp / "src-bfloat16.safetensors", tmp / "grown-bfloat16.safetensors"
    write_random_checkpoint(src, cfg, torch.bfloat16)
    compile_other(other)
    out_dir = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp
    arms = {"this": GROWTOOL, "other": other}
    rows, expand = [], [str(src), "--width", str(width)]
    for op, args in (("expand", expand), ("fold", [str(grown), "--alpha", "0.5"])):
        if op == "fold":  # its input: this growtool's expansion
            made = run_measured([GROWTOOL, "expand", *expand, "-o", str(grown), "--quiet"])
            if made["rc"] != 0:
                raise SystemExit(f"growtool expand failed (exit {made['rc']}): {made['stderr'].strip()[-2000:]}")
        runs: dict[str, list[dict]] = {k: [] for k in arms}
        digests = {}
        for i in range(repeats):
            for arm in list(arms) if i % 2 == 0 else list(arms)[::-1]:
                out = out_dir / f"growtool-against-{os.getpid()}-{arm}.safetensors"
                m = run_measured([arms[arm], op, *args, "-o", str(out), "--quiet"])
                if m["rc"] != 0:
                    raise SystemExit(f"{arms[arm]} {op} failed (exit {m['rc']}): {m['stderr'].strip()[-2000:]}")
                runs[arm].append({k: m[k] for k in ("wall_s", "cpu_s", "minflt")})
                if i == 0:
                    digests[arm] = hashlib.sha256(out.read_bytes()).hexdigest()
                out.unlink()
        med = statistics.median
        row = {"command": op, "pairs": repeats, "other": other, "same_bytes": digests["this"] == digests["other"]}
        for key in ("wall_s", "cpu_s", "minflt"):
            for arm in arms:
                row[f"{arm}_{key}"] = med(r[key] for r in runs[arm])
            row[f"gain_{key}"] = med(o[key] - t[key] for t, o in zip(runs["this"], runs["other"]))
        row["this_runs_s"] = ";".join(f"{r['wall_s']:.2f}" for r in runs["this"])
        row["other_runs_s"] = ";".join(f"{r['wall_s']:.2f}" for r in runs["other"])
        rows.append(row)
    src.unlink()
    grown.unlink()
    return rows


# ---- a >= 4 GB bfloat16 Hugging Face folder ----------------------------------------------------


def write_sharded_folder(folder: Path, cfg: ModelConfig, shard_bytes: int = 2 * 10**9, seed: int = 0) -> int:
    """An HF-style bfloat16 folder: config.json, model-0000i-of-0000K.safetensors (at most
    ``shard_bytes`` of tensors each, metadata {"format": "pt"} as transformers writes),
    model.safetensors.index.json. Tensors are written one at a time. Returns the number of shards."""
    folder.mkdir(parents=True)
    shapes, specs = expected_shapes(cfg), tensor_specs(cfg)
    shards = checkpoint.plan_shards([(n, s, torch.bfloat16) for n, s in shapes.items()], shard_bytes)
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for k, part in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, _ in part:
            nb = 2 * torch.Size(shape).numel()
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = fname
        total += off
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(folder / fname, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for name, shape, _ in part:
                t = torch.randn(shape, generator=gen)
                t = 1 + 0.1 * t if specs[name].role == "norm_gain" else 0.02 * t
                f.write(t.to(torch.bfloat16).reshape(-1).view(torch.uint8).numpy().data)
                del t
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    hf = cfg.to_hf()
    hf.pop("growtool", None)  # a stock transformers config
    hf["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    os.sync()
    return len(shards)


def bench_sharded(gb: float, repeats: int, start: dict, tmp: Path) -> dict:
    cfg = sharded_config(gb)
    width = cfg.width * 3 // 2
    src, out, cp = tmp / "src-sharded", tmp / "out-sharded", tmp / "copy-sharded"
    for p in (src, out, cp):
        remove(p)
    try:
        t0 = time.perf_counter()
        n_src = write_sharded_folder(src, cfg)
        t_gen = time.perf_counter() - t0
        print(f"sharded: generated {n_src} shards in {t_gen:.0f} s", file=sys.stderr, flush=True)
        plan = build_plan(cfg, recipes.load("srio"), width, dtype=torch.bfloat16)
        largest = max(2 * torch.Size(s).numel() for _, s, _ in plan.outputs())
        cmd = [GROWTOOL, "expand", str(src), "--width", str(width), "-o", str(out), "--shard-size", "2GB", "--quiet"]
        pairs = timed_pairs(cmd, out, cp, repeats)
        size = lambda d: sum(f.stat().st_size for f in d.iterdir())  # noqa: E731
        src_b, out_b, n_out = size(src), size(out), len(list(out.glob("*.safetensors")))
    finally:
        for p in (src, out, cp):
            remove(p)
    summary = pair_summary(pairs, start)
    rss_target = 3 * largest + 0.5 * GB
    return {
        "dtype": "bfloat16",
        "layers": cfg.layers,
        "width_from": cfg.width,
        "width_to": width,
        "params": cfg.n_params(),
        "grown_params": plan.cfg.n_params(),
        "src_GB": src_b / 1e9,
        "src_shards": n_src,
        "out_GB": out_b / 1e9,
        "out_shards": n_out,
        "generate_s": t_gen,
        **summary,
        "target": SHARDED_TARGET,
        "target_ok": summary["pair_ratio"] <= SHARDED_TARGET,
        "largest_out_MB": largest / MB,
        "rss_target_MB": rss_target / MB,
        "rss_ok": summary["peak_rss_MB"] * MB <= rss_target,
    }


STEP_KEYS = ["save", "setup"]  # the wall: the streaming save, then load + plan before it (and after)


def plot(rows: list[dict], steps: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    labels, y = [], 0
    for i, (r, s) in enumerate(zip(rows, steps)):
        ax.barh(y, r["startup_s"], color="lightgrey", label="python + import torch" if i == 0 else None)
        ax.barh(
            y,
            r["expand_s"] - r["startup_s"],
            left=r["startup_s"],
            color="tab:blue",
            label="growtool expand (rest)" if i == 0 else None,
        )
        left = 0.0
        for j, k in enumerate(STEP_KEYS):
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


SHOW = [
    "expand_s",
    "copy_s",
    "ratio",
    "pair_ratio",
    "startup_s",
    "growtool_startup_s",
    "ratio_no_startup",
    "pair_ratio_no_startup",
    "import_only_s",
    "pair_ratio_no_import",
    "pair_ratio_no_start_import",
    "target",
    "target_ok",
    "expand_cpu_s",
    "copy_cpu_s",
    "peak_rss_MB",
    "import_only_rss_MB",
    "largest_out_MB",
    "rss_target_MB",
    "rss_ok",
]


def main():
    def extra(p):
        p.add_argument("--profile", action="store_true", help="also write a cProfile of the in-process expansion")
        p.add_argument("--sharded-gb", type=float, default=None, help="only the sharded bf16 HF folder of ~N GB")
        p.add_argument("--repeats", type=int, default=None, help="expand + copy pairs (3; 1 with --quick / sharded)")
        p.add_argument("--against", default=None, help="only: alternate bf16 expands with this other growtool program")

    args = parse_args("surgery", __doc__, extra)
    torch.manual_seed(0)
    tmp = Path(args.out) / "tmp" / "surgery"
    tmp.mkdir(parents=True, exist_ok=True)
    d = args.dir
    if args.against:  # no start-up timings: both arms pay their own start-up in every run
        compile_growtool()
        which_growtool()
        cfg = llama_config(args.quick)
        repeats = args.repeats or (1 if args.quick else 10)
        try:
            rows = bench_against(args.against, cfg, cfg.width * 3 // 2, repeats, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        write_csv(d / "against.csv", rows)
        write_json(d / "against.json", {"config": cfg.to_hf(), "machine": machine(), "rows": rows})
        print(table(rows, f"this growtool against {args.against}: bf16 expand and fold to tmpfs, {repeats} pair(s)"))
        print(f"\nwrote {d}/against.csv, against.json")
        return
    start = startup(1 if args.quick else 3)
    if args.sharded_gb:
        repeats = args.repeats or 1
        try:
            row = bench_sharded(args.sharded_gb, repeats, start, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        write_csv(d / "sharded.csv", [row])
        write_json(
            d / "sharded.json",
            {"sharded_gb": args.sharded_gb, "repeats": repeats, "startup": start, "machine": machine(), "row": row},
        )
        print(
            table(
                [{k: row[k] for k in ["src_GB", "src_shards", "out_GB", "out_shards", *SHOW]}],
                f"growtool expand of a {row['src_GB']:.2f} GB bf16 HF folder (llama d{row['width_from']} x "
                f"{row['layers']} layers) -> d{row['width_to']}, {repeats} pair(s)",
            )
        )
        print(f"\nwrote {d}/sharded.csv, sharded.json")
        return
    cfg = llama_config(args.quick)
    width = cfg.width * 3 // 2
    repeats = args.repeats or (1 if args.quick else 3)
    rows, steps = [], []
    try:
        for dt in (torch.float32, torch.bfloat16):
            row, st = bench_dtype(cfg, dt, width, repeats, start, tmp, args)
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
    write_csv(d / "surgery.csv", rows)
    write_csv(d / "steps.csv", steps)
    write_json(
        d / "surgery.json",
        {
            "config": cfg.to_hf(),
            "width_to": width,
            "repeats": repeats,
            "quick": args.quick,
            "startup": start,
            "machine": machine(),
            "rows": rows,
            "steps": steps,
        },
    )
    plot(rows, steps, d / "surgery.png")
    print(
        table(
            [{k: r[k] for k in ["dtype", "src_MB", "out_MB", *SHOW]} for r in rows],
            f"growtool expand d{cfg.width} -> d{width} (llama, {cfg.n_params():,} params), {repeats} pairs",
        )
    )
    print()
    print(table(steps, "in-process steps (seconds)"))
    print(f"\nwrote {d}/surgery.csv, steps.csv, surgery.json, surgery.png")


if __name__ == "__main__":
    main()
