"""Growing the training state: the AdamW moments grow with the model (DESIGN section 8).

The grown weights come from ``engine.grow_tensor`` (the plan's steps). The moments of each grown
tensor are made by walking the *same* steps with a moment rule for each one. Let G be the source
gradient of a weight W and m, v its first and second moments (averages of G and G*G):

* Steps that copy old entries or fill new ones with zeros (keep, zero padding, new rows/columns of
  the residual, "old units write 0 to new dims", new units of a gated recipe): old entries keep
  their moments bit for bit, new entries start at m = v = 0. At gate 0 this is exact for the new
  units and for readers' new residual columns: their gradient is 0 there (a gated unit's output is
  multiplied by 0; a reader's new columns read residual dims that hold 0).
* A scaling W' = a W (norm gains times sqrt(d/D), q/k scales, embedding scales; folding a norm gain
  g into a reader, W' = W diag(g)) changes the gradient by the inverse factor, G' = G / a: m' = m / a,
  v' = v / a^2 (entries with a = 0 get 0).
* The SRIO rotation W' = R W along the residual axis is orthogonal: G' = R G, so m' = R m (exact for
  the old coordinates of the gradient). v has no exact transform under a rotation; the rule is
  v' = (R o R) v (R o R: R with every entry squared), the diagonal of R diag(v) R^T: exact if the
  gradient coordinates are uncorrelated, and it keeps v >= 0 and sum(v) (R o R is doubly stochastic).
* Net2Net split (ungated copy recipes): a unit copied c times, all copies writing 1/(1+c) of its
  output, sees 1/(1+c) of its gradient on its readers and the full gradient on its writers. Copies
  take the source unit's moments; readers' moments are scaled: m' = m/(1+c), v' = v/(1+c)^2;
  writers' are kept. Exact: these are the moments of the gradients the grown model would have seen.
* A norm gain folded into its readers becomes a uniform sqrt(d/D) (RMSNorm under a rotation): a new
  parameter, whose moments start at 0.
* Adam's step count is kept (bias correction continues), and so is every hyperparameter: the grown
  optimizer continues the source's learning-rate schedule with no reset and no re-warm.

Tensors are named as in the checkpoint (``LM.tensors``); the optimizer's parameter order is
``train.make_optimizer``'s (matrices, then the rest, each in ``named_parameters`` order).
"""

from __future__ import annotations

import math

import torch

from growtool.grow import ops
from growtool.grow.mixer import GrowChannels
from growtool.grow.plan import Plan
from growtool.grow.steps import (
    BreakSymmetry,
    CancelPairs,
    Ctx,
    ExpandResidual,
    ExpandUnits,
    FoldGain,
    Keep,
    NormGain,
    PadRotate,
    PadZero,
    Rotate,
    Scale,
    UnitNormGain,
    ZeroNewUnits,
    ZeroOldWrites,
)
from growtool.nn.errors import GrowError
from growtool.nn.families import unit_count

# ---- one tensor's moments --------------------------------------------------------------------


def _zero_exp(e: ops.Expansion) -> ops.Expansion:
    return ops.Expansion("zero", e.n, e.n_new)


def rotate_sq_(v: torch.Tensor, d: int, eps: float, axis: int) -> torch.Tensor:
    """(R o R) v along ``axis`` in place: every vector v -> sum_j R_ij^2 v_j, in O(D).

    With R = I + A (A from the rotation's closed form; see ops.rotate), R_ij^2 = delta_ij (1 + 2 A_ii)
    + A_ij^2, and A is constant on each of the four blocks (old/new x old/new):
    A_oo = (eps-1)/d, A_nn = (eps-1)/g, A_no = -A_on = sqrt(1-eps^2)/sqrt(dg).
    """
    if eps == 1.0:
        return v
    s2 = max(0.0, 1.0 - eps * eps)
    vm = v.movedim(axis, -1)
    D = vm.shape[-1]
    g = D - d
    so = vm[..., :d].sum(-1, keepdim=True)
    sn = vm[..., d:].sum(-1, keepdim=True)
    aoo, ann, cross = (eps - 1.0) / d, (eps - 1.0) / g, s2 / (d * g)
    old = vm[..., :d] * (1 + 2 * aoo) + aoo * aoo * so + cross * sn
    new = vm[..., d:] * (1 + 2 * ann) + cross * so + ann * ann * sn
    vm[..., :d] = old
    vm[..., d:] = new
    return v


