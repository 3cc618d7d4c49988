"""The one forward pass of the project: GPT-2 and Llama, with gated attention and growth gates.

Parameter names are Hugging Face's, so ``model.state_dict()`` *is* the checkpoint. Two
growtool additions, both off in a plain HF model:

* gated attention (``attn_gate``): each head's output is multiplied by
  sigmoid(x W_g) - x the normed block input, one logit per head - before the output projection;
* growth gates: in a grown, unfolded model, units (query heads, FFN neurons) with an index at or
  above ``base_heads`` / ``base_ffn`` have their outputs multiplied by the block's scalar
  ``growth_gate``. Gate 0 is the source model's function; gate 1 is a plain model.
"""

from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight stored [in, out]."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(cfg: ModelConfig, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of Llama's default rotary embedding ([T, head_dim])."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    f = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


SDPA_GQA = torch.__version__ >= (2, 5)  # sdpa takes enable_gqa (grouped-query attention) from torch 2.5


def unit_mask(n: int, base: int, gate: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[n] multipliers: 1 for ungated units (< base), the gate for grown ones."""
    m = torch.ones(n, dtype=like.dtype, device=like.device)
    if base < n:
        m = torch.cat([m[:base], gate.to(like.dtype).expand(n - base)])
    return m


class Block(nn.Module):
    """One transformer block of either family; submodule names follow HF."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, qd, kvd, f = cfg.width, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn
        if cfg.family == "gpt2":
            self.ln_1 = nn.LayerNorm(d, eps=cfg.norm_eps)
            self.attn = nn.Module()
            self.attn.c_attn = Conv1D(d, qd + 2 * kvd)
            self.attn.c_proj = Conv1D(qd, d)
            if cfg.attn_gate:
                self.attn.c_gate = Conv1D(d, cfg.heads)
            self.ln_2 = nn.LayerNorm(d, eps=cfg.norm_eps)
            self.mlp = nn.Module()
            self.mlp.c_fc = Conv1D(d, f)
            self.mlp.c_proj = Conv1D(f, d)
        else:
            self.input_layernorm = RMSNorm(d, cfg.norm_eps)
            a = self.self_attn = nn.Module()
            a.q_proj = nn.Linear(d, qd, bias=cfg.qkv_bias)
            a.k_proj = nn.Linear(d, kvd, bias=cfg.qkv_bias)
            a.v_proj = nn.Linear(d, kvd, bias=cfg.qkv_bias)
            a.o_proj = nn.Linear(qd, d, bias=False)
            if cfg.attn_gate:
                a.g_proj = nn.Linear(d, cfg.heads, bias=False)
            self.post_attention_layernorm = RMSNorm(d, cfg.norm_eps)
            m = self.mlp = nn.Module()
            m.gate_proj = nn.Linear(d, f, bias=False)
            m.up_proj = nn.Linear(d, f, bias=False)
            m.down_proj = nn.Linear(f, d, bias=False)
        if cfg.gated:
            self.growth_gate = nn.Parameter(torch.zeros(1))

    def gate(self, alpha):
        if alpha is not None:
            return torch.as_tensor(float(alpha))
        return self.growth_gate if self.cfg.gated else torch.ones(1)

    def attention(self, x, rope, g):
        cfg = self.cfg
        B, T, _ = x.shape
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        if cfg.family == "gpt2":
            q, k, v = self.attn.c_attn(x).split([H * hd, K * hd, K * hd], dim=-1)
        else:
            a = self.self_attn
            q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, K, hd).transpose(1, 2)
        v = v.view(B, T, K, hd).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        gqa = {}
        if K != H and SDPA_GQA:  # query head h reads KV head h // (H / K), without copying K and V
            gqa = {"enable_gqa": True}
        elif K != H:
            k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)  # [B, H, T, hd]
        mult = None  # a plain model without gated attention skips the multiply by ones
        if cfg.base_heads < H:
            mult = unit_mask(H, cfg.base_heads, g, y).view(1, H, 1, 1)
        if cfg.attn_gate:
            gl = (self.attn.c_gate(x) if cfg.family == "gpt2" else self.self_attn.g_proj(x))  # [B, T, H]
            s = torch.sigmoid(gl).transpose(1, 2).unsqueeze(-1)
            mult = s if mult is None else mult * s
        if mult is not None:
            y = y * mult
        y = y.transpose(1, 2).reshape(B, T, H * hd)
        return self.attn.c_proj(y) if cfg.family == "gpt2" else self.self_attn.o_proj(y)

    def ffn(self, x, g):
        cfg = self.cfg
        if cfg.family == "gpt2":
            h = F.gelu(self.mlp.c_fc(x), approximate="tanh")
        else:
            h = F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x)
        if cfg.base_ffn < cfg.ffn:  # grown neurons behind the gate (skipped in a plain model)
            h = h * unit_mask(cfg.ffn, cfg.base_ffn, g, h)
        return self.mlp.c_proj(h) if cfg.family == "gpt2" else self.mlp.down_proj(h)

    def forward(self, x, rope=None, alpha=None):
        g = self.gate(alpha)
        if self.cfg.family == "gpt2":
            x = x + self.attention(self.ln_1(x), rope, g)
            return x + self.ffn(self.ln_2(x), g)
        x = x + self.attention(self.input_layernorm(x), rope, g)
        return x + self.ffn(self.post_attention_layernorm(x), g)


