"""Folding: bake the growth gates of a grown model away at a fixed value (a plain checkpoint)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from growtool.grow import ops
from growtool.nn.attention import alibi_order
from growtool.nn.config import ModelConfig
from growtool.nn.families import arch_of, expected_shapes, tensor_specs, unit_count

if TYPE_CHECKING:
    from growtool.grow.engine import Workspace


# ---- fold ---------------------------------------------------------------------------------


def fold_config(cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(
        base_heads=cfg.heads,
        base_ffn=cfg.ffn,
        base_shared_ffn=cfg.shared_ffn,
        base_dense_ffn=cfg.dense_ffn,
        base_conv=None,
        new_layers=None,
    )


def _head_order(cfg: ModelConfig, spec) -> tuple | None:
    """ALiBi (BLOOM): (order, block) taking a query tensor's heads from growth order to the
    positions of their slopes; None elsewhere."""
    if arch_of(cfg).features.positions == "alibi" and cfg.base_heads < cfg.heads:
        if spec.units and spec.units[0] in ("q", "qkv", "qgate"):
            return alibi_order(cfg.base_heads, cfg.heads), unit_count(cfg, spec.units[0])[1]
    return None


def _gated_parts(cfg: ModelConfig, spec) -> list[tuple]:
    """(axis, start, length) of a writer's gated units' weights, one per unit segment (a stacked
    writer holds one per expert); empty where none is gated."""
    if spec.role != "writer":
        return []
    parts, off = [], 0
    for kind in spec.units:
        base, (n, block) = cfg.base_units(kind), unit_count(cfg, kind)
        if base != n:
            parts.append((spec.unit_axis, off + base * block, (n - base) * block))
        off += n * block
    return parts


def fold_tensor(
    name: str, cfg: ModelConfig, alpha: float, get, dtype: torch.dtype, work: Workspace | None = None
) -> torch.Tensor:
    """Bake gate ``alpha`` into the writers: gated units' output weights times alpha.

    A gated unit's write is gate * W_col * h; with the gate fixed at alpha, alpha * W_col is the same
    function without a gate, so the folded model is a plain checkpoint.

    With a ``work`` space (``get`` then takes ``into=``, as ``Checkpoint.get``) the result is made in
    one of its output blocks, placed for the writer (hand it back with ``work.recycle`` once
    written): a source whose elements have the output's size is read straight into that block (and
    scaled or converted there through this thread's float32 block); any other source is read into
    this thread's source block. The same bytes, without fresh memory or a copy per tensor.
    """
    if cfg.new_layers:  # blocks added by depth growth: their gate goes into writers or post-norms
        from growtool.grow import depth

        width_only = cfg.replace(new_layers=None)
        t = depth.fold_new_block_tensor(
            name, cfg, alpha, get, dtype, lambda n, dt: fold_tensor(n, width_only, alpha, get, dt)
        )
        if t is not None:
            return t
        cfg = width_only
    spec = tensor_specs(cfg)[name]
    order, parts = _head_order(cfg, spec), _gated_parts(cfg, spec)
    if work is None or order is not None:
        t = get(name)
        if not parts and order is None:
            return t.to(dtype)
        t = t.float().clone()
        for part in parts:
            t.narrow(*part).mul_(alpha)
        if order is not None:
            t = ops.permute_units(t, spec.unit_axis, *order)
        return t.to(dtype)
    key, size = (name, 0), math.prod(expected_shapes(cfg)[name]) * dtype.itemsize
    placed = []  # the output block the source was read into (never a checkpoint's own tensor)

    def into(nbytes: int) -> torch.Tensor:
        if nbytes != size:
            return work.source(nbytes)
        placed.append(work.output((nbytes,), torch.uint8, key))
        return placed[0]

    t = get(name, into=into)
    if not parts and t.dtype == dtype:
        return t  # as read: in the output's block (or a held checkpoint's tensor, as .to returns it)
    f = work.tensor(t.shape).copy_(t)
    for part in parts:
        f.narrow(*part).mul_(alpha)
    out = t.view(dtype) if placed else work.output(t.shape, dtype, key)
    return out.copy_(f)  # as .to: the same conversion
