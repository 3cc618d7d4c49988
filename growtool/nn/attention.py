"""Attention's pieces for the one forward pass (``model.py``): rotary embeddings applied (tables in
``rope.py``), the position-dependent query scale, ALiBi's slopes and their order in a grown model, and
causal attention itself (windows, soft-capped scores, grouped-query heads).

Imports nothing else from growtool but ``config``, ``families`` and ``rope``: copied into remote-code
folders with ``model.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .families import arch_of
from .rope import layer_params, tables


def rope_tables(
    cfg: ModelConfig, T: int, device, theta: float | None = None, layer: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of a layer's rotary embedding over the first ``rotary_dim`` dims ([T, rot]),
    with its scaling (``rope.py``: every rope type transformers defines)."""
    return tables(cfg, T, device, theta, layer)


def apply_rope(x, cos, sin):
    """Rotate the first cos.shape[-1] dims of each head (partial rotary keeps the rest)."""
    rot = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # float32 tables, applied in x's dtype (as transformers)
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr.chunk(2, dim=-1)
    xr = xr * cos + torch.cat([-x2, x1], dim=-1) * sin
    return xr if xp.shape[-1] == 0 else torch.cat([xr, xp], dim=-1)


def apply_rope_interleaved(x, cos, sin):
    """``apply_rope`` on pairs of adjacent dims (2i, 2i + 1) with frequency i (GPT-J), from the same
    tables (whose first half holds each frequency once)."""
    rot = cos.shape[-1]
    cos, sin = (t[..., : rot // 2].repeat_interleave(2, -1).to(x.dtype) for t in (cos, sin))
    xr, xp = x[..., :rot], x[..., rot:]
    turned = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    xr = xr * cos + turned * sin
    return xr if xp.shape[-1] == 0 else torch.cat([xr, xp], dim=-1)


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last axis, without a gain, in float32 (Llama 4's q/k norm)."""
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def query_scale(q: torch.Tensor, cfg: ModelConfig, layer: int) -> torch.Tensor:
    """Ministral 3 (Llama 4's attention temperature): the rotated query at position p times
    1 + beta log(1 + floor(p / original_max_position_embeddings)), beta the RoPE parameters'
    ``llama_4_scaling_beta``; unchanged without it. Llama 4 itself (``Features.attn_temperature``,
    attention temperature tuning, arXiv:2501.19399) scales the query of its layers without RoPE by
    1 + attn_scale log(1 + floor((p + 1) / floor_scale))."""
    x = cfg.extra
    if arch_of(cfg).features.attn_temperature and not cfg.has_rope(layer) and x.get("attn_temperature_tuning", True):
        pos = torch.arange(q.shape[-2], device=q.device, dtype=torch.float32)
        scale = 1 + x.get("attn_scale", 0.1) * torch.log1p(torch.floor((pos + 1) / x.get("floor_scale", 8192)))
        return q * scale[:, None].to(q.dtype)
    p = layer_params(cfg, layer) or {}
    if not p.get("llama_4_scaling_beta"):
        return q
    pos = torch.arange(q.shape[-2], device=q.device)
    scale = 1 + p["llama_4_scaling_beta"] * torch.log(1 + torch.floor(pos / p["original_max_position_embeddings"]))
    return q * scale[:, None].to(q.dtype)


def alibi_slopes(n: int) -> torch.Tensor:
    """ALiBi's per-head slopes for ``n`` heads, float32, as transformers computes them (BLOOM's
    ``_get_alibi_slopes``): the powers of 2^(-8/c) for c, the largest power of two <= n, then the odd
    powers of 2^(-4/c) for the n - c others."""
    c = 2 ** math.floor(math.log2(n))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(c) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + c, dtype=torch.int32))
    if c != n:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * c) - 3))), dtype=torch.float32)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * min(c, n - c), 2, dtype=torch.int32))])
    return slopes


def alibi_order(n_old: int, n_new: int) -> list[int]:
    """Where each head of a model grown from ``n_old`` to ``n_new`` >= ``n_old`` ALiBi heads sits in
    the plain (folded) model: old head i at the position whose slope (of ``n_new``) equals its slope
    (of ``n_old``), the new heads at the other positions in order. A growth keeps old heads first
    (units above ``base_heads`` are gated); fold puts each at its position.

    There always is one: with c the largest power of two <= n, the slopes of n heads are 2^-x for
    the first n of x = 8/c, 16/c, .., 8 (c of them) then 4/c, 12/c, .. (odd multiples of 4/c), so
    n + 1 heads add one slope (or, at n + 1 = 2c, halve the step: the old x are all still there).
    Slopes are matched in float64; transformers' float32 powers round them (1e-6 relative at 128
    heads), which the grown model then has."""

    def exact(n):  # the slopes of alibi_slopes, in float64
        c = 2 ** math.floor(math.log2(n))
        return [2.0 ** (-8.0 * p / c) for p in range(1, c + 1)] + [
            2.0 ** (-4.0 * p / c) for p in range(1, 2 * (n - c), 2)
        ]

    new, order = exact(n_new), []
    for s in exact(n_old):
        order.append(next(p for p, t in enumerate(new) if p not in order and abs(t - s) <= 1e-12 * s))
    return order + [p for p in range(n_new) if p not in order]


