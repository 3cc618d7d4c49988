"""The trainer's settings, defined once.

Every field of ``Settings`` is a ``growtool train`` option (``--name-with-dashes``, its help, default
and range from here), a keyword of ``growtool.training.loop.train``, and, unless marked otherwise, part of
the settings saved with a run and compared when the run is resumed. Adding a setting is one field
here (plus using it in loop.py); tests/test_train_settings.py checks that every field reaches the
CLI and the resume check.
"""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import MISSING, dataclass, field, fields

from growtool.nn import args
from growtool.nn.errors import GrowError

# what the saved settings hold beyond the fields: the run's identity, compared on resume too
IDENTITY = ("data_sha256", "val_sha256", "source_sha256")

# the default cadences: a share of the run, but at least this many steps (and at most the run), so
# that a short run is not mostly validation, metrics and saving (bench/README.md: "Default intervals")
SHARES = {"eval_every": 0.05, "metrics_every": 0.1, "save_every": 0.1}
FLOORS = {"eval_every": 25, "metrics_every": 50, "save_every": 50}

# --lr's default: the peak LR the budget study's arms were best at (d64 x 4 on docs.jsonl, bytes and a BPE of
# 512 ids: bench/results/budget_d64/WRITEUP.md). The best LR falls as a run grows longer (Bjorck et al., ICLR
# 2025), so each family has a ladder: (the tokens per parameter a run stays under, its LR), shortest runs first,
# the last rung for any longer run. Llama (and the families without a ladder of their own): 6e-3 under 4
# (scratch at 3.5 lower on 2 of 3 seeds; the base of a plain path at 5 runs 3.8 and its growth ended lower on
# 4 of 5), 4.5e-3 under 12 (scratch's best at 5; ties at 10; the grown runs' at 10, a short base's included),
# 3e-3 from 12 (scratch's best at 14 and 20). GPT-2: 6e-3 under 7 (scratch at 3.5 and 5 lower on 3 of 3
# seeds; ties at 7 and 10), 4.5e-3 beyond (its best on BPE at 20; 6e-3 on bytes)
LR_LADDER = {
    "llama": ((4, 6e-3), (12, 4.5e-3), (math.inf, 3e-3)),
    "gpt2": ((7, 6e-3), (math.inf, 4.5e-3)),  # GPT-2 (LayerNorm, learned positions, tied head)
}
WARMUP_MIN = 50  # steps: a run's LR warm-up is no shorter, unless that is more than 10% of the run


def default_lr(family: str, tokens_per_param: float | None = None) -> float:
    """``train``'s peak LR for a model of ``family`` trained on ``tokens_per_param`` tokens per parameter
    (of the model the run ends with) when --lr is not given; a run of unknown length gets the longest rung's."""
    ladder = LR_LADDER.get(family, LR_LADDER["llama"])
    if tokens_per_param is None:
        return ladder[-1][1]
    return next(lr for below, lr in ladder if tokens_per_param < below)


def ladder_text() -> str:
    """The LR ladders in words, for --lr's help."""

    def rungs(ladder):
        return ", ".join(f"{lr:g} under {below:g}" if below < math.inf else f"{lr:g} beyond" for below, lr in ladder)

    return "; ".join(f"{'Llama and the others' if f == 'llama' else f} {rungs(x)}" for f, x in LR_LADDER.items())


def setting(
    default,
    help: str,
    *,
    low=None,
    high=None,
    low_open=False,
    resume: bool | str = True,
    saved: bool | None = None,
    choices=None,
    flag=False,
    multiple=False,
):
    """A field of ``Settings``. ``resume``: True (a resumed run must match the saved value) or a string
    saying why it is not compared. ``saved``: kept in the run's saved settings (default: when compared)."""
    saved = resume is True if saved is None else saved
    return field(
        default=default,
        metadata={
            "help": help,
            "low": low,
            "high": high,
            "low_open": low_open,
            "resume": resume,
            "saved": saved,
            "choices": choices,
            "flag": flag,
            "multiple": multiple,
        },
    )


