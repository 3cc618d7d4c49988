"""Learned growth operators: a few optimiser steps choose part of the growth map, then it is frozen.

Two operators, each fitted for ~100 forward/backward passes of the grown model on language-
modelling loss while the source weights stay fixed, each ending in an ordinary static checkpoint:

* **SRIO-LO** (``learn_srio_eps``): only the SRIO angle is learned. eps = sigmoid(t) and the
  grown weights are ``engine.grow_tensor(name, plan, ...)`` with a tensor eps, so they are a
  differentiable function of t and nothing else receives gradients (the expansions, the source
  weights, the gates are fixed). ``save_srio_lo`` then writes the checkpoint the ordinary way
  (``plan.build_plan`` with ``rotation.eps=<learned>``): exact at gate 0, like any SRIO growth.
  Only an RMSNorm family with an untied head is accepted (there every eps is exact at gate 0).

  What the loss can and cannot see: on such a model every reader, writer and embedding of the
  grown model is rotated by the same R(eps) (norm gains folded, RMSNorm commutes with R), so the
  grown models for all eps < 1 are *one function* written in rotated residual bases - at gate 0
  and with the gates open alike. The plain loss of the grown model is flat in eps (checked:
  ``lookahead=0`` raises instead of following round-off). The angle matters only through training,
  whose coordinate-wise parts (Adam's per-coordinate step, the per-coordinate norm gains) are not
  rotation-equivariant. So the objective is the loss one step later: from W(eps) take
  ``lookahead`` sign steps (Adam's first update, lr * sign(grad)) on all weights, detached, and
  measure the loss on the next batch. The step directions are piecewise constant in eps, so the
  gradient through W(eps) alone is the exact derivative almost everywhere.

* **LiGO-style** (``LiGO``), the learned baseline of Wang et al. 2023, "Learning to Grow
  Pretrained Models for Efficient Transformer Training" (ICLR), width part only, re-implemented
  simply: every grown tensor is a product of expansion matrices with the source tensor,
  W' = U_out W U_in^T, where along a residual axis the matrix is one residual expansion
  B (D x d) shared by all layers and all tensors (one matrix for the residual stream, which the
  residual connections require; it starts from the recipe's attention column expansion),
  and along a unit axis it is the layer's head expansion (KV groups, lifted to query heads and
  head_dim blocks, so head_dim and the query-per-KV ratio are kept) or its FFN expansion.
  Norm gains and biases on the residual are expanded by B too. All matrices start from the
  tool's static expansions ([I; M], M the recipe's convex / tiled mixtures, seeded as in
  ``plan.build_plan``): at initialisation the grown tensors are exactly ``ops.expand_axis``
  of the source tensors. No gates and no function preservation (LiGO does not keep the
  function: new residual dims are read and written by everything from the start). After
  training, ``fold`` gives the plain grown tensors, saved with ``checkpoint.save_tensors``.
  Not re-implemented: LiGO's depth operator and its Kronecker factorisation across layers.

``batches`` is any iterator of (idx, targets) LongTensor pairs [B, T] (SRIO-LO with lookahead
takes two per step, LiGO one).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.func import functional_call

from growtool.grow import ops, recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.fold import fold_config
from growtool.grow.plan import Plan, Units, build_plan, lineage_entry
from growtool.io.checkpoint import Output, save, save_tensors
from growtool.io.stream import Producer
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import arch_of, tensor_specs, unit_count
from growtool.nn.model import LM

Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


def _with_head(cfg: ModelConfig, tensors: dict) -> dict:
    """Checkpoint tensors -> module parameters (a tied head is the embedding)."""
    if cfg.tie:
        a = arch_of(cfg)
        tensors = {**tensors, a.modules["head"] + ".weight": tensors[a.embed]}
    return tensors


def lm_loss(model: LM, tensors: dict, x: torch.Tensor, y: torch.Tensor, alpha=None) -> torch.Tensor:
    """Mean next-token loss of ``model``'s architecture run with ``tensors`` as its parameters."""
    _, loss = functional_call(model, _with_head(model.cfg, tensors), (x, y), {"alpha": alpha})
    return loss


# ---- SRIO-LO: the SRIO angle learned -------------------------------------------------------


@dataclass
class LearnedEps:
    eps: float  # the learned cos of the SRIO angle, in (0, 1)
    eps0: float  # where it started
    steps: int
    tokens: int  # tokens the learning consumed (inner and outer batches)
    passes: int  # forward+backward passes of the grown model (compute)
    lookahead: int
    history: list = field(default_factory=list)  # per step: {"step", "eps", "loss", "grad"}


