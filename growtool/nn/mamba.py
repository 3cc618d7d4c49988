"""The Mamba mixers: Mamba-2 (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060), in plain torch.

A block of kind "mamba" runs norm -> mixer -> residual add (``model.py``). The mixer, for an input
u [B, T, width] (the normed residual):

  [z | xBC | dt] = in_proj(u)                     z, x: inner = heads x head_dim channels
  xBC = silu(causal depthwise conv1d(xBC))       kernel ``conv``, over time, per channel
  [x | B | C] = xBC                               B, C: groups x state (head h reads group h // (heads / groups))
  dt = clamp(softplus(dt + dt_bias), dt_limit)    one step size per head and token
  A = -exp(A_log)                                 one decay per head
  h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T      the selective scan, state [state, head_dim] per head
  y_t = C_t^T h_t + D x_t
  out = out_proj(gated_rmsnorm(y, z))             RMSNorm of y * silu(z) over groups of inner / groups
                                                  channels, times the gain

The scan is computed in its quadratic (attention-like) form, y = (L o C B^T) (dt x) + D x with
L[t, s] = exp(sum_{r = s+1..t} dt_r A) for s <= t: exact, and fine at the lengths growtool trains.

Width growth reads the residual only through in_proj (a reader) and writes it only through out_proj
(a writer): the inner dimensions are kept, the same rotation argument as for attention.

Imports nothing else from growtool but ``config`` and ``families`` (copied into remote-code folders).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .families import ssm_dims


class GatedRMSNorm(nn.Module):
    """RMSNorm of y * silu(z) (of y without z) over ``groups`` contiguous groups of channels, in float32, times
    ``weight``."""

    def __init__(self, n: int, groups: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.groups, self.eps = groups, eps

    def forward(self, y, z=None):
        f = torch.promote_types(y.dtype, torch.float32)
        h = y.to(f) if z is None else y.to(f) * F.silu(z.to(f))
        g = h.view(*h.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view(h.shape).to(y.dtype)


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[t, s] = a[s+1] + .. + a[t] for s <= t, -inf above the diagonal
    (summed from masked copies, not as a difference of cumulative sums, which loses precision)."""
    T = a.shape[-1]
    x = a[..., None, :].expand(*a.shape[:-1], T, T)  # x[t, s] = a[s]
    strict = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    x = x.transpose(-1, -2).masked_fill(~strict, 0).cumsum(-2)  # [t, s] = a[s+1] + .. + a[t]
    return x.masked_fill(~torch.tril(torch.ones_like(strict)), float("-inf"))


def ssd_scan(x, dt, A, B, C):
    """y [B, T, H, P] of the selective scan for x [B, T, H, P], dt [B, T, H], A [H], B and C
    [B, T, H, N] (already per head), in x's dtype (float32 or wider)."""
    decay = torch.exp(segment_sums((dt * A).transpose(1, 2)))  # [B, H, T, S]
    scores = torch.einsum("bthn,bshn->bhts", C, B) * decay
    return torch.einsum("bhts,bshp->bthp", scores, x * dt[..., None])


