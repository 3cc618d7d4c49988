"""Peak memory of reading hostile JSONL: one record on one line of 1 GiB, and a 10 MB ``.jsonl.gz``
that inflates to one line of about 10 GB (issue 41, cause 5). A JSONL line is read up to
``GROWTOOL_MAX_LINE`` bytes (default ``readers.MAX_LINE``, 64 MiB) and refused past it, so neither is
ever held whole; a third case measures an accepted line just under the bound, tokenised (the most a
JSONL record costs).

Each case runs ``corpus.load`` with the byte tokenizer in a fresh child process and reports its peak
RSS (``ru_maxrss``) and the peak over the baseline after the imports. The files are written streamed
into a temporary folder and deleted afterwards (``--quick``: 1/16 of each size, bound 4 MiB).
Writes ``<out>/jsonl_memory/results.csv`` and ``results.json`` and prints the table.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, parse_args, table, write_csv, write_json

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys
from growtool.nn.errors import GrowError
from growtool.tokenizer import get_tokenizer
from growtool.training import corpus
tok = get_tokenizer("byte")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    c = corpus.load([sys.argv[1]], tok, sys.argv[2], 256)
    outcome = f"read, {len(c.tokens):,} tokens"
except GrowError as e:
    outcome = "refused: " + str(e).split(": ", 2)[-1][:70]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kib": base, "peak_kib": peak, "outcome": outcome}))
"""

MIB = 1 << 20


def one_line(path: Path, size: int) -> None:
    """A JSONL file of one record whose line is ``size`` bytes, written in 16 MiB pieces."""
    head, tail = b'{"text": "', b'"}\n'
    left = size - len(head) - len(tail)
    with open(path, "wb") as fh:
        fh.write(head)
        piece = b"x" * (16 * MIB)
        while left > 0:
            fh.write(piece[: min(left, len(piece))])
            left -= len(piece)
        fh.write(tail)


def gzip_bomb(path: Path, size: int) -> int:
    """A ``.jsonl.gz`` of about ``size`` bytes inflating to one line: gzip members concatenated (each
    inflates 16 MiB of ``x``; a gzip reader joins members). Returns the inflated size."""
    member = gzip.compress(b"x" * (16 * MIB), 9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(b'{"text": "'))
        n = 0
        while fh.tell() + len(member) <= size:
            fh.write(member)
            n += 1
    return 10 + n * 16 * MIB


def measure(path: Path, env: dict) -> dict:
    cache = tempfile.mkdtemp(prefix="jsonl-cache-")
    try:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), cache], capture_output=True, text=True, env=env, check=True
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return {
        "peak_rss_mib": round(got["peak_kib"] / 1024),
        "over_baseline_mib": round((got["peak_kib"] - got["base_kib"]) / 1024),
        "outcome": got["outcome"],
    }


def main() -> None:
    args = parse_args("jsonl_memory", __doc__)
    scale = 16 if args.quick else 1
    bound = (64 * MIB) // scale
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "GROWTOOL_MAX_LINE": str(bound)}
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="jsonl-memory-"))
    try:
        cases = [
            ("one line of 1 GiB", "line.jsonl", lambda p: one_line(p, (1 << 30) // scale), None),
            ("10 MB gzip bomb", "bomb.jsonl.gz", lambda p: gzip_bomb(p, 10_000_000 // scale), None),
            ("a line just under the bound", "ok.jsonl", lambda p: one_line(p, bound - 16), None),
        ]
        for name, fname, make, _ in cases:
            path = tmp / fname
            inflated = make(path)
            row = {"case": name, "file_mib": round(path.stat().st_size / MIB, 1)}
            if inflated:
                row["inflated_mib"] = round(inflated / MIB)
            row.update(bound_mib=bound / MIB, **measure(path, env))
            path.unlink()
            rows.append(row)
            print(row, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_csv(args.dir / "results.csv", rows)
    write_json(args.dir / "results.json", {"rows": rows, "machine": machine()})
    print(table(rows, "peak RSS of reading hostile JSONL (byte tokenizer, corpus.load in a fresh process)"))


if __name__ == "__main__":
    main()
