"""The run-folder format: the file names of a training run's resumable state (``MODEL`` +
``STATE``) and final checkpoint, ``metrics.jsonl`` (read / written whole, atomically), the state's
bytes and the loss plot (a growth in words: ``d64 → d96``); and the folder's life (``held``):
locked while a run uses it, removed when a run that made it fails before its first saved state.

The resumable pair, ``last.safetensors`` + ``last.pt``, is replaced together (``commit_pair``): both
are written first under pending names (``.last.pending.*``, each fsynced), and only then renamed
over the old pair: a write that fails (a full disk) removes the pending files and leaves the old,
matching pair, from which ``--resume`` continues. A process killed between the two renames leaves
the new model in place and the new state pending; ``recover`` finishes that rename before a resume.
A folder with no ``last.pt`` (the first save never completed) holds no run: it starts over."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from growtool.io import checkpoint, confine
from growtool.io.files import _replace, atomic_file, fsync_dir
from growtool.nn.errors import GrowError

STATE, MODEL, FINAL = "last.pt", "last.safetensors", "final.safetensors"
PRE_DECAY = "pre-decay"  # a wsd run's resumable state where its decay begins (loop.keep_pre_decay)
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
    fsync_dir(out)


def write_folder(folder: Path, write: Callable[[Path], None], lead: bool, sync: Callable[[], None]) -> None:
    """Write ``folder`` whole or not at all: ``write(tmp)`` fills ``folder.tmp`` (every rank calls it;
    ``sync`` after the lead made the folder; one name every rank knows), which then replaces
    ``folder`` (``files._replace``). A failed write leaves neither ``.tmp`` nor a changed ``folder``; a
    link planted at either name is removed, never followed."""
    tmp = folder.with_name(folder.name + ".tmp")
    if lead:
        _remove(tmp)
        tmp.mkdir()
    sync()
    try:
        write(tmp)
    except BaseException:
        if lead:
            _remove(tmp)
        raise
    if lead:
        _replace(tmp, folder)


def _remove(p: Path) -> None:
    """A link or file unlinked (never followed), a folder removed with its contents."""
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.exists():
        shutil.rmtree(p)


def recover(out: Path, state: str) -> None:
    """Finish a commit cut between its two renames; drop pending files of one that never finished."""
    pm, ps = out / PENDING_MODEL, out / PENDING_STATE
    if ps.exists() and not pm.exists():
        os.replace(ps, out / state)
    for p in (pm, ps):
        p.unlink(missing_ok=True)


def resume_point(out: Path) -> int | None:
    """The step ``--resume`` continues ``out`` from (None: no resumable state: the run starts over). A save
    interrupted between its renames counts once its model is in place (``recover`` finishes it)."""
    if not (out / MODEL).exists() or not ((out / STATE).exists() or (out / PENDING_STATE).exists()):
        return None
    try:
        return checkpoint.load(confine.run_file(out / MODEL)).lineage[-1]["step"]  # a regular file of the run
    except (GrowError, OSError, IndexError, KeyError):
        return None


def load_state(path: Path) -> dict:
    """``last.pt``, loaded with ``weights_only`` and checked to be a training state: a truncated,
    corrupt or incomplete one is one GrowError line, not a traceback."""
    try:
        with confine.open_regular(path, "run folder") as fh:  # not a link out of the run folder, nor a FIFO
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

    @contextlib.contextmanager
    def ctx():
        try:
            yield
        except (ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
            raise GrowError(
                f"{path}: its saved state does not fit this run ({' '.join(str(e).split())[:100]})"
            ) from None

    return ctx()


def save_bytes(path: Path, obj) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_file(path, lambda fh: fh.write(buf.getvalue()))


def write_metrics(path: Path, records: list[dict]) -> None:
    atomic_file(path, lambda fh: fh.write("".join(json.dumps(r) + "\n" for r in records).encode()))


def append_metrics(path: Path):
    """metrics.jsonl opened to append a line per step: a regular file of the run folder (a link or a
    FIFO planted there is refused, never written through)."""
    fh = confine.open_regular(path, "run folder", "r+b")
    fh.seek(0, 2)
    return io.TextIOWrapper(fh, encoding="utf-8")


def read_metrics(path: Path) -> list[dict]:
    """The records of metrics.jsonl; a last line cut short (a full disk, a kill) is dropped."""
    try:
        with confine.open_regular(path, "run folder") as fh:
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            if i == len(lines) - 1:
                break
            raise GrowError(f"{path}: line {i + 1} is not a metrics record (a corrupt run folder)")
        out.append(rec)
    return out


def figure(records: list[dict], title: str):
    """The loss plot as a matplotlib figure: training and validation loss against tokens; on a
    second axis (0 to 1) the growth gate, when there is one, and the learning rate as a share of
    its peak; growth points as dotted lines; the legend under the axes, covering no line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.4))
    tr = [r for r in records if "loss" in r]
    va = [r for r in records if "val_loss" in r]
    ax.plot([r["tokens"] for r in tr], [r["loss"] for r in tr], lw=0.8, alpha=0.6, label="train loss")
    ax.plot([r["tokens"] for r in va], [r["val_loss"] for r in va], "o-", ms=3, label="val loss")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    grew = [(prev, r) for prev, r in zip(tr, tr[1:]) if grown(prev, r)]
    for i, (prev, r) in enumerate(grew):  # growth points (stages.py): the size changes between two steps
        ax.axvline(prev["tokens"], color="tab:red", lw=0.8, ls=":", label="growth" if i == 0 else "_")
        label = f" {growth_label(prev, r)}"
        ax.annotate(label, (prev["tokens"], 0.97), xycoords=("data", "axes fraction"), fontsize=7, va="top")
    handles = ax.get_lines()
    before = [r["tokens"] * (r["step"] - 1) / r["step"] for r in tr]  # a step's gate and LR apply from its start
    lrs = [r.get("lr") for r in tr]
    gated = any(r.get("gate") is not None for r in tr)
    if gated or (lrs and all(isinstance(v, (int, float)) for v in lrs) and max(lrs) > 0):
        ax2 = ax.twinx()
        if gated:
            ax2.plot(before, [r["gate"] for r in tr], color="grey", lw=0.8, ls="--", label="growth gate")
        if lrs and all(isinstance(v, (int, float)) for v in lrs) and max(lrs) > 0:
            peak = max(lrs)
            ax2.plot(before, [v / peak for v in lrs], color="tab:green", lw=0.8, label=f"LR / peak ({peak:.3g})")
        ax2.set_ylabel("growth gate, LR / peak LR")
        ax2.set_ylim(-0.05, 1.05)
        handles = handles + ax2.get_lines()
    handles = [h for h in handles if not h.get_label().startswith("_")]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5)
    # fixed margins, about those tight_layout finds for this figure, which cost a fifth of the plot's
    # time (200 -> 160 ms measured; a few-second run spent a tenth of its time plotting)
    fig.subplots_adjust(left=0.11, right=0.88 if len(fig.axes) > 1 else 0.95, top=0.92, bottom=0.22)
    return fig


