"""Growth inside training: a live model and its optimizer grown at a step, a schedule of such
growths (``growtool train --grow-at FRACTION:WIDTH``, or ``FRACTION:width=W,layers=L[,method=M]``
to grow the depth too), and a run folder grown on disk (``growtool expand RUN_DIR --width D
[--layers L] -o NEW_RUN_DIR``).

What holds:

* A growth at step s happens before update s (0-based). The model's gates (if it was grown before)
  must be fully open (1) by then; they fold away, and the plain model grows by the recipe's plan
  (``plan.build_plan``, seed = the run's seed + the stage number, so a repeat is identical). The
  AdamW moments grow by ``moments``'s rules; step counts, learning-rate schedule and RNG carry
  on: no optimizer reset and no LR re-warm. The new gates ramp 0 -> 1 over ``gate_warmup_tokens``
  from step s, so the first update after the growth sees the source's function.
* A run state records its growths (``growths``: step, width, recipe) in ``last.pt``; a run resumed
  at a saved step before a scheduled growth redoes that growth identically, so a resumed run's
  metrics equal an uninterrupted run's.
* Each metrics record carries ``stage`` (growths so far), ``width``, ``layers`` and ``flops``: cumulative
  training FLOPs, 6 x parameters x tokens summed over the steps (each step at its own width).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from growtool.grow import limits, moments, recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.fold import fold_config, fold_tensor
from growtool.grow.plan import Units, build_plan, lineage_entry
from growtool.io import checkpoint, confine
from growtool.nn.errors import GrowError
from growtool.nn.families import expected_shapes
from growtool.training.run_folder import MODEL, PRE_DECAY, STATE, read_metrics, save_bytes, write_metrics
from growtool.training.schedule import mup, run_gate, run_gate_for
from growtool.training.settings import (
    default_gate_tokens,
    grow_schedule_after,
    parse_grow_at,
    saved_setting,
    target_layers,
    target_width,
)

# ---- the schedule ----------------------------------------------------------------------------


def precheck(grow_at, recipe: str, cfg, fsdp: bool = False, device=None) -> None:
    """What can be checked before the data is read: widths above the model's and rising, layers above
    the model's, each grown model small enough to train on ``device`` (grow/limits.py), the recipe;
    not with --fsdp (growing a sharded model and optimizer is not built)."""
    if grow_at and fsdp:
        raise GrowError("--grow-at does not work with --fsdp yet (a sharded model and optimizer cannot grow)")
    targets = [w for _, w in parse_grow_at(grow_at)]
    check_targets(targets, cfg.width, cfg.layers)
    width, layers = cfg.width, cfg.layers
    for item, w in zip(grow_at or (), targets):
        width, layers = target_width(w) or width, target_layers(w) or layers
        if layers != cfg.layers:
            limits.check_depth(cfg, layers, 4, f"--grow-at {item}: layers")
        limits.check_growth(cfg, width, None, 4, f"--grow-at {item}: width")
        limits.check_trainable(cfg, width, layers, device, f"--grow-at {item}")
    if grow_at and recipes.load(recipe)["add_biases"] != "none" and any(target_layers(w) for w in targets):
        raise GrowError("--grow-recipe: add_biases applies to width growths alone, and --grow-at grows the depth")


def run_params(grow_at, cfg) -> int:
    """The parameters of the model a run of ``cfg`` ends with (--lr's default depends on them): ``cfg``'s,
    or for a run with --grow-at about those of its last target (``cfg``'s count scaled by
    grow/limits.py's estimate of the two shapes)."""
    width, layers = cfg.width, cfg.layers
    for _, w in parse_grow_at(grow_at):
        width, layers = target_width(w) or width, target_layers(w) or layers
    n = cfg.n_params()
    if (width, layers) == (cfg.width, cfg.layers):
        return n
    est = limits.estimate_bytes
    return round(n * est(cfg, width, None, 1, layers) / est(cfg, cfg.width, None, 1, cfg.layers))


def check_schedule(s: dict, width: int) -> None:
    """Refuse a schedule that cannot run: a width not above the previous one, or a gate ramp longer
    than a stage (a model grows again only once its gates are fully open)."""
    if s["grow_at"]:
        recipes.load(s["grow_recipe"])  # a bad name fails before anything is written
    per_step, g = s["batch"] * s["seq"], s["gate_warmup_tokens"]
    steps = [st for st, _ in s["grow_at"]] + [s["steps"]]
    check_targets([w for _, w in s["grow_at"]], width)
    for (st, _), nxt in zip(s["grow_at"], steps[1:]):
        if nxt < s["steps"] and g is not None and (nxt - st) * per_step < g:
            raise GrowError(
                f"--grow-at: the stage from step {st} to {nxt} is shorter than the gate ramp "
                f"({g} tokens = {g / per_step:g} steps); lower --gate-warmup-tokens or space the growths"
            )


def check_targets(targets: list, width: int, layers: int | None = None) -> None:
    """Each growth's width above the one before it (when it grows the width), its layers not below."""
    for w in targets:
        tw, tl = target_width(w), target_layers(w)
        if tw is not None and tw <= width:
            raise GrowError(f"--grow-at: width {tw} is not larger than the model's width {width} before it")
        if tl is not None and layers is not None and tl < layers:
            raise GrowError(f"--grow-at: layers {tl} is below the model's {layers} before it")
        if tl is not None and layers is not None and tl == layers:
            raise GrowError(f"--grow-at: layers {tl} is not more than the model's {layers} before it")
        width, layers = tw or width, tl or layers


# ---- growing a live model and its optimizer ------------------------------------------------------


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for n in sorted(tensors):
        h.update(n.encode())
        h.update(tensors[n].detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Growth:
    """What one growth asks for: the target ``width`` (None: depth alone) by the loaded ``recipe``,
    its random expansions drawn from ``seed``; ``ffn`` neurons and ``heads`` query heads (None: the
    recipe's rule); ``allow_lossy``; ``depth``: (layers, method, insert_at) to grow the depth too."""

    width: int | None
    recipe: dict
    seed: int = 0
    ffn: int | None = None
    heads: int | None = None
    allow_lossy: bool = False
    depth: tuple | None = None


def grow_model(model, opt_state: dict, gate: float | None, growth: Growth, mup: bool = False):
    """(plan, grown model (CPU, train mode, gates 0 and frozen), grown AdamW state_dict, lineage entry).

    ``gate`` is the gate value in force (None for a plain model); a gated model grows only at gate 1.
    ``mup``: the optimizer has the three groups of ``--grow-lr mup`` (moments.param_groups).
    ``growth.depth``: (layers, method, insert_at) to grow the depth too (``growth.width`` None: depth alone)."""
    from growtool.nn.model import LM

    g = growth
    cfg = model.cfg
    src_names = moments.param_order(model, mup)
    t = {n: v.detach().float().cpu().clone() for n, v in model.tensors().items()}
    if cfg.gated:
        if gate != 1.0:
            raise GrowError(
                f"cannot grow while the growth gates are at {gate:g}: grow once the gate ramp has reached 1"
            )
        plain = fold_config(cfg)
        t = {n: fold_tensor(n, cfg, 1.0, t.__getitem__, torch.float32) for n in expected_shapes(plain)}
        cfg = plain
    plan = None
    if g.width is not None:
        plan = build_plan(cfg, g.recipe, g.width, Units(g.ffn, g.heads), seed=g.seed, allow_lossy=g.allow_lossy)
    if g.depth is not None:
        return grow_depth(plan, cfg, t, (opt_state, src_names, mup), g)
    grown = {n: grow_tensor(n, plan, t.__getitem__) for n, _, _ in plan.outputs()}
    new = LM.from_tensors(plan.cfg, grown)
    for n, p in new.named_parameters():
        if n.endswith("growth_gate"):
            p.requires_grad_(False)
    new.set_gates(0.0)
    new.train()
    state = moments.grow_optimizer_state(opt_state, src_names, moments.param_groups(new, mup), plan, t.__getitem__)
    return plan, new, state, lineage_entry(plan, tensors_sha256(t))


def grow_depth(plan, cfg, t: dict, optimizer: tuple, growth: Growth):
    """``grow_model`` with a depth growth (grow/depth.py), after the width plan ``plan`` (or None).
    ``optimizer``: (AdamW state_dict, the source's parameter names in order, mup)."""
    from growtool.grow import depth as deep
    from growtool.grow import depth_state
    from growtool.nn.model import LM

    opt_state, src_names, mup = optimizer
    g = deep.build(cfg, plan, growth.depth, growth.recipe, growth.seed, torch.float32)
    width = (lambda n, rows=None: grow_tensor(n, plan, t.__getitem__)) if plan else (lambda n, rows=None: t[n])
    new = LM.from_tensors(g.cfg, {n: g.grow_tensor(n, width) for n, _, _ in g.outputs()})
    for n, p in new.named_parameters():
        if n.endswith("growth_gate"):
            p.requires_grad_(False)
    new.set_gates(0.0)
    new.train()
    state = depth_state.grow_optimizer_state(opt_state, src_names, moments.param_groups(new, mup), g, t.__getitem__)
    sha = tensors_sha256(t)
    return g, new, state, deep.lineage_entry(g, sha, plan and lineage_entry(plan, sha))


def due(run, step: int) -> int | None:
    """The width to grow to before update ``step``, if the schedule has a growth there not yet done."""
    done = {g["step"] for g in run.growths}
    return next((w for st, w in run.s.get("grow_at") or [] if st == step and st not in done), None)


def grow_run(run, step: int, target) -> None:
    """Grow ``run``'s model and optimizer in place before update ``step`` (the schedule's growth:
    a width, or a {width, layers, method} target)."""
    from growtool.training.optim import make_optimizer

    stage = len(run.growths) + 1
    r = recipes.load(run.s["grow_recipe"])
    width, layers = target_width(target), target_layers(target)
    depth = None if layers is None else (layers, target.get("method", "stack"), None)
    growth = Growth(width, r, seed=run.s["seed"] + stage, depth=depth)
    plan, new, state, entry = grow_model(run.model, run.opt.state_dict(), run_gate(run, step), growth, mup(run.s))
    B, T = run.s["batch"], run.s["seq"]
    partial = {"op": "train", "step": step, "tokens": step * B * T, "complete": False, "stage": stage - 1}
    run.lineage = run.lineage + [partial, {**entry, "step": step}]
    record = {"step": step, "width": plan.cfg.width, "recipe": r["name"], "from": run.model.cfg.width}
    if depth is not None:
        record.update(layers=plan.cfg.layers, layers_from=run.model.cfg.layers)
    run.growths = run.growths + [record]
    from growtool.training import fsdp

    fsdp.place(new, run.dev, run.world, False, run.opts.activation_checkpointing)
    run.model = new
    run.opt = make_optimizer(run.model, run.s)
    if saved_setting(run.s, "grow_optimizer") == "carry":
        run.opt.load_state_dict(state)
        if depth is None:
            from growtool.training import newparams

            newparams.fresh_moments(run)  # with --new-rewarm-steps: the new entries start from zero moments


def annotate(run, rec: dict, prev: dict | None) -> dict:
    """Add stage, width, layers and cumulative FLOPs (6 x params x tokens of this step) to a step record."""
    cfg = run.model.cfg
    step_tokens = rec["tokens"] - (prev["tokens"] if prev else 0)
    rec["stage"] = len(run.growths)
    rec["width"] = cfg.width
    rec["layers"] = cfg.layers
    rec["flops"] = (prev.get("flops", 0.0) if prev else 0.0) + 6.0 * cfg.n_params() * step_tokens
    return rec


# ---- a run folder grown on disk --------------------------------------------------------------------


def expand_run(src: Path, out: Path, growth: Growth, force: bool = False) -> tuple:
    """Grow the resumable state in run folder ``src`` into a new run folder ``out``:
    ``last.safetensors`` (the grown model, gates 0), ``last.pt`` (grown AdamW moments, same step,
    RNG and settings, the growth recorded) and ``metrics.jsonl`` (the source's records up to the step).
    ``growtool train CKPT --data ... --out OUT --resume`` with the source run's command line then
    continues it. Returns (plan, step). Written to a temporary folder, then renamed into place."""
    src, out = Path(src), Path(out)
    _check_run_paths(src, out, force)
    state, last = _read_run(src)
    step, s = state["step"], dict(state["settings"])
    growths = list(state.get("growths", []))
    model = last.model()
    for n, p in model.named_parameters():
        if n.endswith("growth_gate"):
            p.requires_grad_(False)
    shapes = {n: model.get_parameter(n).shape for n in moments.param_order(model, mup(s))}
    moments.check_moments(state["optimizer"], shapes, str(src / STATE))
    gate = run_gate_for(model.cfg, s, growths, step)
    plan, new, opt_state, entry = grow_model(model, state["optimizer"], gate, growth, mup=mup(s))
    if s.get("gate_warmup_tokens") is None:
        s["gate_warmup_tokens"] = default_gate_tokens(s["steps"], s["batch"] * s["seq"])
    record = {"step": step, "width": plan.cfg.width, "recipe": growth.recipe["name"], "from": plan.src.width}
    if growth.depth is not None:
        record.update(layers=plan.cfg.layers, layers_from=plan.src.layers)
    growths.append(record)
    s["grow_schedule"] = grow_schedule_after(s, growths)  # a growth in depth under wsd: no re-warm
    new_state = {**state, "settings": s, "optimizer": opt_state, "growths": growths}
    lineage = last.lineage + [{**entry, "step": step}, dict(last.lineage[-1])]
    records = [r for r in read_metrics(src / "metrics.jsonl") if r["step"] <= step]
    tensors = {n: v.detach().float() for n, v in new.tensors().items()}
    _write_run(
        out,
        lambda tmp: checkpoint.save_tensors(str(tmp / MODEL), plan.cfg, lineage, tensors, tokenizer=last.tokenizer),
        new_state,
        records,
    )
    return plan, step


def _check_run_paths(src: Path, out: Path, force: bool) -> None:
    """Refuse a source that is not a resumable run folder, or a destination that may not be written."""
    if not (src / STATE).exists() or not (src / MODEL).exists():
        raise GrowError(f"{src}: not a run folder with a resumable state ({MODEL} + {STATE})")
    if out.exists() and not force:
        raise GrowError(f"{out}: exists (pass --force to replace it)")
    if not out.parent.is_dir():
        raise GrowError(f"{out}: parent folder {out.parent} does not exist")
    if out.resolve() == src.resolve():
        raise GrowError(f"{out}: is the source run folder")


def _read_run(src: Path) -> tuple:
    """(state, last checkpoint) of run folder ``src``, checked: an unsharded optimizer, model and
    state from one step, steps left to train."""
    from growtool.training.run_folder import load_state

    state = load_state(src / STATE)  # weights_only, checked
    if "optimizer" not in state:
        raise GrowError(f"{src}: its optimizer state is sharded (an --fsdp run): growing it is not built")
    last = checkpoint.load(confine.run_file(src / MODEL))  # a regular file of the run folder, not a link out
    step = state["step"]
    if not last.lineage or last.lineage[-1].get("step") != step:
        raise GrowError(f"{src}: {MODEL} and {STATE} are from different steps")
    s = state["settings"]
    if step >= s["steps"]:
        pre = src / PRE_DECAY
        how = (
            f"grow {pre} (the state before its decay) and resume it with the whole length, or "
            if (pre / STATE).is_file()
            else ""
        )
        raise GrowError(
            f"{src}: the run is finished (step {step} of {s['steps']}): nothing left to train after a growth; "
            f"{how}grow its final.safetensors with expand and train that"
        )
    return state, last


def _write_run(out: Path, save_model, state: dict, records: list) -> None:
    """Write a run folder (the model by ``save_model(folder)``, the state, the metrics) to a
    temporary folder beside ``out``, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        save_model(tmp)
        save_bytes(tmp / STATE, state)
        write_metrics(tmp / "metrics.jsonl", records)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = ["Growth", "grow_model", "grow_run", "expand_run", "annotate", "due"]
