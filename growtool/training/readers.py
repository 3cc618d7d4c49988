"""Reading training inputs (growtool.training.corpus states what holds): which files an input names,
their kinds, the documents or ids in each, and the checks that find bad input (GrowError, one line
naming the file and line, row or position).

Readers yield ``(marker, payload, last, bytes_read, where)``: ``marker`` is where a resumed read
starts again (a byte offset of a text file, a line of a JSONL file, a row of a Parquet file, a
position in a token file), ``payload`` text (``str``, or ``bytes`` of a text file) or an id array,
``last`` whether a document ends with it, ``where`` (file, line or row) for messages.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import zlib
from pathlib import Path

import numpy as np

from growtool.nn.errors import GrowError

MAX_LINE = 64 << 20  # bytes of one JSONL line, unless GROWTOOL_MAX_LINE says otherwise
SURROGATE = re.compile("[\ud800-\udfff]")  # a lone \\uXXXX surrogate escape decodes to one of these


class Stale(Exception):
    """A resumed read starts past the end of its file: the progress record does not fit the input."""


def max_line() -> int:
    """The longest JSONL line read (bytes, newline excluded): ``GROWTOOL_MAX_LINE`` (bytes or a size
    such as 256MB) or ``MAX_LINE``. A record is parsed whole, so this bounds the reader's memory."""
    text = os.environ.get("GROWTOOL_MAX_LINE")
    if not text:
        return MAX_LINE
    from growtool.io.files import parse_size

    try:
        return parse_size(text)
    except GrowError:
        raise GrowError(f"GROWTOOL_MAX_LINE={text!r}: not a positive size (e.g. 64MB, 1GiB, or bytes)") from None


EOT_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
TOKEN_KINDS = ("bin", "npy")


def kind_of(path: Path) -> str:
    name = path.name.lower()
    for suffix, kind in ((".jsonl.gz", "jsonl"), (".jsonl", "jsonl"), (".parquet", "parquet")):
        if name.endswith(suffix):
            return kind
    if name.endswith(".bin"):
        return "bin"
    if name.endswith(".npy"):
        return "npy"
    return "text"


def expand_inputs(specs, what: str = "--data") -> list[Path]:
    """Files, folders (recursively, sorted) and globs -> the files, in order; GrowError for a name
    that matches nothing."""
    if not specs:
        raise GrowError(f"no data files given ({what} FILE)")
    out = []
    for spec in specs:
        p = Path(spec)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            found = sorted(
                q for q in p.rglob("*") if q.is_file() and not any(s.startswith(".") for s in q.parts[len(p.parts) :])
            )
            if not found:
                raise GrowError(f"{p}: the folder holds no files ({what})")
            out += found
        elif glob.has_magic(str(spec)):
            found = sorted(Path(q) for q in glob.glob(str(spec), recursive=True) if Path(q).is_file())
            if not found:
                raise GrowError(f"{spec}: no file matches ({what})")
            out += found
        elif p.exists():
            raise GrowError(f"{p}: not a file")
        else:
            raise GrowError(f"{p}: no such data file")
    return out


def token_dtype(vocab_size: int, spec: str = "auto"):
    if spec in (None, "auto"):
        return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    return np.dtype(spec)


def doc_separator(tok, spec: str | None) -> int | None:
    """The id written after each document (None: nothing)."""
    spec = spec or "auto"
    if spec == "none":
        return None
    if tok.hf is None:
        if spec == "auto":
            return None
        raw = spec.encode("utf-8")
        if len(raw) != 1:
            raise GrowError(f"--doc-sep {spec!r}: the byte tokenizer separates documents by one byte (e.g. a newline)")
        return raw[0]
    vocab = tok.hf.get_vocab(with_added_tokens=True)
    if spec == "auto":
        return next((vocab[n] for n in EOT_NAMES if n in vocab), None)
    if spec not in vocab:
        raise GrowError(f"--doc-sep {spec!r}: not a token of the {tok.name} tokenizer (give a token, auto or none)")
    return vocab[spec]


def line_safe(tok) -> bool:
    """Is a cut before a space or newline followed by a printable ASCII character always a
    pre-token boundary (see ``last_cut``)? True for a byte-level BPE with GPT-2's split regex, no
    prefix space and a local normaliser."""
    if tok.hf is None:
        return True
    try:
        cfg = json.loads(tok.hf.to_str())
    except Exception:  # tokenizers raises its own exception type
        return False
    pre, norm = cfg.get("pre_tokenizer") or {}, cfg.get("normalizer")
    ok_norm = norm is None or norm.get("type") in ("NFC", "NFKC", "NFD", "NFKD")
    return (
        ok_norm
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
    )


