"""What a fused grow-and-round loop would save: a probe for a decision, not a part of growtool.

growtool grows a tensor with torch operations, one pass over memory each. For the old-unit rows of
an FFN reader grown by srio (every row [x; 0] rotated and rounded to bfloat16) that is five
passes: convert x to float32, multiply by the folded norm gain, sum the row, add the rotation's
constant, round into the output (plus one constant written over the new half). This script times
that path (growtool's own ``ops.fold_gain`` and ``ops.rotate_half_into``, by row blocks of about
1M elements as ``engine._row_blocks`` makes them) against one C loop that does the same
arithmetic per row while the row sits in the cache, compiled here with the system's C compiler.

The loop sums each row in its own order, not torch's, so a few output elements differ by one
bfloat16 ulp; the script counts them. Two exact variants keep every byte. One runs two C passes
around torch: convert and multiply by the gain into the float32 block, then (after torch sums the
rows and computes the constants, ``ops._shifts``, as ``ops.rotate_half_into`` does) add, round and
fill the new half. The other is one loop like the first, with torch's summation order mirrored in
C (ATen's cascade sum) and torch's float32 steps for the constants; the script checks the mirror
against torch's own sums on rows of many lengths (7 rows each of 1-199 elements and 14 longer
lengths, 1,484 sums) for float vectors of 8 and of 16 lanes and keeps the width that matches.
Element-wise float32 arithmetic gives the same bits in any order when compiled without fused
multiply-adds (``-ffp-contract=off``); only the sums' order matters. Any of these in growtool
would need a compiled extension (a build dependency): the maintainers' decision (bench/README,
section 3, rounds 10 and 11).

    python bench/fused_probe.py          # ~5 s; bench/results/fused_probe/fused_probe.json
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

from growtool.grow import ops

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

/* The order in which torch sums a contiguous float32 row of n elements (ATen's cascade sum,
   aten/src/ATen/native/cpu/SumKernel.cpp) with float vectors of LANES: row_sum takes the row's
   items (vectors of LANES, or single floats for a row shorter than one vector) 4 at a time into 4
   accumulators, whose sums move up 4 levels every 2^p groups (p = max(4, ceil(log2(groups)) / 4));
   then the leftover items go into the first accumulator and the 4 accumulators are added in turn.
   A row of vectors then sums its leftover floats from 0 and adds the vector's lanes in turn; the
   result is added to the 0 the output starts from. */
static int64_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t r = 0;
    for (uint64_t v = (uint64_t)x - 1; v; v >>= 1) r++;
    return r;
}

static void row_sum(const float *x, int64_t items, int w, float *sum) {  /* sum: w lanes */
    int64_t groups = items / 4, p = ceil_log2(groups) / 4, i = 0;
    if (p < 4) p = 4;
    int64_t step = (int64_t)1 << p;
    float acc[4][4][LANES];
    memset(acc, 0, sizeof acc);
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < w; l++) acc[0][k][l] += x[(i * 4 + k) * w + l];
        for (int lv = 1; lv < 4; lv++) {
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < w; l++) { acc[lv][k][l] += acc[lv - 1][k][l]; acc[lv - 1][k][l] = 0; }
            if (i & ((step - 1) << (lv * p))) break;
        }
    }
    for (; i < groups; i++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += x[(i * 4 + k) * w + l];
    for (int lv = 1; lv < 4; lv++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += acc[lv][k][l];
    for (int64_t v = groups * 4; v < items; v++)
        for (int l = 0; l < w; l++) acc[0][0][l] += x[v * w + l];
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < w; l++) acc[0][0][l] += acc[0][k][l];
    for (int l = 0; l < w; l++) sum[l] = acc[0][0][l];
}

static float torch_order_sum(const float *x, int64_t n) {
    float lanes[LANES], s = 0;
    if (n < LANES) {
        row_sum(x, n, 1, lanes);
        return 0.f + lanes[0];
    }
    int64_t vecs = n / LANES;
    row_sum(x, vecs, LANES, lanes);
    for (int64_t j = vecs * LANES; j < n; j++) s += x[j];
    for (int l = 0; l < LANES; l++) s += lanes[l];
    return 0.f + s;
}

void torch_order_sums(const float *x, float *out, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) out[r] = torch_order_sum(x + r * n, n);
}

/* reader_rows with torch's sums and torch's float32 steps for the constants (ops.rotate_half_into:
   a = sum / sqrt(d), b = 0 / sqrt(g), then ops._shifts; each Python float rounded to float32 as
   torch does with a scalar operand): the bytes of growtool's path. */
void reader_rows_exact(const uint16_t *src, const float *gain, uint16_t *out, int64_t rows, int64_t d,
                       int64_t D, double eps, float *row) {
    float sq_d = (float)sqrt((double)d), sq_g = (float)sqrt((double)(D - d));
    float em1 = (float)(eps - 1.0), s = (float)sqrt(fmax(0.0, 1.0 - eps * eps));
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *x = src + r * d;
        uint16_t *o = out + r * D;
        for (int64_t j = 0; j < d; j++) row[j] = widen(x[j]) * gain[j];
        float a = torch_order_sum(row, d) / sq_d, b = 0.f / sq_g;
        float c_old = (em1 * a - s * b) / sq_d, c_new = (em1 * b + s * a) / sq_g;
        for (int64_t j = 0; j < d; j++) o[j] = round_bf16(row[j] + c_old);
        uint16_t filled = round_bf16(0.f + c_new);
        for (int64_t j = d; j < D; j++) o[j] = filled;
    }
}

/* The exact variant's two passes; torch sums the rows in between (its own order). */
void scale_rows(const uint16_t *src, const float *gain, float *y, int64_t rows, int64_t d, int64_t ld) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < d; j++) y[r * ld + j] = widen(src[r * d + j]) * gain[j];
}

void shift_round_rows(const float *y, const float *c_old, const uint16_t *filled, uint16_t *out,
                      int64_t rows, int64_t d, int64_t D, int64_t ld) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < d; j++) out[r * D + j] = round_bf16(y[r * ld + j] + c_old[r]);
        for (int64_t j = d; j < D; j++) out[r * D + j] = filled[r];
    }
}
"""


