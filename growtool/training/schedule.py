"""Learning-rate schedules (``--schedule``), each over a span that begins at step ``start`` (0, or the
latest growth under ``--grow-schedule rewarm``) and ends at the run's last step.

Every schedule warms up linearly over ``warmup`` steps (capped at the span): update t of the span
(0-based) gets lr * (t + 1) / warmup. Then, with r = ``min_lr_ratio`` and n the span's steps:

* ``cosine``: lr * (r + (1 - r) * (1 + cos(pi * p)) / 2), p = (t - warmup) / (n - warmup).
* ``wsd`` (warmup-stable-decay): lr until the last D = round(``decay_fraction`` * n) steps (at most
  n - warmup), then linear to r: lr * (1 - (1 - r) * p), p = (t - (n - D)) / D.
* ``constant``: lr after the warm-up.
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "wsd", "constant")


def lr_at(step: int, s: dict, start: int = 0) -> float:
    """Learning rate of update ``step`` (0-based) under the saved settings ``s``."""
    kind = s.get("schedule", "cosine")
    lr, n = s["lr"], s["steps"] - start
    warm, t, r = min(s["warmup"], n), step - start, s["min_lr_ratio"]
    if t < warm:
        return lr * (t + 1) / warm
    if kind == "constant":
        return lr
    if kind == "wsd":
        d = min(max(0, round(s.get("decay_fraction", 0.2) * n)), n - warm)
        if d <= 0 or t < n - d:
            return lr
        return lr * (1 - (1 - r) * (t - (n - d)) / d)
    p = (t - warm) / max(1, n - warm)
    return lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p)))


__all__ = ["SCHEDULES", "lr_at"]