# A piece may start at a space or newline followed by a printable ASCII character other than space
# (``x Y``, ``x\nY``, ``x\n\nY``: the piece starts at the last whitespace character of the run). Under
# GPT-2's split regex a whitespace run before a non-space pre-tokenises as the run less its last
# character (``\s+(?!\S)``) then that character (alone, or with the word after it when a space), and
# a run at the end of an input as one pre-token: both sides of such a cut give the whole text's
# pre-tokens.
CUT_BYTES = re.compile(rb"[ \n][!-~]")
CUT_TEXT = re.compile(r"[ \n][!-~]")
FORCE = 4  # a text file with no cut in FORCE blocks is cut there (at a character boundary)


def last_cut(buf, lo: int = 1) -> int:
    """The last position >= max(lo, 1) where a piece of ``buf`` (bytes or str) may start (-1: none)."""
    rx = CUT_BYTES if isinstance(buf, bytes) else CUT_TEXT
    lo, end, window = max(lo, 1), len(buf), 1 << 12
    while end > lo:
        start = max(lo, end - window)
        found = -1
        for m in rx.finditer(buf, start, min(len(buf), end + 1)):
            found = m.start()
        if found >= 0:
            return found
        end, window = start, window * 4
    return -1


def next_cut(text: str, lo: int) -> int:
    """The first position >= lo where a piece of ``text`` may start (-1: none)."""
    m = CUT_TEXT.search(text, max(lo, 1))
    return -1 if m is None else m.start()


def read_text(path: Path, start: int, block: int):
    """A text file in blocks of about ``block`` bytes, each cut at its last ``last_cut``: (byte offset
    after, bytes, last block?, bytes read, (path, first line of the block)); the bytes before
    ``start`` skipped. At most ``FORCE`` blocks without a cut are cut at a UTF-8 character boundary
    (the one place where ids may differ from the whole file's)."""
    with open(path, "rb") as fh:
        line = 1
        if start:  # the line number where a resumed read starts
            for lo in range(0, start, block):
                line += fh.read(min(block, start - lo)).count(b"\n")
        fh.seek(start)
        pos, buf = start, b""
        while True:
            more = fh.read(block)
            if not more:
                yield pos + len(buf), buf, True, pos + len(buf), (path, line)
                return
            buf += more
            if len(buf) < block:
                continue
            cut = last_cut(buf)
            if cut < 0:
                if len(buf) < FORCE * block:
                    continue
                cut = len(buf) - 1
                while cut > 0 and 0x80 <= buf[cut] < 0xC0:  # not inside a UTF-8 character
                    cut -= 1
                cut = cut or len(buf)
            pos += cut
            piece, buf = buf[:cut], buf[cut:]
            yield pos, piece, False, pos, (path, line)
            line += piece.count(b"\n")