def _step_moment(step, t: torch.Tensor, c: Ctx, p: int) -> torch.Tensor:
    """One plan step's moment rule (module docstring); ``p`` = 1 for m, 2 for v."""
    plan, spec = c.plan, c.spec
    if isinstance(step, PadRotate):  # its parts, one after another
        for part in step.parts:
            t = _step_moment(part, t, c, p)
        return t
    if isinstance(step, (Keep, ZeroNewUnits, PadZero, ZeroOldWrites)):
        return step.apply(t, c)  # keeps or zeroes entries: the same on the moments
    if isinstance(step, (BreakSymmetry, CancelPairs)):  # noise on the weights, not their gradients' history
        return t
    if isinstance(step, Scale):
        return t / step.factor**p
    if isinstance(step, NormGain):
        D = plan.cfg.width
        if step.uniform:
            return t.new_zeros(D)
        a = math.sqrt(plan.src.width / D) * step.extra
        return torch.cat([t / a**p, t.new_zeros(D - t.shape[0])])
    if isinstance(step, UnitNormGain):
        kind = spec.units[0]
        e, block = plan.units[c.layer][kind], unit_count(plan.src, kind)[1]
        out = ops.expand_axis(t, 0, _zero_exp(e), block)
        out[: e.n * block] /= (e.n / e.n_new) ** (0.5 * p)
        return out
    if isinstance(step, FoldGain):
        gain = c.get(step.norm.format(i=c.layer) + ".weight").float() + plan.offset
        inv = torch.where(gain != 0, 1.0 / gain, torch.zeros_like(gain)) ** p
        return ops.fold_gain(t, inv, spec.res_axis)
    if isinstance(step, ExpandUnits):
        sizes = [n * b for n, b in (unit_count(plan.src, k) for k in spec.units)]
        parts = []
        for kind, seg in zip(spec.units, t.split(sizes, dim=spec.unit_axis)):
            e, block = plan.units[c.layer][kind], unit_count(plan.src, kind)[1]
            split = _split(plan, c.layer, kind, e)
            if split is None:  # gated new units (or zeros): gradient 0 at gate 0
                seg = ops.expand_axis(seg, spec.unit_axis, _zero_exp(e), block)
            else:  # Net2Net split: copies take the source's moments; readers see 1/(1+c) of the gradient
                seg = ops.expand_axis(seg, spec.unit_axis, e, block)
                if not step.writer:
                    seg = ops.scale_axis(seg, spec.unit_axis, split**p, block)
            parts.append(seg)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=spec.unit_axis)
    if isinstance(step, GrowChannels):  # a Mamba mixer's channels: old ones keep theirs, new ones start at 0
        return step.moment(t, c, p)
    if isinstance(step, ExpandResidual):  # new residual entries (mean / convex / tiled) start at 0
        return ops.expand_axis(t, spec.res_axis, _zero_exp(plan.res[step.key]))
    if isinstance(step, Rotate):
        if p == 1:
            return ops.rotate_(t, plan.src.width, plan.eps, spec.res_axis)
        return rotate_sq_(t, plan.src.width, plan.eps, spec.res_axis)
    raise AssertionError(f"no moment rule for step {type(step).__name__}")  # pragma: no cover


def _split(plan, layer: int, kind: str, e: ops.Expansion):
    """Net2Net split factors of a unit kind's copies, or None (new units gated or zero). A KV group
    copied with its query heads sees its heads' factor (heads of a group share it), fused qkv rows,
    per-head query gates and MLA's per-head rows (q, and kv_b_proj's [k_nope v]) the query heads' factor."""
    q = plan.split[layer].get("q")
    if q is None:
        return plan.split[layer].get(kind)
    alpha = plan.recipe.get("split_alpha", 0.5)
    return (
        ops.split_factors(e, alpha)
        if kind == "kv"
        else q
        if kind in ("q", "qkv", "qgate", "mq", "mkv")
        else plan.split[layer].get(kind)
    )


def grow_moment(name: str, plan: Plan, get, moment: torch.Tensor, second: bool) -> torch.Tensor:
    """The grown moment of tensor ``name``: the source ``moment`` (m, or v if ``second``) through the
    moment rules of the plan's steps. ``get`` reads the source *weights* (a folded norm gain)."""
    spec, layer = plan.specs[name]
    c = Ctx(plan, get, name, spec, layer)
    t = moment.detach().float().clone()
    for step in plan.steps[name]:
        t = _step_moment(step, t, c, 2 if second else 1)
    return t.contiguous()


# ---- a whole optimizer -----------------------------------------------------------------------