@dataclass
class Settings:
    tokens: int | None = setting(
        None,
        "tokens to train on (default: one pass over the data)",
        low=1,
        resume="resolved into steps, which is compared",
    )
    steps: int | None = setting(
        None,
        "optimizer steps (instead of --tokens)",
        low=1,
        resume="may change when the steps done keep their learning rates (resume.py: a wsd run before its decay)",
        saved=True,
    )
    batch: int = setting(16, "global batch (sequences per step)", low=1)
    seq: int | None = setting(None, "sequence length (default min(context, 128))", low=1)
    lr: float | None = setting(
        None,
        f"peak learning rate (default by the run's tokens per parameter: {ladder_text()}; measured, "
        "bench/README section 15)",
        low=0,
        low_open=True,
    )
    min_lr_ratio: float = setting(0.1, "final lr / peak lr", low=0, high=1)
    schedule: str = setting(
        "wsd",
        "lr after the warm-up: wsd (warmup-stable-decay: the peak, then a decay (--decay-shape) to --min-lr-ratio "
        "over the last --decay-fraction of the steps; the default: bench/README section 9), cosine or constant",
        choices=("cosine", "wsd", "constant"),
    )
    decay_fraction: float = setting(0.2, "--schedule wsd: fraction of the steps in the final decay", low=0, high=1)
    decay_shape: str = setting(
        "sqrt",
        "--schedule wsd: the decay's shape: sqrt (1 - sqrt, Hägele et al. 2024: lr * (1 - (1 - r) * sqrt(p)) at "
        "the decay's share p; the default, for the evidence in bench/README section 9) or "
        "linear (the default before)",
        choices=("sqrt", "linear"),
    )
    warmup: int | None = setting(
        None, f"lr warm-up steps (default 5% of the steps, at least {WARMUP_MIN} or 10% of them if fewer)", low=0
    )
    weight_decay: float = setting(0.1, "AdamW weight decay (matrices only)", low=0)
    clip: float = setting(1.0, "gradient-norm clip", low=0, low_open=True)
    gate_warmup_tokens: int | None = setting(None, "grown models: gate ramp 0->1 (default 10% of the run)", low=0)
    eval_every: int | None = setting(
        None,
        f"steps between validations (default 5% of the run, at least {FLOORS['eval_every']})",
        low=1,
        resume="a cadence: decides when the run measures, not what it computes",
        saved=True,
    )
    eval_batches: int = setting(8, "validation batches", low=1)
    save_every: int | None = setting(
        None,
        f"steps between resumable checkpoints (default 10% of the run, at least {FLOORS['save_every']})",
        low=1,
        resume="only decides when checkpoints are written",
        saved=True,
    )
    metrics_every: int | None = setting(
        None,
        f"steps between condensation metrics (default 10% of the run, at least {FLOORS['metrics_every']})",
        low=1,
        resume="a cadence: decides when the run measures, not what it computes",
        saved=True,
    )
    seed: int = setting(0, "data order and initial RNG state", low=0, high=args.SEED_MAX)
    data_start: int | None = setting(
        None,
        "first batch of the data stream (default: where the input's lineage says its training stopped, "
        "so a grown checkpoint does not replay its source's batches; 0 restarts the stream)",
        low=0,
    )
    tokenizer: str | None = setting(
        None, "byte, or a tokenizer.json / folder holding one (default: the checkpoint's own; byte for 256 ids)"
    )
    text_key: str = setting("text", "the text field of .jsonl / .jsonl.gz records and the column of .parquet files")
    doc_sep: str = setting(
        "auto",
        "token after each document: auto (the tokenizer's end-of-text token if it has one; none for the byte "
        "tokenizer), none, or a token (one byte for the byte tokenizer)",
    )
    data_dtype: str = setting(
        "auto",
        ".bin token files' id type (auto: uint16 for vocabularies up to 65,536, else uint32)",
        choices=("auto", "uint16", "uint32"),
    )
    device: str = setting(
        "auto", "where to train", choices=("auto", "cpu", "cuda"), resume="the machine may change between invocations"
    )
    fsdp: bool = setting(
        False,
        "under torchrun: shard parameters, gradients and optimizer state (FSDP2); state saved sharded (DCP)",
        flag=True,
        resume="the saved state records its own format; a run may change its sharding and number of ranks",
    )
    grad_accum: int = setting(
        1,
        "split each process's share of the batch into this many micro-batches (same global batch)",
        low=1,
        resume="the same batch in smaller pieces: the update differs only in round-off",
    )
    activation_checkpointing: bool = setting(
        False,
        "recompute each block's activations in backward (less memory, more compute)",
        flag=True,
        resume="an execution detail",
    )
    compile: bool = setting(False, "torch.compile the model", flag=True, resume="an execution detail")
    deterministic: bool = setting(
        False,
        "deterministic kernels (CUDA runs then repeat and resume bitwise)",
        flag=True,
        resume="an execution detail",
    )
    grow_at: tuple[str, ...] = setting(
        (),
        "FRACTION:WIDTH or FRACTION:width=W,layers=L[,method=stack|interleave|middle|identity]: grow after "
        "that fraction of the steps, carrying the optimizer (repeatable)",
        multiple=True,
    )
    grow_recipe: str = setting("srio", "recipe for --grow-at growths (a shipped name or a YAML file)")
    grow_optimizer: str = setting(
        "carry",
        "AdamW state at a --grow-at growth: carry (moments grown with the model) or reset (fresh AdamW; "
        "the LR schedule continues either way)",
        choices=("carry", "reset"),
    )
    grow_lr: str = setting(
        "same",
        "hidden-matrix learning rate after a --grow-at growth: same, or mup (x first width / width, "
        "muP's rule for Adam; embedding, head, norms and biases keep --lr)",
        choices=("same", "mup"),
    )
    grow_schedule: str | None = setting(
        None,
        "LR schedule at a --grow-at growth: rewarm (warm up again and decay over the steps left), continue "
        "(one warm-up and one schedule over the whole run) or rewarm-width (re-warm at growths in width, "
        "continue through growths in depth alone); default continue under wsd when a growth is in "
        "depth alone, rewarm otherwise (measured: bench/README.md)",
        choices=("continue", "rewarm", "rewarm-width"),
    )
    grow_warmup: int | None = setting(
        None,
        "LR warm-up, in updates, after a growth that re-warms the schedule (--grow-schedule rewarm or "
        "rewarm-width); 0 keeps the LR at its peak and restarts only the decay's span (its length a "
        "--decay-fraction of the steps left); default --warmup",
        low=0,
    )
    new_lr_mult: float = setting(
        1.0,
        "step multiplier for the latest width growth's new parameters (new units' slices and new residual "
        "dims: growtool/training/newparams.py), with --grow-at or on a grown checkpoint not trained since; "
        "1 (the papers' one LR for all) measured better at 10 tokens/parameter, 2 at 0.5 (bench/README.md, issue 40)",
        low=0.0,
        low_open=True,
        high=100.0,
    )
    new_rewarm_steps: int | None = setting(
        0,
        "re-warm the new parameters only: their step ramps 0 -> --new-lr-mult over this many updates after "
        "the growth, and a --grow-at growth gives them fresh AdamW moments (0: off; the library's None: the "
        "gate ramp's updates, 10% of the run)",
        low=0,
    )
    grow_dropout: float = setting(
        0.0,
        "dropout on the dense MLP's units and the attention heads' outputs from a growth until its gate ramp "
        "ends (a symmetry breaker: twin units get different masks; each mask follows the seed and the step, "
        "so a resumed run is exact); 0: off (measured: bench/README.md, issue 40)",
        low=0.0,
        high=0.9,
    )
    stop_at: int | None = setting(
        None, "end this invocation after this step (resumable)", low=1, resume="each invocation may stop elsewhere"
    )
    no_pre_decay: bool = setting(
        False,
        "--schedule wsd: do not keep OUT/pre-decay (the resumable state where the decay begins: a run folder "
        "to extend with --resume --steps, or to grow with expand, under one LR schedule)",
        flag=True,
        resume="decides what is written, not what the run computes",
    )

    def check(self) -> None:
        """Every field of its type (``None`` only where that is the default), every number finite and
        in its range (one line naming the option, ``growtool.nn.args``); --tokens and --steps exclusive."""
        for f in fields(self):
            check_field(f, getattr(self, f.name))
        if self.tokens is not None and self.steps is not None:
            raise GrowError("give --tokens or --steps, not both")
        if self.grow_dropout and self.compile:
            raise GrowError("--grow-dropout: not with --compile (each update's masks would recompile the model)")
        parse_grow_at(self.grow_at)

    def resolve(
        self,
        n_train: int,
        context: int,
        gated: bool,
        tokenizer_key: str,
        identity: dict,
        family: str = "",
        params: int | None = None,
    ) -> dict:
        """The run's saved settings: defaults filled in from the data, the model (its ``family`` and
        ``params``, those of the model the run ends with: --lr) and the run length."""
        seq = self.seq or min(context, 128)
        per_step = self.batch * seq
        steps = self.steps or math.ceil((self.tokens if self.tokens is not None else n_train) / per_step)
        steps = max(1, int(steps))
        gate = None
        if gated:
            gate = (
                self.gate_warmup_tokens if self.gate_warmup_tokens is not None else default_gate_tokens(steps, per_step)
            )
        auto = {
            "lr": self.lr if self.lr is not None else default_lr(family, steps * per_step / params if params else None),
            "steps": steps,
            "seq": seq,
            "gate_warmup_tokens": gate,
            "tokenizer": tokenizer_key,
            "warmup": min(int(self.warmup if self.warmup is not None else default_warmup(steps)), steps),
            "eval_every": int(self.eval_every or default_every("eval_every", steps)),
            "metrics_every": int(self.metrics_every or default_every("metrics_every", steps)),
            "save_every": int(self.save_every or default_every("save_every", steps)),
            "grow_at": resolve_grow_at(self.grow_at, steps),
            "grow_schedule": self.grow_schedule or default_grow_schedule(self.schedule, self.grow_at),
            "new_rewarm_steps": (
                self.new_rewarm_steps
                if self.new_rewarm_steps is not None
                else math.ceil((gate or default_gate_tokens(steps, per_step)) / per_step)
            ),
        }
        saved = [f.name for f in fields(self) if f.metadata["saved"]]
        return {**{k: auto.get(k, getattr(self, k)) for k in saved}, **identity}


