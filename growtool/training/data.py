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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from growtool.nn.errors import GrowError


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


CHUNK, OVERLAP, AGREE = 1 << 16, 1 << 10, 8


def _cuts(text: str, chunk: int) -> list[int]:
    """Piece boundaries: after the first line end at least ``chunk`` characters on (or right at
    ``chunk`` within a line longer than ``2 * chunk``); the last piece is at least ``chunk`` long."""
    cuts, pos = [0], 0
    while pos + 2 * chunk < len(text):
        nl = text.find("\n", pos + chunk, pos + 2 * chunk)
        pos = nl + 1 if nl >= 0 else pos + chunk
        cuts.append(pos)
    return cuts + [len(text)]


def _stitch(prev, nxt, lo: int) -> tuple[int, int] | None:
    """Where to join two overlapping encodings (ids, starts, ends; absolute character offsets):
    (i, j) with prev's tokens [lo, i) followed by nxt's tokens [j, ...). The join is at the first
    clean token boundary (no character split between tokens) where both encodings hold the same
    ``AGREE`` tokens, ids and offsets - past the reach of the context each piece lacks. None if
    there is no such place."""
    (pi, ps, pe), (ni, ns, ne) = prev, nxt
    first = {}
    for i in range(max(lo, 1, int(np.searchsorted(ps, ns[0]))), len(pi) - AGREE + 1):
        if pe[i - 1] <= ps[i]:
            first.setdefault(int(ps[i]), i)
    for j in range(1, len(ni) - AGREE + 1):
        i = first.get(int(ns[j]))
        if i is None or ne[j - 1] > ns[j]:
            continue
        k = slice(i, i + AGREE), slice(j, j + AGREE)
        if (pi[k[0]] == ni[k[1]]).all() and (ps[k[0]] == ns[k[1]]).all() and (pe[k[0]] == ne[k[1]]).all():
            return i, j
    return None


