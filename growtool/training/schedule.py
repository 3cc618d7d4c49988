"""The schedules of a training run: the learning rate (linear warm-up, then cosine) and the growth
gates (a linear ramp 0 -> 1 from the run's last growth)."""

from __future__ import annotations

import math

from growtool.training.settings import saved_setting


def lr_at(step: int, s: dict, start: int = 0) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up, then cosine to lr * min_lr_ratio,
    over a schedule that began at step ``start`` (0; a growth under --grow-schedule rewarm)."""
    lr, warm, n = s["lr"], min(s["warmup"], s["steps"] - start), s["steps"] - start
    step -= start
    if step < warm:
        return lr * (step + 1) / warm
    p = (step - warm) / max(1, n - warm)
    return lr * (s["min_lr_ratio"] + (1 - s["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * p)))


def gate_at(step: int, s: dict, start: int = 0) -> float | None:
    """Growth-gate value in force after ``step`` updates of a ramp that began at step ``start``
    (None for a plain model)."""
    g = s["gate_warmup_tokens"]
    if g is None:
        return None
    return 1.0 if g <= 0 else min(1.0, (step - start) * s["batch"] * s["seq"] / g)


def run_gate_for(cfg, s: dict, growths: list, step: int) -> float | None:
    """The gate in force after ``step`` updates for a model of ``cfg`` whose run grew at ``growths``
    (the ramp restarts at each growth; None for a plain model)."""
    return gate_at(step, s, last_growth(growths, step)) if cfg.gated else None


def run_gate(run, step: int) -> float | None:
    return run_gate_for(run.model.cfg, run.s, run.growths, step)


def last_growth(growths: list, step: int) -> int:
    """Step of the latest growth at or before ``step`` (0: none; the gates then ramp from the start)."""
    return max((g["step"] for g in growths if g["step"] <= step), default=0)


def mup(s: dict) -> bool:
    """``--grow-lr mup``: the hidden matrices' learning rate follows 1/width across growths."""
    return saved_setting(s, "grow_lr") == "mup"
