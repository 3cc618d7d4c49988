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
    "router_jitter": None,  # PhiMoE's default 0.01 also for a config made here
}
# keys that describe how a folder is loaded, not the model: rewritten on every save
_NOT_CARRIED = ("growtool", "auto_map", "architectures", "model_type")


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
)
SSM_SIZES = ("heads", "head_dim", "state", "groups", "conv")  # a Mamba mixer's integer sizes
POSITIVE = ("rope_theta", "rope_local_theta", "attn_softcap", "final_softcap", "query_pre_attn_scalar", "clip_qkv")


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
        if self.base_shared_ffn is None:
            self.base_shared_ffn = self.shared_ffn
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
        conv = self.base_conv is not None and self.base_conv < self.width
        return self.base_heads < self.heads or self.base_ffn < self.ffn or shared or conv or bool(self.new_layers)

    def base_units(self, kind: str) -> int:
        """Units of a kind that are not behind the warm-up gate ("q" heads and "qg" heads with their output
        gates, "ffn", "sffn" neurons, LFM2's "conv" channels; every one of a mixer's inner units, which growth
        keeps)."""
        if kind in ("m_in", "m_inner") or kind.startswith("gdn_"):
            return unit_count(self, kind)[0]
        conv = self.width if self.base_conv is None else self.base_conv
        base = {"q": self.base_heads, "qg": self.base_heads, "ffn": self.base_ffn, "sffn": self.base_shared_ffn}
        return {**base, "conv": conv}[kind]

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
        if f.moe and not (isinstance(self.experts, int) and isinstance(self.top_k, int)):
            raise GrowError(f"{self.family} needs the number of experts and of experts per token")
        if f.moe and not 0 < self.top_k <= self.experts:
            raise GrowError(f"experts per token {self.top_k} must be in 1..{self.experts} (the experts)")
        if f.mqa and self.kv_heads != 1:
            raise GrowError(f"{self.family} has one key/value head (multi-query attention), got {self.kv_heads}")
        if not f.mqa and self.base_heads % (self.heads // self.kv_heads):
            raise GrowError("base_heads must cover whole KV groups")
        self._check_kinds()
        if "gdn" in arch_sublayers(self.arch):
            _check_gdn(self)
        nl = self.new_layers or []
        if any(not isinstance(i, int) or not 0 <= i < self.layers for i in nl) or list(nl) != sorted(set(nl)):
            raise GrowError(f"growth state new_layers {nl!r}: distinct increasing block indices below {self.layers}")

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
            if val is None and key not in hf:
                continue
            hf[key] = val
            if a.alt_keys.get(key) in hf:  # the other spelling the source used says the same (it may win on load)
                hf[a.alt_keys[key]] = val
        for key, name in a.mirrors.items():
            hf[key] = getattr(self, name)
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
        if self.ssm:
            _ssm_to_hf(a, self.ssm, hf)
        if self.block_types is not None and "hybrid_override_pattern" in hf:  # the legacy (4.x) spelling
            hf["hybrid_override_pattern"] = "".join(a.kind_codes[t] for t in self.block_types)
        hf["model_type"], hf["architectures"] = a.model_type, [a.hf_class]
        hf["growtool"] = {"attn_gate": self.attn_gate, "base_heads": self.base_heads, "base_ffn": self.base_ffn}
        if self.shared_ffn is not None:
            hf["growtool"]["base_shared_ffn"] = self.base_shared_ffn
        if self.new_layers:
            hf["growtool"]["new_layers"] = list(self.new_layers)
        if self.base_conv is not None:
            hf["growtool"]["base_conv"] = self.base_conv
        if a.kinds:
            _mixer_to_hf(self, hf)
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
            if hf.get(key):
                raise GrowError(reason)
        for key, (want, reason, *absent) in a.require.items():  # want: a value or a tuple of values
            got = hf.get(key, absent[0] if absent else want)
            if got not in (want if isinstance(want, tuple) else (want,)):
                raise GrowError(reason)
        for key, name in a.mirrors.items():
            other = a.keys[name]
            if hf.get(key) is not None and hf.get(key) != hf.get(other):
                raise GrowError(f"{a.name} {key} {hf[key]} different from {other} {hf.get(other)} is not supported")

        def get(name, default=None):
            key = a.keys.get(name)
            val = hf.get(key) if key else None
            if val is None and key in a.alt_keys:
                val = hf.get(a.alt_keys[key])
            if val is None and name == "layers" and a.kinds:  # Nemotron-H: as many layers as its block kinds
                kinds = hf.get(a.keys.get("block_types"), hf.get("hybrid_override_pattern"))
                val = len(kinds) if isinstance(kinds, (list, str)) else None
            return val if val is not None else a.defaults.get(name, default)

        try:
            d, h = int(get("width")), int(get("heads"))
            hd = hf.get("head_dim") if a.features.free_head_dim else None
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
            rope_layers = get("rope_layers")
            if rope_layers is None and "rope_layers" in a.keys:  # SmolLM3's default: none every 4th layer
                every = int(hf.get("no_rope_layer_interval") or 4)
                rope_layers = [int((i + 1) % every != 0) for i in range(int(get("layers")))]
            cfg = cls(
                family=a.name,
                vocab_size=int(get("vocab_size")),
                width=d,
                layers=int(get("layers")),
                heads=h,
                kv_heads=int(get("kv_heads") or h),
                head_dim=int(hd),
                ffn=_auto_ffn(hf, int(get("ffn"))) if a.features.ffn_auto_adjust else int(get("ffn") or 4 * d),
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
                top_k=get("top_k"),
                norm_topk=get("norm_topk"),
                shared_ffn=get("shared_ffn"),
                router_jitter=get("router_jitter"),
                base_shared_ffn=own.get("base_shared_ffn"),
                base_heads=own.get("base_heads"),
                base_ffn=own.get("base_ffn"),
                new_layers=list(own["new_layers"]) if own.get("new_layers") else None,
                base_conv=own.get("base_conv"),
                block_types=_block_types(a, hf, get("block_types")),
                ssm=_ssm(a, hf),
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


def _auto_ffn(hf: dict, size: int) -> int:
    """LFM2's MLP neurons: with ``block_auto_adjust_ff_dim`` (the default) 2/3 of intermediate_size, times
    ``block_ffn_dim_multiplier``, rounded up to a multiple of ``block_multiple_of``; else intermediate_size."""
    if not hf.get("block_auto_adjust_ff_dim", True):
        return size
    size = int(hf.get("block_ffn_dim_multiplier", 1.0) * int(2 * size / 3))
    of = int(hf.get("block_multiple_of", 256))
    return of * ((size + of - 1) // of)


def _mixer_to_hf(cfg: ModelConfig, hf: dict) -> None:
    """A hybrid family's config keys besides ``layer_types``: the MLP size written as it is (LFM2's auto
    adjustment off) and ``full_attn_idxs`` following the layer types."""
    if cfg.arch.features.ffn_auto_adjust:
        hf["block_auto_adjust_ff_dim"] = False
    if "full_attn_idxs" in hf:
        hf["full_attn_idxs"] = [i for i, t in enumerate(cfg.block_types) if t == "full_attention"]


def _block_types(a, hf: dict, listed) -> list | None:
    """A hybrid's block kinds: the config's list, or its legacy pattern string (Nemotron-H's
    ``hybrid_override_pattern``, one character per block: ``Arch.kind_codes``)."""
    if not a.kinds:
        return None
    if listed is None and isinstance(hf.get("hybrid_override_pattern"), str) and a.kind_codes:
        by_code = {c: k for k, c in a.kind_codes.items()}
        pattern = hf["hybrid_override_pattern"]
        if any(c not in by_code for c in pattern):
            raise GrowError(f"{a.name} hybrid_override_pattern {pattern!r}: a block code not in {''.join(by_code)}")
        return [by_code[c] for c in pattern]
    if listed is None and "gdn" in arch_sublayers(
        a
    ):  # Qwen3-Next, 3.5: every full_attention_interval-th layer attention
        every, n = int(hf.get("full_attention_interval") or 4), int(hf[a.keys["layers"]])
        return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if listed is None and "shortconv" in arch_sublayers(a):  # LFM2: attention at full_attn_idxs (default: every layer)
        n = int(hf[a.keys["layers"]])
        full = hf.get("full_attn_idxs") or range(n)
        return ["full_attention" if i in full else "conv" for i in range(n)]
    return list(listed) if listed is not None else None


def _ssm_to_hf(a, m: dict, hf: dict) -> None:
    """A Mamba mixer's fields into ``hf``: its sizes always (Mamba-2's head_dim grows with the width), the
    rest where the config (the source's, carried in ``extra``) does not already say them in its spelling."""
    val = {
        **m,
        "inner": m["heads"] * m["head_dim"],
        "dt_min": m["dt_limit"][0],
        "norm": m.get("norm", "gated") != "none",
        "before_gate": m.get("norm") == "before_gate",
    }
    for k, key in a.ssm_keys.items():
        if k in SSM_SIZES + ("inner",) or key not in hf:
            hf[key] = list(val[k]) if k == "dt_limit" else val[k]


def _ssm(a, hf: dict) -> dict | None:
    """A Mamba-2 mixer's sizes from the config (``Arch.ssm_keys``); dt is clamped to time_step_limit, or at
    time_step_min where the family does (``Features.fixed_dt_min``)."""
    if not a.ssm_keys:
        return None
    m = {k: hf[key] if key in hf else hf.get(a.alt_keys.get(key)) for k, key in a.ssm_keys.items()}
    if a.features.fixed_dt_min:
        m["dt_limit"] = [m.pop("dt_min", None) or 0.0, float("inf")]
    # transformers writes an infinite limit as {"__float__": "Infinity"}
    m["dt_limit"] = [float(v["__float__"] if isinstance(v, dict) else v) for v in m.get("dt_limit") or (0.0, "inf")]
    m["conv_bias"], m["bias"] = bool(m.get("conv_bias", True)), bool(m.get("bias", False))
    for k in ("heads", "groups"):  # Mamba (1): one "head" of all the mixer's channels, one group
        m.setdefault(k, 1)
    if "norm" in m:  # Falcon-H1: mamba_rms_norm, and where it norms (mamba_norm_before_gate)
        m["norm"] = ("before_gate" if m.pop("before_gate", True) else "gated") if m["norm"] else "none"
    if "inner" in a.ssm_keys and m.pop("inner") is None:  # given, it is heads x head_dim (transformers checks)
        raise GrowError(f"{a.name} without {a.ssm_keys['inner']} (inner width expand x hidden_size) is not supported")
    return m


def _check_gdn(cfg: ModelConfig) -> None:
    """Gated DeltaNet's inner sizes (read from the config by ``families.gdn_dims``): positive integers, the
    value heads a multiple of the key heads."""
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    for k in (*keys, "linear_conv_kernel_dim"):
        v = cfg.extra.get(k, 4 if k == "linear_conv_kernel_dim" else None)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise GrowError(f"{cfg.family}'s Gated DeltaNet needs config {k}, a positive integer, got {v!r}")
    if cfg.extra["linear_num_value_heads"] % cfg.extra["linear_num_key_heads"]:
        raise GrowError(f"{cfg.family}'s Gated DeltaNet: linear_num_key_heads must divide linear_num_value_heads")
