"""Property-based growth contract: random families, shapes, ratios, options and recipes.

For every drawn source (random weights, perturbed norm gains and biases) and growth request:
  1. gate 0: the grown model's logits equal the source's within 1e-4 x the logit scale (float32);
  2. ``fold --alpha 1`` equals the grown model run at gate 1 (same tolerance).
Ratios are whatever the draw gives (e.g. 3 -> 5 heads: 48 -> 80), integer or not.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings

from growtool.check import compare, random_batches
from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.fold import fold_config, fold_tensor
from growtool.grow.plan import build_plan
from growtool.nn.families import expected_shapes
from growtool.nn.model import LM

from helpers import random_tensors
from strategies import growth_cases


@settings(max_examples=40, deadline=None, derandomize=True)
@given(growth_cases())
def test_gate_zero_keeps_the_function_and_fold_one_is_gate_one(case):
    cfg, D, recipe, seed = case
    src = random_tensors(cfg, seed=seed)
    plan = build_plan(cfg, recipes.load(recipe), D, seed=seed)
    assert plan.exact and plan.cfg.width == D
    grown = {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}
    m_src, m_grown = LM.from_tensors(cfg, src), LM.from_tensors(plan.cfg, grown)
    x = random_batches(cfg.vocab_size, cfg.context, 4, seed)
    c0 = compare(m_src, m_grown, x, alpha=0.0)
    assert c0.logit_scale > 1e-3  # a real function, not a degenerate one
    assert c0.rel <= 1e-4, (c0, case)

    fcfg = fold_config(plan.cfg)
    folded = {n: fold_tensor(n, plan.cfg, 1.0, grown.__getitem__, torch.float32) for n in expected_shapes(fcfg)}
    m_fold = LM.from_tensors(fcfg, folded)
    assert not fcfg.gated
    c1 = compare(m_grown, m_fold, x, alpha=1.0, src_alpha=1.0)
    assert c1.rel <= 1e-4, (c1, case)