def build(tmp: Path, lanes: int):
    """The C source compiled for float vectors of ``lanes`` (no fused multiply-adds) and loaded."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        sys.exit("fused_probe: no C compiler (cc, gcc or clang) on PATH")
    (tmp / "probe.c").write_text(SOURCE)
    so = tmp / f"probe{lanes}.so"
    flags = ["-O3", "-march=native", "-ffp-contract=off", f"-DLANES={lanes}", "-shared", "-fPIC"]
    subprocess.run([cc, *flags, "-o", so, tmp / "probe.c"], check=True)
    lib = ctypes.CDLL(str(so))
    p, n = ctypes.c_void_p, ctypes.c_int64
    lib.reader_rows.argtypes = [p, p, p, n, n, n, ctypes.c_float, p]
    lib.scale_rows.argtypes = [p, p, p, n, n, n]
    lib.torch_order_sums.argtypes = [p, p, n, n]
    lib.reader_rows_exact.argtypes = [p, p, p, n, n, n, ctypes.c_double, p]
    lib.shift_round_rows.argtypes = [p, p, p, p, n, n, n, n]
    return lib


def mirrored_sums(lib, gen) -> tuple[int, int]:
    """Rows of many lengths (tails of every size, shorter than a vector, past one level of the cascade)
    summed by torch and by the C mirror of its order: how many sums differ, of how many."""
    differ = total = 0
    for n in [*range(1, 200), 255, 256, 257, 1000, 1024, 2047, 2048, 2051, 4096, 5632, 16384, 65541, 300007]:
        x = torch.randn(7, n, generator=gen) * torch.logspace(-3, 3, n)  # magnitudes that make order matter
        got = torch.empty(7)
        lib.torch_order_sums(x.data_ptr(), got.data_ptr(), 7, n)
        differ += int((got.view(torch.int32) != x.sum(-1).view(torch.int32)).sum())
        total += 7
    return differ, total


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
    per = max(1, (1 << 20) // D)  # engine.ROW_BLOCK grown elements a block
    block, row = torch.empty(per, D), torch.empty(d)

    def with_torch():
        for r0 in range(0, rows, per):
            n = min(per, rows - r0)
            x = ops.fold_gain(src[r0 : r0 + n], gain, 1, out=block[:n, :d])
            ops.rotate_half_into(out[r0 : r0 + n], x, d, eps, 1, zero_new=True)

    with tempfile.TemporaryDirectory() as tmp:
        for lanes in (8, 16):  # torch's vectors here: the width whose mirrored sums are torch's
            lib = build(Path(tmp), lanes)
            sums_differ, sums_of = mirrored_sums(lib, torch.Generator().manual_seed(1))
            if sums_differ == 0:
                break
        found = lanes if sums_differ == 0 else None  # None: neither width is torch's order here

        def fused():
            lib.reader_rows(src.data_ptr(), gain.data_ptr(), out.data_ptr(), rows, d, D, eps, row.data_ptr())

        def exact():  # two C passes around torch's own row sums and constants: the same bytes
            s = math.sqrt(max(0.0, 1.0 - eps * eps))
            for r0 in range(0, rows, per):
                n = min(per, rows - r0)
                y = block[:n, :d]
                lib.scale_rows(src[r0].data_ptr(), gain.data_ptr(), y.data_ptr(), n, d, D)
                zero = y.new_zeros((n, 1))  # the constants as ops.rotate_half_into computes them
                a, b = y.sum(-1, keepdim=True) / math.sqrt(d), zero / math.sqrt(D - d)
                c_old, c_new = ops._shifts(a, b, d, D - d, eps, s)
                filled = (zero + c_new).to(torch.bfloat16)
                lib.shift_round_rows(y.data_ptr(), c_old.data_ptr(), filled.data_ptr(), out[r0].data_ptr(), n, d, D, D)

        def exact_fused():
            lib.reader_rows_exact(src.data_ptr(), gain.data_ptr(), out.data_ptr(), rows, d, D, eps, row.data_ptr())

        t_torch, t_fused, t_exact = timed(with_torch, 10), timed(fused, 10), timed(exact, 10)
        t_exact_fused = timed(exact_fused, 10)
        with_torch()
        want = out.clone()
        out.zero_()
        exact()
        exact_differ = int((out != want).sum())
        out.zero_()
        exact_fused()
        exact_fused_differ = int((out != want).sum())
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
        "exact_ms": 1e3 * t_exact,
        "exact_speedup": t_torch / t_exact,
        "exact_elements_differing": exact_differ,
        "lanes": found,
        "exact_fused_ms": 1e3 * t_exact_fused,
        "exact_fused_speedup": t_torch / t_exact_fused,
        "exact_fused_elements_differing": exact_fused_differ,
        "mirrored_sums_differing": sums_differ,
        "mirrored_sums_of": sums_of,
        "elements_differing": differ,
        "of": out.numel(),
        "max_abs_difference": gap,
        "output_rms": float(want.float().pow(2).mean().sqrt()),
    }
    print(
        f"FFN reader rows [x; 0], {rows} x {d} bf16 -> {rows} x {D} (one thread): torch {result['torch_ms']:.1f} ms "
        f"({result['torch_ns_per_out']:.2f} ns per output element), fused loop {result['fused_ms']:.1f} ms "
        f"({result['fused_ns_per_out']:.2f} ns): {result['speedup']:.1f}x; {differ} of {out.numel()} elements "
        f"differ (the sums' order), by at most {gap:.2g} (output RMS {result['output_rms']:.2g}); exact variant "
        f"(torch's sums between two C passes) {result['exact_ms']:.1f} ms: {result['exact_speedup']:.1f}x, "
        f"{exact_differ} elements differ; fused with torch's summation order mirrored ({found} lanes) "
        f"{result['exact_fused_ms']:.1f} ms: {result['exact_fused_speedup']:.1f}x, {exact_fused_differ} elements "
        f"differ; mirrored row sums unlike torch's: {sums_differ} of {sums_of}"
    )
    write_json(args.dir / "fused_probe.json", result)
    print(f"wrote {args.dir / 'fused_probe.json'}")


if __name__ == "__main__":
    main()
