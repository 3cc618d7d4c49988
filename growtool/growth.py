"""Width growth as a plan, then an execution: ``plan = build_plan(...)``; ``execute(plan, ckpt)``.

The plan fixes everything before a tensor is touched: the target config, the rotation angle, the
expansion of every unit axis in every block and of the residual axis, whether the result keeps
the function (and if not, why), and the output tensor list. Execution then streams tensors one
at a time through ``grow_tensor`` - which applies, in order: fold the norm gain (RMSNorm readers,
when rotating), expand the unit axis, expand the residual axis, zero the writes that ungated units
would make into new residual dims, rotate along the residual axis, cast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import ops
from .checkpoint import Checkpoint
from .config import ModelConfig
from .errors import GrowError
from .families import FAMILY, TensorSpec, expected_shapes, tensor_specs, unit_count


@dataclass
class Plan:
    src: ModelConfig
    cfg: ModelConfig  # the grown config
    recipe: dict
    seed: int
    eps: float  # cos of the SRIO angle actually used
    rotate_readers: bool  # RMSNorm with a real rotation: readers take R^T, norm gains fold into them
    lossy: list[str]  # reasons the function is not kept (empty = exact at gate 0)
    units: list[dict]  # per block: unit kind -> Expansion
    split: list[dict]  # per block: unit kind -> writer multipliers (Net2Net split) or None
    res: dict  # residual expansions by group: "attn", "ffn", "head", "zero", "mean"
    dtype: torch.dtype
    specs: dict = field(default_factory=dict)  # output name -> (TensorSpec, layer or None)
    warnings: list[str] = field(default_factory=list)  # exact, but probably not what the user wants

    @property
    def exact(self) -> bool:
        return not self.lossy

    def outputs(self) -> list[tuple[str, tuple, torch.dtype]]:
        return [(n, shp, self.dtype) for n, shp in expected_shapes(self.cfg).items()]

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(tensor pattern, old shape, new shape, operation) - one row per pattern."""
        old, new = expected_shapes(self.src), expected_shapes(self.cfg)
        seen, out = set(), []
        for name, (spec, _) in self.specs.items():
            if spec.pattern in seen:
                continue
            seen.add(spec.pattern)
            o = "x".join(map(str, old[name])) if name in old else "-"
            out.append((spec.pattern, o, "x".join(map(str, new[name])), describe(spec, self, name)))
        return out


def describe(spec: TensorSpec, plan: Plan, name: str) -> str:
    r = plan.recipe
    rot = f"R({plan.eps:.4g})" if plan.eps != 1.0 else "no rotation"
    mode = lambda g: {"attn": r["attention"], "ffn": r["ffn"]}[g]  # noqa: E731
    if spec.role == "growth_gate":
        return "warm-up gate = 0"
    if spec.role == "norm_gain":
        return "uniform sqrt(d/D) (gain folded into readers)" if plan.rotate_readers else "gain * sqrt(d/D), new = mean"
    if spec.role == "norm_bias":
        return "keep, new = 0"
    if spec.role == "embedding":
        return "mean fill (tied LayerNorm head)" if _mean_filled(name, plan) else f"pad 0, {rot}"
    if spec.role == "writer_bias":
        return f"pad 0, {rot}"
    units = "units " + (mode(spec.group).get("new_heads") or mode(spec.group).get("new_units")) if spec.units else ""
    if spec.role == "unit_bias":
        return units
    if spec.role == "head":
        return ("fold gain, " if plan.rotate_readers else "") + "new cols 0" + (f", {rot}" if plan.rotate_readers else "")
    cols = mode(spec.group)["new_columns"]
    if spec.role == "reader":
        return ("fold gain, " if plan.rotate_readers else "") + f"{units}, new cols {cols}" + (f", {rot}" if plan.rotate_readers else "")
    split = " split" if any(s.get(spec.units[0]) is not None for s in plan.split) else ""
    return f"{units}{split}, new rows {cols} (gated units only), {rot}"


def _mean_filled(name: str, plan: Plan) -> bool:
    return plan.src.norm == "layernorm" and plan.src.tie and name == FAMILY[plan.src.family].embed


