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
  router_bias  the router's bias (GPT-OSS): one per expert, kept by growth
  router       reads the normed residual into a fixed number of outputs (MoE router, shared-expert gate, MLA's
               down-projections to its latents)
  latent_norm / latent_bias   a norm over an MLA latent, a bias on one: kept (latent ranks are fixed)
  head_rows    a matrix from an MLA latent to heads (q_b_proj, kv_b_proj): its rows grow with the heads
               (unit axis 0), the latent axis is kept
  act_param    a learned scalar of the block's activation (Apertus' xIELU): kept by width growth
  expert_bias  an MoE router's per-expert correction bias, used to choose experts, not to weigh them
               (DeepSeek-V3's e_score_correction_bias): kept by width growth, copied by depth growth
  inner        a tensor on a mixer's inner channels only (Mamba's conv1d, A_log, D, dt_bias, gated norm; Gated
               DeltaNet's conv1d, A_log, dt_bias, inner norm):
               kept by width growth, copied by depth growth
  growth_gate  the warm-up gate of a block (only in grown, unfolded checkpoints; shape [1])

Unit kinds: ``q`` (query heads, block head_dim), ``kv`` (key/value heads, block head_dim),
``qkv`` (GPT-NeoX: one head's interleaved [q k v], block 3 x head_dim), ``qkvg`` (Falcon: one KV
group's [q_1 .. q_r k v], block (r + 2) x head_dim, grown as the KV groups), ``qgate`` (one gate
logit per query head), ``ffn`` (FFN neurons; an MoE family's: each expert's), ``sffn`` (the shared
expert's neurons), ``dffn`` (the neurons of an MoE family's dense blocks), ``qg`` (Qwen3-Next: a query
head and its output gate, block 2 x head_dim), ``conv`` (LFM2's conv channels, one per residual dim),
``gdn_*`` (Gated DeltaNet's inner outputs: one unit, never grown). A fused tensor lists several kinds:
its unit axis is their concatenation (GPT-2's c_attn and Phi-3's qkv_proj: q, kv, kv; Phi-3's
gate_up_proj: ffn, ffn). MLA's kinds: ``mq`` (query heads of qk_nope + qk_rope dims), ``mv`` (their
values in o_proj), ``mkv`` (kv_b_proj's per-head [k_nope v]), ``qa`` / ``kvl`` / ``kva`` (the query
latent, the key/value latent, and that latent with the shared RoPE key). ``m_in`` / ``m_inner``: a
Mamba mixer's in_proj outputs / inner channels, never grown. ``group`` picks the recipe section that
fills new units ("attn" or "ffn").

Adding an architecture: one ``Arch`` entry below (plus its parity test against transformers).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ExpertLayout:
    """How a block's experts are stored when one tensor holds all E of them (``Features.experts``).

    Expert slots (``e_gate_up``, or ``e_gate`` and ``e_up``; ``e_down``) name whole tensors, relative to the
    block. A 3-D tensor is [E, ., .], the expert axis first; a ``stacked`` 2-D one holds the experts as E
    blocks of units along its unit axis ([E * units, d], DBRX). Per expert, a reader is [units, d]
    (``reader`` "out_in") or [d, units] ("in_out"); the writer [d, units] ("out_in") or [units, d]
    ("in_out"). Gate and up in one reader sit as ``glu`` "halves" [gate | up] or "interleaved"
    (g_0 u_0 g_1 u_1 ..: one neuron's pair is a unit of 2, kind ``ffn2``); "separate": two tensors.
    ``bias``: each tensor has a bias per expert at slot ``<slot>_bias``: [E, units] on a reader's units
    (a stacked one: [E * units]), [E, d] on the writer's output (GPT-OSS)."""

    reader: str = "out_in"
    writer: str = "out_in"
    glu: str = "halves"  # "halves" | "interleaved" | "separate"
    stacked: bool = False
    bias: bool = False


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
    #                    "l2": without weights, over head_dim, after RoPE, on RoPE layers where use_qk_norm (Llama 4)
    gqa: bool = True  # key/value heads may be fewer than query heads
    free_head_dim: bool = True  # head_dim may differ from width / heads
    norm_offset: float = 0.0  # norms scale by (offset + w): Gemma stores w with gain 1 + w
    embed_scale: bool = False  # embeddings times sqrt(width), rounded to the weights' dtype (Gemma)
    pre_norms: bool = True  # a norm on the residual before each sublayer (its readers' norm)
    post_norms: bool = False  # a norm on each sublayer's output before the residual add (Gemma 2/3, OLMo-2)
    pos_offset: int = 0  # learned positions: position p reads row p + offset (OPT: 2)
    fixed_eps: bool = False  # the norm eps is a constant of the class, not a config key: growth keeps it
    #                          and scales the residual by sqrt(D/d) instead (OPT, OLMo; Llama 4, whose weightless
    #                          q/k norms over head_dim read the config's one eps too); also where a mixer's
    #                          inner norm shares the key (Mamba's gated norm reads layer_norm_epsilon: Nemotron-H)
    norm_affine: bool = True  # False: LayerNorm without gain or bias (OLMo)
    mqa: bool = False  # one key/value head read by every query head (GPT-BigCode): growth adds query heads only
    shared_norm: bool = False  # one pre-norm (ln1) read by attention and MLP, in parallel (Phi, GPT-J, Cohere)
    head_bias: bool = False  # the output head has a bias (Phi, GPT-J): vocabulary-sized, kept
    head_bias_key: str = ""  # the config key that gives the head a bias (PhiMoE: lm_head_bias)
    routing: str = "softmax"  # MoE routing: "softmax" top-k | "sparsemixer" (PhiMoE's top-2 at inference) |
    #                           "sigmoid_in": top-k logits, sigmoid weights times the token before its expert (Llama 4)
    #                           "sigmoid" (DeepSeek-V3: sigmoid scores, chosen by score + correction bias within
    #                           the best groups) | "softmax_bias" (Ernie 4.5-MoE: softmax scores chosen with the bias)
    #                           | "softmax_group" (DeepSeek-V2: softmax top-k, within the groups of the best experts
    #                           unless its topk_method is greedy)
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
    experts: ExpertLayout | None = None  # the experts fused into tensors holding all E (None: one module each)
    shared_gate: bool = True  # the shared expert's output passes sigmoid(s_router(x)) (Qwen2-MoE); False: added
    sinks: bool = False  # attention sinks: a learned logit per query head (slot sinks) joins each softmax and is
    #                      dropped, so a head may attend to nothing (GPT-OSS); new heads' sinks follow their q/k/v
    router_bias: bool = False  # the MoE router has a bias, one per expert (GPT-OSS): kept by growth
    shared_plain: bool = False  # every MoE block has a shared expert of ``ffn`` neurons, added without a gate (Llama 4)
    attn_temperature: bool = False  # Llama 4: on layers without RoPE the query at position p is scaled by
    #                                 1 + attn_scale log(1 + floor((p + 1) / floor_scale)) (attn_temperature_tuning)
    mla: bool = False  # multi-head latent attention (DeepSeek-V2, nn/mla.py): slots q_a, q_a_norm, q_b (or q), kv_a,
    #                    kv_a_norm, kv_b, o; its dims in ModelConfig (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    #                    v_head_dim; head_dim is the decoupled RoPE key's qk_rope_head_dim)
    rope_interleave_key: str = ""  # the config key that turns interleaved-pair RoPE off when false (DeepSeek-V3)
    expert_bias: tuple = ()  # the router's selection-only correction bias (slot e_bias, a buffer), kept by width
    #                          growth: its shape in unit kinds, ("experts",) or ("one", "experts") (Ernie 4.5-MoE)
    fp32: tuple = ()  # slots transformers keeps in float32 in a checkpoint of another dtype (its
    #                   _keep_in_fp32_modules_strict: MoE routers, correction biases): read as they are stored
    qk_norm_key: str = ""  # a config key that must be true for the qk_norm to exist (GLM-4-MoE's use_qk_norm)
    moe_layers: tuple = ()  # (config key, its default) saying which blocks are MoE, the others dense GLU MLPs of
    #                         dense_ffn neurons at slots gate/up/down (nn/moe_layers.py); () every block MoE
    attn_output_gate: bool = False  # q_proj holds per head [q | gate]: the attention output x sigmoid(gate), per
    #                                 element, before o_proj (Qwen3-Next; unit kind "qg", 2 x head_dim per head)
    gdn_split: bool = False  # Gated DeltaNet's projections in_proj_qkv / _z / _b / _a (Qwen3.5), not in_proj_qkvz / _ba
    #                          interleaved per key head (Qwen3-Next)
    ffn_auto_adjust: bool = False  # LFM2: with block_auto_adjust_ff_dim the MLP has 2/3 x intermediate_size neurons,
    #                                x block_ffn_dim_multiplier, rounded up to block_multiple_of
    ssm_version: int = 2  # the Mamba mixer: 2 (Mamba-2, nn/mamba.Mamba2Mixer) or 1 (Mamba, Mamba1Mixer)
    parallel_mixers: bool = False  # a block's Mamba mixer and attention read one norm, their outputs summed (Falcon-H1)


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

_GRANITEMOE_MODULES = {
    **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("gate", "up", "down")},
    "router": "block_sparse_moe.router.layer",
    "e_gate_up": "block_sparse_moe.input_linear.weight",  # [E, 2f, d]: each expert's [gate | up] rows
    "e_down": "block_sparse_moe.output_linear.weight",  # [E, d, f]
    "s_gate_up": "shared_mlp.input_linear",
    "s_down": "shared_mlp.output_linear",
}

GRANITEMOE = Arch(
    name="granitemoe",
    model_type="granitemoe",
    hf_class="GraniteMoeForCausalLM",
    block="model.layers.{i}.",
    modules=_GRANITEMOE_MODULES,
    features=Features(moe=True, experts=ExpertLayout()),  # softmax over the top-k logits: softmax, top-k, renormed
    keys={**GRANITE.keys, "experts": "num_local_experts", "top_k": "num_experts_per_tok"},
    fixed={"mlp_bias": False, "norm_topk": True},
    defaults={"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-6},
)

GRANITEMOESHARED = dataclasses.replace(
    GRANITEMOE,
    name="granitemoeshared",
    model_type="granitemoeshared",
    hf_class="GraniteMoeSharedForCausalLM",
    features=Features(moe=True, experts=ExpertLayout(), shared_gate=False),  # the shared MLP is added, ungated
    keys={**GRANITEMOE.keys, "shared_ffn": "shared_intermediate_size"},
)

DBRX = Arch(
    name="dbrx",
    model_type="dbrx",
    hf_class="DbrxForCausalLM",
    block="transformer.blocks.{i}.",
    modules={
        "embed": "transformer.wte",
        "final_norm": "transformer.norm_f",
        "head": "lm_head",
        "ln1": "norm_attn_norm.norm_1",
        "ln2": "norm_attn_norm.norm_2",
        "qkv": "norm_attn_norm.attn.Wqkv",  # [Q | K | V], clamped to +-clip_qkv
        "o": "norm_attn_norm.attn.out_proj",
        "g": "norm_attn_norm.attn.g_proj",
        "router": "ffn.router.layer",
        "e_gate": "ffn.experts.mlp.w1",  # [E * f, d]: expert e's rows e f .. (e + 1) f
        "e_up": "ffn.experts.mlp.v1",
        "e_down": "ffn.experts.mlp.w2",  # [E * f, d]: expert e's [f, d], read as h @ w2
    },
    features=Features(
        norm="layernorm",
        norm_bias=False,  # nn.LayerNorm(d, bias=False), eps 1e-5 of the class
        fixed_eps=True,
        qkv="concat",
        free_head_dim=False,
        moe=True,
        experts=ExpertLayout(writer="in_out", glu="separate", stacked=True),
    ),
    keys={
        "vocab_size": "vocab_size",
        "width": "d_model",
        "layers": "n_layers",
        "heads": "n_heads",
        "kv_heads": "attn_config.kv_n_heads",
        "ffn": "ffn_config.ffn_hidden_size",
        "context": "max_seq_len",
        "tie": "tie_word_embeddings",
        "activation": "ffn_config.ffn_act_fn.name",
        "experts": "ffn_config.moe_num_experts",
        "top_k": "ffn_config.moe_top_k",
        "clip_qkv": "attn_config.clip_qkv",
    },
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False, "norm_topk": True},
    defaults={  # DbrxConfig's, DbrxAttentionConfig's and DbrxFFNConfig's
        **{"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-5, "kv_heads": 1},
        **{"ffn": 3584, "experts": 4, "top_k": 1},
    },
    require={
        "ffn_config.moe_normalize_expert_weights": (
            (1, 1.0),
            "dbrx with moe_normalize_expert_weights other than 1 (top-k weights over another p-norm, or none) "
            "is not supported",
            1.0,
        )
    },
    mirrors={"ffn_config.hidden_size": "width", "num_key_value_heads": "kv_heads"},
)

GPT_OSS = Arch(
    name="gpt_oss",
    model_type="gpt_oss",
    hf_class="GptOssForCausalLM",
    block="model.layers.{i}.",
    modules={
        **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("gate", "up", "down")},
        "sinks": "self_attn.sinks",
        "router": "mlp.router",
        "e_gate_up": "mlp.experts.gate_up_proj",  # [E, d, 2f]: neuron j's gate at 2j, its up at 2j + 1
        "e_gate_up_bias": "mlp.experts.gate_up_proj_bias",  # [E, 2f]
        "e_down": "mlp.experts.down_proj",  # [E, f, d]
        "e_down_bias": "mlp.experts.down_proj_bias",  # [E, d]
    },
    features=Features(
        moe=True,
        experts=ExpertLayout(reader="in_out", writer="in_out", glu="interleaved", bias=True),
        sinks=True,
        router_bias=True,
    ),
    keys={
        **_LLAMA_KEYS,
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
        "experts": "num_local_experts",
        "top_k": "num_experts_per_tok",
        "swiglu_alpha": "swiglu_alpha",
        "swiglu_limit": "swiglu_limit",
    },
    # top-k of the router's logits, softmax over those k: softmax, top-k, renormalised (norm_topk)
    fixed={"mlp_bias": False, "norm_topk": True},
    defaults={
        **{"activation": "silu", "tie": False, "context": 131072, "norm_eps": 1e-5, "qkv_bias": True},
        **{"swiglu_alpha": 1.702, "swiglu_limit": 7.0},
    },
    refuse={"quantization_config": "gpt_oss with quantized (MXFP4) experts is not supported: dequantize it first"},
    alt_keys={"num_experts_per_tok": "experts_per_token"},  # the Hub's configs spell both
    window_every=2,
)


_LLAMA4_MLP = {"gate": "feed_forward.gate_proj", "up": "feed_forward.up_proj", "down": "feed_forward.down_proj"}
LLAMA4_TEXT = Arch(
    name="llama4_text",
    model_type="llama4_text",
    hf_class="Llama4ForCausalLM",
    block="model.layers.{i}.",
    modules={
        **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("q_norm", "k_norm")},
        **_LLAMA4_MLP,  # the dense layers' MLP (intermediate_size_mlp neurons)
        "router": "feed_forward.router",
        "e_gate_up": "feed_forward.experts.gate_up_proj",  # [E, d, 2f]: each expert's [gate | up] columns
        "e_down": "feed_forward.experts.down_proj",  # [E, f, d]
        **{"s_" + k: "feed_forward.shared_expert." + v.split(".")[1] for k, v in _LLAMA4_MLP.items()},
    },
    features=Features(
        qk_norm="l2",
        rope_interleaved=True,  # RoPE as complex numbers: pairs (2i, 2i + 1)
        fixed_eps=True,  # rms_norm_eps is also the q/k norms' eps over head_dim: kept, the residual scaled
        moe=True,
        routing="sigmoid_in",
        experts=ExpertLayout(reader="in_out", writer="in_out"),
        shared_plain=True,
        shared_gate=False,
        attn_temperature=True,
        moe_layers=("moe_layers", None),  # block indices; without them every interleave_moe_layer_step-th block
    ),
    keys={
        **_LLAMA_KEYS,
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "dense_ffn": "intermediate_size_mlp",
        "experts": "num_local_experts",
        "top_k": "num_experts_per_tok",
        "layer_types": "layer_types",
        "rope_layers": "no_rope_layers",
    },
    fixed={"mlp_bias": False, "norm_topk": False},
    defaults={  # transformers' Llama4TextConfig defaults
        "activation": "silu",
        "tie": False,
        "context": 131072,
        "norm_eps": 1e-5,
        "top_k": 1,
        "experts": 16,
        "dense_ffn": 16384,
    },
)


