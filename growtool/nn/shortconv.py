"""LFM2's gated short convolution, the token mixer of its "conv" layers (Liquid AI, LFM2, 2025; the
gated short convolution of Hyena, Poli et al. 2023, arXiv:2302.10866, with a kernel of a few tokens).

For the normed block input x [B, T, d]: [b | c | h] = x W_in (each d wide, one of each per channel),
u = b * h, y_t = sum_{j < L} w_j u_{t - j} per channel (a depthwise causal convolution of L taps, u
before the first token 0), then out = (c * y) W_out. Every channel is independent of the others until
W_out, so a channel is a unit like an FFN neuron: width growth adds channels (the config ties their
count to hidden_size) whose outputs pass the growth gate, and the old ones compute what they did.

Like ``model.py`` this imports nothing else from growtool (it is copied into remote-code folders).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def shortconv_modules(cfg, lin) -> dict[str, nn.Module]:
    """The mixer's modules by slot (``lin(n_in, n_out, bias)`` makes the family's linear layer)."""
    d, bias = cfg.width, bool(cfg.extra.get("conv_bias"))
    kernel = int(cfg.extra.get("conv_L_cache", 3))
    conv = nn.Conv1d(d, d, kernel, groups=d, bias=bias)  # weight [d, 1, L]: one kernel per channel
    return {"m_in": lin(d, 3 * d, bias), "m_conv": conv, "m_out": lin(d, d, bias)}


def shortconv_forward(s: dict, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mixer's output for the normed input ``x`` [B, T, d]; ``mask`` [d] (or None) multiplies each
    channel before the output projection (grown channels: the growth gate)."""
    T = x.shape[1]
    b, c, h = s["m_in"](x).chunk(3, dim=-1)
    conv = s["m_conv"]
    u = (b * h).transpose(1, 2)  # [B, d, T]
    y = F.conv1d(u, conv.weight, conv.bias, padding=conv.weight.shape[-1] - 1, groups=u.shape[1])[..., :T]
    y = c * y.transpose(1, 2)
    return s["m_out"](y if mask is None else y * mask)
