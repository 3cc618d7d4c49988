"""The optimizer of a training run: AdamW over ``moments.param_groups``."""

from __future__ import annotations

import torch

from growtool.grow import moments
from growtool.nn.model import LM
from growtool.training.schedule import mup as mup_of


def make_optimizer(model: LM, s: dict) -> torch.optim.AdamW:
    """AdamW over moments.param_groups: weight decay on matrices only; with --grow-lr mup the
    hidden matrices form their own group (``width_scaled``: its LR follows 1/width after growths)."""
    by_name, mup = dict(model.named_parameters()), mup_of(s)
    *matrices, rest = moments.param_groups(model, mup)
    groups = [
        {"params": [by_name[n] for n in g], "weight_decay": s["weight_decay"], "width_scaled": mup and i == 0}
        for i, g in enumerate(matrices)
    ]
    groups.append({"params": [by_name[n] for n in rest], "weight_decay": 0.0, "width_scaled": False})
    return torch.optim.AdamW(groups, lr=s["lr"], betas=(0.9, 0.95))
