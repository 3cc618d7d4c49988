"""``growtool.inspect``: what a checkpoint is (family, shapes, parameters, dtype, gates, lineage,
tokenizer, every tensor's shape), read from its header alone; with ``metrics``, the condensation
metrics of every matrix, one tensor in memory at a time, and for a grown checkpoint (or one
trained after its growth) how its copied units compare with their sources (training.diagnostics)."""

from __future__ import annotations

from pathlib import Path

from growtool.grow.plan import gate_values
from growtool.io import checkpoint
from growtool.nn import args

FIELDS = ("family", "width", "layers", "heads", "kv_heads", "head_dim", "ffn")


def run_state(path) -> str | None:
    """A training run folder's model (``last.safetensors``, the state ``--resume`` continues from);
    None when ``path`` is no run folder (a folder holding ``last.pt``, the rule ``expand`` uses)."""
    p = Path(path)
    return str(p / "last.safetensors") if p.is_dir() and (p / "last.pt").exists() else None


def inspect(ckpt, *, metrics: bool = False) -> dict:
    """The facts about ``ckpt`` (a path, a training run folder: its ``last.safetensors``, or a
    loaded checkpoint) as a dict (``growtool inspect --json``)."""
    args.flag("metrics", metrics)
    run = None if isinstance(ckpt, checkpoint.Checkpoint) else run_state(args.path("ckpt", ckpt))
    run, ckpt = (str(ckpt), run) if run else (None, ckpt)
    ck = checkpoint.load(ckpt) if not isinstance(ckpt, checkpoint.Checkpoint) else ckpt
    cfg = ck.config
    info = {
        "path": str(ckpt) if not isinstance(ckpt, checkpoint.Checkpoint) else None,
        "run_folder": run,
        **{k: getattr(cfg, k) for k in FIELDS},
        "vocab": cfg.vocab_size,
        "context": cfg.context,
        "norm_eps": cfg.norm_eps,
        "tied": cfg.tie,
        "attn_gate": cfg.attn_gate,
        "parameters": cfg.n_params(),
        "dtype": str(ck.main_dtype()).replace("torch.", ""),
        "gated": cfg.gated,
        "base_heads": cfg.base_heads,
        "base_ffn": cfg.base_ffn,
        "new_layers": list(cfg.new_layers or []),
        "blocks": list(cfg.block_types) if cfg.block_types else None,  # a hybrid's block kinds
        "mixer": {k: v for k, v in cfg.ssm.items() if k != "dt_limit"} if cfg.ssm else None,  # Mamba sizes
        "gates": gate_values(ck),
        "lineage": ck.lineage,
        "tokenizer": ck.tokenizer,
        "tensors": {n: list(ck.shape(n)) for n in ck.names()},
    }
    if metrics:
        from growtool.metrics import matrix_metrics

        info["metrics"] = matrix_metrics(cfg, ck.get, ck.names())  # one tensor in memory at a time
        from growtool.training.diagnostics import checkpoint_record

        info["growth"] = checkpoint_record(ck)  # copies vs their sources (None: no recorded growth)
    return info
