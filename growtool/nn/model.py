"""The one forward pass of the project, for every architecture in ``families``.

It reads features, never an architecture's name: modules are created at the Hugging Face paths
the architecture lists, so ``model.state_dict()`` *is* the checkpoint, and the forward pass finds
them through slots (``q``, ``o``, ``up``, ``ln1``, ...). Two growtool additions, both off in a
plain HF model:

* gated attention (``attn_gate``): each head's output is multiplied by sigmoid(x W_g) - x the
  normed block input, one logit per head - before the output projection;
* growth gates: in a grown, unfolded model, units (query heads, FFN neurons) with an index at or
  above ``base_heads`` / ``base_ffn`` have their outputs multiplied by the block's ``growth_gate``
  (a 1-element parameter); a block added by depth growth (``new_layers``) has every residual write
  (attention and MLP, after a post-norm) multiplied by it. Gate 0 is the source model's function;
  gate 1 is a plain model.

This file, ``attention.py``, ``mla.py``, ``moe.py``, ``experts.py``, the mixers (``mamba.py``, ``shortconv.py``,
``deltanet.py``), ``config.py``, ``families.py``, ``errors.py`` and ``rope.py`` import nothing else from growtool:
they are copied into remote-code folders (``hf_remote``) as the model transformers runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import apply_rope, apply_rope_interleaved, attend, l2_norm, query_scale, rope_tables
from .config import ModelConfig
from .deltanet import gdn_forward, gdn_modules
from .experts import Fused, expert_parameters
from .families import arch_of, block_features, block_sublayers, has_head_bias
from .mamba import Mamba1Mixer, Mamba2Mixer
from .mla import attention as mla_attention
from .mla import modules as mla_modules
from .moe import route
from .rope import extends_context, layer_key
from .shortconv import shortconv_forward, shortconv_modules

# a hybrid's mixer sublayer (Arch.kinds) -> (its modules by slot (cfg, lin), its forward (slots, normed x, channel
# mask or None))
MIXERS = {"shortconv": (shortconv_modules, shortconv_forward), "gdn": (gdn_modules, gdn_forward)}

ACT = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: torch.square(F.relu(x)),  # ReLU squared (So et al. 2021, Primer): Arcee, Nemotron
    "silu": F.silu,
    "bloom_gelu": lambda x: x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))),  # BLOOM's constants
}


class Linear(nn.Module):
    """A linear layer whose weight is stored [out, in] (nn.Linear) or [in, out] (GPT-2's Conv1D)."""

    def __init__(self, n_in: int, n_out: int, bias: bool, in_out: bool = False):
        super().__init__()
        self.in_out = in_out
        self.weight = nn.Parameter(torch.zeros((n_in, n_out) if in_out else (n_out, n_in)))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x):
        if not self.in_out:
            return F.linear(x, self.weight, self.bias)
        y = x.reshape(-1, x.shape[-1])
        y = torch.addmm(self.bias, y, self.weight) if self.bias is not None else y @ self.weight
        return y.view(*x.shape[:-1], -1)


class RMSNorm(nn.Module):
    """RMSNorm with gain ``weight`` (Llama) or ``offset + weight`` (Gemma's 1 + w, in float32)."""

    def __init__(self, d: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((d,), 1.0 - offset))
        self.eps, self.offset = eps, offset

    def forward(self, x):
        h = x.to(torch.promote_types(x.dtype, torch.float32))  # float32 math, float64 kept (verify's reference)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (self.offset + self.weight.float())).type_as(x)
        return self.weight * h.to(x.dtype)


class OffsetLayerNorm(nn.LayerNorm):
    """LayerNorm whose gain is ``offset + weight`` (Nemotron's LayerNorm1P stores w with gain 1 + w)."""

    def __init__(self, d: int, eps: float, offset: float, bias: bool):
        super().__init__(d, eps=eps, bias=bias)
        self.offset = offset
        with torch.no_grad():
            self.weight.fill_(1.0 - offset)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight + self.offset, self.bias, self.eps)


