"""The growth plan: ``build_plan`` fixes the target config, the residual map (the SRIO rotation, or
none) and why, the expansion of every unit axis and of the residual axis, whether the result keeps
the function (and if not, why), and every output tensor's steps (``steps.py``); the plan table and
the execution (``engine.grow_tensor``) both read them. Also the lineage entry of a growth and the
gate values of a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from growtool.grow import biases, draws, mixer, ops, recipes
from growtool.grow.steps import (
    CopyOldWrites,
    Duplicate,
    ExpandResidual,
    ExpandUnits,
    FoldGain,
    GateZero,
    Keep,
    NewZero,
    NormGain,
    PadZero,
    PermuteHeads,
    RefitEmbedding,
    RefitEmbedNorm,
    Rotate,
    Scale,
    Step,
    UnitNormGain,
    ZeroNewUnits,
    ZeroOldWrites,
    _fuse_pad_rotate,
    _symmetry,
)
from growtool.nn.attention import alibi_order
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import (
    TensorSpec,
    arch_of,
    arch_sublayers,
    expected_shapes,
    tensor_specs,
    unit_count,
)
from growtool.nn.rope import describe as describe_rope

# ---- the plan -------------------------------------------------------------------------------


@dataclass
class Plan:
    src: ModelConfig
    cfg: ModelConfig  # the grown config
    recipe: dict
    seed: int
    eps: float  # cos of the SRIO angle actually used (1 = no rotation)
    rotate_readers: bool  # RMSNorm with a real rotation: readers take R^T, norm gains fold into them
    residual_map: str  # the residual map chosen, and why
    lossy: list[str]  # reasons the function is not kept (empty = exact at gate 0)
    units: list[dict]  # per block: unit kind -> Expansion
    split: list[dict]  # per block: unit kind -> writer multipliers (Net2Net split) or None
    res: dict  # residual expansions: "attn", "ffn", "tile", "zero", "mean"
    dtype: torch.dtype
    specs: dict = field(default_factory=dict)  # output name -> (TensorSpec, layer or None)
    steps: dict = field(default_factory=dict)  # output name -> [Step]
    shapes: dict = field(default_factory=dict)  # output name -> grown shape
    warnings: list[str] = field(default_factory=list)  # exact, but probably not what the user wants
    head_order: list | None = None  # ALiBi: the position of each grown head in the plain model (attention.alibi_order)

    @property
    def exact(self) -> bool:
        return not self.lossy

    @property
    def offset(self) -> float:
        return arch_of(self.src).features.norm_offset

    @property
    def carried(self) -> list[str]:
        """Settings that pass through growth unchanged, said in the plan (RoPE scaling, ALiBi slopes)."""
        pos = arch_of(self.cfg).features.positions
        if pos == "alibi" and self.head_order:
            n, H = self.src.heads, self.cfg.heads
            where = "fold puts them there" if self.recipe["gate"] else "placed there"
            at = self.head_order[:n]
            return [f"ALiBi slopes: old heads 0..{n - 1} keep theirs at positions {at} of {H} ({where})"]
        return describe_rope(self.cfg) if pos == "rope" else []

    def outputs(self) -> list[tuple[str, tuple, torch.dtype]]:
        return [(n, shp, self.dtype) for n, shp in expected_shapes(self.cfg).items()]

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(tensor pattern, old shape, new shape, operation) - one row per pattern, from the steps."""
        old, new = expected_shapes(self.src), expected_shapes(self.cfg)
        seen, out = set(), []
        for name, (spec, _) in self.specs.items():
            if spec.pattern in seen:
                continue
            seen.add(spec.pattern)
            o = "x".join(map(str, old[name])) if name in old else "-"
            op = ", ".join(s.describe(self, spec) for s in self.steps[name])
            out.append((spec.pattern, o, "x".join(map(str, new[name])), op))
        return out