def _doc(obj, key: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise GrowError(f"{where}: not a JSON object")
    if key not in obj:
        raise GrowError(f"{where}: no {key!r} key (--text-key names the text field)")
    v = obj[key]
    if not isinstance(v, str):
        raise GrowError(f"{where}: {key!r} is not a string ({type(v).__name__})")
    bad = SURROGATE.search(v)
    if bad:
        raise GrowError(f"{where}: {key!r} holds a lone surrogate \\u{ord(bad.group()):04x}, not text")
    return v


def read_jsonl(path: Path, start: int, key: str):
    """(line number after, text, True) per record; lines before ``start`` skipped (``Stale`` when the
    file has fewer). A line is read up to ``max_line()`` bytes: a longer one is refused, so neither a
    long line nor a gzip file inflating to one is ever held whole."""
    gz, limit = path.name.lower().endswith(".gz"), max_line()
    try:
        with open(path, "rb") as raw, gzip.open(raw, "rb") if gz else raw as fh:
            done, n = 0, 0
            while line := fh.readline(limit + 1):
                n += 1
                done = raw.tell() if gz else done + len(line)
                if len(line) > limit and not line.endswith(b"\n"):
                    raise GrowError(
                        f"{path}: line {n}: longer than {limit:,} bytes (a record is read whole; "
                        "GROWTOOL_MAX_LINE raises the bound)"
                    )
                if n <= start or not line.strip():
                    continue
                yield n, _doc(_json(line, f"{path}: line {n}"), key, f"{path}: line {n}"), True, done, (path, n)
            if n < start:
                raise Stale(f"{path}: {n} lines, the record says {start}")
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise GrowError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None


def _json(line: bytes, where: str):
    try:
        return json.loads(line)
    except UnicodeDecodeError as e:
        raise GrowError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:
        raise GrowError(f"{where}: not JSON ({str(e).split(':')[0]})") from None
    except RecursionError:
        raise GrowError(f"{where}: nested too deeply to be a record") from None


def parquet_file(path: Path, key: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own types
        raise GrowError(f"{path}: not a Parquet file ({str(e).splitlines()[0]})") from None
    schema = pf.schema_arrow
    if key not in schema.names:
        raise GrowError(f"{path}: no column {key!r} (columns: {', '.join(schema.names)}; --text-key names it)")
    t = schema.field(key).type
    if pa.types.is_dictionary(t):  # a dictionary-encoded column (pandas' categorical): its values count
        t = t.value_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise GrowError(f"{path}: column {key!r} is {t}, not text")
    return pf


def read_parquet(path: Path, start: int, key: str):
    """(row after, text, True) per row."""
    pf = parquet_file(path, key)
    row, rows, size = 0, max(1, pf.metadata.num_rows), path.stat().st_size
    for batch in _batches(pf, path, key):
        vals = batch.column(0).to_pylist()
        if row + len(vals) <= start:
            row += len(vals)
            continue
        for v in vals:
            row += 1
            if row <= start:
                continue
            if v is None:
                raise GrowError(f"{path}: row {row}: {key!r} is null")
            yield row, v, True, size * row // rows, (path, row)


def _batches(pf, path: Path, key: str):
    """``pf``'s batches of column ``key``; a file damaged past its footer is one GrowError line."""
    import pyarrow as pa

    batches = pf.iter_batches(batch_size=4096, columns=[key])
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise GrowError(f"{path}: cannot read its rows ({' '.join(str(e).split())[:120]})") from None
        yield batch


def token_file(path: Path, kind: str, dtype) -> np.ndarray:
    """A .bin / .npy file as a read-only memory map (checked: size, shape, integer dtype)."""
    if kind == "npy":
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as e:  # numpy raises ValueError and others
            raise GrowError(f"{path}: not a .npy token array ({str(e).splitlines()[0]})") from None
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise GrowError(f"{path}: a .npy token file holds a 1-D integer array, not {a.dtype} {a.shape}")
        return a
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise GrowError(
            f"{path}: {size:,} bytes is not a whole number of {dtype.name} ids (--data-dtype to choose the dtype)"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def scan_ids(path: Path, arr: np.ndarray, vocab: int | None, scan: int = 1 << 22) -> int:
    """The largest id of a token file, read in chunks (plain reads: the scan does not stay in this
    process's memory); GrowError at the first id outside 0 .. vocab - 1."""
    top, dtype, n = -1, arr.dtype, len(arr)
    head = _data_offset(path, arr)
    with open(path, "rb") as fh:
        fh.seek(head)
        for lo in range(0, n, scan):
            chunk = np.fromfile(fh, dtype=dtype, count=min(scan, n - lo))
            bad = np.flatnonzero((chunk < 0) | (chunk >= vocab)) if vocab is not None else []
            if len(bad):
                i = int(bad[0])
                raise GrowError(
                    f"{path}: token {int(chunk[i])} at position {lo + i:,} does not fit the vocabulary of {vocab:,}"
                )
            if len(chunk):
                top = max(top, int(chunk.max()))
    return top


def _data_offset(path: Path, arr: np.ndarray) -> int:
    if isinstance(arr, np.memmap):
        return int(arr.offset)
    return path.stat().st_size - arr.nbytes  # a .npy: the header comes first, then the data


def read_tokens(path: Path, arr: np.ndarray, start: int, vocab: int | None, scan: int = 1 << 22):
    """(position after, ids chunk, False) for a token file, checked against the vocabulary."""
    for lo in range(start, len(arr), scan):
        chunk = np.asarray(arr[lo : lo + scan])
        if vocab is not None:
            bad = np.flatnonzero((chunk < 0) | (chunk >= vocab))
            if len(bad):
                i = int(bad[0])
                raise GrowError(
                    f"{path}: token {int(chunk[i])} at position {lo + i:,} does not fit the vocabulary of {vocab:,}"
                )
        yield lo + len(chunk), chunk, False, (lo + len(chunk)) * arr.dtype.itemsize, (path, lo)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    except OSError as e:
        raise GrowError(f"{path}: cannot read ({e.strerror})") from None
    return h.hexdigest()


def precheck(files: list[Path], tok, text_key: str, bin_dtype) -> None:
    """What can be checked before reading: token files' sizes and dtypes, Parquet columns."""
    for p in files:
        k = kind_of(p)
        if k in TOKEN_KINDS:
            token_file(p, k, bin_dtype)
        elif k == "parquet":
            parquet_file(p, text_key)
