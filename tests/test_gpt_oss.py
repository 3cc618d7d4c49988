"""GPT-OSS (issue 44): what is particular to it, beyond the width and depth cases of its rows in
tests/arch_cases.py and tests/test_depth.py: attention sinks, the router's bias, the clamped GLU of
its experts, each against transformers' own function and each shown to bite."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.gpt_oss import modeling_gpt_oss as hf_oss  # noqa: E402

from growtool.nn.attention import explicit  # noqa: E402
from growtool.nn.moe import clamped_glu  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _qkv(B=2, H=4, K=2, T=10, hd=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, n, T, hd, generator=g) for n in (H, K, K)] + [3 * torch.randn(H, generator=g)]


@pytest.mark.parametrize("window", [None, 3])
def test_sink_attention_equals_transformers_eager(window):
    """Each head's softmax over its scores and its sink logit, the sink's share dropped: as
    transformers' eager GPT-OSS attention (an additive mask of finfo.min), on causal and sliding masks.
    Without the sinks (or with sinks of -inf) the output differs."""
    q, k, v, sinks = _qkv()
    T, hd = q.shape[2], q.shape[3]
    i = torch.arange(T)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep = keep & (i[:, None] - i[None, :] < window)
    add = torch.zeros(T, T).masked_fill(~keep, torch.finfo(torch.float32).min)[None, None]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=2, training=False)
    want, _ = hf_oss.eager_attention_forward(module, q, k, v, add, scaling=hd**-0.5)  # [B, T, H, hd]
    got = explicit(q, k, v, keep, hd**-0.5, sinks=sinks).transpose(1, 2)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    without = explicit(q, k, v, keep, hd**-0.5).transpose(1, 2)
    assert (without - want).abs().max() > 1e-2
    none = explicit(q, k, v, keep, hd**-0.5, sinks=torch.full_like(sinks, float("-inf"))).transpose(1, 2)
    assert torch.allclose(none, without, atol=1e-6)


def test_clamped_glu_equals_transformers_and_its_clamps_bite():
    """(clamp(up, +-limit) + 1) x g sigmoid(alpha g), g = min(gate, limit), on GPT-OSS's interleaved
    [g_0 u_0 g_1 u_1 ..] pairs, as transformers' GptOssExperts applies it; without the clamps (or the
    +1) it differs."""
    cfg = transformers.GptOssConfig(swiglu_alpha=1.702, swiglu_limit=1.5)
    experts = hf_oss.GptOssExperts(cfg)
    gate_up = 3 * torch.randn(5, 2 * 16, generator=torch.Generator().manual_seed(0))
    want = experts._apply_gate(gate_up)
    got = clamped_glu(gate_up[..., ::2], gate_up[..., 1::2], 1.702, 1.5)
    assert torch.allclose(got, want, atol=1e-6)
    loose = clamped_glu(gate_up[..., ::2], gate_up[..., 1::2], 1.702, 1e9)
    assert (loose - want).abs().max() > 1e-1
    zero = torch.zeros(3, 4)
    assert torch.equal(clamped_glu(zero, zero, 1.702, 1.5), zero)  # a zero neuron writes nothing
