"""Training corpora: inputs (files, folders, globs of text, JSONL, Parquet, token files; read by
``growtool.training.readers``), streaming tokenisation into an on-disk token cache, document
separators, and bad-input checks.

What holds:

* Inputs (``expand_inputs``): each ``--data`` / ``--val-data`` item is a file, a folder (every file
  under it, recursively, sorted by path; hidden files skipped) or a glob (matches sorted). Kinds by
  name: ``.jsonl`` / ``.jsonl.gz`` (one JSON object a line, the text under ``text_key``; blank lines
  skipped), ``.parquet`` (the string column ``text_key``), ``.bin`` (raw token ids: uint16 when the
  tokenizer has at most 65,536 ids, else uint32, or ``data_dtype``), ``.npy`` (a 1-D integer
  array), anything else plain text (UTF-8 for a Hugging Face tokenizer; raw bytes for the byte one).
* Documents: a text file, a JSONL record, a Parquet row. After each one the separator id is
  written: the tokenizer's end-of-text token (``doc_sep="auto"``: ``<|endoftext|>``, ``</s>``,
  ``<|end_of_text|>``, ``<eos>`` or ``<|eos|>``, the first in its vocabulary), none
  (``"none"``) or a named token. The byte tokenizer has no spare id (its 256 ids are the bytes),
  so under ``auto`` its documents are concatenated with nothing between; ``--doc-sep`` with a
  one-byte character (e.g. a newline) puts that byte between them. Token files (``.bin``,
  ``.npy``) are taken as they are, nothing added.
* Ids: a document's ids equal ``tokenizer.encode(text, add_special_tokens=False)``. A text file is
  read in blocks of about ``BLOCK`` bytes, each ending before its last space or newline that is
  followed by a printable ASCII character (``readers.last_cut``: ``x Y``, ``x\nY``); for a
  byte-level BPE with GPT-2's split regex and no prefix space (``line_safe``: GPT-2, and the BPE
  the benchmark trains) such a cut is always a pre-token boundary, so blocks (and pieces of about
  ``PIECE`` characters inside a document, for the parallel batches) give the whole file's ids, and
  no encode call sees more than a block, whatever the file's size or line lengths. Text with no
  such cut for ``FORCE`` blocks (pieces) is cut there, at a character boundary: the one case where
  ids may differ from the whole file's. Other tokenizers encode each document whole up to
  ``BLOCK`` bytes and longer ones block by block (``data.encode_text``, exact within a block).
* Streaming in bounded memory: documents are read, batched (about ``BATCH`` characters), encoded by
  the tokenizers library's ``encode_batch_fast`` on every core in a second thread while the next
  batch is read, and appended to ``.tokens-KEY.<dtype>.partial`` in the cache folder; the byte
  tokenizer needs no workers (a copy). Every ``CHECKPOINT`` tokens the partial file is fsynced
  and a progress record (input file, position in it, tokens, documents) is written atomically. An
  interrupted run (a crash, Ctrl-C, a kill) leaves the partial file and its record; the next run
  cuts the partial file back to the record and continues from there. When all is done the token
  file is fsynced and renamed to ``tokens-KEY.<dtype>`` beside ``tokens-KEY.json`` (count, largest
  id, separator) and ``tokens-KEY.docs`` (int64 end of every document): a cache file is always
  whole. KEY is the sha256 of the format, the tokenizer, every input's kind and sha256, the text
  key, the separator and the token-file dtype. ``CacheWriter`` writes the cache; the checks of a
  progress record and of a finished cache are ``growtool.training.cache``'s.
* Bad input (``GrowError``, one line naming the file and line / row / position): a JSONL line that
  is not JSON, not an object or lacks the key (or its value is not a string), a Parquet file
  without the column (or a null in it), a token file whose size is not a multiple of its dtype or
  whose ids exceed the vocabulary, non-UTF-8 text, an empty corpus, a glob or folder matching
  nothing. The partial files are removed; no cache is written.
* A single token file whose dtype is the cache's is used in place (memory-mapped, not copied),
  after a scan of its ids in chunks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from growtool.io.confine import create_new, open_regular, same_file
from growtool.io.files import atomic_file, fsync_dir
from growtool.nn.errors import GrowError
from growtool.tokenizer import encode_text, native
from growtool.training import cache as token_cache
from growtool.training.readers import (
    FORCE,
    TOKEN_KINDS,
    Stale,
    doc_separator,
    expand_inputs,
    file_sha256,
    kind_of,
    line_safe,
    next_cut,
    precheck,
    read_jsonl,
    read_parquet,
    read_text,
    read_tokens,
    scan_ids,
    token_dtype,
    token_file,
)

VERSION = "corpus-v1"
BLOCK = 2 << 20  # bytes of a text file read at a time
PIECE = 1 << 16  # characters per piece of a long document in a parallel batch (line-safe tokenizers)
BATCH = 2 << 20  # characters per encode batch
CHECKPOINT = 8 << 20  # tokens between resumable progress records


# ---- encoding -------------------------------------------------------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of about ``size`` characters at ``next_cut`` positions; a stretch of
    ``FORCE * size`` characters without one is cut there (ids may differ from the whole text's only
    at such a cut)."""
    if len(text) <= 2 * size:
        return [text]
    out, pos, most = [], 0, FORCE * size
    while len(text) - pos > 2 * size:
        i = next_cut(text, pos + size)
        if i < 0 or i - pos > most:
            i = pos + most if len(text) - pos > most else -1
        if i < 0:
            break
        out.append(text[pos:i])
        pos = i
    out.append(text[pos:])
    return out


