"""transformers' own forward pass of a Hugging Face folder: the reference that ``verify --reference
transformers`` compares a source and its grown model against, so a user sees both implementations
agree. transformers is needed only for this (``pip install transformers``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from growtool.nn.errors import GrowError


class Reference:
    """transformers' model of ``folder`` in float32 (eager attention), called as growtool's models are
    by ``check.compare``: ``ref(ids, alpha=None) -> logits``; never gated."""

    cfg = SimpleNamespace(gated=False)

    def __init__(self, folder: str):
        if not (Path(folder).is_dir() and (Path(folder) / "config.json").is_file()):
            raise GrowError(f"--reference transformers: {folder} is not a Hugging Face folder (config.json)")
        try:
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise GrowError("--reference transformers needs transformers (pip install transformers)") from None
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
            ).eval()
        except Exception as e:  # noqa: BLE001 - any failure of transformers to build the folder's model
            raise GrowError(f"--reference transformers: transformers cannot load {folder}: {e}") from None

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, alpha=None) -> torch.Tensor:
        return self.model(ids).logits
