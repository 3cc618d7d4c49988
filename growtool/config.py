"""The model config: one dataclass for both families, and its mapping to Hugging Face config.json.

Growth state lives here too: ``base_heads`` / ``base_ffn`` count the units that are *not*
behind the warm-up gate. Units with a higher index (appended by a gated growth stage) have
their outputs multiplied by the block's gate. A plain model has base_* equal to the totals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import GrowError

FAMILIES = ("gpt2", "llama")


@dataclass
class ModelConfig:
    family: str
    vocab_size: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    context: int = 1024
    norm_eps: float = 1e-5
    tie: bool = True
    attn_gate: bool = False
    qkv_bias: bool = False  # llama only (gpt2 always has biases)
    rope_theta: float = 10000.0
    base_heads: int | None = None  # units below these counts are ungated
    base_ffn: int | None = None
    extra: dict = field(default_factory=dict)  # unknown HF keys, carried through unchanged

    def __post_init__(self):
        if self.base_heads is None:
            self.base_heads = self.heads
        if self.base_ffn is None:
            self.base_ffn = self.ffn
        self.check()

    @property
    def gated(self) -> bool:
        """True when some units sit behind the warm-up gate (a grown, unfolded model)."""
        return self.base_heads < self.heads or self.base_ffn < self.ffn

    @property
    def norm(self) -> str:
        return "layernorm" if self.family == "gpt2" else "rmsnorm"

    def check(self) -> None:
        if self.family not in FAMILIES:
            raise GrowError(f"unknown family {self.family!r} (known: {', '.join(FAMILIES)})")
        for name in ("vocab_size", "width", "layers", "heads", "kv_heads", "head_dim", "ffn", "context"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise GrowError(f"config {name} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise GrowError(f"kv_heads {self.kv_heads} does not divide heads {self.heads}")
        if self.family == "gpt2":
            if self.heads * self.head_dim != self.width:
                raise GrowError(f"gpt2 needs heads x head_dim == width, got {self.heads} x {self.head_dim} != {self.width}")
            if self.kv_heads != self.heads:
                raise GrowError("gpt2 has no grouped-query attention (kv_heads must equal heads)")
        if self.family == "llama" and self.head_dim % 2:
            raise GrowError(f"llama head_dim must be even for RoPE, got {self.head_dim}")
        if not (0 < self.norm_eps < 1):
            raise GrowError(f"norm eps must be in (0, 1), got {self.norm_eps}")
        if not (0 < self.base_heads <= self.heads and 0 < self.base_ffn <= self.ffn):
            raise GrowError("growth state base_heads/base_ffn out of range")
        if self.base_heads % (self.heads // self.kv_heads):
            raise GrowError("base_heads must cover whole KV groups")

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def n_params(self) -> int:
        d, f, hd = self.width, self.ffn, self.head_dim
        qd, kvd = self.heads * hd, self.kv_heads * hd
        attn = d * (qd + 2 * kvd) + qd * d + (self.heads * d if self.attn_gate else 0)
        mlp = (3 if self.family == "llama" else 2) * d * f
        if self.family == "gpt2":
            attn += qd + 2 * kvd + d + (self.heads if self.attn_gate else 0)
            mlp += f + d
            norms = 4 * d
        else:
            attn += (qd + 2 * kvd) if self.qkv_bias else 0
            norms = 2 * d
        total = self.layers * (attn + mlp + norms) + self.vocab_size * d
        total += 2 * d if self.family == "gpt2" else d
        if self.family == "gpt2":
            total += self.context * d
        if not self.tie:
            total += self.vocab_size * d
        if self.gated:
            total += self.layers  # one growth-gate scalar per block
        return total

    # ---- Hugging Face config.json -------------------------------------------------------

    def to_hf(self) -> dict:
        """An HF-style config dict (loads in transformers), plus a ``growtool`` section."""
        own = {"attn_gate": self.attn_gate, "base_heads": self.base_heads, "base_ffn": self.base_ffn}
        if self.family == "gpt2":
            hf = {
                "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "vocab_size": self.vocab_size, "n_positions": self.context, "n_embd": self.width,
                "n_layer": self.layers, "n_head": self.heads, "n_inner": self.ffn,
                "layer_norm_epsilon": self.norm_eps, "activation_function": "gelu_new",
                "tie_word_embeddings": self.tie, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            }
        else:
            hf = {
                "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "vocab_size": self.vocab_size, "hidden_size": self.width,
                "intermediate_size": self.ffn, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "head_dim": self.head_dim, "max_position_embeddings": self.context,
                "rms_norm_eps": self.norm_eps, "rope_theta": self.rope_theta,
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
                "tie_word_embeddings": self.tie, "attention_bias": self.qkv_bias,
                "mlp_bias": False, "hidden_act": "silu",
            }
        out = {**self.extra, **hf, "growtool": own}
        return out

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Read an HF config dict (ours or one written by transformers)."""
        if not isinstance(hf, dict):
            raise GrowError("config is not a JSON object")
        mt = hf.get("model_type")
        own = hf.get("growtool") or {}
        known_extra = {k: v for k, v in hf.items() if k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        try:
            if mt == "gpt2":
                act = hf.get("activation_function", "gelu_new")
                if act not in ("gelu_new", "gelu_pytorch_tanh"):
                    raise GrowError(f"gpt2 activation {act!r} is not supported (gelu_new only)")
                if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn"):
                    raise GrowError("gpt2 scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
                d, h = int(hf["n_embd"]), int(hf["n_head"])
                if d % h:
                    raise GrowError(f"heads {h} do not divide width {d}")
                cfg = cls(
                    family="gpt2", vocab_size=int(hf["vocab_size"]), width=d, layers=int(hf["n_layer"]),
                    heads=h, kv_heads=h, head_dim=d // h, ffn=int(hf.get("n_inner") or 4 * d),
                    context=int(hf.get("n_positions", 1024)), norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                    tie=bool(hf.get("tie_word_embeddings", True)), attn_gate=bool(own.get("attn_gate", False)),
                    base_heads=own.get("base_heads"), base_ffn=own.get("base_ffn"), extra=known_extra,
                )
            elif mt == "llama":
                act = hf.get("hidden_act", "silu")
                if act != "silu":
                    raise GrowError(f"llama hidden_act {act!r} is not supported (silu only)")
                if hf.get("mlp_bias"):
                    raise GrowError("llama mlp_bias is not supported")
                rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
                if rope.get("rope_type", rope.get("type", "default")) != "default":
                    raise GrowError(f"rope scaling {rope.get('rope_type')!r} is not supported")
                theta = float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0)
                d, h = int(hf["hidden_size"]), int(hf["num_attention_heads"])
                hd = hf.get("head_dim") or (d // h if d % h == 0 else None)
                if hd is None:
                    raise GrowError(f"heads {h} do not divide width {d} and no head_dim is given")
                cfg = cls(
                    family="llama", vocab_size=int(hf["vocab_size"]), width=d,
                    layers=int(hf["num_hidden_layers"]), heads=h,
                    kv_heads=int(hf.get("num_key_value_heads") or h), head_dim=int(hd),
                    ffn=int(hf["intermediate_size"]), context=int(hf.get("max_position_embeddings", 2048)),
                    norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie=bool(hf.get("tie_word_embeddings", False)),
                    attn_gate=bool(own.get("attn_gate", False)), qkv_bias=bool(hf.get("attention_bias", False)),
                    rope_theta=theta, base_heads=own.get("base_heads"), base_ffn=own.get("base_ffn"),
                    extra=known_extra,
                )
            else:
                raise GrowError(f"unknown family (model_type {mt!r}; known: {', '.join(FAMILIES)})")
        except KeyError as e:
            raise GrowError(f"config lacks {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise GrowError(f"config has a bad value: {e}") from None
        return cfg