def plot(records: list[dict], path: Path, title: str) -> None:
    """Write ``figure(records, title)`` to ``path`` as a PNG (atomically)."""
    save_png(figure(records, title), path)


def save_png(fig, path: Path) -> None:
    """Write matplotlib figure ``fig`` to ``path`` as a PNG (atomically) and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_file(path, lambda fh: fh.write(buf.getvalue()))


def size_label(rec: dict) -> str:
    """A metrics record's model size in words: ``d64 × 2 layers`` (``d64`` when the record has no layer
    count: a run written before records carried it)."""
    w, n = rec.get("width"), rec.get("layers")
    return f"d{w}" + ("" if n is None else f" × {n} layer{'s' if n != 1 else ''}")


def resized(prev: dict, rec: dict) -> bool:
    """Whether two metrics records are of different model sizes: width, or layer count where both
    records have one (records written before they carried it lack it)."""
    return prev.get("width") != rec.get("width") or len({prev.get("layers"), rec.get("layers")} - {None}) > 1


def grown(prev: dict, rec: dict) -> bool:
    """Whether the model grew between two records of one run: its size or its count of growths so far
    (``stage``) changed."""
    return resized(prev, rec) or prev.get("stage") != rec.get("stage")


def growth_label(prev: dict, rec: dict) -> str:
    """A growth between two metrics records in words: ``d64 → d96``, ``2 → 4 layers``, or both
    (``d64 → d96, 2 → 4 layers``)."""
    parts = []
    if prev.get("width") != rec.get("width"):
        parts.append(f"d{prev.get('width')} → d{rec.get('width')}")
    if prev.get("layers") != rec.get("layers") and None not in (prev.get("layers"), rec.get("layers")):
        parts.append(f"{prev['layers']} → {rec['layers']} layers")
    return ", ".join(parts) or f"growth {rec.get('stage')}"


@contextlib.contextmanager
def held(out: Path, lead: bool, state: str):
    """The life of run folder ``out`` for one ``train``: made if missing, locked (``flock`` on the
    folder itself, held until the run ends: a second ``train`` on it is refused at once) and, when this
    run made it and then fails (anything but an interrupt, which leaves a resumable token cache)
    before a first state was saved, removed whole. An interrupt at any point of the run carries the
    step it resumes from (``resume_point``: None, nothing saved) for its one line. Only the lead rank
    (rank 0) makes, locks or removes."""
    if not lead:
        yield
        return
    if out.exists() and not out.is_dir():
        raise GrowError(f"{out}: exists and is not a folder")
    if not out.parent.is_dir():
        raise GrowError(f"{out}: parent folder {out.parent} does not exist")
    made = False
    try:
        out.mkdir()
        made = True
    except FileExistsError:
        confine.real_dir(out, "run folder")
    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _lock(fd, out)
        yield
    except BaseException as e:
        from growtool.console import Interrupted

        if isinstance(e, Interrupted) and not hasattr(e, "resume_step"):  # the line says where the run resumes
            e.resume_step = resume_point(out)
        if made and not isinstance(e, (Interrupted, KeyboardInterrupt)) and not (out / state).exists():
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, out: Path) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise GrowError(
            f"{out}: another train is using this run folder (refused; wait for it, or another --out)"
        ) from None