class XIELU(nn.Module):
    """xIELU (Huang et al. 2024, arXiv:2411.13010) with learned scalars, as Apertus stores them:
    x > 0: a_p x^2 + beta x; else (expm1(min(x, eps)) - x) a_n + beta x, with a_p = softplus(alpha_p),
    a_n = beta + softplus(alpha_n). alpha_p and alpha_n are trained, beta and eps are constants."""

    def __init__(self):
        super().__init__()
        self.alpha_p, self.alpha_n = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
        self.register_buffer("beta", torch.tensor(0.5))
        self.register_buffer("eps", torch.tensor(-1e-6))

    def forward(self, x):
        a_p, a_n = F.softplus(self.alpha_p), self.beta + F.softplus(self.alpha_n)
        return torch.where(
            x > 0, a_p * x * x + self.beta * x, (torch.expm1(torch.min(x, self.eps)) - x) * a_n + self.beta * x
        )


def make_norm(cfg: ModelConfig, d: int) -> nn.Module:
    if cfg.norm == "layernorm":
        f = arch_of(cfg).features
        if f.norm_offset:
            return OffsetLayerNorm(d, cfg.norm_eps, f.norm_offset, f.norm_bias)
        return nn.LayerNorm(d, eps=cfg.norm_eps, elementwise_affine=f.norm_affine, bias=f.norm_affine and f.norm_bias)
    return RMSNorm(d, cfg.norm_eps, arch_of(cfg).features.norm_offset)


