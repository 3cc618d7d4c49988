"""The random draws of a width plan (``plan.build_plan``): each block's unit expansions (one generator per
block, every unit kind drawn in a fixed order so that adding a kind leaves the other families' draws
unchanged), the writers' Net2Net split factors, the residual axis's expansions, and the warnings for new
units that would never train."""

from __future__ import annotations

import torch

from growtool.grow import mixer, ops
from growtool.nn.config import ModelConfig
from growtool.nn.families import GDN_UNITS, arch_of, arch_sublayers, unit_count


def unit_expansions(src: ModelConfig, cfg: ModelConfig, recipe: dict, seed: int) -> tuple[list, list]:
    """Per block: each unit kind's expansion (drawn from the block's own generator) and the writer
    multipliers of a Net2Net split (None where the units are gated or not split)."""
    k, gated, alpha = recipe["convex_k"], recipe["gate"], recipe.get("split_alpha", 0.5)
    units, split = [], []
    r = src.heads // src.kv_heads
    for i in range(src.layers):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        kv = ops.make_expansion(recipe["attention"]["new_heads"], src.kv_heads, cfg.kv_heads, gen, k)
        q = ops.group_to_heads(kv, r)
        if arch_of(src).features.mqa:  # the one KV head stays; new query heads mix old ones (all read it)
            q = ops.make_expansion(recipe["attention"]["new_heads"], src.heads, cfg.heads, gen, k)
        f = ops.make_expansion(recipe["ffn"]["new_units"], src.ffn, cfg.ffn, gen, k)
        units.append({"q": q, "kv": kv, "qkv": q, "qkvg": kv, "qgate": q, "ffn": f, "ffn2": f})
        units[-1].update(mq=q, mv=q, mkv=q)  # MLA's heads
        if src.shared_ffn:  # drawn after the others: the expansions of every other family are unchanged
            units[-1]["sffn"] = ops.make_expansion(recipe["ffn"]["new_units"], src.shared_ffn, cfg.shared_ffn, gen, k)
        if src.dense_ffn:  # an MoE family's dense blocks, drawn last (the other kinds' draws are unchanged)
            units[-1]["dffn"] = ops.make_expansion(recipe["ffn"]["new_units"], src.dense_ffn, cfg.dense_ffn, gen, k)
        units[-1].update(_mixer_units(src, cfg, recipe, gen, q))
        split.append(
            {
                kind: ops.split_factors(e, alpha) if (not gated and ops.KINDS[e.kind].splits_writers) else None
                for kind, e in ((n, units[-1].get(n)) for n in ("q", "ffn", "sffn", "dffn", "conv"))
                if e is not None
            }
        )
        split[-1]["mv"] = split[-1]["q"]  # MLA's o_proj columns: the query heads' split
    return units, split


def _mixer_units(src: ModelConfig, cfg: ModelConfig, recipe: dict, gen, q) -> dict:
    """A hybrid block's mixer unit kinds' expansions, drawn after the others (every other family's draws are
    unchanged): a Mamba mixer's and Gated DeltaNet's inner units kept (nothing drawn; Mamba-2's grown channels
    are mixer.GrowChannels'), LFM2's conv channels grown as neurons, Qwen3-Next's query heads with their gates."""
    out, subs = {}, arch_sublayers(arch_of(src))
    if src.ssm:  # a Mamba mixer's inner units are kept (residual-width growth)
        for kind in mixer.MIXER_KINDS:
            n = unit_count(src, kind)[0]
            out[kind] = ops.make_expansion("zero", n, n, gen)
    if "shortconv" in subs:  # LFM2's conv channels, one per residual dim: as neurons
        out["conv"] = ops.make_expansion(recipe["ffn"]["new_units"], src.width, cfg.width, gen, recipe["convex_k"])
    if "gdn" in subs:  # Gated DeltaNet's inner outputs: kept (one unit, nothing added)
        out.update({kind: ops.make_expansion("zero", 1, 1, gen) for kind in GDN_UNITS})
    if arch_of(src).features.attn_output_gate:  # Qwen3-Next: a query head and its output gate grow together
        out["qg"] = q
    return out


def residual_expansions(src: ModelConfig, cfg: ModelConfig, recipe: dict, seed: int) -> dict:
    """The residual axis's expansions by kind ("attn", "ffn": the recipe's new columns; "tile",
    "zero", "mean"), drawn from one generator of their own."""
    k = recipe["convex_k"]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    d, D = src.width, cfg.width
    return {
        "attn": ops.make_expansion(recipe["attention"]["new_columns"], d, D, gen, k),
        "ffn": ops.make_expansion(recipe["ffn"]["new_columns"], d, D, gen, k),
        "tile": ops.make_expansion("tile", d, D, gen),
        "zero": ops.make_expansion("zero", d, D, gen),
        "mean": ops.make_expansion("mean", d, D, gen),
    }


def dead_units(src: ModelConfig, cfg: ModelConfig, recipe: dict) -> list[str]:
    """Warnings for new units filled with zeros: exact, but never trained (a zero-gradient saddle)."""
    warnings = []
    for sec, key, what in (("attention", "new_heads", "heads"), ("ffn", "new_units", "FFN neurons")):
        added = (cfg.heads > src.heads) if sec == "attention" else (cfg.ffn > src.ffn)
        if added and ops.KINDS[recipe[sec][key]].dead:
            warnings.append(
                f"new {what} are all zeros ({sec}.{key}: zero): their inputs and outputs sit at a "
                "zero-gradient saddle, so training never moves them (dead capacity)"
            )
    return warnings