# DeepSeek-style MoE (DeepSeek-AI 2024, arXiv:2412.19437): sigmoid scores chosen with a correction bias within the
# best expert groups, weights x routed_scaling_factor, ungated shared experts, the first blocks dense
_DS_MOE_MODULES = {
    **_LLAMA_MODULES,  # gate/up/down: the dense blocks' MLP
    "router": "mlp.gate",
    "e_bias": "mlp.gate.e_score_correction_bias",
    "experts": "mlp.experts",
    "e_gate": "gate_proj",
    "e_up": "up_proj",
    "e_down": "down_proj",
    "s_gate": "mlp.shared_experts.gate_proj",
    "s_up": "mlp.shared_experts.up_proj",
    "s_down": "mlp.shared_experts.down_proj",
}
_DS_MOE_KEYS = {
    **_LLAMA_KEYS,
    "ffn": "moe_intermediate_size",
    "dense_ffn": "intermediate_size",
    "experts": "n_routed_experts",
    "top_k": "num_experts_per_tok",
    "norm_topk": "norm_topk_prob",
    "shared_experts": "n_shared_experts",
    "n_group": "n_group",
    "topk_group": "topk_group",
    "routed_scale": "routed_scaling_factor",
}
_DS_MOE = Features(
    moe=True,
    routing="sigmoid",
    expert_bias=("experts",),
    moe_layers=("first_k_dense_replace", 1),
    fp32=("router", "e_bias"),
)