def unit_mask(n: int, base: int, gate: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[n] multipliers: 1 for ungated units (< base), the gate for grown ones."""
    m = torch.ones(n, dtype=like.dtype, device=like.device)
    if base < n:
        m = torch.cat([m[:base], gate.to(like.dtype).reshape(1).expand(n - base)])
    return m


def drop_units(t: torch.Tensor, drop: tuple[float, int], salt: int) -> torch.Tensor:
    """Dropout of rate p = ``drop[0]``: ``t`` times a mask of keep-probability 1 - p, over 1 - p. The
    mask is drawn from a generator seeded by ``drop[1]`` (the run's seed and step) and ``salt`` (the
    place), so a rerun forward (activation checkpointing) and a resumed run draw the same mask."""
    p, key = drop
    gen = torch.Generator(device=t.device).manual_seed(key * 1024 + salt)
    keep = torch.rand(t.shape, generator=gen, device=t.device) >= p
    return t * keep.to(t.dtype) / (1 - p)


def _has(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
        return True
    except AttributeError:
        return False


def _put(root: nn.Module, path: str, module: nn.Module | nn.Parameter) -> None:
    """Attach ``module`` (or a bare parameter: GPT-OSS's sinks) at a dotted path, creating empty
    container modules on the way."""
    *parents, last = path.split(".")
    for p in parents:
        if not hasattr(root, p):
            root.add_module(p, nn.Module())
        root = getattr(root, p)
    if isinstance(module, nn.Parameter):  # a tensor of its own (fused experts, GPT-OSS's sinks)
        root.register_parameter(last, module)
    else:
        root.add_module(last, module)


_SUB_SLOTS = {  # hybrids: the slots each sublayer owns (a block holds those of its kind's sublayers)
    "attention": {"ln1", "post_attn", "q", "k", "v", "qkv", "q_norm", "k_norm", "g", "o", "sinks"}
    | {"q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b"},
    "mamba": {"ln1", "mamba"},
    "shortconv": {"ln1", "m_in", "m_conv", "m_out"},
    "gdn": {"ln1", "mixer"},
    "mlp": {"ln2", "post_ffn", "router", "experts", "s_gate", "s_up", "s_down", "s_router", "gate_up", "gate", "up"}
    | {"down", "act", "e_gate_up", "e_gate", "e_up", "e_down", "e_gate_up_bias", "e_down_bias", "s_gate_up"},
}


def _block_modules(cfg: ModelConfig, layer: int) -> dict[str, nn.Module]:
    """Block ``layer``'s modules by slot: all of them, or in a hybrid those of its kind's sublayers."""
    if not arch_of(cfg).kinds:
        return _slot_modules(cfg, layer)
    subs = block_sublayers(cfg, layer)
    keep = set().union(*(_SUB_SLOTS[sub] for sub in subs))
    if subs == ("mamba",):  # a mixer block alone (Mamba, Nemotron-H): build no attention or MLP to drop
        m = {"ln1": make_norm(cfg, cfg.width)}
    else:
        m = {k: v for k, v in _slot_modules(cfg, layer).items() if k in keep}
    if "mamba" in subs:
        m["mamba"] = Mamba1Mixer(cfg) if arch_of(cfg).features.ssm_version == 1 else Mamba2Mixer(cfg)
    for sub in set(subs) & set(MIXERS):  # LFM2's short convolution, Gated DeltaNet
        m.update(MIXERS[sub][0](cfg, lambda n_in, n_out, bias: Linear(n_in, n_out, bias)))
    return m


def _slot_modules(cfg: ModelConfig, layer: int) -> dict[str, nn.Module]:
    """Block ``layer``'s modules by slot, sized from the config and shaped by the features."""
    f = block_features(cfg)
    d, hd, f_n = cfg.width, cfg.head_dim, cfg.ffn if cfg.is_moe(layer) or not f.moe else cfg.dense_ffn
    qd, kvd = cfg.heads * hd, cfg.kv_heads * hd

    def lin(n_in, n_out, bias):
        return Linear(n_in, n_out, bias, in_out=f.linear == "in_out")

    m = {"ln1": make_norm(cfg, d), "ln2": make_norm(cfg, d)} if f.pre_norms else {}
    if f.shared_norm:
        del m["ln2"]  # attention and MLP read ln1
    if f.post_norms:
        m.update(post_attn=make_norm(cfg, d), post_ffn=make_norm(cfg, d))
    if f.mla:  # multi-head latent attention (mla.py), its o_proj included
        m.update(mla_modules(cfg, lin, RMSNorm))
    elif f.qkv == "separate":
        q = lin(d, 2 * qd if f.attn_output_gate else qd, cfg.qkv_bias)  # Qwen3-Next: per head [q | gate]
        m.update(q=q, k=lin(d, kvd, cfg.qkv_bias), v=lin(d, kvd, cfg.qkv_bias))
    else:
        m["qkv"] = lin(d, qd + 2 * kvd, cfg.qkv_bias)
    if f.qk_norm in ("head", "full"):
        n_q, n_k = (hd, hd) if f.qk_norm == "head" else (qd, kvd)
        m.update(q_norm=RMSNorm(n_q, cfg.norm_eps, f.norm_offset), k_norm=RMSNorm(n_k, cfg.norm_eps, f.norm_offset))
    if cfg.attn_gate:
        m["g"] = lin(d, cfg.heads, cfg.qkv_bias)
    if f.sinks:
        m["sinks"] = nn.Parameter(torch.zeros(cfg.heads))  # one logit per query head (attention.explicit)
    if "o" not in m:  # (MLA's modules include it)
        m["o"] = lin(qd, d, cfg.o_bias)
    if cfg.is_moe(layer):  # a router over experts, each a GLU FFN of cfg.ffn neurons; maybe a shared expert
        return {**m, **_moe_modules(cfg, lin)}
    if f.mlp == "glu_fused":
        m["gate_up"] = lin(d, 2 * f_n, cfg.mlp_bias)
    else:
        if f.mlp == "glu":
            m["gate"] = lin(d, f_n, cfg.mlp_bias)
        m["up"] = lin(d, f_n, cfg.mlp_bias)
    m["down"] = lin(f_n, d, cfg.mlp_bias)
    if f.act_params:
        m["act"] = XIELU()
    return m


def _moe_modules(cfg: ModelConfig, lin) -> dict[str, nn.Module]:
    """An MoE block's router, experts (modules, or fused tensors: ``experts.py``) and shared expert."""
    a, d, f_n = arch_of(cfg), cfg.width, cfg.ffn
    f = a.features
    m = {"router": lin(d, cfg.experts, f.router_bias)}
    if f.experts:  # every expert in a few tensors (experts.py)
        m.update(expert_parameters(cfg))
    else:
        m["experts"] = nn.ModuleList()
    for _ in range(0 if f.experts else cfg.experts):
        m["experts"].append(nn.Module())
        for slot, shape in (("e_gate", (d, f_n)), ("e_up", (d, f_n)), ("e_down", (f_n, d))):
            _put(m["experts"][-1], a.modules[slot], lin(*shape, False))
    if cfg.shared_ffn or f.shared_plain:  # Llama 4's (shared_plain): of the experts' size
        sf = f_n if f.shared_plain else cfg.shared_ffn
        fused = "s_gate_up" in a.modules  # [gate | up] in one tensor (GraniteMoeShared)
        sb = cfg.mlp_bias  # Ernie 4.5-MoE's shared experts have biases where use_bias says so
        m.update({"s_gate_up": lin(d, 2 * sf, sb)} if fused else {"s_gate": lin(d, sf, sb), "s_up": lin(d, sf, sb)})
        m["s_down"] = lin(sf, d, sb)
        if f.shared_gate and "s_router" in a.modules:  # Qwen2-MoE's sigmoid gate on the shared expert
            m["s_router"] = lin(d, 1, False)
    return m


class Block(nn.Module):
    """One transformer block; submodules sit at the architecture's HF paths."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg, self.layer, self.features = cfg, layer, block_features(cfg)
        a = arch_of(cfg)
        self.slot = _block_modules(cfg, layer)  # a plain dict: the same module objects, found by slot
        for name, mod in self.slot.items():
            _put(self, a.modules[name], mod)
        if self.features.expert_bias and cfg.is_moe(layer):  # a buffer at its path (under the router, maybe)
            parent, last = a.modules["e_bias"].rsplit(".", 1)
            if not _has(self, parent):
                _put(self, parent, nn.Module())
            shape = [cfg.experts if u == "experts" else 1 for u in self.features.expert_bias]
            self.get_submodule(parent).register_buffer(last, torch.zeros(shape))
        if cfg.gated:
            self.growth_gate = nn.Parameter(torch.zeros(1))
        self.grow_dropout: tuple[float, int] | None = None  # (rate, key) while --grow-dropout is on (LM.set_dropout)

    def _gate(self, alpha):
        if alpha is not None:
            return torch.as_tensor(float(alpha))
        return self.growth_gate if self.cfg.gated else torch.ones(1)

    def _attention(self, x, rope, g):
        cfg, s, f = self.cfg, self.slot, self.features
        if f.mla:
            return mla_attention(cfg, s, x, rope, self.layer, g)
        B, T, _ = x.shape
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        gate = None
        if f.qkv == "separate":
            q, k, v = s["q"](x), s["k"](x), s["v"](x)
            if f.attn_output_gate:  # per head [q | gate]; the output's gate as [B, H, T, hd]
                q, gate = q.view(B, T, H, 2 * hd).chunk(2, dim=-1)
                gate = torch.sigmoid(gate.transpose(1, 2))
        elif f.qkv == "concat":
            q, k, v = s["qkv"](x).split([H * hd, K * hd, K * hd], dim=-1)
        elif f.qkv == "grouped":  # per KV group [q_1 .. q_r k v] (Falcon)
            grp = s["qkv"](x).view(B, T, K, H // K + 2, hd)
            q, k, v = grp[:, :, :, :-2], grp[:, :, :, -2], grp[:, :, :, -1]
        else:  # interleaved: per head [q k v]
            q, k, v = s["qkv"](x).view(B, T, H, 3 * hd).chunk(3, dim=-1)
        if f.qk_norm == "full":  # over all heads at once, before the split into heads (OLMo-2)
            q, k = s["q_norm"](q), s["k_norm"](k)
        if cfg.clip_qkv is not None:  # OLMo, OLMoE: clamped after the projections (and a full q/k norm)
            q, k, v = (t.clamp(-cfg.clip_qkv, cfg.clip_qkv) for t in (q, k, v))
        q, k, v = q.reshape(B, T, H, hd), k.reshape(B, T, K, hd), v.reshape(B, T, K, hd)
        if f.qk_norm == "head" and not f.qk_norm_after_rope:
            q, k = s["q_norm"](q), s["k_norm"](k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rope is not None:
            turn = apply_rope_interleaved if f.rope_interleaved else apply_rope
            q, k = turn(q, *rope), turn(k, *rope)
        if f.qk_norm == "head" and f.qk_norm_after_rope:  # HunYuan: the rotated q and k are normed
            q, k = s["q_norm"](q), s["k_norm"](k)
        if f.qk_norm == "l2" and rope is not None and cfg.extra.get("use_qk_norm", True):  # Llama 4's RoPE layers
            q, k = l2_norm(q, cfg.norm_eps), l2_norm(k, cfg.norm_eps)
        q = query_scale(q, cfg, self.layer)
        sinks = self.get_parameter(arch_of(cfg).modules["sinks"]) if f.sinks else None  # by path: load(assign=)
        y = attend(q, k, v, cfg, self.layer, sinks)  # [B, H, T, hd]
        mult = None  # a plain model without gated attention skips the multiply by ones
        if cfg.base_heads < H:
            mult = unit_mask(H, cfg.base_heads, g, y).view(1, H, 1, 1)
        if cfg.attn_gate:
            sg = torch.sigmoid(s["g"](x)).transpose(1, 2).unsqueeze(-1)  # [B, H, T, 1]
            mult = sg if mult is None else mult * sg
        if mult is not None:
            y = y * mult
        if gate is not None:
            y = y * gate
        if self.grow_dropout and self.training:  # per head channel: twin heads get different masks
            y = drop_units(y, self.grow_dropout, 2 * self.layer)
        return s["o"](y.transpose(1, 2).reshape(B, T, H * hd))

    def _moe(self, x, g):
        """Mixture of experts: the router picks top_k experts per token (``moe.route``: softmax top-k,
        or the family's rule); each picked expert's GLU output times its weight, summed; plus the
        shared expert, times sigmoid(s_router(x)) where the family gates it. Grown neurons of every
        expert (and of the shared one) sit behind the gate."""
        cfg, s, a = self.cfg, self.slot, arch_of(self.cfg)
        act, shape, pre = ACT[cfg.activation], x.shape, a.features.routing == "sigmoid_in"
        x = x.reshape(-1, shape[-1])
        bias = self.get_buffer(a.modules["e_bias"]) if self.features.expert_bias else None
        top, pick = route(cfg, s["router"], x, bias)
        top = top.to(x.dtype)
        mask = unit_mask(cfg.ffn, cfg.base_ffn, g, x) if cfg.base_ffn < cfg.ffn else None
        out, fused = torch.zeros_like(x), Fused(cfg, self) if a.features.experts else None
        for e in range(cfg.experts):
            tok, k = torch.where(pick == e)
            if tok.numel() == 0:
                continue
            h = x[tok] * top[tok, k, None] if pre else x[tok]
            m = fused.ffn(e, h, act, mask) if fused is not None else self._expert(e, h, act, mask)
            out.index_add_(0, tok, m if pre else m * top[tok, k, None])
        if cfg.shared_ffn or a.features.shared_plain:
            n, base = (cfg.ffn, cfg.base_ffn) if a.features.shared_plain else (cfg.shared_ffn, cfg.base_shared_ffn)
            gate, up = s["s_gate_up"](x).chunk(2, dim=-1) if "s_gate_up" in s else (s["s_gate"](x), s["s_up"](x))
            h = act(gate) * up
            h = h * unit_mask(n, base, g, h) if base < n else h
            y = s["s_down"](h)
            out = out + (torch.sigmoid(s["s_router"](x)) * y if "s_router" in s else y)
        return out.view(shape)

    def _expert(self, e, h, act, mask):
        """Expert ``e``'s GLU output for tokens ``h`` (grown neurons times ``mask``), one module per expert."""
        ex, a = self.slot["experts"][e], arch_of(self.cfg)
        m = act(ex.get_submodule(a.modules["e_gate"])(h)) * ex.get_submodule(a.modules["e_up"])(h)
        return ex.get_submodule(a.modules["e_down"])(m if mask is None else m * mask)

    def _ffn(self, x, g):
        cfg, s, f = self.cfg, self.slot, self.features
        if cfg.is_moe(self.layer):
            return self._moe(x, g)
        n, base = (cfg.dense_ffn, cfg.base_dense_ffn) if f.moe else (cfg.ffn, cfg.base_ffn)  # Llama 4's dense blocks
        act = s["act"] if "act" in s else ACT[cfg.activation]
        mg, md = (cfg.multipliers or {}).get("mlp", (None, None))  # Falcon-H1: on the gate, on the output
        if f.mlp == "glu_fused":
            gate, up = s["gate_up"](x).chunk(2, dim=-1)
            h = act(gate) * up
        elif f.mlp == "glu":
            h = act(s["gate"](x) if mg is None else s["gate"](x) * mg) * s["up"](x)
        else:
            h = act(s["up"](x))
        if base < n:  # grown neurons behind the gate (skipped in a plain model)
            h = h * unit_mask(n, base, g, h)
        if self.grow_dropout and self.training:  # per unit: twin units get different masks
            h = drop_units(h, self.grow_dropout, 2 * self.layer + 1)
        return s["down"](h) if md is None else s["down"](h) * md

    def forward(self, x, rope=None, alpha=None):
        g = self._gate(alpha)
        if self.cfg.new_block(self.layer):  # added by depth growth: every residual write through the gate
            return self._forward(x, rope, g, lambda y: g.to(y.dtype) * y)
        return self._forward(x, rope, g, lambda y: y)

    def _forward(self, x, rope, g, w):
        s, f = self.slot, self.features
        r = self.cfg.residual_multiplier  # Granite: sublayer outputs x r before the add
        if arch_of(self.cfg).kinds:
            return self._hybrid(x, rope, g, w)
        if self.cfg.parallel:
            h = s["ln1"](x)
            return x + w(self._attention(h, rope, g)) + w(self._ffn(h if f.shared_norm else s["ln2"](x), g))
        a = self._attention(s["ln1"](x) if f.pre_norms else x, rope, g)
        a = s["post_attn"](a) if f.post_norms else a
        x = x + w(a if r is None else a * r)
        m = self._ffn(s["ln2"](x) if f.pre_norms else x, g)
        m = s["post_ffn"](m) if f.post_norms else m
        return x + w(m if r is None else m * r)

    def _mixer(self, sub, x, g):
        """LFM2's short convolution (its grown channels behind the gate) or Gated DeltaNet (nothing gated)."""
        cfg = self.cfg
        base = cfg.base_units("conv")
        return MIXERS[sub][1](self.slot, x, unit_mask(cfg.width, base, g, x) if base < cfg.width else None)

    def _hybrid(self, x, rope, g, w):
        """A hybrid's block (``Arch.kinds``): each sublayer of its kind reads its pre-norm of the residual
        (ln1: attention or the Mamba mixer, ln2: the MLP) and adds its output (x r, Granite) to it."""
        s, r, m = self.slot, self.cfg.residual_multiplier, self.cfg.multipliers or {}
        for sub in block_sublayers(self.cfg, self.layer):
            if sub == "mlp":
                y = self._ffn(s["ln2"](x), g)
            elif sub == "mamba" and self.features.parallel_mixers:  # Falcon-H1: with attention, on one norm
                h = s["ln1"](x)
                y = s["mamba"](h) * m.get("ssm_out", 1.0)
                y = y + self._attention(h * m.get("attn_in", 1.0), rope, g) * m.get("attn_out", 1.0)
            elif sub == "attention" and self.features.parallel_mixers:
                continue  # run with the mixer
            elif sub == "mamba":
                y = s["mamba"](s["ln1"](x))
            elif sub in MIXERS:
                y = self._mixer(sub, s["ln1"](x), g)
            else:
                y = self._attention(s["ln1"](x), rope, g)
            x = x + w(y if r is None else y * r)
        return x


class LM(nn.Module):
    """A causal language model of any supported architecture; ``forward(idx) -> logits``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        build(self, cfg)

    @property
    def blocks(self):
        return self.get_submodule(arch_of(self.cfg).blocks_path)

    def set_gates(self, value: float) -> None:
        """Set every block's growth gate (no-op on a plain model)."""
        with torch.no_grad():
            for b in self.blocks:
                if self.cfg.gated:
                    b.growth_gate.fill_(value)

    def set_dropout(self, p: float, key: int) -> None:
        """``--grow-dropout``: rate ``p`` (0: off) in every block's dense MLP units and attention heads'
        outputs while training, the masks drawn from ``key`` (``drop_units``)."""
        for b in self.blocks:
            b.grow_dropout = (p, key) if p > 0 else None

    def forward(self, idx, targets=None, alpha=None):
        logits = run(self, idx, alpha)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    # ---- checkpoint tensors <-> module ------------------------------------------------------

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors (the tied head is not stored separately, as in HF)."""
        sd = self.state_dict()
        if self.cfg.tie:
            sd.pop(arch_of(self.cfg).modules["head"] + ".weight", None)
        return sd

    @classmethod
    def from_tensors(cls, cfg: ModelConfig, tensors: dict[str, torch.Tensor], dtype=torch.float32) -> LM:
        model = cls(cfg)
        a = arch_of(cfg)
        sd = {k: v.to(dtype) for k, v in tensors.items()}
        if cfg.tie:
            sd[a.modules["head"] + ".weight"] = sd[a.embed]
        model.load_state_dict(sd, strict=True)
        return model.to(dtype).eval()


def build(model: nn.Module, cfg: ModelConfig) -> None:
    """Create the modules of a model of ``cfg`` on ``model`` (also used by the remote-code class)."""
    a = arch_of(cfg)
    model.cfg = cfg
    _put(model, a.modules["embed"], nn.Embedding(cfg.vocab_size, cfg.width))
    if a.features.positions == "learned":
        _put(model, a.modules["pos"], nn.Embedding(cfg.context + a.features.pos_offset, cfg.width))
    if a.features.embed_norm:
        _put(model, a.modules["embed_norm"], make_norm(cfg, cfg.width))
    _put(model, a.blocks_path, nn.ModuleList(Block(cfg, i) for i in range(cfg.layers)))
    _put(model, a.modules["final_norm"], make_norm(cfg, cfg.width))
    _put(model, a.modules["head"], nn.Linear(cfg.width, cfg.vocab_size, bias=has_head_bias(cfg)))
    if cfg.tie:
        model.get_submodule(a.modules["head"]).weight = model.get_submodule(a.modules["embed"]).weight


def run(model: nn.Module, idx: torch.Tensor, alpha=None) -> torch.Tensor:
    """Logits of a model built by ``build`` for token ids ``idx`` [B, T]."""
    return head_logits(model, hidden(model, idx, alpha))


def hidden(model: nn.Module, idx: torch.Tensor, alpha=None) -> torch.Tensor:
    """The final-norm output of a model built by ``build`` ([B, T, width]): all but the head."""
    cfg, a = model.cfg, arch_of(model.cfg)
    T = idx.shape[1]
    if T > cfg.context and not extends_context(cfg):
        raise ValueError(f"sequence length {T} exceeds the model's context {cfg.context}")
    x = model.get_submodule(a.modules["embed"])(idx)
    if a.features.embed_scale:  # Gemma: sqrt(width), rounded to the weights' dtype as transformers does
        x = x * torch.tensor(cfg.width**0.5).to(x.dtype)
    if cfg.embedding_multiplier is not None:  # Granite
        x = x * cfg.embedding_multiplier
    if a.features.embed_norm:  # BLOOM: the residual starts as the embeddings' LayerNorm output
        x = model.get_submodule(a.modules["embed_norm"])(x)
    ropes = {}
    if a.features.positions == "learned":
        pos = torch.arange(T, device=idx.device) + a.features.pos_offset  # OPT reads row p + 2
        x = x + model.get_submodule(a.modules["pos"])(pos)
    for i, b in enumerate(model.get_submodule(a.blocks_path)):
        rope = None
        if a.features.positions == "rope":
            key = layer_key(cfg, i)
            if key not in ropes:
                ropes[key] = rope_tables(cfg, T, idx.device, layer=i)
            rope = ropes[key]
        if not cfg.has_rope(i):
            rope = None  # SmolLM3's no-RoPE layers; Cohere 2 / EXAONE 4: RoPE on sliding layers only
        x = b(x, rope, alpha)
    return model.get_submodule(a.modules["final_norm"])(x)


def head_logits(model: nn.Module, x: torch.Tensor, head: nn.Module | None = None) -> torch.Tensor:
    """The head (and the final soft-cap) applied to final-norm outputs ``x``."""
    cfg = model.cfg
    logits = (head or model.get_submodule(arch_of(cfg).modules["head"]))(x)
    if cfg.logits_scaling is not None:  # Granite divides the logits
        logits = logits / cfg.logits_scaling
    if cfg.logit_scale is not None:  # Cohere multiplies them
        logits = logits * cfg.logit_scale
    if cfg.final_softcap:
        logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return logits


def logit_scale(logits: torch.Tensor) -> float:
    """The scale a logit error is measured against: the std of the logits (floored at 1e-6)."""
    return max(float(logits.float().std()), 1e-6)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["LM", "Block", "logit_scale", "count_params", "build", "run", "hidden", "head_logits"]
