"""The bundled trainer: next-token prediction on text files, for plain and freshly grown checkpoints.

What holds:

* Optimiser: AdamW; weight decay on matrices (dim >= 2) only, never on norm gains, biases or the
  growth gates (the gates are not trained at all: the schedule sets them every step).
* Learning rate: linear warm-up over ``warmup`` steps (every run re-warms, grown or not), then
  cosine decay to ``lr * min_lr_ratio`` at the last step. Gradients are clipped to norm ``clip``.
* Grown checkpoints (growth gates present, all at 0): before update ``s`` every gate is set to
  min(1, s * batch * seq / gate_warmup_tokens), a linear ramp 0 -> 1. Evaluation after ``s``
  updates uses the gate of step ``s``, so the first evaluation (step 0, gate 0) measures the
  source model's function. The final checkpoint has the gates folded away at the value they
  reached (1 unless the run was shorter than the ramp): a plain checkpoint.
* Batches depend on (seed, step) only, the model has no dropout, and the state file holds the
  optimiser, RNG and step: ``resume=True`` continues a run so that its metrics equal an
  uninterrupted run's (bitwise on CPU).
* Files in ``out/`` (rank 0 only, every one written atomically): ``last.safetensors`` (the model,
  unfolded) + ``last.pt`` (optimiser, RNG, step, settings) every ``save_every`` steps;
  ``metrics.jsonl`` (one JSON object per step: step, tokens, loss, lr, gate, grad_norm, tok_s;
  val_loss every ``eval_every`` steps and at step 0; condensation metrics every ``metrics_every``);
  at the end ``final.safetensors`` (plain) and ``loss.png``. Token caches go to ``out/cache``.
* Distributed: under torchrun (WORLD_SIZE > 1) each rank computes its slice of the same global
  batch of ``batch`` sequences; DistributedDataParallel averages the gradients (gloo on CPU, NCCL
  on CUDA). Evaluation runs on every rank on the same batches.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, data, growth
from .checkpoint import atomic_file
from .errors import GrowError
from .families import expected_shapes
from .metrics import matrix_metrics
from .model import LM
from .tokenizer import Carry, write_files

STATE, MODEL, FINAL = "last.pt", "last.safetensors", "final.safetensors"
# settings a resumed run must share with the run it continues
RESUME_KEYS = ("steps", "batch", "seq", "lr", "min_lr_ratio", "warmup", "weight_decay", "clip",
               "gate_warmup_tokens", "eval_every", "eval_batches", "metrics_every", "seed", "tokenizer",
               "data_sha256", "source_sha256")


# ---- schedules --------------------------------------------------------------------------------

def lr_at(step: int, s: dict) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up, then cosine to lr * min_lr_ratio."""
    lr, warm, n = s["lr"], s["warmup"], s["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    p = (step - warm) / max(1, n - warm)
    return lr * (s["min_lr_ratio"] + (1 - s["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * p)))


def gate_at(step: int, s: dict) -> float | None:
    """Growth-gate value in force after ``step`` updates (None for a plain model)."""
    g = s["gate_warmup_tokens"]
    if g is None:
        return None
    return 1.0 if g <= 0 else min(1.0, step * s["batch"] * s["seq"] / g)


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


def make_optimizer(model: LM, s: dict) -> torch.optim.AdamW:
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if p.dim() >= 2]
    rest = [p for n, p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                              {"params": rest, "weight_decay": 0.0}], lr=s["lr"], betas=(0.9, 0.95))


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
    return {n: t.detach().float().cpu().clone() for n, t in model.tensors().items()}


def folded(model: LM, gate: float) -> tuple:
    """(plain config, tensors) of a gated model with its gates baked in at ``gate``."""
    cfg, t = model.cfg, cpu_tensors(model)
    if not cfg.gated:
        return cfg, t
    plain = growth.fold_config(cfg)
    return plain, {n: growth.fold_tensor(n, cfg, gate, t.__getitem__, torch.float32) for n in expected_shapes(plain)}


def save_bytes(path: Path, obj) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_file(path, lambda fh: fh.write(buf.getvalue()))


def write_metrics(path: Path, records: list[dict]) -> None:
    atomic_file(path, lambda fh: fh.write("".join(json.dumps(r) + "\n" for r in records).encode()))


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(records: list[dict], path: Path, title: str) -> None:
    """Training and validation loss against tokens (gate on a second axis when there is one)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    tr = [r for r in records if "loss" in r]
    va = [r for r in records if "val_loss" in r]
    ax.plot([r["tokens"] for r in tr], [r["loss"] for r in tr], lw=0.8, alpha=0.6, label="train loss")
    ax.plot([r["tokens"] for r in va], [r["val_loss"] for r in va], "o-", ms=3, label="val loss")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right")
    if any(r.get("gate") is not None for r in tr):
        ax2 = ax.twinx()
        before = [r["tokens"] * (r["step"] - 1) / r["step"] for r in tr]  # a step's gate applies from its start
        ax2.plot(before, [r["gate"] for r in tr], color="grey", lw=0.8, ls="--")
        ax2.set_ylabel("growth gate", color="grey")
        ax2.set_ylim(-0.05, 1.05)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_file(path, lambda fh: fh.write(buf.getvalue()))


class Progress:
    """A rich progress bar on stderr (tokens/s, loss, lr, gate); silent when disabled."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as P, TextColumn, TimeRemainingColumn
        self.bar = P(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                     TimeRemainingColumn(), console=Console(stderr=True))
        self.task = self.bar.add_task("train", total=total, completed=done, info="")
        self.bar.start()

    def update(self, step: int, rec: dict) -> None:
        if self.bar is None:
            return
        info = f"{rec['tok_s']:,.0f} tok/s  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}"
        if rec.get("gate") is not None:
            info += f"  gate {rec['gate']:.2f}"
        if "val_loss" in rec:
            self.last_val = rec["val_loss"]
        if getattr(self, "last_val", None) is not None:
            info += f"  val {self.last_val:.4f}"
        self.bar.update(self.task, completed=step, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ---- the run ----------------------------------------------------------------------------------

def settings(cfg, ds: data.Dataset, tok, shas, src_sha, *, tokens, steps, batch, seq, lr, min_lr_ratio,
             warmup, weight_decay, clip, gate_warmup_tokens, eval_every, eval_batches, metrics_every,
             save_every, seed) -> dict:
    """The run's resolved hyperparameters (defaults filled in)."""
    per_step = batch * seq
    if steps is None:
        steps = math.ceil((tokens if tokens is not None else ds.n_train) / per_step)
    steps = max(1, int(steps))
    if warmup is None:
        warmup = max(1, round(0.05 * steps))
    if cfg.gated:
        if gate_warmup_tokens is None:
            gate_warmup_tokens = max(1, round(0.1 * steps * per_step))
    else:
        gate_warmup_tokens = None
    return {
        "steps": steps, "batch": batch, "seq": seq, "lr": lr, "min_lr_ratio": min_lr_ratio,
        "warmup": min(int(warmup), steps), "weight_decay": weight_decay, "clip": clip,
        "gate_warmup_tokens": gate_warmup_tokens,
        "eval_every": int(eval_every or max(1, round(steps / 20))), "eval_batches": eval_batches,
        "metrics_every": int(metrics_every or max(1, round(steps / 10))),
        "save_every": int(save_every or max(1, round(steps / 10))),
        "seed": seed, "tokenizer": tok.key, "data_sha256": shas, "source_sha256": src_sha,
    }


def check_args(batch, seq, lr, min_lr_ratio, clip, eval_batches, tokens, steps, world, cfg, optional) -> None:
    if tokens is not None and steps is not None:
        raise GrowError("give --tokens or --steps, not both")
    for name, v in (("--batch", batch), ("--seq", seq), ("--eval-batches", eval_batches)):
        if not isinstance(v, int) or v < 1:
            raise GrowError(f"{name} must be a positive integer, got {v!r}")
    for name, v in (("--tokens", tokens), ("--steps", steps), *optional.items()):
        low = 0 if name in ("--warmup", "--gate-warmup-tokens") else 1
        if v is not None and v < low:
            raise GrowError(f"{name} must be {'at least 0' if low == 0 else 'positive'}, got {v}")
    if seq > cfg.context:
        raise GrowError(f"--seq {seq} exceeds the model's context {cfg.context}")
    for name, ok in (("--lr must be positive", lr > 0), ("--clip must be positive", clip > 0),
                     ("--min-lr-ratio must lie in [0, 1]", 0 <= min_lr_ratio <= 1)):
        if not ok:
            raise GrowError(name)
    if batch % world:
        raise GrowError(f"--batch {batch} is not divisible by the {world} processes (each takes an equal slice)")


def train(ckpt, data_files, out, *, tokens=None, steps=None, batch=16, seq=None, lr=3e-3, min_lr_ratio=0.1,
          warmup=None, weight_decay=0.1, clip=1.0, gate_warmup_tokens=None, eval_every=None, eval_batches=8,
          save_every=None, metrics_every=None, seed=0, device="auto", compile=False, resume=False,
          tokenizer=None, progress=True, stop_at=None, cache_dir=None, deterministic=False) -> dict:
    """Train checkpoint ``ckpt`` on text files ``data_files``, writing into folder ``out``.

    ``steps`` (or ``tokens``, default: one pass over the training split) sets the run length;
    ``stop_at`` ends this invocation after that many updates with a resumable checkpoint.
    ``deterministic`` turns on torch's deterministic algorithms: needed on CUDA for runs (and
    resumed runs) to repeat bitwise; CPU runs repeat without it.
    Returns a summary dict (paths, steps, tokens, first / last val loss, final gate, seconds).
    """
    t_start = time.time()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    lead = rank == 0
    out = Path(out)
    if isinstance(data_files, (str, os.PathLike)):
        data_files = [data_files]

    # -- check everything before writing anything
    files = data.check_files(data_files)
    dev = pick_device(device, local_rank)
    ck = checkpoint.load(ckpt)
    cfg = ck.config
    tok = data.tokenizer_for(ck, tokenizer)  # the checkpoint's own unless given; refuses a vocabulary mismatch
    tok_record = tok.files.record() if tok.files else ck.tokenizer
    seq = min(cfg.context, 128) if seq is None else seq
    check_args(batch, seq, lr, min_lr_ratio, clip, eval_batches, tokens, steps, world, cfg,
               {"--eval-every": eval_every, "--save-every": save_every, "--metrics-every": metrics_every,
                "--stop-at": stop_at, "--warmup": warmup, "--gate-warmup-tokens": gate_warmup_tokens})
    if cfg.gated and any(v != 0.0 for v in growth.gate_values(ck)):
        raise GrowError(f"{ckpt}: its growth gates are already open ({max(growth.gate_values(ck)):g}); "
                        "fold it first (growtool fold) or resume the run that wrote it")
    if out.exists() and not out.is_dir():
        raise GrowError(f"{out}: exists and is not a folder")
    has_run = (out / STATE).exists() or (out / "metrics.jsonl").exists()
    if has_run and not resume:
        raise GrowError(f"{out}: already holds a training run (pass --resume to continue it, or another --out)")
    if resume and not (out / STATE).exists():
        raise GrowError(f"{out}: nothing to resume (no {STATE})")
    if not out.parent.is_dir():
        raise GrowError(f"{out}: parent folder {out.parent} does not exist")
    if cache_dir is None:
        cache_dir = out / "cache"
    tokens_arr = data.load_tokens(files, tok, cache_dir, cfg.vocab_size, data.min_tokens(seq, batch), write_cache=lead)
    ds = data.Dataset(tokens_arr, seq, batch, src=", ".join(map(str, files)))
    s = settings(cfg, ds, tok, [data.file_sha256(f) for f in files], ck.sha256(), tokens=tokens, steps=steps,
                 batch=batch, seq=seq, lr=lr, min_lr_ratio=min_lr_ratio, warmup=warmup, weight_decay=weight_decay,
                 clip=clip, gate_warmup_tokens=gate_warmup_tokens, eval_every=eval_every,
                 eval_batches=eval_batches, metrics_every=metrics_every, save_every=save_every, seed=seed)

    # -- model, optimiser, and (when resuming) their saved state
    lineage = ck.lineage
    model = ck.model()
    start = 0
    state = None
    if resume:
        state = torch.load(out / STATE, map_location="cpu", weights_only=True)
        for k in RESUME_KEYS:
            if state["settings"].get(k) != s[k]:
                raise GrowError(f"--resume: setting {k} = {s[k]!r} differs from the saved run's "
                                f"{state['settings'].get(k)!r} (resume with the same command line)")
        last = checkpoint.load(out / MODEL)
        if not last.lineage or last.lineage[-1].get("step") != state["step"]:
            raise GrowError(f"{out}: {MODEL} and {STATE} are from different steps (cannot resume exactly)")
        model = last.model()
        lineage = last.lineage[:-1]
        start = state["step"]
    for n, p in model.named_parameters():
        if n.endswith("growth_gate"):
            p.requires_grad_(False)
    model.to(dev).train()
    opt = make_optimizer(model, s)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if dev.type == "cuda" and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(state["rng"]["cuda"], dev)
    else:
        torch.manual_seed(seed)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.use_deterministic_algorithms(True)

    own_group = world > 1 and not dist.is_initialized()
    if own_group:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    run = model
    if world > 1:
        run = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if compile:
        run = torch.compile(run)

    # -- files (rank 0)
    metrics_path = out / "metrics.jsonl"
    records = []
    if lead:
        out.mkdir(exist_ok=True)
        if resume:
            records = [r for r in read_metrics(metrics_path) if r["step"] <= start]
            write_metrics(metrics_path, records)  # drop steps logged after the saved state

    val = ds.val_batches(s["eval_batches"])
    B, T = s["batch"], s["seq"]
    fh = open(metrics_path, "a") if lead else None

    def log(rec):
        records.append(rec)
        if fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()

    def save(step):
        if not lead:
            return
        entry = {"op": "train", "step": step, "steps": s["steps"], "tokens": step * B * T, "complete": False,
                 "data_sha256": s["data_sha256"], "tokenizer": s["tokenizer"]}
        checkpoint.save_tensors(str(out / MODEL), model.cfg, lineage + [entry], cpu_tensors(model), force=True,
                                tokenizer=tok_record)
        rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None}
        save_bytes(out / STATE, {"step": step, "data_step": step, "settings": s, "optimizer": opt.state_dict(), "rng": rng})

    if start == 0:
        g = gate_at(0, s)
        model.set_gates(g or 0.0)
        rec = {"step": 0, "tokens": 0, "gate": g, "val_loss": evaluate(model, val, dev)}
        rec["matrix"] = matrix_metrics(model.cfg, cpu_tensors(model))
        log(rec)

    bar = Progress(progress and lead, s["steps"], start)
    step = start
    end = s["steps"] if stop_at is None else min(s["steps"], max(start, int(stop_at)))
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        while step < end:
            t0 = time.time()
            g, lr_now = gate_at(step, s), lr_at(step, s)
            if g is not None:
                model.set_gates(g)
            for group in opt.param_groups:
                group["lr"] = lr_now
            x, y = ds.train_batch(step, s["seed"], rank, world)
            with autocast(dev):
                _, loss = run(x.to(dev), y.to(dev))
            loss.backward()
            gnorm = float(torch.nn.utils.clip_grad_norm_(params, s["clip"]))
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = loss.detach()
            if world > 1:
                dist.all_reduce(loss)
                loss /= world
            step += 1
            dt = time.time() - t0
            rec = {"step": step, "tokens": step * B * T, "loss": float(loss), "lr": lr_now, "gate": g,
                   "grad_norm": gnorm, "tok_s": B * T / max(dt, 1e-9)}
            if not math.isfinite(rec["loss"]):
                raise GrowError(f"training diverged: loss is {rec['loss']} at step {step} (lower --lr?)")
            if step % s["eval_every"] == 0 or step == s["steps"]:
                g_eval = gate_at(step, s)
                if g_eval is not None:
                    model.set_gates(g_eval)
                rec["val_loss"] = evaluate(model, val, dev)
            if step % s["metrics_every"] == 0 or step == s["steps"]:
                rec["matrix"] = matrix_metrics(model.cfg, cpu_tensors(model))
            log(rec)
            bar.update(step, rec)
            if step % s["save_every"] == 0 or step == end:
                save(step)
    finally:
        bar.close()
        if fh:
            fh.close()
        torch.use_deterministic_algorithms(was_deterministic)

    summary = {"out": str(out), "steps": step, "total_steps": s["steps"], "tokens": step * B * T,
               "first_val_loss": next((r["val_loss"] for r in records if "val_loss" in r), None),
               "val_loss": next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None),
               "params": model.cfg.n_params(), "seconds": time.time() - t_start, "final": None,
               "metrics": str(metrics_path), "gate": gate_at(step, s), "settings": s}
    if step == s["steps"] and lead:
        gate = gate_at(step, s)
        cfg_f, tensors = folded(model, gate if gate is not None else 1.0)
        entry = {"op": "train", "steps": step, "tokens": step * B * T, "batch": B, "seq": T, "lr": s["lr"],
                 "tokenizer": s["tokenizer"], "data_sha256": s["data_sha256"], "source_sha256": s["source_sha256"],
                 "val_loss": summary["val_loss"], "gates_folded_at": gate, "world_size": world}
        summary["final"] = checkpoint.save_tensors(str(out / FINAL), cfg_f, lineage + [entry], tensors, force=True,
                                                   tokenizer=tok_record)
        carried = Carry(tok.files, tok_record, None).files(cfg_f, lineage + [entry], str(ckpt), FINAL)
        write_files(out, carried)  # tokenizer files and model card beside final.safetensors
        summary["params"] = cfg_f.n_params()
        plot(records, out / "loss.png", f"{cfg_f.family} d{cfg_f.width}: {step} steps, {step * B * T:,} tokens")
        summary["plot"] = str(out / "loss.png")
    if own_group:
        dist.barrier()
        dist.destroy_process_group()
    return summary


__all__ = ["train", "evaluate", "lr_at", "gate_at"]
