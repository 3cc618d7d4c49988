"""Small helpers shared by the bench scripts: arguments, results folder, CSV/JSON, tables,
timing, and running a command while measuring its wall time and peak resident memory.

Every bench script is run as ``python bench/<name>.py [--quick] [--out bench/results]`` and
writes its files under ``<out>/<name>/``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
LOAD_AT_START = os.getloadavg()  # other jobs on the machine inflate timings: record how busy it was


def make_parser(name: str, doc: str, extra=None) -> argparse.ArgumentParser:
    """A bench script's parser: ``--quick`` / ``--out``, and what ``extra(parser)`` adds."""
    p = argparse.ArgumentParser(prog=f"bench/{name}.py", description=doc)
    p.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results root (default bench/results)")
    if extra:
        extra(p)
    return p


def parse_args(name: str, doc: str, extra=None) -> argparse.Namespace:
    """Parse ``make_parser``'s options from the command line. Sets ``args.dir``."""
    args = make_parser(name, doc, extra).parse_args()
    args.dir = results_dir(args.out, name)
    return args


def results_dir(out: str | os.PathLike, name: str) -> Path:
    d = Path(out) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def write_json(path: Path, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def machine() -> dict:
    """What the numbers were measured on."""
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "loadavg_1m_start": LOAD_AT_START[0],
        "loadavg_1m_end": os.getloadavg()[0],
        "argv": " ".join(sys.argv),
    }


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def table(rows: list[dict], title: str = "") -> str:
    """A plain fixed-width text table of ``rows`` (dicts with the same keys)."""
    if not rows:
        return title
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    out = [title] if title else []
    out += [line(keys), line(["-" * w for w in widths])] + [line(c) for c in cells]
    return "\n".join(out)


def median_time(fn, repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall seconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def run_measured(cmd: list[str], stdin=None) -> dict:
    """Run ``cmd``; return its exit code, wall seconds, CPU seconds (user + system), peak RSS in
    bytes (this child only, from ``os.wait4``'s rusage: Linux reports ru_maxrss in KiB), minor
    page faults, and stdout / stderr text. CPU seconds are less sensitive than wall time to a busy machine."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=stdin, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": p.returncode,
            "wall_s": wall,
            "cpu_s": ru.ru_utime + ru.ru_stime,
            "peak_rss": ru.ru_maxrss * 1024,
            "minflt": ru.ru_minflt,  # minor page faults (first touches of memory, among others)
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (includes kernel time of copies)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


MB = 1024 * 1024


def train_phase(P: dict, ckpt, out, tokens: int, seed: int, **kw) -> tuple[dict, list[dict]]:
    """One ``growtool.train`` phase of a benchmark on ``P``'s data and sizes (batch, seq, lr, evals,
    eval_batches, work): enough steps for ``tokens``, one save at the end, no condensation metrics.
    ``kw`` go to ``train`` as they are (``P["tokenizer"]``, when set, too); the LR schedule is
    ``P["schedule"]``, else cosine (the trainer's default when most results in bench/results were
    recorded; its default is wsd now).
    Returns (train's summary, the run's metrics records)."""
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    steps = max(1, math.ceil(tokens / (P["batch"] * P["seq"])))
    kw.setdefault("schedule", P.get("schedule") or "cosine")  # the bench's --schedule, unless the phase sets one
    if kw["schedule"] == "wsd" and P.get("decay") is not None:  # the bench's decay (budget --decay, --decay-shape)
        kw.setdefault("decay_fraction", P["decay"])
        kw.setdefault("decay_shape", P.get("decay_shape", "linear"))
    s = train(
        ckpt,
        [P["data"]],
        out,
        steps=steps,
        batch=P["batch"],
        seq=P["seq"],
        lr=P["lr"],
        eval_every=max(1, steps // P["evals"]),
        eval_batches=P["eval_batches"],
        save_every=steps,
        metrics_every=10**9,
        seed=seed,
        device="cpu",
        progress=False,
        cache_dir=P["work"] + "/cache",
        **({"tokenizer": P["tokenizer"]} if P.get("tokenizer") else {}),
        **kw,
    )
    return s, read_metrics(Path(out) / "metrics.jsonl")


def tokenizer(text: str, vocab: int, cache: Path) -> str:
    """A byte-level BPE tokenizer.json of ``vocab`` ids trained on the file ``text``, written once into ``cache``."""
    key = hashlib.sha256(f"{Path(text).read_bytes()}:{vocab}".encode()).hexdigest()[:12]
    out = cache / f"bpe-{vocab}-{key}.json"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"])
        tok.train([text], trainer)
        tmp = out.with_suffix(".tmp")
        tok.save(str(tmp))
        tmp.replace(out)
    return str(out)
