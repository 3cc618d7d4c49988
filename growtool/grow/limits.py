"""Sizes checked before any work: an absurd target width is one line at once, not a plan that loops
for minutes over new heads (``--width 10**20`` hung even ``--dry-run``), nor a write that fills the
disk after an hour. The estimate counts the matrices (embeddings, head, attention, FFN) from the
target shape alone; the plan's exact figure is close to it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from growtool.nn.errors import GrowError

MAX_BYTES = 1 << 50  # 1 PiB: beyond any machine this runs on


def estimate_bytes(src, width: int, ffn: int | None, itemsize: int) -> int:
    """About the bytes of ``src`` grown to ``width`` (FFN ``ffn``, default scaled with the width)."""
    f = ffn if ffn is not None else -(-src.ffn * width // src.width)
    per_layer = 4 * width * width + 3 * width * f
    return itemsize * (src.layers * per_layer + src.vocab_size * width * (1 if src.tie else 2))


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return str(n)


def check_growth(src, width: int, ffn: int | None, itemsize: int) -> None:
    """GrowError when the grown model could not exist on any machine (before the plan is built)."""
    need = estimate_bytes(src, width, ffn, itemsize)
    if need > MAX_BYTES:
        raise GrowError(f"--width {width}: the grown model would need about {_human(need)}, beyond any machine")


def check_space(need: int, out: str) -> None:
    """GrowError when ``need`` bytes do not fit the free space where ``out`` is written (``-``: the
    temporary folder it is spooled to)."""
    where = Path(tempfile.gettempdir()) if out == "-" else (Path(out).parent if str(Path(out).parent) else Path("."))
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return
    if usage.total > 0 and need > usage.free:  # (pseudo file systems such as /sys report no size at all)
        raise GrowError(f"{out}: the grown model needs {_human(need)}, {where} has {_human(usage.free)} free")
