"""Experts fused into tensors that hold all E of them (``families.ExpertLayout``): their parameters for
the one forward pass (``model.py``) and each expert's GLU FFN read from them.

The tensors are described once, by ``families.expert_specs``: their unit and residual axes and, for a
3-D tensor, its expert axis. Growth reads the same specs, so what the forward pass takes for expert e's
neurons is what growth grows. Imports nothing else from growtool but ``families``: copied into
remote-code folders with ``model.py``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .families import arch_of, expert_specs, tensor_shape

SLOTS = ("e_gate_up", "e_gate", "e_up", "e_down")  # the slots a fused layout may use


def specs(cfg) -> dict:
    """Slot -> spec of every fused expert tensor of a block (``families.expert_specs``)."""
    a = arch_of(cfg)
    by_name = {a.block + a.modules[slot]: slot for slot in SLOTS if slot in a.modules}
    return {by_name[sp.pattern]: sp for sp in expert_specs(a, cfg, None)}


def expert_parameters(cfg) -> dict[str, nn.Parameter]:
    """Slot -> a zero parameter of its stored shape, for every fused expert tensor of a block."""
    return {slot: nn.Parameter(torch.zeros(tensor_shape(sp.pattern, sp, cfg))) for slot, sp in specs(cfg).items()}


def matrix(t: torch.Tensor, spec, experts: int, e: int) -> torch.Tensor:
    """Expert e's matrix from a fused tensor, as [units, d]: its slice along the expert axis (3-D) or
    its e-th block of units (stacked 2-D), with the unit axis first."""
    if spec.expert_axis is not None:
        t, ua = t.select(spec.expert_axis, e), spec.unit_axis - (spec.unit_axis > spec.expert_axis)
    else:
        n = t.shape[spec.unit_axis] // experts
        t, ua = t.narrow(spec.unit_axis, e * n, n), spec.unit_axis
    return t if ua == 0 else t.t()


class Fused:
    """A block's fused experts (its parameters at their paths), read through their specs:
    ``ffn(e, x, act, mask)`` is expert e's GLU output on tokens ``x``; grown neurons (``mask``) sit
    behind the growth gate."""

    def __init__(self, cfg, block: nn.Module):
        self.cfg, self.block, self.specs = cfg, block, specs(cfg)
        self.paths, self.layout = arch_of(cfg).modules, arch_of(cfg).features.experts

    def _w(self, slot: str, e: int) -> torch.Tensor:
        return matrix(self.block.get_parameter(self.paths[slot]), self.specs[slot], self.cfg.experts, e)

    def ffn(self, e: int, x: torch.Tensor, act, mask: torch.Tensor | None) -> torch.Tensor:
        if self.layout.glu == "separate":
            gate, up = x @ self._w("e_gate", e).t(), x @ self._w("e_up", e).t()
        else:
            h = x @ self._w("e_gate_up", e).t()
            if self.layout.glu == "halves":
                gate, up = h.chunk(2, dim=-1)
            else:  # interleaved: neuron j's gate at 2j, its up at 2j + 1
                gate, up = h[..., 0::2], h[..., 1::2]
        h = act(gate) * up
        return (h if mask is None else h * mask) @ self._w("e_down", e)
