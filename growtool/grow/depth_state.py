"""The AdamW state of a depth growth (grow/depth.py): each tensor's moments grown by the width plan's
rules (``moments``), then placed by the depth layout, as the weights are."""

from __future__ import annotations

import torch

from growtool.grow import moments as grow_state
from growtool.grow.depth import Grown
from growtool.nn.errors import GrowError
from growtool.nn.families import expected_shapes


def grow_optimizer_state(opt_state: dict, src_names: list[str], new_groups: list[list[str]], g: Grown, get) -> dict:
    """The AdamW ``state_dict`` of the grown model: each tensor's moments grown by the width plan's
    rules (``moments``), then placed by the depth layout. A copied block takes its source block's
    moments (Staged Training's rule: the copy starts where its source's optimizer is); an identity
    block and the gates start at zero moments with the common step count."""
    src = grow_state.moments_by_name(src_names, opt_state)
    steps = [s["step"] for s in src.values()]
    step0 = steps[0].clone() if steps else torch.tensor(0.0)
    shapes = expected_shapes(g.cfg)
    state, cache = {}, {}

    def grown(n):  # the width-grown moments of source tensor n (each computed once)
        if n not in cache:
            m = src[n]
            if g.width is None:
                cache[n] = {k: m[k].detach().float().clone() for k in ("exp_avg", "exp_avg_sq")}
            else:
                cache[n] = {
                    "exp_avg": grow_state.grow_moment(n, g.width, get, m["exp_avg"], second=False),
                    "exp_avg_sq": grow_state.grow_moment(n, g.width, get, m["exp_avg_sq"], second=True),
                }
            cache[n]["step"] = m["step"]
        return cache[n]

    new_names = [n for grp in new_groups for n in grp]
    for i, n in enumerate(new_names):
        s = g.source_name(n)
        _, j = g.specs[n]
        identity = j is not None and g.depth.layout[j].kind == "identity"
        if s in src and not identity:
            m = grown(s)
            state[i] = {k: m[k].clone() for k in ("step", "exp_avg", "exp_avg_sq")}
        elif opt_state["state"]:
            z = torch.zeros(shapes[n])
            state[i] = {"step": step0.clone(), "exp_avg": z, "exp_avg_sq": z.clone()}
    groups, k = [], 0
    if len(opt_state["param_groups"]) != len(new_groups):
        raise GrowError("the optimizer's parameter groups do not match the grown model's")
    for grp, names in zip(opt_state["param_groups"], new_groups):
        groups.append({**grp, "params": list(range(k, k + len(names)))})
        k += len(names)
    return {"state": state, "param_groups": groups}


__all__ = ["grow_optimizer_state"]
