"""Loading a sharded training state (``last-<step>.dcp``) without running anything it contains.

torch.distributed.checkpoint's own reader unpickles ``.metadata`` with a plain ``pickle.load`` and
its default planner ``torch.load(weights_only=False)``s every non-tensor item: a crafted run folder
would run its payload on ``train --resume``. Here:

* the folder's name must be ``last-<step>.dcp`` (no separator, no ``..``), a folder of the run
  folder itself (not a link out of it);
* ``.metadata`` must be a regular file of at most ``MAX_METADATA`` bytes whose sha256, when
  ``last.pt`` records one (every state growtool writes does), is the recorded one;
* it is unpickled by ``Restricted``, which builds only DCP's own metadata classes, torch sizes,
  dtypes and layouts (any other global is refused before it is looked up, so nothing runs);
* every storage entry names a data file ``__<rank>_<n>.distcp`` of that folder, with no transforms;
* non-tensor items (optimizer hyper-parameters) load with ``weights_only=True`` (``SafePlanner``);
  tensors already do in DCP's reader;
* anything the loader raises, ``CheckpointException`` (a ``BaseException``) included, becomes one
  ``GrowError`` line.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
from pathlib import Path

import torch

from growtool.nn.errors import GrowError

NAME = re.compile(r"last-\d+\.dcp")
DATA_FILE = re.compile(r"__\d+_\d+\.distcp")
MAX_METADATA = 256 << 20
DCP = "torch.distributed.checkpoint."
ALLOWED = {
    (DCP + "metadata", n)
    for n in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    (DCP + "filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class Restricted(pickle.Unpickler):
    """An unpickler that can build DCP metadata and nothing else: every global it meets must be in
    ``ALLOWED`` (or be a torch dtype); anything else is refused before it is imported or called."""

    def find_class(self, module, name):
        if (module, name) in ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused persistent id")


def metadata_sha256(folder: Path) -> str:
    return hashlib.sha256((folder / ".metadata").read_bytes()).hexdigest()


def state_folder(out: Path, name) -> Path:
    """The sharded state folder ``last.pt`` names, confined to the run folder ``out``."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise GrowError(f"{out}: last.pt names a sharded state {str(name)[:80]!r}, not last-<step>.dcp of the run")
    folder = out / name
    if folder.is_symlink() or not folder.is_dir():
        raise GrowError(f"{folder}: sharded training state is missing or not a folder of the run")
    return folder


def read_metadata(folder: Path, want_sha256: str | None):
    """The checked ``Metadata`` of a sharded state folder (see the module docstring)."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    path = folder / ".metadata"
    if path.is_symlink() or not path.is_file():
        raise GrowError(f"{folder}: sharded training state is missing or incomplete (no .metadata)")
    if path.stat().st_size > MAX_METADATA:
        raise GrowError(f"{path}: {path.stat().st_size:,} bytes, more than a training state's metadata")
    data = path.read_bytes()
    if want_sha256 is not None and hashlib.sha256(data).hexdigest() != want_sha256:
        raise GrowError(f"{path}: changed since last.pt was written (sha256 differs); cannot resume from it")
    try:
        md = Restricted(io.BytesIO(data)).load()
    except Exception as e:  # refused globals, truncated or garbage bytes
        raise GrowError(f"{path}: not a growtool sharded state ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        raise GrowError(f"{path}: not a growtool sharded state (no DCP metadata)")
    for info in md.storage_data.values():
        rel, off, n = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
        if not (isinstance(rel, str) and DATA_FILE.fullmatch(rel)):
            raise GrowError(f"{path}: names a data file {str(rel)[:80]!r} outside the state folder")
        if not (isinstance(off, int) and isinstance(n, int) and off >= 0 and n >= 0):
            raise GrowError(f"{path}: bad offsets for {rel}")
        if getattr(info, "transform_descriptors", None):
            raise GrowError(f"{path}: uses storage transforms, which growtool does not write")
    for rel in sorted({info.relative_path for info in md.storage_data.values()}):
        data_file(folder / rel)
    if getattr(md, "storage_meta", None) is None:
        md.storage_meta = StorageMeta()
    return md


def data_file(path: Path) -> None:
    """GrowError unless ``path`` is a regular file of the state folder: not a link (to a file outside
    the run folder), not a FIFO (a read that never ends) nor anything else."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        raise GrowError(f"{path}: a data file of the sharded state is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise GrowError(f"{path}: not a regular file of the sharded state (a link or special file; refused)")


def load(state: dict, folder: Path, want_sha256: str | None, no_dist: bool) -> None:
    """``dcp.load(state, ...)`` from ``folder`` through the checked metadata; one GrowError line on failure."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException

    md = read_metadata(folder, want_sha256)

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            md.storage_meta.load_id = self.load_id
            return md

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            try:
                obj = torch.load(value, weights_only=True)
            except Exception as e:
                raise GrowError(f"refused item {read_item.dest_index.fqn}: {str(e).splitlines()[0][:100]}") from None
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element  # as DefaultLoadPlanner does

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    try:
        dcp.load(state, storage_reader=Reader(folder), planner=SafePlanner(), no_dist=no_dist)
    except (Exception, CheckpointException) as e:
        signal = _interrupt(e)
        if signal is not None:  # SIGINT / SIGTERM arrived while loading: an interrupt, not bad input
            raise signal from None
        raise GrowError(f"{folder}: cannot load the sharded training state ({_first_line(e)})") from None


def _interrupt(e: BaseException) -> BaseException | None:
    """The interrupt (``console.Interrupted``, ``KeyboardInterrupt``) that DCP wrapped into its
    ``CheckpointException`` (it collects every failure of a step, BaseExceptions included), if any."""
    from growtool.console import Interrupted

    failures = getattr(e, "failures", None)
    for inner in (failures or {}).values() if isinstance(failures, dict) else ():
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, (Interrupted, KeyboardInterrupt)):
            return inner
    return None


def _first_line(e: BaseException) -> str:
    """The message of the first underlying error (a CheckpointException's text holds tracebacks)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        e = inner[0] if isinstance(inner, tuple) else inner
    return (" ".join(str(e).split()) or type(e).__name__)[:200]
