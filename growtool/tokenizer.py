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
from dataclasses import dataclass
from pathlib import Path

from growtool.nn.errors import GrowError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
)
CARRIED = TOKENIZER_FILES + ("generation_config.json",)


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
        from growtool.training.data import tokenizer_for

        tokenizer_for(ck, explicit)  # checks the tokenizer against the vocabulary
    found, note = resolve(ck, explicit)
    if note:
        note = f"{ck.source}: {note}; the output has no tokenizer files (attach one with --tokenizer PATH)"
    return Carry(found, found.record() if found else ck.tokenizer, note)


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``folder``, each atomically."""
    from growtool.io.checkpoint import atomic_file

    for n, b in files.items():
        atomic_file(folder / n, lambda fh, b=b: fh.write(b))


__all__ = ["CARRIED", "TokenizerFiles", "resolve", "carry", "from_path", "write_files"]
