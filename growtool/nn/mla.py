"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, section 2.1) for
the one forward pass (``model.py``): DeepSeek-V2 and V3.

From the normed residual x, per block:

* queries: c_q = RMSNorm(x W_qa) (the query latent, rank ``q_lora_rank``), q = c_q W_qb; or q = x W_q
  where ``q_lora_rank`` is None. Each head's q is [q_nope | q_rope] (``qk_nope_head_dim`` + ``head_dim``);
* keys and values: x W_kva = [c_kv | k_rope]: the latent c_kv (rank ``kv_lora_rank``) and one RoPE key
  of ``head_dim`` dims shared by every head; RMSNorm(c_kv) W_kvb gives each head [k_nope | v]
  (``qk_nope_head_dim`` + ``v_head_dim``), and its key is [k_nope | k_rope];
* RoPE turns q_rope and k_rope only: adjacent pairs (DeepSeek-V2's complex form, V3 unless its
  ``rope_interleave`` is false) or halves. V3 lays the turned pairs out as [evens | odds], the same
  permutation of q's and k's dims, so their dot products are those of pairs left in place;
* softmax(q k^T / sqrt(qk_nope_head_dim + head_dim) x m^2) v, with m = 0.1 mscale_all_dim ln(factor) + 1
  where the RoPE is scaled (YaRN) and names ``mscale_all_dim`` (1 otherwise); the heads' values,
  ``heads`` x ``v_head_dim``, through o_proj.

The latent norms have transformers' eps 1e-6 (a constant of the class, not a config key). Width
growth rotates the readers of the residual (q_a_proj or q_proj, kv_a_proj_with_mqa) and the writer
(o_proj) and keeps the latents (their ranks, norms and biases); new heads are new rows of q_b_proj
(or q_proj) and kv_b_proj and new columns of o_proj, behind the growth gate.

Imports nothing else from growtool but ``attention`` and ``rope``: copied into remote-code folders
with ``model.py``.
"""

from __future__ import annotations

import math

import torch

from .attention import apply_rope, apply_rope_interleaved, attend
from .rope import layer_params

LATENT_EPS = 1e-6  # DeepSeek's q_a_layernorm / kv_a_layernorm: RMSNorm(n) at its default eps


def modules(cfg, lin, norm) -> dict:
    """The attention's modules by slot, from ``lin(n_in, n_out, bias)`` and ``norm(n, eps)`` factories."""
    d, H, rot, nope = cfg.width, cfg.heads, cfg.head_dim, cfg.qk_nope_head_dim
    m = {}
    if cfg.q_lora_rank:
        m.update(q_a=lin(d, cfg.q_lora_rank, cfg.qkv_bias), q_a_norm=norm(cfg.q_lora_rank, LATENT_EPS))
        m["q_b"] = lin(cfg.q_lora_rank, H * (nope + rot), False)
    else:
        m["q"] = lin(d, H * (nope + rot), False)
    m.update(kv_a=lin(d, cfg.kv_lora_rank + rot, cfg.qkv_bias), kv_a_norm=norm(cfg.kv_lora_rank, LATENT_EPS))
    m["kv_b"] = lin(cfg.kv_lora_rank, H * (nope + cfg.v_head_dim), False)
    m["o"] = lin(H * cfg.v_head_dim, d, cfg.o_bias)
    return m


def interleaved(cfg) -> bool:
    """RoPE on adjacent pairs: the family's rule, unless its config key says false (DeepSeek-V3)."""
    f = cfg.arch.features
    return f.rope_interleaved and (not f.rope_interleave_key or bool(cfg.extra.get(f.rope_interleave_key, True)))


def softmax_gain(cfg, layer: int) -> float:
    """m^2 on the scores (module docstring), 1 without a scaled RoPE naming mscale_all_dim."""
    p = layer_params(cfg, layer) or {}
    m_all, factor = p.get("mscale_all_dim"), p.get("factor") or 1.0
    if not m_all or factor <= 1:
        return 1.0
    m = 0.1 * m_all * math.log(factor) + 1.0
    return m * m


def attention(cfg, s: dict, x: torch.Tensor, rope, layer: int, gate: torch.Tensor) -> torch.Tensor:
    """MLA of the block's modules ``s`` (by slot) on the normed residual ``x`` [B, T, width]: the output
    projection's result [B, T, width]. ``rope``: the layer's (cos, sin) tables, or None. Heads from
    ``base_heads`` on (added by a gated growth) have their values multiplied by ``gate``."""
    B, T, _ = x.shape
    H, rot, nope, vd = cfg.heads, cfg.head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
    q = s["q_b"](s["q_a_norm"](s["q_a"](x))) if cfg.q_lora_rank else s["q"](x)
    q_nope, q_rot = q.view(B, T, H, nope + rot).transpose(1, 2).split([nope, rot], dim=-1)
    latent, k_rot = s["kv_a"](x).split([cfg.kv_lora_rank, rot], dim=-1)
    kv = s["kv_b"](s["kv_a_norm"](latent)).view(B, T, H, nope + vd).transpose(1, 2)
    k_nope, v = kv.split([nope, vd], dim=-1)
    k_rot = k_rot.view(B, 1, T, rot)
    if rope is not None:
        turn = apply_rope_interleaved if interleaved(cfg) else apply_rope
        q_rot, k_rot = turn(q_rot, *rope), turn(k_rot, *rope)
    q = torch.cat([q_nope, q_rot], dim=-1)
    gain = softmax_gain(cfg, layer)
    if gain != 1.0:  # the scores x m^2: the default scale 1/sqrt(qk head dim) on m^2 q
        q = q * gain
    k = torch.cat([k_nope, k_rot.expand(B, H, T, rot)], dim=-1)
    y = attend(q, k, v, cfg, layer)  # [B, H, T, v_head_dim]
    if cfg.base_heads < H:
        mult = torch.ones(H, dtype=y.dtype, device=y.device)
        mult[cfg.base_heads :] = gate.to(y.dtype).reshape(())
        y = y * mult.view(1, H, 1, 1)
    return s["o"](y.transpose(1, 2).reshape(B, T, H * vd))