class Encoder:
    """Payloads (str / bytes of text, or id arrays) -> id arrays in the cache dtype."""

    def __init__(self, tok, dtype, piece: int | None = None):
        self.tok, self.dtype, self.piece = tok, dtype, piece or PIECE
        self.safe = line_safe(tok)

    def text(self, payload, where) -> str:
        """``where``: (path, line of the payload's first byte)."""
        if isinstance(payload, str):
            return payload
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError as e:
            line = where[1] + payload.count(b"\n", 0, e.start)
            raise GrowError(
                f"{where[0]}: line {line}: not UTF-8 text (the {self.tok.name} tokenizer needs text)"
            ) from None

    def encode(self, items: list) -> list[np.ndarray]:
        """One id array per item (where, payload): text encoded, id arrays converted."""
        out: list = [None] * len(items)
        hf, batch, owner = self.tok.hf, [], []
        for k, (where, payload) in enumerate(items):
            if isinstance(payload, np.ndarray):
                out[k] = payload.astype(self.dtype, copy=False)
            elif hf is None:
                raw = payload.encode("utf-8") if isinstance(payload, str) else payload
                out[k] = np.frombuffer(raw, dtype=np.uint8).astype(self.dtype)
            elif self.safe:
                for p in _pieces(self.text(payload, where), self.piece):
                    batch.append(p)
                    owner.append(k)
            else:
                text = self.text(payload, where)
                if len(text) > 2 * self.piece:
                    out[k] = native(lambda t=text: encode_text(hf, t)).astype(self.dtype)
                else:
                    batch.append(text)
                    owner.append(k)
        if batch:
            encs = native(lambda: hf.encode_batch_fast(batch, add_special_tokens=False))
            parts: dict[int, list] = {}
            for k, e in zip(owner, encs):
                parts.setdefault(k, []).append(np.array(e.ids, dtype=self.dtype))
            for k, ps in parts.items():
                out[k] = ps[0] if len(ps) == 1 else np.concatenate(ps)
        return out