GLM4_MOE = Arch(
    name="glm4_moe",
    model_type="glm4_moe",
    hf_class="Glm4MoeForCausalLM",
    block="model.layers.{i}.",
    modules=_DS_MOE_MODULES,
    features=dataclasses.replace(_DS_MOE, qk_norm="head", qk_norm_key="use_qk_norm"),  # RoPE on half of each head
    keys={**_DS_MOE_KEYS, "qkv_bias": "attention_bias"},
    fixed={"o_bias": False, "mlp_bias": False},
    defaults={
        "activation": "silu",
        "tie": False,
        "context": 131072,
        "norm_eps": 1e-5,
        "rotary_fraction": 0.5,
        "ffn": 1408,
        "dense_ffn": 10944,
        "experts": 128,
        "top_k": 8,
        "norm_topk": True,
        "shared_experts": 1,
        "routed_scale": 1.0,
    },
)

DOTS1 = dataclasses.replace(
    GLM4_MOE,
    name="dots1",
    model_type="dots1",
    hf_class="Dots1ForCausalLM",
    features=dataclasses.replace(_DS_MOE, qk_norm="head", moe_layers=("first_k_dense_replace", 0)),  # as Qwen3, always
    keys={
        **_DS_MOE_KEYS,
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
    },
    fixed={"mlp_bias": False},
    defaults={
        "activation": "silu",
        "tie": False,
        "context": 2048,
        "norm_eps": 1e-6,
        "ffn": 1408,
        "dense_ffn": 10944,
        "norm_topk": False,
        "routed_scale": 1.0,
    },
)

MINIMAX_M2 = Arch(
    name="minimax_m2",
    model_type="minimax_m2",
    hf_class="MiniMaxM2ForCausalLM",
    block="model.layers.{i}.",
    modules={**MIXTRAL.modules, "e_bias": "block_sparse_moe.e_score_correction_bias"},  # stored as Mixtral
    features=Features(moe=True, routing="sigmoid", expert_bias=("experts",), qk_norm="full"),  # q/k norms as OLMo-2
    keys={**MIXTRAL.keys, "ffn": "intermediate_size"},  # every block MoE, no shared expert, no groups
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False, "norm_topk": True},
    defaults={"activation": "silu", "tie": False, "context": 196608, "norm_eps": 1e-6},
)

