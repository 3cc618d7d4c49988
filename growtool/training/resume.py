"""What ``growtool train --resume`` may change, and the words it refuses the rest in.

A resumed run continues the run saved in ``--out`` so that its metrics equal an uninterrupted run's.
What it may change:

* **Cadences** (``--eval-every``, ``--save-every``, ``--metrics-every``): they decide when the run
  measures or writes, never what it computes.
* **Length** (``--steps`` or ``--tokens``), when the updates already done are exactly the first
  updates of a run of the new length: the same learning rate at every step done, and no scheduled
  growth (``--grow-at`` places its growths at fractions of the run). Under ``wsd`` that holds until
  the decay begins: the stable phase is extended (or shortened) and the decay moves to the new end,
  so a run stopped before its decay and resumed with ``--steps 2N`` equals an uninterrupted 2N-step
  run. A run already in its decay is refused with one line: its learning rates so far belong to the
  old length, so no run of the new length has them, and a re-paced decay would be a schedule no
  single run has (not reproducible from a command line). ``constant`` extends at any step;
  ``cosine`` only within its warm-up. To train on from a run in its decay, resume a copy of its
  ``pre-decay`` folder (a wsd run keeps its state where the decay begins: ``loop.keep_pre_decay``)
  with the new length, or train its ``final.safetensors`` in a new run folder.

Settings not given on resume keep the run's values, where the default would be re-derived from the
new length: the length itself (neither ``--steps`` nor ``--tokens``), ``--warmup``,
``--gate-warmup-tokens`` and the cadences; and ``--lr``, ``--grow-schedule`` and ``--grow-warmup``
(their defaults depend on the family, the run's length and the growths, and a later release may
change them: the run keeps the ones it started with). So ``--resume --steps 2N`` keeps the warm-up,
gate ramp and peak LR the run started with; an uninterrupted 2N-step run matches it when it is given
the same values.
Every accepted change is recorded in ``last.pt``'s ``history``: [{step, changed: {name: [old, new]}}].
"""

from __future__ import annotations

from growtool.nn.errors import GrowError
from growtool.training.run_folder import PRE_DECAY
from growtool.training.schedule import lr_at
from growtool.training.settings import ABSENT, option, resume_keys, saved_setting

CADENCES = ("eval_every", "save_every", "metrics_every")
GROWTH_SCHEDULE = ("grow_schedule", "grow_warmup")  # free on a run folder that expand RUN just grew
KEPT = ("lr", "warmup", "gate_warmup_tokens", *GROWTH_SCHEDULE, *CADENCES)  # derived defaults: kept when not given
ADJUSTABLE = ("steps", *CADENCES)


def merge(saved: dict, resolved: dict, opts, inputs: dict | None = None, free=()) -> tuple[dict, dict]:
    """(the resumed run's settings, the accepted changes {name: [old, new]}); refuses, in the words of
    the command line, a change that would alter the math already done. ``opts``: the Settings given;
    ``inputs``: the run's saved ``--data`` / ``--val-data`` as given (named in the refusals); ``free``:
    settings that may change here too (``--grow-schedule`` for a run folder whose last growth is at the
    step it resumes from: ``expand RUN`` just made it, no update has used it yet, and ``check_grow_schedule``
    keeps the updates done at their learning rates)."""
    s = dict(resolved)
    for k in KEPT:
        if getattr(opts, k) is None and (k in saved or k in ABSENT):  # a run saved before k: what it meant
            s[k] = saved_setting(saved, k)
    if opts.steps is None and opts.tokens is None:
        s["steps"] = saved["steps"]
    if s["steps"] != saved["steps"] and saved_setting(saved, "grow_at"):
        raise GrowError(
            f"--steps {s['steps']}: a run with --grow-at keeps its length ({saved['steps']} steps): "
            "its growths are placed at fractions of the run"
        )
    for k in resume_keys():
        old, new = saved_setting(saved, k), s[k]
        if old != new and k not in free:
            raise GrowError(refusal(k, old, new, inputs or {}))
    changes = {k: [saved.get(k), s[k]] for k in (*ADJUSTABLE, *free) if saved.get(k) != s[k]}
    return s, changes


