"""Helpers for the hardening tests: tiny checkpoints with non-trivial weights, hashing, CLI runs."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import torch
from click.testing import CliRunner

from growtool.cli import main
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.config import ModelConfig

GROWTOOL = str(Path(sys.executable).parent / "growtool")
NOBODY = 65534


def make_config(
    family="llama",
    width=32,
    layers=2,
    heads=4,
    kv_heads=None,
    head_dim=None,
    ffn=None,
    vocab=64,
    context=32,
    tie=False,
    attn_gate=False,
    qkv_bias=False,
    norm_eps=1e-5,
) -> ModelConfig:
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        width=width,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=head_dim or width // heads,
        ffn=ffn or 2 * width,
        context=context,
        norm_eps=norm_eps,
        tie=tie,
        attn_gate=attn_gate,
        qkv_bias=qkv_bias and family == "llama",
    )


def random_tensors(cfg: ModelConfig, seed: int = 0, gamma: float = 0.5, perturb: float = 0.3) -> dict:
    """gamma-init weights plus random norm gains / biases (1-d tensors), so gain folding is exercised."""
    t = init_model(cfg, gamma=gamma, seed=seed).tensors()
    g = torch.Generator().manual_seed(seed + 1)
    for n, v in t.items():
        if v.dim() == 1 and "growth_gate" not in n:
            v.add_(perturb * torch.randn(v.shape, generator=g))
    return t


def write_ckpt(path, cfg: ModelConfig, seed: int = 0, dtype=torch.float32, **kw) -> Path:
    tensors = {n: v.to(dtype) for n, v in random_tensors(cfg, seed).items()}
    checkpoint.save_tensors(str(path), cfg, [], tensors, force=True, **kw)
    return Path(path)


def sha256(path) -> str:
    """Hash of a file's bytes, or of every file in a folder (relative names and contents, sorted)."""
    p = Path(path)
    if not p.is_dir():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(f for f in p.rglob("*") if f.is_file()):
        h.update(str(f.relative_to(p)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def listing(folder) -> dict[str, int]:
    """Every path under ``folder`` (hidden ones included) with its size: detects leftovers."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*")}


def cli(*args, input=None):
    """The CLI in-process; click's Result has exit_code, stdout, stderr."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def run(*args, input=None, user=None, cwd=None, timeout=120, env=None) -> subprocess.CompletedProcess:
    """The installed ``growtool`` as a subprocess (optionally as another user, or with ``env``)."""
    kw = dict(user=user, group=user, extra_groups=[]) if user is not None else {}
    return subprocess.run(
        [GROWTOOL, *map(str, args)], input=input, capture_output=True, cwd=cwd, timeout=timeout, env=env, **kw
    )


def raw_safetensors(header: dict, data: bytes, pad: bool = True) -> bytes:
    """Hand-made safetensors bytes (any header, valid or not)."""
    hb = json.dumps(header).encode()
    if pad:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def read_raw(path) -> tuple[dict, bytes]:
    """(header dict incl. __metadata__, data bytes) of a safetensors file."""
    b = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", b[:8])
    return json.loads(b[8 : 8 + n]), b[8 + n :]


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
