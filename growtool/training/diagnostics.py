"""Growth diagnostics: how the units a growth added relate to the units they copy, during training.

Why recipes tie or differ is a question about the new units: do copies stay clones of their
sources (symmetric gradients keep exact copies on the "cloned-unit" manifold), and how much
gradient do new units get while the warm-up gates are low? This module measures both.

* The unit map. A growth's ``expand`` lineage entry records the recipe (``recipe_full``), the plan
  seed and the unit counts (``heads``, ``ffn``); ``plan.build_plan`` is a pure function of those
  and the source config, so ``unit_map`` rebuilds the plan (no tensors are read) and reads which
  source unit each new unit copies: ``copy`` and ``tile`` units their one source, ``convex`` units
  the source with the largest weight; ``zero`` units have none and are left out. Nothing new is
  stored in checkpoints; every grown checkpoint written so far carries what is needed.
* A unit's vector: everything that belongs to one unit in its block, over the model's coordinates:
  an FFN neuron's rows in the readers (up, gate) and its column in ``down``; a query head's rows in
  q (and the attention gate), its columns in o, and the k / v rows of its KV group. Biases are left
  out. The cosine of a new unit with its source (``ffn_cos`` / ``head_cos``, mean and max over the
  block's new units) is 1 for an exact copy and stays 1 under symmetric training; ``tile`` units
  start at 0 (they read and write the new residual dimensions only, their sources the old ones).
* The gradient ratio (``ffn_grad_ratio`` / ``head_grad_ratio``): RMS of the gradient over the new
  units' weights divided by the RMS over the old units' weights, in the same tensors, at that
  update (before clipping, which scales both alike). Near 0 while a gate is near 0.
* ``gate``: each block's growth-gate value (None on an ungated model, e.g. the ``copy`` recipe):
  in a training record the gate that update ran at (the one its gradient saw), so the first
  update of a gated growth shows ratio 0 at gate 0 (a gated unit's gradient is the gate times
  its ungated gradient).

``Tracker.record`` gives one JSON-ready dict per block plus the means over blocks; the trainer puts
it under ``growth`` in metrics.jsonl at step 0, at the condensation-metrics cadence, and about 8
times while the gates ramp (from the run's latest growth; for an ungated growth over the first 10%
of the run). ``checkpoint_record`` gives the same figures for a checkpoint (``inspect --metrics``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from growtool.nn.errors import GrowError
from growtool.nn.families import arch_of, tensor_specs, unit_count
from growtool.nn.model import Linear
from growtool.training.schedule import ramp_tokens


def latest_growth(lineage: list) -> dict | None:
    """The latest ``expand`` entry of a lineage that records its plan (recipe and seed), or None."""
    for entry in reversed(lineage or []):
        if entry.get("op") == "expand":
            return entry if "recipe_full" in entry and "seed" in entry else None
    return None


def _sources(e) -> torch.Tensor | None:
    """The source unit of each new unit of expansion ``e`` (-1: none), or None when nothing was added."""
    if not e.added:
        return None
    if e.index is None:  # zero (and mean): no source unit
        return torch.full((e.added,), -1, dtype=torch.long)
    if e.weight is None or e.index.shape[1] == 1:
        return e.index[:, 0].clone()
    return e.index.gather(1, e.weight.argmax(1, keepdim=True))[:, 0]


def growth_source(cfg, lineage: list):
    """(the latest width growth's lineage entry, the config it grew from) when that growth made this
    model's unit counts; None when the lineage has none, or another growth or a change came since."""
    entry = latest_growth(lineage)
    if entry is None:
        return None
    (h0, h1), (f0, f1) = entry["heads"], entry["ffn"]
    if (cfg.width, cfg.heads, cfg.ffn) != (entry["width_to"], h1, f1):
        return None
    r = cfg.heads // cfg.kv_heads
    try:
        kw = dict(width=entry["width_from"], heads=h0, kv_heads=max(1, h0 // r), ffn=f0, base_heads=h0, base_ffn=f0)
        kw.update({flag: False for flag in entry.get("biases_added", ())})  # recipe add_biases
        return entry, cfg.replace(**kw)
    except (GrowError, KeyError, TypeError, ValueError):  # not a width growth of this model
        return None


def unit_map(cfg, lineage: list) -> list[dict] | None:
    """Per block: {"ffn": (old count, source of each new unit), "head": (...), "kv": (...)} for the
    latest growth in ``lineage``, rebuilt from its plan; None when there is no such growth
    (``growth_source``)."""
    from growtool.grow.plan import Units, build_plan

    found = growth_source(cfg, lineage)
    if found is None:
        return None
    entry, src = found
    try:
        recipe, seed, units = entry["recipe_full"], entry["seed"], Units(entry["ffn"][1], entry["heads"][1])
        plan = build_plan(src, recipe, entry["width_to"], units, seed=seed, allow_lossy=True)
    except (GrowError, KeyError, TypeError, ValueError):
        return None
    out = []
    for units in plan.units:
        out.append({g: (units[k].n, _sources(units[k])) for g, k in (("ffn", "ffn"), ("head", "q"), ("kv", "kv"))})
    return out


def _unit_rows(t: torch.Tensor, spec, cfg):
    """(group, unit matrix [units, features]) for each unit kind of a reader / writer tensor."""
    off = 0
    for kind in spec.units:
        n, block = unit_count(cfg, kind)
        seg = t.narrow(spec.unit_axis, off, n * block).movedim(spec.unit_axis, 0)
        off += n * block
        if kind == "conv" or kind.startswith(("gdn_", "m_")):  # a mixer's channels or inner units: no heads
            continue
        group = "ffn" if kind == "ffn" else "kv" if kind == "kv" else "head"
        yield group, seg.reshape(n, -1)  # a unit's block of rows (head_dim for a head) is contiguous


def _block_tensors(cfg, layer: int):
    prefix = arch_of(cfg).block.format(i=layer)
    return [
        (n, s)
        for n, s in tensor_specs(cfg).items()
        if n.startswith(prefix) and s.role in ("reader", "writer") and s.units
    ]


def similarity(cfg, umap: list[dict], get: Callable[[str], torch.Tensor]) -> list[dict]:
    """Per block: cosine of each new unit with its source unit, mean and max (None: no new unit with
    a source). ``get(name)`` returns a tensor of the model (a state dict's or a checkpoint's)."""
    out = []
    r = cfg.heads // cfg.kv_heads
    for i, m in enumerate(umap):
        acc = {}
        for name, spec in _block_tensors(cfg, i):
            t = get(name).detach().float()
            for group, u in _unit_rows(t, spec, cfg):
                target = "head" if group == "kv" else group
                n_old, srcs = m[target]
                if srcs is None:
                    continue
                new = torch.arange(n_old, n_old + len(srcs), device=u.device)
                srcs = srcs.to(u.device)
                keep = srcs >= 0
                if group == "kv":  # a head's KV group; the source head's KV group
                    a, b = u[new // r], u[srcs.clamp_min(0) // r]
                else:
                    a, b = u[new], u[srcs.clamp_min(0)]
                dot, na, nb = acc.setdefault(target, [0.0, 0.0, 0.0, keep])[:3]
                acc[target][:3] = [dot + (a * b).sum(1), na + (a * a).sum(1), nb + (b * b).sum(1)]
        rec = {}
        for g in ("ffn", "head"):
            if g not in acc or not bool(acc[g][3].any()):
                rec[f"{g}_cos_mean"] = rec[f"{g}_cos_max"] = None
                continue
            dot, na, nb, keep = acc[g]
            cos = (dot / (na.sqrt() * nb.sqrt()).clamp_min(1e-30))[keep]
            rec[f"{g}_cos_mean"], rec[f"{g}_cos_max"] = float(cos.mean()), float(cos.max())
            rec[f"_{g}_cos"] = cos.cpu()  # every new unit's cosine: the distribution (``summarize``)
        out.append(rec)
    return out


def quantiles(xs: torch.Tensor) -> tuple[float, float]:
    """(median, 90th percentile) of a 1-d tensor (linear interpolation)."""
    q = torch.quantile(xs.double(), torch.tensor([0.5, 0.9], dtype=torch.float64))
    return float(q[0]), float(q[1])


def _new_old_rms(cfg, umap: list[dict], get: Callable[[str], torch.Tensor | None]) -> list[dict]:
    """Per block and group ("ffn", "head": a head with its KV group's rows): (RMS over the new units'
    entries, RMS over the old units') of the tensors ``get`` gives for the block's readers and writers
    (None where it gives none)."""
    out = []
    for i, m in enumerate(umap):
        acc = {}  # group -> [new sum sq, new count, old sum sq, old count]
        for name, spec in _block_tensors(cfg, i):
            t = get(name)
            if t is None:
                continue
            for group, u in _unit_rows(t.detach().float(), spec, cfg):
                n_old = m[group][0]
                if m[group][1] is None:
                    continue
                target = "head" if group == "kv" else group
                a = acc.setdefault(target, [0.0, 0, 0.0, 0])
                a[0] += float((u[n_old:] ** 2).sum())
                a[1] += u[n_old:].numel()
                a[2] += float((u[:n_old] ** 2).sum())
                a[3] += u[:n_old].numel()
        out.append({g: (math.sqrt(a[0] / a[1]), math.sqrt(a[2] / a[3])) for g, a in acc.items() if a[1] and a[3]})
    return out


def grad_ratios(cfg, umap: list[dict], params: dict) -> list[dict]:
    """Per block: RMS gradient of the new units' weights / RMS gradient of the old units' (None when
    there are no new units or no gradient)."""

    def grad(name):
        p = params.get(name)
        return None if p is None else p.grad

    out = []
    for rms in _new_old_rms(cfg, umap, grad):
        out.append({f"{g}_grad_ratio": (rms[g][0] / rms[g][1] if g in rms and rms[g][1] > 0 else None)
                    for g in ("ffn", "head")})  # fmt: skip
    return out


def update_rms(cfg, umap: list[dict], before: dict, params: dict) -> list[dict]:
    """Per block: the RMS of one optimizer update (weights after - ``before``) over the new units'
    entries and over the old units', and their ratio (new / old). Under Adam the gradient ratio says
    little (the update is normalised per entry); this is what the new units actually move by."""

    def delta(name):
        p = params.get(name)
        return None if p is None or name not in before else p.detach() - before[name]

    out = []
    for rms in _new_old_rms(cfg, umap, delta):
        rec = {}
        for g in ("ffn", "head"):
            new, old = rms.get(g, (None, None))
            rec[f"{g}_update_rms_new"], rec[f"{g}_update_rms_old"] = new, old
            rec[f"{g}_update_ratio"] = new / old if new is not None and old else None
        out.append(rec)
    return out


def _mean(blocks: list[dict], key: str):
    xs = [b[key] for b in blocks if b.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


def _cos_distribution(blocks: list[dict]) -> dict:
    """Median and 90th percentile of the copied-unit cosines over every block (FFN neurons, heads, and
    both together: ``cos_median`` / ``cos_p90``); the per-unit tensors are taken out of ``blocks``."""
    out, both = {}, []
    for g in ("ffn", "head"):
        xs = [b.pop(f"_{g}_cos") for b in blocks if f"_{g}_cos" in b]
        med = p90 = None
        if xs:
            both += xs
            med, p90 = quantiles(torch.cat(xs))
        out[f"{g}_cos_median"], out[f"{g}_cos_p90"] = med, p90
    out["cos_median"], out["cos_p90"] = quantiles(torch.cat(both)) if both else (None, None)
    return out


def summarize(blocks: list[dict], entry: dict, since: int | None) -> dict:
    dist = _cos_distribution(blocks)
    keys = list(dict.fromkeys(k for b in blocks for k in b))
    means = {k: _mean(blocks, k) for k in keys if k != "gate"}
    means["ffn_cos_max"] = max((b["ffn_cos_max"] for b in blocks if b.get("ffn_cos_max") is not None), default=None)
    means["head_cos_max"] = max((b["head_cos_max"] for b in blocks if b.get("head_cos_max") is not None), default=None)
    out = {"recipe": entry.get("recipe"), "width_from": entry.get("width_from"), "width_to": entry.get("width_to")}
    if since is not None:
        out["since_step"] = since
    return {**out, **means, **dist, "blocks": blocks}


def writer_modules(model, cfg) -> list[dict]:
    """Per block: {"ffn" / "head": (module, tensor name, unit kind)} of its writers that are plain Linear
    layers (an FFN's down projection, attention's output), whose inputs are the units' outputs."""
    out = []
    for i in range(cfg.layers):
        found = {}
        for name, spec in _block_tensors(cfg, i):
            if spec.role != "writer" or len(spec.units) != 1:
                continue
            group = "ffn" if spec.units[0] == "ffn" else "head" if spec.units[0] in ("q", "qkv", "mv") else None
            mod = model.get_submodule(name.rsplit(".", 1)[0]) if group else None
            if isinstance(mod, (torch.nn.Linear, Linear)) and mod.weight.dim() == 2:
                found[group] = (mod, name, spec.units[0])
        out.append(found)
    return out


def new_share(x: torch.Tensor, w: torch.Tensor, n_old: int) -> float | None:
    """The share of a writer's output that comes from its new units, on input ``x`` [..., units]
    (the units' outputs, gated ones times their gate): |y_new| / (|y_old| + |y_new|), y_old = x_old W_old^T,
    y_new = x_new W_new^T, norms over every token (1/2 for exact split copies; 0 at gate 0)."""
    x, w = x.detach().float().reshape(-1, x.shape[-1]), w.detach().float()
    a = (x[:, :n_old] @ w[:, :n_old].T).norm()
    b = (x[:, n_old:] @ w[:, n_old:].T).norm()
    return float(b / (a + b)) if float(a + b) > 0 else None


class Tracker:
    """The diagnostics of one run's latest growth (``for_run``): when they are due and their record."""

    def __init__(self, cfg, lineage: list, umap: list[dict]):
        self.cfg, self.entry, self.umap = cfg, latest_growth(lineage), umap
        self.key = (len(lineage), cfg.width, cfg.heads, cfg.ffn)

    def due(self, step: int, s: dict, since: int) -> bool:
        """After update ``step`` (1-based count): at the metrics cadence, the last step, and about 8
        times over the gate ramp from step ``since`` (the run's latest growth)."""
        if step % s["metrics_every"] == 0 or step == s["steps"]:
            return True
        per_step = s["batch"] * s["seq"]
        ramp = max(1, math.ceil(ramp_tokens(s) / per_step))
        k = step - since
        return 0 < k <= ramp and (k == 1 or k % max(1, ramp // 8) == 0)

    def gates(self, model) -> list:
        if not self.cfg.gated:
            return [None] * self.cfg.layers
        sd, a = model.state_dict(), arch_of(self.cfg)
        return [float(sd[a.gate_name(i)].reshape(-1)[0]) for i in range(self.cfg.layers)]

    def grads(self, model) -> list[dict]:
        """The gradient ratios of the update in progress, and the gates that update runs at; keeps a
        copy of the blocks' unit weights, so ``record`` can measure the update itself."""
        params = dict(model.named_parameters())
        ratios = grad_ratios(self.cfg, self.umap, params)
        self.before = {
            n: params[n].detach().clone()
            for i in range(self.cfg.layers)
            for n, _ in _block_tensors(self.cfg, i)
            if n in params
        }
        return [{**r, "gate": g} for r, g in zip(ratios, self.gates(model))]

    def capture(self, model) -> None:
        """Keep the writers' inputs of the next forward pass (for ``record``'s new-unit output shares)."""
        self.inputs, self.hooks = {}, []
        for i, found in enumerate(writer_modules(model, self.cfg)):
            for group, (mod, _, _) in found.items():

                def keep(_m, args, key=(i, group)):
                    self.inputs.setdefault(key, args[0].detach())

                self.hooks.append(mod.register_forward_pre_hook(keep))

    def shares(self, model) -> list[dict]:
        """Per block: ``ffn_new_share`` / ``head_new_share`` from the captured inputs (None without)."""
        for h in getattr(self, "hooks", []):
            h.remove()
        self.hooks, inputs = [], getattr(self, "inputs", {})
        out = []
        for i, found in enumerate(writer_modules(model, self.cfg)):
            rec = {}
            for group in ("ffn", "head"):
                x = inputs.get((i, group))
                if group not in found or x is None or self.umap[i][group][1] is None:
                    rec[f"{group}_new_share"] = None
                    continue
                mod, _, kind = found[group]
                n_old = self.umap[i][group][0] * unit_count(self.cfg, kind)[1]
                w = mod.weight.T if getattr(mod, "in_out", False) else mod.weight  # GPT-2's Conv1D: [in, out]
                rec[f"{group}_new_share"] = new_share(x, w, n_old)
            out.append(rec)
        self.inputs = {}
        return out

    def record(self, model, grads: list[dict] | None, since: int | None) -> dict:
        """Cosines of the weights now; with ``grads`` (from before the update) its ratios, gates and
        update RMS (new / old units), else the gates now."""
        blocks = similarity(self.cfg, self.umap, model.state_dict().__getitem__)
        empty = [{"ffn_grad_ratio": None, "head_grad_ratio": None, "gate": g} for g in self.gates(model)]
        for b, extra in zip(blocks, grads or empty):
            b.update(extra)
        before = getattr(self, "before", None)
        if grads is not None and before is not None:
            for b, extra in zip(blocks, update_rms(self.cfg, self.umap, before, dict(model.named_parameters()))):
                b.update(extra)
            self.before = None
        if getattr(self, "inputs", None):
            for b, extra in zip(blocks, self.shares(model)):
                b.update(extra)
        return summarize(blocks, self.entry, since)


def for_run(run) -> Tracker | None:
    """The run's tracker for its model now (cached on ``run.diag``; rebuilt after a growth); None for a
    model without a recorded growth, and for an FSDP-sharded model (its tensors are not local)."""
    from growtool.training import fsdp

    cfg = run.model.cfg
    key = (len(run.lineage), cfg.width, cfg.heads, cfg.ffn)
    if run.diag is not None and run.diag[0] == key:
        return run.diag[1]
    umap = None if fsdp.is_sharded(run.model) else unit_map(cfg, run.lineage)
    run.diag = (key, Tracker(cfg, run.lineage, umap) if umap else None)
    return run.diag[1]


def since(run, step: int) -> int:
    """The step of the run's latest growth at or before ``step`` (0: none; as schedule.last_growth)."""
    return max((g["step"] for g in run.growths if g["step"] <= step), default=0)


def before_forward(run, step: int) -> None:
    """Before the forward pass of update ``step`` (0-based): when the diagnostics are due after it, keep
    the writers' inputs of that pass (the new units' share of each block's output)."""
    t = for_run(run) if run.lead else None
    if t is not None and t.due(step + 1, run.s, since(run, step)):
        t.capture(run.model)


def before_update(run, step: int) -> list[dict] | None:
    """Before the optimizer step of update ``step`` (0-based): the gradient ratios when the
    diagnostics are due after it (lead rank only), else None."""
    t = for_run(run) if run.lead else None
    if t is None or not t.due(step + 1, run.s, since(run, step)):
        return None
    return t.grads(run.model)


def after_update(run, step: int, grads: list[dict] | None) -> dict | None:
    """The record after update ``step`` (1-based count) when ``before_update`` found it due."""
    if grads is None:
        return None
    return for_run(run).record(run.model, grads, since(run, step))


def at_start(run) -> dict | None:
    """The record at step 0 (before any update: cosines and gates, no gradients)."""
    t = for_run(run) if run.lead else None
    return None if t is None else t.record(run.model, None, since(run, 0))


def checkpoint_record(ck) -> dict | None:
    """The similarity figures of a checkpoint against its latest recorded growth (``inspect --metrics``):
    a grown checkpoint (cosines at the growth) or one trained after it (how far its copies moved)."""
    umap = unit_map(ck.config, ck.lineage)
    if umap is None:
        return None
    blocks = similarity(ck.config, umap, ck.get)
    gates = None
    if ck.config.gated:
        a = arch_of(ck.config)
        gates = [float(ck.get(a.gate_name(i)).reshape(-1)[0]) for i in range(ck.config.layers)]
    for i, b in enumerate(blocks):
        b["gate"] = gates[i] if gates else None
    return summarize(blocks, latest_growth(ck.lineage), None)


__all__ = ["unit_map", "similarity", "grad_ratios", "Tracker", "for_run", "checkpoint_record", "latest_growth"]
