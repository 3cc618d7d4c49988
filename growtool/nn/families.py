"""Architectures as data: one ``Arch`` per architecture, nothing else knows a family by name.

An architecture is described by
  * ``modules``: the Hugging Face module path of every *slot* (the model's generic name for a
    weight: ``q``, ``o``, ``up``, ``ln1``, ...); block slots are relative to ``block``;
  * ``features``: the facts the forward pass, growth and init read (norm kind, linear layout,
    fused projections, MLP kind, positions, parallel residual, q/k norms, ...);
  * ``keys``: where each ``ModelConfig`` field lives in the HF config.json, ``fixed`` values the
    architecture always has, and ``defaults`` for keys a config may omit.

From these, ``tensor_specs(cfg)`` derives every tensor of a checkpoint with its role and axes:

Roles
  embedding    writes a token/position vector into the residual (residual axis = columns)
  reader       reads the normed residual (``norm`` names the norm whose gain it may absorb)
  writer       writes into the residual from units (residual axis + unit axis)
  writer_bias  a bias added to the residual by a writer
  unit_bias    a bias on units (q/k/v, FFN neurons, gate heads)
  norm_gain / norm_bias
  head_norm    a per-head norm over head_dim (q/k norms): untouched when head_dim is fixed
  unit_norm    a norm over all units at once (OLMo-2's q/k norms over heads x head_dim)
  head         the untied output head (a reader of the final norm)
  head_bias    the output head's bias (vocabulary-sized: kept by growth)
  router       reads the normed residual into a fixed number of logits (MoE router, shared-expert gate)
  act_param    a learned scalar of the block's activation (Apertus' xIELU): kept by width growth
  inner        a tensor on a mixer's inner channels only (Mamba's conv1d, A_log, D, dt_bias, gated norm):
               kept by width growth, copied by depth growth
  growth_gate  the warm-up gate of a block (only in grown, unfolded checkpoints; shape [1])

Unit kinds: ``q`` (query heads, block head_dim), ``kv`` (key/value heads, block head_dim),
``qkv`` (GPT-NeoX: one head's interleaved [q k v], block 3 x head_dim), ``qkvg`` (Falcon: one KV
group's [q_1 .. q_r k v], block (r + 2) x head_dim, grown as the KV groups), ``qgate`` (one gate
logit per query head), ``ffn`` (FFN neurons). A fused tensor lists several kinds: its unit axis
is their concatenation (GPT-2's c_attn and Phi-3's qkv_proj: q, kv, kv; Phi-3's gate_up_proj:
ffn, ffn). ``m_in`` / ``m_inner``: a Mamba mixer's in_proj outputs / inner channels, never grown.
``group`` picks the recipe section that fills new units ("attn" or "ffn").

Adding an architecture: one ``Arch`` entry below (plus its parity test against transformers).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Features:
    norm: str = "rmsnorm"  # "layernorm" (gain + bias) | "rmsnorm" (gain)
    linear: str = "out_in"  # weight layout: "out_in" (nn.Linear) | "in_out" (GPT-2's Conv1D)
    qkv: str = "separate"  # "separate" q/k/v | "concat" [Q|K|V] | "interleaved" per head [q k v]
    #                        | "grouped" per KV group [q_1 .. q_r k v] (Falcon's new decoder architecture)
    mlp: str = "glu"  # "glu" act(gate) * up | "glu_fused" [gate|up] in one tensor | "plain" act(up)
    positions: str = "rope"  # "rope" | "learned" (a position embedding) | "alibi" (a per-head linear score bias, BLOOM)
    qk_norm: str = ""  # "head": RMSNorm on q and k over head_dim, before RoPE (Qwen3, Gemma 3)
    #                    "full": over all heads' width at once, before the reshape (OLMo-2)
    gqa: bool = True  # key/value heads may be fewer than query heads
    free_head_dim: bool = True  # head_dim may differ from width / heads
    norm_offset: float = 0.0  # norms scale by (offset + w): Gemma stores w with gain 1 + w
    embed_scale: bool = False  # embeddings times sqrt(width), rounded to the weights' dtype (Gemma)
    pre_norms: bool = True  # a norm on the residual before each sublayer (its readers' norm)
    post_norms: bool = False  # a norm on each sublayer's output before the residual add (Gemma 2/3, OLMo-2)
    pos_offset: int = 0  # learned positions: position p reads row p + offset (OPT: 2)
    fixed_eps: bool = False  # the norm eps is a constant of the class, not a config key: growth keeps it
    #                          and scales the residual by sqrt(D/d) instead (OPT, OLMo); also where a mixer's
    #                          inner norm shares the key (Mamba's gated norm reads layer_norm_epsilon: Nemotron-H)
    norm_affine: bool = True  # False: LayerNorm without gain or bias (OLMo)
    mqa: bool = False  # one key/value head read by every query head (GPT-BigCode): growth adds query heads only
    shared_norm: bool = False  # one pre-norm (ln1) read by attention and MLP, in parallel (Phi, GPT-J, Cohere)
    head_bias: bool = False  # the output head has a bias (Phi, GPT-J): vocabulary-sized, kept
    head_bias_key: str = ""  # the config key that gives the head a bias (PhiMoE: lm_head_bias)
    routing: str = "softmax"  # MoE routing: "softmax" top-k | "sparsemixer" (PhiMoE's top-2 at inference)
    rope_interleaved: bool = False  # RoPE rotates pairs (2i, 2i + 1), not (i, i + rot/2) (GPT-J)
    norm_bias: bool = True  # False: LayerNorm with a gain and no bias (Cohere)
    embed_norm: bool = False  # a LayerNorm on the embeddings (slot embed_norm): the residual starts as its output,
    #                           so width grows by duplicating the residual (whole factors) or, untied, by a
    #                           refit of the embedding table (any width; grow/plan.py ``copies``) (BLOOM)
    rope_per_type: bool = False  # one RoPE per layer type (Gemma 3): rope_parameters is keyed by layer type, and a
    #                              legacy global rope_scaling applies to the full-attention layers only
    qk_norm_after_rope: bool = False  # the "head" q/k norms are applied to the rotated q and k (HunYuan)
    act_params: tuple = ()  # (name, shape) of the activation's own tensors at slot "act" (Apertus' xIELU: learned
    #                         scalars, one set per block, kept by width growth)
    rope_where: str = ""  # "" every layer | "windowed": only layers with a sliding window (Cohere 2) |
    #                       "windowed_if_any": only sliding layers when the config has a window, else all (EXAONE 4)
    moe: bool = False  # the MLP is a router over experts (slots router, experts, e_gate/e_up/e_down; a shared
    #                    expert s_gate/s_up/s_down with its gate s_router where the config has shared_ffn)
    ssm_version: int = 2  # the Mamba mixer: 2 (Mamba-2, nn/mamba.Mamba2Mixer) or 1 (Mamba, Mamba1Mixer)
    parallel_mixers: bool = False  # a block's Mamba mixer and attention read one norm, their outputs summed (Falcon-H1)
    fixed_dt_min: bool = False  # a Mamba mixer clamps dt at time_step_min (Nemotron-H), not at time_step_limit


@dataclass(frozen=True)
class Arch:
    name: str
    model_type: str
    hf_class: str
    block: str  # "model.layers.{i}."
    modules: dict  # slot -> HF module path
    features: Features
    keys: dict  # ModelConfig field -> HF config key
    fixed: dict = field(default_factory=dict)  # ModelConfig field -> value the architecture always has
    defaults: dict = field(default_factory=dict)  # ModelConfig field -> value when the key is absent
    template: dict = field(default_factory=dict)  # HF keys a fresh config.json carries
    aliases: dict = field(default_factory=dict)  # stored-name prefix rewrites, canonical -> as stored
    refuse: dict = field(default_factory=dict)  # HF key -> reason, refused when truthy
    require: dict = field(default_factory=dict)  # HF key -> (value(s), reason[, value when absent]), else refused
    mirrors: dict = field(default_factory=dict)  # HF key -> ModelConfig field it must equal (written back with it)
    alt_keys: dict = field(default_factory=dict)  # HF key -> another spelling configs use for it (read only)
    window_every: int | None = None  # without layer_types: every n-th layer full, the others sliding (transformers'
    #                                  rule; a config's sliding_window_pattern gives n where it has one)
    kinds: dict = field(default_factory=dict)  # hybrids: block kind (the config's per-layer label, ModelConfig.
    #   block_types) -> the sublayers such a block runs in order, each read through a pre-norm and added to the
    #   residual: "attention" (ln1), "mamba" (ln1, nn/mamba.py), "mlp" (ln2); {} is every block ("attention", "mlp")
    kind_codes: dict = field(default_factory=dict)  # kind -> its character in a legacy pattern string (Nemotron-H)
    kind_default: str = ""  # the kind of every block where the config lists none (Mamba-2: all "mamba")
    ssm_keys: dict = field(default_factory=dict)  # Mamba mixer field (ModelConfig.ssm) -> HF key
    mult_keys: dict = field(default_factory=dict)  # muP scalar (ModelConfig.multipliers) -> HF key (Falcon-H1)

    @property
    def embed(self) -> str:
        return self.modules["embed"] + ".weight"

    @property
    def blocks_path(self) -> str:
        return self.block.split(".{i}")[0]

    def gate_name(self, i: int) -> str:
        return self.block.format(i=i) + "growth_gate"


_LLAMA_KEYS = {
    "vocab_size": "vocab_size",
    "width": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "ffn": "intermediate_size",
    "context": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "tie": "tie_word_embeddings",
    "activation": "hidden_act",
}
_LLAMA_MODULES = {
    "embed": "model.embed_tokens",
    "final_norm": "model.norm",
    "head": "lm_head",
    "ln1": "input_layernorm",
    "ln2": "post_attention_layernorm",
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "g": "self_attn.g_proj",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}

GPT2 = Arch(
    name="gpt2",
    model_type="gpt2",
    hf_class="GPT2LMHeadModel",
    block="transformer.h.{i}.",
    modules={
        "embed": "transformer.wte",
        "pos": "transformer.wpe",
        "final_norm": "transformer.ln_f",
        "head": "lm_head",
        "ln1": "ln_1",
        "ln2": "ln_2",
        "qkv": "attn.c_attn",
        "o": "attn.c_proj",
        "g": "attn.c_gate",
        "up": "mlp.c_fc",
        "down": "mlp.c_proj",
    },
    features=Features(
        norm="layernorm",
        linear="in_out",
        qkv="concat",
        mlp="plain",
        positions="learned",
        gqa=False,
        free_head_dim=False,
    ),
    keys={
        "vocab_size": "vocab_size",
        "width": "n_embd",
        "layers": "n_layer",
        "heads": "n_head",
        "ffn": "n_inner",
        "context": "n_positions",
        "norm_eps": "layer_norm_epsilon",
        "tie": "tie_word_embeddings",
        "activation": "activation_function",
    },
    fixed={"qkv_bias": True, "o_bias": True, "mlp_bias": True},
    defaults={"activation": "gelu_new", "tie": True, "context": 1024, "norm_eps": 1e-5},
    template={
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
    },
    aliases={"transformer.": ""},  # Hub files store GPT-2 keys without the "transformer." prefix
    refuse={
        "scale_attn_by_inverse_layer_idx": "gpt2 scale_attn_by_inverse_layer_idx is not supported",
        "reorder_and_upcast_attn": "gpt2 reorder_and_upcast_attn is not supported",
    },
)

LLAMA = Arch(
    name="llama",
    model_type="llama",
    hf_class="LlamaForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": "mlp_bias"},
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-6},
)

MISTRAL = Arch(
    name="mistral",
    model_type="mistral",
    hf_class="MistralForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(),
    keys={**_LLAMA_KEYS, "sliding_window": "sliding_window"},
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6},
)

QWEN2 = Arch(
    name="qwen2",
    model_type="qwen2",
    hf_class="Qwen2ForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(),
    keys={**_LLAMA_KEYS, "sliding_window": "sliding_window", "layer_types": "layer_types"},
    fixed={"qkv_bias": True, "o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6},
)

QWEN3 = Arch(
    name="qwen3",
    model_type="qwen3",
    hf_class="Qwen3ForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(qk_norm="head"),
    keys={
        **_LLAMA_KEYS,
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
    },
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6},
)

PHI3 = Arch(
    name="phi3",
    model_type="phi3",
    hf_class="Phi3ForCausalLM",
    block="model.layers.{i}.",
    modules={
        "embed": "model.embed_tokens",
        "final_norm": "model.norm",
        "head": "lm_head",
        "ln1": "input_layernorm",
        "ln2": "post_attention_layernorm",
        "qkv": "self_attn.qkv_proj",
        "o": "self_attn.o_proj",
        "g": "self_attn.g_proj",
        "gate_up": "mlp.gate_up_proj",
        "down": "mlp.down_proj",
    },
    features=Features(qkv="concat", mlp="glu_fused"),
    keys={**_LLAMA_KEYS, "sliding_window": "sliding_window"},
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-5},
    # pad_token_id: Phi3Config defaults to 32000, which a smaller vocabulary cannot hold (transformers refuses it)
    template={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "pad_token_id": None},
)

GPT_NEOX = Arch(
    name="gpt_neox",
    model_type="gpt_neox",
    hf_class="GPTNeoXForCausalLM",
    block="gpt_neox.layers.{i}.",
    modules={
        "embed": "gpt_neox.embed_in",
        "final_norm": "gpt_neox.final_layer_norm",
        "head": "embed_out",
        "ln1": "input_layernorm",
        "ln2": "post_attention_layernorm",
        "qkv": "attention.query_key_value",
        "o": "attention.dense",
        "g": "attention.g_proj",
        "up": "mlp.dense_h_to_4h",
        "down": "mlp.dense_4h_to_h",
    },
    features=Features(norm="layernorm", qkv="interleaved", mlp="plain", gqa=False, free_head_dim=False),
    keys={
        "vocab_size": "vocab_size",
        "width": "hidden_size",
        "layers": "num_hidden_layers",
        "heads": "num_attention_heads",
        "ffn": "intermediate_size",
        "context": "max_position_embeddings",
        "norm_eps": "layer_norm_eps",
        "tie": "tie_word_embeddings",
        "activation": "hidden_act",
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "parallel": "use_parallel_residual",
    },
    fixed={"mlp_bias": True},
    defaults={
        "activation": "gelu",
        "tie": False,
        "context": 2048,
        "norm_eps": 1e-5,
        "qkv_bias": True,
        "o_bias": True,
        "parallel": True,
        "rotary_fraction": 0.25,
    },
    template={"hidden_dropout": 0.0, "attention_dropout": 0.0},
)

STARCODER2 = Arch(
    name="starcoder2",
    model_type="starcoder2",
    hf_class="Starcoder2ForCausalLM",
    block="model.layers.{i}.",
    modules={**_LLAMA_MODULES, "up": "mlp.c_fc", "down": "mlp.c_proj"},
    features=Features(norm="layernorm", mlp="plain"),
    keys={
        **_LLAMA_KEYS,
        "norm_eps": "norm_epsilon",
        "qkv_bias": "use_bias",
        "o_bias": "use_bias",
        "mlp_bias": "use_bias",
        "sliding_window": "sliding_window",
    },
    defaults={
        "activation": "gelu_pytorch_tanh",
        "tie": True,
        "context": 4096,
        "norm_eps": 1e-5,
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
    },
    template={"residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0},
)

_GEMMA_SANDWICH = {
    **_LLAMA_MODULES,
    "post_attn": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "post_ffn": "post_feedforward_layernorm",
}
_GEMMA_KEYS = {
    **_LLAMA_KEYS,
    "activation": "hidden_activation",
    "qkv_bias": "attention_bias",
    "o_bias": "attention_bias",
    "sliding_window": "sliding_window",
    "layer_types": "layer_types",
    "attn_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
}
_GEMMA_DEFAULTS = {"activation": "gelu_pytorch_tanh", "tie": True, "context": 8192, "norm_eps": 1e-6}

GEMMA = Arch(
    name="gemma",
    model_type="gemma",
    hf_class="GemmaForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(norm_offset=1.0, embed_scale=True),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_bias"},
    fixed={"mlp_bias": False},
    defaults=_GEMMA_DEFAULTS,
)

GEMMA2 = Arch(
    name="gemma2",
    model_type="gemma2",
    hf_class="Gemma2ForCausalLM",
    block="model.layers.{i}.",
    modules=_GEMMA_SANDWICH,
    features=Features(norm_offset=1.0, embed_scale=True, post_norms=True),
    keys=_GEMMA_KEYS,
    fixed={"mlp_bias": False},
    defaults=_GEMMA_DEFAULTS,
    window_every=2,
)

GEMMA3 = Arch(
    name="gemma3_text",
    model_type="gemma3_text",
    hf_class="Gemma3ForCausalLM",
    block="model.layers.{i}.",
    modules=_GEMMA_SANDWICH,
    features=Features(norm_offset=1.0, embed_scale=True, post_norms=True, qk_norm="head", rope_per_type=True),
    keys=_GEMMA_KEYS,
    fixed={"mlp_bias": False},
    defaults=_GEMMA_DEFAULTS,
    window_every=6,
)

OLMO2 = Arch(
    name="olmo2",
    model_type="olmo2",
    hf_class="Olmo2ForCausalLM",
    block="model.layers.{i}.",
    modules={
        **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("ln1", "ln2")},
        "post_attn": "post_attention_layernorm",
        "post_ffn": "post_feedforward_layernorm",
    },
    features=Features(pre_norms=False, post_norms=True, qk_norm="full"),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_bias"},
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-6},
)

OPT = Arch(
    name="opt",
    model_type="opt",
    hf_class="OPTForCausalLM",
    block="model.decoder.layers.{i}.",
    modules={
        "embed": "model.decoder.embed_tokens",
        "pos": "model.decoder.embed_positions",
        "final_norm": "model.decoder.final_layer_norm",
        "head": "lm_head",
        "ln1": "self_attn_layer_norm",
        "ln2": "final_layer_norm",
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.out_proj",
        "g": "self_attn.g_proj",
        "up": "fc1",
        "down": "fc2",
    },
    features=Features(
        norm="layernorm", mlp="plain", positions="learned", gqa=False, free_head_dim=False, pos_offset=2, fixed_eps=True
    ),
    keys={
        "vocab_size": "vocab_size",
        "width": "hidden_size",
        "layers": "num_hidden_layers",
        "heads": "num_attention_heads",
        "ffn": "ffn_dim",
        "context": "max_position_embeddings",
        "tie": "tie_word_embeddings",
        "activation": "activation_function",
        "qkv_bias": "enable_bias",
        "o_bias": "enable_bias",
        "mlp_bias": "enable_bias",
    },
    defaults={
        "activation": "relu",
        "tie": True,
        "context": 2048,
        "norm_eps": 1e-5,  # nn.LayerNorm's default: not in config.json
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
    },
    template={"dropout": 0.0, "attention_dropout": 0.0, "layerdrop": 0.0},
    refuse={"_remove_final_layer_norm": "opt _remove_final_layer_norm is not supported"},
    require={
        "do_layer_norm_before": (
            True,
            "opt with do_layer_norm_before=false (post-LayerNorm, as OPT-350m) is not supported: its residual "
            "is a LayerNorm output, which a zero-padded or rotated residual cannot reproduce",
        ),
        "layer_norm_elementwise_affine": (True, "opt with layer_norm_elementwise_affine=false is not supported"),
    },
    mirrors={"word_embed_proj_dim": "width"},  # project_in / project_out exist only when they differ
)

OLMO = Arch(
    name="olmo",
    model_type="olmo",
    hf_class="OlmoForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(norm="layernorm", norm_affine=False, fixed_eps=True),
    keys={
        **{k: v for k, v in _LLAMA_KEYS.items() if k != "norm_eps"},  # OlmoLayerNorm: eps 1e-5 in code
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "clip_qkv": "clip_qkv",
    },
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-5},
)

GPT_BIGCODE = Arch(
    name="gpt_bigcode",
    model_type="gpt_bigcode",
    hf_class="GPTBigCodeForCausalLM",
    block="transformer.h.{i}.",
    modules={**GPT2.modules},
    features=Features(norm="layernorm", qkv="concat", mlp="plain", positions="learned", free_head_dim=False, mqa=True),
    keys={**GPT2.keys},
    fixed={"qkv_bias": True, "o_bias": True, "mlp_bias": True},
    defaults={"kv_heads": 1, "activation": "gelu_pytorch_tanh", "tie": True, "context": 1024, "norm_eps": 1e-5},
    template={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "multi_query": True},
    refuse={"add_cross_attention": "gpt_bigcode add_cross_attention is not supported"},
    require={
        "multi_query": (True, "gpt_bigcode with multi_query=false (per-head interleaved q, k, v) is not supported"),
        "scale_attn_weights": (True, "gpt_bigcode with scale_attn_weights=false is not supported"),
    },
)

GRANITE = Arch(
    name="granite",
    model_type="granite",
    hf_class="GraniteForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(),
    keys={
        **LLAMA.keys,
        **{k: k for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")},
    },
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-6},
)

PHI = Arch(
    name="phi",
    model_type="phi",
    hf_class="PhiForCausalLM",
    block="model.layers.{i}.",
    modules={
        "embed": "model.embed_tokens",
        "final_norm": "model.final_layernorm",
        "head": "lm_head",
        "ln1": "input_layernorm",
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.dense",
        "g": "self_attn.g_proj",
        "up": "mlp.fc1",
        "down": "mlp.fc2",
    },
    features=Features(norm="layernorm", mlp="plain", shared_norm=True, head_bias=True),
    keys={**_LLAMA_KEYS, "norm_eps": "layer_norm_eps"},
    fixed={"qkv_bias": True, "o_bias": True, "mlp_bias": True, "parallel": True},
    defaults={"activation": "gelu_new", "tie": False, "context": 2048, "norm_eps": 1e-5, "rotary_fraction": 0.5},
    template={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0},
    require={"qk_layernorm": (False, "phi with qk_layernorm=true is not supported")},
)

GPTJ = Arch(
    name="gptj",
    model_type="gptj",
    hf_class="GPTJForCausalLM",
    block="transformer.h.{i}.",
    modules={
        "embed": "transformer.wte",
        "final_norm": "transformer.ln_f",
        "head": "lm_head",
        "ln1": "ln_1",
        "q": "attn.q_proj",
        "k": "attn.k_proj",
        "v": "attn.v_proj",
        "o": "attn.out_proj",
        "g": "attn.g_proj",
        "up": "mlp.fc_in",
        "down": "mlp.fc_out",
    },
    features=Features(
        norm="layernorm",
        mlp="plain",
        gqa=False,
        free_head_dim=False,
        shared_norm=True,
        head_bias=True,
        rope_interleaved=True,
    ),
    keys={**GPT2.keys},
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": True, "parallel": True},
    defaults={"activation": "gelu_new", "tie": False, "context": 2048, "norm_eps": 1e-5},
    template={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
)

COHERE = Arch(
    name="cohere",
    model_type="cohere",
    hf_class="CohereForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(norm="layernorm", norm_bias=False, shared_norm=True, rope_interleaved=True),
    keys={
        **_LLAMA_KEYS,
        "norm_eps": "layer_norm_eps",
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "logit_scale": "logit_scale",
    },
    fixed={"mlp_bias": False, "parallel": True},
    defaults={"activation": "silu", "tie": True, "context": 8192, "norm_eps": 1e-5},
    require={"use_qk_norm": (False, "cohere with use_qk_norm=true is not supported")},
)

FALCON = Arch(
    name="falcon",
    model_type="falcon",
    hf_class="FalconForCausalLM",
    block="transformer.h.{i}.",
    modules={
        "embed": "transformer.word_embeddings",
        "final_norm": "transformer.ln_f",
        "head": "lm_head",
        "ln1": "ln_attn",
        "ln2": "ln_mlp",
        "qkv": "self_attention.query_key_value",
        "o": "self_attention.dense",
        "g": "self_attention.g_proj",
        "up": "mlp.dense_h_to_4h",
        "down": "mlp.dense_4h_to_h",
    },
    features=Features(norm="layernorm", qkv="grouped", mlp="plain", free_head_dim=False),
    keys={
        **{k: v for k, v in _LLAMA_KEYS.items() if k not in ("head_dim", "ffn", "activation")},
        "kv_heads": "num_kv_heads",
        "ffn": "ffn_hidden_size",
        "norm_eps": "layer_norm_epsilon",
        "activation": "activation",
        "qkv_bias": "bias",
        "o_bias": "bias",
        "mlp_bias": "bias",
    },
    fixed={"parallel": True},
    defaults={"activation": "gelu", "tie": True, "context": 2048, "norm_eps": 1e-5, "qkv_bias": False},
    template={"hidden_dropout": 0.0, "attention_dropout": 0.0},
    require={
        "new_decoder_architecture": (
            True,
            "falcon without new_decoder_architecture (Falcon-7B/RW layouts) is not supported",
            False,
        ),
        "parallel_attn": (True, "falcon with parallel_attn=false is not supported"),
        "num_ln_in_parallel_attn": ((None, 2), "falcon with num_ln_in_parallel_attn=1 is not supported"),
        "alibi": (False, "falcon with alibi is not supported"),
    },
)

_MOE_MODULES = {
    **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("gate", "up", "down")},
    "router": "mlp.gate",
    "experts": "mlp.experts",
    "e_gate": "gate_proj",
    "e_up": "up_proj",
    "e_down": "down_proj",
    "s_gate": "mlp.shared_expert.gate_proj",
    "s_up": "mlp.shared_expert.up_proj",
    "s_down": "mlp.shared_expert.down_proj",
    "s_router": "mlp.shared_expert_gate",
}
_MOE_KEYS = {
    **_LLAMA_KEYS,
    "ffn": "moe_intermediate_size",
    "experts": "num_experts",
    "top_k": "num_experts_per_tok",
    "norm_topk": "norm_topk_prob",
}
_SPARSE_EVERY_LAYER = {  # Qwen MoE: dense MLPs in some layers are not supported
    "decoder_sparse_step": (1, "a decoder_sparse_step other than 1 (dense MLP layers) is not supported"),
    "mlp_only_layers": ((None, []), "mlp_only_layers (dense MLP layers) are not supported"),
}

MIXTRAL = Arch(
    name="mixtral",
    model_type="mixtral",
    hf_class="MixtralForCausalLM",
    block="model.layers.{i}.",
    modules={
        **_MOE_MODULES,
        "router": "block_sparse_moe.gate",
        "experts": "block_sparse_moe.experts",
        "e_gate": "w1",
        "e_up": "w3",
        "e_down": "w2",
    },
    features=Features(moe=True),
    keys={
        **_LLAMA_KEYS,
        "experts": "num_local_experts",
        "top_k": "num_experts_per_tok",
        "sliding_window": "sliding_window",
    },
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False, "norm_topk": True},
    defaults={"activation": "silu", "tie": False, "context": 4096 * 32, "norm_eps": 1e-5},
)

QWEN2_MOE = Arch(
    name="qwen2_moe",
    model_type="qwen2_moe",
    hf_class="Qwen2MoeForCausalLM",
    block="model.layers.{i}.",
    modules=_MOE_MODULES,
    features=Features(moe=True),
    keys={
        **_MOE_KEYS,
        "shared_ffn": "shared_expert_intermediate_size",
        "qkv_bias": "qkv_bias",
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
    },
    fixed={"o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6, "qkv_bias": True},
    require=_SPARSE_EVERY_LAYER,
)

QWEN3_MOE = Arch(
    name="qwen3_moe",
    model_type="qwen3_moe",
    hf_class="Qwen3MoeForCausalLM",
    block="model.layers.{i}.",
    modules=_MOE_MODULES,
    features=Features(moe=True, qk_norm="head"),
    keys={
        **_MOE_KEYS,
        "experts": "num_local_experts",  # transformers writes this; Hub configs say num_experts
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
    },
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6},
    require=_SPARSE_EVERY_LAYER,
    alt_keys={"num_local_experts": "num_experts"},
)

OLMOE = Arch(
    name="olmoe",
    model_type="olmoe",
    hf_class="OlmoeForCausalLM",
    block="model.layers.{i}.",
    modules=_MOE_MODULES,
    features=Features(moe=True, qk_norm="full"),
    keys={
        **_MOE_KEYS,
        "ffn": "intermediate_size",
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "clip_qkv": "clip_qkv",
    },
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-5},
)

SMOLLM3 = Arch(
    name="smollm3",
    model_type="smollm3",
    hf_class="SmolLM3ForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(),
    keys={
        **LLAMA.keys,
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
        "rope_layers": "no_rope_layers",
    },
    defaults={"activation": "silu", "tie": True, "context": 32768, "norm_eps": 1e-6},
)

BLOOM = Arch(
    name="bloom",
    model_type="bloom",
    hf_class="BloomForCausalLM",
    block="transformer.h.{i}.",
    modules={
        "embed": "transformer.word_embeddings",
        "embed_norm": "transformer.word_embeddings_layernorm",
        "final_norm": "transformer.ln_f",
        "head": "lm_head",
        "ln1": "input_layernorm",
        "ln2": "post_attention_layernorm",
        "qkv": "self_attention.query_key_value",
        "o": "self_attention.dense",
        "g": "self_attention.g_proj",
        "up": "mlp.dense_h_to_4h",
        "down": "mlp.dense_4h_to_h",
    },
    features=Features(
        norm="layernorm",
        qkv="interleaved",
        mlp="plain",
        positions="alibi",
        gqa=False,
        free_head_dim=False,
        embed_norm=True,
    ),
    keys={  # no ffn key: the MLP is 4 x hidden_size in code; no context: ALiBi has no table
        "vocab_size": "vocab_size",
        "width": "hidden_size",
        "layers": "n_layer",
        "heads": "n_head",
        "norm_eps": "layer_norm_epsilon",
        "tie": "tie_word_embeddings",
    },
    fixed={"qkv_bias": True, "o_bias": True, "mlp_bias": True, "activation": "bloom_gelu", "parallel": False},
    defaults={"tie": True, "context": 2048, "norm_eps": 1e-5},
    template={"hidden_dropout": 0.0, "attention_dropout": 0.0},
    require={
        "apply_residual_connection_post_layernorm": (
            False,
            "bloom with apply_residual_connection_post_layernorm=true (a LayerNorm output residual) is not supported",
        ),
    },
    alt_keys={"hidden_size": "n_embed", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads"},
)

# ---- the families of 2025-2026 (issue 44) ---------------------------------------------------
# Aliases: another model_type (and, for EXAONE 3.5, other tensor names) for a function growtool has.

INTERNLM3 = dataclasses.replace(LLAMA, name="internlm3", model_type="internlm3", hf_class="LlamaForCausalLM")

EXAONE = Arch(
    name="exaone",
    model_type="exaone",
    hf_class="LlamaForCausalLM",  # transformers loads EXAONE 3.5 as Llama, renaming its tensors
    block="transformer.h.{i}.",
    modules={
        "embed": "transformer.wte",
        "final_norm": "transformer.ln_f",
        "head": "lm_head",
        "ln1": "ln_1",
        "ln2": "ln_2",
        "q": "attn.attention.q_proj",
        "k": "attn.attention.k_proj",
        "v": "attn.attention.v_proj",
        "o": "attn.attention.out_proj",
        "g": "attn.attention.g_proj",
        "gate": "mlp.c_fc_0",
        "up": "mlp.c_fc_1",
        "down": "mlp.c_proj",
    },
    features=Features(),
    keys=LLAMA.keys,
    defaults={"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-5},
    alt_keys={  # the Hub's EXAONE 3.5 config.json spelling
        "num_hidden_layers": "num_layers",
        "rms_norm_eps": "layer_norm_epsilon",
        "hidden_act": "activation_function",
    },
)

SEED_OSS = Arch(
    name="seed_oss",
    model_type="seed_oss",
    hf_class="SeedOssForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_out_bias", "mlp_bias": "mlp_bias"},
    defaults={"activation": "silu", "tie": False, "context": 524288, "norm_eps": 1e-6, "qkv_bias": True},
    template={"attention_dropout": 0.0, "residual_dropout": 0.0},
)

MINISTRAL = dataclasses.replace(
    MISTRAL,
    name="ministral",
    model_type="ministral",
    hf_class="MinistralForCausalLM",
    keys={**MISTRAL.keys, "layer_types": "layer_types"},
)

# Close kin: a function growtool has, with one or two known features combined otherwise.

MINISTRAL3 = dataclasses.replace(
    MISTRAL,
    name="ministral3",
    model_type="ministral3",
    hf_class="Ministral3ForCausalLM",  # queries scaled by position (RoPE's llama_4_scaling_beta): nn/model.py
    defaults={**MISTRAL.defaults, "context": 262144},
)

HELIUM = Arch(
    name="helium",
    model_type="helium",
    hf_class="HeliumForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(rope_interleaved=True, free_head_dim=False),  # o_proj is hidden x hidden
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "mlp_bias": "mlp_bias"},
    fixed={"o_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-8},
)

ERNIE4_5 = Arch(
    name="ernie4_5",
    model_type="ernie4_5",
    hf_class="Ernie4_5ForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(rope_interleaved=True),
    keys={**_LLAMA_KEYS, "qkv_bias": "use_bias", "o_bias": "use_bias", "mlp_bias": "use_bias"},
    defaults={"activation": "silu", "tie": True, "context": 131072, "norm_eps": 1e-5},
)

OLMO3 = dataclasses.replace(
    OLMO2,
    name="olmo3",
    model_type="olmo3",
    hf_class="Olmo3ForCausalLM",
    features=dataclasses.replace(OLMO2.features, rope_per_type=True),
    keys={**OLMO2.keys, "sliding_window": "sliding_window", "layer_types": "layer_types"},
    window_every=4,
)

EXAONE4 = Arch(
    name="exaone4",
    model_type="exaone4",
    hf_class="Exaone4ForCausalLM",
    block="model.layers.{i}.",
    modules=OLMO2.modules,
    features=Features(pre_norms=False, post_norms=True, qk_norm="head", rope_where="windowed_if_any"),
    keys={**_LLAMA_KEYS, "sliding_window": "sliding_window", "layer_types": "layer_types"},
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-5},
    window_every=4,
)

COHERE2 = dataclasses.replace(
    COHERE,
    name="cohere2",
    model_type="cohere2",
    hf_class="Cohere2ForCausalLM",
    features=dataclasses.replace(COHERE.features, free_head_dim=False, rope_where="windowed"),
    keys={**COHERE.keys, "sliding_window": "sliding_window", "layer_types": "layer_types"},
    require={},
    window_every=4,
)

VAULTGEMMA = Arch(
    name="vaultgemma",
    model_type="vaultgemma",
    hf_class="VaultGemmaForCausalLM",
    block="model.layers.{i}.",
    modules={**_LLAMA_MODULES, "ln2": "pre_feedforward_layernorm"},
    features=Features(norm_offset=1.0, embed_scale=True),
    keys=_GEMMA_KEYS,
    fixed={"mlp_bias": False},
    defaults=_GEMMA_DEFAULTS,
    window_every=2,
)

STABLELM = Arch(
    name="stablelm",
    model_type="stablelm",
    hf_class="StableLmForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(norm="layernorm", free_head_dim=False),
    keys={**_LLAMA_KEYS, "norm_eps": "layer_norm_eps", "qkv_bias": "use_qkv_bias"},
    fixed={"o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-5, "rotary_fraction": 0.25},
    template={"hidden_dropout": 0.0, "attention_dropout": 0.0},
    require={
        "use_parallel_residual": (False, "stablelm with use_parallel_residual=true is not supported"),
        "qk_layernorm": (False, "stablelm with qk_layernorm=true (a LayerNorm per head) is not supported"),
    },
)

# One new mechanism each.

ARCEE = Arch(
    name="arcee",
    model_type="arcee",
    hf_class="ArceeForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(mlp="plain"),  # up -> ReLU^2 -> down, no gate
    keys=LLAMA.keys,
    defaults={"activation": "relu2", "tie": False, "context": 4096, "norm_eps": 1e-5},
)

NEMOTRON = Arch(
    name="nemotron",
    model_type="nemotron",
    hf_class="NemotronForCausalLM",
    block="model.layers.{i}.",
    modules=_LLAMA_MODULES,
    features=Features(norm="layernorm", norm_offset=1.0, mlp="plain"),  # LayerNorm1P: gain 1 + w; ReLU^2
    keys={**LLAMA.keys, "norm_eps": "norm_eps"},
    defaults={"activation": "relu2", "tie": False, "context": 4096, "norm_eps": 1e-5, "rotary_fraction": 0.5},
)

HUNYUAN_DENSE = Arch(
    name="hunyuan_v1_dense",
    model_type="hunyuan_v1_dense",
    hf_class="HunYuanDenseV1ForCausalLM",
    block="model.layers.{i}.",
    modules={**_LLAMA_MODULES, "q_norm": "self_attn.query_layernorm", "k_norm": "self_attn.key_layernorm"},
    features=Features(qk_norm="head", qk_norm_after_rope=True),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_bias"},
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-5},
)

APERTUS = Arch(
    name="apertus",
    model_type="apertus",
    hf_class="ApertusForCausalLM",
    block="model.layers.{i}.",
    modules={
        **_LLAMA_MODULES,
        "ln1": "attention_layernorm",
        "ln2": "feedforward_layernorm",
        "act": "mlp.act_fn",
    },
    features=Features(
        mlp="plain",  # up -> xIELU -> down
        qk_norm="head",
        act_params=(("alpha_p", (1,)), ("alpha_n", (1,)), ("beta", ()), ("eps", ())),
    ),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_bias"},
    fixed={"mlp_bias": False},
    defaults={"activation": "xielu", "tie": False, "context": 65536, "norm_eps": 1e-5},
)

PHIMOE = Arch(
    name="phimoe",
    model_type="phimoe",
    hf_class="PhimoeForCausalLM",
    block="model.layers.{i}.",
    modules=MIXTRAL.modules,  # stored as Mixtral (the router as block_sparse_moe.gate)
    features=Features(norm="layernorm", moe=True, routing="sparsemixer", head_bias_key="lm_head_bias"),
    keys={
        **MIXTRAL.keys,
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "router_jitter": "router_jitter_noise",
    },
    fixed={"mlp_bias": False, "norm_topk": False},
    defaults={"activation": "silu", "tie": False, "context": 131072, "norm_eps": 1e-5, "router_jitter": 0.01},
    require={"num_experts_per_tok": (2, "phimoe's sparsemixer routes to exactly 2 experts", 2)},
)

_GLM_MODULES = {
    **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("gate", "up")},
    "gate_up": "mlp.gate_up_proj",
}
_GLM_KEYS = {**_LLAMA_KEYS, "qkv_bias": "attention_bias"}

GLM = Arch(
    name="glm",
    model_type="glm",
    hf_class="GlmForCausalLM",
    block="model.layers.{i}.",
    modules=_GLM_MODULES,
    features=Features(mlp="glu_fused", rope_interleaved=True),  # [gate | up] in one tensor; partial pair RoPE
    keys=_GLM_KEYS,
    fixed={"o_bias": False, "mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 131072, "norm_eps": 1.5625e-07, "rotary_fraction": 0.5},
)

GLM4 = dataclasses.replace(
    GLM,
    name="glm4",
    model_type="glm4",
    hf_class="Glm4ForCausalLM",
    modules={
        **_GLM_MODULES,
        "post_attn": "post_self_attn_layernorm",
        "ln2": "post_attention_layernorm",  # the norm before the MLP, despite its name
        "post_ffn": "post_mlp_layernorm",
    },
    features=Features(mlp="glu_fused", rope_interleaved=True, post_norms=True),  # sandwich norms
)

_NEMOTRON_H_SSM = {
    "heads": "mamba_num_heads",
    "head_dim": "mamba_head_dim",
    "state": "ssm_state_size",
    "groups": "n_groups",
    "conv": "conv_kernel",
    "conv_bias": "use_conv_bias",
    "bias": "use_bias",  # in_proj and out_proj (mamba_proj_bias is read by nothing)
    "dt_min": "time_step_min",
}

# Nemotron-H: every block is one norm and one mixer (Mamba-2, attention without positions, or a ReLU^2 MLP)
NEMOTRON_H = Arch(
    name="nemotron_h",
    model_type="nemotron_h",
    hf_class="NemotronHForCausalLM",
    block="backbone.layers.{i}.",  # as transformers saves it (and the Hub stores it)
    modules={
        "embed": "backbone.embeddings",
        "final_norm": "backbone.norm_f",
        "head": "lm_head",
        "ln1": "norm",
        "ln2": "norm",  # an MLP block's one norm: each block has one sublayer
        "mamba": "mixer",
        "q": "mixer.q_proj",
        "k": "mixer.k_proj",
        "v": "mixer.v_proj",
        "o": "mixer.o_proj",
        "g": "mixer.g_proj",
        "up": "mixer.up_proj",
        "down": "mixer.down_proj",
    },
    features=Features(positions="none", mlp="plain", fixed_eps=True, fixed_dt_min=True),
    keys={
        **{k: v for k, v in _LLAMA_KEYS.items() if k not in ("norm_eps", "tie")},  # never tied (transformers
        #   unties lm_head whatever tie_word_embeddings says)
        "norm_eps": "layer_norm_epsilon",
        "activation": "mlp_hidden_act",
        "mlp_bias": "mlp_bias",
        "block_types": "layers_block_type",
    },
    fixed={"qkv_bias": False, "o_bias": False},  # q/k/v/o are built without bias whatever attention_bias says
    defaults={"activation": "relu2", "tie": False, "context": 4096, "norm_eps": 1e-5},
    kinds={"linear_attention": ("mamba",), "full_attention": ("attention",), "mlp": ("mlp",)}
    | {"mamba": ("mamba",), "attention": ("attention",)},  # the 4.x labels (transformers remaps them)
    kind_codes={"mamba": "M", "attention": "*", "linear_attention": "M", "full_attention": "*", "mlp": "-"},
    ssm_keys=_NEMOTRON_H_SSM,
    require={
        "mamba_hidden_act": ("silu", "nemotron_h's Mamba mixer is supported with mamba_hidden_act silu only", "silu"),
        "num_nextn_predict_layers": (0, "nemotron_h's multi-token prediction layers are not supported", 0),
    },
)

# Mamba-2: every block one RMSNorm and one Mamba-2 mixer, no attention, no MLP; the mixer's inner width is
# expand x hidden_size (an integer), so width growth grows each mixer head's channels (grow/mixer.py)
MAMBA2 = Arch(
    name="mamba2",
    model_type="mamba2",
    hf_class="Mamba2ForCausalLM",
    block="backbone.layers.{i}.",
    modules={"embed": "backbone.embeddings", "final_norm": "backbone.norm_f", "head": "lm_head", "ln1": "norm"}
    | {"mamba": "mixer"},
    features=Features(positions="none"),
    keys={
        "vocab_size": "vocab_size",
        "width": "hidden_size",
        "layers": "num_hidden_layers",
        "norm_eps": "layer_norm_epsilon",
        "tie": "tie_word_embeddings",
    },
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False},
    defaults={"heads": 1, "tie": False, "context": 2048, "norm_eps": 1e-5},  # no attention: one nominal head
    kinds={"mamba": ("mamba",)},
    kind_default="mamba",
    ssm_keys={
        "heads": "num_heads",
        "head_dim": "head_dim",
        "state": "state_size",
        "groups": "n_groups",
        "conv": "conv_kernel",
        "conv_bias": "use_conv_bias",
        "bias": "use_bias",
        "dt_limit": "time_step_limit",
        "expand": "expand",  # inner width = expand x hidden_size
    },
    require={"hidden_act": ("silu", "mamba2 is supported with hidden_act silu only (the mixer's activation)", "silu")},
)

# Granite 4 hybrids (dense): a Mamba-2 mixer or attention without positions, then the shared MLP (input_linear
# = [gate | up]), each sublayer's output x residual_multiplier; Granite's other scalars; inner = expand x width
GRANITE_HYBRID = Arch(
    name="granitemoehybrid",
    model_type="granitemoehybrid",
    hf_class="GraniteMoeHybridForCausalLM",
    block="model.layers.{i}.",
    modules={
        **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("gate", "up", "down")},
        "mamba": "mamba",
        "gate_up": "shared_mlp.input_linear",
        "down": "shared_mlp.output_linear",
    },
    features=Features(positions="none", mlp="glu_fused"),
    keys={
        **{k: v for k, v in GRANITE.keys.items() if k not in ("mlp_bias", "ffn")},
        "ffn": "shared_intermediate_size",
        "block_types": "layer_types",
    },
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-6},
    kinds={"linear_attention": ("mamba", "mlp"), "full_attention": ("attention", "mlp")}
    | {"mamba": ("mamba", "mlp"), "attention": ("attention", "mlp")},  # the 4.x labels (transformers remaps them)
    kind_default="linear_attention",  # transformers' default: every block a Mamba mixer
    template={"num_local_experts": 0},  # a config made here is dense (transformers' default has 8 experts)
    ssm_keys={
        "heads": "mamba_n_heads",
        "head_dim": "mamba_d_head",
        "state": "mamba_d_state",
        "groups": "mamba_n_groups",
        "conv": "mamba_d_conv",
        "conv_bias": "mamba_conv_bias",
        "bias": "mamba_proj_bias",
        "dt_limit": "time_step_limit",
        "expand": "mamba_expand",  # inner width = expand x hidden_size
    },
    require={
        "num_local_experts": (0, "granitemoehybrid with experts (3-D fused expert tensors) is not supported", 8),
        "position_embedding_type": ((None, "nope"), "granitemoehybrid with RoPE is not supported", None),
        "hidden_act": ("silu", "granitemoehybrid is supported with hidden_act silu only (the Mamba mixer's)", "silu"),
    },
)

# Mamba (1): every block one RMSNorm and one Mamba mixer (no inner norm; dt, B, C from x_proj of the convolved x);
# inner (intermediate_size) = expand x hidden_size, so width growth grows the mixer's channels (grow/mixer.py)
MAMBA = dataclasses.replace(
    MAMBA2,
    name="mamba",
    model_type="mamba",
    hf_class="MambaForCausalLM",
    features=Features(positions="none", ssm_version=1),
    defaults={"heads": 1, "tie": True, "context": 2048, "norm_eps": 1e-5},
    ssm_keys={
        "head_dim": "intermediate_size",  # one "head" of all the mixer's channels
        "state": "state_size",
        "conv": "conv_kernel",
        "conv_bias": "use_conv_bias",
        "bias": "use_bias",
        "expand": "expand",
        "dt_rank": "time_step_rank",
    },
    require={"hidden_act": ("silu", "mamba is supported with hidden_act silu only (the mixer's activation)", "silu")},
)

# Falcon-H1: each block a Mamba-2 mixer and attention in parallel on one norm, then a GLU MLP; muP scalars on
# the mixer's input and in_proj's segments, on attention's input, keys and output, on the MLP's gate and output
FALCON_H1 = Arch(
    name="falcon_h1",
    model_type="falcon_h1",
    hf_class="FalconH1ForCausalLM",
    block="model.layers.{i}.",
    modules={
        **_LLAMA_MODULES,
        "final_norm": "model.final_layernorm",
        "ln2": "pre_ff_layernorm",
        "gate": "feed_forward.gate_proj",
        "up": "feed_forward.up_proj",
        "down": "feed_forward.down_proj",
        "mamba": "mamba",
    },
    features=Features(free_head_dim=False, fixed_eps=True, parallel_mixers=True),
    keys={
        **{k: v for k, v in _LLAMA_KEYS.items() if k != "head_dim"},
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "mlp_bias": "mlp_bias",
        "embedding_multiplier": "embedding_multiplier",
        "logit_scale": "lm_head_multiplier",
    },
    defaults={"activation": "silu", "tie": False, "context": 8192, "norm_eps": 1e-5},
    kinds={"hybrid": ("mamba", "attention", "mlp")},
    kind_default="hybrid",
    ssm_keys={
        "heads": "mamba_n_heads",
        "head_dim": "mamba_d_head",
        "state": "mamba_d_state",
        "groups": "mamba_n_groups",
        "conv": "mamba_d_conv",
        "conv_bias": "mamba_conv_bias",
        "bias": "mamba_proj_bias",
        "out_bias": "projectors_bias",
        "dt_limit": "time_step_limit",
        "inner": "mamba_d_ssm",  # given: the inner width is no function of the width (absent: refused)
        "norm": "mamba_rms_norm",  # False: y silu(z); True: by mamba_norm_before_gate
        "before_gate": "mamba_norm_before_gate",
    },
    mult_keys={
        "ssm_in": "ssm_in_multiplier",
        "ssm_out": "ssm_out_multiplier",
        "attn_in": "attention_in_multiplier",
        "attn_out": "attention_out_multiplier",
        "key": "key_multiplier",
        "mlp": "mlp_multipliers",
        "mup": "ssm_multipliers",
    },
    require={"hidden_act": ("silu", "falcon_h1 is supported with hidden_act silu only (the Mamba mixer's)", "silu")},
    refuse={},
)

ARCHS = {
    a.name: a
    for a in (
        *(GPT2, LLAMA, MISTRAL, QWEN2, QWEN3, PHI3, GPT_NEOX, STARCODER2, GEMMA, GEMMA2, GEMMA3, OLMO2),
        *(OPT, OLMO, GPT_BIGCODE, GRANITE, PHI, GPTJ, COHERE, FALCON),
        *(MIXTRAL, QWEN2_MOE, QWEN3_MOE, OLMOE, SMOLLM3, BLOOM),
        *(INTERNLM3, EXAONE, SEED_OSS, MINISTRAL, HELIUM, ERNIE4_5, OLMO3, EXAONE4, COHERE2, VAULTGEMMA, STABLELM),
        *(ARCEE, NEMOTRON, HUNYUAN_DENSE, GLM, GLM4, MINISTRAL3, APERTUS, PHIMOE),
        *(NEMOTRON_H, MAMBA2, GRANITE_HYBRID, MAMBA, FALCON_H1),
    )
}
BY_MODEL_TYPE = {a.model_type: a for a in ARCHS.values()}

# Decoder families transformers has and growtool does not grow yet: model_type -> the mechanism missing
# (refused with one line naming it, instead of "unknown family").
_DEEPSEEK_MOE = "DeepSeek-style MoE routing (sigmoid scores, a selection-only bias, group-limited top-k, dense layers)"
_MAMBA = "Mamba state-space mixer layers"
_GDN = "Gated DeltaNet linear-attention mixer layers"
_PLE = "per-layer embeddings and AltUp"
_LLAMA4 = "Llama 4's dense/MoE interleave, chunked attention, RoPE-free layers with temperature tuning, L2 q/k norm"
_FUSED_EXPERTS = "3-D fused expert tensors (input_linear / output_linear)"
UNSUPPORTED = {
    "granitemoe": _FUSED_EXPERTS,
    "granitemoeshared": _FUSED_EXPERTS,
    "deepseek_v2": "multi-head latent attention (MLA) and " + _DEEPSEEK_MOE,
    "deepseek_v3": "multi-head latent attention (MLA) and " + _DEEPSEEK_MOE,
    "kimi_k2": "multi-head latent attention (MLA) and " + _DEEPSEEK_MOE,
    "glm4_moe": _DEEPSEEK_MOE,
    "dots1": _DEEPSEEK_MOE,
    "minimax_m2": _DEEPSEEK_MOE,
    "ernie4_5_moe": _DEEPSEEK_MOE,
    "hunyuan_v1_moe": "HunYuan's MoE with q/k norms after RoPE",
    "exaone_moe": _DEEPSEEK_MOE,
    "llama4": _LLAMA4,
    "llama4_text": _LLAMA4,
    "gpt_oss": "GPT-OSS's attention sinks, biased clamped experts and router bias",
    "dbrx": "DBRX's fused Wqkv with clip_qkv and its fused experts",
    "jamba": "Jamba's 3-D fused experts and its block kinds given by period rules (attn_layer_period)",
    "zamba2": _MAMBA,
    "qwen3_next": _GDN,
    "qwen3_5": _GDN,
    "qwen3_5_text": _GDN,
    "qwen3_5_moe": _GDN,
    "kimi_linear": "Kimi delta attention (KDA) mixer layers and MLA",
    "lfm2": "LFM2's short-convolution mixer layers",
    "minimax": "MiniMax's lightning-attention layers",
    "gemma3n": _PLE,
    "gemma3n_text": _PLE,
    "gemma4": _PLE,
    "gemma4_text": _PLE,
}

# Buffers some HF checkpoints carry that are not weights (causal masks, rotary tables).
IGNORED = re.compile(r"(^|\.)(attn|attention)\.(masked_)?bias$|rotary_emb\.inv_freq$")


def arch_of(cfg) -> Arch:
    return ARCHS[cfg.family]


def has_head_bias(cfg) -> bool:
    """The output head has a bias: always (Phi, GPT-J), or where the config's key says so (PhiMoE)."""
    f = arch_of(cfg).features
    return f.head_bias or bool(f.head_bias_key and cfg.extra.get(f.head_bias_key))