def default_every(name: str, steps: int) -> int:
    """The default of cadence ``name`` for a run of ``steps``: its share of the run, at least its floor,
    at most the run (validation and metrics also run at step 0 and at the end, a save at the end)."""
    return min(steps, max(FLOORS[name], round(SHARES[name] * steps)))


def check_field(f, v) -> None:
    """GrowError naming the option unless ``v`` is a valid value of field ``f`` (``growtool.nn.args``)."""
    name, m, kind = option(f.name), f.metadata, value_type(f.name)
    if v is None and f.default is None:
        return
    if m["multiple"]:
        args.texts(name, v)
    elif m["flag"]:
        args.flag(name, v)
    elif kind is int:
        args.integer(name, v, m["low"], m["high"])
    elif kind is float:
        args.real(name, v, m["low"], m["high"], m["low_open"])
    else:
        args.text(name, v, m["choices"])


def default_warmup(steps: int) -> int:
    """The LR warm-up when --warmup is not given: 5% of the run's steps, and at least WARMUP_MIN steps
    or 10% of the run if that is fewer (a 559-step GPT-2 base warmed up over 28 steps ended 0.03 and
    0.06 higher than over 64, its growth too: bench/results/budget_d64/WRITEUP.md, eighteenth session)."""
    return max(1, round(0.05 * steps), min(WARMUP_MIN, round(0.1 * steps)))