def target_config(src: ModelConfig, width: int, ffn: int | None, heads: int | None) -> ModelConfig:
    d, D = src.width, width
    if not isinstance(D, int) or D <= d:
        raise GrowError(f"target width {D} is not larger than the source width {d}")
    hd, r = src.head_dim, src.heads // src.kv_heads
    if src.heads * hd == d and D % hd:
        raise GrowError(f"target width {D} is not a multiple of head_dim {hd}")
    if heads is None:
        if (src.heads * D) % d:
            raise GrowError(f"width {D} does not scale the {src.heads} heads to a whole number; pass --heads")
        heads = src.heads * D // d
    if src.family == "gpt2" and heads * hd != D:
        raise GrowError(f"target width {D} is not heads x head_dim ({heads} x {hd}); gpt2 needs them equal")
    if heads < src.heads:
        raise GrowError(f"target heads {heads} fewer than the source's {src.heads}")
    if heads % r:
        raise GrowError(f"target heads {heads} not a multiple of the {r} query heads per KV head")
    if ffn is None:
        ffn = round(src.ffn * D / d)
    if ffn < src.ffn:
        raise GrowError(f"target ffn {ffn} smaller than the source's {src.ffn}")
    return src.replace(width=D, heads=heads, kv_heads=heads // r, ffn=ffn,
                       norm_eps=ops.grow_norm_eps(src.norm_eps, d, D))


def _resolve_eps(src: ModelConfig, D: int, eps) -> tuple[float, list[str]]:
    d = src.width
    exact = ops.exact_layernorm_eps(d, D)
    reasons = []
    if eps == "auto":
        eps = 1.0 if (src.norm == "rmsnorm" and src.tie) else exact
    eps = float(eps)
    if src.norm == "layernorm" and abs(eps - exact) > 1e-9:
        reasons.append(f"LayerNorm cannot absorb rotation eps={eps:g}: only the exact angle eps=sqrt(d/D)={exact:.6f} keeps the function")
    if src.norm == "rmsnorm" and src.tie and eps != 1.0:
        reasons.append(f"a tied head cannot take the final RMSNorm gain, so only eps=1 (no rotation) keeps the function, not eps={eps:g}")
    return eps, reasons


def build_plan(src: ModelConfig, recipe: dict, width: int, ffn: int | None = None, heads: int | None = None,
               seed: int = 0, allow_lossy: bool = False, dtype: torch.dtype = torch.float32,
               gate_values: list[float] | None = None) -> Plan:
    cfg = target_config(src, width, ffn, heads)
    eps, lossy = _resolve_eps(src, width, recipe["rotation"]["eps"])
    gated = recipe["gate"]
    if src.gated:
        if not gated:
            raise GrowError(f"recipe {recipe['name']!r} adds ungated units but the source has growth gates: fold it first (growtool fold --alpha 0|1)")
        if gate_values and any(v != 0.0 for v in gate_values):
            raise GrowError(f"the source's growth gates are open (values up to {max(gate_values):g}): fold it first (growtool fold --alpha ...)")
    if gated:
        cfg = cfg.replace(base_heads=src.base_heads, base_ffn=src.base_ffn)
    else:
        cfg = cfg.replace(base_heads=cfg.heads, base_ffn=cfg.ffn)
        for sec, key in (("attention", "new_heads"), ("ffn", "new_units")):
            mode = recipe[sec][key]
            added = (cfg.heads > src.heads) if sec == "attention" else (cfg.ffn > src.ffn)
            if added and mode not in ("copy", "zero"):
                lossy.append(f"new {sec} units filled by {mode!r} write without a warm-up gate")
    k = recipe["convex_k"]
    units, split = [], []
    r = src.heads // src.kv_heads
    for i in range(src.layers):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        kv = ops.make_expansion(recipe["attention"]["new_heads"], src.kv_heads, cfg.kv_heads, gen, k)
        q = ops.group_to_heads(kv, r)
        f = ops.make_expansion(recipe["ffn"]["new_units"], src.ffn, cfg.ffn, gen, k)
        units.append({"q": q, "kv": kv, "qgate": q, "ffn": f})
        split.append({"q": ops.split_factors(q) if (not gated and q.kind == "copy") else None,
                      "ffn": ops.split_factors(f) if (not gated and f.kind == "copy") else None})
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    d, D = src.width, cfg.width
    res = {
        "attn": ops.make_expansion(recipe["attention"]["new_columns"], d, D, gen, k),
        "ffn": ops.make_expansion(recipe["ffn"]["new_columns"], d, D, gen, k),
        "head": ops.make_expansion("zero", d, D, gen),
        "tile": ops.make_expansion("tile", d, D, gen),
        "zero": ops.make_expansion("zero", d, D, gen),
        "mean": ops.make_expansion("mean", d, D, gen),
    }
    warnings = []
    for sec, key, what in (("attention", "new_heads", "heads"), ("ffn", "new_units", "FFN neurons")):
        added = (cfg.heads > src.heads) if sec == "attention" else (cfg.ffn > src.ffn)
        if added and recipe[sec][key] == "zero":
            warnings.append(f"new {what} are all zeros ({sec}.{key}: zero): their inputs and outputs sit at a "
                            "zero-gradient saddle, so training never moves them (dead capacity)")
    if recipe["lossy"] is False and lossy and not allow_lossy:
        raise GrowError(f"refused: {lossy[0]} (pass --allow-lossy to grow anyway)")
    plan = Plan(src, cfg, recipe, seed, eps, src.norm == "rmsnorm" and eps != 1.0, lossy, units, split, res, dtype,
                warnings=warnings)
    for name, spec in tensor_specs(cfg).items():
        layer = None
        if "{i}" in spec.pattern:
            layer = int(name[len(spec.pattern.split("{i}")[0]):].split(".")[0])
        plan.specs[name] = (spec, layer)
    return plan