def _recipe(recipe: str | dict, overrides: dict | None) -> dict:
    """A recipe by name / YAML path (``recipes.load``) or as a dict, with overrides, checked."""
    if isinstance(recipe, str):
        return recipes.load(recipe, overrides)
    return recipes.validate(recipes._merge(recipes._merge(recipes.DEFAULTS, recipe), overrides or {}))


@dataclass(frozen=True)
class SrioGrowth:
    """The static growth around the learned angle: to ``width`` (``ffn`` neurons, ``heads`` query
    heads) by ``recipe`` (a name, a YAML path or a dict) with ``overrides``, its expansions drawn
    from ``seed``."""

    width: int
    recipe: str | dict = "srio"
    overrides: dict | None = None
    seed: int = 0
    ffn: int | None = None
    heads: int | None = None


@dataclass(frozen=True)
class Lookahead:
    """The objective's inner training: ``steps`` detached sign steps of learning rate ``lr``, with
    the growth gates at ``alpha``."""

    steps: int = 1
    lr: float = 3e-3
    alpha: float = 1.0


def _srio_plan(src: ModelConfig, growth: SrioGrowth, eps: float) -> Plan:
    g = growth
    over = recipes._merge(g.overrides or {}, {"rotation": {"eps": float(eps)}})
    return build_plan(src, _recipe(g.recipe, over), g.width, Units(g.ffn, g.heads), seed=g.seed)


class SrioObjective:
    """eps -> loss of the grown model after ``lookahead`` detached sign steps (see the module doc)."""

    def __init__(
        self, src: ModelConfig, tensors: dict, growth: SrioGrowth, inner: Lookahead = Lookahead(), eps0: float = 0.5
    ):
        lookahead, lr, alpha = inner.steps, inner.lr, inner.alpha
        if src.norm != "rmsnorm" or src.tie or arch_of(src).features.post_norms:
            raise GrowError(
                "SRIO-LO learns the angle only where every angle is exact: an RMSNorm family with an untied head"
            )
        if not 0.0 < alpha <= 1.0:
            raise GrowError(f"alpha must be in (0, 1] (at gate 0 the loss does not depend on the angle), got {alpha}")
        if lookahead < 0:
            raise GrowError(f"lookahead must be >= 0, got {lookahead}")
        self.plan = _srio_plan(src, growth, eps0)
        self.model = LM(self.plan.cfg).train()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.get, self.lookahead, self.lr, self.alpha = tensors.__getitem__, lookahead, lr, alpha
        self.names = [n for n, _, _ in self.plan.outputs()]

    def grown(self, eps) -> dict:
        eps = eps if isinstance(eps, torch.Tensor) else torch.tensor(float(eps))
        p = dataclasses.replace(self.plan, eps=eps)
        return {n: grow_tensor(n, p, self.get) for n in self.names}

    def __call__(self, eps, inner: tuple, outer: tuple) -> torch.Tensor:
        w0 = self.grown(eps)
        w = {n: v.detach().requires_grad_(not n.endswith("growth_gate")) for n, v in w0.items()}
        for _ in range(self.lookahead):
            train = [n for n in self.names if w[n].requires_grad]
            with torch.enable_grad():
                grads = torch.autograd.grad(lm_loss(self.model, w, *inner, alpha=self.alpha), [w[n] for n in train])
            for n, g in zip(train, grads):
                w[n] = (w[n] - self.lr * torch.sign(g)).detach().requires_grad_(True)
        return lm_loss(self.model, {n: w0[n] + (w[n] - w0[n]).detach() for n in self.names}, *outer, alpha=self.alpha)


