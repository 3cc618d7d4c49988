"""The safetensors format: the dtype table, the header of a file (parsed and checked: a malformed
file gives one clear line), and the bytes of a header and of a tensor for the writer.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import torch

from growtool.io import confine
from growtool.nn.errors import GrowError

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
ACCEPTED = (
    "growtool reads a .safetensors file, a Hugging Face model folder (config.json + model.safetensors, "
    "or a sharded index), a nanoGPT ckpt.pt, or - (standard input)"
)
Progress = Callable[[str, int], None]  # called with (tensor name, bytes) after each tensor read or written


def parse_header(buf: bytes, size: int, src: str) -> tuple[dict, dict, int]:
    """Check a safetensors header: returns (tensor entries, metadata, data start offset).

    ``buf`` holds at least the first 8 + header bytes; ``size`` is the whole file's size.
    """
    if size < 8:
        raise GrowError(f"{src}: not a safetensors file (only {size} bytes); {ACCEPTED}")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER:  # the first 8 bytes of a text or other file read as a length: no safetensors header
        raise GrowError(f"{src}: not a checkpoint (not a safetensors file); {ACCEPTED}")
    if 8 + n > size:
        raise GrowError(f"{src}: not a safetensors file (header length {n} beyond the file's {size} bytes)")
    try:
        header = json.loads(buf[8 : 8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise GrowError(f"{src}: not a safetensors file (header is not valid JSON)") from None
    except GrowError as e:
        raise GrowError(f"{src}: {e}") from None
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
    _check_tiling(spans, data_len, src)
    return header, meta, 8 + n


def _no_duplicates(pairs):
    """A JSON object's pairs -> dict; a key given twice makes the header ambiguous (refused)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise GrowError(f"the safetensors header names {k!r} twice")
        out[k] = v
    return out


def _check_tiling(spans, data_len: int, src: str) -> None:
    """The tensors fill the data exactly, as the safetensors format requires: no hole between two
    (where other bytes could hide: a polyglot file) and no bytes after the last."""
    end = 0
    for b, e, name in spans:
        if b != end:
            raise GrowError(
                f"{src}: {b - end} unused bytes before tensor {name} (a hole; not a valid safetensors file)"
            )
        end = e
    if end != data_len:
        raise GrowError(f"{src}: {data_len - end} bytes after the last tensor (not a valid safetensors file)")


def read_file_header(path: Path) -> tuple[dict, dict, int]:
    """(tensor entries, metadata, data start offset) of a safetensors file, checked."""
    if path.is_dir():
        raise GrowError(f"{path}: is a folder without config.json, not a safetensors file")
    try:
        size = confine.regular(path, "a safetensors file").st_size  # a FIFO would block, a device not end
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


def _nbytes(shape, dt: torch.dtype) -> int:
    n = dt.itemsize
    for s in shape:
        n *= s
    return n
