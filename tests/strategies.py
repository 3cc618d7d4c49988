"""Hypothesis strategies the tests share: a random growth case (family, config, target width, recipe, seed)."""

from __future__ import annotations

from hypothesis import strategies as st

from growtool.nn.config import ModelConfig
from growtool.nn.families import ARCHS


def _moe(draw, arch) -> dict:
    experts = draw(st.integers(1, 4))
    kw = dict(experts=experts, top_k=draw(st.integers(1, experts)), norm_topk=draw(st.booleans()))
    if "shared_ffn" in arch.keys:  # Qwen2-MoE's shared expert
        kw["shared_ffn"] = draw(st.integers(1, 40))
    return kw


def _mla(draw) -> dict:
    """Latent attention's dims (DeepSeek-V2/V3)."""
    q_lora = draw(st.sampled_from([None, 6, 12]))
    kw = dict(q_lora_rank=q_lora, kv_lora_rank=draw(st.integers(2, 12)), qk_nope_head_dim=draw(st.integers(1, 8)))
    return dict(kw, v_head_dim=draw(st.integers(1, 8)))


@st.composite
def growth_cases(draw):
    family = draw(st.sampled_from(sorted(ARCHS)))
    f = ARCHS[family].features
    partial = ARCHS[family].defaults.get("rotary_fraction", 1.0) < 1  # NeoX rotates 1/4, Phi 1/2
    head_dim = draw(st.sampled_from([8, 16] if partial else [4, 6, 8, 16]))
    per_kv = draw(st.sampled_from([1, 2, 3])) if f.gqa else 1  # query heads per KV head
    kv = 1 if f.mqa else draw(st.integers(1, 3))  # multi-query: one KV head, before and after growth
    new_kv = draw(st.integers(kv + 1, kv + 3))
    heads, width = kv * per_kv, kv * per_kv * head_dim
    bias = draw(st.booleans())
    cfg = ModelConfig(
        family=family,
        vocab_size=draw(st.integers(16, 48)),
        width=width,
        layers=draw(st.integers(1, 2)),
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        ffn=4 * width if f.embed_norm else draw(st.integers(1, 4)) * width + draw(st.integers(0, 5)),
        context=16,
        tie=draw(st.booleans()) and f.norm_affine,  # a tied head over a norm without gain: refused
        attn_gate=draw(st.booleans()) and not f.mla,  # gated attention is refused with latent attention
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=draw(st.booleans()) and not f.mla,  # DeepSeek-V2's biased shared experts: refused
        norm_eps=draw(st.sampled_from([1e-5, 1e-12])),
        **(_moe(draw, ARCHS[family]) if f.moe else {}),  # drawn last: other families' draws unchanged
        **(_mla(draw) if f.mla else {}),
    )
    if f.moe_layers:  # DeepSeek-style: shared experts, dense blocks of their own width (drawn last, as above)
        kinds = [draw(st.integers(0, 1)) for _ in range(cfg.layers)]
        shared = None if f.shared_plain else draw(st.integers(0, 2))  # Llama 4's shared expert: always, of ffn
        cfg = cfg.replace(shared_experts=shared, moe_layers=kinds, dense_ffn=draw(st.integers(1, 40)))
    # copy adds ungated heads: refused as lossy under a q/k norm over all heads (OLMo 2), whose new rows must be 0
    recipes_ = ["srio"] + (["copy"] if f.qk_norm != "full" else []) + (["nrio"] if f.norm == "rmsnorm" else [])
    D = new_kv * per_kv * head_dim
    if f.embed_norm:  # BLOOM: whole factors only, MLP 4 x width, no copied heads (ALiBi slopes differ)
        D, recipes_ = (2 + (new_kv - kv) // 3) * width, ["srio"]
    recipe = draw(st.sampled_from(recipes_))
    return cfg, D, recipe, draw(st.integers(0, 2**16))
