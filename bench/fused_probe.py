"""What a fused grow-and-round loop would save: a probe for a decision, not a part of growtool.

growtool grows a tensor with torch operations, one pass over memory each. For the old-unit rows of
an FFN reader grown by srio (every row [x; 0] rotated and rounded to bfloat16) that is five
passes: convert x to float32, multiply by the folded norm gain, sum the row, add the rotation's
constant, round into the output (plus one constant written over the new half). This script times
that path (growtool's own ``ops.fold_gain`` and ``ops.rotate_half_into``, by row blocks of about
1M elements as ``growth._row_blocks`` makes them) against one C loop that does the same
arithmetic per row while the row sits in the cache, compiled here with the system's C compiler.

The loop sums each row in its own order, not torch's, so a few output elements differ by one
bfloat16 ulp; the script counts them. A fused loop in growtool would need a compiled extension
(a build dependency) and, to keep the bytes, torch's summation order: both are the maintainers'
decision (bench/README, section 3, round 10).

    python bench/fused_probe.py          # ~10 s; bench/results/fused_probe/fused_probe.json
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import parse_args, write_json

from growtool import ops

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float widen(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t round_bf16(float f) {  /* to nearest, ties to even (no NaN here) */
    uint32_t u; memcpy(&u, &f, 4); u += 0x7FFF + ((u >> 16) & 1); return (uint16_t)(u >> 16);
}

/* out[r] = R(eps) [src[r] * gain; 0], rounded to bfloat16: src rows x d, out rows x D. */
void reader_rows(const uint16_t *src, const float *gain, uint16_t *out, int64_t rows, int64_t d,
                 int64_t D, float eps, float *row) {
    float s = sqrtf(1.f - eps * eps), rd = 1.f / sqrtf((float)d), rg = 1.f / sqrtf((float)(D - d));
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *x = src + r * d;
        uint16_t *o = out + r * D;
        float lanes[16] = {0}, a = 0;
        for (int64_t j = 0; j + 16 <= d; j += 16)
            for (int k = 0; k < 16; k++) { float v = widen(x[j + k]) * gain[j + k]; row[j + k] = v; lanes[k] += v; }
        for (int64_t j = d - d % 16; j < d; j++) { row[j] = widen(x[j]) * gain[j]; a += row[j]; }
        for (int k = 0; k < 16; k++) a += lanes[k];
        a *= rd;
        float c_old = (eps - 1.f) * a * rd, c_new = s * a * rg;
        for (int64_t j = 0; j < d; j++) o[j] = round_bf16(row[j] + c_old);
        uint16_t filled = round_bf16(c_new);
        for (int64_t j = d; j < D; j++) o[j] = filled;
    }
}
"""


def build(tmp: Path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        sys.exit("fused_probe: no C compiler (cc, gcc or clang) on PATH")
    (tmp / "probe.c").write_text(SOURCE)
    subprocess.run(
        [cc, "-O3", "-march=native", "-shared", "-fPIC", "-o", tmp / "probe.so", tmp / "probe.c"], check=True
    )
    lib = ctypes.CDLL(str(tmp / "probe.so"))
    p, n = ctypes.c_void_p, ctypes.c_int64
    lib.reader_rows.argtypes = [p, p, p, n, n, n, ctypes.c_float, p]
    return lib


def timed(f, repeats: int) -> float:
    f()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    args = parse_args("fused_probe", __doc__.splitlines()[0])
    torch.set_num_threads(1)  # as a streaming expand runs torch
    d, D, rows = (256, 384, 704) if args.quick else (2048, 3072, 5632)  # the 4 GB folder's FFN readers
    eps = math.sqrt(d / D)  # srio's angle for a LayerNorm model; any angle costs the same
    gen = torch.Generator().manual_seed(0)
    src = (0.02 * torch.randn(rows, d, generator=gen)).to(torch.bfloat16)
    gain = 1 + 0.1 * torch.randn(d, generator=gen)
    out = torch.empty(rows, D, dtype=torch.bfloat16)
    per = max(1, (1 << 20) // D)  # growth.ROW_BLOCK grown elements a block
    block, row = torch.empty(per, D), torch.empty(d)

    def with_torch():
        for r0 in range(0, rows, per):
            n = min(per, rows - r0)
            x = ops.fold_gain(src[r0 : r0 + n], gain, 1, out=block[:n, :d])
            ops.rotate_half_into(out[r0 : r0 + n], x, d, eps, 1, zero_new=True)

    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))

        def fused():
            lib.reader_rows(src.data_ptr(), gain.data_ptr(), out.data_ptr(), rows, d, D, eps, row.data_ptr())

        t_torch, t_fused = timed(with_torch, 10), timed(fused, 10)
        with_torch()
        want = out.clone()
        fused()
    differ = int((out != want).sum())
    gap = float((out.float() - want.float()).abs().max())  # where the sums' order moved a rounding
    result = {
        "shape": [rows, D],
        "from": [rows, d],
        "torch_ms": 1e3 * t_torch,
        "fused_ms": 1e3 * t_fused,
        "torch_ns_per_out": 1e9 * t_torch / out.numel(),
        "fused_ns_per_out": 1e9 * t_fused / out.numel(),
        "speedup": t_torch / t_fused,
        "elements_differing": differ,
        "of": out.numel(),
        "max_abs_difference": gap,
        "output_rms": float(want.float().pow(2).mean().sqrt()),
    }
    print(
        f"FFN reader rows [x; 0], {rows} x {d} bf16 -> {rows} x {D} (one thread): torch {result['torch_ms']:.1f} ms "
        f"({result['torch_ns_per_out']:.2f} ns per output element), fused loop {result['fused_ms']:.1f} ms "
        f"({result['fused_ns_per_out']:.2f} ns): {result['speedup']:.1f}x; {differ} of {out.numel()} elements "
        f"differ (the sums' order), by at most {gap:.2g} (output RMS {result['output_rms']:.2g})"
    )
    write_json(args.dir / "fused_probe.json", result)
    print(f"wrote {args.dir / 'fused_probe.json'}")


if __name__ == "__main__":
    main()