ERNIE4_5_MOE = Arch(
    name="ernie4_5_moe",
    model_type="ernie4_5_moe",
    hf_class="Ernie4_5_MoeForCausalLM",
    block="model.layers.{i}.",
    modules={**_DS_MOE_MODULES, "e_bias": "mlp.moe_statics.e_score_correction_bias"},
    features=Features(  # Ernie 4.5's attention (pair RoPE); softmax scores chosen with the bias, renormalised
        rope_interleaved=True,
        moe=True,
        routing="softmax_bias",
        expert_bias=("one", "experts"),
        moe_layers=("moe_layer_start_index", 1),
        head_bias_key="use_bias",
        fp32=("router", "e_bias"),
    ),
    keys={
        **_DS_MOE_KEYS,
        "experts": "moe_num_experts",
        "top_k": "moe_k",
        "shared_experts": "moe_num_shared_experts",
        "qkv_bias": "use_bias",
        "o_bias": "use_bias",
        "mlp_bias": "use_bias",  # the dense blocks' and the shared experts' linears (the experts have none)
    },
    fixed={"norm_topk": True},
    defaults={"activation": "silu", "tie": True, "context": 131072, "norm_eps": 1e-5, "experts": 64, "top_k": 6},
)

EXAONE_MOE = Arch(
    name="exaone_moe",
    model_type="exaone_moe",
    hf_class="ExaoneMoeForCausalLM",
    block="model.layers.{i}.",
    modules={**_DS_MOE_MODULES, "e_bias": "mlp.e_score_correction_bias"},
    features=dataclasses.replace(  # per-head q/k norms; RoPE on sliding layers only where there is a window
        _DS_MOE, qk_norm="head", rope_where="windowed_if_any", moe_layers=("mlp_layer_types", None)
    ),
    keys={
        **_DS_MOE_KEYS,
        "experts": "num_experts",
        "shared_experts": "num_shared_experts",
        "sliding_window": "sliding_window",
        "layer_types": "layer_types",
    },
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False},
    defaults={
        "activation": "silu",
        "tie": False,
        "context": 2048,
        "norm_eps": 1e-5,
        "ffn": 1024,
        "experts": 64,
        "top_k": 8,
        "norm_topk": True,
        "shared_experts": 1,
        "routed_scale": 2.5,
    },
    window_every=4,
)

HUNYUAN_MOE = Arch(
    name="hunyuan_v1_moe",
    model_type="hunyuan_v1_moe",
    hf_class="HunYuanMoEV1ForCausalLM",
    block="model.layers.{i}.",
    modules={  # HunYuan's attention; the router in mlp.gate.wg, one ungated shared MLP of the experts' width
        **{k: v for k, v in HUNYUAN_DENSE.modules.items() if k not in ("gate", "up", "down")},
        "router": "mlp.gate.wg",
        "experts": "mlp.experts",
        "e_gate": "gate_proj",
        "e_up": "up_proj",
        "e_down": "down_proj",
        "s_gate": "mlp.shared_mlp.gate_proj",
        "s_up": "mlp.shared_mlp.up_proj",
        "s_down": "mlp.shared_mlp.down_proj",
    },
    features=dataclasses.replace(HUNYUAN_DENSE.features, moe=True, fp32=("router",)),  # softmax top-k, renormalised
    keys={**HUNYUAN_DENSE.keys, "experts": "num_experts", "top_k": "moe_topk"},
    fixed={"mlp_bias": False, "norm_topk": True, "shared_experts": 1},
    defaults=HUNYUAN_DENSE.defaults,
)

