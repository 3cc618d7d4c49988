"""gamma-initialisation ("Small Initialization Matters for Large Language Models").

Every weight matrix W ~ N(0, sigma^2) with sigma = fan_in^(-gamma): gamma = 0.5 is the usual
Xavier-like scale and growtool's default (it trained better here: bench/small_init.py and
bench/growth_pays.py), gamma = 1 the paper's recommended small initialisation. fan_in is the size of
the axis the matrix reads: the residual width for readers and the untied head, the number of
unit inputs (heads x head_dim, FFN neurons) for writers.

Embeddings (token and position): the paper does not publish its choice, so it is a knob:
sigma = width^(-embed_gamma), ``embed_gamma`` defaulting to gamma. Norm gains are 1, all biases 0.
"""

from __future__ import annotations

import torch

from growtool.nn.config import ModelConfig
from growtool.nn.families import arch_of, tensor_specs
from growtool.nn.model import LM


def init_sigma(name: str, spec, shape, cfg: ModelConfig, gamma: float, embed_gamma: float) -> float | None:
    """The std of a tensor under the rule, or None for tensors that are not drawn (gains, biases)."""
    if spec.role == "embedding":
        return cfg.width ** (-embed_gamma)
    if spec.role in ("reader", "head", "router"):
        return shape[spec.res_axis] ** (-gamma)
    if spec.role == "writer":
        return shape[spec.unit_axis] ** (-gamma)
    if spec.role == "head_rows":  # MLA's latent -> heads: reads the latent
        return shape[1] ** (-gamma)
    return None


def init_model(cfg: ModelConfig, gamma: float = 0.5, embed_gamma: float | None = None, seed: int = 0) -> LM:
    embed_gamma = gamma if embed_gamma is None else embed_gamma
    model = LM(cfg)
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, spec in tensor_specs(cfg).items():
            if spec.role in ("act_param", "expert_bias", "inner"):  # the module's own values: xIELU's scalars,
                continue  # a zero bias; a Mamba mixer's conv1d (PyTorch's init), A = -(1..heads), D = 1, dt_bias 0
            p = params[name]
            sigma = init_sigma(name, spec, p.shape, cfg, gamma, embed_gamma)
            if sigma is not None:
                p.copy_(torch.randn(p.shape, generator=gen) * sigma)
            elif spec.role in ("norm_gain", "head_norm", "unit_norm", "latent_norm"):
                p.fill_(1.0 - arch_of(cfg).features.norm_offset)  # effective gain 1 (Gemma stores 1 + w)
            else:
                p.zero_()
    return model