def embed_factor(plan: Plan) -> float:
    """Embeddings scaled by sqrt(width) inside the model (Gemma): the grown embedding takes
    sqrt(d)/sqrt(D), each rounded to the output dtype as the model rounds it, so the scaled
    embedding is the old one. 1 where the architecture has no embedding scale."""
    if not arch_of(plan.src).features.embed_scale:
        return 1.0

    def s(w):
        return float(torch.tensor(w**0.5).to(plan.dtype))

    return s(plan.src.width) / s(plan.cfg.width)


def qk_scale(plan: Plan, spec: TensorSpec) -> float:
    """Scale of q/k rows that keeps a q/k RMSNorm exact although the config's single norm eps was
    multiplied by d/D for the residual norms. RMSNorm is scale-invariant except for eps: scaling
    its input by s turns eps' = eps d/D into eps d/D / s^2. A norm over n -> n' elements whose new
    ones are zero (OLMo-2's q/k norms over all heads) sees a mean square n/n' times the old one,
    so it needs eps n/n' there: s^2 = (d/D) (n'/n). Per head (Qwen3, Gemma 3) n' = n: s^2 = d/D."""
    s2 = 1.0 if arch_of(plan.src).features.fixed_eps else plan.src.width / plan.cfg.width  # fixed: the eps is kept
    if spec.qk_norm == "full":
        n_old, n_new = (unit_count(plan.src, spec.units[0])[0], unit_count(plan.cfg, spec.units[0])[0])
        s2 *= n_new / n_old
    return s2**0.5


def resid_scale(plan: Plan) -> float:
    """c = sqrt(D/d) where the norm eps is fixed by the class (``Features.fixed_eps``), else 1.

    A residual carried as c R[h; 0] has the old variance over D dims, so a LayerNorm with the old
    eps gives c [core(h); 0] exactly (core = (h - mean) / sqrt(var + eps)): the gains x sqrt(d/D)
    then give [LN(h); 0], as with eps x d/D. Every write into the residual (embeddings, writers,
    their biases) takes the factor c; a tied head reads c E, so the final norm takes a further 1/c.
    Without gains (``norm_affine`` False) the readers take sqrt(d/D) instead."""
    return (plan.cfg.width / plan.src.width) ** 0.5 if arch_of(plan.src).features.fixed_eps else 1.0


def copies(src: ModelConfig, D: int) -> bool:
    """Width D grows ``src`` by copying its residual (an embedding LayerNorm and a whole factor D / d);
    an embedding norm at any other width is refit (``RefitEmbedding``: untied models only)."""
    return arch_of(src).features.embed_norm and D % src.width == 0


# roles whose tensors width growth keeps as they are, and why (said in the plan)
KEPT = {
    "head_bias": "vocabulary-sized",
    "router_bias": "one per expert",
    "expert_bias": "one per expert: the router's outputs are kept",
    "act_param": "a scalar of the activation",
    "head_norm": "over head_dim, which is fixed",
    "latent_norm": "over a latent, whose rank stays",
    "latent_bias": "over a latent, whose rank stays",
}


def tensor_steps(spec: TensorSpec, name: str, plan: Plan) -> list[Step]:
    """The steps that make the grown tensor ``name`` from its source."""
    if copies(plan.src, plan.cfg.width):
        steps = _duplicate_steps(spec, name, plan)
    else:
        steps = _fuse_pad_rotate(_steps(spec, name, plan), plan)
    if plan.head_order and not plan.recipe["gate"] and spec.units and spec.units[0] in ("q", "qkv", "qgate"):
        steps.append(PermuteHeads(tuple(plan.head_order)))  # ungated: the plain model's ALiBi order now
    return steps