_MLA_MODULES = {  # DeepSeek-style MoE's modules, MLA for the attention
    **{k: v for k, v in _DS_MOE_MODULES.items() if k not in ("k", "v", "g", "q_norm", "k_norm")},
    "q_a": "self_attn.q_a_proj",
    "q_a_norm": "self_attn.q_a_layernorm",
    "q_b": "self_attn.q_b_proj",
    "kv_a": "self_attn.kv_a_proj_with_mqa",
    "kv_a_norm": "self_attn.kv_a_layernorm",
    "kv_b": "self_attn.kv_b_proj",
}
_MLA_KEYS = {
    **_DS_MOE_KEYS,  # num_key_value_heads: equal to the heads (one latent for all heads; transformers groups by it)
    "head_dim": "qk_rope_head_dim",  # the RoPE key's dims (transformers' head_dim says the same)
    "qkv_bias": "attention_bias",  # q_a_proj, kv_a_proj_with_mqa
    "o_bias": "attention_bias",
    **{k: k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim")},
}

DEEPSEEK_V2 = Arch(
    name="deepseek_v2",
    model_type="deepseek_v2",
    hf_class="DeepseekV2ForCausalLM",
    block="model.layers.{i}.",
    modules=_MLA_MODULES,
    features=Features(  # RoPE on adjacent pairs (complex form); softmax routing (greedy or within the best groups)
        mla=True,
        gqa=False,
        rope_interleaved=True,
        moe=True,
        routing="softmax_group",
        moe_layers=("first_k_dense_replace", 0),
        fp32=("router",),
    ),
    keys={**_MLA_KEYS, "mlp_bias": "mlp_bias"},
    fixed={"norm_topk": False},  # the router never renormalises (norm_topk_prob is read by nothing)
    defaults={
        **{"activation": "silu", "tie": False, "context": 2048, "norm_eps": 1e-6, "ffn": 1407, "dense_ffn": 11008},
        **{"experts": 64, "shared_experts": 2, "routed_scale": 1.0},
    },
    require={
        "topk_method": (
            ("greedy", "group_limited_greedy"),
            "deepseek_v2 routes by topk_method greedy or group_limited_greedy only",
            "greedy",
        )
    },
)

DEEPSEEK_V3 = Arch(
    name="deepseek_v3",
    model_type="deepseek_v3",
    hf_class="DeepseekV3ForCausalLM",
    block="model.layers.{i}.",
    modules=_MLA_MODULES,
    features=dataclasses.replace(
        _DS_MOE,
        mla=True,
        gqa=False,
        rope_interleaved=True,
        rope_interleave_key="rope_interleave",
        moe_layers=("first_k_dense_replace", 3),
    ),
    keys=_MLA_KEYS,
    fixed={"mlp_bias": False},
    defaults={
        **{"activation": "silu", "tie": False, "context": 4096, "norm_eps": 1e-6, "ffn": 2048, "dense_ffn": 18432},
        **{"experts": 256, "top_k": 8, "norm_topk": True, "shared_experts": 1, "routed_scale": 2.5},
        **{"n_group": 8, "topk_group": 4},
    },
)

_NEMOTRON_H_SSM = {
    "heads": "mamba_num_heads",
    "head_dim": "mamba_head_dim",
    "state": "ssm_state_size",
    "groups": "n_groups",
    "conv": "conv_kernel",
    "conv_bias": "use_conv_bias",
    "bias": "use_bias",  # in_proj and out_proj (mamba_proj_bias is read by nothing)
    "dt_limit": "time_step_limit",  # dt's clamp (transformers >= 5.25; 5.24 and before clamped at time_step_min)
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
    features=Features(positions="none", mlp="plain", fixed_eps=True),
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

# Hybrids whose blocks are a token mixer (attention, or a mixer in the layer types' other kind) and an MLP.

LFM2 = Arch(
    name="lfm2",
    model_type="lfm2",
    hf_class="Lfm2ForCausalLM",
    block="model.layers.{i}.",
    modules={
        **{k: v for k, v in _LLAMA_MODULES.items() if k not in ("gate", "up", "down")},
        "final_norm": "model.embedding_norm",  # after the blocks, despite its name
        "ln1": "operator_norm",
        "ln2": "ffn_norm",
        "o": "self_attn.out_proj",
        "q_norm": "self_attn.q_layernorm",
        "k_norm": "self_attn.k_layernorm",
        "gate": "feed_forward.w1",
        "up": "feed_forward.w3",
        "down": "feed_forward.w2",
        "m_in": "conv.in_proj",
        "m_conv": "conv.conv",
        "m_out": "conv.out_proj",
    },
    features=Features(qk_norm="head", free_head_dim=False, ffn_auto_adjust=True),
    keys={
        **{k: v for k, v in _LLAMA_KEYS.items() if k not in ("head_dim", "activation")},
        "norm_eps": "norm_eps",
        "block_types": "layer_types",
    },
    fixed={"qkv_bias": False, "o_bias": False, "mlp_bias": False, "activation": "silu"},
    defaults={"tie": True, "context": 128000, "norm_eps": 1e-5},
    alt_keys={"intermediate_size": "block_ff_dim", "tie_word_embeddings": "tie_embedding"},  # LFM2's Hub spelling
    kinds={"conv": ("shortconv", "mlp"), "full_attention": ("attention", "mlp")},  # nn/shortconv.py
    kind_default="full_attention",
)

QWEN3_NEXT = Arch(
    name="qwen3_next",
    model_type="qwen3_next",
    hf_class="Qwen3NextForCausalLM",
    block="model.layers.{i}.",
    modules={**_MOE_MODULES, "mixer": "linear_attn"},
    features=Features(
        moe=True,
        qk_norm="head",
        norm_offset=1.0,  # zero-centred RMSNorm: gain 1 + w (not the Gated DeltaNet's inner norm: gain w)
        attn_output_gate=True,
        fixed_eps=True,  # rms_norm_eps is also the eps of norms over inner dims (q/k, the mixer's): kept by growth,
        #                 which scales the residual by sqrt(D/d) instead
    ),
    keys={
        **_MOE_KEYS,
        "shared_ffn": "shared_expert_intermediate_size",
        "qkv_bias": "attention_bias",
        "o_bias": "attention_bias",
        "block_types": "layer_types",
    },
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6, "rotary_fraction": 0.25},
    require=_SPARSE_EVERY_LAYER,
    kinds={"linear_attention": ("gdn", "mlp"), "full_attention": ("attention", "mlp")},  # nn/deltanet.py
    kind_default="full_attention",
)

QWEN3_5_TEXT = Arch(  # Qwen3.5's text decoder: Qwen3-Next's blocks with a dense MLP and split mixer projections
    name="qwen3_5_text",
    model_type="qwen3_5_text",
    hf_class="Qwen3_5ForCausalLM",
    block="model.layers.{i}.",
    modules={**_LLAMA_MODULES, "mixer": "linear_attn"},
    features=dataclasses.replace(QWEN3_NEXT.features, moe=False, gdn_split=True),
    keys={**_LLAMA_KEYS, "qkv_bias": "attention_bias", "o_bias": "attention_bias", "block_types": "layer_types"},
    fixed={"mlp_bias": False},
    defaults={"activation": "silu", "tie": False, "context": 32768, "norm_eps": 1e-6, "rotary_fraction": 0.25},
    kinds=QWEN3_NEXT.kinds,
    kind_default="full_attention",
)

QWEN3_5_MOE_TEXT = dataclasses.replace(  # Qwen3.5-MoE's text decoder: Qwen3-Next with split mixer projections
    QWEN3_NEXT,
    name="qwen3_5_moe_text",
    model_type="qwen3_5_moe_text",
    hf_class="Qwen3_5MoeForCausalLM",
    features=dataclasses.replace(QWEN3_NEXT.features, gdn_split=True),
    fixed={"mlp_bias": False, "norm_topk": True},  # the router always renormalises its top-k; every layer sparse
    require={},
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
        *(GRANITEMOE, GRANITEMOESHARED, DBRX),
        GPT_OSS,
        LLAMA4_TEXT,
        *(GLM4_MOE, DOTS1, MINIMAX_M2, ERNIE4_5_MOE, EXAONE_MOE, HUNYUAN_MOE),
        *(DEEPSEEK_V2, DEEPSEEK_V3),
        *(NEMOTRON_H, MAMBA2, GRANITE_HYBRID, MAMBA, FALCON_H1),
        *(LFM2, QWEN3_NEXT, QWEN3_5_TEXT, QWEN3_5_MOE_TEXT),
    )
}
BY_MODEL_TYPE = {a.model_type: a for a in ARCHS.values()}