def learn_srio_eps(
    src: ModelConfig,
    tensors: dict,
    growth: SrioGrowth,
    batches: Batches,
    *,
    steps: int = 100,
    lr: float = 0.05,
    eps0: float | None = None,
    inner: Lookahead = Lookahead(),
) -> LearnedEps:
    """Learn the SRIO angle: Adam on t, eps = sigmoid(t), ``steps`` steps of the ``SrioObjective``.

    Each step takes two batches (the sign steps' and the loss's) when ``inner.steps`` (the
    lookahead) >= 1, one when 0. Everything but eps is the recipe's static growth ``growth`` (same
    seed, same expansions). With lookahead 0 the objective is checked first and refused when it is
    flat in eps.
    """
    if steps < 1:
        raise GrowError(f"steps must be >= 1, got {steps}")
    eps0 = ops.exact_layernorm_eps(src.width, growth.width) if eps0 is None else float(eps0)
    if not 0.0 < eps0 < 1.0:
        raise GrowError(f"eps0 must be in (0, 1), got {eps0}")
    obj = SrioObjective(src, tensors, growth, inner, eps0=eps0)
    lookahead = inner.steps
    out = LearnedEps(eps=eps0, eps0=eps0, steps=steps, tokens=0, passes=0, lookahead=lookahead)
    t = torch.tensor(math.log(eps0 / (1.0 - eps0)), requires_grad=True)
    opt = torch.optim.Adam([t], lr=lr)
    for step in range(steps):
        first = next(batches) if lookahead else None
        outer = next(batches)
        if step == 0 and lookahead == 0:
            _check_not_flat(obj, eps0, outer)
        eps = torch.sigmoid(t)
        loss = obj(eps, first, outer)
        opt.zero_grad()
        loss.backward()
        g = float(t.grad)
        opt.step()
        out.tokens += outer[1].numel() + (first[1].numel() * lookahead if lookahead else 0)
        out.passes += 1 + lookahead
        out.history.append({"step": step, "eps": float(eps.detach()), "loss": float(loss.detach()), "grad": g})
    out.eps = float(torch.sigmoid(t.detach()))
    return out


def _check_not_flat(obj: SrioObjective, eps0: float, outer: tuple) -> None:
    """Refuse an objective without lookahead that is flat in eps (it then follows round-off)."""
    with torch.no_grad():
        l0, l1 = float(obj(eps0, None, outer)), float(obj(0.5 * eps0, None, outer))
    if abs(l0 - l1) <= 1e-6 * max(1.0, abs(l0)):
        raise GrowError(
            f"the grown model's loss does not depend on the angle ({l0:.7g} at eps {eps0:.4g} and "
            f"{0.5 * eps0:.4g}): every eps < 1 is the same function in a rotated basis; "
            "learn it through training (lookahead >= 1)"
        )


def save_srio_lo(
    out_path: str,
    src: ModelConfig,
    tensors: dict,
    growth: SrioGrowth,
    learned: LearnedEps,
    *,
    lineage: list = (),
    source_sha256: str = "",
    force: bool = False,
) -> str:
    """Write the static growth ``growth`` at the learned angle (``rotation.eps=<learned>``): exact at gate 0."""
    plan = _srio_plan(src, growth, learned.eps)
    entry = lineage_entry(plan, source_sha256)
    entry["learned"] = {
        "op": "srio-lo",
        "eps0": learned.eps0,
        "steps": learned.steps,
        "tokens": learned.tokens,
        "lookahead": learned.lookahead,
    }
    grow = Producer(lambda n: grow_tensor(n, plan, tensors.__getitem__))
    return save(out_path, plan.cfg, list(lineage) + [entry], plan.outputs(), grow, Output(force=force))


# ---- LiGO-style learned linear growth operator --------------------------------------------


def expansion_matrix(e: ops.Expansion) -> torch.Tensor:
    """The [n_new, n] matrix of an expansion: identity on old entries, the mixtures below."""
    m = torch.zeros(e.n_new, e.n)
    m[: e.n, : e.n] = torch.eye(e.n)
    if e.added == 0 or e.kind == "zero":
        return m
    if e.kind == "mean":
        m[e.n :] = 1.0 / e.n
        return m
    rows = torch.arange(e.n, e.n_new).unsqueeze(1).expand_as(e.index)
    m.index_put_((rows.reshape(-1), e.index.reshape(-1)), e.weight.reshape(-1).float(), accumulate=True)
    return m


def apply_matrix(x: torch.Tensor, axis: int, m: torch.Tensor, block: int = 1) -> torch.Tensor:
    """Expand ``axis`` (blocks of ``block`` entries) by the matrix m [n_new, n]: new = m @ old."""
    x = x.movedim(axis, 0)
    n = m.shape[1]
    xb = x.reshape(n, block, -1)
    out = torch.einsum("ij,jbr->ibr", m.to(x.dtype), xb).reshape(m.shape[0] * block, *x.shape[1:])
    return out.movedim(0, axis)


