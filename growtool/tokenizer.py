"""A model's tokenizer and generation files: which files travel with a checkpoint, where they are
found, and how a checkpoint records the tokenizer it expects.

* Carried files (``CARRIED``): the Hugging Face tokenizer files (``tokenizer.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``, ``added_tokens.json``, vocab / merges /
  sentencepiece files, chat templates) and ``generation_config.json``. They are copied byte for
  byte; nothing else in a source folder is (its README.md describes another model).
* Where they are found (``resolve``), first match wins: an explicit path (``--tokenizer``: a
  folder holding them, or a single ``tokenizer.json`` file); the checkpoint's own folder (an HF
  folder, or the folder a ``.safetensors`` file sits in, if that folder holds tokenizer files); the
  origin recorded in the checkpoint's metadata, if its files still have the recorded sha256.
* The record kept in the safetensors metadata under ``tokenizer``:
  ``{"from": absolute folder or file, "files": {name: sha256}}`` - so a ``.safetensors`` output,
  or a stage read from standard input, still knows which tokenizer the model expects.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from growtool.io.carried import CARRIED, TOKENIZER_FILES  # noqa: E402 (the names, where io/confine reads them too)
from growtool.nn.errors import GrowError


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class TokenizerFiles:
    """Tokenizer / generation files (name -> bytes) and the folder or file they were read from."""

    origin: str
    files: dict

    @property
    def has_tokenizer(self) -> bool:
        return any(n in self.files for n in TOKENIZER_FILES)

    def record(self) -> dict:
        """What the metadata keeps: origin and every file's sha256."""
        return {"from": self.origin, "files": {n: sha256(b) for n, b in sorted(self.files.items())}}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise GrowError(f"{path}: cannot read ({e.strerror})") from None


def read_folder(folder: Path, names=CARRIED) -> TokenizerFiles | None:
    """The carried files present in ``folder`` (None when there are none); each must resolve inside
    it (a Hugging Face cache's blob links allowed: ``confine.inside``) and be a regular file."""
    from growtool.io import confine

    present = [n for n in names if (folder / n).is_file() or (folder / n).is_symlink()]
    for n in present:
        confine.inside(folder / n, folder, "a tokenizer or generation file")
    files = {n: confine.read_small(folder / n, n, confine.TOKENIZER) for n in present}
    return TokenizerFiles(str(folder.resolve()), files) if files else None


def from_path(path: str) -> TokenizerFiles:
    """An explicit ``--tokenizer PATH``: a folder of tokenizer files, or one tokenizer.json file."""
    p = Path(path)
    if p.is_dir():
        tf = read_folder(p)
        if tf is None or not tf.has_tokenizer:
            raise GrowError(f"--tokenizer {path}: the folder holds no tokenizer files (expected tokenizer.json)")
        return tf
    if p.is_file():
        return TokenizerFiles(str(p.resolve()), {"tokenizer.json": _read(p)})
    raise GrowError(f"--tokenizer {path}: no such file or folder (expected a tokenizer.json or a folder holding one)")


def from_record(rec: dict) -> tuple[TokenizerFiles | None, str | None]:
    """The recorded tokenizer's files if they are still where the record says, unchanged; else
    (None, a note saying why)."""
    origin, want = Path(str(rec.get("from", ""))), rec.get("files") or {}
    if origin.is_dir():
        tf = read_folder(origin, [n for n in CARRIED if n in want])
    elif origin.is_file() and list(want) == ["tokenizer.json"]:
        tf = TokenizerFiles(str(origin), {"tokenizer.json": _read(origin)})
    else:
        return None, f"the tokenizer it records ({origin}) is no longer there"
    if tf is None or tf.record()["files"] != want:
        return None, f"the tokenizer it records ({origin}) has changed since"
    return tf, None


def resolve(ck, explicit: str | None = None) -> tuple[TokenizerFiles | None, str | None]:
    """The tokenizer files checkpoint ``ck`` goes with (see the module docstring for the order),
    or (None, a note when a recorded tokenizer could not be found)."""
    if explicit is not None:
        return from_path(explicit), None
    if ck.source != "<stdin>":
        p = Path(ck.source)
        tf = read_folder(p) if p.is_dir() else read_folder(p.parent)
        if tf is not None and (p.is_dir() or tf.has_tokenizer):
            return tf, None
    if ck.tokenizer:
        return from_record(ck.tokenizer)
    return None, None