# ---- tensors of a config ------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    pattern: str  # "{i}" stands for the block index
    role: str
    res_axis: int | None = None
    unit_axis: int | None = None
    units: tuple[str, ...] = ()
    group: str | None = None
    norm: str | None = None  # the norm (pattern, without ".weight") feeding this reader
    qk_norm: str = ""  # q/k projections feeding a q/k norm: "head" (per head) or "full" (all units at once)
    sub: str = ""  # the sublayer a block tensor belongs to ("attention", "mlp", "mamba"; "" the block's own)
    shape: tuple = ()  # an inner tensor's shape (role "inner": kept by width growth)


def _qkv_units(f: Features) -> tuple[str, ...]:
    return {"interleaved": ("qkv",), "grouped": ("qkvg",)}.get(f.qkv, ("q", "kv", "kv"))


def arch_specs(a: Arch, cfg) -> list[TensorSpec]:
    """The tensor table of an architecture under a config's flags, derived from slots + features.
    A block tensor's ``sub`` names the sublayer it belongs to ("attention", "mlp", "mamba"; "" the
    block's own): a hybrid's block holds only those of its kind's sublayers (``tensor_specs``)."""
    f, B = a.features, a.block
    r_in = 0 if f.linear == "in_out" else 1  # the residual axis of a reader's weight
    ln1 = B + a.modules["ln1"] if f.pre_norms else None

    def w(slot):
        top = slot in ("embed", "pos", "embed_norm", "final_norm", "head")  # outside the blocks
        return ("" if top else B) + a.modules[slot] + ".weight"

    def b(slot):
        return w(slot)[: -len("weight")] + "bias"

    def reader(slot, units, group, norm, bias, qk=""):
        out = [TensorSpec(w(slot), "reader", r_in, 1 - r_in, units, group, norm, qk)]
        if bias:
            out.append(TensorSpec(b(slot), "unit_bias", unit_axis=0, units=units, group=group, qk_norm=qk))
        return out

    def writer(slot, units, group, bias):
        out = [TensorSpec(w(slot), "writer", 1 - r_in, r_in, units, group)]
        if bias:
            out.append(TensorSpec(b(slot), "writer_bias", res_axis=0))
        return out

    def norm(slot):
        if not f.norm_affine:
            return []  # a LayerNorm without parameters: no tensors
        out = [TensorSpec(w(slot), "norm_gain")]
        if f.norm == "layernorm" and f.norm_bias:
            out.append(TensorSpec(b(slot), "norm_bias"))
        return out

    s = [TensorSpec(w("embed"), "embedding", res_axis=1)]
    if f.positions == "learned":
        s.append(TensorSpec(w("pos"), "embedding", res_axis=1))
    if f.embed_norm:
        s += norm("embed_norm")
    subs = arch_sublayers(a)
    if "attention" in subs:
        s += _tag("attention", _attention_specs(a, cfg, norm, reader, writer, w))
    if "mlp" in subs:
        s += _tag("mlp", _mlp_specs(a, cfg, norm, reader, writer, w))
    if "mamba" in subs:
        s += _tag("mamba", norm("ln1") + _mamba_specs(a, cfg, r_in, ln1))
    if cfg.gated:
        s.append(TensorSpec(B + "growth_gate", "growth_gate"))
    s += norm("final_norm")
    if not cfg.tie:
        s.append(TensorSpec(w("head"), "head", res_axis=1, norm=a.modules["final_norm"]))
    if has_head_bias(cfg):
        s.append(TensorSpec(w("head")[: -len("weight")] + "bias", "head_bias"))
    return s


