"""Families as data: for every tensor, its role and which axes are residual or unit axes.

Roles
  embedding    writes a token/position vector into the residual (residual axis = columns)
  reader       reads the normed residual (``norm`` names the norm whose gain it may absorb)
  writer       writes into the residual from units (residual axis + unit axis)
  writer_bias  a bias added to the residual by a writer
  unit_bias    a bias on units (q/k/v, FFN neurons, gate heads)
  norm_gain / norm_bias
  head         the untied output head (a reader of the final norm)
  growth_gate  the warm-up gate scalar of a block (only in grown, unfolded checkpoints)

Unit kinds: ``q`` (query heads, block head_dim), ``kv`` (key/value heads, block head_dim),
``qgate`` (one gate logit per query head, block 1), ``ffn`` (FFN neurons, block 1).
A fused tensor (GPT-2's c_attn) lists several kinds: the unit axis is their concatenation.

``group`` picks the recipe section that fills new units / new columns ("attn" or "ffn").
GPT-2 stores Conv1D weights as [in, out]; Llama stores nn.Linear weights as [out, in].
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    pattern: str  # "{i}" stands for the block index
    role: str
    res_axis: int | None = None
    unit_axis: int | None = None
    units: tuple[str, ...] = ()
    group: str | None = None
    norm: str | None = None  # the norm (pattern) feeding this reader
    when: str | None = None  # config flag that must be true for the tensor to exist ("attn_gate", "qkv_bias", "untied", "gated")


@dataclass(frozen=True)
class Family:
    name: str
    norm: str  # "layernorm" | "rmsnorm"
    tensors: tuple[TensorSpec, ...]
    embed: str  # the token embedding (tied head)
    block_prefix: str  # "transformer.h.{i}." - used for the gate name

    def gate_name(self, i: int) -> str:
        return self.block_prefix.format(i=i) + "growth_gate"


T = TensorSpec
_H = "transformer.h.{i}."
GPT2 = Family(
    name="gpt2",
    norm="layernorm",
    embed="transformer.wte.weight",
    block_prefix=_H,
    tensors=(
        T("transformer.wte.weight", "embedding", res_axis=1),
        T("transformer.wpe.weight", "embedding", res_axis=1),
        T(_H + "ln_1.weight", "norm_gain"),
        T(_H + "ln_1.bias", "norm_bias"),
        T(_H + "attn.c_attn.weight", "reader", res_axis=0, unit_axis=1, units=("q", "kv", "kv"), group="attn", norm=_H + "ln_1"),
        T(_H + "attn.c_attn.bias", "unit_bias", unit_axis=0, units=("q", "kv", "kv"), group="attn"),
        T(_H + "attn.c_gate.weight", "reader", res_axis=0, unit_axis=1, units=("qgate",), group="attn", norm=_H + "ln_1", when="attn_gate"),
        T(_H + "attn.c_gate.bias", "unit_bias", unit_axis=0, units=("qgate",), group="attn", when="attn_gate"),
        T(_H + "attn.c_proj.weight", "writer", res_axis=1, unit_axis=0, units=("q",), group="attn"),
        T(_H + "attn.c_proj.bias", "writer_bias", res_axis=0),
        T(_H + "ln_2.weight", "norm_gain"),
        T(_H + "ln_2.bias", "norm_bias"),
        T(_H + "mlp.c_fc.weight", "reader", res_axis=0, unit_axis=1, units=("ffn",), group="ffn", norm=_H + "ln_2"),
        T(_H + "mlp.c_fc.bias", "unit_bias", unit_axis=0, units=("ffn",), group="ffn"),
        T(_H + "mlp.c_proj.weight", "writer", res_axis=1, unit_axis=0, units=("ffn",), group="ffn"),
        T(_H + "mlp.c_proj.bias", "writer_bias", res_axis=0),
        T(_H + "growth_gate", "growth_gate", when="gated"),
        T("transformer.ln_f.weight", "norm_gain"),
        T("transformer.ln_f.bias", "norm_bias"),
        T("lm_head.weight", "head", res_axis=1, norm="transformer.ln_f", when="untied"),
    ),
)

_L = "model.layers.{i}."
LLAMA = Family(
    name="llama",
    norm="rmsnorm",
    embed="model.embed_tokens.weight",
    block_prefix=_L,
    tensors=(
        T("model.embed_tokens.weight", "embedding", res_axis=1),
        T(_L + "input_layernorm.weight", "norm_gain"),
        T(_L + "self_attn.q_proj.weight", "reader", res_axis=1, unit_axis=0, units=("q",), group="attn", norm=_L + "input_layernorm"),
        T(_L + "self_attn.k_proj.weight", "reader", res_axis=1, unit_axis=0, units=("kv",), group="attn", norm=_L + "input_layernorm"),
        T(_L + "self_attn.v_proj.weight", "reader", res_axis=1, unit_axis=0, units=("kv",), group="attn", norm=_L + "input_layernorm"),
        T(_L + "self_attn.q_proj.bias", "unit_bias", unit_axis=0, units=("q",), group="attn", when="qkv_bias"),
        T(_L + "self_attn.k_proj.bias", "unit_bias", unit_axis=0, units=("kv",), group="attn", when="qkv_bias"),
        T(_L + "self_attn.v_proj.bias", "unit_bias", unit_axis=0, units=("kv",), group="attn", when="qkv_bias"),
        T(_L + "self_attn.g_proj.weight", "reader", res_axis=1, unit_axis=0, units=("qgate",), group="attn", norm=_L + "input_layernorm", when="attn_gate"),
        T(_L + "self_attn.o_proj.weight", "writer", res_axis=0, unit_axis=1, units=("q",), group="attn"),
        T(_L + "post_attention_layernorm.weight", "norm_gain"),
        T(_L + "mlp.gate_proj.weight", "reader", res_axis=1, unit_axis=0, units=("ffn",), group="ffn", norm=_L + "post_attention_layernorm"),
        T(_L + "mlp.up_proj.weight", "reader", res_axis=1, unit_axis=0, units=("ffn",), group="ffn", norm=_L + "post_attention_layernorm"),
        T(_L + "mlp.down_proj.weight", "writer", res_axis=0, unit_axis=1, units=("ffn",), group="ffn"),
        T(_L + "growth_gate", "growth_gate", when="gated"),
        T("model.norm.weight", "norm_gain"),
        T("lm_head.weight", "head", res_axis=1, norm="model.norm", when="untied"),
    ),
)

FAMILY = {"gpt2": GPT2, "llama": LLAMA}

# Buffers some HF checkpoints carry that are not weights.
IGNORED = re.compile(r"(^|\.)attn\.(masked_)?bias$|rotary_emb\.inv_freq$")


def unit_count(cfg, kind: str) -> tuple[int, int]:
    """(number of units, elements per unit) of a unit kind under a config."""
    return {
        "q": (cfg.heads, cfg.head_dim),
        "kv": (cfg.kv_heads, cfg.head_dim),
        "qgate": (cfg.heads, 1),
        "ffn": (cfg.ffn, 1),
    }[kind]


def _active(spec: TensorSpec, cfg) -> bool:
    return {
        None: True,
        "attn_gate": cfg.attn_gate,
        "qkv_bias": cfg.qkv_bias,
        "untied": not cfg.tie,
        "gated": cfg.gated,
    }[spec.when]


def tensor_specs(cfg) -> dict[str, TensorSpec]:
    """Every tensor name the config's checkpoint must hold, mapped to its spec (in file order)."""
    fam = FAMILY[cfg.family]
    out: dict[str, TensorSpec] = {}
    for spec in fam.tensors:
        if not _active(spec, cfg):
            continue
        if "{i}" in spec.pattern:
            for i in range(cfg.layers):
                out[spec.pattern.format(i=i)] = spec
        else:
            out[spec.pattern] = spec
    return out


def tensor_shape(name: str, spec: TensorSpec, cfg) -> tuple[int, ...]:
    """The shape a tensor must have under cfg (derived from the spec's axes)."""
    if spec.role == "growth_gate":
        return (1,)
    if spec.role in ("norm_gain", "norm_bias", "writer_bias"):
        return (cfg.width,)
    if spec.role == "embedding":
        rows = cfg.context if name.endswith("wpe.weight") else cfg.vocab_size
        return (rows, cfg.width)
    if spec.role == "head":
        return (cfg.vocab_size, cfg.width)
    units = sum(n * b for n, b in (unit_count(cfg, k) for k in spec.units))
    if spec.role == "unit_bias":
        return (units,)
    shape = [0, 0]
    shape[spec.res_axis] = cfg.width
    shape[spec.unit_axis] = units
    return tuple(shape)


def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    return {n: tensor_shape(n, s, cfg) for n, s in tensor_specs(cfg).items()}