def default_gate_tokens(steps: int, per_step: int) -> int:
    """The gate ramp when --gate-warmup-tokens is not given: 10% of the run's tokens."""
    return max(1, round(0.1 * steps * per_step))


def default_grow_schedule(schedule: str, grow_at) -> str:
    """The LR at --grow-at growths when --grow-schedule is not given: continue (no re-warm) when the
    schedule is wsd and a growth is in depth alone (``layers=``, no ``width=``), rewarm otherwise.
    Measured (bench/results/budget_d64/WRITEUP.md): under wsd, stacking ended lower without the re-warm
    in 17 of 20 seed pairs (Llama and GPT-2 at 10 and 20 tokens / parameter; higher in 3 of 3 at 5), a
    width growth followed by stacking in 10 of 10 and a stacking followed by a width growth in 7 of 7
    (GPT-2; Llama 3 of 3; 10 tokens / parameter, twenty-seventh and twenty-ninth sessions); a width
    growth alone ended lower with it (5 of 7), and under cosine re-warming won 18 of 18 (bench/README.md,
    section 6)."""
    return schedule_for(schedule, [target_width(t) is None for _, t in parse_grow_at(grow_at)])


def schedule_for(schedule: str, depth_only: list[bool]) -> str:
    """The default rule itself, on one flag per growth in order (True: in depth alone)."""
    return "continue" if schedule == "wsd" and any(depth_only) else "rewarm"