@dataclass
class Carry:
    """What an output made from a checkpoint takes along: the tokenizer files (if found), the record
    for its metadata (the found files', else the input's own record), and a note for the user."""

    found: TokenizerFiles | None
    record: dict | None
    note: str | None

    def files(self, cfg, lineage: list, source: str, name: str) -> dict[str, bytes]:
        """The files for a folder output: the carried tokenizer files and a model card (README.md)."""
        from growtool.io.card import model_card

        out = dict(self.found.files) if self.found else {}
        out["README.md"] = model_card(cfg, lineage, source, name, self.found).encode()
        return out


def carry(ck, explicit: str | None = None) -> Carry:
    """The tokenizer an output of ``ck`` takes along (``explicit`` = an attached ``--tokenizer``,
    refused with GrowError when it does not fit the model's vocabulary)."""
    if explicit is not None:
        tokenizer_for(ck, explicit, whole=True)  # checks the tokenizer against the vocabulary
    found, note = resolve(ck, explicit)
    if note:
        note = f"{ck.source}: {note}; the output has no tokenizer files (attach one with --tokenizer PATH)"
    return Carry(found, found.record() if found else ck.tokenizer, note)


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``folder``, each atomically."""
    from growtool.io.files import atomic_file

    for n, b in files.items():
        atomic_file(folder / n, lambda fh, b=b: fh.write(b))


__all__ = ["TokenizerFiles", "resolve", "carry", "from_path", "write_files"]


# ---- the tokenizer itself ------------------------------------------------------------------

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


def native(call, on: str = "this data"):
    """``call()`` (a tokenizers library call on the user's text or ids), with a panic of the library
    (pyo3's ``PanicException``, a ``BaseException``: a pre-tokenizer or decoder regex past its engine's
    retry limit, say) made one GrowError line: the tokenizer failed on ``on``. The library prints a
    panic to file descriptor 2 itself, so descriptor 2 is held in a temporary file during the call and
    copied back unless the call panicked. Every call of the library on user text goes through here."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as cap:
        saved, panicked = os.dup(2), False
        os.dup2(cap.fileno(), 2)
        try:
            return call()
        except BaseException as e:
            if type(e).__name__ != "PanicException":
                raise
            panicked = True
            raise GrowError(f"the tokenizer failed on {on} ({' '.join(str(e).split())[:120]})") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            cap.seek(0)
            held = cap.read()
            if held and not panicked:
                os.write(2, held)


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
        return native(lambda: encode_text(self.hf, text), src)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids, with the special tokens the tokenizer adds to an input (e.g. BOS)."""
        if self.hf is None:
            return list(text.encode("utf-8"))
        return list(native(lambda: self.hf.encode(text, add_special_tokens=True), "this prompt").ids)

    def decode(self, ids) -> str:
        if self.hf is None:
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return native(lambda: self.hf.decode([int(i) for i in ids], skip_special_tokens=False), "these ids")


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
    return _hf_tokenizer(from_path(spec), spec)


def pads_to(n: int, vocab: int) -> bool:
    """True when ``vocab`` is ``n`` ids rounded up to a multiple of 64 (or 128): the padding nanoGPT
    and Megatron give an embedding (GPT-2's 50,257 ids in 50,304 rows)."""
    return any(vocab == -(-n // m) * m for m in (64, 128))


def tokenizer_for(ck, spec: str | None = None, whole: bool = False) -> Tokenizer:
    """The tokenizer to use with checkpoint ``ck``: ``spec`` (``"byte"`` or a path) if given, else
    the checkpoint's own (``growtool.tokenizer.resolve``), else the byte tokenizer for a model with
    a vocabulary of 256. Raises GrowError (one line) when there is none, or when the tokenizer and
    the model's vocabulary do not match (byte on a vocabulary other than 256, or a tokenizer with
    more ids than the vocabulary; with ``whole``, also one with fewer, unless the vocabulary is its
    ids padded to a multiple of 64: sampling and attaching need the tokenizer of every id)."""
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
    if whole and tok.vocab_size < vocab and not pads_to(tok.vocab_size, vocab):
        raise GrowError(
            f"tokenizer {tok.name} has {tok.vocab_size:,} ids, fewer than {ck.source}'s vocabulary "
            f"of {vocab:,} (not this model's tokenizer: ids from {tok.vocab_size:,} up have no text)"
        )
    return tok
