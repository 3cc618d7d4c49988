"""The source checkpoint's sha256, computed by a child process forked as ``growtool expand`` / ``fold``
starts, before torch is imported.

The program's first second goes to importing torch, on one core. ``start`` (called by the
``growtool`` script first) finds the command's source among its arguments and forks a process that
hashes the source's files meanwhile, on a core the import leaves idle; the growth that follows then
has every core to itself. (A thread could not do this: the import holds the GIL, and a thread that
hashed during it slowed the start.) ``take(files)`` hands the digest over if the child hashed
exactly those files, unchanged since it began; otherwise the caller hashes them itself
(``checkpoint.SourceHash``). Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import signal
import threading
from pathlib import Path

from growtool.io import confine
from growtool.nn.errors import GrowError

COMMANDS = ("expand", "fold")  # the commands whose lineage records their source's sha256
FLAGS = ("-q", "--quiet", "--force", "--allow-lossy", "--debug")  # options without a value
CHUNK = 1 << 20
# Bytes the hashing child maps at a time. Through maps the 3.9 GB of the 4 GB folder's first two
# shards (in the page cache) took 3.61 s of CPU to hash, against 4.10 s through ``readinto``
# (the kernel's copy into the buffer); the rest is sha256 itself, about 1 GB/s on one core with
# the CPU's SHA instructions (bench/results/surgery/ROUNDS.md, round 10). A window's pages count in the child's
# resident memory until it is unmapped: 16 MB at most.
WINDOW = 16 << 20

_lock = threading.Lock()
_child: dict | None = None  # pid, fd (the pipe's read end), files, stats, taken (a ``take`` is reading)


def checkpoint_files(src: str) -> list[Path]:
    """The files a checkpoint is read and hashed from, in order: the file itself, or a Hugging Face
    folder's shards (sorted, from its index) or its model.safetensors. GrowError if there are none."""
    p = Path(src)
    if not src or src == "-":
        raise GrowError("standard input is not a file")
    if not p.exists():
        raise GrowError(f"{p}: no such file or folder")
    if not p.is_dir():
        confine.regular(p, "a checkpoint file")  # a FIFO would block the reader (and the hashing child)
        return [p]
    if not (p / "config.json").exists():
        if p.suffix == ".safetensors":
            raise GrowError(f"{p}: is a folder, not a safetensors file (and holds no config.json)")
        raise GrowError(f"{p}: folder has no config.json (not a Hugging Face model folder)")
    index = p / "model.safetensors.index.json"
    if index.exists():
        try:
            names = json.loads(confine.read_small(index, "safetensors index"))["weight_map"].values()
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise GrowError(f"{index}: not a valid safetensors index (no weight_map)") from None
        files = sorted({p / confine.plain_name(v, index) for v in names})
        for f in files:
            if not f.exists():
                raise GrowError(f"{index}: shard {f.name} is missing")
            confine.inside(f, p, "a shard in its index")  # no link out of the folder (HF cache blobs allowed)
        return files
    if (p / "model.safetensors").exists():
        return [p / "model.safetensors"]
    raise GrowError(f"{p}: folder has neither model.safetensors nor model.safetensors.index.json")


def sha256_of(files: list[Path], raw: bytes | None = None, stop=None, mapped: bool = False) -> str | None:
    """sha256 of ``raw`` followed by the bytes of ``files`` in turn; None once ``stop.is_set()``.

    ``mapped``: read the files through memory maps (``_mapped_chunks``) instead of with
    ``readinto``; for the hashing child only, since a file truncated meanwhile kills the process
    that maps it (SIGBUS), which the child may do and the command may not."""
    h = hashlib.sha256()
    if raw is not None:
        h.update(raw)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            for chunk in _mapped_chunks(fh) if mapped else _read_chunks(fh):
                if stop is not None and stop.is_set():
                    return None
                h.update(chunk)
    return h.hexdigest()


def _read_chunks(fh):
    buf = memoryview(bytearray(CHUNK))  # one buffer, read into: no allocation per chunk
    while n := fh.readinto(buf):
        yield buf[:n]


def _mapped_chunks(fh):
    """The file as maps of WINDOW bytes, each populated at once (MAP_POPULATE, where there is one)
    and unmapped once hashed."""
    size, flags = os.fstat(fh.fileno()).st_size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    for off in range(0, size, WINDOW):
        with mmap.mmap(fh.fileno(), min(WINDOW, size - off), flags, mmap.PROT_READ, offset=off) as m:
            yield m


def _stats(files: list[Path]) -> list[tuple]:
    return [(s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in (os.stat(f) for f in files)]


class _Orphaned:
    """``stop`` for the child: set once the parent is gone (its process then belongs to another)."""

    def __init__(self):
        self.parent = os.getppid()

    def is_set(self) -> bool:
        return os.getppid() != self.parent


def start(args: list[str]) -> None:
    """Fork the hashing child for ``growtool ARGS`` when they name an expand / fold source: the
    first argument that is not an option or an option's value (options other than FLAGS take one)
    and resolves to checkpoint files. A wrong guess costs only the child's work: ``take`` hands
    nothing over for other files."""
    global _child
    if not hasattr(os, "fork") or len(args) < 2 or args[0] not in COMMANDS or "--dry-run" in args:
        return
    if os.environ.get("GROWTOOL_NO_PREHASH"):
        return
    for prev, arg in zip(args, args[1:]):
        if arg.startswith("-") or (prev.startswith("-") and "=" not in prev and prev not in FLAGS):
            continue
        try:
            files = checkpoint_files(arg)
            stats = _stats(files)
        except (GrowError, OSError):
            continue
        break
    else:
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: hash, send the digest, and leave without the parent's cleanup
        code = 1
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # the parent's output (a pipe, maybe) must not wait for this process
                os.dup2(null, fd)
            digest = sha256_of(files, stop=_Orphaned(), mapped=True)
            if digest is not None:
                os.write(w, digest.encode())
                code = 0
        finally:
            os._exit(code)
    os.close(w)
    with _lock:
        _child = {"pid": pid, "fd": r, "files": files, "stats": stats, "taken": False}


def take(files: list[Path]) -> str | None:
    """The child's digest of ``files``, if it hashed exactly these, unchanged from before it began
    to now; None otherwise (no child, another source, a failure, a change, or ``cancel``). Waits
    for the child."""
    global _child
    with _lock:
        c = _child
        if c is None or c["taken"]:
            return None
        c["taken"] = True
    try:
        data = b""
        if [Path(f) for f in files] == c["files"]:
            while chunk := os.read(c["fd"], 64):
                data += chunk
        ok = len(data) == 64 and _stats(c["files"]) == c["stats"]
        return data.decode() if ok else None
    except OSError:
        return None
    finally:
        with _lock:
            _child = None
        _end(c)


def cancel() -> None:
    """Stop the child, if any: its digest is no longer wanted (a ``take`` waiting for it returns
    None)."""
    global _child
    with _lock:
        c = _child
        if c is None:
            return
        if c["taken"]:  # ``take`` is reading: ending the child ends its read, and ``take`` cleans up
            _kill(c["pid"])
            return
        _child = None
    _end(c)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _end(c: dict) -> None:
    _kill(c["pid"])
    os.waitpid(c["pid"], 0)
    os.close(c["fd"])
