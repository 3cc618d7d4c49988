"""Checkpoint I/O: safetensors files, Hugging Face folders (single or sharded), standard streams.

Reading is lazy: the header is checked first (so a malformed file gives one clear line), then
each tensor is read on demand with a plain positioned read (no mmap, see ``read_tensor``).
Writing streams: the header is computed from the planned shapes, then each tensor is produced and
written in turn, into a temporary file in the destination folder that is fsynced and renamed into
place - a killed process leaves no partial output. The model config and growth lineage travel in
the safetensors ``__metadata__``.
"""

from __future__ import annotations

import errno
import functools
import io
import json
import math
import os
import re
import secrets
import shutil
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from growtool.io import hf_remote, nanogpt, prehash
from growtool.machine import linux_call
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import IGNORED, arch_of, expected_shapes

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAME = {v: k for k, v in DTYPES.items()}
FLOATS = {"F64", "F32", "F16", "BF16"}
MAX_HEADER = 100 * 1024 * 1024
Progress = Callable[[str, int], None]  # called with (tensor name, bytes) after each tensor read or written


# ---- reading ------------------------------------------------------------------------------


def parse_header(buf: bytes, size: int, src: str) -> tuple[dict, dict, int]:
    """Check a safetensors header: returns (tensor entries, metadata, data start offset).

    ``buf`` holds at least the first 8 + header bytes; ``size`` is the whole file's size.
    """
    if size < 8:
        raise GrowError(f"{src}: not a safetensors file (only {size} bytes)")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER or 8 + n > size:
        raise GrowError(f"{src}: not a safetensors file (header length {n} beyond the file's {size} bytes)")
    try:
        header = json.loads(buf[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise GrowError(f"{src}: not a safetensors file (header is not valid JSON)") from None
    if not isinstance(header, dict):
        raise GrowError(f"{src}: safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise GrowError(f"{src}: safetensors __metadata__ must map strings to strings")
    data_len = size - 8 - n
    spans = []
    for name, e in header.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            raise GrowError(f"{src}: tensor {name} has a malformed header entry")
        dt = e["dtype"]
        if dt not in DTYPES:
            raise GrowError(f"{src}: tensor {name} has unknown dtype {dt!r}")
        shape, offs = e["shape"], e["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise GrowError(f"{src}: tensor {name} has a bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise GrowError(f"{src}: tensor {name} has bad data offsets {offs!r}")
        b, en = offs
        if not (0 <= b <= en <= data_len):
            raise GrowError(
                f"{src}: tensor {name} data offsets {offs} lie outside the file's {data_len} data bytes "
                "(truncated or corrupt file)"
            )
        numel = 1
        for s in shape:
            numel *= s
        if numel * DTYPES[dt].itemsize != en - b:
            raise GrowError(
                f"{src}: tensor {name} shape {shape} ({dt}) needs {numel * DTYPES[dt].itemsize} bytes, "
                f"header gives {en - b}"
            )
        spans.append((b, en, name))
    spans.sort()
    for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise GrowError(f"{src}: tensors {n0} and {n1} overlap in the file")
    return header, meta, 8 + n


def read_file_header(path: Path) -> tuple[dict, dict, int]:
    """(tensor entries, metadata, data start offset) of a safetensors file, checked."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                if n <= MAX_HEADER:
                    head += f.read(n)
    except PermissionError:
        raise GrowError(f"{path}: cannot read (permission denied)") from None
    except IsADirectoryError:
        raise GrowError(f"{path}: is a folder without config.json") from None
    except OSError as e:
        raise GrowError(f"{path}: cannot read ({e.strerror})") from None
    return parse_header(head, size, str(path))


@dataclass
class Checkpoint:
    """A checkpoint opened for lazy reading: config, lineage, and tensors by name."""

    config: ModelConfig
    lineage: list
    source: str
    entries: dict  # name -> (dtype name, shape)
    _get: Callable[[str], torch.Tensor]
    files: list = field(default_factory=list)  # backing files (for hashing)
    raw: bytes | None = None  # stdin bytes
    tokenizer: dict | None = None  # the tokenizer the model expects, as recorded in the metadata (growtool.tokenizer)
    _read_into: Callable | None = None  # (name, into, rows) -> tensor (rows of it) read into ``into(nbytes)`` (files)

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name][1])

    def dtype(self, name: str) -> torch.dtype:
        return DTYPES[self.entries[name][0]]

    def get(
        self, name: str, into: Callable[[int], torch.Tensor] | None = None, rows: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """One tensor, checked for NaN / Inf. ``into(nbytes)``: memory to read it into (a uint8
        tensor of ``nbytes``, e.g. ``growth.Workspace.source``) instead of new memory; the caller
        must be done with the tensor before that memory is handed out again. Ignored for
        checkpoints held in memory. ``rows=(r0, n)``: only rows r0 .. r0+n-1 (along the first
        axis), read from the file on their own."""
        if self._read_into is not None and (into is not None or rows is not None):
            t = self._read_into(name, into, rows)
        else:
            t = self._get(name)
            t = t if rows is None else t.narrow(0, *rows)
        if t.is_floating_point() and t.numel() and not all(map(math.isfinite, map(float, torch.aminmax(t)))):
            # aminmax propagates NaN and shows +-Inf; one pass, no temporary (isfinite().all() is ~15x slower)
            raise GrowError(f"{self.source}: tensor {name} holds NaN or Inf values")
        return t

    def main_dtype(self) -> torch.dtype:
        return self.dtype(next(iter(self.entries)))

    def get_nbytes(self, name: str) -> int:
        """Bytes of one tensor's data (from the header)."""
        dt, shape = self.entries[name]
        return _nbytes(shape, DTYPES[dt])

    def nbytes(self) -> int:
        """Bytes of tensor data (from the header: nothing is read)."""
        return sum(_nbytes(shape, DTYPES[dt]) for dt, shape in self.entries.values())

    def tensors(self, progress: Progress | None = None) -> dict[str, torch.Tensor]:
        """Every tensor, read in turn; ``progress(name, nbytes)`` after each."""
        out = {}
        for n in self.entries:
            out[n] = self.get(n)
            if progress:
                progress(n, out[n].numel() * out[n].element_size())
        return out

    def sha256(self, stop: threading.Event | None = None) -> str | None:
        """sha256 of the checkpoint's bytes (its files in turn); None if ``stop`` is set meanwhile."""
        return prehash.sha256_of(self.files, self.raw, stop)

    def model(self, dtype=torch.float32, progress: Progress | None = None):
        from growtool.nn.model import LM

        return LM.from_tensors(self.config, self.tensors(progress), dtype=dtype)


class SourceHash:
    """A checkpoint's sha256, computed in a background thread (file reads and hashlib release the
    GIL) while the output is grown and written, not in a pass of its own before; or taken from the
    child process the ``growtool`` program forked to hash it while torch was imported (``prehash``).

    Until it is known, ``token`` stands in for it: 64 random hex characters, the length of the hex
    digest. ``save(..., source_hash=)`` writes the header with the token and, once the tensors are
    written, rewrites the header in place with the digest (same length: no offset moves) before
    the file is fsynced and renamed into place, so the bytes are those of a file written with the
    digest from the start. ``value()`` waits for the digest; a failure to read raises GrowError
    there (the output is then not written). ``fill(obj)`` replaces the token in JSON-like data."""

    def __init__(self, ck: Checkpoint):
        self.source = ck.source
        self.token = secrets.token_hex(32)
        self._stop = threading.Event()
        self._result: tuple[bool, object] | None = None
        self._thread = threading.Thread(target=self._run, args=(ck,), name="growtool-sha256", daemon=True)
        self._thread.start()

    def _run(self, ck: Checkpoint) -> None:
        try:
            early = prehash.take(ck.files) if ck.raw is None and ck.files else None  # hashed as the program began
            self._result = (True, early or ck.sha256(self._stop))
        except BaseException as e:  # raised in the waiting thread by value()
            self._result = (False, e)

    def value(self) -> str:
        self._thread.join()
        ok, v = self._result
        if ok and v is None:
            raise GrowError(f"{self.source}: hashing was cancelled")
        if ok:
            return v
        if isinstance(v, OSError):
            raise GrowError(f"{self.source}: cannot read ({v.strerror or v})") from None
        raise v

    def patch(self, data: bytes) -> bytes:
        return data.replace(self.token.encode(), self.value().encode())

    def fill(self, obj):
        if isinstance(obj, str):
            return obj.replace(self.token, self.value())
        if isinstance(obj, dict):
            return {k: self.fill(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.fill(v) for v in obj)
        return obj

    def cancel(self) -> None:
        """Stop hashing (the result is no longer needed) and wait for the thread."""
        self._stop.set()
        prehash.cancel()
        self._thread.join()


def _tokenizer_record(meta: dict, src: str) -> dict | None:
    """The ``tokenizer`` metadata entry (a JSON object), or None when absent."""
    if "tokenizer" not in meta:
        return None
    try:
        rec = json.loads(meta["tokenizer"])
    except json.JSONDecodeError:
        rec = None
    if not isinstance(rec, dict):
        raise GrowError(f"{src}: tokenizer record in the metadata is not a JSON object")
    return rec


def _config_from(meta: dict, folder_cfg: Path | None, src: str) -> tuple[ModelConfig, list]:
    raw = None
    if "config" in meta:
        raw = meta["config"]
    elif folder_cfg is not None and folder_cfg.exists():
        raw = folder_cfg.read_text()
    if raw is None:
        raise GrowError(f"{src}: no model config (neither in the safetensors metadata nor a config.json beside it)")
    try:
        hf = json.loads(raw)
    except json.JSONDecodeError:
        raise GrowError(f"{src}: model config is not valid JSON") from None
    try:
        lineage = json.loads(meta.get("lineage", "[]"))
    except json.JSONDecodeError:
        raise GrowError(f"{src}: growth lineage in the metadata is not valid JSON") from None
    try:
        cfg = ModelConfig.from_hf(hf)
    except GrowError as e:
        raise GrowError(f"{src}: {e}") from None
    return cfg, lineage


def _canonical(cfg: ModelConfig, entries: dict) -> dict[str, str]:
    """Stored name -> growtool's name. Architectures list the prefixes other writers drop
    (Hub GPT-2 files store ``h.0.attn...`` for ``transformer.h.0.attn...``)."""
    want, out = expected_shapes(cfg), {}
    for n in entries:
        out[n] = n
        if n not in want:
            for canon, stored in arch_of(cfg).aliases.items():
                if n.startswith(stored) and canon + n[len(stored) :] in want:
                    out[n] = canon + n[len(stored) :]
    return out


def _check_tensors(cfg: ModelConfig, entries: dict, src: str) -> tuple[dict, dict]:
    """(entries by growtool name in canonical order, growtool name -> stored name), checked."""
    names = _canonical(cfg, entries)
    entries = {names[k]: v for k, v in entries.items() if not IGNORED.search(k)}
    stored = {c: k for k, c in names.items()}
    head = arch_of(cfg).modules["head"] + ".weight"
    if cfg.tie and head in entries:
        entries.pop(head)  # HF sometimes stores the tied head too
    want = expected_shapes(cfg)
    missing = [n for n in want if n not in entries]
    extra = [n for n in entries if n not in want]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise GrowError(f"{src}: tensor {missing[0]}{more} missing for a {cfg.family} model of this config")
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise GrowError(f"{src}: unexpected tensor {extra[0]}{more} for a {cfg.family} model of this config")
    for n, shp in want.items():
        dt, got = entries[n]
        if tuple(got) != shp:
            raise GrowError(
                f"{src}: tensor {n} has shape {tuple(got)}, config says {shp} (config and tensors disagree)"
            )
        if dt not in FLOATS:
            raise GrowError(f"{src}: tensor {n} has dtype {dt}; weights must be floating point")
    dts = {entries[n][0] for n in want}
    if len(dts) > 1:
        raise GrowError(f"{src}: tensors mix dtypes {sorted(dts)}")
    return {n: entries[n] for n in want}, {n: stored[n] for n in want}  # canonical order


def read_tensor(
    path: Path, start: int, entry: dict, name: str, into: Callable | None = None, rows: tuple[int, int] | None = None
) -> torch.Tensor:
    """One tensor read with a plain ``readinto`` at its (checked) offsets; ``rows=(r0, n)``: only
    those rows of it (along the first axis: a contiguous range of its bytes).

    No mmap: a memory-mapped file's touched pages count in the process's resident set until it is
    unmapped, so reading a whole checkpoint through ``safe_open`` makes peak RSS grow with the
    file size. An explicit read keeps only the tensor itself in memory (the page cache is not RSS).
    A file truncated meanwhile is a short read and a clear error (a map would raise SIGBUS).
    """
    b, e = entry["data_offsets"]
    dt = DTYPES[entry["dtype"]]
    shape = list(entry["shape"])
    if rows is not None:
        row_bytes = (e - b) // shape[0]
        b, e, shape[0] = b + rows[0] * row_bytes, b + (rows[0] + rows[1]) * row_bytes, rows[1]
    mem = into(e - b) if into is not None else None  # reused memory: no page faults on fresh memory
    buf = mem.numpy() if mem is not None else bytearray(e - b)
    try:
        with open(path, "rb") as fh:
            fh.seek(start + b)
            got = fh.readinto(buf)
    except OSError as err:
        raise GrowError(f"{path}: cannot read tensor {name} ({err.strerror})") from None
    if got != e - b:
        raise GrowError(f"{path}: file is truncated (tensor {name} lies beyond its end)")
    if mem is not None:
        return mem.view(dt).reshape(shape)
    t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
    return t.reshape(shape)


def _open_files(files: list[Path], src: str) -> tuple[dict, dict, Callable]:
    """Lazy access to tensors spread over one or more safetensors files (one read per tensor)."""
    where, entries, meta0 = {}, {}, None
    for f in files:
        header, meta, start = read_file_header(f)
        meta0 = meta if meta0 is None else meta0
        for n, e in header.items():
            if n in where:
                raise GrowError(f"{f}: tensor {n} is also in {where[n][0]}")
            where[n] = (f, start, e)
            entries[n] = (e["dtype"], e["shape"])

    def get(name: str, into: Callable | None = None, rows: tuple[int, int] | None = None) -> torch.Tensor:
        f, start, e = where[name]
        return read_tensor(f, start, e, name, into, rows)

    return entries, meta0 or {}, get


def load(src: str | os.PathLike) -> Checkpoint:
    """Open a checkpoint: a .safetensors file, an HF model folder, or ``-`` (standard input)."""
    s = str(src)
    if not s:
        raise GrowError("empty checkpoint path")
    if s == "-":
        data = sys.stdin.buffer.read()
        if not data:
            raise GrowError("standard input is empty (expected a safetensors checkpoint)")
        header, meta, start = parse_header(data, len(data), "<stdin>")
        cfg, lineage = _config_from(meta, None, "<stdin>")
        entries = {n: (e["dtype"], e["shape"]) for n, e in header.items()}
        entries, stored = _check_tensors(cfg, entries, "<stdin>")

        def get(name: str) -> torch.Tensor:  # one tensor copied out of the held bytes
            e = header[stored[name]]
            b, en = e["data_offsets"]
            buf, dt = bytearray(memoryview(data)[start + b : start + en]), DTYPES[e["dtype"]]
            return (torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)).reshape(e["shape"])

        return Checkpoint(cfg, lineage, "<stdin>", entries, get, raw=data, tokenizer=_tokenizer_record(meta, "<stdin>"))
    p = Path(s)
    files = prehash.checkpoint_files(s)
    folder_cfg = p / "config.json" if p.is_dir() else None
    if not p.is_dir():
        if nanogpt.is_torch_file(p):
            return _load_nanogpt(p)
        if (p.parent / "config.json").exists():
            folder_cfg = p.parent / "config.json"
    entries, meta, read = _open_files(files, s)
    cfg, lineage = _config_from(meta, folder_cfg, s)
    entries, stored = _check_tensors(cfg, entries, s)
    return Checkpoint(
        cfg,
        lineage,
        s,
        entries,
        lambda name: read(stored[name]),
        files=files,
        tokenizer=_tokenizer_record(meta, s),
        _read_into=lambda name, into, rows=None: read(stored[name], into, rows),
    )


def _load_nanogpt(p: Path) -> Checkpoint:
    """A nanoGPT ``ckpt.pt``, held in memory as GPT-2 tensors (see ``nanogpt``)."""
    cfg, tensors, entry = nanogpt.read(p)
    entries = {n: (DTYPE_NAME[t.dtype], list(t.shape)) for n, t in tensors.items()}
    dts = {e[0] for e in entries.values()}
    if len(dts) > 1 or not dts <= FLOATS:
        raise GrowError(f"{p}: tensors mix dtypes {sorted(dts)}")
    return Checkpoint(cfg, [entry], str(p), entries, tensors.__getitem__, files=[p])


# ---- writing ------------------------------------------------------------------------------


def metadata(cfg: ModelConfig, lineage: list, tokenizer: dict | None = None) -> dict[str, str]:
    meta = {
        "format": "pt",
        "family": cfg.family,
        "config": json.dumps(cfg.to_hf(), sort_keys=True),
        "lineage": json.dumps(lineage, sort_keys=True),
    }
    if tokenizer is not None:
        meta["tokenizer"] = json.dumps(tokenizer, sort_keys=True)
    return meta


def _header_bytes(specs: list[tuple[str, tuple, torch.dtype]], meta: dict) -> bytes:
    header, off = {}, 0
    for name, shape, dt in specs:
        n = 1
        for s in shape:
            n *= s
        nb = n * dt.itemsize
        header[name] = {"dtype": DTYPE_NAME[dt], "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    header = {"__metadata__": meta, **header}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().contiguous().cpu()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


# bench/write_chunks.py: on a quiet disk 1 MB writes were as fast as a kernel file copy and several
# times faster than 4-16 MB ones; on a slow disk the size made no consistent difference. Whole
# tensors in one write() were slower still (1.9-4.4 s for 1.9 GB against 0.6 s in pieces).
WRITE_CHUNK = 1 << 20
WRITEBACK_EVERY = 1 << 26  # start the disk writing every 64 MB written (see ``start_writeback``)


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
      from ``growth.Workspace.output`` after ``place``) go to the disk straight from that memory,
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


def write_stream(
    fh,
    specs,
    produce: Callable[[str], torch.Tensor],
    meta: dict,
    progress: Progress | None = None,
    source_hash: SourceHash | None = None,
    recycle: Callable[[torch.Tensor], None] | None = None,
    workers: int = 1,
    place: Callable[[dict], None] | None = None,
    pieces: Callable[[str], list[tuple[int, int]] | None] | None = None,
) -> None:
    """Write a safetensors stream: header from ``specs``, then each tensor from ``produce(name)``;
    ``progress(name, nbytes)`` after each. With ``source_hash`` the header is written with its
    token and rewritten in place with the digest once the tensors are written (``fh`` must be a
    seekable file: the caller fsyncs it afterwards). ``recycle(t)`` is called with each produced
    tensor once it is written and no longer read (its memory may then be reused).

    ``pieces(name)``: the row ranges ``[(r0, n), ...]`` a tensor is made in, or None for whole.
    A piece is ``produce(name, (r0, n))``, rows r0 .. r0+n-1 along the first axis: a contiguous
    run of the tensor's bytes, written as soon as it is made (a vocabulary-sized tensor then needs
    neither a block of its own size nor a wait for its last row before its first is written).
    ``place(offsets)`` is told the file offset of every piece, keyed ``(name, r0)`` (``r0`` 0 for
    a whole tensor), before any is produced (``growth.Workspace.place``).

    Producing and writing overlap: ``workers`` threads produce the next pieces while piece k is
    written (torch and file writes release the GIL), up to ``3 * workers`` pieces alive at a time
    (made and not yet written: a worker may run ahead past small tensors while another makes a
    large one) and together at most twice the largest tensor's bytes (so that memory does not grow
    with the number of cores); the bytes are the same as producing them one after another. A
    regular file is written past the page cache where the system allows it (``DirectSink``), else
    through it (``BufferedSink``).
    """
    header = _header_bytes(specs, meta)
    items, offsets, off = [], {}, len(header)  # (name, shape, dtype, rows or None), in file order
    for name, shape, dt in specs:
        for rows in (pieces(name) if pieces else None) or [None]:
            items.append((name, shape, dt, rows))
            offsets[name, rows[0] if rows else 0] = off + (rows[0] * _nbytes(shape[1:], dt) if rows else 0)
        off += _nbytes(shape, dt)
    if place is not None:
        place(offsets)

    def make(item):
        name, _, _, rows = item
        return produce(name) if rows is None else produce(name, rows)

    sink = DirectSink.open(fh) or BufferedSink(fh)
    try:
        sink.write(memoryview(bytearray(header)))
        done = 0  # bytes of the current tensor written
        budget = 2 * max((_nbytes(shape, dt) for _, shape, dt in specs), default=0)
        made = prefetch(items, make, ahead=2 * workers, workers=workers, cost=_item_nbytes, budget=budget)
        for item, t in zip(items, made):
            name, shape, dt, rows = item
            want = _item_shape(item)
            if tuple(t.shape) != want or t.dtype != dt:
                raise RuntimeError(
                    f"internal: {name} {rows or ''} made {tuple(t.shape)} {t.dtype}, planned {want} {dt}"
                )
            b = _tensor_bytes(t)
            sink.write(b, release=None if recycle is None else functools.partial(recycle, t))
            del t
            done += b.nbytes
            if rows is None or rows[0] + rows[1] == shape[0]:  # the tensor's last piece
                if progress:
                    progress(name, done)
                done = 0
    except BaseException:
        sink.close(abandon=True)
        raise
    sink.close()
    if source_hash is not None and source_hash.token.encode() in header:
        os.pwrite(fh.fileno(), source_hash.patch(header), 0)  # same length: only these bytes change


def _item_shape(item) -> tuple:
    """Shape of a ``write_stream`` item (name, shape, dtype, rows or None): a tensor or a piece."""
    _, shape, _, rows = item
    return tuple(shape) if rows is None else (rows[1], *shape[1:])


def _item_nbytes(item) -> int:
    return _nbytes(_item_shape(item), item[2])


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
    import threading

    if ahead < 1 or len(names) < 2:
        yield from (produce(n) for n in names)
        return
    workers = max(1, min(workers, len(names)))
    cost = cost or (lambda name: 0)
    budget = budget if budget is not None else 0
    room = threading.Condition()  # guards claims: the next index, and the results alive with their cost
    claims = {"next": 0, "alive": 0, "spent": 0}
    done = threading.Condition()
    results: dict[int, tuple[bool, object]] = {}
    stop = threading.Event()

    def claim() -> int | None:
        """The next index once there is room for its result (in order: no result waits on a later one)."""
        with room:
            while not stop.is_set() and claims["next"] < len(names):
                i, c = claims["next"], cost(names[claims["next"]])
                if claims["alive"] < ahead + workers and (claims["alive"] == 0 or claims["spent"] + c <= budget):
                    claims.update(next=i + 1, alive=claims["alive"] + 1, spent=claims["spent"] + c)
                    return i
                room.wait(0.1)
        return None

    def release(i: int) -> None:
        with room:
            claims["alive"] -= 1
            claims["spent"] -= cost(names[i])
            room.notify_all()

    def work():
        while (i := claim()) is not None:
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
            release(i)
    finally:
        stop.set()
        with room:
            room.notify_all()
        for t in threads:
            t.join(timeout=5)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def atomic_file(dest: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write ``dest`` through a temporary file in its folder: fsync, then rename. Nothing partial remains."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
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
    for i in inputs:
        if i != "-" and Path(i).exists() and dest.exists() and _clobbers(dest.resolve(), Path(i).resolve()):
            raise GrowError(f"{dest}: output would overwrite the input {i}")
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


def _nbytes(shape, dt: torch.dtype) -> int:
    n = dt.itemsize
    for s in shape:
        n *= s
    return n


def specs_nbytes(specs) -> int:
    """Tensor bytes of (name, shape, dtype) specs."""
    return sum(_nbytes(shape, dt) for _, shape, dt in specs)


def plan_shards(specs, shard_size: int | None) -> list[list]:
    """Split ``specs`` (in order) into shards of at most ``shard_size`` tensor bytes each; a tensor
    larger than the limit gets a shard of its own. One shard when the total fits (or no limit)."""
    if shard_size is None:
        return [list(specs)]
    shards, size = [[]], 0
    for spec in specs:
        nb = _nbytes(spec[1], spec[2])
        if shards[-1] and size + nb > shard_size:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nb
    return shards


def _write_folder(
    folder: Path,
    cfg: ModelConfig,
    shards: list[list],
    write: Callable[[io.BufferedWriter, list], None],
    files: dict[str, bytes] | Callable[[], dict[str, bytes]] | None = None,
) -> None:
    """An HF model folder: config.json and model.safetensors, or model-0000i-of-0000N.safetensors
    shards (each with the same metadata; ``write(fh, specs)`` streams one) plus
    model.safetensors.index.json; then ``files`` (name -> bytes: tokenizer, generation config,
    modeling code, model card; or a function returning them, called once the weights are written)
    beside them."""

    def write_json(path, obj):
        atomic_file(path, lambda fh: fh.write((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()))

    if len(shards) == 1:
        atomic_file(folder / "model.safetensors", lambda fh: write(fh, shards[0]))
    else:
        weight_map, total = {}, 0
        for k, part in enumerate(shards, 1):
            name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            atomic_file(folder / name, lambda fh, part=part: write(fh, part))
            for n, shape, dt in part:
                weight_map[n] = name
                total += _nbytes(shape, dt)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write_json(folder / "model.safetensors.index.json", index)
    write_json(folder / "config.json", hf_remote.folder_config(cfg))
    files = files() if callable(files) else files
    for name, data in {**hf_remote.folder_files(cfg), **(files or {})}.items():
        atomic_file(folder / name, lambda fh, data=data: fh.write(data))


def _replace(tmp: Path, dest: Path) -> None:
    """Move the finished ``tmp`` (file or folder) to ``dest``. An existing ``dest`` is first renamed
    aside (a folder cannot be replaced by one rename), then deleted once ``tmp`` is in place."""
    old = None
    if dest.exists() or dest.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent)) / "old"
        os.replace(dest, old)
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


def save(
    out: str,
    cfg: ModelConfig,
    lineage: list,
    specs,
    produce,
    force: bool = False,
    inputs: Iterable[str] = (),
    shard_size: int | None = None,
    files: dict[str, bytes] | Callable[[], dict[str, bytes]] | None = None,
    progress: Progress | None = None,
    tokenizer: dict | None = None,
    source_hash: SourceHash | None = None,
    recycle: Callable[[torch.Tensor], None] | None = None,
    workers: int = 1,
    place: Callable[[dict], None] | None = None,
    pieces: Callable[[str], list[tuple[int, int]] | None] | None = None,
) -> str:
    """Write a checkpoint to a .safetensors file, an HF folder (config.json + model.safetensors, or
    shards + index when the tensors exceed ``shard_size`` bytes), or ``-`` (standard output).

    Tensors are produced one at a time and streamed to a temporary file (a temporary folder for a
    folder target) beside the destination, fsynced, then renamed into place: the destination is
    either absent, the earlier complete file, or the new complete one. ``files`` (name -> bytes)
    are written into a folder target beside the weights (ignored for a single file).
    ``progress(name, nbytes)`` is called after each tensor is written. ``tokenizer`` (a record from
    ``growtool.tokenizer``) is kept in the metadata: which tokenizer the model expects.
    ``source_hash`` (a ``SourceHash`` whose token the lineage holds): its digest replaces the token
    in every written header before the file is fsynced (``files`` may then be a function, called
    after the weights are written, that fills it in too). ``recycle(t)``: called with each produced
    tensor once written (``growth.Workspace.recycle``); ``workers``: threads producing tensors;
    ``place(offsets)``: told where each tensor goes in its file (``growth.Workspace.place``);
    ``pieces(name)``: the row ranges a tensor is made and written in (``write_stream``).
    Returns the written path.
    """
    meta = metadata(cfg, lineage, tokenizer)
    dest = check_destination(out, inputs, force)
    shards = plan_shards(specs, shard_size)
    if len(shards) > 1 and (dest is None or not is_folder_target(out)):
        total = sum(_nbytes(sh, dt) for _, sh, dt in specs)
        raise GrowError(
            f"{out}: the output ({total:,} bytes) exceeds --shard-size {shard_size:,}: "
            "give a folder as -o to write shards"
        )

    def write(fh, part):
        write_stream(fh, part, produce, meta, progress, source_hash, recycle, workers, place, pieces)

    if dest is None:  # spool to a temporary file first: a failure leaves stdout untouched
        with tempfile.TemporaryFile() as tmp:
            write(tmp, specs)
            tmp.seek(0)
            shutil.copyfileobj(tmp, sys.stdout.buffer, 1 << 22)
        sys.stdout.buffer.flush()
        return "-"
    try:
        if not is_folder_target(out):
            atomic_file(dest, lambda fh: write(fh, specs))
            return str(dest)
        tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
        try:
            _write_folder(tmpdir, cfg, shards, write, files)
            os.chmod(tmpdir, 0o777 & ~_umask())  # mkdtemp makes 0700; a written folder gets the usual mode
            _replace(tmpdir, dest)
        except BaseException:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        return str(dest)
    except OSError as e:
        raise GrowError(f"{dest}: cannot write ({e.strerror or e})") from None


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def save_tensors(
    out: str,
    cfg: ModelConfig,
    lineage: list,
    tensors: dict[str, torch.Tensor],
    force: bool = False,
    inputs: Iterable[str] = (),
    shard_size: int | None = None,
    files: dict[str, bytes] | None = None,
    tokenizer: dict | None = None,
) -> str:
    """Save in-memory tensors (in the family's canonical order)."""
    order = [n for n in expected_shapes(cfg)]
    specs = [(n, tuple(tensors[n].shape), tensors[n].dtype) for n in order]
    return save(
        out,
        cfg,
        lineage,
        specs,
        tensors.__getitem__,
        force=force,
        inputs=inputs,
        shard_size=shard_size,
        files=files,
        tokenizer=tokenizer,
    )