def _duplicate_steps(spec: TensorSpec, name: str, plan: Plan) -> list[Step]:
    """An embedding LayerNorm (BLOOM): the residual is copied k = D/d times, z = [h; ..; h]. A
    LayerNorm over kd copies has the mean and variance of h over d (eps kept), so its output is
    the copies of the old one with gains and biases copied; every reader takes [W, .., W] / k,
    every writer (and the embedding) writes copies; the tied head reads k copies of the embedding,
    so the final norm's gain and bias take 1/k."""
    k = plan.cfg.width // plan.src.width
    tied_final = plan.src.tie and spec.pattern.rsplit(".", 1)[0] == arch_of(plan.src).modules["final_norm"]
    role = spec.role
    if role == "growth_gate":
        return [GateZero()]
    if role in ("norm_gain", "norm_bias"):
        return [Duplicate(1.0 / k, "tied head reads k copies")] if tied_final else [Duplicate()]
    if role in ("embedding", "writer_bias"):
        return [Duplicate()]
    if role in KEPT:
        return [Keep(KEPT[role])]
    if role == "inner":
        return [Keep("a mixer's inner channels")]
    if role == "unit_bias":
        return [ExpandUnits(writer=False)]
    if role == "head":
        return [Duplicate(1.0 / k, "reads k copies")]
    if role == "reader":
        return [ExpandUnits(writer=False), Duplicate(1.0 / k, "reads k copies")] + _symmetry(plan, spec, writer=False)
    if role == "writer":
        steps = [ExpandUnits(writer=True), ExpandResidual(spec.group, tile=True), CopyOldWrites()]
        return steps + _symmetry(plan, spec, writer=True)
    raise GrowError(f"{plan.src.family}: no duplicated growth for a tensor of role {role!r}")


def _steps(spec: TensorSpec, name: str, plan: Plan) -> list[Step]:
    role, rot = spec.role, [Rotate()] if plan.eps != 1.0 else []
    a, f, c = arch_of(plan.src), embed_factor(plan), resid_scale(plan)
    up = [Scale(c, "residual x sqrt(D/d): fixed norm eps")] if c != 1.0 else []
    tied_final = plan.src.tie and spec.pattern.rsplit(".", 1)[0] == a.modules["final_norm"]
    if a.features.embed_norm and name == a.embed:
        return [RefitEmbedding()]
    if a.features.embed_norm and spec.pattern.rsplit(".", 1)[0] == a.modules["embed_norm"]:
        return [RefitEmbedNorm()]
    if role == "growth_gate":
        return [GateZero()]
    if role == "norm_gain":
        extra = 1.0 / f if tied_final else 1.0
        if c != 1.0 and tied_final:  # the tied head reads the residual's scale: the final norm x 1/c
            return [NormGain(uniform=plan.rotate_readers, offset=plan.offset, extra=1.0 / c, why="tied head")]
        return [NormGain(uniform=plan.rotate_readers, offset=plan.offset, extra=extra)]
    if role == "norm_bias":
        return [PadZero()] + ([Scale(1.0 / c, "tied head reads a residual x sqrt(D/d)")] if tied_final and up else [])
    if role == "head_rows":  # MLA: a latent -> heads, the latent kept
        return [ExpandUnits(writer=False)] + _symmetry(plan, spec, writer=False)
    if role in KEPT:
        return [Keep(KEPT[role])]
    if role == "inner":  # kept, but where the mixer's channels grow with the width (grow/mixer.py)
        return mixer.inner_steps(spec, plan)
    if role == "unit_norm":
        return [UnitNormGain()]
    if role in ("embedding", "writer_bias"):
        if _mean_filled(name, plan):
            return [ExpandResidual("mean")] + up
        scale = [Scale(f, "embedding scale sqrt(d)/sqrt(D)")] if (name == a.embed and f != 1.0) else []
        return up + [ExpandResidual("zero")] + scale + rot
    qk = []  # q/k feeding a q/k norm: see qk_scale; new units must not move a norm shared by all units
    if spec.qk_norm:  # (no scale under a fixed eps: Qwen3-Next's q_proj also holds its output gate, never scaled)
        s = qk_scale(plan, spec)
        qk = ([Scale(s, "q/k norm eps")] if s != 1.0 else []) + ([ZeroNewUnits()] if spec.qk_norm == "full" else [])
    if role == "unit_bias":
        return mixer.unit_steps(spec, plan, ExpandUnits(writer=False)) + qk
    fold = [FoldGain(spec.norm)] if plan.rotate_readers else []
    if not a.features.norm_affine:  # no gain to take the grown norm's sqrt(D/d): the readers take sqrt(d/D)
        fold = [Scale((plan.src.width / plan.cfg.width) ** 0.5, "norm without gain")]
    rrot = rot if plan.rotate_readers else []
    if role in ("head", "router"):  # no units to grow: the same logits from the grown residual
        return fold + [ExpandResidual("zero")] + rrot
    if role == "reader":
        units = mixer.unit_steps(spec, plan, ExpandUnits(writer=False))
        steps = fold + units + qk + [ExpandResidual(spec.group, tile=True)] + rrot
        return steps + _symmetry(plan, spec, writer=False)
    if role == "writer":
        units = mixer.unit_steps(spec, plan, ExpandUnits(writer=True))
        steps = units + up + [ExpandResidual(spec.group, tile=True), ZeroOldWrites()] + rot
        return steps + _symmetry(plan, spec, writer=True)
    raise AssertionError(role)  # pragma: no cover - the architecture tables only use the roles above


