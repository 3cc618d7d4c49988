"""The schedules of a training run: the learning rate and the growth gates (a linear ramp 0 -> 1
from the run's last growth).

Learning rate (``--schedule``), over a span that begins at step ``start`` (0, or the latest growth
under ``--grow-schedule rewarm``) and ends at the run's last step. Every schedule warms up linearly
over ``warmup`` steps (``grow_warmup`` in a span that begins at a growth; each capped at the span):
update t of the span (0-based) gets lr * (t + 1) / warmup. Then, with r = ``min_lr_ratio`` and n the span's steps:

* ``cosine``: lr * (r + (1 - r) * (1 + cos(pi * p)) / 2), p = (t - warmup) / (n - warmup).
* ``wsd`` (warmup-stable-decay): lr until the last D = round(``decay_fraction`` * n) steps (at most
  n - warmup), then to r: lr * (1 - (1 - r) * p) with ``decay_shape`` linear, lr * (1 - (1 - r) * sqrt(p))
  with sqrt (Hägele et al. 2024's 1 - sqrt cooldown), p = (t - (n - D)) / D.
* ``constant``: lr after the warm-up.
"""

from __future__ import annotations

import math

from growtool.training.settings import default_gate_tokens, rewarms, saved_setting

SCHEDULES = ("cosine", "wsd", "constant")


def lr_at(step: int, s: dict, start: int = 0) -> float:
    """Learning rate of update ``step`` (0-based) under the saved settings ``s`` (runs saved before
    ``schedule`` existed: cosine)."""
    kind = saved_setting(s, "schedule")
    lr, n = s["lr"], s["steps"] - start
    warm, t, r = warmup_steps(s, start), step - start, s["min_lr_ratio"]
    if t < warm:
        return lr * (t + 1) / warm
    if kind == "constant":
        return lr
    if kind == "wsd":
        d = decay_steps(s, n, warm)
        if d <= 0 or t < n - d:
            return lr
        p = (t - (n - d)) / d
        return lr * (1 - (1 - r) * (math.sqrt(p) if saved_setting(s, "decay_shape") == "sqrt" else p))
    p = (t - warm) / max(1, n - warm)
    return lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p)))


def warmup_steps(s: dict, start: int = 0) -> int:
    """The LR warm-up of the schedule span that begins at step ``start``: ``warmup`` for the run's first
    span, ``grow_warmup`` (when given) for one that a growth began; at most the span."""
    given = saved_setting(s, "grow_warmup")
    return min(s["warmup"] if start == 0 or given is None else given, s["steps"] - start)


def decay_steps(s: dict, n: int, warm: int) -> int:
    """wsd: the updates in the decay of a schedule span of ``n`` updates (after its warm-up of ``warm``
    at most)."""
    return min(max(0, round(saved_setting(s, "decay_fraction") * n)), n - warm)


def decay_start(s: dict, start: int = 0) -> int | None:
    """Updates done when a ``wsd`` schedule that began at step ``start`` starts its decay (every update
    so far in the warm-up or at the peak; the next is the decay's first, itself still at the peak, and
    the ones after it fall); None for the other schedules and for a wsd run without a decay."""
    if saved_setting(s, "schedule") != "wsd":
        return None
    d = decay_steps(s, s["steps"] - start, warmup_steps(s, start))
    return s["steps"] - d if d > 0 else None


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


def dropout_at(step: int, s: dict, growths: list) -> float:
    """``--grow-dropout``'s rate for update ``step`` (0-based): its value from a growth until the gates'
    ramp after it ends (``gate_warmup_tokens``, default 10% of the run), 0 before any growth and after."""
    p = saved_setting(s, "grow_dropout")
    if not p or not any(g["step"] <= step for g in growths):
        return 0.0
    return p if (step - last_growth(growths, step)) * s["batch"] * s["seq"] < ramp_tokens(s) else 0.0


def ramp_tokens(s: dict) -> int:
    """The tokens of the gate ramp after a growth: ``gate_warmup_tokens``, or the default, 10% of the
    run's tokens, where it is None (a run saved without gates) or 0 (gates open at once: the dropout
    window and the diagnostics' dense cadence after a growth then keep the default's length)."""
    return s.get("gate_warmup_tokens") or default_gate_tokens(s["steps"], s["batch"] * s["seq"])


def last_growth(growths: list, step: int) -> int:
    """Step of the latest growth at or before ``step`` (0: none; the gates then ramp from the start)."""
    return max((g["step"] for g in growths if g["step"] <= step), default=0)


def mup(s: dict) -> bool:
    """``--grow-lr mup``: the hidden matrices' learning rate follows 1/width across growths."""
    return saved_setting(s, "grow_lr") == "mup"


def width_lr_scale(cfg, growths: list) -> float:
    """The hidden matrices' learning-rate factor under ``--grow-lr mup``: the run's first width over
    the width now (muP's 1/fan_in rule for Adam; 1 before any growth)."""
    first = growths[0].get("from", cfg.width) if growths else cfg.width
    return first / cfg.width


def lr_start(s: dict, growths: list, step: int) -> int:
    """Where the LR schedule in force at ``step`` began: 0 (``--grow-schedule continue``); the latest
    growth (``rewarm``: the LR warms up again and decays over the steps left, as a second run would); the
    latest growth in width (``rewarm-width``: a growth in depth alone continues the schedule in force).
    Which growths re-warm under each mode: ``settings.rewarms``, which the run-folder rule uses too."""
    mode = saved_setting(s, "grow_schedule")
    return last_growth([g for g in growths if rewarms(mode, g)], step)