def head_slopes(cfg: ModelConfig) -> torch.Tensor:
    """The ALiBi slope of each head of ``cfg``: a grown, unfolded model's heads are in growth order
    (``alibi_order``), each with the slope of the position fold gives it."""
    s = alibi_slopes(cfg.heads)
    return s[alibi_order(cfg.base_heads, cfg.heads)] if cfg.base_heads < cfg.heads else s


def explicit(q, k, v, keep, scale: float, softcap: float | None = None, sinks=None) -> torch.Tensor:
    """Attention computed step by step, softmax in float32: scores q k^T x scale, soft-capped to
    cap tanh(s / cap) where ``softcap`` is given (Gemma 2), masked where ``keep`` is False. With
    ``sinks`` ([H], GPT-OSS), head h's softmax runs over its scores and one more logit, sinks[h],
    whose probability is then dropped: the weights of the real keys sum to
    Z / (Z + exp(sinks[h])) < 1, so a head can attend to nothing (attention sinks, Xiao et al. 2023,
    arXiv:2309.17453; learned per head in OpenAI's gpt-oss, 2025)."""
    H, K = q.shape[1], k.shape[1]
    if K != H:
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
    a = (q @ k.transpose(-2, -1)) * scale
    if softcap:
        a = torch.tanh(a / softcap) * softcap
    a = a.masked_fill(~keep, float("-inf"))
    soft = torch.promote_types(q.dtype, torch.float32)  # float32, float64 kept (verify's reference)
    if sinks is None:
        return a.softmax(-1, dtype=soft).to(q.dtype) @ v
    sink = sinks.to(a.dtype).view(1, H, 1, 1).expand(*a.shape[:-1], 1)
    return torch.cat([a, sink], dim=-1).softmax(-1, dtype=soft)[..., :-1].to(q.dtype) @ v


def chunk_size(cfg: ModelConfig, layer: int) -> int | None:
    """Llama 4's chunked attention: a "chunked_attention" layer's query at position p attends to the
    keys of its own chunk of ``attention_chunk_size`` positions (p // c), causally; None elsewhere."""
    chunked = cfg.layer_types is not None and cfg.layer_types[layer] == "chunked_attention"
    return cfg.extra.get("attention_chunk_size") if chunked else None


SDPA_GQA = torch.__version__ >= (2, 5)  # sdpa takes enable_gqa (grouped-query attention) from torch 2.5


def attend(q, k, v, cfg: ModelConfig, layer: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention (sliding where the layer has a window), with the config's scale,
    optional soft-capped scores and optional attention sinks (``explicit``); grouped-query heads
    read their KV group."""
    T, H, K = q.shape[2], q.shape[1], k.shape[1]
    scale = cfg.query_pre_attn_scalar**-0.5 if cfg.query_pre_attn_scalar else None
    if cfg.attention_multiplier is not None:  # Granite: the score scale itself
        scale = cfg.attention_multiplier
    if cfg.multipliers and "key" in cfg.multipliers:  # Falcon-H1: keys x a scalar, i.e. the scores
        scale = (q.shape[-1] ** -0.5 if scale is None else scale) * cfg.multipliers["key"]
    window = cfg.window(layer)
    i = torch.arange(T, device=q.device)
    mask = (
        (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window) if window is not None and T > window else None
    )
    chunk = chunk_size(cfg, layer)
    if chunk is not None and T > chunk:
        mask = (i[None, :] <= i[:, None]) & (i[:, None] // chunk == i[None, :] // chunk)
    if cfg.attn_softcap or sinks is not None:  # sdpa can neither cap scores nor take a sink
        keep = mask if mask is not None else (i[None, :] <= i[:, None])
        return explicit(q, k, v, keep, scale if scale is not None else q.shape[-1] ** -0.5, cfg.attn_softcap, sinks)
    if arch_of(cfg).features.positions == "alibi":  # scores + slope_h x key position (BLOOM), in a float mask
        bias = head_slopes(cfg).to(q.device).view(1, H, 1, 1) * i.to(torch.float32)
        keep = mask if mask is not None else (i[None, :] <= i[:, None])
        mask = bias.to(q.dtype).masked_fill(~keep, float("-inf"))
    kw = {"is_causal": True} if mask is None else {"attn_mask": mask}
    if scale is not None:
        kw["scale"] = scale
    if K != H and SDPA_GQA:  # query head h reads KV head h // (H / K), without copying K and V
        kw["enable_gqa"] = True
    elif K != H:
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
    return F.scaled_dot_product_attention(q, k, v, **kw)
