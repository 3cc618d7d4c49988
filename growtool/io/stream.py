"""The streaming writer: tensors produced by a pool of threads (``prefetch``) and written in order
(``write_stream``) through a buffered or an O_DIRECT sink, the disk started on them as they go
(``start_writeback``).
"""

from __future__ import annotations

import errno
import functools
import io
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from growtool.io import header as fmt
from growtool.io import overflow
from growtool.io.header import Progress, _header_bytes, _nbytes
from growtool.machine import linux_call

# bench/write_chunks.py: on a quiet disk 1 MB writes were as fast as a kernel file copy and several
# times faster than 4-16 MB ones; on a slow disk the size made no consistent difference. Whole
# tensors in one write() were slower still (1.9-4.4 s for 1.9 GB against 0.6 s in pieces).
WRITE_CHUNK = 1 << 20
WRITEBACK_EVERY = 1 << 26  # start the disk writing every 64 MB written (see ``start_writeback``)
# An output of fewer bytes is produced in the writer's own thread: there, handing each piece from a
# producing thread to the writer costs more than their overlap gives back (bench/write_small.py).
INLINE_BELOW = 4 << 20


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``nbytes`` at ``offset`` of ``fd`` to disk, without waiting
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere nothing). Otherwise the dirty pages
    of a file written in a few seconds mostly wait in memory for the final fsync, which then writes
    them all while nothing else happens; started early, the disk writes while the next tensors are
    grown. The pages stay cached. Measured here: 2 GB written in 16 MB pieces + fsync, median of 6,
    0.69 s this way against 0.99 s without."""
    fn = linux_call("sync_file_range", "c_int", "c_int64", "c_int64", "c_uint")
    if fn is not None and nbytes > 0:
        fn(fd, offset, nbytes, 2)  # SYNC_FILE_RANGE_WRITE; a failure only means no early start


class BufferedSink:
    """A stream written through the page cache (``fh.write`` in 1 MB pieces), the disk asked every
    64 MB to start writing (``start_writeback``). Any writable file object: pipes and spools too."""

    def __init__(self, fh):
        self.fh, self.written, self.started = fh, 0, 0  # bytes written, and up to where the disk was asked

    def write(self, b: memoryview, release: Callable[[], None] | None = None) -> None:
        for i in range(0, b.nbytes, WRITE_CHUNK):  # 1 MB writes (see WRITE_CHUNK)
            chunk = b[i : i + WRITE_CHUNK]
            self.fh.write(chunk)
            self.written += chunk.nbytes
            if self.written - self.started >= WRITEBACK_EVERY:
                self.fh.flush()
                start_writeback(self.fh.fileno(), self.started, self.written - self.started)
                self.started = self.written
        if release is not None:
            release()

    def close(self, abandon: bool = False) -> None:
        if not abandon:
            self.fh.flush()


class DirectSink:
    """A stream written to a regular file past the page cache (Linux ``O_DIRECT``), which needs
    4 KB-aligned memory, lengths and file offsets:

    * bytes whose memory sits at the same place within a 4 KB page as their file offset (outputs
      from ``engine.Workspace.output`` after ``place``) go to the disk straight from that memory,
      all but the unaligned first and last few bytes, written by the thread (the memory is
      ``release``d after; up to HELD bytes wait);
    * other bytes are copied into page-aligned 4 MB buffers, and the thread writes each buffer to
      the disk while the next one fills; the last one is written padded to 4 KB, and the file is then
      truncated to the stream's length.

    No page cache is filled and no dirty pages wait for the final fsync: measured here, 1 GB
    written + fsynced in 0.34-0.58 s with 0.03 s of CPU, against 0.5-3.0 s and 0.24-2.7 s of CPU
    through the page cache (which varied with the cache's state).

    ``open(fh)`` returns None where direct I/O is unavailable (not Linux, a pipe, tmpfs, a file
    system without it): then use ``BufferedSink``. A direct write refused with EINVAL (an alignment
    the device does not accept) falls back to ordinary writes for the rest of the file."""

    ALIGN = 4096
    SIZE = 4 << 20
    BUFFERS = 4
    STRAIGHT = 1 << 20  # pieces from this size are written from their own memory when placed right
    HELD = 32 << 20  # bytes of such pieces waiting for the writing thread (or one larger piece)

    @classmethod
    def open(cls, fh) -> DirectSink | None:
        direct = getattr(os, "O_DIRECT", 0)
        try:
            import fcntl

            fh.flush()
            fd = fh.fileno()
            if not direct or fh.tell() != 0 or not os.path.isfile(f"/proc/self/fd/{fd}"):
                return None
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | direct)  # EINVAL where the file system has no direct I/O
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation, ImportError):
            return None
        return cls(fd, flags)

    def __init__(self, fd: int, flags: int):
        import mmap
        import queue

        self.fd, self.flags, self.error, self.direct = fd, flags, None, True
        self.lock = threading.Lock()
        self.pending, self.held = threading.Condition(), 0  # bytes handed to the thread to write straight
        self.start = 0  # file offset of the current buffer (always 4 KB-aligned)
        self.free, self.todo = queue.Queue(), queue.Queue()
        for _ in range(self.BUFFERS):
            self.free.put(mmap.mmap(-1, self.SIZE))  # anonymous maps are page-aligned
        self.buf, self.pos = self.free.get(), 0
        self.view = torch.frombuffer(self.buf, dtype=torch.uint8)
        self.thread = threading.Thread(target=self._io, name="growtool-write", daemon=True)
        self.thread.start()

    def write(self, b: memoryview, release: Callable[[], None] | None = None) -> None:
        """Append ``b`` (a writable byte view). ``release()`` is called once ``b``'s memory is no
        longer needed (now, or once the writing thread has sent it to the disk). Copies are torch's,
        which let other threads run meanwhile (a copy into the map by slice assignment would hold
        the GIL: 1 GB of it stalled the threads growing the next tensors)."""
        src = torch.frombuffer(b, dtype=torch.uint8) if b.nbytes else None
        here = self.start + self.pos
        if self.direct and b.nbytes >= self.STRAIGHT and (src.data_ptr() - here) % self.ALIGN == 0:
            head = -here % self.ALIGN  # to the next aligned file offset, through the buffer
            self._copy(src[:head])
            if self.pos:
                self._submit()  # the buffer ends on an aligned offset: written as it is
            n = (b.nbytes - head) // self.ALIGN * self.ALIGN
            tail = src[head + n :]
            with self.pending:  # at most HELD bytes (or one piece) waiting to be written straight
                self.pending.wait_for(lambda: self.held == 0 or self.held + n <= self.HELD)
                self.held += n
            self.todo.put((b[head : head + n], self.start, functools.partial(self._written, n, release)))
            self.start += n  # b's middle is written from its own memory
            self._copy(tail)
            return
        if src is not None:
            self._copy(src)
        if release is not None:
            release()

    def _written(self, n: int, release: Callable[[], None] | None) -> None:
        """A piece written straight from its memory is done: ``n`` bytes less wait, memory released."""
        with self.pending:
            self.held -= n
            self.pending.notify_all()
        if release is not None:
            release()

    def _queue(self) -> None:
        """Hand the current buffer (ending on an aligned offset, or the stream's last) to the thread,
        written padded to 4 KB; the buffer is free again once written."""
        data = memoryview(self.buf)[: -(-self.pos // self.ALIGN) * self.ALIGN]
        self.todo.put((data, self.start, functools.partial(self.free.put, self.buf)))

    def _copy(self, src: torch.Tensor) -> None:
        done = 0
        while done < src.numel():
            n = min(src.numel() - done, self.SIZE - self.pos)
            self.view[self.pos : self.pos + n].copy_(src[done : done + n])
            self.pos += n
            done += n
            if self.pos == self.SIZE:
                self._submit()

    def _submit(self) -> None:
        if self.error is not None:
            raise self.error
        self._queue()
        self.start += self.pos
        self.buf, self.pos = self.free.get(), 0  # waits while every buffer is being written
        self.view = torch.frombuffer(self.buf, dtype=torch.uint8)

    def _pwrite(self, data: memoryview, off: int) -> None:
        """Write ``data`` (aligned length, and aligned memory unless direct I/O was given up) at
        ``off``; on EINVAL give direct I/O up for the rest of the file and write it ordinarily."""
        import fcntl

        try:
            done = 0
            while done < data.nbytes:
                done += os.pwrite(self.fd, data[done:], off + done)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            with self.lock:  # both threads may meet it
                if self.direct:
                    self.direct = False
                    fcntl.fcntl(self.fd, fcntl.F_SETFL, self.flags)  # no direct I/O here after all
            os.pwrite(self.fd, data, off)

    def _io(self) -> None:
        while (item := self.todo.get()) is not None:
            data, off, done = item  # bytes, file offset, and what to call once written
            try:
                if self.error is None:
                    self._pwrite(data, off)
            except OSError as e:
                self.error = e
            finally:
                del data, item  # the memory may be reused from here on
                done()

    def close(self, abandon: bool = False) -> None:
        """Write what is left, wait for the writes, truncate to the stream's length, and put the
        file back to ordinary I/O (for the header patch and fsync that follow). ``abandon``: the
        stream failed; only stop the writing thread."""
        import fcntl

        end = self.start + self.pos
        if self.pos and not abandon:
            self._queue()
        self.todo.put(None)
        self.thread.join()
        fcntl.fcntl(self.fd, fcntl.F_SETFL, self.flags)
        if abandon:
            return
        if self.error is not None:
            raise self.error
        os.ftruncate(self.fd, end)


@dataclass(frozen=True)
class Producer:
    """What a streaming writer asks for its tensors. ``produce(name)`` makes a tensor (``produce(name,
    (r0, n))`` a piece: rows r0 .. r0+n-1 along the first axis); ``recycle(t)`` is called with each
    produced tensor once it is written and no longer read (its memory may then be reused);
    ``workers`` threads produce at once; ``place(offsets)`` is told the file offset of every piece,
    keyed ``(name, r0)`` (``r0`` 0 for a whole tensor), before any is produced
    (``engine.Workspace.place``); ``pieces(name)``: the row ranges ``[(r0, n), ...]`` a tensor is
    made in, or None for whole (``engine.pieces``)."""

    produce: Callable[..., torch.Tensor]
    recycle: Callable[[torch.Tensor], None] | None = None
    workers: int = 1
    place: Callable[[dict], None] | None = None
    pieces: Callable[[str], list[tuple[int, int]] | None] | None = None


def _layout(specs, producer: Producer, start: int) -> tuple[list, dict]:
    """The items written, (name, shape, dtype, rows or None) in file order, and each one's offset
    keyed (name, r0), for tensors laid out from byte ``start``."""
    items, offsets, off = [], {}, start
    for name, shape, dt in specs:
        for rows in (producer.pieces(name) if producer.pieces else None) or [None]:
            items.append((name, shape, dt, rows))
            offsets[name, rows[0] if rows else 0] = off + (rows[0] * _nbytes(shape[1:], dt) if rows else 0)
        off += _nbytes(shape, dt)
    return items, offsets


def write_stream(
    fh,
    specs,
    producer: Producer,
    meta: dict,
    progress: Progress | None = None,
    source_hash=None,
) -> None:
    """Write a safetensors stream: header from ``specs``, then each tensor (or each of its pieces,
    written as soon as it is made: a vocabulary-sized tensor then needs neither a block of its own
    size nor a wait for its last row before its first is written) from ``producer``;
    ``progress(name, nbytes)`` after each tensor. With ``source_hash`` (a ``checkpoint.SourceHash``)
    the header is written with its token and rewritten in place with the digest once the tensors
    are written (``fh`` must be a seekable file: the caller fsyncs it afterwards).

    Producing and writing overlap (for an output of ``INLINE_BELOW`` bytes or more; a smaller one is
    produced in this thread): ``producer.workers`` threads produce the next pieces while piece k is
    written (torch and file writes release the GIL), up to ``3 * workers`` pieces alive at a
    time (made and not yet written: a worker may run ahead past small tensors while another makes a
    large one) and together at most twice the largest tensor's bytes (so that memory does not grow
    with the number of cores); the bytes are the same as producing them one after another. A
    regular file is written past the page cache where the system allows it (``DirectSink``), else
    through it (``BufferedSink``).
    """
    header = _header_bytes(specs, meta)
    items, offsets = _layout(specs, producer, len(header))
    if producer.place is not None:
        producer.place(offsets)
    sink = DirectSink.open(fh) or BufferedSink(fh)
    try:
        sink.write(memoryview(bytearray(header)))
        _write_items(sink, items, producer, specs, progress)
    except BaseException:
        sink.close(abandon=True)
        raise
    sink.close()
    if source_hash is not None and source_hash.token.encode() in header:
        os.pwrite(fh.fileno(), source_hash.patch(header), 0)  # same length: only these bytes change


def _write_items(sink, items: list, producer: Producer, specs, progress: Progress | None) -> None:
    """Produce ``items`` ahead on the producer's threads and write each in order into ``sink``."""

    def make(item):
        name, _, _, rows = item
        return producer.produce(name) if rows is None else producer.produce(name, rows)

    recycle, workers = producer.recycle, producer.workers
    done = 0  # bytes of the current tensor written
    sizes = [_nbytes(shape, dt) for _, shape, dt in specs]
    budget = 2 * max(sizes, default=0)
    ahead = 2 * workers if sum(sizes) >= INLINE_BELOW else 0
    made = prefetch(items, make, ahead=ahead, workers=workers, cost=_item_nbytes, budget=budget)
    for item, t in zip(items, made):
        name, shape, dt, rows = item
        want = _item_shape(item)
        if tuple(t.shape) != want or t.dtype != dt:
            raise RuntimeError(f"internal: {name} {rows or ''} made {tuple(t.shape)} {t.dtype}, planned {want} {dt}")
        overflow.check_finite(name, t)  # float16 outputs: no value beyond its range
        b = fmt._tensor_bytes(t)  # looked up here: tests count the tensors alive at each write
        sink.write(b, release=None if recycle is None else functools.partial(recycle, t))
        del t
        done += b.nbytes
        if rows is None or rows[0] + rows[1] == shape[0]:  # the tensor's last piece
            if progress:
                progress(name, done)
            done = 0


def _item_shape(item) -> tuple:
    """Shape of a ``write_stream`` item (name, shape, dtype, rows or None): a tensor or a piece."""
    _, shape, _, rows = item
    return tuple(shape) if rows is None else (rows[1], *shape[1:])


def _item_nbytes(item) -> int:
    return _nbytes(_item_shape(item), item[2])


class _Room:
    """``prefetch``'s claims: the next index, and the results alive (made, not yet released) with
    their summed cost, under one condition; ``close`` stops every claim."""

    def __init__(self, names: list, most: int, cost: Callable[..., int], budget: int):
        self.names, self.most, self.cost, self.budget = names, most, cost, budget
        self.cond, self.stop = threading.Condition(), threading.Event()
        self.next = self.alive = self.spent = 0

    def claim(self) -> int | None:
        """The next index once there is room for its result (in order: no result waits on a later one)."""
        with self.cond:
            while not self.stop.is_set() and self.next < len(self.names):
                i, c = self.next, self.cost(self.names[self.next])
                if self.alive < self.most and (self.alive == 0 or self.spent + c <= self.budget):
                    self.next, self.alive, self.spent = i + 1, self.alive + 1, self.spent + c
                    return i
                self.cond.wait(0.1)
        return None

    def release(self, i: int) -> None:
        with self.cond:
            self.alive -= 1
            self.spent -= self.cost(self.names[i])
            self.cond.notify_all()

    def close(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()


def prefetch(
    names: list,
    produce: Callable[..., torch.Tensor],
    ahead: int = 1,
    workers: int = 1,
    cost: Callable[..., int] | None = None,
    budget: int | None = None,
):
    """Yield ``produce(name)`` for each name (any item) in order, computed ahead by ``workers``
    threads, each taking the next name in turn; at most ``ahead + workers`` results are made but
    not yet yielded and released (each result is released when the loop asks for the next), and
    with ``cost(name)`` (bytes, say) their costs add up to at most ``budget`` (one result alone may
    exceed it). With ``ahead`` 0 every result is made in the caller's thread when asked for. An
    error in ``produce`` is raised here (in order: the first failing name's); leaving the loop
    early stops the workers."""
    if ahead < 1 or len(names) < 2:
        yield from (produce(n) for n in names)
        return
    workers = max(1, min(workers, len(names)))
    room = _Room(names, ahead + workers, cost or (lambda name: 0), budget if budget is not None else 0)
    done = threading.Condition()
    results: dict[int, tuple[bool, object]] = {}

    def work():
        while (i := room.claim()) is not None:
            try:
                item = (True, produce(names[i]))
            except BaseException as e:  # handed to the consumer, raised in its thread
                item = (False, e)
            ok = item[0]
            with done:
                results[i] = item
                done.notify_all()
            del item  # the consumer holds it now: written and dropped there, not kept alive here
            if not ok:
                return

    threads = [threading.Thread(target=work, name=f"growtool-produce-{k}", daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    try:
        for i in range(len(names)):
            with done:
                while i not in results:
                    if not any(t.is_alive() for t in threads):  # a worker died without a result
                        raise RuntimeError(f"internal: no result for {names[i]}")
                    done.wait(0.1)
                ok, item = results.pop(i)
            if not ok:
                raise item
            yield item
            del item
            room.release(i)
    finally:
        room.close()
        for t in threads:
            t.join(timeout=5)
