"""The run-folder format: the file names of a training run's resumable state (``MODEL`` +
``STATE``) and final checkpoint, ``metrics.jsonl`` (read / written whole, atomically), the state's
bytes and the loss plot."""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from growtool.io.files import atomic_file
from growtool.nn.errors import GrowError

STATE, MODEL, FINAL = "last.pt", "last.safetensors", "final.safetensors"


def save_bytes(path: Path, obj) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_file(path, lambda fh: fh.write(buf.getvalue()))


def write_metrics(path: Path, records: list[dict]) -> None:
    atomic_file(path, lambda fh: fh.write("".join(json.dumps(r) + "\n" for r in records).encode()))


def read_metrics(path: Path) -> list[dict]:
    """The records of metrics.jsonl; a last line cut short (a full disk, a kill) is dropped."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
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


def plot(records: list[dict], path: Path, title: str) -> None:
    """Training and validation loss against tokens (gate on a second axis when there is one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    tr = [r for r in records if "loss" in r]
    va = [r for r in records if "val_loss" in r]
    ax.plot([r["tokens"] for r in tr], [r["loss"] for r in tr], lw=0.8, alpha=0.6, label="train loss")
    ax.plot([r["tokens"] for r in va], [r["val_loss"] for r in va], "o-", ms=3, label="val loss")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    for prev, r in zip(tr, tr[1:]):  # growth points (stages.py): the width changes between two steps
        if prev.get("width") != r.get("width"):
            ax.axvline(prev["tokens"], color="tab:red", lw=0.8, ls=":")
            ax.annotate(f"d{r['width']}", (prev["tokens"], 1.0), xycoords=("data", "axes fraction"), fontsize=7)
    ax.legend(loc="upper right")
    if any(r.get("gate") is not None for r in tr):
        ax2 = ax.twinx()
        before = [r["tokens"] * (r["step"] - 1) / r["step"] for r in tr]  # a step's gate applies from its start
        ax2.plot(before, [r["gate"] for r in tr], color="grey", lw=0.8, ls="--")
        ax2.set_ylabel("growth gate", color="grey")
        ax2.set_ylim(-0.05, 1.05)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_file(path, lambda fh: fh.write(buf.getvalue()))