def _tag(sub: str, specs: list[TensorSpec]) -> list[TensorSpec]:
    return [dataclasses.replace(sp, sub=sub) for sp in specs]


def _attention_specs(a: Arch, cfg, norm, reader, writer, w) -> list[TensorSpec]:
    """The attention sublayer's tensors: its pre-norm, q/k/v (or fused), q/k norms, gate, output, post-norm."""
    f = a.features
    ln1 = a.block + a.modules["ln1"] if f.pre_norms else None
    s = norm("ln1") if f.pre_norms else []
    if f.qkv == "separate":
        s += reader("q", ("q",), "attn", ln1, cfg.qkv_bias, f.qk_norm)
        s += reader("k", ("kv",), "attn", ln1, cfg.qkv_bias, f.qk_norm)
        s += reader("v", ("kv",), "attn", ln1, cfg.qkv_bias)
    else:
        s += reader("qkv", _qkv_units(f), "attn", ln1, cfg.qkv_bias)
    if f.qk_norm == "head":
        s += [TensorSpec(w("q_norm"), "head_norm"), TensorSpec(w("k_norm"), "head_norm")]
    elif f.qk_norm == "full":
        s += [
            TensorSpec(w("q_norm"), "unit_norm", unit_axis=0, units=("q",), group="attn"),
            TensorSpec(w("k_norm"), "unit_norm", unit_axis=0, units=("kv",), group="attn"),
        ]
    if cfg.attn_gate:
        s += reader("g", ("qgate",), "attn", ln1, cfg.qkv_bias)
    s += writer("o", ("q",), "attn", cfg.o_bias)
    if f.post_norms:
        s += norm("post_attn")
    return s


