"""Width growth of a Mamba-2 mixer whose inner width is tied to the residual width (Mamba-2: inner =
expand x hidden_size, an integer in the config; ``ModelConfig.ssm["expand"]``).

Residual-width growth alone keeps a mixer's inner dimensions (in_proj reads the residual, out_proj
writes it: ``plan.py``'s readers and writers). Where the config ties the inner width to the residual
width, a wider model has wider mixers: each head's channels grow from P to P' = P D / d (heads, groups,
state and the per-head dt_bias, A_log, D are kept). The identity (``GrowChannels``):

* new channel p >= P of head h copies channel p mod P of the same head in the x rows of in_proj and in
  the convolution, and its z row (and bias) is 0: silu(0) = 0, so y * silu(z) is 0 on every new channel;
* the gated RMSNorm runs over groups of heads x channels / groups channels, which grow by P'/P = D/d:
  with zeros on the new channels a group's mean square is d/D times the old one, exactly as the
  residual's, so the eps the two share (``layer_norm_epsilon``) becomes eps d/D for both and the old
  gains take sqrt(d/D) (the new ones, reading 0, copy theirs);
* out_proj's columns for new channels copy their source's: they read 0, whatever they hold.

The grown mixer computes the source's function at every gate value; the new channels' z rows start at 0,
where silu has slope 1/2, so they are trained from the first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from growtool.grow.steps import Keep, Step
from growtool.nn.errors import GrowError
from growtool.nn.families import TensorSpec, arch_of

MIXER_KINDS = ("m_in", "m_inner")  # a Mamba mixer's unit kinds (in_proj outputs, inner channels)


def grown_ssm(src, D: int) -> dict | None:
    """The mixer sizes of ``src`` grown to width ``D``: the same, but where the inner width is expand x
    width (then each head's channels P -> expand D / heads, which must be whole)."""
    m = src.ssm
    if not m or "expand" not in m:
        return m
    inner = m["expand"] * D
    if inner % m["heads"]:
        raise GrowError(
            f"{src.family}: the Mamba mixer's inner width expand x {D} = {inner} is not a multiple of its "
            f"{m['heads']} heads; pick a width whose expand x width the heads divide"
        )
    return {**m, "head_dim": inner // m["heads"]}


def channel_map(H: int, P: int, P2: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(source channel, is new) of each of the H x P2 grown channels (head-major): channel p of head h
    is channel p mod P of head h in the source, new where p >= P."""
    h, p = torch.arange(H).repeat_interleave(P2), torch.arange(P2).repeat(H)
    return h * P + p % P, p >= P


@dataclass(frozen=True)
class GrowChannels(Step):
    """Each mixer head's channels P -> P' along a tensor's channel axis (module docstring). ``part``:
    "in" (in_proj rows [z | x | B C | dt]), "conv" (conv1d rows [x | B C]), "norm" (the gated norm's
    gain, x sqrt(P/P')), "out" (out_proj columns)."""

    part: str
    axis: int

    def _maps(self, c, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(source index of each output entry along the axis, the new entries that start at 0, every new
        channel's entries) for a tensor of ``n`` entries along it."""
        src, new = c.plan.src.ssm, c.plan.cfg.ssm
        H, P, P2 = src["heads"], src["head_dim"], new["head_dim"]
        idx, fresh = channel_map(H, P, P2)
        inner, rest, f = H * P, n - H * P, torch.nonzero(fresh).squeeze(1)
        if self.part == "in" and arch_of(c.plan.src).features.ssm_version == 1:  # [x | z]
            return torch.cat([idx, inner + idx]), H * P2 + f, torch.cat([f, H * P2 + f])
        if self.part == "in":  # [z | x | B C | dt]
            return torch.cat([idx, inner + idx, 2 * inner + torch.arange(rest - inner)]), f, torch.cat([f, H * P2 + f])
        zero = f if self.part == "x_proj" else f[:0]  # x_proj: new channels are read by nothing
        return torch.cat([idx, inner + torch.arange(rest)]), zero, f  # the channels, then (Mamba-2's B, C) kept

    def apply(self, t, c):
        order, zero, _ = self._maps(c, t.shape[self.axis])
        out = t.float().index_select(self.axis, order)
        out.index_fill_(self.axis, zero, 0.0)  # z rows (silu(0) = 0: new channels add nothing) / x_proj columns
        return out * self._scale(c) if self.part == "norm" else out

    def _scale(self, c) -> float:
        return (c.plan.src.ssm["head_dim"] / c.plan.cfg.ssm["head_dim"]) ** 0.5

    def moment(self, t, c, p: int) -> torch.Tensor:
        """The AdamW moments (p = 1: m, 2: v; grow/moments.py): old channels keep theirs (the gated norm's
        gain, scaled by a, takes m / a, v / a^2), every new channel's start at 0."""
        order, _, new = self._maps(c, t.shape[self.axis])
        out = t.float().index_select(self.axis, order).index_fill_(self.axis, new, 0.0)
        return out / self._scale(c) ** p if self.part == "norm" else out

    def describe(self, plan, spec):
        P, P2 = plan.src.ssm["head_dim"], plan.cfg.ssm["head_dim"]
        what = {"in": "new z rows 0, x rows copied", "norm": f"copied, x {(P / P2) ** 0.5:.6g}", "x_proj": "new 0"}
        what["out"] = "copied (they read 0)"
        return f"head channels {P} -> {P2}: " + what.get(self.part, "copied")


def _grows(plan) -> bool:
    return bool(plan.src.ssm) and plan.src.ssm["head_dim"] != plan.cfg.ssm["head_dim"]


def unit_steps(spec: TensorSpec, plan, expand: Step) -> list[Step]:
    """A reader's or writer's unit step: ``expand`` (ExpandUnits), but GrowChannels on a mixer's
    in_proj / out_proj when its channels grow."""
    if not (spec.units and spec.units[0] in MIXER_KINDS and _grows(plan)):
        return [expand]
    return [GrowChannels("in", 0) if spec.units[0] == "m_in" else GrowChannels("out", spec.unit_axis)]


def inner_steps(spec: TensorSpec, plan) -> list[Step]:
    """A mixer's inner tensor: kept, but its channels where they grow: the convolution's, the gated norm's
    (Mamba-2: dt_bias, A_log and D are per head, kept); Mamba (1): x_proj's columns (new ones 0: the new
    channels must not move dt, B and C), and per channel dt_proj, A_log, D (copied)."""
    name = spec.pattern.rsplit(".", 2)
    part = {"conv1d": "conv", "norm": "norm", "x_proj": "x_proj", "dt_proj": "copy"}.get(name[-2], "copy")
    if not _grows(plan) or (part == "copy" and arch_of(plan.src).features.ssm_version == 2):
        return [Keep("a mixer's inner channels")]
    return [GrowChannels(part, 1 if part == "x_proj" else 0)]
