"""Training data: text files -> one token array (cached), a train/validation split, and batches.

* Tokenizer (``tokenizer_for``): the checkpoint's own (its folder's ``tokenizer.json`` or the one its
  metadata records, see ``growtool.tokenizer``), or an explicit ``"byte"`` / path; the byte
  tokenizer (ids 0..255) only for a model with a vocabulary of 256, and never a tokenizer with more
  ids than the model's vocabulary. Files are tokenised in the order given and concatenated; the ids
  equal encoding each whole file in one call (``encode_text``), computed in pieces.
* Cache: the token array is written once as a raw uint16 (uint32 for vocabularies above 65536)
  file named after the sha256 of the tokenizer and of every data file, and read back as a numpy
  memmap. The file is written atomically, so a cache file is always complete.
* Split: the last ``max(n // 20, batch * seq + 1)`` tokens are validation, the rest training.
* Batches: training batch ``step`` is drawn from ``numpy.random.default_rng([seed, step])``, so it
  depends on (seed, step) only - resuming at step s sees exactly the batches an uninterrupted run
  sees. A data-parallel rank takes its contiguous slice of the same global batch. Validation batches
  are fixed windows spread evenly over the held-out tail.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from growtool.io.checkpoint import atomic_file
from growtool.nn.errors import GrowError
from growtool.tokenizer import (  # noqa: F401 (the tokenizer lives in growtool.tokenizer; kept importable here)
    AGREE,
    CHUNK,
    OVERLAP,
    Tokenizer,
    _cuts,
    _stitch,
    encode_text,
    get_tokenizer,
    tokenizer_for,
)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def check_files(files) -> list[Path]:
    if not files:
        raise GrowError("no data files given (--data FILE)")
    out = []
    for f in files:
        p = Path(f)
        if not p.exists():
            raise GrowError(f"{p}: no such data file")
        if not p.is_file():
            raise GrowError(f"{p}: not a file")
        out.append(p)
    return out


def check_tokens(ids: np.ndarray, vocab_size: int | None, need: int, src: str) -> None:
    """Raise GrowError unless the tokens are non-empty, fit the vocabulary and number at least ``need``."""
    if len(ids) == 0:
        raise GrowError(f"{src}: no tokens (the data is empty)")
    top = int(ids.max())
    if vocab_size is not None and top >= vocab_size:
        raise GrowError(
            f"{src}: token id {top} does not fit the model's vocabulary of {vocab_size} "
            f"(use a model with a larger vocab or another tokenizer)"
        )
    if len(ids) < need:
        raise GrowError(
            f"{src}: {len(ids)} tokens are shorter than one training sequence plus one "
            f"validation batch ({need} tokens at this --seq and --batch)"
        )


def load_tokens(
    files,
    tok: Tokenizer,
    cache_dir: str | Path | None,
    vocab_size: int | None = None,
    need: int = 1,
    write_cache: bool = True,
) -> np.ndarray:
    """All files' tokens, concatenated: read from the cache in ``cache_dir``, or tokenised (and then
    cached there, if ``write_cache``). The tokens are checked (``check_tokens``) before anything
    is written, so bad data leaves no file behind."""
    paths = check_files(files)
    shas = [file_sha256(p) for p in paths]
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    key = hashlib.sha256(json.dumps([tok.key, shas, "whole-text"]).encode()).hexdigest()[:32]
    cache = Path(cache_dir) / f"tokens-{key}.{np.dtype(dtype).name}" if cache_dir is not None else None
    src = ", ".join(map(str, paths))
    if cache is not None and cache.is_file() and cache.stat().st_size > 0:
        if cache.stat().st_size % np.dtype(dtype).itemsize == 0:  # else cut short: rebuilt below
            ids = np.memmap(cache, dtype=dtype, mode="r")
            if len(ids) and int(ids.max()) < tok.vocab_size:  # else damaged: rebuilt below
                check_tokens(ids, vocab_size, need, src)
                return ids
    parts = []
    for p in paths:
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise GrowError(f"{p}: cannot read ({e.strerror})") from None
        parts.append(tok.encode(raw, str(p)))
    ids = np.concatenate(parts).astype(dtype)
    check_tokens(ids, vocab_size, need, src)
    if cache is None or not write_cache:
        return ids
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_file(cache, lambda fh: fh.write(ids.tobytes()))
    return np.memmap(cache, dtype=dtype, mode="r")


def val_tokens(n: int, seq: int, batch: int) -> int:
    """Size of the held-out tail: ~5% of the data, at least one batch of windows."""
    return max(n // 20, batch * seq + 1)


def min_tokens(seq: int, batch: int) -> int:
    """The fewest tokens that hold one training window and one validation batch."""
    return (seq + 1) + (batch * seq + 1)


class Dataset:
    """A token array split into training and validation parts; batches of ``seq`` tokens."""

    def __init__(self, tokens: np.ndarray, seq: int, batch: int, src: str = "data"):
        n = len(tokens)
        self.tokens, self.seq, self.batch = tokens, seq, batch
        self.n_val = val_tokens(n, seq, batch)
        self.n_train = n - self.n_val
        check_tokens(tokens, None, min_tokens(seq, batch), src)

    def train_batch(self, step: int, seed: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Global batch ``step`` (a function of seed and step only); this rank's slice of it."""
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, self.n_train - self.seq, size=self.batch)
        per = self.batch // world
        return self._windows(starts[rank * per : (rank + 1) * per])

    def val_batches(self, max_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed validation windows (non-overlapping where the tail allows), in batches."""
        lo, hi = self.n_train, len(self.tokens) - self.seq - 1
        n = max(1, min(max_batches * self.batch, (hi - lo) // self.seq + 1))
        starts = np.linspace(lo, hi, n).round().astype(np.int64)
        return [self._windows(starts[i : i + self.batch]) for i in range(0, n, self.batch)]

    def _windows(self, starts) -> tuple[torch.Tensor, torch.Tensor]:
        w = np.stack([np.asarray(self.tokens[s : s + self.seq + 1], dtype=np.int64) for s in starts])
        w = torch.from_numpy(w)
        return w[:, :-1], w[:, 1:]


__all__ = ["Tokenizer", "get_tokenizer", "tokenizer_for", "encode_text", "load_tokens", "Dataset", "file_sha256"]
