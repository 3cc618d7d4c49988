"""Where growtool reads and writes: inside the input, and never over it.

Reads (``inside``, ``regular``, ``read_small``): a file named by an input (a shard in an index's
``weight_map``, a carried tokenizer or generation file) must resolve inside the input's folder; the
one exception is a Hugging Face cache snapshot (``.../models--X/snapshots/<rev>/``), whose files are
links into ``.../models--X/blobs/``. Inputs must be regular files (a FIFO would block, a device
never end), and small files (configs, indexes, tokenizers) are read up to a limit.

Writes (``check_output``, ``check_run_folder``, ``place``): an output path must not be, hold, or
lie inside anything an input is read from (the input file, its folder's config.json and tokenizer
files, a whole input folder), with or without ``--force``; nor be the current folder. The check
runs before any work and again at the final rename, which without ``--force`` never replaces a file
or folder that appeared meanwhile (``renameat2(RENAME_NOREPLACE)``).

Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from growtool.io.carried import CARRIED
from growtool.nn.errors import GrowError

SMALL = 64 << 20  # config.json, index, chat templates
TOKENIZER = 1 << 30  # tokenizer.json, sentencepiece models, vocab files


def _cache_blobs(folder: Path) -> Path | None:
    """``.../models--X/blobs`` when ``folder`` is a snapshot of a Hugging Face cache, else None."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(("models--", "datasets--")):
        return folder.parent.parent / "blobs"
    return None


def inside(path: Path, folder: Path, what: str) -> Path:
    """``path`` resolved; GrowError unless it lies inside ``folder`` (or its HF cache blobs)."""
    real, home = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    if real == home or home in real.parents:
        return real
    blobs = _cache_blobs(Path(os.path.abspath(folder)))
    if blobs is not None and Path(os.path.realpath(blobs)) in real.parents:
        return real
    raise GrowError(f"{path}: {what} resolves to {real}, outside {folder} (refused: inputs are read only from there)")