def param_groups(model, mup: bool = False) -> list[list[str]]:
    """Checkpoint names of the trainable parameters, per AdamW group in ``train.make_optimizer``'s
    order: the matrices (weight decay), then the rest. With ``mup`` the matrices split in two groups:
    the hidden matrices (readers and writers of the blocks, whose learning rate follows 1/width after
    a growth), then the embedding and head."""
    from growtool.nn.families import tensor_specs

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    mats, rest = [n for n, p in params if p.dim() >= 2], [n for n, p in params if p.dim() < 2]
    if not mup:
        return [mats, rest]
    specs = tensor_specs(model.cfg)
    hidden = [n for n in mats if specs[n].role in ("reader", "writer")]
    return [hidden, [n for n in mats if n not in hidden], rest]


def param_order(model, mup: bool = False) -> list[str]:
    """Checkpoint names of the trainable parameters in the optimizer's order (train.make_optimizer)."""
    return [n for g in param_groups(model, mup) for n in g]


def moments_by_name(names: list[str], opt_state: dict) -> dict[str, dict]:
    """{tensor name: {"step", "exp_avg", "exp_avg_sq"}} from an AdamW ``state_dict()``."""
    ids = [i for g in opt_state["param_groups"] for i in g["params"]]
    if len(ids) != len(names):
        raise GrowError(f"the optimizer state has {len(ids)} parameters, the model {len(names)}")
    return {n: opt_state["state"][i] for n, i in zip(names, ids) if i in opt_state["state"]}


def check_moments(opt_state, shapes: dict, where: str) -> None:
    """GrowError (naming ``where``, the file) unless ``opt_state`` is an AdamW ``state_dict`` for
    parameters of ``shapes`` ({checkpoint name: shape}, in the optimizer's order): one group entry per
    parameter, and each parameter's moments tensors of its shape with a finite step count."""
    groups = opt_state.get("param_groups") if isinstance(opt_state, dict) else None
    state = opt_state.get("state") if isinstance(opt_state, dict) else None
    if not isinstance(groups, list) or not isinstance(state, dict) or not all(isinstance(g, dict) for g in groups):
        raise GrowError(f"{where}: the optimizer state is not an AdamW state (state and param_groups expected)")
    ids = [i for g in groups for i in (g.get("params") if isinstance(g.get("params"), list) else [None])]
    if len(ids) != len(shapes) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise GrowError(f"{where}: the optimizer state has {len(ids)} parameters, the model {len(shapes)}")
    for (name, shape), i in zip(shapes.items(), ids):
        m = state.get(i)
        if m is None:
            continue
        ok = isinstance(m, dict) and all(
            isinstance(m.get(k), torch.Tensor) and tuple(m[k].shape) == tuple(shape) for k in ("exp_avg", "exp_avg_sq")
        )
        step = m.get("step") if isinstance(m, dict) else None
        step = step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step
        if not ok or isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 <= step < 2**53:
            raise GrowError(f"{where}: the AdamW moments of {name} do not match its shape {tuple(shape)}")


def grow_optimizer_state(opt_state: dict, src_names: list[str], new_groups: list[list[str]], plan, get) -> dict:
    """The AdamW ``state_dict`` for the grown model (parameter groups ``new_groups``): every moment
    grown by the rules above, the step counts and hyperparameters kept. Parameters without a source
    (none today: gates are not trained) start at zero moments with the common step count."""
    new_names = [n for g in new_groups for n in g]
    src = moments_by_name(src_names, opt_state)
    steps = [s["step"] for s in src.values()]
    step0 = steps[0].clone() if steps else torch.tensor(0.0)
    state = {}
    out_shapes = {n: shp for n, shp, _ in plan.outputs()}
    for i, n in enumerate(new_names):
        if n in src:
            m = src[n]
            state[i] = {
                "step": m["step"].clone(),
                "exp_avg": grow_moment(n, plan, get, m["exp_avg"], second=False),
                "exp_avg_sq": grow_moment(n, plan, get, m["exp_avg_sq"], second=True),
            }
        elif opt_state["state"]:
            z = torch.zeros(out_shapes[n])
            state[i] = {"step": step0.clone(), "exp_avg": z, "exp_avg_sq": z.clone()}
    groups, k = [], 0
    new_sizes = [len(g) for g in new_groups]
    assert len(opt_state["param_groups"]) == len(new_sizes), (len(opt_state["param_groups"]), new_sizes)
    for g, size in zip(opt_state["param_groups"], new_sizes):
        groups.append({**g, "params": list(range(k, k + size))})
        k += size
    return {"state": state, "param_groups": groups}


__all__ = [
    "grow_moment",
    "check_moments",
    "grow_optimizer_state",
    "rotate_sq_",
    "param_order",
    "param_groups",
    "moments_by_name",
]
