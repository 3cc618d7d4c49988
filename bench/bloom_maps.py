"""Is there an exact 1.5x width map for a tied model whose embeddings pass a LayerNorm (BLOOM)?

`expand` grows BLOOM only by whole factors (docs/architectures.md, "Why not 64 -> 96"). This script
asks the question numerically, on the parts that make it hard, in float64: a table E (V x d) read
through an embedding LayerNorm (gain g0, bias b0) and, tied, as the head after a final LayerNorm
(gf, bf). A width-D model is exact when, for one linear residual map h -> h M (d x D):

* every later LayerNorm is exact: 1_d M is a multiple of 1_D and M is a scaled isometry between
  centered vectors (C_d M C_D M^T C_d = (D/d) C_d); blocks' readers and writers then follow from M;
* the new embedding norm gives every row's old residual mapped: LN0'(E'_t) = LN0(E_t) M (mod 1_D);
* the tied head gives the old logits: LN_f'(h M) E'^T = LN_f(h) E^T for the residuals h it reads
  (3d random vectors and every embedding output).

Unknowns M, E', g0', b0', gf', bf' (every new row free); the residual of all equations is minimised
by Levenberg-Marquardt from several random starts. Controls: a whole factor (4 -> 8, where the copy
map is exact) and a model without the embedding norm (GPT-2, which `expand` grows 1.5x exactly).
A start that reaches |residual| ~ 1e-13 has found an exact map; one that stops at 1e-3 is a local
minimum. A case "d:D:1:pad" fixes M to the zero padding of the centered residual (GPT-2's and
OPT's map, h -> sqrt(D/d) [C h; 0] + mean(h) 1_D) and searches only the rest: it finds no exact
tied map (docs/architectures.md derives why). Writes results/bloom_maps/results.json.
"""

from __future__ import annotations

import time

import torch
from common import machine, parse_args, table, write_json

FULL = dict(cases="4:8:1,4:6:0,4:6:1,6:9:1,8:12:1,4:6:1:pad,6:9:1:pad", vocab=40, starts=6, iters=300)
QUICK = dict(cases="4:8:1,4:6:1", vocab=24, starts=3, iters=200)


def ln(x, g, b):
    m = x.mean(-1, keepdim=True)
    return (x - m) / ((x - m) ** 2).mean(-1, keepdim=True).sqrt() * g + b


def source(d: int, V: int, seed: int):
    """A random tied source: table, embedding-norm and final-norm gains and biases, residuals."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(V, d), 1 + 0.5 * r(d), 0.3 * r(d), 1 + 0.5 * r(d), 0.3 * r(d), r(3 * d, d)


def residual(x, d: int, D: int, V: int, src, embed_norm: bool):
    E, g0, b0, gf, bf, H = src
    sizes = [d * D, V * D, D, D, D, D]
    M, Ep, g0p, b0p, gfp, bfp = (t.view(-1) for t in torch.split(x, sizes))
    M, Ep = M.view(d, D), Ep.view(V, D)
    Cd = torch.eye(d, dtype=x.dtype) - 1 / d
    CD = torch.eye(D, dtype=x.dtype) - 1 / D
    h0, h0p = (ln(E, g0, b0), ln(Ep, g0p, b0p)) if embed_norm else (E, Ep)
    hs = torch.cat([H, h0])
    return torch.cat(
        [
            CD @ (M.T @ torch.ones(d, dtype=x.dtype)),  # the mean direction maps to the mean direction
            (Cd @ M @ CD @ M.T @ Cd - D / d * Cd).flatten(),  # a scaled isometry of centered vectors
            ((h0p - h0 @ M) @ CD).flatten(),  # the embedding norm's output, mapped
            (ln(hs @ M, gfp, bfp) @ Ep.T - ln(hs, gf, bf) @ E.T).flatten(),  # the tied head's logits
        ]
    )


def pad_map(d: int, D: int) -> torch.Tensor:
    """M (d x D) of h -> sqrt(D/d) [C h; 0] + mean(h) 1_D: the centered residual zero-padded."""
    M = torch.full((d, D), 1 / d, dtype=torch.float64)
    M[:, :d] += (D / d) ** 0.5 * (torch.eye(d, dtype=torch.float64) - 1 / d)
    return M


def solve(d: int, D: int, V: int, embed_norm: bool, start: int, iters: int, pad: bool = False) -> float:
    """|residual| after Levenberg-Marquardt from random start ``start`` (source seed 0); ``pad``: M
    fixed to ``pad_map``, the other unknowns searched."""
    src = source(d, V, 0)
    g = torch.Generator().manual_seed(1000 + start)
    x = 0.5 * torch.randn(d * D + V * D + 4 * D, generator=g, dtype=torch.float64)
    o = d * D + V * D
    x[o : o + D] += 1  # gains near 1
    x[o + 2 * D : o + 3 * D] += 1
    if pad:
        M, x = pad_map(d, D).flatten(), x[d * D :]
        f = lambda y: residual(torch.cat([M, y]), d, D, V, src, embed_norm)  # noqa: E731
    else:
        f = lambda x: residual(x, d, D, V, src, embed_norm)  # noqa: E731
    lam, r = 1e-3, f(x)
    for _ in range(iters):
        J = torch.func.jacfwd(f)(x)
        A, grad = J.T @ J, J.T @ r
        while True:
            xn = x + torch.linalg.solve(A + lam * torch.diag(torch.diag(A) + 1e-9), -grad)
            rn = f(xn)
            if rn.norm() < r.norm():
                x, r, lam = xn, rn, max(lam / 3, 1e-12)
                break
            lam *= 4
            if lam > 1e12:
                return r.norm().item()
        if r.norm() < 1e-12:
            break
    return r.norm().item()


def options(p):
    for k, v in FULL.items():
        p.add_argument("--" + k, type=type(v), default=None, help=f"default {v} (quick {QUICK[k]})")


def main():
    args = parse_args("bloom_maps", __doc__.splitlines()[0], options)
    P = {k: getattr(args, k) if getattr(args, k) is not None else (QUICK if args.quick else FULL)[k] for k in FULL}
    torch.set_num_threads(1)
    rows = []
    for case in P["cases"].split(","):
        parts = case.split(":")
        d, D, en = (int(v) for v in parts[:3])
        pad = parts[3:] == ["pad"]
        t0 = time.time()
        res = [solve(d, D, P["vocab"], bool(en), s, P["iters"], pad) for s in range(P["starts"])]
        rows.append(
            {
                "d": d,
                "D": D,
                "embedding_norm": bool(en),
                "map": "pad" if pad else "free",
                "vocab": P["vocab"],
                "best_residual": min(res),
                "exact_starts": f"{sum(x < 1e-10 for x in res)}/{len(res)}",
                "residuals": " ".join(f"{x:.1e}" for x in res),
                "seconds": round(time.time() - t0, 1),
            }
        )
        print(table([rows[-1]]), flush=True)
    write_json(args.dir / "results.json", {"settings": P, "machine": machine(), "rows": rows})
    print(table(rows, "exact tied width maps (|residual| < 1e-10: found)"))


if __name__ == "__main__":
    main()
