"""Outputs hold only finite values: growth can scale values past float16's 65504, and a file holding
Inf is refused by every reader (verify included). Other dtypes have float32's range."""

from __future__ import annotations

import math

import torch

from growtool.nn.errors import GrowError


class Overflow(GrowError):
    """A float16 output would hold Inf (``save`` names the output)."""


def check_finite(name: str, t) -> None:
    """Overflow unless a float16 tensor ``t`` holds finite values only (one pass: aminmax)."""
    if t.dtype == torch.float16 and t.numel() and not all(map(math.isfinite, map(float, torch.aminmax(t)))):
        raise Overflow(
            f"tensor {name}: the grown values exceed float16's range (65504); write --dtype bfloat16 or float32"
        )
