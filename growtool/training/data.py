"""Training data: inputs -> one token array (cached), a train/validation split, and batches.

* Tokenizer (``tokenizer_for``, in ``growtool.tokenizer``): the checkpoint's own, or an explicit
  ``"byte"`` / path; refused when it does not fit the model's vocabulary.
* Corpus and cache (``growtool.training.corpus``): files, folders and globs of text, JSONL, Parquet
  and token files, tokenised by streaming into an atomic, resumable uint16 / uint32 cache read back
  as a numpy memmap; each document followed by the separator (``corpus_dataset``). ``load_tokens``
  keeps the older call: the files' ids with nothing between them.
* Split: a ``--val-data`` corpus; else the last whole documents holding at least
  ``max(n // 20, batch * seq + 1)`` tokens (that many tokens when the documents do not allow it).
* Batches: training batch ``step`` is drawn from ``numpy.random.default_rng([seed, step])``, so it
  depends on (seed, step) only - resuming at step s sees exactly the batches an uninterrupted run
  sees. A data-parallel rank takes its contiguous slice of the same global batch. Validation batches
  are fixed windows spread evenly over the held-out part.
* Where a run starts in the stream (``stream_start``, ``stream_position``): after the batches its
  input's training already used. Since batch ``k`` depends on (seed, k) only, a second run with the
  same seed would see the very batches the first one saw; a grown checkpoint trained with the
  defaults (``expand`` then ``train GROWN``) used to do exactly that: replay its source's batches
  (bench/README, the plain path). Each ``train`` lineage entry now records the seed and
  ``data_end``, the stream position after its last update (``data_start + steps``), and a run
  starts, by default, at the latest recorded position in its input's lineage (``--data-start``
  overrides it; 0 restarts the stream). Update ``s`` of a run uses batch ``data_start + s``. A
  lineage from before ``data_end`` was recorded starts at 0, as before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from growtool.nn.errors import GrowError
from growtool.tokenizer import (
    Tokenizer,
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


def check_tokens(ids: np.ndarray, vocab_size: int | None, need: int, src: str, top: int | None = None) -> None:
    """Raise GrowError unless the tokens are non-empty, fit the vocabulary and number at least ``need``
    (``top``: the largest id when known, so a memory-mapped corpus is not read whole)."""
    if len(ids) == 0:
        raise GrowError(f"{src}: no tokens (the data is empty)")
    top = int(ids.max()) if top is None and vocab_size is not None else top
    if vocab_size is not None and top is not None and top >= vocab_size:
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
    """All files' tokens, concatenated with nothing between them (``corpus.load`` with
    ``doc_sep="none"``): read from the cache in ``cache_dir``, or tokenised into it (streaming; bad
    data leaves no file behind). A memory map."""
    from growtool.training import corpus

    c = corpus.load(files, tok, cache_dir, vocab_size, reading=corpus.Reading(doc_sep="none"), write_cache=write_cache)
    check_tokens(c.tokens, None, need, ", ".join(map(str, c.files)), top=c.max_id)
    return c.tokens


@dataclass(frozen=True)
class Inputs:
    """The text a run trains on: the training ``files``, the ``val_files`` (None: the training
    corpus's last whole documents), read by tokenizer ``tok`` into the token cache ``cache_dir``."""

    files: list
    val_files: list | None
    tok: object
    cache_dir: Path


def corpus_dataset(inputs: Inputs, vocab_size, seq, opts, rank=0, progress=False):
    """The trainer's data (growtool.training.corpus): the training corpus, its validation part (the
    ``val_files`` corpus, or its last whole documents), and the run identity (inputs' sha256)."""
    from growtool.training import corpus

    files, val_files, tok, cache_dir = inputs.files, inputs.val_files, inputs.tok, inputs.cache_dir
    reading = corpus.Reading(opts.text_key, opts.doc_sep, opts.data_dtype)
    kw = dict(reading=reading, write_cache=rank == 0)
    train = corpus.load(files, tok, cache_dir, vocab_size, progress=progress and rank == 0, **kw)
    val = corpus.load(val_files, tok, cache_dir, vocab_size, label="validation", **kw) if val_files else None
    src = ", ".join(map(str, train.files))
    check_tokens(train.tokens, vocab_size, min_tokens(seq, opts.batch) if val is None else seq + 1, src, train.max_id)
    if val is not None:
        check_tokens(val.tokens, vocab_size, seq + 1, ", ".join(map(str, val.files)), val.max_id)
    ds = Dataset(train.tokens, seq, opts.batch, src, val=None if val is None else val.tokens, doc_ends=train.doc_ends)
    identity = {"data_sha256": train.shas, "val_sha256": val.shas if val is not None else []}
    return ds, identity


def val_tokens(n: int, seq: int, batch: int) -> int:
    """Size of the held-out tail: ~5% of the data, at least one batch of windows."""
    return max(n // 20, batch * seq + 1)


def min_tokens(seq: int, batch: int) -> int:
    """The fewest tokens that hold one training window and one validation batch."""
    return (seq + 1) + (batch * seq + 1)


RELEASE_EVERY = 1024  # training steps between dropping the memory map's pages from this process


def release(tokens) -> None:
    """Drop a memory-mapped token array's pages from this process's resident set (they stay in the
    page cache), so that RSS does not grow with the tokens a long run has touched."""
    import mmap

    m = getattr(tokens, "_mmap", None)
    if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        m.madvise(mmap.MADV_DONTNEED)


class Dataset:
    """A token array split into training and validation parts; batches of ``seq`` tokens.

    ``val``: a held-out token array (then all of ``tokens`` trains). Otherwise, given ``doc_ends``
    (where documents end), the validation part is the last whole documents holding at least
    ``val_tokens`` tokens; without them, or when that would leave less than one training window
    (a corpus of one long document), the last ``val_tokens`` tokens."""

    def __init__(self, tokens: np.ndarray, seq: int, batch: int, src: str = "data", val=None, doc_ends=None):
        n = len(tokens)
        self.tokens, self.seq, self.batch, self.val = tokens, seq, batch, val
        if val is not None:
            self.n_val, self.n_train = len(val), n
            check_tokens(tokens, None, seq + 1, src, top=0)
            check_tokens(val, None, seq + 1, "--val-data", top=0)
            return
        self.n_val = val_tokens(n, seq, batch)
        self.n_train = n - self.n_val
        if doc_ends is not None and len(doc_ends):
            k = int(np.searchsorted(doc_ends, self.n_train, side="right"))
            cut = int(doc_ends[k - 1]) if k else 0
            if cut >= seq + 1:
                self.n_train, self.n_val = cut, n - cut
        check_tokens(tokens, None, min_tokens(seq, batch), src, top=0)

    def train_batch(self, step: int, seed: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Global batch ``step`` (a function of seed and step only); this rank's slice of it."""
        if step % RELEASE_EVERY == 0:
            release(self.tokens)
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, self.n_train - self.seq, size=self.batch)
        per = self.batch // world
        return self._windows(starts[rank * per : (rank + 1) * per])

    def val_batches(self, max_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed validation windows (non-overlapping where the tail allows), in batches."""
        src = self.tokens if self.val is None else self.val
        lo, hi = (self.n_train if self.val is None else 0), len(src) - self.seq - 1
        n = max(1, min(max_batches * self.batch, (hi - lo) // self.seq + 1))
        starts = np.linspace(lo, hi, n).round().astype(np.int64)
        return [self._windows(starts[i : i + self.batch], src) for i in range(0, n, self.batch)]

    def _windows(self, starts, src=None) -> tuple[torch.Tensor, torch.Tensor]:
        src = self.tokens if src is None else src
        w = np.stack([np.asarray(src[s : s + self.seq + 1], dtype=np.int64) for s in starts])
        w = torch.from_numpy(w)
        return w[:, :-1], w[:, 1:]


def stream_start(lineage: list) -> int:
    """The data-stream position after the latest ``train`` entry of ``lineage`` that records one (0: none)."""
    from growtool.nn import args

    for entry in reversed(lineage or []):
        if isinstance(entry, dict) and entry.get("op") == "train" and entry.get("data_end") is not None:
            return args.integer("the lineage's data_end", entry["data_end"], 0)
    return 0


def stream_position(s: dict, step: int) -> int:
    """The stream position of update ``step`` (0-based) of a run with saved settings ``s``."""
    return int(s.get("data_start") or 0) + step


__all__ = ["load_tokens", "Dataset", "file_sha256", "stream_start", "stream_position"]
