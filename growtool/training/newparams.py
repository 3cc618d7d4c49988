"""The optimizer treatment of a growth's new parameters (issue 40): their own LR multiplier, and fresh
AdamW moments with a short re-warm for them only (SPARKLING-style).

"New" is defined per tensor by the latest width growth in the run's lineage (``diagnostics.latest_growth``),
as a boolean mask of the grown tensor's entries:

* along a unit axis (query heads, KV groups, FFN neurons of readers, writers and unit biases): the
  units at index >= the source's count of that kind (every row / column of a new unit);
* along the residual axis (every tensor that has one: embedding, head, readers, writers, norms):
  the dims at index >= the source's width (old units' entries on the new dims included: the new
  residual dims are new capacity whatever writes into them).

A tensor the growth added (recipe ``add_biases``: a zero bias the source did not have) is new whole.
Everything else (old units on old dims, per-head norms, gates) is old. Depth growth's new blocks
and a shared expert's new neurons (Qwen2-MoE) are not covered: they count as old.

The treatment, from the growth on (``--grow-at``: its step; the plain path, ``expand`` then
``train GROWN``: step 0 of a run whose checkpoint was grown and not trained since):
  new entries' step = f(k) x AdamW's step, f(k) = new_lr_mult x min(1, (k + 1) / new_rewarm_steps)
  (k: updates since the growth; no ramp when new_rewarm_steps = 0). AdamW has one LR per group, so
  the step is scaled after it is taken: p <- p0 + f (p - p0) on the mask (weight decay included,
  as a per-entry LR would). With new_rewarm_steps > 0 a --grow-at growth also zeroes the new
  entries' carried moments (fresh moments; the plain path's AdamW is fresh anyway).
"""

from __future__ import annotations

import torch

from growtool.nn.families import expected_shapes, tensor_specs, unit_count
from growtool.training import diagnostics


def active(s: dict) -> bool:
    return s.get("new_lr_mult", 1.0) != 1.0 or bool(s.get("new_rewarm_steps", 0))


def masks(cfg, lineage: list) -> dict[str, torch.Tensor] | None:
    """{tensor name: bool mask of its new entries} for the latest width growth in ``lineage``, or None
    when there is none that made this model's shape."""
    found = diagnostics.growth_source(cfg, lineage)
    if found is None:
        return None
    src = found[1]
    out, had, shapes = {}, expected_shapes(src), expected_shapes(cfg)
    for name, spec in tensor_specs(cfg).items():
        shape = tuple(shapes[name])
        m = torch.full(shape, name not in had and spec.role != "growth_gate", dtype=torch.bool)
        if spec.res_axis is not None and spec.res_axis < len(shape):
            m.narrow(spec.res_axis, src.width, cfg.width - src.width).fill_(True)
        if spec.units and spec.unit_axis is not None:
            off = 0
            for kind in spec.units:
                (n, block), n_old = unit_count(cfg, kind), unit_count(src, kind)[0]
                m.narrow(spec.unit_axis, off + n_old * block, (n - n_old) * block).fill_(True)
                off += n * block
        if m.any():
            out[name] = m
    return out


def since(run, step: int) -> int | None:
    """The step the treatment counts from at update ``step``: the run's latest growth at or before it,
    else 0 when the run's checkpoint was grown and not trained since (the plain path), else None."""
    done = [g["step"] for g in run.growths if g["step"] <= step and "layers" not in g]
    if done:
        return max(done)
    if not run.growths and run.ck.lineage and run.ck.lineage[-1].get("op") == "expand":
        return 0
    return None


def factor(s: dict, k: int) -> float:
    """f(k) of the module docstring: the new entries' step multiplier k updates after the growth."""
    ramp = s.get("new_rewarm_steps", 0)
    return s.get("new_lr_mult", 1.0) * (min(1.0, (k + 1) / ramp) if ramp else 1.0)


def _masks_now(run) -> dict | None:
    cfg = run.model.cfg
    key = (len(run.lineage), cfg.width, cfg.heads, cfg.ffn)
    cached = getattr(run, "_new_masks", None)
    if cached is None or cached[0] != key:
        ms = masks(cfg, run.lineage)
        dev = next(run.model.parameters()).device
        run._new_masks = (key, {n: m.to(dev) for n, m in ms.items()} if ms else None)
    return run._new_masks[1]


def local(t: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the entries of ``t`` this process holds, the part of mask ``m`` over them): ``t`` and ``m``
    themselves, or under FSDP2 the rank's shard (Shard(0): the rank's ``torch.chunk`` of the rows)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, m
    mesh = t.device_mesh
    rows = torch.chunk(m, mesh.size(), dim=0)
    rank = mesh.get_local_rank()
    part = t.to_local()
    return part, (rows[rank] if rank < len(rows) else m[:0])[: part.shape[0]].to(part.device)


def before_step(run, step: int) -> list | None:
    """Before the optimizer step of update ``step`` (0-based): (parameter, its values, mask, f) for
    each tensor with new entries, when the treatment applies; else None. Under FSDP2 each rank
    treats the entries of its own shard."""
    if not active(run.s):
        return None
    start = since(run, step)
    if start is None:
        return None
    f = factor(run.s, step - start)
    ms = _masks_now(run)
    if f == 1.0 or not ms:
        return None
    params = dict(run.model.named_parameters())
    return [(*_kept(params[n], m), f) for n, m in ms.items() if n in params]


def _kept(p, m):
    t, lm = local(p.detach(), m)
    return t, t.clone(), lm


def after_step(kept: list | None) -> None:
    """Scale the step just taken on the new entries by f (``before_step``)."""
    for p, p0, m, f in kept or []:
        with torch.no_grad():
            p.copy_(torch.where(m, p0 + f * (p - p0), p))


def fresh_moments(run) -> None:
    """Zero the AdamW moments of the new entries (after a --grow-at growth, with new_rewarm_steps > 0)."""
    if not run.s.get("new_rewarm_steps", 0):
        return
    ms = _masks_now(run) or {}
    for n, p in run.model.named_parameters():
        st = run.opt.state.get(p)
        if n in ms and st:
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    t, m = local(st[k], ms[n])
                    t.masked_fill_(m, 0.0)