class LM(nn.Module):
    """A causal language model of either family; ``forward(idx) -> logits``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.width
        blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        if cfg.family == "gpt2":
            self.transformer = nn.Module()
            self.transformer.wte = nn.Embedding(cfg.vocab_size, d)
            self.transformer.wpe = nn.Embedding(cfg.context, d)
            self.transformer.h = blocks
            self.transformer.ln_f = nn.LayerNorm(d, eps=cfg.norm_eps)
            emb = self.transformer.wte
        else:
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(cfg.vocab_size, d)
            self.model.layers = blocks
            self.model.norm = RMSNorm(d, cfg.norm_eps)
            emb = self.model.embed_tokens
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie:
            self.lm_head.weight = emb.weight

    @property
    def blocks(self):
        return self.transformer.h if self.cfg.family == "gpt2" else self.model.layers

    def set_gates(self, value: float) -> None:
        """Set every block's growth gate (no-op on a plain model)."""
        with torch.no_grad():
            for b in self.blocks:
                if self.cfg.gated:
                    b.growth_gate.fill_(value)

    def forward(self, idx, targets=None, alpha=None):
        cfg = self.cfg
        T = idx.shape[1]
        if T > cfg.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {cfg.context}")
        if cfg.family == "gpt2":
            pos = torch.arange(T, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            rope = None
        else:
            x = self.model.embed_tokens(idx)
            rope = rope_tables(cfg, T, idx.device)
        for b in self.blocks:
            x = b(x, rope, alpha)
        x = self.transformer.ln_f(x) if cfg.family == "gpt2" else self.model.norm(x)
        logits = self.lm_head(x)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    # ---- checkpoint tensors <-> module ------------------------------------------------------

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors (the tied head is not stored separately, as in HF)."""
        sd = self.state_dict()
        if self.cfg.tie:
            sd.pop("lm_head.weight", None)
        return sd

    @classmethod
    def from_tensors(cls, cfg: ModelConfig, tensors: dict[str, torch.Tensor], dtype=torch.float32) -> "LM":
        model = cls(cfg)
        sd = {k: v.to(dtype) for k, v in tensors.items()}
        if cfg.tie:
            sd["lm_head.weight"] = sd[FAMILY_EMBED[cfg.family]]
        model.load_state_dict(sd, strict=True)
        return model.to(dtype).eval()


FAMILY_EMBED = {"gpt2": "transformer.wte.weight", "llama": "model.embed_tokens.weight"}


def logit_scale(logits: torch.Tensor) -> float:
    """The scale a logit error is measured against: the std of the logits (floored at 1e-6)."""
    return max(float(logits.float().std()), 1e-6)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["LM", "Block", "ModelConfig", "logit_scale", "count_params"]