# Decoder families transformers has and growtool does not grow yet: model_type -> the mechanism missing
# (refused with one line naming it, instead of "unknown family").
_MAMBA = "Mamba state-space mixer layers"
_QWEN3_5_VL = (
    "Qwen3.5's vision-language wrapper (the decoder nested under text_config and model.language_model; "
    "its text decoder saved alone, qwen3_5_text / qwen3_5_moe_text, grows)"
)
_PLE = "per-layer embeddings and AltUp"
UNSUPPORTED = {
    "kimi_k2": "kimi_k2 as a model type of its own: transformers has none (Kimi K2 is DeepSeek-V3's architecture; "
    "its config.json with model_type deepseek_v3 is read as DeepSeek-V3)",
    "llama4": "the multimodal Llama 4 wrapper (a vision tower, the text model under text_config); its text model "
    "(model_type llama4_text) grows",
    "jamba": "Jamba's 3-D fused experts and its block kinds given by period rules (attn_layer_period)",
    "zamba2": _MAMBA,
    "qwen3_5": _QWEN3_5_VL,
    "qwen3_5_moe": _QWEN3_5_VL,
    "kimi_linear": "Kimi delta attention (KDA) mixer layers and MLA",
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


def block_features(cfg) -> Features:
    """The features of the config's blocks: the family's, without its q/k norm where the config switches
    it off (``qk_norm_key``, GLM-4-MoE's use_qk_norm false or absent)."""
    f = arch_of(cfg).features
    return dataclasses.replace(f, qk_norm="") if f.qk_norm_key and not cfg.extra.get(f.qk_norm_key) else f


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
    expert_axis: int | None = None  # a 3-D tensor of all experts (Llama 4): this axis counts them (cfg.experts)
    sub: str = ""  # the part of a block holding it (``block_parts``): a sublayer ("attention", "mlp", "mamba",
    #                "shortconv", "gdn"), or in an MoE family with dense blocks its MLP's form ("moe" or "dense",
    #                ``ModelConfig.moe_layers``); "" every block
    shape: tuple = ()  # an inner tensor's shape (role "inner": kept by width growth)
    tail: tuple = ()  # a per-unit tensor's shape after its unit axis (LFM2's depthwise conv weight: (1, kernel))


def _qkv_units(f: Features) -> tuple[str, ...]:
    return {"interleaved": ("qkv",), "grouped": ("qkvg",)}.get(f.qkv, ("q", "kv", "kv"))


def arch_specs(a: Arch, cfg) -> list[TensorSpec]:
    """The tensor table of an architecture under a config's flags, derived from slots + features.
    A block tensor's ``sub`` names the part of a block it belongs to (a sublayer, or an MoE family's MoE or
    dense MLP; "" the block's own): a block holds only its parts' tensors (``block_parts``, ``tensor_specs``)."""
    f, B = block_features(cfg), a.block
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
    for sub in ("shortconv", "gdn"):  # LFM2's, Qwen3-Next's mixer
        if sub in arch_sublayers(a):
            s += _tag(sub, norm("ln1") + mixer_specs(a, cfg, sub, reader, writer))
    if cfg.gated:
        s.append(TensorSpec(B + "growth_gate", "growth_gate"))
    s += norm("final_norm")
    if not cfg.tie:
        s.append(TensorSpec(w("head"), "head", res_axis=1, norm=a.modules["final_norm"]))
    if has_head_bias(cfg):
        s.append(TensorSpec(w("head")[: -len("weight")] + "bias", "head_bias"))
    return s


def _tag(sub: str, specs: list[TensorSpec]) -> list[TensorSpec]:
    """The specs of a sublayer, each tagged with it (or with the finer part it already names: "moe", "dense")."""
    return [dataclasses.replace(sp, sub=sp.sub or sub) for sp in specs]


def _attention_specs(a: Arch, cfg, norm, reader, writer, w) -> list[TensorSpec]:
    """The attention sublayer's tensors: its pre-norm, q/k/v (fused, or MLA's latents), q/k norms, gate, sinks,
    output, post-norm."""
    f, B = block_features(cfg), a.block
    ln1 = B + a.modules["ln1"] if f.pre_norms else None
    s = norm("ln1") if f.pre_norms else []
    qk = f.qk_norm if f.qk_norm in ("head", "full") else ""  # norms with a learned gain (l2 has none)
    if f.mla:  # readers of the residual into the latents (or q_proj), their norms kept, their heads grown
        s += _mla_specs(w, reader, ln1, 0 if f.linear == "in_out" else 1, cfg)
    elif f.qkv == "separate":
        s += reader("q", ("qg",) if f.attn_output_gate else ("q",), "attn", ln1, cfg.qkv_bias, qk)
        s += reader("k", ("kv",), "attn", ln1, cfg.qkv_bias, qk)
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
    if f.sinks:  # one logit per query head: grown with the heads ("qgate": one element per query head)
        s.append(TensorSpec(B + a.modules["sinks"], "unit_bias", unit_axis=0, units=("qgate",), group="attn"))
    s += writer("o", ("mv",) if f.mla else ("q",), "attn", cfg.o_bias)
    if f.post_norms:
        s += norm("post_attn")
    return s


def _mlp_specs(a: Arch, cfg, norm, reader, writer, w) -> list[TensorSpec]:
    """The MLP sublayer's tensors: its pre-norm, the MLP or the experts, the activation's scalars, post-norm."""
    f, B = block_features(cfg), a.block
    ln2 = B + a.modules["ln2"] if f.pre_norms and not f.shared_norm else (B + a.modules["ln1"] if f.pre_norms else None)
    s = norm("ln2") if f.pre_norms and not f.shared_norm else []
    if f.moe:
        m = _moe_specs(a, cfg, ln2)
        s += [dataclasses.replace(sp, sub="moe") for sp in m] if f.moe_layers else m
    if not f.moe or f.moe_layers:  # a dense MLP (an MoE family's dense blocks: dense_ffn neurons, "dffn")
        u, m = ("dffn",) if f.moe else ("ffn",), []
        if f.mlp == "glu_fused":
            m += reader("gate_up", u + u, "ffn", ln2, cfg.mlp_bias)
        else:
            if f.mlp == "glu":
                m += reader("gate", u, "ffn", ln2, cfg.mlp_bias)
            m += reader("up", u, "ffn", ln2, cfg.mlp_bias)
        m += writer("down", u, "ffn", cfg.mlp_bias)
        s += [dataclasses.replace(sp, sub="dense") for sp in m] if f.moe else m
    s += [TensorSpec(B + a.modules["act"] + "." + p, "act_param") for p, _ in f.act_params]
    if f.post_norms:
        s += norm("post_ffn")
    return s


def _moe_specs(a: Arch, cfg, ln2: str | None) -> list[TensorSpec]:
    """An MoE block's tensors: the router, the experts (one module each, or fused: ``expert_specs``),
    the shared expert where the config has shared_ffn (gated by s_router where ``Features.shared_gate``)
    or, Llama 4's, of ffn neurons and ungated (``Features.shared_plain``)."""
    f, B = block_features(cfg), a.block
    r_in = 0 if f.linear == "in_out" else 1

    def w(slot):
        return B + a.modules[slot] + ".weight"

    s = [TensorSpec(w("router"), "router", r_in, 1 - r_in, ("experts",), "ffn", ln2)]
    if f.router_bias:
        s.append(TensorSpec(B + a.modules["router"] + ".bias", "router_bias"))
    if f.expert_bias:  # a buffer, not a weight: its name is the slot's path
        s.append(TensorSpec(B + a.modules["e_bias"], "expert_bias", units=f.expert_bias))
    for j in range(0 if f.experts else cfg.experts):
        e = f"{B}{a.modules['experts']}.{j}."
        s.append(TensorSpec(e + a.modules["e_gate"] + ".weight", "reader", r_in, 1 - r_in, ("ffn",), "ffn", ln2))
        s.append(TensorSpec(e + a.modules["e_up"] + ".weight", "reader", r_in, 1 - r_in, ("ffn",), "ffn", ln2))
        s.append(TensorSpec(e + a.modules["e_down"] + ".weight", "writer", 1 - r_in, r_in, ("ffn",), "ffn"))
    s += expert_specs(a, cfg, ln2) if f.experts else []
    shared, kind = cfg.shared_ffn or f.shared_plain, ("ffn",) if f.shared_plain else ("sffn",)
    if shared and "s_gate_up" in a.modules:  # [gate | up] of the shared expert in one tensor
        s.append(TensorSpec(w("s_gate_up"), "reader", r_in, 1 - r_in, kind * 2, "ffn", ln2))
    elif shared:
        for slot in ("s_gate", "s_up"):
            s.append(TensorSpec(w(slot), "reader", r_in, 1 - r_in, kind, "ffn", ln2))
            if cfg.mlp_bias:  # Ernie 4.5-MoE's shared experts have biases where use_bias says so
                bias = w(slot)[: -len("weight")] + "bias"
                s.append(TensorSpec(bias, "unit_bias", unit_axis=0, units=kind, group="ffn"))
    if shared:
        s.append(TensorSpec(w("s_down"), "writer", 1 - r_in, r_in, kind, "ffn"))
        if cfg.mlp_bias and "s_gate_up" not in a.modules:
            s.append(TensorSpec(w("s_down")[: -len("weight")] + "bias", "writer_bias", res_axis=0))
    if shared and f.shared_gate and "s_router" in a.modules:  # Qwen2-MoE's sigmoid gate (DeepSeek's has none)
        s.append(TensorSpec(w("s_router"), "router", r_in, 1 - r_in, ("one",), "ffn", ln2))
    return s


def expert_specs(a: Arch, cfg, norm: str | None) -> list[TensorSpec]:
    """The tensors of a block's fused experts (``Features.experts``, an ``ExpertLayout``), each with its
    unit and residual axes and its unit kinds: a 3-D tensor names its expert axis (0, never grown), a
    stacked 2-D one repeats its kinds once per expert along the unit axis. Readers come first, in the
    order the forward pass reads them (gate, up), then the writer."""
    lay = a.features.experts
    if lay.glu == "separate":
        slots = [("e_gate", "reader", ("ffn",)), ("e_up", "reader", ("ffn",))]
    else:
        slots = [("e_gate_up", "reader", {"halves": ("ffn", "ffn"), "interleaved": ("ffn2",)}[lay.glu])]
    out, E = [], cfg.experts
    for slot, role, units in [*slots, ("e_down", "writer", ("ffn",))]:
        rows = (lay.reader == "out_in") if role == "reader" else (lay.writer == "in_out")  # units before d
        name, ua, nm = a.block + a.modules[slot], 0 if rows else 1, norm if role == "reader" else None
        if lay.stacked:
            out.append(TensorSpec(name, role, 1 - ua, ua, units * E, "ffn", nm))
        else:
            out.append(TensorSpec(name, role, 2 - ua, 1 + ua, units, "ffn", nm, "", 0))
        bias = a.block + a.modules.get(slot + "_bias", "") if lay.bias else None
        if bias and role == "writer":
            out.append(TensorSpec(bias, "writer_bias", res_axis=1, expert_axis=0))
        elif bias:
            ax = (0, units * E, None) if lay.stacked else (1, units, 0)
            out.append(TensorSpec(bias, "unit_bias", unit_axis=ax[0], units=ax[1], group="ffn", expert_axis=ax[2]))
    return out


def _mla_specs(w, reader, ln1: str, r_in: int, cfg) -> list[TensorSpec]:
    """MLA's attention tensors but o_proj: q_a_proj and kv_a_proj_with_mqa read the normed residual into
    latents of fixed rank (role router, with their biases), or q_proj reads it into the query heads; the
    latents' norms never see the residual (kept by width growth), their up-projections grow with the heads."""

    def latent(slot, units):
        out = [TensorSpec(w(slot), "router", r_in, 1 - r_in, units, "attn", ln1)]
        if cfg.qkv_bias:
            out.append(TensorSpec(w(slot)[: -len("weight")] + "bias", "latent_bias", unit_axis=0, units=units))
        return out

    s = []
    if cfg.q_lora_rank:
        s += latent("q_a", ("qa",)) + [TensorSpec(w("q_a_norm"), "latent_norm", unit_axis=0, units=("qa",))]
        s.append(TensorSpec(w("q_b"), "head_rows", unit_axis=0, units=("mq",), group="attn"))
    else:
        s += reader("q", ("mq",), "attn", ln1, False)
    s += latent("kv_a", ("kva",)) + [TensorSpec(w("kv_a_norm"), "latent_norm", unit_axis=0, units=("kvl",))]
    return s + [TensorSpec(w("kv_b"), "head_rows", unit_axis=0, units=("mkv",), group="attn")]


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


def mixer_specs(a: Arch, cfg, sub: str, reader, writer) -> list[TensorSpec]:
    """The tensors of a mixer sublayer. LFM2's short convolution ("shortconv"): one channel per residual
    dim (unit kind "conv", grown with the width like FFN neurons): in_proj reads the normed residual into
    [B | C | x] per channel, the depthwise conv holds a kernel per channel, out_proj writes."""
    ln1, bias = a.block + a.modules["ln1"], bool(cfg.extra.get("conv_bias"))
    if sub == "gdn":
        return _gdn_specs(a, cfg)
    w = a.block + a.modules["m_conv"] + ".weight"
    s = reader("m_in", ("conv", "conv", "conv"), "attn", ln1, bias)
    kernel = (1, int(cfg.extra.get("conv_L_cache", 3)))
    s.append(TensorSpec(w, "unit_bias", unit_axis=0, units=("conv",), group="attn", tail=kernel))
    if bias:
        s.append(TensorSpec(w[: -len("weight")] + "bias", "unit_bias", unit_axis=0, units=("conv",)))
    return s + writer("m_out", ("conv",), "attn", bias)


def gdn_dims(cfg) -> tuple[int, int, int, int, int]:
    """Gated DeltaNet's inner sizes from the config: key heads, value heads, key and value head dims, conv taps."""
    e = cfg.extra
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    return (*(int(e[k]) for k in keys), int(e.get("linear_conv_kernel_dim", 4)))


def _gdn_specs(a: Arch, cfg) -> list[TensorSpec]:
    """Gated DeltaNet (Qwen3-Next): in_proj_qkvz and in_proj_ba read the normed residual into inner units, out_proj
    writes from them; the inner sizes never grow (unit kinds gdn_*: one unit each), so the conv kernel, A_log,
    dt_bias and the inner norm are ``inner`` tensors width growth keeps."""
    nk, nv, dk, dv, taps = gdn_dims(cfg)
    ln1, m = a.block + a.modules["ln1"], a.block + a.modules["mixer"] + "."
    readers = {"qkvz": "gdn_qkvz", "ba": "gdn_ba"}  # Qwen3-Next; Qwen3.5:
    if a.features.gdn_split:
        readers = {"qkv": "gdn_qkv", "z": "gdn_v", "b": "gdn_h", "a": "gdn_h"}
    s = [TensorSpec(f"{m}in_proj_{n}.weight", "reader", 1, 0, (kind,), "attn", ln1) for n, kind in readers.items()]
    s.append(TensorSpec(m + "conv1d.weight", "inner", shape=(2 * nk * dk + nv * dv, 1, taps)))
    s += [TensorSpec(m + n, "inner", shape=(nv,)) for n in ("dt_bias", "A_log")]
    s.append(TensorSpec(m + "norm.weight", "inner", shape=(dv,)))
    return s + [TensorSpec(m + "out_proj.weight", "writer", 0, 1, ("gdn_v",), "attn")]


def block_sublayers(cfg, layer: int) -> tuple[str, ...]:
    """The sublayers block ``layer`` runs, in order: ("attention", "mlp") but in hybrids (``Arch.kinds``)."""
    a = arch_of(cfg)
    if not a.kinds:
        return ("attention", "mlp")
    return a.kinds[cfg.block_types[layer] if cfg.block_types else a.kind_default]


def block_parts(cfg, layer: int) -> set[str]:
    """The parts block ``layer`` holds (``TensorSpec.sub``): "" (the block's own), its sublayers and, in an
    MoE family with dense blocks (``Features.moe_layers``), its MLP's form: "moe" or "dense"."""
    parts = {"", *block_sublayers(cfg, layer)}
    if "mlp" in parts and arch_of(cfg).features.moe_layers:
        parts.add("moe" if cfg.is_moe(layer) else "dense")
    return parts


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
        "ffn2": (cfg.ffn, 2),  # one FFN neuron's (gate, up) pair, interleaved in a fused tensor (GPT-OSS)
        "sffn": (cfg.shared_ffn or 0, 1),
        "dffn": (cfg.dense_ffn or 0, 1),  # the dense blocks' FFN neurons beside MoE blocks (Llama 4)
        "experts": (cfg.experts or 0, 1),  # a router's outputs: one logit per expert, never grown
        "one": (1, 1),  # the shared expert's gate logit
        **_mla_units(cfg),
        "conv": (cfg.width, 1),  # LFM2's short-convolution channels, one per residual dim
        "qg": (cfg.heads, 2 * cfg.head_dim),  # Qwen3-Next's q_proj: per head [q | output gate]
        **({k: (1, n) for k, n in _gdn_units(cfg).items()} if kind.startswith("gdn_") else {}),
    }[kind]


