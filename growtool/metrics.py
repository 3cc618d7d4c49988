"""Condensation metrics of weight matrices (small-init paper); the token-level comparison is in compare.py.

* stable rank  ||W||_F^2 / ||W||_2^2 : near 1 when the matrix is condensed onto one direction.
* row cosine   mean |cos| between distinct rows, a row being one unit's weight vector (slices
  along the unit axis for readers and writers; one row per token for embeddings and the head).
  Near 1 when units have condensed onto few directions. At most 512 rows are used (evenly spaced).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from growtool.nn.families import tensor_specs


def stable_rank(w: torch.Tensor) -> float:
    """||W||_F^2 / ||W||_2^2, with ||W||_2^2 the largest eigenvalue of the smaller Gram matrix (W W^T
    or W^T W, float32 product, float64 eigenvalues) on the tensor's own device: what an SVD gives to
    ~1e-6 relative, 3-10x faster on a CPU (192 x 512: 7.6 against 25 ms; 2048 x 8192: 1.4 against 15 s)."""
    w = w.float()
    fro2 = float((w * w).sum())
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    spec = float(torch.linalg.eigvalsh(gram.double())[-1])
    return fro2 / spec if spec > 0 else 0.0


def row_cosine(w: torch.Tensor, max_rows: int = 512) -> float:
    w = w.float()
    if w.shape[0] > max_rows:
        w = w[torch.linspace(0, w.shape[0] - 1, max_rows).long()]
    n = w.shape[0]
    if n < 2:
        return 0.0
    u = w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)
    c = (u @ u.T).abs()
    return float((c.sum() - c.diagonal().sum()) / (n * (n - 1)))


def unit_rows(w: torch.Tensor, spec) -> torch.Tensor:
    """The matrix with one row per unit (see module docstring)."""
    if spec.role in ("reader", "writer"):
        return w.movedim(spec.unit_axis, 0).reshape(w.shape[spec.unit_axis], -1)
    return w


def matrix_metrics(cfg, get: Callable[[str], torch.Tensor], names: Iterable[str]) -> dict[str, dict[str, float]]:
    """{tensor name: {"stable_rank", "row_cosine"}} for every weight matrix of a model among ``names``,
    each tensor taken with ``get`` (a checkpoint's reads it from disk) and dropped before the next."""
    out, have = {}, set(names)
    for name, spec in tensor_specs(cfg).items():
        if spec.role in ("reader", "writer", "embedding", "head") and name in have:
            w = unit_rows(get(name).detach(), spec)
            out[name] = {"stable_rank": stable_rank(w), "row_cosine": row_cosine(w)}
    return out
