"""Property-based growth contract: random families, shapes, ratios, options and recipes.

For every drawn source (random weights, perturbed norm gains and biases) and growth request:
  1. gate 0: the grown model's logits equal the source's within 1e-4 x the logit scale (float32);
  2. ``fold --alpha 1`` equals the grown model run at gate 1 (same tolerance).
Ratios are whatever the draw gives (e.g. 3 -> 5 heads: 48 -> 80), integer or not.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from growtool.check import compare, random_batches
from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.fold import fold_config, fold_tensor
from growtool.grow.plan import build_plan
from growtool.nn.config import ModelConfig
from growtool.nn.families import ARCHS, expected_shapes
from growtool.nn.model import LM

from helpers import random_tensors


def _moe(draw, arch) -> dict:
    experts = draw(st.integers(1, 4))
    kw = dict(experts=experts, top_k=draw(st.integers(1, experts)), norm_topk=draw(st.booleans()))
    if "shared_ffn" in arch.keys:  # Qwen2-MoE's shared expert
        kw["shared_ffn"] = draw(st.integers(1, 40))
    return kw


@st.composite
def growth_cases(draw):
    family = draw(st.sampled_from(sorted(ARCHS)))
    f = ARCHS[family].features
    partial = ARCHS[family].defaults.get("rotary_fraction", 1.0) < 1  # NeoX rotates 1/4, Phi 1/2
    head_dim = draw(st.sampled_from([8, 16] if partial else [4, 6, 8, 16]))
    per_kv = draw(st.sampled_from([1, 2, 3])) if f.gqa else 1  # query heads per KV head
    kv = 1 if f.mqa else draw(st.integers(1, 3))  # multi-query: one KV head, before and after growth
    new_kv = draw(st.integers(kv + 1, kv + 3))
    heads, width = kv * per_kv, kv * per_kv * head_dim
    bias = draw(st.booleans())
    cfg = ModelConfig(
        family=family,
        vocab_size=draw(st.integers(16, 48)),
        width=width,
        layers=draw(st.integers(1, 2)),
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        ffn=4 * width if f.embed_norm else draw(st.integers(1, 4)) * width + draw(st.integers(0, 5)),
        context=16,
        tie=draw(st.booleans()) and f.norm_affine,  # a tied head over a norm without gain: refused
        attn_gate=draw(st.booleans()),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=draw(st.booleans()),
        norm_eps=draw(st.sampled_from([1e-5, 1e-12])),
        **(_moe(draw, ARCHS[family]) if f.moe else {}),  # drawn last: other families' draws unchanged
    )
    # copy adds ungated heads: refused as lossy under a q/k norm over all heads (OLMo 2), whose new rows must be 0
    recipes_ = ["srio"] + (["copy"] if f.qk_norm != "full" else []) + (["nrio"] if f.norm == "rmsnorm" else [])
    D = new_kv * per_kv * head_dim
    if f.embed_norm:  # BLOOM: whole factors only, MLP 4 x width, no copied heads (ALiBi slopes differ)
        D, recipes_ = (2 + (new_kv - kv) // 3) * width, ["srio"]
    recipe = draw(st.sampled_from(recipes_))
    return cfg, D, recipe, draw(st.integers(0, 2**16))


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
