"""RoPE frequencies for every rope type transformers defines for the supported families.

``default``, ``linear``, ``dynamic``, ``yarn``, ``longrope`` and ``llama3``, computed as
transformers' ``modeling_rope_utils`` computes them (the same float32 operations, in the same
order), with their attention scaling: cos and sin are multiplied by it, as transformers' rotary
embeddings do. Two types depend on the sequence length T of the forward pass:

* ``dynamic``: for T > max_position_embeddings the base becomes
  theta * (factor * T / max_pos - (factor - 1)) ** (rot / (rot - 2)) (transformers' first call at
  that length; it caches the largest length seen, a state growtool does not keep);
* ``longrope``: ``long_factor`` for T > original_max_position_embeddings, ``short_factor`` otherwise.

Width growth keeps head_dim, so the frequencies of a grown model are the source's: the scaling
parameters are carried in ``ModelConfig.rope_scaling`` and written back unchanged.

``rope_scaling`` is None (default RoPE), one dict for every layer ({"rope_type": ..., params}), or,
for configs with one RoPE per layer type (Gemma 3), a dict keyed by layer type holding the
non-default ones. Parameters are transformers' keys; ``rope_theta`` and ``partial_rotary_factor``
live in ``ModelConfig.rope_theta`` / ``rotary_fraction`` instead.

Imports only itself (the remote-code core).
"""

from __future__ import annotations

import math

import torch

from .errors import GrowError

TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
ALIASES = {"su": "longrope"}  # the name LongRoPE had in early Phi-3 configs
REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "longrope": ("long_factor", "short_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
WITH_ORIGINAL = ("llama3", "yarn", "longrope")  # types that read original_max_position_embeddings
LAYER_TYPES = ("full_attention", "sliding_attention")
_OWN_FIELDS = ("rope_theta", "partial_rotary_factor", "type")  # kept elsewhere (or a legacy duplicate)


def _normalise(r: dict, hf: dict, context: int) -> dict | None:
    """One rope dict as transformers standardises it, without theta / partial factor; None: default."""
    rtype = r.get("rope_type") or r.get("type") or "default"
    rtype = ALIASES.get(rtype, rtype)
    if rtype not in TYPES:
        raise GrowError(f"rope type {rtype!r} is not supported (supported: {', '.join(TYPES)})")
    if rtype == "dynamic" and r.get("alpha"):
        raise GrowError("rope type 'dynamic' with alpha (HunYuan's NTK-alpha RoPE) is not supported")
    if rtype == "default":
        return None
    out = {k: v for k, v in r.items() if k not in _OWN_FIELDS}
    out["rope_type"] = rtype
    if rtype in WITH_ORIGINAL:  # transformers: a top-level original_max_position_embeddings wins (Phi-3)
        out["original_max_position_embeddings"] = int(
            hf.get("original_max_position_embeddings") or r.get("original_max_position_embeddings") or context
        )
    return out


def from_hf(hf: dict, context: int) -> dict | None:
    """The scaling of an HF config: ``rope_parameters`` (transformers 5.x, flat or per layer type)
    or the legacy ``rope_scaling`` (4.x), which transformers 5.x lets win when both are set."""
    legacy = hf.get("rope_scaling")
    rp = legacy if isinstance(legacy, dict) and legacy else hf.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise GrowError(f"rope_parameters must be a JSON object, got {rp!r}")
    nested = {k: v for k, v in rp.items() if k in LAYER_TYPES and isinstance(v, dict)}
    if not nested:
        return _normalise(rp, hf, context)
    per = {k: _normalise(v, hf, context) for k, v in nested.items()}
    per = {k: v for k, v in per.items() if v is not None}
    return per or None


def layer_params(cfg, layer: int) -> dict | None:
    """The scaling of one layer (None: default RoPE)."""
    s = cfg.rope_scaling
    if not s or "rope_type" in s:
        return s or None
    kind = cfg.layer_types[layer] if cfg.layer_types is not None else "full_attention"
    return s.get(kind)


def check(cfg) -> None:
    """Raise GrowError for scaling parameters transformers would refuse (or growtool cannot run)."""
    s = cfg.rope_scaling
    if not s:
        return
    for p in [s] if "rope_type" in s else s.values():
        rtype = p.get("rope_type")
        if rtype not in TYPES:
            raise GrowError(f"rope type {rtype!r} is not supported (supported: {', '.join(TYPES)})")
        for key in REQUIRED.get(rtype, ()):
            if p.get(key) is None:
                raise GrowError(f"rope type {rtype!r} needs {key!r} in rope_parameters")
        if rtype == "longrope":
            for key in ("long_factor", "short_factor"):
                v = p[key]
                if not isinstance(v, list) or len(v) != cfg.rotary_dim // 2:
                    raise GrowError(
                        f"longrope {key} must list {cfg.rotary_dim // 2} numbers (rotary dim {cfg.rotary_dim} / 2), "
                        f"got {len(v) if isinstance(v, list) else v!r}"
                    )


def to_hf(cfg, hf: dict, rp: dict) -> None:
    """Write the scaling back into ``rp`` (the config's rope_parameters) and, when the source had
    the legacy ``rope_scaling`` key, into it too (the same dict, so old and new readers agree)."""
    s = cfg.rope_scaling
    if s and "rope_type" in s:
        rp.update(s)
    elif s:
        for kind, p in s.items():
            rp.setdefault(kind, {}).update(p)
    if isinstance(hf.get("rope_scaling"), dict) and hf["rope_scaling"] and "full_attention" not in rp:
        hf["rope_scaling"] = dict(rp)


def extends_context(cfg) -> bool:
    """True when the RoPE is meant to run past max_position_embeddings (dynamic NTK scaling)."""
    return any((layer_params(cfg, i) or {}).get("rope_type") == "dynamic" for i in range(cfg.layers))


def describe(cfg) -> list[str]:
    """What the plan says about the RoPE: the settings carried through growth unchanged."""
    s = cfg.rope_scaling
    if not s:
        return []
    items = [("", s)] if "rope_type" in s else [(f"{k}: ", v) for k, v in s.items()]
    out = []
    for where, p in items:
        _, att = inv_freq(p, cfg.rotary_dim, cfg.rope_theta, cfg.context, 1)
        keys = ", ".join(f"{k} {v:g}" for k, v in p.items() if isinstance(v, (int, float)) and k != "rope_type")
        out.append(
            f"RoPE {where}{p['rope_type']} ({keys}{', ' if keys else ''}attention factor {att:.4g}) carried unchanged: "
            f"growth keeps head_dim {cfg.head_dim}, so the frequencies are the source's"
        )
    return out


# ---- the frequencies, as transformers computes them ----------------------------------------


def _base_inv(theta, rot: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))


