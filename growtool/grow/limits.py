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
MAX_HEADER = 100 * 1024 * 1024  # the largest safetensors header read (io/header.py's MAX_HEADER, the library's)


def estimate_bytes(src, width: int, ffn: int | None, itemsize: int, layers: int | None = None) -> int:
    """About the bytes of ``src`` grown to ``width`` (FFN ``ffn``, default scaled with the width) and
    ``layers`` blocks (default the source's)."""
    f = ffn if ffn is not None else -(-src.ffn * width // src.width)
    per_layer = 4 * width * width + 3 * width * f
    return itemsize * ((layers or src.layers) * per_layer + src.vocab_size * width * (1 if src.tie else 2))


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return str(n)


def check_growth(src, width: int, ffn: int | None, itemsize: int, what: str = "--width") -> None:
    """GrowError when the grown model could not exist on any machine (before the plan is built)."""
    need = estimate_bytes(src, width, ffn, itemsize)
    if need > MAX_BYTES:
        raise GrowError(f"{what} {width}: the grown model would need about {_human(need)}, beyond any machine")


def header_bytes(src, layers: int) -> int:
    """About the bytes of the safetensors header of ``src`` at ``layers`` blocks: one JSON entry per
    tensor (its name, dtype, shape and two offsets of up to 16 digits)."""
    from growtool.nn.families import tensor_specs

    specs = tensor_specs(src)
    block = [n for n, sp in specs.items() if "{i}" in sp.pattern]
    entry = max((len(n) for n in specs), default=0) + len(str(layers)) + 96
    return entry * (len(specs) - len(block) + -(-len(block) * layers // max(src.layers, 1)))


def check_depth(src, layers: int, itemsize: int, what: str = "--layers") -> None:
    """GrowError when ``src`` grown to ``layers`` blocks could not be written and read back: its
    bytes beyond any machine (MAX_BYTES), or its header beyond MAX_HEADER (100 MiB), the largest
    header growtool and the safetensors library read (about 100,000 blocks of a Llama). Checked
    before a depth plan is built: the plan holds an entry per tensor."""
    need = src.n_params() * itemsize * layers // max(src.layers, 1)
    if need > MAX_BYTES:
        raise GrowError(f"{what} {layers}: the grown model would need about {_human(need)}, beyond any machine")
    head = header_bytes(src, layers)
    if head > MAX_HEADER:
        raise GrowError(
            f"{what} {layers}: the grown checkpoint's header would take about {_human(head)}, beyond the "
            f"{_human(MAX_HEADER)} a safetensors reader accepts"
        )


def memory_bytes(device) -> int | None:
    """The memory of ``device`` (a torch device): the GPU's, or the host's physical memory."""
    import os

    import torch

    try:
        if getattr(device, "type", str(device)) == "cuda":
            return torch.cuda.get_device_properties(device).total_memory
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, RuntimeError, AssertionError):
        return None


TRAIN_BYTES_PER_PARAM = 16  # float32 weights, their gradients and AdamW's two moments


def check_trainable(src, width: int, layers: int, device, what: str) -> None:
    """GrowError when training ``src`` grown to ``width`` and ``layers`` (weights, gradients, AdamW
    moments in float32) would not fit the memory of ``device``: a ``--grow-at`` target, checked
    before any data is read."""
    need, have = estimate_bytes(src, width, None, TRAIN_BYTES_PER_PARAM, layers), memory_bytes(device)
    where = "the GPU" if getattr(device, "type", device) == "cuda" else "this machine"
    if have and need > have:
        raise GrowError(
            f"{what}: training the grown model needs about {_human(need)} (weights, gradients and AdamW "
            f"moments in float32); {where} has {_human(have)}"
        )


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
