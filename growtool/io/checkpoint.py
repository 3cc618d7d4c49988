"""Checkpoint I/O: safetensors files, Hugging Face folders (single or sharded), standard streams.

Reading is lazy: the header is checked first (so a malformed file gives one clear line), then
each tensor is read on demand with a plain positioned read (no mmap, see ``read_tensor``).
Writing streams: the header is computed from the planned shapes, then each tensor is produced and
written in turn, into a temporary file in the destination folder that is fsynced and renamed into
place - a killed process leaves no partial output. The model config and growth lineage travel in
the safetensors ``__metadata__``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from growtool.io import confine, hf_remote, loadable, nanogpt, one_config, overflow, prehash, stdout
from growtool.io.files import (
    _replace,
    _umask,
    atomic_file,
    check_destination,
    is_folder_target,
)
from growtool.io.header import (
    DTYPE_NAME,
    DTYPES,
    FLOATS,
    Progress,
    _nbytes,
    parse_header,
    read_file_header,
)
from growtool.io.stream import Producer, write_stream
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import IGNORED, arch_of, expected_shapes, float32_names

# ---- reading ------------------------------------------------------------------------------


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
        tensor of ``nbytes``, e.g. ``engine.Workspace.source``) instead of new memory; the caller
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
    files = rec.get("files", {}) if isinstance(rec, dict) else None
    if not isinstance(rec, dict) or not isinstance(rec.get("from", ""), str) or not isinstance(files, dict):
        raise GrowError(f"{src}: tokenizer record in the metadata is not a JSON object of 'from' and 'files'")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise GrowError(f"{src}: tokenizer record in the metadata names its files badly (name -> sha256 expected)")
    return rec


def _config_from(meta: dict, folder_cfg: Path | None, src: str) -> tuple[ModelConfig, list]:
    cfg = one_config.config(meta, folder_cfg, src)  # config.json where there is one, checked against the metadata
    return cfg, one_config.lineage(meta, src)


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
    kept = float32_names(cfg)  # MoE routers transformers keeps in float32 in a bf16 file, say
    dts = {entries[n][0] for n in want if n not in kept or entries[n][0] != "F32"}
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


def untied(ck: Checkpoint) -> Checkpoint:
    """``ck`` seen as an untied model (``expand --untie``): the same function, with the head its own
    tensor, read from the embedding (a tied head *is* the embedding). Nothing is copied; an untied
    checkpoint is returned as it is."""
    cfg = ck.config
    if not cfg.tie:
        return ck
    a, u = arch_of(cfg), cfg.replace(tie=False)
    head = a.modules["head"] + ".weight"

    def src(name: str) -> str:
        return a.embed if name == head else name

    entries = {n: ck.entries[src(n)] for n in expected_shapes(u)}
    if tuple(entries[head][1]) != expected_shapes(u)[head]:  # pragma: no cover - every family stores [V, d]
        raise GrowError(f"{ck.source}: the embedding's shape is not the head's; it cannot be untied")
    read = ck._read_into
    return dataclasses.replace(
        ck,
        config=u,
        entries=entries,
        _get=lambda n: ck._get(src(n)),
        _read_into=None if read is None else (lambda n, into, rows: read(src(n), into, rows)),
    )


def load(src: str | os.PathLike) -> Checkpoint:
    """Open a checkpoint: a .safetensors file, an HF model folder, or ``-`` (standard input)."""
    if not isinstance(src, (str, os.PathLike)):
        raise GrowError(f"src must be a path (a string), got {src!r}")
    s = str(src)
    if not s:
        raise GrowError("empty checkpoint path")
    if s == "-":
        if sys.stdin is None:
            raise GrowError("standard input is closed (expected a safetensors checkpoint)")
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
        confine.regular(p, "a checkpoint file")  # before any open: a FIFO would block
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


@dataclass(frozen=True)
class Output:
    """How ``save`` writes, beside what: ``force`` replaces an existing output; ``inputs`` are the
    paths it must not clobber; ``shard_size`` (bytes) splits a folder's weights into shards;
    ``files`` (name -> bytes, or a function called after the weights are written that returns
    them) go into a folder target beside the weights (ignored for a single file);
    ``progress(name, nbytes)`` is called after each tensor is written; ``tokenizer`` (a record from
    ``growtool.tokenizer``) is kept in the metadata: which tokenizer the model expects;
    ``source_hash`` (a ``SourceHash`` whose token the lineage holds): its digest replaces the token
    in every written header before the file is fsynced (``files`` may then be a function that
    fills it in too)."""

    force: bool = False
    inputs: Iterable[str] = ()
    shard_size: int | None = None
    files: dict[str, bytes] | Callable[[], dict[str, bytes]] | None = None
    progress: Progress | None = None
    tokenizer: dict | None = None
    source_hash: SourceHash | None = None


def save(out: str, cfg: ModelConfig, lineage: list, specs, producer: Producer, options: Output = Output()) -> str:
    """Write a checkpoint to a .safetensors file, an HF folder (config.json + model.safetensors, or
    shards + index when the tensors exceed ``options.shard_size`` bytes), or ``-`` (standard
    output), its tensors made by ``producer`` (``stream.Producer``) in the order of ``specs``.

    Tensors are produced one at a time and streamed to a temporary file (a temporary folder for a
    folder target) beside the destination, fsynced, then renamed into place: the destination is
    either absent, the earlier complete file, or the new complete one. Returns the written path.
    """
    specs = list(specs)
    cfg = one_config.with_dtype(cfg, specs[0][2]) if specs else cfg  # config.json names the dtype written
    meta = metadata(cfg, lineage, options.tokenizer)
    inputs, force = [str(i) for i in options.inputs], options.force
    dest = check_destination(out, inputs, force)
    shards = plan_shards(specs, options.shard_size)
    if len(shards) > 1 and (dest is None or not is_folder_target(out)):
        total = sum(_nbytes(sh, dt) for _, sh, dt in specs)
        raise GrowError(
            f"{out}: the output ({total:,} bytes) exceeds --shard-size {options.shard_size:,}: "
            "give a folder as -o to write shards"
        )

    if dest is not None and is_folder_target(out):
        loadable.check(cfg)  # its config.json must load in transformers: refused before any byte is written

    def write(fh, part):
        try:
            write_stream(fh, part, producer, meta, options.progress, options.source_hash)
        except overflow.Overflow as e:
            raise GrowError(f"{out}: {e}") from None

    if dest is None:  # spool to a temporary file first: a failure leaves stdout untouched
        with tempfile.TemporaryFile() as tmp:
            write(tmp, specs)
            total = tmp.tell()
            tmp.seek(0)
            stdout.copy_file(tmp, total)  # every byte taken, or one line (a closed pipe, a full disk)
        return "-"
    try:
        if not is_folder_target(out):
            atomic_file(dest, lambda fh: write(fh, specs), confine.place(dest, inputs, force))  # checked again
        else:
            rename = lambda tmpdir: confine.place(dest, inputs, force, _replace)(tmpdir, dest)  # noqa: E731
            _write_folder_into(dest, rename, cfg, shards, write, options.files)
        return str(dest)
    except OSError as e:
        raise GrowError(f"{dest}: cannot write ({e.strerror or e})") from None


def _write_folder_into(dest: Path, rename, cfg: ModelConfig, shards: list, write, files) -> None:
    """A folder target: written into a temporary folder beside ``dest``, then ``rename(tmpdir)``
    (checked again at the rename); a failure removes the temporary folder."""
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        _write_folder(tmpdir, cfg, shards, write, files)
        os.chmod(tmpdir, 0o777 & ~_umask())  # mkdtemp makes 0700; a written folder gets the usual mode
        rename(tmpdir)
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise


def save_tensors(out: str, cfg: ModelConfig, lineage: list, tensors: dict[str, torch.Tensor], **options) -> str:
    """Save in-memory tensors (in the family's canonical order); ``options``: the fields of ``Output``."""
    specs = [(n, tuple(tensors[n].shape), tensors[n].dtype) for n in expected_shapes(cfg)]
    return save(out, cfg, lineage, specs, Producer(tensors.__getitem__), Output(**options))
