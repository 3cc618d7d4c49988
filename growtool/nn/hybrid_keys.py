"""A hybrid's and a Mamba mixer's config keys, read and written in each family's spelling (as
``moe_layers.py`` does for the MoE / dense blocks): the block kinds (a list, Nemotron-H's legacy
pattern string, Qwen3-Next's interval, LFM2's attention indices), a Mamba mixer's sizes, LFM2's
adjusted MLP size, Gated DeltaNet's inner sizes checked. Imports nothing from growtool but ``errors``
and ``families``: copied into remote-code folders with ``config.py``."""

from .errors import GrowError
from .families import arch_sublayers

SSM_SIZES = ("heads", "head_dim", "state", "groups", "conv")  # a Mamba mixer's integer sizes


def auto_ffn(hf: dict, size: int) -> int:
    """LFM2's MLP neurons: with ``block_auto_adjust_ff_dim`` (the default) 2/3 of intermediate_size, times
    ``block_ffn_dim_multiplier``, rounded up to a multiple of ``block_multiple_of``; else intermediate_size."""
    if not hf.get("block_auto_adjust_ff_dim", True):
        return size
    size = int(hf.get("block_ffn_dim_multiplier", 1.0) * int(2 * size / 3))
    of = int(hf.get("block_multiple_of", 256))
    return of * ((size + of - 1) // of)


def mixer_to_hf(cfg, hf: dict) -> None:
    """A hybrid family's config keys besides ``layer_types``: the MLP size written as it is (LFM2's auto
    adjustment off) and ``full_attn_idxs`` following the layer types."""
    if cfg.arch.features.ffn_auto_adjust:
        hf["block_auto_adjust_ff_dim"] = False
    if "full_attn_idxs" in hf:
        hf["full_attn_idxs"] = [i for i, t in enumerate(cfg.block_types) if t == "full_attention"]


def block_types(a, hf: dict, listed) -> list | None:
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
    if listed is None and "gdn" in arch_sublayers(a):  # Qwen3-Next, 3.5: every full_attention_interval-th layer
        every, n = int(hf.get("full_attention_interval") or 4), int(hf[a.keys["layers"]])
        return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if listed is None and "shortconv" in arch_sublayers(a):  # LFM2: attention at full_attn_idxs (default: every layer)
        n = int(hf[a.keys["layers"]])
        full = hf.get("full_attn_idxs") or range(n)
        return ["full_attention" if i in full else "conv" for i in range(n)]
    return list(listed) if listed is not None else None


def ssm_to_hf(a, m: dict, hf: dict) -> None:
    """A Mamba mixer's fields into ``hf``: its sizes always (Mamba-2's head_dim grows with the width), the
    rest where the config (the source's, carried in ``extra``) does not already say them in its spelling."""
    val = {
        **m,
        "inner": m["heads"] * m["head_dim"],
        "norm": m.get("norm", "gated") != "none",
        "before_gate": m.get("norm") == "before_gate",
    }
    for k, key in a.ssm_keys.items():
        if k in SSM_SIZES + ("inner",) or key not in hf:
            hf[key] = list(val[k]) if k == "dt_limit" else val[k]


def ssm_from_hf(a, hf: dict) -> dict | None:
    """A Mamba-2 mixer's sizes from the config (``Arch.ssm_keys``); dt is clamped to time_step_limit."""
    if not a.ssm_keys:
        return None
    m = {k: hf[key] if key in hf else hf.get(a.alt_keys.get(key)) for k, key in a.ssm_keys.items()}
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


def check_gdn(cfg) -> None:
    """Gated DeltaNet's inner sizes (read from the config by ``families.gdn_dims``): positive integers, the
    value heads a multiple of the key heads."""
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    for k in (*keys, "linear_conv_kernel_dim"):
        v = cfg.extra.get(k, 4 if k == "linear_conv_kernel_dim" else None)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise GrowError(f"{cfg.family}'s Gated DeltaNet needs config {k}, a positive integer, got {v!r}")
    if cfg.extra["linear_num_value_heads"] % cfg.extra["linear_num_key_heads"]:
        raise GrowError(f"{cfg.family}'s Gated DeltaNet: linear_num_key_heads must divide linear_num_value_heads")