def changed_update(saved: dict, s: dict, step: int, lr_start) -> int | None:
    """The first of the ``step`` updates done whose learning rate under settings ``s`` differs from the
    one it had under ``saved`` (``lr_start(settings, t)``: where the schedule in force at update t
    began); None when every one keeps its own."""
    return next((t for t in range(step) if lr_at(t, saved, lr_start(saved, t)) != lr_at(t, s, lr_start(s, t))), None)


def check_grow_schedule(saved: dict, s: dict, step: int, lr_start) -> None:
    """A ``--grow-schedule`` or ``--grow-warmup`` other than the run's is accepted when each of the
    ``step`` updates done had the learning rate it gives them."""
    for k in GROWTH_SCHEDULE:
        old, new = saved_setting(saved, k), s.get(k)
        t = None if old == new else changed_update(saved, {**saved, k: new}, step, lr_start)
        if t is not None:
            was, again = (old, f"with {option(k)} {old}") if old is not None else ("--warmup", f"without {option(k)}")
            raise GrowError(
                f"{option(k)} {new}: update {t} of this run had its learning rate under {was} and would "
                f"get another one: resume {again}"
            )


def check_length(saved: dict, s: dict, step: int, lr_start) -> None:
    """A new length is accepted when the ``step`` updates done had the learning rate the new length
    gives them (``lr_start(settings, t)``: where the schedule in force at update t began)."""
    if s["steps"] == saved["steps"]:
        return
    if s["steps"] <= step:
        raise GrowError(f"--steps {s['steps']}: the run has already done {step} steps (give a larger --steps)")
    t = changed_update(saved, s, step, lr_start)
    if t is not None:
        kind = saved_setting(saved, "schedule")
        where = "in its decay" if kind != "constant" else "past its warm-up"
        raise GrowError(
            f"--steps {s['steps']}: the run is already {where} at step {step} ({kind} over {saved['steps']} "
            f"steps; update {t} would get another learning rate), so it cannot be extended exactly: "
            f"resume it with --steps {saved['steps']}, then train its final.safetensors in a new run, "
            f"or resume a copy of its {PRE_DECAY} folder (the state before the decay) with --steps {s['steps']}"
        )


def refusal(k: str, old, new, inputs: dict) -> str:
    """One line, in the command line's words, for a setting a resumed run may not change."""
    val = " ".join(inputs.get("val_data") or []) or "(its held-out files)"
    if k == "val_sha256":
        if old and not new:
            return f"--val-data missing: the run was started with --val-data {val}"
        if new and not old:
            return "--val-data: the run was started without it (it validates on the last 5% of --data)"
        return f"--val-data: not the held-out data the run was started with ({val}; give the same files, unchanged)"
    if k == "data_sha256":
        data = " ".join(inputs.get("data") or []) or "its files"
        return f"--data: not the data the run was started with ({data}; the same files, unchanged, in the same order)"
    if k == "source_sha256":
        return "CKPT: not the checkpoint the run was started from (give the same checkpoint)"
    if k == "tokenizer":
        named = lambda key: "the byte tokenizer" if key == "byte" else f"a tokenizer.json ({key[3:15]}…)"  # noqa: E731
        return f"--tokenizer: {named(new)}, but the run was started with {named(old)} (give the same one)"
    if k == "grow_at":
        at = lambda g: ", ".join(f"step {st} to {w}" for st, w in g) or "no growth"  # noqa: E731
        return f"--grow-at: the run was started with {at(old)} (given: {at(new)}); give the same --grow-at"
    return (
        f"--resume: {option(k)} {shown(new)} differs from the run's {shown(old)} "
        "(resume with the run's settings; --steps and the --eval/--save/--metrics-every cadences may change)"
    )


def shown(v) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "(none)"
    return "(default)" if v is None else str(v)