# ---- the cache ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """How inputs are read: the JSONL key / Parquet column of the text, the separator after each
    document (``doc_separator``: "auto", "none" or a token) and the dtype of ``.bin`` token files
    ("auto": by the tokenizer's size)."""

    text_key: str = "text"
    doc_sep: str | None = "auto"
    data_dtype: str = "auto"


@dataclass
class Corpus:
    """The tokens of a set of inputs (a read-only memory map) and where its documents end."""

    tokens: np.ndarray
    doc_ends: np.ndarray  # int64, the position after each document (and its separator)
    files: list
    shas: list
    max_id: int
    sep: int | None = None
    path: Path | None = None
    extra: dict = field(default_factory=dict)


def _reader(path: Path, kind: str, start: int, text_key: str, dtype, vocab):
    if kind == "text":
        return read_text(path, start, BLOCK)
    if kind == "jsonl":
        return read_jsonl(path, start, text_key)
    if kind == "parquet":
        return read_parquet(path, start, text_key)
    return read_tokens(path, token_file(path, kind, dtype), start, vocab, token_cache.SCAN)


class Bar:
    """A rich progress bar on a terminal: MB, MB/s, tokens, ETA (nothing elsewhere)."""

    def __init__(self, enabled: bool, total_bytes: int, label: str):
        self.p = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.p = Progress(
            TextColumn(label),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[tokens]:,} tokens"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.p.add_task(label, total=total_bytes, tokens=0)
        self.p.start()

    def update(self, done_bytes: int, tokens: int) -> None:
        if self.p is not None:
            self.p.update(self.task, completed=done_bytes, tokens=tokens)

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()


def cache_key(tok, files, shas, text_key, sep, bin_dtype) -> str:
    kinds = [kind_of(p) for p in files]
    parts = [VERSION, tok.key, list(zip(kinds, shas)), text_key if {"jsonl", "parquet"} & set(kinds) else None]
    parts += [sep, bin_dtype.name if set(TOKEN_KINDS) & set(kinds) else None]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _fsync(fh) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _remove(*paths) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def _trimmer():
    """glibc's ``malloc_trim`` (None elsewhere). The tokenizers library's parallel encoding frees its
    working memory in a pattern glibc does not hand back on its own: without a trim after each batch
    the RSS grew by about 1 MB per MB of text encoded, without bound."""
    try:
        import ctypes

        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


TRIM = _trimmer()
HOOK = None  # tests: called as HOOK(tokens_written) after each written batch (to interrupt a run)


@dataclass
class CacheWriter:
    """Tokenises ``files`` into the token file ``cache`` (and its .json / .docs): started afresh, or
    resumed from the progress record of an interrupted build of the same key when that record fits
    the inputs and the partial files (``cache.resumable``); documents written in encoded batches,
    with a progress record every ``CHECKPOINT`` tokens; the finished files renamed into place. See
    the module docstring (sizes: the module's BLOCK, BATCH, CHECKPOINT)."""

    files: list[Path]
    tok: object
    cache: Path
    dtype: np.dtype
    sep: int | None
    text_key: str
    vocab: int | None
    bin_dtype: np.dtype
    progress: bool = False
    label: str = "tokenise"
    # the build under way: the partial files, the tokens, documents and largest id they hold, and
    # the tokens written since the last progress record
    fh: object = field(default=None, init=False, repr=False)
    dh: object = field(default=None, init=False, repr=False)
    tokens: int = field(default=0, init=False)
    docs: int = field(default=0, init=False)
    top: int = field(default=-1, init=False)
    since: int = field(default=0, init=False)

    def write(self) -> None:
        """Build the cache: from the progress record when it fits, else (or when the record points
        past the end of an input: ``Stale``) from the start."""
        try:
            self._build(token_cache.resumable(self.cache, self.files, self.dtype, self.sep, self.vocab, self.bin_dtype))
        except Stale:  # the record points past the end of an input: start over
            self._build(None)

    def _build(self, state: dict | None) -> None:
        state = self._start(state)
        enc = Encoder(self.tok, self.dtype)
        sizes = [p.stat().st_size for p in self.files]
        bar = Bar(self.progress and sys.stderr.isatty(), sum(sizes), self.label)
        pool = ThreadPoolExecutor(1)
        try:
            pending = None  # the batch being encoded in the pool's thread while the next one is read
            for items, metas in self._batches(state, sizes, bar):
                job = (pool.submit(enc.encode, items), metas)
                if pending is not None:
                    self._write(*pending)
                pending = job
            if pending is not None:
                self._write(*pending)
            bar.update(sum(sizes), self.tokens)
            self._finish()
        except (GrowError, Stale):
            self.fh.close()
            self.dh.close()
            _remove(*token_cache.partials(self.cache))
            raise
        finally:
            pool.shutdown(wait=True)
            bar.close()
            if not self.fh.closed:
                self.fh.close()
            if not self.dh.closed:
                self.dh.close()

    def _start(self, state: dict | None) -> dict:
        """Open the partial files: fresh ones when ``state`` is None (never written through a link
        planted in their place), else the interrupted build's, cut back to its record. The record
        to go on from."""
        part, docs_part, prog = token_cache.partials(self.cache)
        if state is None:
            _remove(prog)
            state = {"file": 0, "marker": 0, "tokens": 0, "docs": 0, "max": -1}
            self.fh, self.dh = create_new(part), create_new(docs_part)
        else:
            self.fh, self.dh = open_regular(part, "token cache", "r+b"), open_regular(docs_part, "token cache", "r+b")
        self.tokens, self.docs, self.top, self.since = state["tokens"], state["docs"], state["max"], 0
        self.fh.truncate(self.tokens * self.dtype.itemsize)
        self.dh.truncate(self.docs * 8)
        self.fh.seek(0, 2)
        self.dh.seek(0, 2)
        return state

    def _batches(self, state: dict, sizes: list[int], bar: Bar):
        """The documents from the record's position on, in batches of about ``BATCH`` characters:
        (items, metas), an item (where, payload) for the encoder, a meta (input index, position in
        it, whether the payload ends its document). The bar follows the bytes read."""
        items, metas, chars = [], [], 0
        done_bytes = sum(sizes[: state["file"]])
        for fi in range(state["file"], len(self.files)):
            path, kind = self.files[fi], kind_of(self.files[fi])
            start = state["marker"] if fi == state["file"] else 0
            open_doc = fi == state["file"] and state.get("open", False)
            if kind == "text" and start and not open_doc:
                done_bytes += sizes[fi]  # the record was written after this file's last block
                continue
            for marker, payload, last, done, where in _reader(
                path, kind, start, self.text_key, self.bin_dtype, self.vocab
            ):
                if last and not len(payload) and not open_doc:
                    continue  # an empty document: no tokens, no separator
                open_doc = not last
                items.append((where, payload))
                metas.append((fi, marker, last))
                chars += len(payload)
                if chars >= BATCH:
                    yield items, metas
                    items, metas, chars = [], [], 0
                    bar.update(done_bytes + done, self.tokens)
            done_bytes += sizes[fi]
        if items:
            yield items, metas

    def _write(self, fut, metas) -> None:
        """Append one encoded batch: its ids, a separator after each document it ends, and those
        documents' ends; a progress record when ``CHECKPOINT`` tokens have been written since the last."""
        arrays = fut.result()
        ends = []
        for (_, _, last), ids in zip(metas, arrays):
            if len(ids):
                self.fh.write(ids.tobytes())
                self.tokens += len(ids)
                self.top = max(self.top, int(ids.max()))
            if last:
                if self.sep is not None:
                    self.fh.write(np.array([self.sep], dtype=self.dtype).tobytes())
                    self.tokens += 1
                    self.top = max(self.top, self.sep)
                ends.append(self.tokens)
        if ends:
            self.dh.write(np.asarray(ends, dtype=np.int64).tobytes())
            self.docs += len(ends)
        self.since += sum(len(a) for a in arrays)
        if self.since >= CHECKPOINT:
            self._record(*metas[-1])
        if TRIM is not None:
            TRIM(0)
        if HOOK is not None:
            HOOK(self.tokens)

    def _record(self, fi: int, marker: int, last: bool) -> None:
        """The partial files fsynced, then the progress record (written atomically) that holds them."""
        self.since = 0
        _fsync(self.fh)
        _fsync(self.dh)
        st = {"file": fi, "marker": marker, "open": not last, "tokens": self.tokens, "docs": self.docs, "max": self.top}
        atomic_file(token_cache.partials(self.cache)[2], lambda f: f.write(json.dumps(st).encode()))

    def _finish(self) -> None:
        """The partial files fsynced and renamed to the cache's, its .json written, the record removed."""
        if self.tokens == 0:
            raise GrowError(f"{', '.join(map(str, self.files))}: no tokens (the data is empty)")
        part, docs_part, prog = token_cache.partials(self.cache)
        _fsync(self.fh)
        _fsync(self.dh)
        if not (same_file(self.fh, part) and same_file(self.dh, docs_part)):
            raise GrowError(f"{self.cache.parent}: a partial token file was replaced while it was written (refused)")
        self.fh.close()
        self.dh.close()
        key, folder = self.cache.with_suffix("").name, self.cache.parent
        meta = {"tokens": self.tokens, "max": self.top, "docs": self.docs, "sep": self.sep, "dtype": self.dtype.name}
        os.replace(docs_part, folder / f"{key}.docs")
        atomic_file(folder / f"{key}.json", lambda f: f.write(json.dumps(meta).encode()))
        os.replace(part, self.cache)
        fsync_dir(folder)
        _remove(prog)


@contextmanager
def _locked(folder: Path):
    """An exclusive lock on the cache folder itself (flock on the directory: no file is made; released
    when the process ends, however it ends), so that processes sharing a cache folder (bench
    workers, several runs) neither build one key twice nor remove a cache another one is reading.
    Without fcntl (not POSIX): no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def load(
    specs,
    tok,
    cache_dir,
    vocab_size: int | None = None,
    *,
    reading: Reading | None = None,
    write_cache: bool = True,
    progress: bool = False,
    label: str = "tokenise",
) -> Corpus:
    """The corpus of ``specs`` (see ``expand_inputs``), read as ``reading`` says (default: ``Reading()``):
    from the cache in ``cache_dir`` when it holds this key, else tokenised into it (``cache_dir`` None
    or ``write_cache`` False: into a private temporary file, removed once mapped)."""
    reading = Reading() if reading is None else reading
    files = expand_inputs(specs)
    bin_dtype = token_dtype(tok.vocab_size, reading.data_dtype)
    dtype = token_dtype(tok.vocab_size)
    if bin_dtype.itemsize > dtype.itemsize:
        dtype = bin_dtype
    sep = doc_separator(tok, reading.doc_sep)
    precheck(files, tok, reading.text_key, bin_dtype)
    shas = [file_sha256(p) for p in files]
    if len(files) == 1 and kind_of(files[0]) in TOKEN_KINDS:  # one token file: used in place
        arr = token_file(files[0], kind_of(files[0]), bin_dtype)
        top = scan_ids(files[0], arr, vocab_size, token_cache.SCAN)
        if len(arr) == 0:
            raise GrowError(f"{files[0]}: no tokens (the data is empty)")
        return Corpus(arr, np.zeros(0, dtype=np.int64), files, shas, top, None, files[0])
    key = cache_key(tok, files, shas, reading.text_key, sep, bin_dtype)
    private = cache_dir is None or not write_cache
    if private:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="growtool-tokens-"))
    else:
        folder = Path(cache_dir)
    cache = folder / f"tokens-{key}.{dtype.name}"
    writer = CacheWriter(files, tok, cache, dtype, sep, reading.text_key, vocab_size, bin_dtype, progress, label)
    try:
        meta, tokens, ends = _read_or_write(writer)
    finally:
        if private:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    if vocab_size is not None and meta["max"] >= vocab_size:
        raise GrowError(
            f"{', '.join(map(str, files))}: token id {meta['max']} does not fit the model's vocabulary of {vocab_size}"
        )
    return Corpus(tokens, ends, files, shas, meta["max"], sep, None if private else cache)


def _read_or_write(writer: CacheWriter) -> tuple:
    """(record, tokens memmap, document ends) of the cache ``writer`` writes: read when it holds what
    its record says, else (re)built first; under the folder's lock (one builder at a time, readers
    wait for it)."""
    cache = writer.cache
    folder, key = cache.parent, cache.with_suffix("").name
    meta_path, docs_path = folder / f"{key}.json", folder / f"{key}.docs"
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):  # one builder at a time; readers wait for it
        found = token_cache.checked(cache, meta_path, docs_path, writer.dtype, writer.sep)
        if found is None:  # none yet, or not what its record says: (re)built
            _remove(cache, meta_path, docs_path)
            writer.write()
            found = token_cache.checked(cache, meta_path, docs_path, writer.dtype, writer.sep)
            if found is None:
                raise GrowError(f"{folder}: the token cache just written does not read back (a changing folder?)")
    return found


__all__ = ["load", "Reading", "CacheWriter", "Corpus", "Encoder"]
