"""The token cache's checks (``growtool.training.corpus`` writes the cache): where an interrupted
build's partial files and progress record lie, whether that record fits the inputs and the partial
files (else the build starts over), and whether a finished cache holds what its record says (else it
is rebuilt). Every file is opened as a regular file of the folder (no links); token ids are read in
chunks of ``SCAN``, never whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from growtool.io.confine import open_regular, read_regular
from growtool.nn.errors import GrowError
from growtool.training.readers import TOKEN_KINDS, kind_of, token_file

SCAN = 1 << 22  # ids per chunk when scanning a token file


def partials(cache: Path) -> tuple[Path, Path, Path]:
    """The partial token file, partial document ends and progress record of a build of ``cache``."""
    folder, key = cache.parent, cache.with_suffix("").name
    return folder / f".{cache.name}.partial", folder / f".{key}.docs.partial", folder / f".{key}.progress.json"


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _position_bound(path: Path, dtype) -> int:
    """The largest position a progress record may hold for ``path`` (bytes, lines, rows or ids)."""
    kind = kind_of(path)
    if kind == "parquet":
        return _rows(path)
    if kind in TOKEN_KINDS:
        return len(token_file(path, kind, dtype))
    return path.stat().st_size + 1  # text: a byte offset; JSONL: lines (checked again as read: Stale)


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # pyarrow's own types; the build refuses the file with its message
        return 0


def resumable(cache: Path, files, dtype, sep, vocab, bin_dtype) -> dict | None:
    """The progress record of an interrupted build of this key, if it fits: every field of its type,
    its file and position inside the inputs, its token and document counts held by the partial files,
    the partial tokens' largest id the recorded one (and inside the vocabulary), the document ends
    increasing. None (start over) otherwise."""
    part, docs_part, prog = partials(cache)
    try:
        rec = json.loads(read_regular(prog, "token cache"))
        with open_regular(part, "token cache") as fh, open_regular(docs_part, "token cache") as dh:
            ok = (
                isinstance(rec, dict)
                and _int(rec.get("file"), 0, len(files) - 1)
                and _int(rec.get("tokens"), 0, os.fstat(fh.fileno()).st_size // dtype.itemsize)
                and _int(rec.get("docs"), 0, min(rec["tokens"], os.fstat(dh.fileno()).st_size // 8))
                and _int(rec.get("max"), -1, (vocab or 1 << 32) - 1)
                and isinstance(rec.get("open", False), bool)
                and _int(rec.get("marker"), 0, _position_bound(files[rec["file"]], bin_dtype))
            )
            if not ok:
                return None
            ids = np.memmap(fh, dtype=dtype, mode="r", shape=(rec["tokens"],)) if rec["tokens"] else np.zeros(0, dtype)
            ends = np.fromfile(dh, dtype=np.int64, count=rec["docs"])
            return rec if fits(ids, ends, rec["max"], sep) else None
    except (OSError, ValueError, GrowError, KeyError):
        return None


def fits(ids: np.ndarray, ends: np.ndarray, top: int, sep) -> bool:
    """Do token ids and document ends agree with a record's largest id and count (chunked reads)?"""
    seen = -1
    for lo in range(0, len(ids), SCAN):
        chunk = np.asarray(ids[lo : lo + SCAN])
        seen = max(seen, int(chunk.max()))
    if seen != top:
        return False
    if len(ends) and (ends[0] <= 0 or ends[-1] > len(ids) or np.any(np.diff(ends) <= 0)):
        return False
    return sep is None or all(int(ids[e - 1]) == sep for e in ends[-8:])


def checked(cache: Path, meta_path: Path, docs_path: Path, dtype, sep) -> tuple | None:
    """(record, tokens memmap, document ends) of a finished cache, if it holds what its record says:
    regular files of the folder (no links), every field of its type, the sizes, document ends
    increasing up to the token count, and the largest id (a chunked scan) the recorded one. None
    otherwise: the cache is rebuilt, never trusted as found."""
    try:
        meta = json.loads(read_regular(meta_path, "token cache"))
        with open_regular(cache, "token cache") as fh, open_regular(docs_path, "token cache") as dh:
            n = os.fstat(fh.fileno()).st_size // dtype.itemsize
            ok = (
                isinstance(meta, dict)
                and meta.get("tokens") == n > 0
                and n * dtype.itemsize == os.fstat(fh.fileno()).st_size
                and _int(meta.get("docs"), 0, n)
                and meta["docs"] * 8 == os.fstat(dh.fileno()).st_size
                and _int(meta.get("max"), 0, (1 << 32) - 1)
                and meta.get("sep") == sep
                and meta.get("dtype") == dtype.name
            )
            if not ok:
                return None
            tokens = np.memmap(fh, dtype=dtype, mode="r", shape=(n,))
            ends = np.fromfile(dh, dtype=np.int64)
    except (OSError, ValueError, GrowError):
        return None
    if not fits(tokens, ends, meta["max"], sep):
        return None
    return meta, tokens, ends


__all__ = ["SCAN", "partials", "resumable", "fits", "checked"]