def encode_text(hf, text: str, chunk: int = CHUNK, overlap: int = OVERLAP, group: int = 64) -> np.ndarray:
    """The ids of ``hf.encode(text, add_special_tokens=False)`` (a ``tokenizers.Tokenizer``),
    computed in pieces of about ``chunk`` characters, ``group`` pieces per parallel batch.

    Each piece after the first is encoded with ``overlap`` characters of the text before it, and
    consecutive pieces are joined where their encodings agree (``_stitch``), so a token spanning a
    piece boundary, or a tokenizer that treats the start of its input specially, comes out as in
    one whole-text call. Where no agreeing join exists the whole text is encoded in one call.
    """
    cuts = _cuts(text, chunk)
    if len(cuts) <= 2:
        return np.asarray(hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    spans = [(max(0, a - (overlap if k else 0)), b) for k, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    kept, prev, lo = [], None, 0
    for g in range(0, len(spans), group):
        encs = hf.encode_batch([text[a:b] for a, b in spans[g : g + group]], add_special_tokens=False)
        for (a, _), e in zip(spans[g : g + group], encs):
            off = np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) + a
            cur = (np.asarray(e.ids, dtype=np.int64), off[:, 0].copy(), off[:, 1].copy())
            if prev is not None:
                join = _stitch(prev, cur, lo) if len(cur[0]) else None
                if join is None:
                    return np.asarray(hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)
                kept.append(prev[0][lo : join[0]])
                lo = join[1]
            prev = cur
    kept.append(prev[0][lo:])
    return np.concatenate(kept)


@dataclass
class Tokenizer:
    """``encode(bytes) -> int array``; ``key`` identifies it in the cache; ``files`` are the tokenizer
    files it was read from (carried into a training run's folder), None for the byte tokenizer."""

    name: str
    vocab_size: int
    key: str
    hf: object = None
    files: object = None  # growtool.tokenizer.TokenizerFiles

    def encode(self, raw: bytes, src: str) -> np.ndarray:
        """A data file's ids: its bytes, or equal to encoding the whole file's text in one call."""
        if self.hf is None:
            return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GrowError(f"{src}: not UTF-8 text (byte {e.start}); the {self.name} tokenizer needs text") from None
        return encode_text(self.hf, text)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids, with the special tokens the tokenizer adds to an input (e.g. BOS)."""
        if self.hf is None:
            return list(text.encode("utf-8"))
        return list(self.hf.encode(text, add_special_tokens=True).ids)

    def decode(self, ids) -> str:
        if self.hf is None:
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)


def _hf_tokenizer(tf, where: str) -> Tokenizer:
    """A Tokenizer from the tokenizer.json among ``tf``'s files (growtool.tokenizer.TokenizerFiles)."""
    from tokenizers import Tokenizer as HFTokenizer

    raw = tf.files.get("tokenizer.json")
    if raw is None:
        raise GrowError(
            f"{where}: has tokenizer files but no tokenizer.json "
            "(save the tokenizer with transformers' save_pretrained to write one)"
        )
    try:
        tok = HFTokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises its own exception type
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GrowError(f"{where}: not a Hugging Face tokenizer.json ({why})") from None
    ids = list(tok.get_vocab(with_added_tokens=True).values())
    size = max(ids) + 1 if ids else 0
    return Tokenizer(where, size, "hf-" + hashlib.sha256(raw).hexdigest(), tok, tf)


def get_tokenizer(spec: str) -> Tokenizer:
    """``"byte"``, or a path to a Hugging Face ``tokenizer.json`` or a folder holding one."""
    if spec == "byte":
        return Tokenizer("byte", 256, "byte")
    from growtool.tokenizer import from_path

    return _hf_tokenizer(from_path(spec), spec)


def tokenizer_for(ck, spec: str | None = None) -> Tokenizer:
    """The tokenizer to use with checkpoint ``ck``: ``spec`` (``"byte"`` or a path) if given, else
    the checkpoint's own (``growtool.tokenizer.resolve``), else the byte tokenizer for a model with
    a vocabulary of 256. Raises GrowError (one line) when there is none, or when the tokenizer and
    the model's vocabulary do not match (byte on a vocabulary other than 256, or a tokenizer with
    more ids than the vocabulary)."""
    from growtool.tokenizer import resolve

    vocab = ck.config.vocab_size
    if spec == "byte":
        if vocab != 256:
            raise GrowError(
                f"the byte tokenizer (256 ids) does not match {ck.source}'s vocabulary of {vocab:,} "
                "(use the model's own tokenizer: drop --tokenizer byte, or pass --tokenizer PATH)"
            )
        return get_tokenizer("byte")
    tf, note = resolve(ck, spec)
    if tf is None or not tf.has_tokenizer:
        if vocab == 256:
            return get_tokenizer("byte")
        why = f" ({note})" if note else ""
        raise GrowError(
            f"{ck.source}: no tokenizer found for its vocabulary of {vocab:,}{why}: "
            "pass --tokenizer PATH (a tokenizer.json or a folder holding one)"
        )
    tok = _hf_tokenizer(tf, spec or tf.origin)
    if tok.vocab_size > vocab:
        raise GrowError(
            f"tokenizer {tok.name} has {tok.vocab_size:,} ids, more than {ck.source}'s vocabulary "
            f"of {vocab:,} (not this model's tokenizer)"
        )
    return tok


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

    c = corpus.load(files, tok, cache_dir, vocab_size, doc_sep="none", write_cache=write_cache)
    check_tokens(c.tokens, None, need, ", ".join(map(str, c.files)), top=c.max_id)
    return c.tokens


def corpus_dataset(files, val_files, tok, cache_dir, vocab_size, seq, opts, rank=0, progress=False):
    """The trainer's data (growtool.training.corpus): the training corpus, its validation part (the
    ``val_files`` corpus, or its last whole documents), and the run identity (inputs' sha256)."""
    from growtool.training import corpus

    kw = dict(text_key=opts.text_key, doc_sep=opts.doc_sep, data_dtype=opts.data_dtype, write_cache=rank == 0)
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


__all__ = ["Tokenizer", "get_tokenizer", "tokenizer_for", "encode_text", "load_tokens", "Dataset", "file_sha256"]