def _expand_units(t: torch.Tensor, spec: TensorSpec, plan: Plan, layer: int, writer: bool) -> torch.Tensor:
    parts = []
    sizes = [n * b for n, b in (unit_count(plan.src, k) for k in spec.units)]
    for kind, seg in zip(spec.units, t.split(sizes, dim=spec.unit_axis)):
        block = unit_count(plan.src, kind)[1]
        seg = ops.expand_axis(seg, spec.unit_axis, plan.units[layer][kind], block)
        if writer and plan.split[layer].get(kind) is not None:
            seg = ops.scale_axis(seg, spec.unit_axis, plan.split[layer][kind], block)
        parts.append(seg)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=spec.unit_axis)


def _tile_into_new_block(out: torch.Tensor, t_units: torch.Tensor, spec: TensorSpec, plan: Plan, layer: int) -> None:
    """Units grown by "tile" live in the new residual dims only (in place on ``out``).

    Their weights on the old residual dims are 0 and those on the new dims are the old matrix
    tiled and cropped: the new-new block of the grown matrix is W[i mod n, j mod d]. Such units
    pass through the gate, so the function at gate 0 is unchanged whatever they hold.
    """
    d, D, off = plan.src.width, plan.cfg.width, 0
    for kind in spec.units:
        e, block = plan.units[layer][kind], unit_count(plan.src, kind)[1]
        if e.kind == "tile" and e.added:
            lo, n = off + e.n * block, e.added * block
            tiled = ops.expand_axis(t_units.narrow(spec.unit_axis, lo, n), spec.res_axis, plan.res["tile"])
            dst = out.narrow(spec.unit_axis, lo, n)
            dst.narrow(spec.res_axis, 0, d).zero_()
            dst.narrow(spec.res_axis, d, D - d).copy_(tiled.narrow(spec.res_axis, d, D - d))
        off += e.n_new * block


