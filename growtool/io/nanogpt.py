"""nanoGPT checkpoints (``ckpt.pt``) as GPT-2 models.

nanoGPT's ``train.py`` saves ``{"model": state_dict, "model_args": {...}, "optimizer": ...,
"iter_num": ..., "config": ...}``. Its model is GPT-2 with ``nn.Linear`` weights ([out, in];
GPT-2's Conv1D stores [in, out]), exact GELU, LayerNorm eps 1e-5, a tied head, and, with
``bias=False``, no biases at all. A missing bias is a zero bias, so every nanoGPT model is
exactly a GPT-2 checkpoint with ``activation_function: gelu``.

The file is read with ``torch.load(weights_only=True)``: tensors and plain containers only,
nothing in the file is executed.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from growtool.nn import args
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import IGNORED, expected_shapes

LINEARS = re.compile(r"\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def is_torch_file(path: Path) -> bool:
    """A torch.save file (zip archive or legacy pickle), not safetensors (whose 8-byte header
    length is followed by the JSON header's ``{``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False  # the safetensors reader reports the error
    if head[8:9] == b"{":
        return False
    return head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"))


def read(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """(config, GPT-2 tensors in growtool's layout, lineage entry) of a nanoGPT checkpoint; a
    malformed one (model_args or state dict of the wrong kinds) is one GrowError line."""
    try:
        return _read(path)
    except (AttributeError, TypeError, ValueError, OverflowError, KeyError, IndexError, RuntimeError) as e:
        raise GrowError(f"{path}: malformed nanoGPT checkpoint ({' '.join(str(e).split())[:120]})") from None


def _read(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise GrowError(
            f"{path}: not a plain-tensor checkpoint (refused by weights_only loading: {str(e).splitlines()[0][:120]})"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise GrowError(f"{path}: cannot read as a torch checkpoint ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(ck, dict) or "model" not in ck or "model_args" not in ck:
        raise GrowError(f"{path}: not a nanoGPT checkpoint (expected the keys 'model' and 'model_args')")
    margs, sd = ck["model_args"], ck["model"]
    if not isinstance(margs, dict) or not isinstance(sd, dict):
        raise GrowError(f"{path}: malformed nanoGPT checkpoint ('model' and 'model_args' must be dictionaries)")
    for key in ("n_embd", "n_head", "n_layer", "vocab_size", "block_size"):
        if key not in margs:
            raise GrowError(f"{path}: model_args lacks {key!r}")
        args.integer(f"{path}: model_args {key}", margs[key], 1)
    d, h = margs["n_embd"], margs["n_head"]
    if d % h:
        raise GrowError(f"{path}: n_head {h} does not divide n_embd {d}")
    cfg = ModelConfig(
        family="gpt2",
        vocab_size=margs["vocab_size"],
        width=d,
        layers=margs["n_layer"],
        heads=h,
        kv_heads=h,
        head_dim=d // h,
        ffn=4 * d,
        context=margs["block_size"],
        norm_eps=1e-5,
        tie=True,
        activation="gelu",
    )
    sd = {k.removeprefix("_orig_mod."): v for k, v in sd.items() if not IGNORED.search(k)}
    head = sd.pop("lm_head.weight", None)
    if head is not None and not torch.equal(head, sd.get("transformer.wte.weight", head)):
        raise GrowError(f"{path}: lm_head differs from transformer.wte (an untied nanoGPT model is not supported)")
    want = expected_shapes(cfg)
    extra = sorted(set(sd) - set(want))
    if extra:
        raise GrowError(f"{path}: unexpected tensor {extra[0]} in a nanoGPT checkpoint")
    out = {}
    for name, shape in want.items():
        if name in sd:
            t = sd[name]
            out[name] = t.t().contiguous() if LINEARS.search(name) else t
        elif name.endswith(".bias"):
            out[name] = torch.zeros(shape, dtype=sd["transformer.wte.weight"].dtype)  # bias=False
        else:
            raise GrowError(f"{path}: tensor {name} missing from the nanoGPT checkpoint")
        if tuple(out[name].shape) != shape:
            raise GrowError(f"{path}: tensor {name} has shape {tuple(out[name].shape)}, model_args say {shape}")
        if not out[name].is_floating_point():
            raise GrowError(f"{path}: tensor {name} is not floating point")
    entry = {"op": "import", "from": "nanogpt", "iter_num": ck.get("iter_num"), "bias": bool(margs.get("bias", True))}
    return cfg, out, entry