def widened(growth: dict) -> bool:
    """Whether a growth record changed the width (records of depth alone keep it: ``from`` == ``width``)."""
    return growth["width"] != growth.get("from", growth["width"])


def grow_schedule_after(saved: dict, growths: list[dict]) -> str:
    """--grow-schedule for a run folder grown by ``expand RUN`` (``growths``: the run's growth records, the
    new one included). A value given on the command line is kept: one that differs from what the rule below
    made of the run's growths so far (a given value equal to the rule's reads as the rule, and ``train
    --resume --grow-schedule`` sets it). Otherwise ``next_grow_schedule`` of the rule's value."""
    schedule, planned = saved_setting(saved, "schedule"), saved_setting(saved, "grow_at")
    current = schedule_for(schedule, [target_width(t) is None for _, t in planned])  # what the run started with
    at = {st for st, _ in planned}
    for i, g in enumerate(growths[:-1]):  # and what each earlier ``expand RUN`` (not --grow-at's) made of it
        if g["step"] not in at:
            current = next_grow_schedule(schedule, current, growths[: i + 1])
    if saved_setting(saved, "grow_schedule") != current:
        return saved_setting(saved, "grow_schedule")
    return next_grow_schedule(schedule, current, growths)


def rewarms(mode: str, growth: dict) -> bool:
    """Whether ``--grow-schedule mode`` re-warms the LR at ``growth``."""
    return mode == "rewarm" or (mode == "rewarm-width" and widened(growth))


def next_grow_schedule(schedule: str, current: str, growths: list[dict]) -> str:
    """The schedule after the last of ``growths``, for a run whose updates so far ran under ``current``: the
    first of the measured preferences that gives every update done the LR it had (re-warms at the same
    earlier growths). Under wsd, once a growth in depth alone is among them: ``continue``, then
    ``rewarm-width``, then ``rewarm`` (one schedule ended lower than a re-warm at a stacking in 17 of 20
    seed pairs, at a width growth after a stacking in 7 of 7, and a stacking after a width growth that
    re-warmed ended lower without a second re-warm on 10 of 10 seeds at 10 tokens / parameter:
    bench/results/budget_d64/WRITEUP.md, thirteenth, twenty-eighth and twenty-ninth sessions); otherwise
    ``rewarm``, then ``rewarm-width`` (a width growth alone ended lower re-warmed, 5 of 7). None of them:
    ``current``."""
    depth = any("layers" in g and not widened(g) for g in growths)
    if schedule != "wsd":
        prefer = ["rewarm"]
    else:
        prefer = ["continue", "rewarm-width", "rewarm"] if depth else ["rewarm", "rewarm-width"]
    keeps = [m for m in prefer if all(rewarms(m, g) == rewarms(current, g) for g in growths[:-1])]
    return keeps[0] if keeps else current


# settings added after runs were already being saved: what a saved run without them meant
ABSENT = {
    "grow_at": [],
    "grow_recipe": "srio",
    "grow_optimizer": "carry",
    "grow_lr": "same",
    "grow_schedule": "continue",
    "schedule": "cosine",
    "decay_fraction": 0.2,
    "decay_shape": "linear",  # runs saved before --decay-shape decayed linearly
    "text_key": "text",
    "doc_sep": "none",  # runs before documents were separated
    "data_dtype": "auto",
    "val_sha256": [],
    "data_start": 0,
    "new_lr_mult": 1.0,
    "new_rewarm_steps": 0,
    "grow_warmup": None,  # runs before --grow-warmup re-warmed over --warmup
    "grow_dropout": 0.0,
}


def saved_setting(saved: dict, name: str):
    """A saved run's value of setting ``name`` (runs saved before the setting existed: ABSENT)."""
    return saved[name] if name in saved else ABSENT.get(name)


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def value_type(name: str) -> type:
    """int, float, str or bool: the field's annotation without its ``| None`` (resolved once: the
    annotations are strings, and resolving them all costs more than a short run's step)."""
    t = typing.get_type_hints(Settings)[name]
    return next(a for a in typing.get_args(t) if a is not type(None)) if typing.get_args(t) else t


def resume_keys() -> list[str]:
    """Saved settings a resumed run must share with the run it continues."""
    return [f.name for f in fields(Settings) if f.metadata["resume"] is True] + list(IDENTITY)


def defaults() -> dict:
    return {f.name: f.default for f in fields(Settings) if f.default is not MISSING}


# ---- growths scheduled inside a run (--grow-at) ----------------------------------------------


def parse_grow_at(items) -> list[tuple[float, int | dict]]:
    """``("0.25:96", "0.5:width=128,layers=4")`` -> [(0.25, 96), (0.5, {"width": 128, "layers": 4})];
    one clear line for bad input. A target is a width (FRACTION:WIDTH) or ``key=value`` pairs:
    ``width``, ``layers`` (depth growth, grow/depth.py) and ``method`` (its depth method)."""
    out = []
    for item in items or ():
        frac, sep, target = str(item).partition(":")
        try:
            f = float(frac)
            w = int(target) if "=" not in target else depth_target(target)
        except ValueError:
            raise GrowError(
                f"--grow-at {item!r}: expected FRACTION:WIDTH or FRACTION:width=W,layers=L[,method=M], e.g. 0.3:96"
            ) from None
        if not sep or not 0 < f < 1 or (isinstance(w, int) and w < 1):
            raise GrowError(f"--grow-at {item!r}: expected FRACTION:WIDTH with 0 < FRACTION < 1 and WIDTH >= 1")
        out.append((f, w))
    if [f for f, _ in out] != sorted({f for f, _ in out}):
        raise GrowError("--grow-at: fractions must be distinct and in increasing order")
    widths = [target_width(w) for _, w in out if target_width(w) is not None]
    if widths != sorted(set(widths)):
        raise GrowError("--grow-at: widths must increase from stage to stage")
    return out


def depth_target(text: str) -> dict:
    """``"width=96,layers=4,method=interleave"`` -> {"width": 96, "layers": 4, "method": "interleave"}."""
    from growtool.grow.depth import METHODS

    out = {}
    for pair in text.split(","):
        k, eq, v = pair.partition("=")
        k = k.strip()
        if not eq or k not in ("width", "layers", "method") or k in out:
            raise ValueError(pair)
        if k == "method":
            if v not in METHODS:
                raise GrowError(f"--grow-at: depth method {v!r} is not one of {', '.join(METHODS)}")
            out[k] = v
        else:
            out[k] = int(v)
            if out[k] < 1:
                raise ValueError(pair)
    if "method" in out and "layers" not in out:
        raise GrowError(f"--grow-at {text!r}: method= needs layers=")
    if "width" not in out and "layers" not in out:
        raise ValueError(text)
    return out


def target_width(w) -> int | None:
    return w if isinstance(w, int) else w.get("width")


def target_layers(w) -> int | None:
    return None if isinstance(w, int) else w.get("layers")


def resolve_grow_at(items, steps: int) -> list[list[int]]:
    """[[step, width], ...]: each fraction of the run rounded to a step in 1 .. steps - 1."""
    out = [[min(steps - 1, max(1, round(f * steps))), w] for f, w in parse_grow_at(items)]
    if len({s for s, _ in out}) != len(out):
        raise GrowError(f"--grow-at: two growths fall on the same step of a {steps}-step run")
    return out
