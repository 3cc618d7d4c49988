"""Width growth as a plan, then an execution: ``plan = build_plan(...)``; ``grow_tensor(name, plan, get)``.

This module gathers the names of the growth package in one place; the code is in ``plan.py`` (the
plan), ``steps.py`` (the steps), ``engine.py`` (the execution and its memory) and ``fold.py``.

The plan fixes everything before a tensor is touched: the target config, the residual map (the
rotation angle, or none) and why, the expansion of every unit axis in every block and of the
residual axis, whether the result keeps the function (and if not, why), and for every output
tensor the list of steps that make it. The printed plan table and the execution both read those
steps, so they cannot disagree.

Steps (each a small class below, with ``apply`` and ``describe``):
  FoldGain        fold the norm gain into a reader (rotated RMSNorm readers)
  ExpandUnits     grow the unit axis (new heads / FFN neurons) by the recipe's kind; Net2Net split
  ExpandResidual  grow the residual axis by a kind; "tile" units fill the new-new block
  ZeroOldWrites   old (ungated) units write nothing into the new residual dims
  Rotate          the SRIO rotation along the residual axis
  PadRotate       ExpandResidual by zeros + Rotate in one pass that skips the zeros (same bytes)
  BreakSymmetry   recipe ``noise``: noise on new units that keeps the function at gate 0
  CancelPairs     recipe ``pair_noise``: +/- delta (relative to the unit) on split copies' writers
  NormGain, PadZero, Keep, GateZero   norms, biases, per-head norms, warm-up gates
"""

from growtool.grow.engine import (  # noqa: F401
    BLOCKED_FROM,
    HUGE,
    PIECE,
    ROW_BLOCK,
    Workspace,
    fresh,
    grow_tensor,
)
from growtool.grow.fold import fold_config, fold_tensor  # noqa: F401
from growtool.grow.plan import (  # noqa: F401
    Plan,
    build_plan,
    embed_factor,
    gate_values,
    lineage_entry,
    qk_scale,
    residual_map,
    target_config,
    tensor_steps,
)
from growtool.grow.steps import (  # noqa: F401
    BreakSymmetry,
    CancelPairs,
    Ctx,
    ExpandResidual,
    ExpandUnits,
    FoldGain,
    GateZero,
    Keep,
    NormGain,
    PadRotate,
    PadZero,
    Rotate,
    Scale,
    Step,
    UnitNormGain,
    ZeroNewUnits,
    ZeroOldWrites,
)

__all__ = [
    "Plan",
    "Workspace",
    "build_plan",
    "grow_tensor",
    "fold_tensor",
    "fold_config",
    "target_config",
    "residual_map",
]
