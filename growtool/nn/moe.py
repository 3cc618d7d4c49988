"""Mixture-of-experts routing for the one forward pass (``model.py``): which experts each token goes
to, and with which weights; and GPT-OSS's clamped GLU of its experts.

Imports nothing else from growtool but ``config`` and ``families``: copied into remote-code folders
with ``model.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def grouped_choice(choice: torch.Tensor, k: int, n_group: int, topk_group: int, best_of: int = 2) -> torch.Tensor:
    """DeepSeek's group-limited choice (DeepSeek-V3, arXiv:2412.19437, sec. 2.1.2): the experts are n_group
    equal groups; a group's score is the sum of its ``best_of`` best choice scores (V3: 2; V2's
    group_limited_greedy: 1, its best); each token picks its k experts among the topk_group best groups
    only. [tokens, k] expert indices."""
    if n_group > 1:
        grouped = choice.view(*choice.shape[:-1], n_group, -1)
        best = grouped.topk(best_of, dim=-1)[0].sum(-1).topk(topk_group, dim=-1)[1]
        keep = torch.zeros(grouped.shape[:-1], dtype=torch.bool, device=choice.device).scatter(-1, best, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(choice.shape)
    return torch.topk(choice, k, dim=-1)[1]


def biased(cfg: ModelConfig, logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing with a selection-only correction bias (auxiliary-loss-free load balancing, DeepSeek-V3):
    scores s = sigmoid(logits) ("sigmoid") or softmax(logits) ("softmax_bias", Ernie 4.5-MoE), float32;
    the experts are chosen by s + bias (within the best groups), weighted by their s alone."""
    scores = torch.sigmoid(logits) if arch_of(cfg).features.routing == "sigmoid" else torch.softmax(logits, -1)
    pick = grouped_choice(scores + bias.reshape(-1).float(), cfg.top_k, cfg.n_group or 1, cfg.topk_group or 1)
    return scores.gather(-1, pick), pick


def route(cfg: ModelConfig, router, x: torch.Tensor, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) of each token's top_k experts from the router on ``x``: softmax (float32)
    then top-k, or the family's own rule (``Features.routing``); weights renormalised to sum 1 where
    the family does (``norm_topk``), then times ``routed_scale`` where it has one. "sigmoid_in" weights
    multiply the token before its expert (Llama 4)."""
    rule = arch_of(cfg).features.routing
    if rule == "softmax_group":  # DeepSeek-V2: softmax, the best groups by their best expert, never renormalised
        scores = torch.softmax(F.linear(x.float(), router.weight.float()), -1)
        groups = 1 if cfg.extra.get("topk_method") == "greedy" else cfg.n_group or 1  # greedy: from all experts
        pick = grouped_choice(scores, cfg.top_k, groups, cfg.topk_group or 1, best_of=1)
        return scores.gather(-1, pick) * (cfg.routed_scale or 1.0), pick
    if rule in ("sigmoid", "softmax_bias"):  # router logits in float32, as these families compute them
        top, pick = biased(cfg, F.linear(x.float(), router.weight.float()), bias)
        if cfg.norm_topk:  # DeepSeek adds 1e-20 to the sum, Ernie clamps it at moe_norm_min
            den = top.sum(dim=-1, keepdim=True)
            top = top / (den + 1e-20 if rule == "sigmoid" else den.clamp(min=cfg.extra.get("moe_norm_min", 1e-12)))
        return top * (cfg.routed_scale or 1.0), pick
    logits = router(x)
    if rule == "sparsemixer":
        top, pick = sparsemixer(logits, cfg.router_jitter)
    elif rule == "sigmoid_in":  # Llama 4: the top-k logits, each weight the sigmoid of its own logit
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
