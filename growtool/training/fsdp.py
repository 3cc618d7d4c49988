"""Scale-out pieces of the bundled trainer: FSDP2 sharding, the sharded resumable state, micro-batches
(gradient accumulation) and activation checkpointing. ``loop.py`` calls these; nothing here knows
about data, schedules or metrics.

What holds:

* ``place``: with ``--fsdp`` under torchrun (more than one process), ``fully_shard`` wraps
  every block, then the root (embeddings, final norm, head). Each rank then holds 1/world of every
  parameter and of its gradient, and, since the optimiser is built on the sharded parameters, of
  both AdamW moments. The growth gates are 1-element parameters, sharded like the rest (one rank
  holds the element; ``LM.set_gates`` writes it there and the next all-gather spreads it). On CUDA
  the parameters are gathered in bf16 and gradients reduced in fp32 (``MixedPrecisionPolicy``); on
  CPU all is fp32. With one process ``--fsdp`` shards nothing: it only chooses the sharded state
  format below, so a run may continue on any number of ranks. ``--activation-checkpointing``
  recomputes each block's activations in the backward pass (with or without FSDP); tensor names
  are unchanged.
* ``full_tensors``: the model's tensors gathered in full, on CPU, named as ``LM.tensors()``. Every
  rank must call it (the gather is collective); only rank 0 receives the tensors, the others {}.
* ``save_state`` / ``load_state``: model and optimiser state written with
  ``torch.distributed.checkpoint`` (DCP) into a new folder ``last-<step>.dcp`` (each rank writes its
  own shards), loaded into a model sharded over any number of ranks or not sharded at all (DCP
  reshards on load). The folder is named by the step, so a new state never overwrites the one
  ``last.pt`` points to; ``drop_old_states`` removes the others once ``last.pt`` is replaced.
* ``forward_backward``: this rank's slice of the batch in ``n`` equal micro-batches, each loss
  scaled by 1/n: the accumulated gradient is the full slice's (up to round-off) and the returned
  loss is the slice's mean. DDP reduces gradients after the last micro-batch only; FSDP2 after each
  (so gradients are never held in full).
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from growtool.nn.errors import GrowError

DCP_PREFIX = "last-"


def is_sharded(model: torch.nn.Module) -> bool:
    """True when ``model``'s parameters are FSDP2 shards (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def checkpoint_blocks(model) -> None:
    """Recompute each block's activations during backward instead of keeping them (names unchanged)."""
    from torch.distributed._composable import checkpoint

    for block in model.blocks:
        checkpoint(block)


def shard(model, dev: torch.device) -> None:
    """FSDP2: every block, then the root, over all ranks; bf16 compute with fp32 gradient reduction on
    CUDA. fully_shard moves each module to ``dev`` as it shards it, so the device never holds more than
    one block in full (the model is built whole in CPU memory first)."""
    import torch.distributed.fsdp as fsdp2
    from torch.distributed.device_mesh import init_device_mesh

    if not hasattr(fsdp2, "fully_shard"):
        raise GrowError(
            f"--fsdp needs torch >= 2.6 (torch.distributed.fsdp.fully_shard); this is torch {torch.__version__}"
        )
    kw = {"mesh": init_device_mesh(dev.type, (dist.get_world_size(),))}
    if dev.type == "cuda":
        kw["mp_policy"] = fsdp2.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fsdp2.fully_shard(block, **kw)
    fsdp2.fully_shard(model, **kw)


def place(model, dev: torch.device, world: int, fsdp: bool, activation_checkpointing: bool) -> None:
    """Put ``model`` on ``dev``: whole, or FSDP2-sharded (--fsdp, several processes); with activation
    checkpointing if asked. In place, before the optimiser is built on its parameters."""
    if activation_checkpointing:
        checkpoint_blocks(model)  # before fully_shard, so FSDP's hooks wrap the recomputed forward
    if fsdp and world > 1:
        shard(model, dev)
    else:
        model.to(dev)


def full_tensors(model) -> dict[str, torch.Tensor]:
    """The full tensors of a sharded ``model`` on CPU as ``LM.tensors()`` names them (rank 0; {} elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not sd:
        return {}
    if model.cfg.tie:  # the tied head is the embedding; checkpoints store it once
        from growtool.nn.families import arch_of

        sd.pop(arch_of(model.cfg).modules["head"] + ".weight", None)
    return {n: t.detach().float().clone() for n, t in sd.items()}


def state_folder(out: Path, step: int) -> Path:
    return out / f"{DCP_PREFIX}{step}.dcp"


def _state_dicts(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optimizer": osd}


class _Quiet(warnings.catch_warnings):
    """DCP warns whenever it saves or loads without a process group, which a one-process run does."""

    def __enter__(self):
        super().__enter__()
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


def save_state(model, opt, out: Path, step: int) -> str:
    """Write model and optimiser state sharded (every rank calls); returns the folder's name in ``out``."""
    import torch.distributed.checkpoint as dcp

    folder = state_folder(out, step)
    if os.path.lexists(folder) and (not dist.is_initialized() or dist.get_rank() == 0):
        if folder.is_symlink() or not folder.is_dir():  # a link planted there: removed, never written through
            folder.unlink()
        else:
            shutil.rmtree(folder)  # a leftover of an interrupted save at this step: never the one last.pt names
    if dist.is_initialized():
        dist.barrier()
    with _Quiet():
        dcp.save(_state_dicts(model, opt), checkpoint_id=str(folder), no_dist=not dist.is_initialized())
    return folder.name


def load_state(model, opt, folder: Path, sha256: str | None = None) -> None:
    """Load what ``save_state`` wrote into ``model`` / ``opt``, sharded over any number of ranks or not
    (through ``dcp_safe``: nothing in the folder is unpickled freely; ``sha256``: its .metadata's)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from growtool.training import dcp_safe

    state = _state_dicts(model, opt)
    with _Quiet():
        dcp_safe.load(state, folder, sha256, no_dist=not dist.is_initialized())
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def drop_old_states(out: Path, keep: str | None) -> None:
    """Remove every ``last-<step>.dcp`` folder in ``out`` but ``keep`` (call after last.pt is replaced)."""
    for p in out.glob(f"{DCP_PREFIX}*.dcp"):
        if p.name != keep and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _no_sync(module):
    """DDP: a context in which backward accumulates gradients without reducing them across ranks.
    FSDP2 reduce-scatters after every micro-batch instead, so its gradients stay sharded."""
    return module.no_sync() if hasattr(module, "no_sync") else nullcontext()


def forward_backward(module, x: torch.Tensor, y: torch.Tensor, n: int, autocast) -> torch.Tensor:
    """Loss and backward of batch (x, y) in ``n`` micro-batches; returns the detached mean loss.

    ``autocast`` is a zero-argument factory of the forward's autocast context. ``n`` must divide
    the batch (the trainer checks it before the run starts)."""
    inner = getattr(module, "_orig_mod", module)  # torch.compile keeps the wrapped module here
    total = torch.zeros((), device=x.device)
    for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
        with _no_sync(inner) if i < n - 1 else nullcontext():
            with autocast():
                _, loss = module(xm, ym)
            (loss / n).backward()
        total += loss.detach() / n
    return total
