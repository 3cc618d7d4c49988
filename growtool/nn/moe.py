"""Mixture-of-experts routing for the one forward pass (``model.py``): which experts each token goes
to, and with which weights; and GPT-OSS's clamped GLU of its experts.

Imports nothing else from growtool but ``config`` and ``families``: copied into remote-code folders
with ``model.py``.
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .families import arch_of


def sparsemixer(scores: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's top-2 routing at inference (SparseMixer, Liu et al. 2024, arXiv:2409.12136): the best
    expert, then the best of the rest; each one's weight is its softmax among the experts whose logit
    s is within 2 eps of its own, relatively: (best - s) / max(|s|, best) <= 2 eps. (weights, experts)."""

    def pick(s, best):
        top = s.gather(-1, best)
        far = (top - scores) / scores.abs().clamp(min=top) > 2 * eps
        return torch.softmax(s.masked_fill(far, float("-inf")), dim=-1).gather(-1, best)

    first = scores.argmax(dim=-1, keepdim=True)
    rest = scores.scatter(-1, first, float("-inf"))
    second = rest.argmax(dim=-1, keepdim=True)
    return torch.cat([pick(scores, first), pick(rest, second)], -1), torch.cat([first, second], -1)


def route(cfg: ModelConfig, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) of each token's top_k experts from its router logits: softmax (float32)
    then top-k, or the family's own rule (``Features.routing``); weights renormalised to sum 1 where
    the family does (``norm_topk``). "sigmoid_in" weights multiply the token before its expert (Llama 4)."""
    routing = arch_of(cfg).features.routing
    if routing == "sparsemixer":
        top, pick = sparsemixer(logits, cfg.router_jitter)
    elif routing == "sigmoid_in":  # Llama 4: the top-k logits, each weight the sigmoid of its own logit
        top, pick = torch.topk(logits, cfg.top_k, dim=-1)
        top = torch.sigmoid(top.float())
    else:
        probs = torch.softmax(logits.float(), dim=-1)
        top, pick = torch.topk(probs, cfg.top_k, dim=-1)
    if cfg.norm_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, pick


def clamped_glu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's expert activation (OpenAI's gpt-oss model card, 2025): a SwiGLU with a sigmoid gain
    alpha, the gate clamped above at ``limit`` and the up projection to [-limit, limit], and up + 1:
    (clamp(up) + 1) x g sigmoid(alpha g), g = min(gate, limit). A neuron with zero weights and biases
    gives 0 (g = 0)."""
    g = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (g * torch.sigmoid(alpha * g))