def _mean_filled(name: str, plan) -> bool:
    """The tied LayerNorm embedding is also the head: its new columns take the mean (LEMON)."""
    return plan.src.norm == "layernorm" and plan.src.tie and name == arch_of(plan.src).embed


def _heads_for(src: ModelConfig, D: int) -> int:
    """Query heads for width D when --heads is not given. Where heads must fill the width, D /
    head_dim; else D / head_dim if that keeps whole KV groups and the source had heads x head_dim
    == width; else the whole-KV-group count nearest to heads x D / d (ties upward)."""
    hd, r = src.head_dim, src.heads // src.kv_heads
    if not arch_of(src).features.free_head_dim:
        if D % hd:
            raise GrowError(f"target width {D} is not a multiple of head_dim {hd}")
        return D // hd
    if src.heads * hd == src.width and D % hd == 0 and (D // hd) % r == 0:
        return D // hd
    want = src.heads * D / src.width
    lo = max(src.heads, int(want // r) * r)
    return min((lo, lo + r), key=lambda h: (abs(h - want), -h))


def target_config(src: ModelConfig, width: int, ffn: int | None, heads: int | None) -> ModelConfig:
    d, D = src.width, width
    if not isinstance(D, int) or D <= d:
        raise GrowError(f"target width {D} is not larger than the source width {d}")
    if "attention" not in arch_sublayers(arch_of(src)):  # Mamba-2: no heads, no MLP; the mixers' channels grow
        eps = ops.grow_norm_eps(src.norm_eps, d, D)
        return src.replace(width=D, ffn=4 * D, norm_eps=eps, ssm=mixer.grown_ssm(src, D))  # ffn: nominal, 4 x width
    hd, r = src.head_dim, src.heads // src.kv_heads
    bound = not arch_of(src).features.free_head_dim
    if heads is None:
        heads = _heads_for(src, D)
    if arch_of(src).features.mqa:  # one key/value head read by all query heads: any count of query heads
        r = heads
    if bound and heads * hd != D:
        raise GrowError(f"target width {D} is not heads x head_dim ({heads} x {hd}); {src.family} needs them equal")
    if heads < src.heads:
        raise GrowError(f"target heads {heads} fewer than the source's {src.heads}")
    if heads % r:
        ok = [h for h in range(src.heads, 2 * heads + r) if h % r == 0][:4]
        raise GrowError(
            f"target heads {heads} not a multiple of the {r} query heads per KV head "
            f"(pass --heads {' or '.join(map(str, ok))})"
        )
    if bound and (D // hd) % r:
        raise GrowError(f"width {D} gives {D // hd} heads, not a multiple of {r} query heads per KV head")
    if ffn is None:
        ffn = round(src.ffn * D / d)
    if ffn < src.ffn:
        raise GrowError(f"target ffn {ffn} smaller than the source's {src.ffn}")
    f = arch_of(src).features
    if f.embed_norm and D % d and src.tie:
        raise GrowError(
            f"a tied {src.family} grows exactly only by a whole factor ({d} -> {2 * d}, {3 * d}, ...), not {d} -> {D}: "
            f"its embeddings pass a LayerNorm and are also its head; pass --untie to grow it to {D} with a head "
            f"of its own (+{src.vocab_size * D:,} parameters)"
        )
    if f.embed_norm and D % d and D - d < 2:
        raise GrowError(f"{src.family} {d} -> {D}: an embedding LayerNorm refit needs at least 2 new dims")
    if src.tie and not f.norm_affine:
        raise GrowError(
            f"{src.family} with tied embeddings cannot grow exactly: its LayerNorm has no gain, so the tied "
            "head (the embedding) would have to take the norm's sqrt(D/d) that the embedding must not; pass "
            "--untie to grow it with a head of its own"
        )
    kept = f.fixed_eps or copies(src, D)
    eps = src.norm_eps if kept else ops.grow_norm_eps(src.norm_eps, d, D)
    shared = round(src.shared_ffn * D / d) if src.shared_ffn else src.shared_ffn  # the shared expert's neurons
    if src.shared_experts:  # DeepSeek's shared experts: whole experts, so shared_experts x the experts' neurons
        shared = src.shared_experts * ffn
    dense = round(src.dense_ffn * ffn / src.ffn) if src.dense_ffn else src.dense_ffn  # dense blocks: as the experts
    ssm = mixer.grown_ssm(src, D)
    return src.replace(
        width=D, heads=heads, kv_heads=heads // r, ffn=ffn, norm_eps=eps, shared_ffn=shared, dense_ffn=dense, ssm=ssm
    )


def residual_map(src: ModelConfig, D: int, eps) -> tuple[float, str, list[str]]:
    """(eps, the map and why, reasons it is lossy) for the recipe's ``rotation.eps``.

    LayerNorm removes the residual mean: only R(sqrt(d/D)) (or mean fill) keeps it exact.
    RMSNorm commutes with any rotation once gains fold into the readers - unless the head is the
    tied embedding, which cannot take the final norm's gain: then only eps 1 (zero padding).
    """
    exact = ops.exact_layernorm_eps(src.width, D)
    tied_rms = src.norm == "rmsnorm" and src.tie
    post = arch_of(src).features.post_norms
    if copies(src, D):
        k = D // src.width
        why = (
            f"copied x{k}, z = (h, .., h): the embeddings pass a LayerNorm, whose output only a copy keeps "
            f"(mean and variance over {D} dims are those over {src.width}, eps kept); readers (W, .., W) / {k}"
        )
        if eps != "auto" and float(eps) != 1.0:
            raise GrowError(
                f"{src.family}'s copied residual takes no rotation: rotation.eps must be auto or 1, not {eps}"
            )
        return 1.0, why, []
    if eps == "auto":
        eps = 1.0 if (tied_rms or post) else exact
    eps, lossy = float(eps), []
    if post:
        exact_map = (
            "eps 1 (zero padding): norms on sublayer outputs put their gains on residual coordinates, "
            "which no rotation passes; every norm gain is rescaled by sqrt(d/D)"
        )
        if eps != 1.0:
            lossy.append(
                "post-norm gains sit on residual coordinates, so only eps=1 (no rotation) keeps the function, "
                f"not eps={eps:g}"
            )
    elif src.norm == "layernorm":
        exact_map = _layernorm_map(src, eps, exact, lossy)
    elif tied_rms:
        exact_map = (
            "eps 1 (zero padding): a tied RMSNorm head cannot absorb a rotation "
            "(the final norm's gain cannot fold into the embedding)"
        )
        if eps != 1.0:
            lossy.append(
                "a tied head cannot take the final RMSNorm gain, so only eps=1 (no rotation) keeps the function, "
                f"not eps={eps:g}"
            )
    elif eps == 1.0:
        exact_map = (
            "eps 1 (zero padding), as the recipe asks: RMSNorm commutes with any rotation, the identity included"
        )
    else:
        exact_map = f"R({eps:.4f}): RMSNorm commutes with any rotation once its gains fold into the readers"
    if arch_of(src).features.fixed_eps and src.norm == "rmsnorm":  # Llama 4: its q/k norms read the same eps
        exact_map = (
            f"sqrt(D/d) x {exact_map}; the norm eps is kept (q/k norms over head_dim read it): the residual is scaled"
        )
    why = exact_map if not lossy else f"R({eps:.4f}) as the recipe asks: LOSSY, the exact map is {exact_map}"
    return eps, why, lossy


def _layernorm_map(src: ModelConfig, eps: float, exact: float, lossy: list) -> str:
    """The exact map of a LayerNorm model (R(sqrt(d/D)), the embedding norm refit, the residual
    scaled under a fixed norm eps); appends to ``lossy`` when ``eps`` is another angle."""
    exact_map = f"R({exact:.4f}) = R(sqrt(d/D)): LayerNorm removes the mean, and only this angle maps it onto 1_D"
    if arch_of(src).features.embed_norm:
        exact_map += (
            "; the embeddings' LayerNorm is refit: each table row is its old output, centered, plus a filler on "
            "the new dims (every row of one norm), under a uniform gain on the old dims and 0 on the new"
        )
    if arch_of(src).features.fixed_eps:
        exact_map = f"sqrt(D/d) x {exact_map}; the norm eps is fixed: the residual is scaled to keep its variance"
    if abs(eps - exact) > 1e-9:
        lossy.append(
            f"LayerNorm cannot absorb rotation eps={eps:g}: only the exact angle eps=sqrt(d/D)={exact:.6f} "
            "keeps the function"
        )
    return exact_map


@dataclass(frozen=True)
class Units:
    """The grown model's unit counts besides its width: ``ffn`` neurons and ``heads`` query heads
    (None: the recipe's rule from the width)."""

    ffn: int | None = None
    heads: int | None = None


def build_plan(
    src: ModelConfig,
    recipe: dict,
    width: int,
    units: Units = Units(),
    seed: int = 0,
    allow_lossy: bool = False,
    dtype: torch.dtype = torch.float32,
    gate_values: list[float] | None = None,
) -> Plan:
    """The plan of growing ``src`` to ``width`` (and ``units``: ``ffn`` neurons, ``heads`` query heads)
    by ``recipe``, its random expansions drawn from ``seed``; refused (GrowError) where the source
    cannot grow so, or where the result does not keep the function and neither the recipe
    (``lossy: true``) nor ``allow_lossy`` allows that."""
    from growtool.grow import limits

    ffn, heads = units.ffn, units.heads
    limits.check_growth(src, width, ffn, dtype.itemsize)  # an absurd width: one line, before the plan
    added_biases = recipe.get("add_biases", "none")  # (a lineage recorded before the key has none)
    cfg = biases.with_biases(src, target_config(src, width, ffn, heads), added_biases)
    eps, why, lossy = residual_map(src, width, recipe["rotation"]["eps"])
    alibi = arch_of(src).features.positions == "alibi"
    _check_source(src, recipe, gate_values, alibi)
    cfg = _gated_config(src, cfg, recipe, lossy, alibi)
    units, split = draws.unit_expansions(src, cfg, recipe, seed)
    res = draws.residual_expansions(src, cfg, recipe, seed)
    warnings = draws.dead_units(src, cfg, recipe)
    if recipe["lossy"] is False and lossy and not allow_lossy:
        raise GrowError(f"refused: {lossy[0]} (pass --allow-lossy to grow anyway)")
    plan = Plan(
        src,
        cfg,
        recipe,
        seed,
        eps,
        src.norm == "rmsnorm" and eps != 1.0,
        why,
        lossy,
        units,
        split,
        res,
        dtype,
        warnings=warnings,
        head_order=alibi_order(src.heads, cfg.heads) if alibi and cfg.heads > src.heads else None,
    )
    added = biases.added(src, cfg, added_biases)
    for name, spec in tensor_specs(cfg).items():
        layer = None
        if "{i}" in spec.pattern:
            layer = int(name[len(spec.pattern.split("{i}")[0]) :].split(".")[0])
        plan.specs[name] = (spec, layer)
        plan.steps[name] = [NewZero()] if name in added else tensor_steps(spec, name, plan)
    plan.shapes.update(expected_shapes(cfg))
    return plan


def _check_source(src: ModelConfig, recipe: dict, gate_values: list[float] | None, alibi: bool) -> None:
    """Refuse a source that must be folded first: a gated ALiBi model, gates under an ungated
    recipe, or open gates."""
    if alibi and src.base_heads < src.heads:  # gated heads (new blocks alone keep every head in place)
        raise GrowError(
            f"a grown {src.family} with growth gates must be folded before it grows again (growtool fold --alpha "
            "0|1): its heads take their ALiBi positions in the fold"
        )
    if src.gated:
        if not recipe["gate"]:
            raise GrowError(
                f"recipe {recipe['name']!r} adds ungated units but the source has growth gates: "
                "fold it first (growtool fold --alpha 0|1)"
            )
        if gate_values and any(v != 0.0 for v in gate_values):
            raise GrowError(
                f"the source's growth gates are open (values up to {max(gate_values):g}): "
                "fold it first (growtool fold --alpha ...)"
            )


def _gated_config(src: ModelConfig, cfg: ModelConfig, recipe: dict, lossy: list, alibi: bool) -> ModelConfig:
    """``cfg`` with its growth-gate state (the unit counts before any gate: the source's under a
    gated recipe, the new counts else); appends to ``lossy`` why ungated new units lose the function."""
    if recipe["gate"]:
        conv = src.base_units("conv") if "shortconv" in arch_sublayers(arch_of(src)) else None  # LFM2's channels
        return cfg.replace(
            base_heads=src.base_heads,
            base_ffn=src.base_ffn,
            base_shared_ffn=src.base_shared_ffn,
            base_dense_ffn=src.base_dense_ffn,
            base_conv=conv,
        )
    cfg = cfg.replace(
        base_heads=cfg.heads,
        base_ffn=cfg.ffn,
        base_shared_ffn=cfg.shared_ffn,
        base_dense_ffn=cfg.dense_ffn,
        base_conv=None,
    )
    if arch_of(src).features.qk_norm == "full" and cfg.heads > src.heads:
        lossy.append(
            "new heads written without a warm-up gate must start with zero q/k rows (the q/k norm is "
            "shared by all heads), so split copies no longer compute their sources' outputs"
        )
    for sec, key in (("attention", "new_heads"), ("ffn", "new_units")):
        mode = recipe[sec][key]
        added = (cfg.heads > src.heads) if sec == "attention" else (cfg.ffn > src.ffn)
        if added and not ops.KINDS[mode].exact_without_gate:
            lossy.append(f"new {sec} units filled by {mode!r} write without a warm-up gate")
    if alibi and cfg.heads > src.heads and ops.KINDS[recipe["attention"]["new_heads"]].splits_writers:
        lossy.append(
            "ALiBi gives every head its own slope, so a copied head attends otherwise than its source "
            "and the split of their outputs no longer adds up"
        )
    return cfg


def lineage_entry(plan: Plan, source_sha256: str) -> dict:
    from growtool import __version__

    return {
        "op": "expand",
        "source_sha256": source_sha256,
        "width_from": plan.src.width,
        "width_to": plan.cfg.width,
        "heads": [plan.src.heads, plan.cfg.heads],
        "ffn": [plan.src.ffn, plan.cfg.ffn],
        "recipe": plan.recipe["name"],
        "recipe_full": recipes.stored(plan.recipe),
        "eps": plan.eps,
        "residual_map": plan.residual_map,
        "seed": plan.seed,
        "exact": plan.exact,
        "growtool": __version__,
        **({"biases_added": turned} if (turned := biases.turned_on(plan.src, plan.cfg)) else {}),
    }


def gate_values(ck) -> list[float]:
    if not ck.config.gated:
        return []
    a = arch_of(ck.config)
    return [float(ck.get(a.gate_name(i))[0]) for i in range(ck.config.layers)]