def _mlp_specs(a: Arch, cfg, norm, reader, writer, w) -> list[TensorSpec]:
    """The MLP sublayer's tensors: its pre-norm, the MLP or the experts, the activation's scalars, post-norm."""
    f, B, r_in = a.features, a.block, 0 if a.features.linear == "in_out" else 1
    ln2 = B + a.modules["ln2"] if f.pre_norms and not f.shared_norm else (B + a.modules["ln1"] if f.pre_norms else None)
    s = norm("ln2") if f.pre_norms and not f.shared_norm else []
    if f.moe:
        s.append(TensorSpec(w("router"), "router", r_in, 1 - r_in, ("experts",), "ffn", ln2))
        for j in range(cfg.experts):
            e = f"{B}{a.modules['experts']}.{j}."
            s.append(TensorSpec(e + a.modules["e_gate"] + ".weight", "reader", r_in, 1 - r_in, ("ffn",), "ffn", ln2))
            s.append(TensorSpec(e + a.modules["e_up"] + ".weight", "reader", r_in, 1 - r_in, ("ffn",), "ffn", ln2))
            s.append(TensorSpec(e + a.modules["e_down"] + ".weight", "writer", 1 - r_in, r_in, ("ffn",), "ffn"))
        if cfg.shared_ffn:
            s += reader("s_gate", ("sffn",), "ffn", ln2, False) + reader("s_up", ("sffn",), "ffn", ln2, False)
            s += writer("s_down", ("sffn",), "ffn", False)
            s.append(TensorSpec(w("s_router"), "router", r_in, 1 - r_in, ("one",), "ffn", ln2))
    elif f.mlp == "glu_fused":
        s += reader("gate_up", ("ffn", "ffn"), "ffn", ln2, cfg.mlp_bias)
    else:
        if f.mlp == "glu":
            s += reader("gate", ("ffn",), "ffn", ln2, cfg.mlp_bias)
        s += reader("up", ("ffn",), "ffn", ln2, cfg.mlp_bias)
    if not f.moe:
        s += writer("down", ("ffn",), "ffn", cfg.mlp_bias)
    s += [TensorSpec(B + a.modules["act"] + "." + p, "act_param") for p, _ in f.act_params]
    if f.post_norms:
        s += norm("post_ffn")
    return s