def inv_freq(p: dict | None, rot: int, theta: float, context: int, T: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rot / 2] float32, attention factor) of one rope dict at length T."""
    rtype = (p or {}).get("rope_type", "default")
    if rtype == "default":
        return _base_inv(theta, rot), 1.0
    if rtype == "linear":
        return _base_inv(theta, rot) / p["factor"], 1.0
    if rtype == "dynamic":
        if T <= context:  # transformers' frequencies from its init, which it restores for short inputs
            return _base_inv(theta, rot), 1.0
        seq = torch.tensor(T)  # transformers computes this base from a tensor length, in float32
        base = theta * ((p["factor"] * seq / context) - (p["factor"] - 1)) ** (rot / (rot - 2))
        return 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot)), 1.0
    omp = p["original_max_position_embeddings"]
    if rtype == "llama3":
        inv = _base_inv(theta, rot)
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        low_wavelen, high_wavelen = omp / low, omp / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (omp / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, inv_l), 1.0
    if rtype == "longrope":
        factor = p.get("factor") or context / omp
        att = p.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(omp))
        ext = torch.tensor(p["long_factor"] if T > omp else p["short_factor"], dtype=torch.float32)
        return 1.0 / (ext * theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot)), float(att)
    # yarn
    factor = p.get("factor") or context / omp
    att, mscale, mscale_all = p.get("attention_factor"), p.get("mscale"), p.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if att is None:
        both = mscale and mscale_all
        att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if both else get_mscale(factor)
    fast, slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def corr_dim(n_rot):
        return (rot * math.log(omp / (n_rot * 2 * math.pi))) / (2 * math.log(theta))

    lo, hi = corr_dim(fast), corr_dim(slow)
    if p.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rot - 1)
    if lo == hi:
        hi += 0.001  # transformers' guard against a zero-width ramp
    pos = theta ** (torch.arange(0, rot, 2).float() / rot)
    extra, inter = 1.0 / pos, 1.0 / (factor * pos)
    keep = 1 - torch.clamp((torch.arange(rot // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    return inter * (1 - keep) + extra * keep, float(att)


def tables(cfg, T: int, device, theta: float | None = None, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ([T, rot], float32, times the attention factor) of one layer's RoPE."""
    theta = cfg.theta(layer) if theta is None else theta
    inv, att = inv_freq(layer_params(cfg, layer), cfg.rotary_dim, theta, cfg.context, T)
    f = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv.to(device)[None, :]
    emb = torch.cat([f, f], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if att != 1.0:
        cos, sin = cos * att, sin * att
    return cos, sin


def layer_key(cfg, layer: int) -> tuple:
    """Layers with equal keys share their tables."""
    return cfg.theta(layer), repr(layer_params(cfg, layer))