def grow_tensor(name: str, plan: Plan, get) -> torch.Tensor:
    """The grown tensor ``name``; ``get(src_name)`` reads source tensors (lazily)."""
    spec, layer = plan.specs[name]
    d, D, eps = plan.src.width, plan.cfg.width, plan.eps
    if spec.role == "growth_gate":
        return torch.zeros(1, dtype=plan.dtype)
    t = get(name).float()
    if spec.role == "norm_gain":
        out = ops.grow_norm_gain(t, D, uniform=plan.rotate_readers)
    elif spec.role == "norm_bias":
        out = ops.grow_norm_bias(t, D)
    elif spec.role in ("embedding", "writer_bias"):
        if _mean_filled(name, plan):
            out = ops.expand_axis(t, spec.res_axis, plan.res["mean"])
        else:
            out = ops.rotate_(ops.expand_axis(t, spec.res_axis, plan.res["zero"]), d, eps, spec.res_axis)
    elif spec.role == "unit_bias":
        out = _expand_units(t, spec, plan, layer, writer=False)
    elif spec.role in ("reader", "head"):
        if plan.rotate_readers:
            gain = get(spec.norm.format(i=layer) + ".weight").float()
            t = ops.fold_gain(t, gain, spec.res_axis)
        if spec.units:
            t = _expand_units(t, spec, plan, layer, writer=False)
        out = ops.expand_axis(t, spec.res_axis, plan.res[spec.group or "head"])
        if spec.units:
            _tile_into_new_block(out, t, spec, plan, layer)
        if plan.rotate_readers:
            out = ops.rotate_(out, d, eps, spec.res_axis)
    elif spec.role == "writer":
        t_units = _expand_units(t, spec, plan, layer, writer=True)
        t = ops.expand_axis(t_units, spec.res_axis, plan.res[spec.group])
        _tile_into_new_block(t, t_units, spec, plan, layer)
        kind = spec.units[0]
        n_base = plan.cfg.base_heads if kind == "q" else plan.cfg.base_ffn
        n_base *= unit_count(plan.src, kind)[1]
        # ungated units must not write into the new residual dims (before rotation)
        t.narrow(spec.res_axis, d, D - d).narrow(spec.unit_axis, 0, n_base).zero_()
        out = ops.rotate_(t, d, eps, spec.res_axis)
    else:  # pragma: no cover - the family tables only use the roles above
        raise AssertionError(spec.role)
    del t  # release the float32 source before the cast: lower peak memory for 16-bit checkpoints
    return out.to(plan.dtype).contiguous()


def lineage_entry(plan: Plan, source_sha256: str) -> dict:
    from . import __version__
    return {
        "op": "expand", "source_sha256": source_sha256, "width_from": plan.src.width,
        "width_to": plan.cfg.width, "heads": [plan.src.heads, plan.cfg.heads],
        "ffn": [plan.src.ffn, plan.cfg.ffn], "recipe": plan.recipe["name"], "recipe_full": plan.recipe,
        "eps": plan.eps, "seed": plan.seed, "exact": plan.exact, "growtool": __version__,
    }


def gate_values(ck: Checkpoint) -> list[float]:
    fam = FAMILY[ck.config.family]
    if not ck.config.gated:
        return []
    return [float(ck.get(fam.gate_name(i))[0]) for i in range(ck.config.layers)]


# ---- fold ---------------------------------------------------------------------------------

def fold_config(cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(base_heads=cfg.heads, base_ffn=cfg.ffn)


def fold_tensor(name: str, cfg: ModelConfig, alpha: float, get, dtype: torch.dtype) -> torch.Tensor:
    """Bake gate ``alpha`` into the writers: gated units' output weights times alpha.

    A gated unit's write is gate * W_col * h; with the gate fixed at alpha, alpha * W_col is the same
    function without a gate, so the folded model is a plain checkpoint.
    """
    specs = tensor_specs(cfg)
    spec = specs[name]
    t = get(name)
    if spec.role != "writer":
        return t.to(dtype)
    kind = spec.units[0]
    base = cfg.base_heads if kind == "q" else cfg.base_ffn
    n = cfg.heads if kind == "q" else cfg.ffn
    if base == n:
        return t.to(dtype)
    block = unit_count(cfg, kind)[1]
    t = t.float().clone()
    t.narrow(spec.unit_axis, base * block, (n - base) * block).mul_(alpha)
    return t.to(dtype)


__all__ = ["Plan", "build_plan", "grow_tensor", "fold_tensor", "fold_config", "target_config"]
