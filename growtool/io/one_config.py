"""One source of truth for a folder's config: its config.json, as transformers reads it.

growtool also writes the config into every safetensors file's metadata (so a lone file, or a stage
read from standard input, describes itself). Where a config.json sits beside the weights, it is the
one used; the metadata's copy must agree with it on every field that changes the computed function
or the tensors' shapes (``ModelConfig``'s fields), else the checkpoint is refused with one line
naming the first field that differs. Other keys (token ids, dtype, ...) come from config.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from growtool.io import confine
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError


def parse(raw, where: str) -> ModelConfig:
    try:
        hf = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise GrowError(f"{where}: model config is not valid JSON") from None
    try:
        return ModelConfig.from_hf(hf)
    except GrowError as e:
        raise GrowError(f"{where}: {e}") from None
    except (AttributeError, OverflowError, TypeError, ValueError, KeyError, IndexError) as e:
        raise GrowError(f"{where}: config has a malformed value ({' '.join(str(e).split())[:120]})") from None


INTS = ("step", "steps", "tokens", "batch", "seq", "width_from", "width_to")  # the fields that are formatted
NUMBERS = ("alpha", "gamma", "embed_gamma", "lr", "val_loss", "gates_folded_at", "eps")
STRINGS = ("op", "source_sha256")


def lineage(meta: dict, src: str) -> list:
    """The growth lineage in the metadata: a list of JSON objects whose known fields have their types."""
    try:
        out = json.loads(meta.get("lineage", "[]"))
    except json.JSONDecodeError:
        raise GrowError(f"{src}: growth lineage in the metadata is not valid JSON") from None
    if not isinstance(out, list) or not all(isinstance(st, dict) for st in out):
        raise GrowError(f"{src}: growth lineage in the metadata is not a list of JSON objects")
    for i, st in enumerate(out):
        for k, v in st.items():
            ok = (
                v is None
                or (k in INTS and isinstance(v, int) and not isinstance(v, bool))
                or (k in NUMBERS and isinstance(v, (int, float)) and not isinstance(v, bool))
                or (k in STRINGS and isinstance(v, str))
                or k not in INTS + NUMBERS + STRINGS
            )
            if not ok:
                raise GrowError(f"{src}: growth lineage entry {i} has a bad {k} ({str(v)[:40]!r})")
    return out


def first_difference(a: ModelConfig, b: ModelConfig) -> tuple[str, object, object] | None:
    for f in dataclasses.fields(ModelConfig):
        if f.name != "extra" and getattr(a, f.name) != getattr(b, f.name):
            return f.name, getattr(a, f.name), getattr(b, f.name)
    return None


def config(meta: dict, folder_cfg: Path | None, src: str) -> ModelConfig:
    """The checkpoint's config: config.json's where there is one (checked against the metadata's)."""
    has_folder = folder_cfg is not None and folder_cfg.exists()
    if not has_folder and "config" not in meta:
        raise GrowError(f"{src}: no model config (neither in the safetensors metadata nor a config.json beside it)")
    if not has_folder:
        return parse(meta["config"], src)
    cfg = parse(confine.read_small(folder_cfg, "config.json"), str(folder_cfg))
    if "config" in meta:
        diff = first_difference(cfg, parse(meta["config"], src))
        if diff is not None:
            name, mine, theirs = diff
            raise GrowError(
                f"{folder_cfg}: says {name} = {str(mine)[:40]}, the weights' metadata {str(theirs)[:40]} "
                f"({src}; transformers reads config.json: make them agree)"
            )
    return cfg


def with_dtype(cfg: ModelConfig, dtype) -> ModelConfig:
    """``cfg`` whose recorded dtype (``dtype`` / ``torch_dtype``, where it has one) names ``dtype``:
    a float32 output of a bfloat16 folder must not say bfloat16 (transformers would load it so)."""
    name = str(dtype).replace("torch.", "")
    stale = {k: name for k in ("dtype", "torch_dtype") if k in cfg.extra and cfg.extra[k] != name}
    return dataclasses.replace(cfg, extra={**cfg.extra, **stale}) if stale else cfg