def _mla_units(cfg) -> dict:
    """MLA's unit kinds (see the module docstring); none without MLA."""
    if not arch_of(cfg).features.mla:
        return {}
    nope, v, kvl = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    return {
        "mq": (cfg.heads, nope + cfg.head_dim),
        "mv": (cfg.heads, v),
        "mkv": (cfg.heads, nope + v),
        "qa": (cfg.q_lora_rank or 0, 1),
        "kvl": (kvl, 1),
        "kva": (kvl + cfg.head_dim, 1),
    }


GDN_UNITS = ("gdn_qkvz", "gdn_ba", "gdn_v", "gdn_qkv", "gdn_h")


def _gdn_units(cfg) -> dict[str, int]:
    """Gated DeltaNet's inner outputs, never grown (one unit each): its projections' outputs (in_proj_qkvz, in_proj_ba;
    in_proj_qkv, in_proj_b / in_proj_a; in_proj_z and out_proj's inputs), ``GDN_UNITS``."""
    nk, nv, dk, dv, _ = gdn_dims(cfg)
    qkv = 2 * nk * dk + nv * dv
    return {"gdn_qkvz": qkv + nv * dv, "gdn_ba": 2 * nv, "gdn_v": nv * dv, "gdn_qkv": qkv, "gdn_h": nv}


