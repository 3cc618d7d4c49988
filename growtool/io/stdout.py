"""Writes to standard output that are checked: every byte written, or one clear error.

``shutil.copyfileobj`` and a text stream over an unbuffered ``FileIO`` (``python -u``,
``PYTHONUNBUFFERED=1``) drop the rest of a short write silently: ``expand -o - > file`` on a full
disk exited 0 with a quarter of the checkpoint written. Here:

* ``write_all(data)`` writes until every byte is taken, to the file descriptor of ``sys.stdout``
  (waiting while a non-blocking one is full);
  a closed pipe, a full disk or a write that takes nothing raises ``StdoutError`` (a GrowError: one
  line, exit 2, never 1, which means "a check failed");
* ``harden()`` (once, as the program starts) puts a buffered writer under ``sys.stdout`` where it
  was a bare ``FileIO`` (a buffered writer retries short writes), and stands in for a closed
  standard output with a stream whose writes fail with that error;
* ``finish()`` flushes it, checked; after a failure ``silence()`` points the descriptor at
  /dev/null, so that the interpreter's own flush at exit has nothing left to fail on.
"""

from __future__ import annotations

import errno
import io
import os
import select
import sys

from growtool.nn.errors import GrowError

CHUNK = 1 << 20


class StdoutError(GrowError):
    """Standard output could not take everything written to it."""


def _why(e: OSError) -> str:
    if e.errno == errno.EPIPE:
        return "closed by the reader (broken pipe)"
    if e.errno == errno.EBADF:
        return "closed"
    return e.strerror or str(e)


def error(e: OSError, done: int | None = None, total: int | None = None) -> StdoutError:
    part = f" after {done:,} of {total:,} bytes" if done is not None and total is not None else ""
    return StdoutError(f"standard output: {_why(e)}{part}; the output is incomplete")


class Closed(io.TextIOBase):
    """What ``sys.stdout`` is when the process started with standard output closed."""

    def writable(self) -> bool:
        return True

    def write(self, s):
        raise OSError(errno.EBADF, "standard output is closed")


def _fd() -> int | None:
    try:
        return sys.stdout.fileno()
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return None


def write_all(data, before: int = 0, total: int | None = None) -> None:
    """Write ``data`` (bytes-like) to standard output, all of it, or raise StdoutError (which says
    how much of ``total`` bytes got through, ``before`` of them written by earlier calls)."""
    view, done = memoryview(data).cast("B"), 0
    total = before + view.nbytes if total is None else total
    if sys.stdout is None or isinstance(sys.stdout, Closed):
        raise StdoutError("standard output is closed; nothing written")
    try:
        sys.stdout.flush()
        fd = _fd()
        while done < view.nbytes:
            piece = view[done : done + CHUNK]
            try:
                n = os.write(fd, piece) if fd is not None else sys.stdout.buffer.write(piece)
            except BlockingIOError:  # a non-blocking descriptor that is full: wait until it takes more
                select.select([], [fd], [])
                continue
            if not n:
                raise OSError(errno.EIO, f"a write of {piece.nbytes:,} bytes took none")
            done += n
        if fd is None:
            sys.stdout.buffer.flush()
    except OSError as e:
        silence()
        raise error(e, before + done, total) from None


def copy_file(fh, total: int) -> None:
    """Copy the file object ``fh`` (from its position, ``total`` bytes) to standard output, checked."""
    done = 0
    while chunk := fh.read(CHUNK):
        write_all(chunk, done, total)
        done += len(chunk)


def harden() -> None:
    """Make ``sys.stdout`` safe to write to (see the module docstring). Only the real streams."""
    if sys.stdout is None:
        sys.stdout = Closed()
        return
    buf = getattr(sys.stdout, "buffer", None)
    if isinstance(sys.stdout, io.TextIOWrapper) and isinstance(buf, io.FileIO):
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(buf), encoding=sys.stdout.encoding, errors=sys.stdout.errors)


def finish() -> None:
    """Flush standard output; StdoutError if it cannot take what was written."""
    try:
        if sys.stdout is not None and not isinstance(sys.stdout, Closed):
            sys.stdout.flush()
    except OSError as e:
        silence()
        raise error(e) from None


def silence() -> None:
    """After a failed write: what is still buffered is dropped, and fd 1 goes to /dev/null."""
    fd = _fd()
    if fd is None:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass
