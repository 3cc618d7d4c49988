"""The bundled trainer: next-token prediction on text files, for plain and freshly grown checkpoints.

What holds:

* Optimiser: AdamW; weight decay on matrices (dim >= 2) only, never on norm gains, biases or the
  growth gates (the gates are not trained at all: the schedule sets them every step).
* Learning rate: linear warm-up over ``warmup`` steps, then ``schedule`` (schedule.py; default wsd:
  the peak, then a decay to ``lr * min_lr_ratio`` over the last ``decay_fraction``, 1 - sqrt by default).
  Gradients are clipped to norm ``clip``. Growths inside a run (``grow_at``, or a run folder grown
  by ``stages.expand_run``) carry the AdamW moments (``grow.moments``); ``grow_schedule`` says
  whether the LR re-warms there.
* Grown checkpoints (growth gates present, all at 0): before update ``s`` every gate is set to
  min(1, (s - s_g) * batch * seq / gate_warmup_tokens), a linear ramp 0 -> 1 from the step s_g of
  the run's last growth (0 for a grown checkpoint). Evaluation after ``s``
  updates uses the gate of step ``s``, so the first evaluation (step 0, gate 0) measures the
  source model's function. The final checkpoint has the gates folded away at the value they
  reached (1 unless the run was shorter than the ramp): a plain checkpoint.
* Batches depend on (seed, data_start + step) only (``data_start``: where the input's lineage says
  its training stopped, data.py), the model has no dropout, and the state file holds the
  optimiser, RNG and step: ``resume=True`` continues a run so that its metrics equal an
  uninterrupted run's (bitwise on CPU).
* Files in ``out/`` (rank 0 only, every one written atomically): ``last.safetensors`` (the model,
  unfolded) + ``last.pt`` (optimiser, RNG, step, settings) every ``save_every`` steps;
  ``metrics.jsonl`` (one JSON object per step: step, tokens, loss, lr, gate, grad_norm, tok_s,
  stage, width, layers, flops (cumulative; stages.annotate);
  val_loss every ``eval_every`` steps and at step 0; condensation metrics every ``metrics_every``;
  for a grown model ``growth``: copies' cosine to their sources, new/old gradient ratio and gates
  per block, at step 0, every ``metrics_every`` and while the gates ramp (diagnostics.py));
  at the end ``final.safetensors`` (plain) and ``loss.png``. Token caches go to ``out/cache``.
* Distributed: under torchrun (WORLD_SIZE > 1) each rank computes its slice of the same global
  batch of ``batch`` sequences; DistributedDataParallel averages the gradients (gloo on CPU, NCCL
  on CUDA). Evaluation runs on every rank on the same batches. With ``fsdp`` the model is sharded
  with FSDP2 instead and the resumable state goes, sharded, into ``last-<step>.dcp`` (growtool.fsdp),
  loadable on any number of ranks; ``grad_accum`` splits each rank's slice into micro-batches.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.distributed as dist

from growtool.grow import moments
from growtool.grow.fold import fold_config, fold_tensor
from growtool.grow.plan import gate_values
from growtool.io import checkpoint, confine
from growtool.io.carried import CARRIED
from growtool.metrics import matrix_metrics
from growtool.nn import args
from growtool.nn.errors import GrowError
from growtool.nn.families import expected_shapes
from growtool.nn.model import LM
from growtool.tokenizer import Carry, Tokenizer, tokenizer_for, write_files
from growtool.training import data, dcp_safe, diagnostics, fsdp, newparams, run_folder, stages
from growtool.training import resume as resuming
from growtool.training.optim import make_optimizer
from growtool.training.progress import Progress
from growtool.training.readers import expand_inputs
from growtool.training.run_folder import (
    FINAL,
    MODEL,
    PRE_DECAY,
    STATE,
    append_metrics,
    plot,
    read_metrics,
    save_bytes,
    write_metrics,
)
from growtool.training.schedule import decay_start, dropout_at, lr_at, lr_start, mup, run_gate, width_lr_scale
from growtool.training.settings import Settings, saved_setting

# ---- pieces -----------------------------------------------------------------------------------


def pick_device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise GrowError("--device cuda: no CUDA device is available")
        return torch.device("cuda", local_rank)
    if device != "cpu":
        raise GrowError(f"--device must be auto, cpu or cuda, got {device!r}")
    return torch.device("cpu")


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


@torch.no_grad()
def evaluate(model: LM, batches, device: torch.device) -> float:
    """Mean next-token cross-entropy (nats) over every position of ``batches``."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        with autocast(device):
            _, loss = model(x.to(device), y.to(device))
        total += float(loss) * y.numel()
        count += y.numel()
    model.train(was)
    return total / count


def cpu_tensors(model: LM) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in float32 on CPU. FSDP-sharded: every rank must call; rank 0 gets them."""
    if fsdp.is_sharded(model):
        return fsdp.full_tensors(model)
    return {n: t.detach().float().cpu().clone() for n, t in model.tensors().items()}


def matrix_record(run: Run) -> dict:
    """Condensation metrics of the model's matrices, computed where the weights live (no copy to the
    CPU). FSDP: every rank must call (the full tensors are gathered to rank 0); DDP: the lead rank
    alone computes them. Other ranks get {}."""
    tensors = fsdp.full_tensors(run.model) if fsdp.is_sharded(run.model) else run.model.tensors() if run.lead else {}
    return matrix_metrics(run.model.cfg, tensors.__getitem__, tensors)


def folded(model: LM, gate: float, tensors: dict | None = None) -> tuple:
    """(plain config, tensors) of a gated model with its gates baked in at ``gate``."""
    cfg, t = model.cfg, cpu_tensors(model) if tensors is None else tensors
    if not cfg.gated:
        return cfg, t
    plain = fold_config(cfg)
    return plain, {n: fold_tensor(n, cfg, gate, t.__getitem__, torch.float32) for n in expected_shapes(plain)}


# ---- the run: check and load, restore, loop, finish ------------------------------------------


@dataclass
class Run:
    """What the parts of one training invocation share."""

    out: Path
    opts: Settings  # as given
    s: dict  # resolved and saved settings (Settings.resolve)
    ck: checkpoint.Checkpoint
    ds: data.Dataset
    dev: torch.device
    world: int
    rank: int
    lineage: list = field(default_factory=list)
    model: LM | None = None
    opt: torch.optim.AdamW | None = None
    start: int = 0
    val: list = field(default_factory=list)  # validation batches
    records: list = field(default_factory=list)
    tok: Tokenizer | None = None
    growths: list = field(default_factory=list)  # growths during this run: step, width, recipe (stages.py)
    diag: tuple | None = None  # (key, diagnostics.Tracker or None) for the model now (diagnostics.py)
    inputs: dict = field(default_factory=dict)  # --data / --val-data as given (named by resume's refusals)
    history: list = field(default_factory=list)  # settings changed on resume: [{step, changed}] (resume.py)

    @property
    def lead(self) -> bool:
        return self.rank == 0

    @property
    def tokenizer_record(self) -> dict | None:
        """What the run's checkpoints record as their tokenizer (growtool.tokenizer)."""
        return self.tok.files.record() if self.tok is not None and self.tok.files else self.ck.tokenizer


def run_inputs(ckpt, data_specs, files, val_specs, val_files, tokenizer) -> list[str]:
    """Everything a run reads: the checkpoint, the data and validation data (as given, so a whole
    folder counts, and as expanded), and a tokenizer path (the run folder's overlap check)."""
    out = [str(ckpt), *map(str, data_specs or []), *map(str, files), *map(str, val_specs or []), *map(str, val_files)]
    return out + ([str(tokenizer)] if tokenizer not in (None, "byte") else [])


def _check_shape(opts: Settings, cfg, world: int) -> int:
    """The sequence length; refused where it exceeds the context, or where the processes or the
    accumulation steps do not divide the batch."""
    seq = opts.seq or min(cfg.context, 128)
    if seq > cfg.context:
        raise GrowError(f"--seq {seq} exceeds the model's context {cfg.context}")
    if opts.batch % world:
        raise GrowError(f"--batch {opts.batch} is not divisible by the {world} processes (each takes an equal slice)")
    if (opts.batch // world) % opts.grad_accum:
        raise GrowError(
            f"--grad-accum {opts.grad_accum} does not divide each process's {opts.batch // world} sequences"
        )
    return seq


def prepare(ckpt, data_files, out: Path, opts: Settings, resume: bool, cache_dir, val_data=None, progress=False) -> Run:
    """Check everything before writing anything; load the data; resolve the settings."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    files = expand_inputs(data_files)
    val_files = expand_inputs(val_data, "--val-data") if val_data else []
    dev = pick_device(opts.device, local_rank)
    ck = checkpoint.load(ckpt)
    confine.check_run_folder(out, run_inputs(ckpt, data_files, files, val_data, val_files, opts.tokenizer))
    if cache_dir is None:
        confine.real_dir(out / "cache", "the run's token cache")  # not a link out of the run folder
    cfg = ck.config
    tok = tokenizer_for(ck, opts.tokenizer)  # the checkpoint's own unless given; refuses a vocabulary mismatch
    seq = _check_shape(opts, cfg, world)
    if cfg.gated and any(v != 0.0 for v in gate_values(ck)):
        raise GrowError(
            f"{ckpt}: its growth gates are already open ({max(gate_values(ck)):g}); "
            "fold it first (growtool fold) or resume the run that wrote it"
        )
    if out.exists() and not out.is_dir():
        raise GrowError(f"{out}: exists and is not a folder")
    if rank == 0:
        run_folder.recover(out, STATE)  # a save cut between its two renames is finished
    has_run = (out / STATE).exists()  # metrics without a saved state: the first save never completed
    if has_run and not resume:
        raise GrowError(f"{out}: already holds a training run (pass --resume to continue it, or another --out)")
    # a folder of the user's (a model, notes): what a run writes beside its final checkpoint would replace theirs
    theirs = [n for n in (FINAL, "README.md", "loss.png", *CARRIED) if not has_run and (out / n).exists()]
    if theirs:
        raise GrowError(f"{out}: holds {theirs[0]} and no training run; train would overwrite it (give a new --out)")
    if resume and not (out / STATE).exists():
        raise GrowError(f"{out}: nothing to resume (no {STATE})")
    if not out.parent.is_dir():
        raise GrowError(f"{out}: parent folder {out.parent} does not exist")
    stages.precheck(opts.grow_at, opts.grow_recipe, cfg, opts.fsdp, dev)
    cache_dir = out / "cache" if cache_dir is None else cache_dir
    cache_existed = Path(cache_dir).exists()
    try:  # bad data, or a schedule refused once the data is counted, leaves no new cache behind
        inputs = data.Inputs(files, val_files, tok, cache_dir)
        ds, identity = data.corpus_dataset(inputs, cfg.vocab_size, seq, opts, rank, progress)
        identity["source_sha256"] = ck.sha256()
        gated = (
            cfg.gated
            or bool(opts.grow_at)
            or (resume and (out / MODEL).exists() and checkpoint.load(confine.run_file(out / MODEL)).config.gated)
        )
        params = stages.run_params(opts.grow_at, cfg)  # the model the run ends with: --lr's default
        s = opts.resolve(ds.n_train, cfg.context, gated, tok.key, identity, cfg.family, params)
        s["data_start"] = data.stream_start(ck.lineage) if opts.data_start is None else opts.data_start  # data.py
        stages.check_schedule(s, cfg.width)
    except GrowError:
        if rank == 0 and not cache_existed:  # (a run folder this run made goes whole: run_folder.held)
            shutil.rmtree(cache_dir, ignore_errors=True)
        raise
    return Run(out, opts, s, ck, ds, dev, world, rank, lineage=ck.lineage, tok=tok)


def restore(run: Run, resume: bool) -> None:
    """The model and optimiser: fresh from the checkpoint, or as the resumed run saved them."""
    model, state = run.ck.model(), None
    if resume:
        state = run_folder.load_state(run.out / STATE)  # weights_only, checked: a damaged one is one line
        saved = state["settings"]
        growths = list(state.get("growths", []))
        grown = bool(growths) and growths[-1]["step"] == state["step"]  # expand RUN, not yet trained
        free = resuming.GROWTH_SCHEDULE if grown else ()
        run.s, changes = resuming.merge(saved, run.s, run.opts, state.get("inputs"), free)  # resume.py: what may change
        resuming.check_grow_schedule(saved, run.s, state["step"], lambda s, t: lr_start(s, growths, t))
        resuming.check_length(saved, run.s, state["step"], lambda s, t: lr_start(s, growths, t))
        run.history = list(state.get("history", []))
        if changes:  # recorded in last.pt from the next save on
            run.history.append({"step": state["step"], "changed": changes})
        last = checkpoint.load(confine.run_file(run.out / MODEL))
        if not last.lineage or last.lineage[-1].get("step") != state["step"]:
            raise GrowError(f"{run.out}: {MODEL} and {STATE} are from different steps (cannot resume exactly)")
        model = last.model()
        run.lineage = last.lineage[:-1]
        run.start = state["step"]
        run.growths = list(state.get("growths", []))
    for n, p in model.named_parameters():
        if n.endswith("growth_gate"):
            p.requires_grad_(False)
    model.train()
    if state is not None and not state.get("sharded"):  # moments of the model's shapes, before any is used
        shapes = {n: model.get_parameter(n).shape for n in moments.param_order(model, mup(run.s))}
        moments.check_moments(state["optimizer"], shapes, str(run.out / STATE))
    fsdp.place(model, run.dev, run.world, run.opts.fsdp, run.opts.activation_checkpointing)  # on the device, or sharded
    run.model, run.opt = model, make_optimizer(model, run.s)
    if state is not None and state.get("sharded"):
        folder = dcp_safe.state_folder(run.out, state["sharded"])  # confined to the run folder
        fsdp.load_state(model, run.opt, folder, state.get("sharded_sha256"))
    elif state is not None and fsdp.is_sharded(model):
        raise GrowError(f"{run.out}: the saved state is not sharded (a run without --fsdp); resume it without --fsdp")
    elif state is not None:
        with run_folder.restoring(run.out / STATE):
            run.opt.load_state_dict(state["optimizer"])
    if state is not None:
        with run_folder.restoring(run.out / STATE):
            torch.set_rng_state(state["rng"]["torch"])
            if run.dev.type == "cuda" and state["rng"].get("cuda") is not None:
                torch.cuda.set_rng_state(state["rng"]["cuda"], run.dev)
    else:
        torch.manual_seed(run.s["seed"])


def start_group(run: Run) -> bool:
    """Join torchrun's process group (several processes, not yet joined); True when this call did."""
    if run.world == 1 or dist.is_initialized():
        return False
    if run.dev.type == "cuda":
        torch.cuda.set_device(run.dev)
    dist.init_process_group("nccl" if run.dev.type == "cuda" else "gloo")
    return True


def parallel(run: Run) -> tuple[torch.nn.Module, bool]:
    """(the module to call: DDP and / or compiled around the model, whether we started the process group).
    An FSDP-sharded model is called as it is (fully_shard wrapped it in place)."""
    own_group = start_group(run)
    module = run.model
    if run.world > 1 and not fsdp.is_sharded(run.model):
        ids = [run.dev.index] if run.dev.type == "cuda" else None
        module = torch.nn.parallel.DistributedDataParallel(run.model, device_ids=ids)
    if run.opts.compile:
        module = torch.compile(module)
    return module, own_group


def save_state(run: Run, step: int, out: Path | None = None) -> None:
    """The resumable pair (rank 0) in ``out`` (default: the run folder): the unfolded model, and the
    optimiser, RNG, step and settings. With --fsdp the model and optimiser also go, sharded, into
    ``last-<step>.dcp`` (every rank writes its shards; ``last.pt`` names the folder instead of holding
    the optimiser)."""
    out = out or run.out
    sharded = run.opts.fsdp
    tensors = cpu_tensors(run.model) if sharded else None  # a collective gather when sharded
    folder = fsdp.save_state(run.model, run.opt, out, step) if sharded else None
    if not run.lead:
        return
    s, B, T, dev = run.s, run.s["batch"], run.s["seq"], run.dev
    entry = {
        "op": "train",
        "step": step,
        "steps": s["steps"],
        "tokens": step * B * T,
        "complete": False,
        "seed": s["seed"],
        "data_end": data.stream_position(s, step),
        "data_sha256": s["data_sha256"],
        "tokenizer": s["tokenizer"],
    }
    tensors = tensors if sharded else cpu_tensors(run.model)
    rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None}
    optim = {"sharded": folder, "sharded_sha256": dcp_safe.metadata_sha256(out / folder)} if sharded else {}
    optim = optim or {"optimizer": run.opt.state_dict()}
    state = {"step": step, "data_step": step, "settings": s, **optim, "rng": rng, "growths": run.growths}
    state.update(inputs=run.inputs, history=run.history)
    run_folder.commit_pair(  # both written, then both renamed: a failed write leaves the old pair, resumable
        out,
        MODEL,
        STATE,
        lambda p: checkpoint.save_tensors(
            str(p), run.model.cfg, run.lineage + [entry], tensors, force=True, tokenizer=run.tokenizer_record
        ),
        lambda p: save_bytes(p, state),
    )
    fsdp.drop_old_states(out, folder)


def keep_pre_decay(run: Run, step: int) -> None:
    """With ``step`` updates done, where a wsd run's decay begins (every update so far at the peak
    learning rate, or in the warm-up): its resumable state, with the metrics so far, as the run
    folder ``OUT/pre-decay``, written beside and renamed into place (a resumed run that passes the
    point again replaces it). ``train --resume --steps M`` on a copy extends the run exactly (the
    decay moves to the new end, resume.py); ``expand OUT/pre-decay`` grows it into a new run folder
    that ``train --resume`` continues under one LR schedule, as ``--grow-at`` does at that step.
    A run without a decay, with --grow-at (its length is fixed) or with --no-pre-decay keeps none."""
    s = run.s
    if run.opts.no_pre_decay or saved_setting(s, "grow_at") or step >= s["steps"]:
        return
    if step != decay_start(s, lr_start(s, run.growths, step)):
        return

    def write(tmp: Path) -> None:
        save_state(run, step, tmp)
        if run.lead:
            write_metrics(tmp / "metrics.jsonl", [r for r in run.records if r["step"] <= step])

    sync = dist.barrier if dist.is_initialized() else (lambda: None)
    run_folder.write_folder(run.out / PRE_DECAY, write, run.lead, sync)


def one_step(run: Run, module, params, step: int) -> dict:
    """Update ``step`` (0-based); returns its metrics record (validation and matrices when due)."""
    s, model, dev = run.s, run.model, run.dev
    t0 = time.time()
    g, lr_now = run_gate(run, step), lr_at(step, s, lr_start(s, run.growths, step))
    if g is not None:
        model.set_gates(g)
    key = ((s["seed"] * 1_000_003 + step) * run.world + run.rank) % 2**48  # the masks of this update, on this rank
    model.set_dropout(dropout_at(step, s, run.growths), key)
    scale = width_lr_scale(model.cfg, run.growths)
    for group in run.opt.param_groups:
        group["lr"] = lr_now * (scale if group.get("width_scaled") else 1.0)
    x, y = run.ds.train_batch(data.stream_position(s, step), s["seed"], run.rank, run.world)
    diagnostics.before_forward(run, step)  # the new units' output share, when the diagnostics are due
    loss = fsdp.forward_backward(module, x.to(dev), y.to(dev), run.opts.grad_accum, lambda: autocast(dev))
    grads = diagnostics.before_update(run, step)  # new/old gradient ratios, when the diagnostics are due
    gnorm = float(torch.nn.utils.clip_grad_norm_(params, s["clip"]))
    kept = newparams.before_step(run, step)  # the new parameters' own step size (newparams.py)
    run.opt.step()
    newparams.after_step(kept)
    run.opt.zero_grad(set_to_none=True)
    if run.world > 1:
        dist.all_reduce(loss)
        loss /= run.world
    step += 1
    BT = s["batch"] * s["seq"]
    rec = {
        "step": step,
        "tokens": step * BT,
        "loss": float(loss),
        "lr": lr_now,
        "gate": g,
        "grad_norm": gnorm,
        "tok_s": BT / max(time.time() - t0, 1e-9),
    }
    if not math.isfinite(rec["loss"]):
        raise GrowError(f"training diverged: loss is {rec['loss']} at step {step} (lower --lr?)")
    if step % s["eval_every"] == 0 or step == s["steps"]:
        g_eval = run_gate(run, step)
        if g_eval is not None:
            model.set_gates(g_eval)
        rec["val_loss"] = evaluate(model, run.val, dev)
    if step % s["metrics_every"] == 0 or step == s["steps"]:
        rec["matrix"] = matrix_record(run)
    if grads is not None:
        rec["growth"] = diagnostics.after_update(run, step, grads)
    return rec


def loop(run: Run, module, progress: bool) -> int:
    """Train from ``run.start`` to the end (or --stop-at), logging every step; returns the last step."""
    s, metrics_path = run.s, run.out / "metrics.jsonl"
    if run.lead:
        run.out.mkdir(exist_ok=True)
        if run.start:  # resumed: drop steps logged after the saved state
            run.records = [r for r in read_metrics(metrics_path) if r["step"] <= run.start]
        write_metrics(metrics_path, run.records)  # a fresh start: none (what a failed first run logged goes)
    run.val = run.ds.val_batches(s["eval_batches"])
    fh = append_metrics(metrics_path) if run.lead else None

    def log(rec):
        run.records.append(rec)
        if fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()

    if run.start == 0:
        g = run_gate(run, 0)
        run.model.set_gates(g or 0.0)
        rec0 = {
            "step": 0,
            "tokens": 0,
            "gate": g,
            "val_loss": evaluate(run.model, run.val, run.dev),
            "matrix": matrix_record(run),
        }
        if (diag := diagnostics.at_start(run)) is not None:
            rec0["growth"] = diag
        log(stages.annotate(run, rec0, None))
    bar = Progress(progress and run.lead, s["steps"], run.start)
    step, stop_at = run.start, run.opts.stop_at
    end = s["steps"] if stop_at is None else min(s["steps"], max(run.start, int(stop_at)))
    params = [p for p in run.model.parameters() if p.requires_grad]
    try:
        while step < end:
            width = stages.due(run, step)
            if width is not None:  # a scheduled growth before this update (stages.py)
                stages.grow_run(run, step, width)
                module, _ = parallel(run)
                params = [p for p in run.model.parameters() if p.requires_grad]
            rec = one_step(run, module, params, step)
            step = rec["step"]
            log(stages.annotate(run, rec, run.records[-1] if run.records else None))
            bar.update(step, rec)
            if step % s["save_every"] == 0 or step == end:
                save_state(run, step)
            keep_pre_decay(run, step)
    finally:
        bar.close()
        if fh:
            fh.close()
    return step


def finish(run: Run, step: int, seconds: float) -> dict:
    """The summary; after the last step (rank 0) the plain final checkpoint, gates folded, and the plot."""
    s, B, T, records = run.s, run.s["batch"], run.s["seq"], run.records
    summary = {
        "out": str(run.out),
        "steps": step,
        "total_steps": s["steps"],
        "tokens": step * B * T,
        "first_val_loss": next((r["val_loss"] for r in records if "val_loss" in r), None),
        "val_loss": next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None),
        "params": run.model.cfg.n_params(),
        "seconds": seconds,
        "final": None,
        "metrics": str(run.out / "metrics.jsonl"),
        "gate": run_gate(run, step),
        "settings": s,
        "history": run.history,
        "pre_decay": str(run.out / PRE_DECAY) if (run.out / PRE_DECAY / STATE).is_file() else None,
    }
    last = step == s["steps"]
    full = cpu_tensors(run.model) if last and (run.lead or fsdp.is_sharded(run.model)) else None  # FSDP: collective
    if step == s["steps"] and run.lead:
        gate = run_gate(run, step)
        cfg_f, tensors = folded(run.model, gate if gate is not None else 1.0, full)
        entry = {
            "op": "train",
            "steps": step,
            "tokens": step * B * T,
            "batch": B,
            "seq": T,
            "lr": s["lr"],
            "seed": s["seed"],
            "data_end": data.stream_position(s, step),
            "tokenizer": s["tokenizer"],
            "data_sha256": s["data_sha256"],
            "source_sha256": s["source_sha256"],
            "val_loss": summary["val_loss"],
            "gates_folded_at": gate,
            "world_size": run.world,
        }
        summary["final"] = checkpoint.save_tensors(
            str(run.out / FINAL), cfg_f, run.lineage + [entry], tensors, force=True, tokenizer=run.tokenizer_record
        )
        carried = Carry(run.tok.files, run.tokenizer_record, None)
        write_files(run.out, carried.files(cfg_f, run.lineage + [entry], run.ck.source, FINAL))  # beside final
        summary["params"] = cfg_f.n_params()
        title = f"{cfg_f.family}, width {cfg_f.width}, {cfg_f.layers} layers: {step} steps, {step * B * T:,} tokens"
        plot(records, run.out / "loss.png", title)
        summary["plot"] = str(run.out / "loss.png")
    return summary


def train(ckpt, data_files, out, *, resume=False, progress=True, cache_dir=None, val_data=None, **settings) -> dict:
    """Train checkpoint ``ckpt`` on ``data_files`` (files, folders, globs: growtool.training.corpus),
    validating on ``val_data`` if given, writing into folder ``out``.

    ``settings`` are the fields of ``settings.Settings`` (the ``growtool train`` options):
    ``steps`` (or ``tokens``, default: one pass over the training split) sets the run length;
    ``stop_at`` ends this invocation after that many updates with a resumable checkpoint.
    ``deterministic`` turns on torch's deterministic algorithms: needed on CUDA for runs (and
    resumed runs) to repeat bitwise; CPU runs repeat without it.
    Returns a summary dict (paths, steps, tokens, first / last val loss, final gate, seconds).
    """
    t_start = time.time()
    unknown = sorted(set(settings) - {f.name for f in fields(Settings)})
    if unknown:
        raise GrowError(f"train() got an unknown setting {unknown[0]!r} (the fields of Settings)")
    opts = Settings(**settings)
    opts.check()
    args.path("ckpt", ckpt)
    out = args.path("out", out)
    data_files = args.paths("data_files", data_files)
    val_data = args.paths("val_data", val_data) if val_data else val_data
    args.path("cache_dir", cache_dir, optional=True)
    args.flag("resume", resume)
    with run_folder.held(Path(out), int(os.environ.get("RANK", "0")) == 0, STATE):  # locked; a failed new one removed
        run = prepare(ckpt, data_files, Path(out), opts, resume, cache_dir, val_data, progress)
        run.inputs = {"data": list(map(str, data_files)), "val_data": list(map(str, val_data or []))}
        own_group = start_group(run)  # before restore: --fsdp shards the model before the optimiser is built
        restore(run, resume)
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        if opts.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
            torch.use_deterministic_algorithms(True)
        try:
            module, _ = parallel(run)
            step = loop(run, module, progress)
        finally:
            torch.use_deterministic_algorithms(was_deterministic)
        summary = finish(run, step, time.time() - t_start)
    if own_group:
        dist.barrier()
        dist.destroy_process_group()
    return summary


__all__ = ["train", "evaluate"]