def ssm_dims(cfg) -> tuple[int, int, int]:
    """(inner channels, convolved channels, in_proj outputs) of a Mamba-2 mixer: inner = heads x head_dim;
    the convolution runs over [x | B | C] (inner + 2 x groups x state); in_proj gives [z | x B C | dt].
    Mamba (1): one "head" of all channels, the convolution over x, in_proj gives [x | z]."""
    m = cfg.ssm
    inner = m["heads"] * m["head_dim"]
    if arch_of(cfg).features.ssm_version == 1:
        return inner, inner, 2 * inner
    conv = inner + 2 * m["groups"] * m["state"]
    return inner, conv, inner + conv + m["heads"]


def _mamba_specs(a: Arch, cfg, r_in: int, ln1: str) -> list[TensorSpec]:
    """A Mamba-2 mixer's tensors: in_proj reads the normed residual (its outputs are inner units, ``m_in``,
    never grown), out_proj writes it (from the ``m_inner`` channels); the convolution, A_log, D, dt_bias
    and the gated inner norm act on inner channels only (role ``inner``: width growth keeps them)."""
    m, ssm = a.block + a.modules["mamba"] + ".", cfg.ssm
    inner, conv, _ = ssm_dims(cfg)
    s = [TensorSpec(m + "in_proj.weight", "reader", r_in, 1 - r_in, ("m_in",), "attn", ln1)]
    if ssm["bias"]:
        s.append(TensorSpec(m + "in_proj.bias", "unit_bias", unit_axis=0, units=("m_in",), group="attn"))
    s.append(TensorSpec(m + "conv1d.weight", "inner", shape=(conv, 1, ssm["conv"])))
    if ssm["conv_bias"]:
        s.append(TensorSpec(m + "conv1d.bias", "inner", shape=(conv,)))
    if a.features.ssm_version == 1:  # x_proj [dt_rank + 2 state, inner], dt_proj, A_log per channel and state
        r, n = ssm["dt_rank"], ssm["state"]
        s.append(TensorSpec(m + "x_proj.weight", "inner", shape=(r + 2 * n, inner)))
        s += [
            TensorSpec(m + "dt_proj.weight", "inner", shape=(inner, r)),
            TensorSpec(m + "dt_proj.bias", "inner", shape=(inner,)),
        ]
        s += [TensorSpec(m + "A_log", "inner", shape=(inner, n)), TensorSpec(m + "D", "inner", shape=(inner,))]
    else:
        s += [TensorSpec(m + p, "inner", shape=(ssm["heads"],)) for p in ("dt_bias", "A_log", "D")]
        if ssm.get("norm", "gated") != "none":
            s.append(TensorSpec(m + "norm.weight", "inner", shape=(inner,)))
    s.append(TensorSpec(m + "out_proj.weight", "writer", 1 - r_in, r_in, ("m_inner",), "attn"))
    if ssm.get("out_bias", ssm["bias"]):
        s.append(TensorSpec(m + "out_proj.bias", "writer_bias", res_axis=0))
    return s