def per_config(fn):
    """Memoise ``fn(cfg) -> dict``, a pure function of the config and its architecture, by the config's
    repr (every field) and the ``Arch`` it names: a surgery asks for a table once per tensor. Each call
    returns a copy, so a caller may change it."""
    memo: dict[str, tuple[Arch, dict]] = {}

    def wrapped(cfg) -> dict:
        if not dataclasses.is_dataclass(cfg):  # its repr need not name its values
            return fn(cfg)
        a, key = arch_of(cfg), repr(cfg)
        hit = memo.get(key)
        if hit is None or hit[0] is not a:
            if len(memo) >= 64:
                memo.clear()
            hit = memo[key] = (a, fn(cfg))
        return dict(hit[1])

    return functools.wraps(fn)(wrapped)


@per_config
def tensor_specs(cfg) -> dict[str, TensorSpec]:
    """Every tensor name the config's checkpoint must hold, mapped to its spec (in file order):
    the non-block tensors first, then block after block, then the final norm and head."""
    specs = arch_specs(arch_of(cfg), cfg)
    flat = [sp for sp in specs if "{i}" not in sp.pattern]
    out = {sp.pattern: sp for sp in flat if sp.role == "embedding"}
    for i in range(cfg.layers):
        parts = block_parts(cfg, i)
        out.update((sp.pattern.format(i=i), sp) for sp in specs if "{i}" in sp.pattern and sp.sub in parts)
    for sp in flat:
        out.setdefault(sp.pattern, sp)
    return out


def float32_names(cfg) -> set[str]:
    """The tensors transformers keeps in float32 whatever the checkpoint's dtype (``Features.fp32``)."""
    a = arch_of(cfg)
    ends = tuple("." + a.modules[s] + ("" if s == "e_bias" else ".weight") for s in a.features.fp32)
    return {n for n in tensor_specs(cfg) if ends and n.endswith(ends)}


def tensor_shape(name: str, spec: TensorSpec, cfg) -> tuple[int, ...]:
    """The shape a tensor must have under cfg (derived from the spec's axes)."""
    if spec.role == "growth_gate":
        return (1,)
    if spec.role == "writer_bias" and spec.expert_axis is not None:
        return (cfg.experts, cfg.width)
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
    if spec.role == "router_bias":
        return (cfg.experts,)
    if spec.role == "expert_bias":  # (experts,) or (1, experts)
        return tuple(unit_count(cfg, k)[0] for k in spec.units)
    units = sum(n * b for n, b in (unit_count(cfg, k) for k in spec.units))
    if spec.role in ("unit_bias", "unit_norm", "latent_norm", "latent_bias"):
        return (units, *spec.tail) if spec.expert_axis is None else (cfg.experts, units)
    if spec.role == "head_rows":  # [heads' rows, the latent they read]
        return (units, {"mq": cfg.q_lora_rank, "mkv": cfg.kv_lora_rank}[spec.units[0]])
    shape = [0, 0] if spec.expert_axis is None else [0, 0, 0]
    if spec.expert_axis is not None:
        shape[spec.expert_axis] = cfg.experts
    shape[spec.res_axis] = cfg.width
    shape[spec.unit_axis] = units
    return tuple(shape)


@per_config
def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    return {n: tensor_shape(n, s, cfg) for n, s in tensor_specs(cfg).items()}
