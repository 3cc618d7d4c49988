"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next's "linear_attention" layers (Yang, Kautz and
Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025, arXiv:2412.06464).

For the normed block input x [B, T, d], with n_k key heads and n_v value heads (r = n_v / n_k per key head):

* in_proj_qkvz gives per key head [q (d_k) | k (d_k) | v (r d_v) | z (r d_v)], in_proj_ba per key head
  [b (r) | a (r)] (Qwen3-Next); or (Qwen3.5, ``Features.gdn_split``) in_proj_qkv gives [q | k | v] of all
  heads, in_proj_z, in_proj_b and in_proj_a the rest;
* [q | k | v] (all heads) pass a depthwise causal convolution of a few taps (no bias), then SiLU;
* q and k are L2-normed per head (eps 1e-6 inside the root), q divided by sqrt(d_k); each key head
  serves its r value heads;
* per value head, beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), and the state S [d_k, d_v]
  (0 before the first token) follows the gated delta rule, token by token:
  S <- exp(g) S;  S <- S + beta k (v - S^T k)^T;  o = S^T q;
* o is RMS-normed over d_v (gain ``norm.weight``, eps the config's rms_norm_eps) and multiplied by
  SiLU(z), then out_proj writes it.

The inner sizes are the config's own (``linear_*``), never tied to the width: growth keeps every inner
tensor and grows only the residual side of in_proj_qkvz, in_proj_ba and out_proj. The recurrence runs
sequentially here (exact, and fast enough at the sizes growth checks). Like ``model.py`` this imports
nothing else from growtool (it is copied into remote-code folders).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .families import arch_of, gdn_dims


class GatedDeltaNet(nn.Module):
    """The mixer's tensors at transformers' names (``linear_attn.in_proj_qkvz``, ``conv1d``, ``A_log``, ...)."""

    def __init__(self, cfg, lin):
        super().__init__()
        nk, nv, dk, dv, taps = gdn_dims(cfg)
        self.dims, self.eps, self.split = (nk, nv, dk, dv), cfg.norm_eps, arch_of(cfg).features.gdn_split
        channels = 2 * nk * dk + nv * dv  # [q | k | v] of all heads, each convolved on its own
        if self.split:  # Qwen3.5
            self.in_proj_qkv, self.in_proj_z = lin(cfg.width, channels, False), lin(cfg.width, nv * dv, False)
            self.in_proj_b, self.in_proj_a = lin(cfg.width, nv, False), lin(cfg.width, nv, False)
        else:  # Qwen3-Next
            self.in_proj_qkvz = lin(cfg.width, 2 * nk * dk + 2 * nv * dv, False)
            self.in_proj_ba = lin(cfg.width, 2 * nv, False)
        self.conv1d = nn.Conv1d(channels, channels, taps, groups=channels, bias=False)
        self.dt_bias, self.A_log = nn.Parameter(torch.ones(nv)), nn.Parameter(torch.zeros(nv))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(dv))
        self.out_proj = lin(nv * dv, cfg.width, False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[q | k | v] of all heads [B, T, channels], z [B, T, n_v, d_v], b and a [B, T, n_v]."""
        B, T, _ = x.shape
        nk, nv, dk, dv = self.dims
        if self.split:
            z = self.in_proj_z(x).view(B, T, nv, dv)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        r = nv // nk
        q, k, v, z = self.in_proj_qkvz(x).view(B, T, nk, 2 * dk + 2 * r * dv).split([dk, dk, r * dv, r * dv], -1)
        b, a = self.in_proj_ba(x).view(B, T, nk, 2 * r).split([r, r], -1)
        mixed = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], -1)
        return mixed, z.reshape(B, T, nv, dv), b.reshape(B, T, nv), a.reshape(B, T, nv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        nk, nv, dk, dv = self.dims
        r = nv // nk
        mixed, z, b, a = self._project(x)
        mixed = mixed.transpose(1, 2)
        w = self.conv1d.weight
        mixed = F.silu(F.conv1d(mixed, w, padding=w.shape[-1] - 1, groups=w.shape[0])[..., :T]).transpose(1, 2)
        q, k, v = mixed.split([nk * dk, nk * dk, nv * dv], -1)
        f = torch.promote_types(x.dtype, torch.float32)  # float32 math, float64 kept (verify's reference)
        beta = torch.sigmoid(b).to(f)
        g = -self.A_log.to(f).exp() * F.softplus(a.to(f) + self.dt_bias.to(f))
        heads = (q.reshape(B, T, nk, dk), k.reshape(B, T, nk, dk))
        q, k = (_l2norm(t.repeat_interleave(r, dim=2).to(f)) for t in heads)
        o = delta_rule(q / dk**0.5, k, v.reshape(B, T, nv, dv).to(f), g, beta).to(x.dtype)
        return self.out_proj(self._gated_norm(o, z).reshape(B, T, nv * dv))

    def _gated_norm(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """RMSNorm over d_v (gain w, in float32) times SiLU(z)."""
        f = torch.promote_types(o.dtype, torch.float32)
        h = o.to(f)
        h = self.norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(o.dtype)
        return (h * F.silu(z.to(f))).to(o.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def delta_rule(q, k, v, g, beta) -> torch.Tensor:
    """The gated delta rule over a sequence: q, k [B, T, H, d_k], v [B, T, H, d_v], g, beta [B, T, H];
    the outputs o_t = S_t^T q_t [B, T, H, d_v] (module docstring)."""
    B, T, H, dk = k.shape
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=v.dtype, device=v.device)
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt)) * beta[:, t, :, None]
        S = S + kt[..., None] * delta[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, 1)


def gdn_modules(cfg, lin) -> dict[str, nn.Module]:
    """The mixer's modules by slot: one module at slot ``mixer``."""
    return {"mixer": GatedDeltaNet(cfg, lin)}


def gdn_forward(s: dict, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mixer's output for the normed input ``x`` (no unit is ever gated: ``mask`` is None)."""
    return s["mixer"](x)