def plain_name(name, index: Path) -> str:
    """A shard name from an index: a relative path without '..' (sub-folders allowed)."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in Path(name).parts:
        raise GrowError(f"{index}: names a shard {str(name)[:80]!r} outside its folder (refused)")
    return name


def regular(path: Path, what: str = "input") -> os.stat_result:
    """``path``'s stat; GrowError unless it is a regular file (a folder, pipe or device is refused)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GrowError(f"{path}: no such file") from None
    except OSError as e:
        raise GrowError(f"{path}: cannot read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise GrowError(f"{path}: is a folder, not a file ({what})")
    if not stat.S_ISREG(st.st_mode):
        kind = "a pipe" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "not a file"
        raise GrowError(f"{path}: is {kind}, not a regular file ({what}; give a file, or - for standard input)")
    return st


def read_small(path: Path, what: str, limit: int = SMALL) -> bytes:
    """The bytes of a small regular file, at most ``limit`` of them (GrowError beyond)."""
    regular(path, what)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise GrowError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > limit:
        raise GrowError(f"{path}: larger than {limit:,} bytes, too large for a {what}")
    return data


# ---- outputs --------------------------------------------------------------------------------


def _real(p) -> Path:
    """``p`` made absolute with links resolved, whether or not it exists."""
    return Path(os.path.realpath(os.path.abspath(p)))


def read_set(src: str) -> list[tuple[Path, bool]]:
    """What an input is read from: (resolved path, is a whole folder). A file brings its folder's
    config.json and tokenizer files (read when present); a folder is an input as a whole."""
    if src in ("", "-"):
        return []
    p = Path(src)
    if p.is_dir():
        return [(_real(p), True)]
    out = [(_real(p), False)]
    for name in ("config.json", "model.safetensors.index.json", *CARRIED):
        if (p.parent / name).exists():
            out.append((_real(p.parent / name), False))
    return out


def overlap(dest: Path, inputs: Iterable[str]) -> str | None:
    """The input that writing ``dest`` (a file or folder, existing or not) would touch, or None."""
    d = _real(dest)
    for src in inputs:
        for r, whole in read_set(str(src)):
            if d == r or d in r.parents or (whole and r in d.parents):
                return str(src)
    return None


def check_output(out: str, inputs: Iterable[str]) -> None:
    """GrowError if output ``out`` overlaps an input, or is the current folder or one above it."""
    if out == "-":
        return
    d, here = _real(out), _real(".")
    if d == here or d in here.parents or Path(out).name in ("", ".", ".."):
        raise GrowError(f"{out}: output would replace the current folder (give a new name)")
    hit = overlap(Path(out), inputs)
    if hit is not None:
        raise GrowError(f"{out}: output would overwrite the input {hit} or a file it is read with (another output)")


def check_run_folder(out: Path, inputs: Iterable[str]) -> None:
    """``train --out``: the run folder must not hold (or be) anything a training input is read from,
    nor lie inside an input folder (whose files are all read: the run's own among them)."""
    d = _real(out)
    for src in inputs:
        for r, whole in read_set(str(src)):
            if d == r or d in r.parents:
                raise GrowError(f"{out}: the run folder holds the input {src}, which its files could replace")
            if whole and r in d.parents:
                raise GrowError(
                    f"{out}: the run folder lies inside the input folder {src}, which would read it as input"
                )


_renameat2 = None


def _no_replace(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` to ``dest`` only if nothing is there (atomically, where the system can)."""
    global _renameat2
    if _renameat2 is None:
        try:
            _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
            _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        except (OSError, AttributeError):
            _renameat2 = False
    if _renameat2:
        if _renameat2(-100, os.fsencode(tmp), -100, os.fsencode(dest), 1) == 0:  # AT_FDCWD, RENAME_NOREPLACE
            return
        e = ctypes.get_errno()
        if e == errno.EEXIST:
            raise FileExistsError(e, os.strerror(e), str(dest))
        if e not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(e, os.strerror(e), str(dest))
    if os.path.lexists(dest):  # no renameat2 here: a narrow window remains
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest))
    os.rename(tmp, dest)


def place(dest: Path, inputs: Iterable[str], force: bool, replace: Callable[[Path, Path], None] = os.replace):
    """The final rename of a finished temporary file or folder to ``dest``: the overlap check again,
    then ``replace`` (with ``force``) or a rename that never replaces what appeared meanwhile."""
    inputs = list(inputs)

    def rename(tmp: Path, target: Path) -> None:
        check_output(str(dest), inputs)
        if force:
            replace(tmp, target)
            return
        try:
            _no_replace(Path(tmp), Path(target))
        except FileExistsError:
            raise GrowError(f"{dest}: output appeared while this one was written (--force replaces it)") from None

    return rename


# ---- run folders and caches: files made and read without following links -------------------

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX; elsewhere O_EXCL alone still never opens a planted link


def open_regular(path: Path, what: str = "file", mode: str = "rb"):
    """``path`` opened for reading (``"rb"``) or updating in place (``"r+b"``) only if it is a regular
    file and not a link: opened with ``O_NOFOLLOW | O_NONBLOCK`` (a link, or a FIFO with no writer,
    cannot redirect or block the open) and checked on the open descriptor (no window between check
    and use). GrowError for anything else; FileNotFoundError passes through."""
    flags = (os.O_RDWR if mode == "r+b" else os.O_RDONLY) | NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise GrowError(f"{path}: is a link, not a regular file of the {what} (refused)") from None
        raise GrowError(f"{path}: cannot read ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise GrowError(f"{path}: not a regular file of the {what} (refused)")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, mode)


def read_regular(path: Path, what: str = "file", limit: int = SMALL) -> bytes:
    """The bytes of a small regular, unlinked file of a run folder or cache (``open_regular``)."""
    with open_regular(path, what) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise GrowError(f"{path}: larger than {limit:,} bytes, too large for a {what} record")
    return data


def create_new(path: Path):
    """A new file at ``path`` for writing: whatever is there (a file, a link planted to redirect the
    write) is first unlinked, then the file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so the
    bytes land in a fresh file of this folder and never through a link."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise GrowError(f"{path}: is a folder, not a file this tool writes (refused)") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "wb")


def same_file(fh, path: Path) -> bool:
    """Is ``path`` (not followed) still the file open as ``fh``? (checked before it is renamed into place)"""
    try:
        a, b = os.fstat(fh.fileno()), os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(b.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def real_dir(path: Path, what: str) -> None:
    """GrowError if ``path`` exists as anything but a folder (a link to a folder elsewhere included)."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        raise GrowError(f"{path}: is a link or not a folder ({what}; refused)")


def run_file(path: Path, what: str = "run folder") -> Path:
    """``path`` if it is a regular file itself (not a link out of its folder, not a FIFO): for files of
    a run folder read by name elsewhere (``last.safetensors``). GrowError otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise GrowError(f"{path}: no such file ({what})") from None
    if not stat.S_ISREG(st.st_mode):
        raise GrowError(f"{path}: not a regular file of the {what} (a link or special file; refused)")
    return path