class LiGO(torch.nn.Module):
    """Learned width-growth operator (LiGO-style): one residual expansion B and per-layer head / FFN
    expansions, initialised from the recipe's static expansions (see the module docstring)."""

    def __init__(
        self,
        src: ModelConfig,
        tensors: dict,
        width: int,
        *,
        ffn: int | None = None,
        heads: int | None = None,
        recipe: str | dict = "srio",
        seed: int = 0,
    ):
        super().__init__()
        if src.gated:
            raise GrowError("LiGO grows plain models: fold the source's growth gates first (growtool fold)")
        r = _recipe(recipe, {"gate": False, "rotation": {"eps": 1.0}})
        plan = build_plan(src, r, width, Units(ffn, heads), seed=seed, allow_lossy=True)
        self.src, self.cfg = src, fold_config(plan.cfg)
        self.source = {n: t.detach().float() for n, t in tensors.items()}
        self.recipe = r["name"]
        self.steps = 0  # optimiser steps taken so far
        self.B = torch.nn.Parameter(expansion_matrix(plan.res["attn"]))
        self.heads = torch.nn.ParameterList(torch.nn.Parameter(expansion_matrix(u["kv"])) for u in plan.units)
        self.ffn = torch.nn.ParameterList(torch.nn.Parameter(expansion_matrix(u["ffn"])) for u in plan.units)
        self.specs = tensor_specs(src)
        self.layer_of = {n: lay for n, (_, lay) in plan.specs.items()}

    def unit_matrix(self, kind: str, layer: int) -> torch.Tensor:
        if kind == "ffn":
            return self.ffn[layer]
        c = self.heads[layer]
        if kind == "kv":
            return c  # q, qkv (NeoX's per-head [q k v]) and qgate follow the query heads
        r = self.src.heads // self.src.kv_heads  # query heads per KV group: kron(C, I_r)
        return torch.kron(c, torch.eye(r))

    def grown(self) -> dict[str, torch.Tensor]:
        """The grown model's tensors (differentiable in the operator's matrices)."""
        out = {}
        for name, spec in self.specs.items():
            t = self.source[name]
            layer = self.layer_of.get(name)
            if spec.unit_axis is not None and spec.units:
                sizes = [n * b for n, b in (unit_count(self.src, k) for k in spec.units)]
                parts = [
                    apply_matrix(seg, spec.unit_axis, self.unit_matrix(k, layer), unit_count(self.src, k)[1])
                    for k, seg in zip(spec.units, t.split(sizes, dim=spec.unit_axis))
                ]
                t = torch.cat(parts, dim=spec.unit_axis)
            if spec.res_axis is not None:
                t = apply_matrix(t, spec.res_axis, self.B)
            elif spec.role in ("norm_gain", "norm_bias"):
                t = self.B @ t
            out[name] = t
        return out

    def fit(self, batches: Batches, steps: int = 100, lr: float = 3e-3) -> list[dict]:
        """Adam on the operator's matrices only, LM loss of the grown model; returns per-step losses."""
        model = LM(self.cfg).train()
        for p in model.parameters():
            p.requires_grad_(False)
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        hist = []
        for step in range(steps):
            x, y = next(batches)
            loss = lm_loss(model, self.grown(), x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            hist.append({"step": step, "loss": float(loss.detach())})
        self.steps += steps
        return hist

    def fold(self) -> dict[str, torch.Tensor]:
        """Plain grown tensors (detached): the operator applied once, nothing learned remains."""
        with torch.no_grad():
            return {n: t.detach().contiguous() for n, t in self.grown().items()}

    def save(self, out_path: str, *, lineage: list = (), source_sha256: str = "", force: bool = False) -> str:
        entry = {
            "op": "expand",
            "source_sha256": source_sha256,
            "width_from": self.src.width,
            "width_to": self.cfg.width,
            "heads": [self.src.heads, self.cfg.heads],
            "ffn": [self.src.ffn, self.cfg.ffn],
            "recipe": "ligo",
            "init_recipe": self.recipe,
            "learned": {"op": "ligo", "steps": self.steps},
            "exact": False,
        }
        return save_tensors(out_path, self.cfg, list(lineage) + [entry], self.fold(), force=force)


__all__ = [
    "SrioGrowth",
    "Lookahead",
    "learn_srio_eps",
    "save_srio_lo",
    "LearnedEps",
    "SrioObjective",
    "LiGO",
    "expansion_matrix",
    "apply_matrix",
    "lm_loss",
]