class Mamba2Mixer(nn.Module):
    """The mixer's tensors at their Hugging Face names (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.ssm
        inner, conv, proj = ssm_dims(cfg)
        self.sizes = (inner, conv, m["heads"], m["head_dim"], m["groups"], m["state"])
        self.dt_limit = tuple(m["dt_limit"])
        self.in_proj = nn.Linear(cfg.width, proj, bias=m["bias"])
        self.conv1d = nn.Conv1d(conv, conv, m["conv"], groups=conv, padding=m["conv"] - 1, bias=m["conv_bias"])
        self.dt_bias = nn.Parameter(torch.zeros(m["heads"]))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, m["heads"] + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(m["heads"]))
        self.gating = m.get("norm", "gated")  # Falcon-H1: "before_gate" norm(y) silu(z), or "none": y silu(z)
        if self.gating != "none":
            self.norm = GatedRMSNorm(inner, m["groups"], cfg.norm_eps)
        self.out_proj = nn.Linear(inner, cfg.width, bias=m.get("out_bias", m["bias"]))
        mult = cfg.multipliers or {}  # Falcon-H1's muP scalars: on the input, and per segment of in_proj's output
        self.in_mult = mult.get("ssm_in")
        self.mup = mult.get("mup")  # [z, x, B, C, dt] multipliers (made per call: no buffer to place)

    def forward(self, u):
        inner, conv, H, P, G, N = self.sizes
        Bsz, T, _ = u.shape
        zxbcdt = self.in_proj(u if self.in_mult is None else u * self.in_mult)
        if self.mup is not None:
            sizes = torch.tensor([inner, inner, G * N, G * N, H], device=u.device)
            zxbcdt = zxbcdt * torch.tensor(self.mup, dtype=zxbcdt.dtype, device=u.device).repeat_interleave(sizes)
        z, xbc, dt = zxbcdt.split([inner, conv, H], dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))
        x, b, c = xbc.split([inner, G * N, G * N], dim=-1)
        f = torch.promote_types(u.dtype, torch.float32)  # the scan in float32 (float64 kept: verify's reference)
        dt = F.softplus(dt.to(f) + self.dt_bias.to(f)).clamp(*self.dt_limit)
        A = -torch.exp(self.A_log.to(f))
        b, c = (t.to(f).view(Bsz, T, G, N).repeat_interleave(H // G, dim=2) for t in (b, c))
        x = x.to(f).view(Bsz, T, H, P)
        y = (ssd_scan(x, dt, A, b, c) + self.D.to(f)[:, None] * x).reshape(Bsz, T, inner)
        if self.gating == "gated":
            y = self.norm(y, z)
        elif self.gating == "before_gate":
            y = self.norm(y) * F.silu(z.to(f))
        else:
            y = y * F.silu(z.to(f))
        return self.out_proj(y.to(u.dtype))


class Mamba1Mixer(nn.Module):
    """The Mamba (1) mixer (Gu & Dao 2023, arXiv:2312.00752) at its Hugging Face names: [x | z] = in_proj(u),
    x = silu(causal depthwise conv1d(x)), [dt_low | B | C] = x_proj(x), dt = softplus(dt_proj(dt_low)) per
    channel, A = -exp(A_log) [channels, state] per channel, h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,
    y_t = C_t h_t + D x_t, out = out_proj(y * silu(z)) (no inner norm). A sequential scan over time."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.ssm
        inner, n = m["heads"] * m["head_dim"], m["state"]
        self.sizes = (inner, m["dt_rank"], n)
        self.in_proj = nn.Linear(cfg.width, 2 * inner, bias=m["bias"])
        self.conv1d = nn.Conv1d(inner, inner, m["conv"], groups=inner, padding=m["conv"] - 1, bias=m["conv_bias"])
        self.x_proj = nn.Linear(inner, m["dt_rank"] + 2 * n, bias=False)
        self.dt_proj = nn.Linear(m["dt_rank"], inner, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, cfg.width, bias=m["bias"])

    def forward(self, u):
        inner, rank, n = self.sizes
        T = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :T].transpose(1, 2))
        dt, b, c = self.x_proj(x).split([rank, n, n], dim=-1)
        f = torch.promote_types(u.dtype, torch.float32)
        dt = F.softplus(F.linear(dt, self.dt_proj.weight).to(f) + self.dt_proj.bias.to(f))  # [B, T, inner]
        A = -torch.exp(self.A_log.to(f))  # [inner, n]
        xf, b, c = x.to(f), b.to(f), c.to(f)
        h, ys = torch.zeros(u.shape[0], inner, n, dtype=f, device=u.device), []
        for t in range(T):
            h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * xf[:, t])[..., None] * b[:, t, None, :]
            ys.append(torch.einsum("bin,bn->bi", h, c[:, t]))
        y = (torch.stack(ys, dim=1) + xf * self.D.to(f)) * F.silu(z.to(f))
        return self.out_proj(y.to(u.dtype))


__all__ = ["Mamba2Mixer", "Mamba1Mixer", "GatedRMSNorm", "ssd_scan", "segment_sums"]
