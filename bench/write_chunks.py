"""How fast bytes held in tensors reach the disk, by the size of each ``write()`` call: the
measurement behind ``checkpoint.WRITE_CHUNK``.

Writes ~1.9 GB of float32 tensors (48 x 40 MB; ``--quick``: 4 x 16 MB) to a file next to the
results with ``write()`` calls of 256 KB, 1 MB, 4 MB and 16 MB, then fsyncs, against
``shutil.copyfile`` + fsync of the same bytes, twice each in turn (``os.sync()`` before each).
Writes ``<out>/write_chunks/results.csv`` and prints the table (seconds, write + fsync).
"""

from __future__ import annotations

import os
import shutil
import time

import torch
from common import fsync_file, machine, parse_args, table, write_csv, write_json

CHUNKS = (256 << 10, 1 << 20, 4 << 20, 16 << 20)


def write(path, tensors, chunk: int) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for t in tensors:
            b = memoryview(t.numpy()).cast("B")
            for i in range(0, b.nbytes, chunk):
                f.write(b[i : i + chunk])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def copy(src, dst) -> float:
    t0 = time.perf_counter()
    shutil.copyfile(src, dst)
    fsync_file(dst)
    return time.perf_counter() - t0


def main():
    args = parse_args("write_chunks", __doc__.splitlines()[0])
    n, size = (4, 4 << 20) if args.quick else (48, 10_000_000)
    tensors = [torch.randn(size) for _ in range(n)]
    path, dst = args.dir / "tmp-write.bin", args.dir / "tmp-copy.bin"
    rows = []
    try:
        for rep in range(2):
            for chunk in CHUNKS:
                os.sync()
                rows.append({"rep": rep, "how": f"write() of {chunk >> 10} KB", "seconds": write(path, tensors, chunk)})
            os.sync()
            rows.append({"rep": rep, "how": "shutil.copyfile", "seconds": copy(path, dst)})
            os.remove(dst)
    finally:
        for p in (path, dst):
            if p.exists():
                os.remove(p)
    gb = n * size * 4 / 2**30
    write_csv(args.dir / "results.csv", rows)
    write_json(args.dir / "results.json", {"gigabytes": gb, "machine": machine(), "rows": rows})
    print(table(rows, f"{gb:.2f} GB written from tensors, then fsync"))
    print(f"wrote {args.dir}/results.csv, results.json")


if __name__ == "__main__":
    main()
