"""Files: atomic writes (temporary file, fsync, rename), destination checks before any work
(``check_destination``: never an input, never an existing output without force), and sizes (``parse_size``).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from growtool.io import confine
from growtool.nn.errors import GrowError


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename into it is durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def atomic_file(dest: Path, write: Callable[[io.BufferedWriter], None], place: Callable | None = None) -> None:
    """Write ``dest`` through a temporary file in its folder: fsync, then rename (``place(tmp, dest)``
    instead where given: ``confine.place``). Nothing partial remains."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        (place or os.replace)(tmp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def is_folder_target(out: str) -> bool:
    return not out.endswith(".safetensors") and out != "-"


def _clobbers(dest: Path, inp: Path) -> bool:
    """Would replacing ``dest`` (both resolved, dest existing) destroy ``inp`` or a file of it?"""
    return dest == inp or dest in inp.parents or (inp.is_dir() and inp in dest.parents)


def check_destination(out: str, inputs: Iterable[str], force: bool) -> Path | None:
    """Refuse a destination that would overwrite an input, already exists (without force),
    or sits in a missing / unwritable folder. Returns the path (None for stdout)."""
    if out == "-":
        return None
    dest = Path(out)
    confine.check_output(out, [str(i) for i in inputs])  # not the input, nor a file it is read with, nor in it
    parent = dest.parent if str(dest.parent) else Path(".")
    if not parent.is_dir():
        raise GrowError(f"{dest}: output folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise GrowError(f"{dest}: output folder {parent} is not writable")
    if dest.exists() and not force:
        raise GrowError(f"{dest}: output exists (pass --force to replace it)")
    return dest


SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """``"500MB"`` -> 500_000_000, ``"2GiB"`` -> 2 * 2**30, ``"1000"`` -> 1000 bytes (as Hugging Face)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or (unit and unit not in SIZE_UNITS):
        raise GrowError(f"--shard-size {text!r} is not a size (e.g. 500MB, 2GB, 1GiB, or bytes)")
    n = int(float(m.group(1)) * SIZE_UNITS[unit or "b"])
    if n <= 0:
        raise GrowError(f"--shard-size must be positive, got {text!r}")
    return n


def _replace(tmp: Path, dest: Path) -> None:
    """Move the finished ``tmp`` (file or folder) to ``dest``. An existing ``dest`` is first renamed
    aside (a folder cannot be replaced by one rename), then deleted once ``tmp`` is in place."""
    old = None
    if dest.exists() or dest.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent)) / "old"
        try:
            os.replace(dest, old)
        except BaseException:
            shutil.rmtree(old.parent, ignore_errors=True)  # nothing hidden left behind
            raise
    try:
        os.replace(tmp, dest)
    except BaseException:
        if old is not None:
            os.replace(old, dest)
            shutil.rmtree(old.parent, ignore_errors=True)
        raise
    fsync_dir(dest.parent)
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m