def arch_sublayers(a: Arch) -> set[str]:
    """Every sublayer some block of the architecture runs ("attention", "mlp", "mamba")."""
    return set().union(*a.kinds.values()) if a.kinds else {"attention", "mlp"}


def block_sublayers(cfg, layer: int) -> tuple[str, ...]:
    """The sublayers block ``layer`` runs, in order: ("attention", "mlp") but in hybrids (``Arch.kinds``)."""
    a = arch_of(cfg)
    if not a.kinds:
        return ("attention", "mlp")
    return a.kinds[cfg.block_types[layer] if cfg.block_types else a.kind_default]


def unit_count(cfg, kind: str) -> tuple[int, int]:
    """(number of units, elements per unit) of a unit kind under a config."""
    if kind in ("m_in", "m_inner"):  # a Mamba mixer's in_proj outputs and inner channels: never grown
        inner, _, proj = ssm_dims(cfg)
        return (proj if kind == "m_in" else inner, 1)
    return {
        "q": (cfg.heads, cfg.head_dim),
        "kv": (cfg.kv_heads, cfg.head_dim),
        "qkv": (cfg.heads, 3 * cfg.head_dim),
        "qkvg": (cfg.kv_heads, (cfg.heads // cfg.kv_heads + 2) * cfg.head_dim),
        "qgate": (cfg.heads, 1),
        "ffn": (cfg.ffn, 1),
        "sffn": (cfg.shared_ffn or 0, 1),
        "experts": (cfg.experts or 0, 1),  # a router's outputs: one logit per expert, never grown
        "one": (1, 1),  # the shared expert's gate logit
    }[kind]


def tensor_specs(cfg) -> dict[str, TensorSpec]:
    """Every tensor name the config's checkpoint must hold, mapped to its spec (in file order):
    the non-block tensors first, then block after block, then the final norm and head."""
    specs = arch_specs(arch_of(cfg), cfg)
    flat = [sp for sp in specs if "{i}" not in sp.pattern]
    out = {sp.pattern: sp for sp in flat if sp.role == "embedding"}
    for i in range(cfg.layers):
        subs = block_sublayers(cfg, i)
        mine = [sp for sp in specs if "{i}" in sp.pattern and (not sp.sub or sp.sub in subs)]
        out.update((sp.pattern.format(i=i), sp) for sp in mine)
    for sp in flat:
        out.setdefault(sp.pattern, sp)
    return out


def tensor_shape(name: str, spec: TensorSpec, cfg) -> tuple[int, ...]:
    """The shape a tensor must have under cfg (derived from the spec's axes)."""
    if spec.role == "growth_gate":
        return (1,)
    if spec.role == "inner":
        return spec.shape
    if spec.role in ("norm_gain", "norm_bias", "writer_bias"):
        return (cfg.width,)
    if spec.role == "head_norm":
        return (cfg.head_dim,)
    if spec.role == "act_param":
        return dict(arch_of(cfg).features.act_params)[name.rsplit(".", 1)[1]]
    if spec.role == "embedding":
        a = arch_of(cfg)
        rows = cfg.vocab_size if name == a.embed else cfg.context + a.features.pos_offset
        return (rows, cfg.width)
    if spec.role == "head":
        return (cfg.vocab_size, cfg.width)
    if spec.role == "head_bias":
        return (cfg.vocab_size,)
    units = sum(n * b for n, b in (unit_count(cfg, k) for k in spec.units))
    if spec.role in ("unit_bias", "unit_norm"):
        return (units,)
    shape = [0, 0]
    shape[spec.res_axis] = cfg.width
    shape[spec.unit_axis] = units
    return tuple(shape)


def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    return {n: tensor_shape(n, s, cfg) for n, s in tensor_specs(cfg).items()}
