"""A run folder's resumable pair, ``last.safetensors`` + ``last.pt``, replaced together.

Both are written first under pending names (``.last.pending.*``, each fsynced), and only then renamed
over the old pair: a write that fails (a full disk) removes the pending files and leaves the old,
matching pair, from which ``--resume`` continues. A process killed between the two renames leaves
the new model in place and the new state pending; ``recover`` finishes that rename before a resume.
A folder with no ``last.pt`` (the first save never completed) holds no run: it starts over.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

PENDING_MODEL, PENDING_STATE = ".last.pending.safetensors", ".last.pending.pt"


def commit_pair(out: Path, model: str, state: str, write_model: Callable, write_state: Callable) -> None:
    """``write_model(path)`` and ``write_state(path)`` to pending files, then both renamed into place."""
    pm, ps = out / PENDING_MODEL, out / PENDING_STATE
    try:
        write_model(pm)
        write_state(ps)
    except BaseException:
        for p in (pm, ps):
            p.unlink(missing_ok=True)
        raise
    os.replace(pm, out / model)
    os.replace(ps, out / state)
    try:
        fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def recover(out: Path, state: str) -> None:
    """Finish a commit cut between its two renames; drop pending files of one that never finished."""
    pm, ps = out / PENDING_MODEL, out / PENDING_STATE
    if ps.exists() and not pm.exists():
        os.replace(ps, out / state)
    for p in (pm, ps):
        p.unlink(missing_ok=True)


def load_state(path: Path) -> dict:
    """``last.pt``, loaded with ``weights_only`` and checked to be a training state: a truncated,
    corrupt or incomplete one is one GrowError line, not a traceback."""
    import torch

    from growtool.io.confine import open_regular
    from growtool.nn.errors import GrowError

    try:
        with open_regular(path, "run folder") as fh:  # not a link out of the run folder, nor a FIFO
            state = torch.load(fh, map_location="cpu", weights_only=True)
    except GrowError:
        raise
    except Exception as e:  # a truncated zip, a refused global, garbage
        raise GrowError(f"{path}: not a readable training state ({' '.join(str(e).split())[:100]})") from None
    rng = state.get("rng") if isinstance(state, dict) else None
    ok = (
        isinstance(state, dict)
        and isinstance(state.get("step"), int)
        and state["step"] >= 0
        and isinstance(state.get("settings"), dict)
        and isinstance(rng, dict)
        and isinstance(rng.get("torch"), torch.Tensor)
        and (isinstance(state.get("optimizer"), dict) or isinstance(state.get("sharded"), str))
        and isinstance(state.get("growths", []), list)
    )
    if not ok:
        raise GrowError(f"{path}: incomplete training state (step, settings, rng and optimizer expected)")
    check_fields(path, state)
    return state


def check_fields(path: Path, state: dict) -> None:
    """The fields of a training state that are used as numbers, checked as such (growtool.nn.args): the
    settings that size the run, the step within it, each growth and each scheduled growth."""
    from growtool.nn import args
    from growtool.nn.errors import GrowError

    s = state["settings"]
    steps = args.integer(f"{path}: settings steps", s.get("steps"), 1)
    for key in ("batch", "seq"):
        args.integer(f"{path}: settings {key}", s.get(key), 1)
    args.seed(f"{path}: settings seed", s.get("seed", 0))
    for key in ("data_start", "gate_warmup_tokens"):
        args.integer(f"{path}: settings {key}", s.get(key), 0, optional=True)
    args.integer(f"{path}: step", state["step"], 0, steps)
    grow_at = s.get("grow_at") or []
    if not isinstance(grow_at, list) or not all(
        isinstance(g, (list, tuple)) and len(g) == 2 and isinstance(g[1], (int, dict)) for g in grow_at
    ):
        raise GrowError(f"{path}: settings grow_at must be a list of [step, target] pairs, got {grow_at!r}"[:200])
    for st, _ in grow_at:
        args.integer(f"{path}: settings grow_at step", st, 1, steps)
    for g in state.get("growths", []):
        if not isinstance(g, dict):
            raise GrowError(f"{path}: growths must be a list of records, got {g!r}"[:200])
        args.integer(f"{path}: growth step", g.get("step"), 0, steps)
        args.integer(f"{path}: growth width", g.get("width"), 1)
        for key in ("from", "layers", "layers_from"):
            args.integer(f"{path}: growth {key}", g.get(key), 1, optional=True)


def restoring(path: Path):
    """A context in which an optimizer or RNG state that does not fit is one GrowError line."""
    import contextlib

    from growtool.nn.errors import GrowError

    @contextlib.contextmanager
    def ctx():
        try:
            yield
        except (ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
            raise GrowError(
                f"{path}: its saved state does not fit this run ({' '.join(str(e).split())[:100]})"
            ) from None

    return ctx()
