"""The model config: one dataclass for every architecture, and its mapping to HF config.json.

Which HF key holds which field is data in ``families.Arch`` (``keys``, ``fixed``, ``defaults``);
this module only applies it. The whole source config.json travels in ``extra`` and is written
back with the managed keys updated, so a grown folder is the same kind of model as its source
(sliding windows, layer types, RoPE settings, token ids, dtype and the rest carried unchanged).

Growth state lives here too: ``base_heads`` / ``base_ffn`` count the units that are *not*
behind the warm-up gate. Units with a higher index (appended by a gated growth stage) have
their outputs multiplied by the block's gate. A plain model has base_* equal to the totals.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .errors import GrowError
from .families import ARCHS, BY_MODEL_TYPE, UNSUPPORTED, arch_of, arch_sublayers, expected_shapes, unit_count
from .hybrid_keys import SSM_SIZES, auto_ffn, check_gdn, mixer_to_hf, ssm_from_hf, ssm_to_hf
from .hybrid_keys import block_types as block_types_from_hf
from .moe_layers import from_hf as moe_layers_from_hf
from .moe_layers import to_hf as moe_layers_to_hf
from .rope import check as rope_check
from .rope import from_hf as rope_from_hf
from .rope import to_hf as rope_to_hf

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "bloom_gelu", "relu2", "xielu")
FEATURE_FALLBACK = {
    "qkv_bias": False,
    "o_bias": False,
    "mlp_bias": False,
    "activation": "silu",
    "rotary_fraction": 1.0,
    "parallel": False,
    "norm_topk": False,
    "swiglu_alpha": None,  # GPT-OSS's clamped GLU: its family's defaults, also for a config made in code
    "swiglu_limit": None,
    "shared_experts": None,
    "router_jitter": None,  # PhiMoE's default (0.01) where a config built in code leaves it out
}
# keys that describe how a folder is loaded, not the model: rewritten on every save
_NOT_CARRIED = ("growtool", "auto_map", "architectures", "model_type")


def hf_get(hf: dict, key: str, default=None):
    """``hf.get(key, default)``; a dotted key (DBRX's ``attn_config.kv_n_heads``) reads the nested dicts,
    ``default`` where a level is absent or the value is null."""
    if "." not in key:
        return hf.get(key, default)
    for part in key.split("."):
        hf = hf.get(part) if isinstance(hf, dict) else None
    return default if hf is None else hf


def hf_put(hf: dict, key: str, val) -> None:
    """``hf[key] = val``; a dotted key writes into copies of the nested dicts (the source's stay as read)."""
    *path, last = key.split(".")
    for part in path:
        hf[part] = dict(hf.get(part) or {})
        hf = hf[part]
    hf[last] = val


# optional numbers of a config (None: absent), checked by ``ModelConfig.check``; POSITIVE ones above 0
SCALARS = (
    "rope_theta",
    "rope_local_theta",
    "attn_softcap",
    "final_softcap",
    "query_pre_attn_scalar",
    "clip_qkv",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
    "logit_scale",
    "swiglu_alpha",
    "swiglu_limit",
    "routed_scale",
)
# ModelConfig's lists with one entry per block: depth growth gives each new block its source block's entry
PER_BLOCK = ("layer_types", "rope_layers", "moe_layers", "block_types")
POSITIVE = (
    *("rope_theta", "rope_local_theta", "attn_softcap", "final_softcap", "query_pre_attn_scalar", "clip_qkv"),
    *("swiglu_limit", "routed_scale"),
)


def _per_model(val, key):
    """A value some configs list per block (HunYuan-MoE's moe_topk): one value when every block has it."""
    if isinstance(val, list):
        if len(set(val)) != 1:
            raise GrowError(f"{key} differs between blocks ({val[:4]}...): per-block values are not supported")
        return val[0]
    return val


@dataclass
class ModelConfig:
    family: str  # the architecture's name (a key of families.ARCHS)
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
    qkv_bias: bool | None = None  # None: the architecture's value (see Arch.fixed / defaults)
    rope_theta: float = 10000.0
    base_heads: int | None = None  # units below these counts are ungated
    base_ffn: int | None = None
    extra: dict = field(default_factory=dict)  # the source HF config, carried through
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    activation: str | None = None
    rotary_fraction: float | None = None  # share of head_dim that RoPE rotates
    parallel: bool | None = None  # attention and MLP read the same residual (GPT-NeoX)
    sliding_window: int | None = None
    layer_types: list | None = None  # per layer "full_attention" | "sliding_attention"
    rope_local_theta: float | None = None  # RoPE base of sliding layers, when it differs (Gemma 3)
    attn_softcap: float | None = None  # attention scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    query_pre_attn_scalar: float | None = None  # attention scale 1/sqrt(this) instead of 1/sqrt(head_dim)
    rope_scaling: dict | None = None  # RoPE scaling (linear, dynamic, yarn, longrope, llama3): see rope.py
    clip_qkv: float | None = None  # q, k and v clamped to [-clip, clip] after their projections (OLMo)
    embedding_multiplier: float | None = None  # embeddings x this (Granite)
    residual_multiplier: float | None = None  # each sublayer's output x this before the residual add (Granite)
    attention_multiplier: float | None = None  # the attention score scale, instead of 1/sqrt(head_dim) (Granite)
    logits_scaling: float | None = None  # logits / this (Granite)
    logit_scale: float | None = None  # logits x this (Cohere)
    rope_layers: list | None = None  # per layer 1 (RoPE) or 0 (none): SmolLM3's no_rope_layers
    experts: int | None = None  # mixture of experts: experts per block, each an FFN of ``ffn`` neurons
    top_k: int | None = None  # experts each token is routed to
    norm_topk: bool | None = None  # the top_k routing weights renormalised to sum 1
    shared_ffn: int | None = None  # neurons of the shared expert (Qwen2-MoE), gated by sigmoid(x w)
    base_shared_ffn: int | None = None  # shared-expert neurons below this count are ungated
    router_jitter: float | None = None  # PhiMoE's sparsemixer: experts whose logit is within 2 x this (relative) pass
    new_layers: list | None = None  # blocks added by depth growth: their residual writes pass the gate
    swiglu_alpha: float | None = None  # GPT-OSS's clamped GLU (moe.clamped_glu): the sigmoid's gain
    swiglu_limit: float | None = None  # ... and the clamp of gate (above) and up (both sides)
    q_lora_rank: int | None = None  # MLA (nn/mla.py): the query latent's rank (None: a plain q_proj)
    kv_lora_rank: int | None = None  # MLA: the key/value latent's rank
    qk_nope_head_dim: int | None = None  # MLA: query/key dims per head without RoPE (head_dim: those with it)
    v_head_dim: int | None = None  # MLA: value dims per head
    # DeepSeek-style MoE (Features.routing "sigmoid" / "softmax_bias", Features.moe_layers)
    n_group: int | None = None  # experts in n_group groups: a token's experts come from its topk_group best groups
    topk_group: int | None = None
    routed_scale: float | None = None  # the routed experts' weights x this (routed_scaling_factor)
    shared_experts: int | None = None  # ungated shared experts: one GLU of shared_experts x ffn neurons (shared_ffn)
    dense_ffn: int | None = None  # neurons of the dense blocks' MLP (intermediate_size) in an MoE family
    base_dense_ffn: int | None = None  # dense-block neurons below this count are ungated
    moe_layers: list | None = None  # per block 1 (MoE) or 0 (dense); None: every block MoE (Features.moe_layers)
    base_conv: int | None = None  # LFM2: short-convolution channels (one per residual dim) below this are ungated
    block_types: list | None = None  # hybrids: each block's kind (a key of Arch.kinds), as the config lists it
    multipliers: dict | None = None  # Falcon-H1's muP scalars by Arch.mult_keys (ssm_in, ssm_out, attn_in, attn_out,
    #                                  key, mlp: [gate, down], mup: in_proj's five segments), carried by growth
    ssm: dict | None = None  # a Mamba-2 mixer's sizes (heads, head_dim, state, groups, conv, conv_bias, bias,
    #                          dt_limit): inner dimensions that width growth keeps (nn/mamba.py)

    def __post_init__(self):
        if self.family not in ARCHS:
            raise GrowError(f"unknown family {self.family!r} (known: {', '.join(ARCHS)})")
        a = arch_of(self)
        for name, fallback in FEATURE_FALLBACK.items():
            if name in a.fixed:
                setattr(self, name, a.fixed[name])
            elif getattr(self, name) is None:
                same_key = [f for f, k in a.keys.items() if f != name and k == a.keys.get(name)]
                val = getattr(self, same_key[0]) if same_key else None  # llama: attention_bias -> q/k/v and o
                setattr(self, name, val if val is not None else a.defaults.get(name, fallback))
        if self.base_heads is None:
            self.base_heads = self.heads
        if self.base_ffn is None:
            self.base_ffn = self.ffn
        if self.shared_experts and self.shared_ffn is None:
            self.shared_ffn = self.shared_experts * self.ffn
        if self.base_shared_ffn is None:
            self.base_shared_ffn = self.shared_ffn
        if self.base_dense_ffn is None:
            self.base_dense_ffn = self.dense_ffn
        if "attention" not in arch_sublayers(a):  # Mamba-2: nominal heads and MLP sizes, never gated
            self.base_heads, self.base_ffn = self.heads, self.ffn
        self.check()

    @property
    def arch(self):
        return arch_of(self)

    @property
    def gated(self) -> bool:
        """True when some units sit behind the warm-up gate (a grown, unfolded model)."""
        shared = self.shared_ffn is not None and self.base_shared_ffn < self.shared_ffn
        dense = self.dense_ffn is not None and self.base_dense_ffn < self.dense_ffn
        conv = self.base_conv is not None and self.base_conv < self.width
        grown = self.base_heads < self.heads or self.base_ffn < self.ffn or shared or dense or conv
        return grown or bool(self.new_layers)

    def base_units(self, kind: str) -> int:
        """Units of a kind that are not behind the warm-up gate ("q" heads and "qg" heads with their output
        gates, MLA's "mq" / "mv" / "mkv" heads, "ffn", "ffn2", "sffn", "dffn" neurons, LFM2's "conv" channels;
        every one of a mixer's inner units, which growth keeps)."""
        if kind in ("m_in", "m_inner") or kind.startswith("gdn_"):
            return unit_count(self, kind)[0]
        heads, conv = self.base_heads, self.width if self.base_conv is None else self.base_conv
        units = {"q": heads, "qg": heads, "mq": heads, "mv": heads, "mkv": heads, "ffn": self.base_ffn}
        units |= {"ffn2": self.base_ffn, "sffn": self.base_shared_ffn, "dffn": self.base_dense_ffn, "conv": conv}
        return units[kind]

    def is_moe(self, layer: int) -> bool:
        """Whether a block's MLP is a mixture of experts (an MoE family's dense blocks: ``moe_layers``)."""
        return self.arch.features.moe and (self.moe_layers is None or bool(self.moe_layers[layer]))

    def new_block(self, layer: int) -> bool:
        """True for a block added by depth growth (grow/depth.py), not yet folded: with its gate at 0
        it adds nothing to the residual stream, whatever its weights."""
        return bool(self.new_layers) and layer in self.new_layers

    @property
    def norm(self) -> str:
        return self.arch.features.norm

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_fraction)

    def theta(self, layer: int) -> float:
        """The RoPE base of a layer (sliding layers may have their own)."""
        sliding = self.layer_types is not None and self.layer_types[layer] == "sliding_attention"
        return self.rope_local_theta if (sliding and self.rope_local_theta) else self.rope_theta

    def window(self, layer: int) -> int | None:
        """The sliding attention window of a layer (None: full causal attention)."""
        if not self.sliding_window:
            return None
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    def has_rope(self, layer: int) -> bool:
        """Whether a layer rotates q and k (``rope_layers``, and ``Features.rope_where``)."""
        if self.rope_layers is not None and not self.rope_layers[layer]:
            return False
        where = self.arch.features.rope_where
        if where == "windowed" or (where == "windowed_if_any" and self.sliding_window):
            return self.window(layer) is not None
        return True

    def check(self) -> None:
        f = self.arch.features
        for name in ("vocab_size", "width", "layers", "heads", "kv_heads", "head_dim", "ffn", "context"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise GrowError(f"config {name} must be a positive integer, got {v!r}")
        for name in SCALARS:  # a number from a config file: finite, of the right type (a string is no softcap)
            v = getattr(self, name)
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            if not ok or (v is not None and name in POSITIVE and v <= 0):
                want = "a finite positive number" if name in POSITIVE else "a finite number"
                raise GrowError(f"config {name} must be {want}, got {v!r}")
        if self.heads % self.kv_heads:
            raise GrowError(f"kv_heads {self.kv_heads} does not divide heads {self.heads}")
        if not f.gqa and self.kv_heads != self.heads:
            raise GrowError(f"{self.family} has no grouped-query attention (kv_heads must equal heads)")
        if not f.free_head_dim and self.heads * self.head_dim != self.width:
            raise GrowError(
                f"{self.family} needs heads x head_dim == width, got {self.heads} x {self.head_dim} != {self.width}"
            )
        if f.positions == "rope" and (self.rotary_dim % 2 or not 0 < self.rotary_fraction <= 1):
            raise GrowError(
                f"RoPE needs an even rotary dimension, got head_dim {self.head_dim} x {self.rotary_fraction}"
            )
        if f.positions == "rope":
            rope_check(self)
        if self.activation not in ACTIVATIONS:
            raise GrowError(f"activation {self.activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        if not (0 < self.norm_eps < 1):
            raise GrowError(f"norm eps must be in (0, 1), got {self.norm_eps}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise GrowError(f"sliding_window must be a positive integer, got {self.sliding_window!r}")
        if self.layer_types is not None and len(self.layer_types) != self.layers:
            raise GrowError(f"layer_types has {len(self.layer_types)} entries for {self.layers} layers")
        if self.rope_layers is not None and len(self.rope_layers) != self.layers:
            raise GrowError(f"no_rope_layers has {len(self.rope_layers)} entries for {self.layers} layers")
        if not (0 < self.base_heads <= self.heads and 0 < self.base_ffn <= self.ffn):
            raise GrowError("growth state base_heads/base_ffn out of range")
        no_key = "ffn" not in self.arch.keys and "mlp" in arch_sublayers(self.arch)
        if no_key and self.ffn != 4 * self.width:  # BLOOM: 4 x hidden_size in code
            raise GrowError(f"{self.family} has an MLP of 4 x width ({4 * self.width}) neurons, not {self.ffn}")
        if f.shared_norm and not self.parallel:
            raise GrowError(f"{self.family} reads one norm in attention and MLP: it must be parallel")
        routed = f.moe and (self.moe_layers is None or any(self.moe_layers))  # all blocks dense: no routing
        if routed:
            self._check_moe()
        if f.mqa and self.kv_heads != 1:
            raise GrowError(f"{self.family} has one key/value head (multi-query attention), got {self.kv_heads}")
        if not f.mqa and self.base_heads % (self.heads // self.kv_heads):
            raise GrowError("base_heads must cover whole KV groups")
        if f.mla:
            self._check_mla()
        self._check_kinds()
        if "gdn" in arch_sublayers(self.arch):
            check_gdn(self)
        nl = self.new_layers or []
        if any(not isinstance(i, int) or not 0 <= i < self.layers for i in nl) or list(nl) != sorted(set(nl)):
            raise GrowError(f"growth state new_layers {nl!r}: distinct increasing block indices below {self.layers}")

    def _check_mla(self) -> None:
        """Multi-head latent attention: positive dims; no gated attention; DeepSeek-V2's mlp_bias only
        without MoE blocks (its shared experts would have biases)."""
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim") + (("q_lora_rank",) if self.q_lora_rank else ()):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise GrowError(f"config {name} must be a positive integer, got {v!r}")
        if self.mlp_bias and any(self.moe_layers or [1]):
            raise GrowError(f"{self.family} with mlp_bias and MoE blocks (shared experts with biases) is not supported")
        if self.attn_gate:
            raise GrowError(f"{self.family}: gated attention is not supported with multi-head latent attention")

    def _check_moe(self) -> None:
        """An MoE config's fields: experts and a top-k they can fill; DeepSeek-style MoE's groups that divide
        the experts, a top-k they can fill, one entry per block in moe_layers, shared experts that are whole
        experts, dense blocks with a width."""
        if not (isinstance(self.experts, int) and isinstance(self.top_k, int)):
            raise GrowError(f"{self.family} needs the number of experts and of experts per token")
        if not 0 < self.top_k <= self.experts:
            raise GrowError(f"experts per token {self.top_k} must be in 1..{self.experts} (the experts)")
        E, g = self.experts, self.n_group or 1
        if not isinstance(g, int) or g < 1 or E % g or (g > 1 and E // g < 2):
            raise GrowError(f"n_group {self.n_group} must divide the {E} experts into groups of at least 2")
        tg = self.topk_group or 1
        if not isinstance(tg, int) or not 1 <= tg <= g or self.top_k > tg * (E // g):
            raise GrowError(f"topk_group {self.topk_group}: 1..{g} groups holding the {self.top_k} experts per token")
        if self.moe_layers is not None and len(self.moe_layers) != self.layers:
            raise GrowError(f"the MoE-layer list has {len(self.moe_layers)} entries for {self.layers} layers")
        if self.shared_experts and self.shared_ffn != self.shared_experts * self.ffn:
            raise GrowError(f"shared experts {self.shared_experts} x {self.ffn} neurons != {self.shared_ffn}")
        if self.moe_layers is not None and not all(self.moe_layers) and not (self.dense_ffn or 0) > 0:
            raise GrowError("dense blocks need a positive intermediate_size")
        if self.dense_ffn is not None and not 0 < self.base_dense_ffn <= self.dense_ffn:
            raise GrowError("growth state base_dense_ffn out of range")

    def _check_kinds(self) -> None:
        """A hybrid's block kinds: one known kind per layer; a Mamba mixer's sizes whole and consistent."""
        a = self.arch
        if a.kinds and not a.kind_default and self.block_types is None:
            raise GrowError(f"{self.family} config lists no block kinds ({a.keys.get('block_types')})")
        if self.block_types is not None:
            if len(self.block_types) != self.layers:
                raise GrowError(f"{len(self.block_types)} block kinds listed for {self.layers} layers")
            bad = sorted({str(t) for t in self.block_types if t not in a.kinds})
            if bad:
                known = ", ".join(a.kinds)
                raise GrowError(f"{self.family} block type {bad[0]!r} is not supported (supported: {known})")
        if "mamba" in arch_sublayers(a):
            m = self.ssm or {}
            for k in SSM_SIZES + tuple(k for k in ("expand", "dt_rank") if k in a.ssm_keys):
                if not isinstance(m.get(k), int) or isinstance(m.get(k), bool) or m[k] <= 0:
                    raise GrowError(f"{self.family} Mamba mixer {k} must be a positive integer, got {m.get(k)!r}")
            if m["heads"] % m["groups"]:
                raise GrowError(f"Mamba mixer groups {m['groups']} do not divide its heads {m['heads']}")
            if "expand" in a.ssm_keys and m["expand"] * self.width != m["heads"] * m["head_dim"]:
                raise GrowError(
                    f"{self.family} Mamba mixer: expand x width ({m['expand']} x {self.width}) must equal heads x "
                    f"head_dim ({m['heads']} x {m['head_dim']})"
                )

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def n_params(self) -> int:
        """Parameters, counted from the checkpoint's tensor shapes (a tied head counts once)."""
        total = 0
        for shape in expected_shapes(self).values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    # ---- Hugging Face config.json -------------------------------------------------------

    def to_hf(self) -> dict:
        """An HF config dict (loads in transformers as the architecture's stock class), plus a
        ``growtool`` section. Remote-code folders (gated models) are made from it by ``hf_remote``."""
        a = self.arch
        hf = {**a.template, **self.extra}
        for name, key in a.keys.items():
            if name in a.fixed:
                continue
            val = getattr(self, name)
            if val is None and key not in hf and hf_get(hf, key) is None:
                continue
            hf_put(hf, key, val)
            if a.alt_keys.get(key) in hf:  # the other spelling the source used says the same (it may win on load)
                hf[a.alt_keys[key]] = val
        for key, name in a.mirrors.items():
            hf_put(hf, key, getattr(self, name))
        if a.features.free_head_dim:
            hf["head_dim"] = self.head_dim
        if a.features.positions == "rope":
            rp = {k: dict(v) if isinstance(v, dict) else v for k, v in (hf.get("rope_parameters") or {}).items()}
            if a.features.rope_per_type and "full_attention" not in rp:  # a legacy (4.x) spelling: made per type
                rp = {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}
                if "rope_local_base_freq" in hf:
                    hf["rope_local_base_freq"] = self.rope_local_theta or self.rope_theta
            if "full_attention" in rp:  # one RoPE per layer type (Gemma 3)
                rp["full_attention"]["rope_theta"] = self.rope_theta
                if "sliding_attention" in rp:
                    rp["sliding_attention"]["rope_theta"] = self.rope_local_theta or self.rope_theta
            else:
                rp.setdefault("rope_type", "default")
                rp["rope_theta"] = self.rope_theta
                if self.rotary_fraction != 1.0 or "partial_rotary_factor" in rp:
                    rp["partial_rotary_factor"] = self.rotary_fraction
                hf["rope_theta"] = self.rope_theta  # transformers 4.x reads the top-level key
            rope_to_hf(self, hf, rp)
            hf["rope_parameters"] = rp
        if a.features.moe_layers and self.moe_layers is not None:
            moe_layers_to_hf(a.features.moe_layers[0], self.moe_layers, hf)
        if self.ssm:
            ssm_to_hf(a, self.ssm, hf)
        if self.block_types is not None and "hybrid_override_pattern" in hf:  # the legacy (4.x) spelling
            hf["hybrid_override_pattern"] = "".join(a.kind_codes[t] for t in self.block_types)
        hf["model_type"], hf["architectures"] = a.model_type, [a.hf_class]
        hf["growtool"] = {"attn_gate": self.attn_gate, "base_heads": self.base_heads, "base_ffn": self.base_ffn}
        if self.shared_ffn is not None:
            hf["growtool"]["base_shared_ffn"] = self.base_shared_ffn
        if self.dense_ffn is not None:
            hf["growtool"]["base_dense_ffn"] = self.base_dense_ffn
        if self.new_layers:
            hf["growtool"]["new_layers"] = list(self.new_layers)
        if self.base_conv is not None:
            hf["growtool"]["base_conv"] = self.base_conv
        if a.kinds:
            mixer_to_hf(self, hf)
        return hf

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Read an HF config dict (ours, or one written by transformers, old or new)."""
        if not isinstance(hf, dict):
            raise GrowError("config is not a JSON object")
        own = hf.get("growtool") or {}
        mt = own.get("model_type") if hf.get("model_type") == "growtool" else hf.get("model_type")
        if mt in UNSUPPORTED:
            raise GrowError(f"{mt} is not supported yet: growtool does not implement {UNSUPPORTED[mt]}")
        if mt not in BY_MODEL_TYPE:
            raise GrowError(f"unknown family (model_type {mt!r}; known: {', '.join(BY_MODEL_TYPE)})")
        a = BY_MODEL_TYPE[mt]
        if a.features.ffn_auto_adjust:  # LFM2: transformers reads block_ff_dim / tie_embedding over the new keys
            hf = {**hf, **{k: hf[alt] for k, alt in a.alt_keys.items() if alt in hf}}
        for key, reason in a.refuse.items():
            if hf_get(hf, key):
                raise GrowError(reason)
        for key, (want, reason, *absent) in a.require.items():  # want: a value or a tuple of values
            got = hf_get(hf, key, absent[0] if absent else want)
            if got not in (want if isinstance(want, tuple) else (want,)):
                raise GrowError(reason)
        for key, name in a.mirrors.items():
            mine, other = hf_get(hf, key), hf_get(hf, a.keys[name])
            if mine is not None and mine != other:
                raise GrowError(f"{a.name} {key} {mine} different from {a.keys[name]} {other} is not supported")

        def get(name, default=None):
            key = a.keys.get(name)
            val = hf_get(hf, key) if key else None
            if val is None and key in a.alt_keys:
                val = hf.get(a.alt_keys[key])
            if val is None and name == "layers" and a.kinds:  # Nemotron-H: as many layers as its block kinds
                kinds = hf.get(a.keys.get("block_types"), hf.get("hybrid_override_pattern"))
                val = len(kinds) if isinstance(kinds, (list, str)) else None
            return val if val is not None else a.defaults.get(name, default)

        try:
            d, h = int(get("width")), int(get("heads"))
            hd = hf.get(a.keys.get("head_dim", "head_dim")) if a.features.free_head_dim else None
            if hd is None:
                if d % h:
                    raise GrowError(f"heads {h} do not divide width {d} and no head_dim is given")
                hd = d // h
            rp = hf.get("rope_parameters") or {}
            local = hf.get("rope_local_base_freq")
            if "full_attention" in rp:  # one RoPE per layer type (Gemma 3)
                local = (rp.get("sliding_attention") or {}).get("rope_theta", local)
                rp = rp["full_attention"]
            scaling = rope_from_hf(hf, int(get("context"))) if a.features.positions == "rope" else None
            if scaling and a.features.rope_per_type and "rope_type" in scaling:  # legacy global rope_scaling:
                scaling = {"full_attention": scaling}  # transformers applies it to the full-attention layers
            theta = rp.get("rope_theta") or hf.get("rope_theta") or hf.get("rotary_emb_base") or 10000.0
            frac = rp.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or hf.get("rotary_pct")
            if frac is None and hf.get("rotary_dim"):  # GPT-J: rotated dims per head, absolute
                frac = int(hf["rotary_dim"]) / int(hd)
            window = get("sliding_window")
            if hf.get("use_sliding_window") is False:
                window = None  # Qwen2/3 keep a window size in the config but switch it off
            types = get("layer_types")
            if window and types is None and hf.get("max_window_layers") is not None and "layer_types" in a.keys:
                types = [
                    "sliding_attention" if i >= hf["max_window_layers"] else "full_attention"
                    for i in range(int(get("layers")))
                ]
            if window and types is None and a.window_every:  # transformers' rule for configs without layer_types
                every = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or a.window_every)
                types = [
                    "sliding_attention" if (i + 1) % every else "full_attention" for i in range(int(get("layers")))
                ]
            rope_layers = get("rope_layers") or None  # transformers reads an empty list as absent too
            if rope_layers is None and "rope_layers" in a.keys:  # SmolLM3's default: none every 4th layer
                every = int(hf.get("no_rope_layer_interval") or 4)
                rope_layers = [int((i + 1) % every != 0) for i in range(int(get("layers")))]
            chunk = hf.get("attention_chunk_size")
            if types is None and chunk and rope_layers is not None:  # Llama 4 without layer_types: RoPE layers chunked
                types = ["chunked_attention" if r else "full_attention" for r in rope_layers]
            cfg = cls(
                family=a.name,
                vocab_size=int(get("vocab_size")),
                width=d,
                layers=int(get("layers")),
                heads=h,
                kv_heads=int(get("kv_heads") or h),
                head_dim=int(hd),
                ffn=auto_ffn(hf, int(get("ffn"))) if a.features.ffn_auto_adjust else int(get("ffn") or 4 * d),
                context=int(get("context")),
                norm_eps=float(get("norm_eps")),
                tie=bool(get("tie")),
                attn_gate=bool(own.get("attn_gate", False)),
                qkv_bias=get("qkv_bias"),
                o_bias=get("o_bias"),
                mlp_bias=get("mlp_bias"),
                activation=get("activation"),
                rope_theta=float(theta),
                rotary_fraction=float(frac) if frac else None,
                parallel=get("parallel"),
                sliding_window=int(window) if window else None,
                layer_types=list(types) if types else None,
                rope_local_theta=float(local) if local else None,
                attn_softcap=get("attn_softcap"),
                final_softcap=get("final_softcap"),
                query_pre_attn_scalar=get("query_pre_attn_scalar"),
                rope_scaling=scaling,
                clip_qkv=get("clip_qkv"),
                embedding_multiplier=get("embedding_multiplier"),
                residual_multiplier=get("residual_multiplier"),
                attention_multiplier=get("attention_multiplier"),
                logits_scaling=get("logits_scaling"),
                logit_scale=get("logit_scale"),
                rope_layers=list(rope_layers) if rope_layers is not None else None,
                experts=get("experts"),
                top_k=_per_model(get("top_k"), a.keys.get("top_k")),
                norm_topk=get("norm_topk"),
                shared_ffn=get("shared_ffn"),
                router_jitter=get("router_jitter"),
                base_shared_ffn=own.get("base_shared_ffn"),
                base_heads=own.get("base_heads"),
                base_ffn=own.get("base_ffn"),
                new_layers=list(own["new_layers"]) if own.get("new_layers") else None,
                swiglu_alpha=get("swiglu_alpha"),
                swiglu_limit=get("swiglu_limit"),
                q_lora_rank=get("q_lora_rank"),
                kv_lora_rank=get("kv_lora_rank"),
                qk_nope_head_dim=get("qk_nope_head_dim"),
                v_head_dim=get("v_head_dim"),
                n_group=get("n_group"),
                topk_group=get("topk_group"),
                routed_scale=get("routed_scale"),
                shared_experts=get("shared_experts"),
                dense_ffn=get("dense_ffn"),
                base_dense_ffn=own.get("base_dense_ffn"),
                moe_layers=moe_layers_from_hf(a.features.moe_layers, hf, int(get("layers"))),
                base_conv=own.get("base_conv"),
                block_types=block_types_from_hf(a, hf, get("block_types")),
                ssm=ssm_from_hf(a, hf),
                multipliers={k: hf[key] for k, key in a.mult_keys.items() if hf.get(key) is not None} or None,
                extra={k: v for k, v in hf.items() if k not in _NOT_CARRIED},
            )
        except GrowError:
            raise
        except (KeyError, TypeError) as e:
            missing = [a.keys.get(n) for n in ("width", "heads", "layers", "vocab_size") if get(n) is None]
            if missing:
                raise GrowError(f"config lacks {missing[0]!r}") from None
            raise GrowError(f"config has a bad value: {e}") from None
        except ValueError as e:
            raise GrowError(f"config has a bad value: {e}") from None
        return cfg
