"""Hypothesis strategies the tests share: a random growth case (family, config, target width, recipe, seed)."""

from __future__ import annotations

from hypothesis import strategies as st

from growtool.nn.config import ModelConfig
from growtool.nn.families import ARCHS, arch_sublayers


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


def _mixers(draw, arch, width: int, layers: int) -> dict:
    """A hybrid's block kinds and a Mamba mixer's sizes (its inner width expand x width where the family ties it)."""
    kw = {"block_types": [draw(st.sampled_from(sorted(arch.kinds))) for _ in range(layers)]} if arch.kinds else {}
    if "mamba" in arch_sublayers(arch):
        heads = draw(st.sampled_from([1, 2])) if "heads" in arch.ssm_keys else 1
        ssm = dict(heads=heads, state=draw(st.integers(1, 4)), groups=heads if draw(st.booleans()) else 1)
        ssm.update(conv=draw(st.integers(1, 4)), conv_bias=draw(st.booleans()), bias=draw(st.booleans()))
        ssm.update(dt_limit=[0.0, float("inf")], dt_rank=draw(st.integers(1, 3)))
        if "expand" in arch.ssm_keys:  # widths are even: expand x width splits into 1 or 2 heads
            ssm["expand"] = draw(st.integers(1, 2))
            ssm["head_dim"] = ssm["expand"] * width // heads
        else:
            ssm["head_dim"] = draw(st.integers(1, 4))
        kw["ssm"] = ssm
    if "gdn" in arch_sublayers(arch):  # Gated DeltaNet's own inner sizes (config keys, carried in extra)
        nk = draw(st.integers(1, 2))
        kw["extra"] = dict(linear_num_key_heads=nk, linear_num_value_heads=nk * draw(st.integers(1, 2)))
        kw["extra"].update(linear_key_head_dim=draw(st.integers(2, 8)), linear_value_head_dim=draw(st.integers(2, 8)))
        kw["extra"]["linear_conv_kernel_dim"] = draw(st.integers(1, 4))
    if "shortconv" in arch_sublayers(arch):  # LFM2's conv taps and biases
        kw["extra"] = dict(conv_L_cache=draw(st.integers(1, 4)), conv_bias=draw(st.booleans()))
    return kw


@st.composite
def growth_cases(draw, family=None):
    family = family or draw(st.sampled_from(sorted(ARCHS)))
    f = ARCHS[family].features
    partial = ARCHS[family].defaults.get("rotary_fraction", 1.0) < 1  # NeoX rotates 1/4, Phi 1/2
    head_dim = draw(st.sampled_from([8, 16] if partial else [4, 6, 8, 16]))
    per_kv = draw(st.sampled_from([1, 2, 3])) if f.gqa else 1  # query heads per KV head
    kv = 1 if f.mqa else draw(st.integers(1, 3))  # multi-query: one KV head, before and after growth
    new_kv = draw(st.integers(kv + 1, kv + 3))
    heads, width = kv * per_kv, kv * per_kv * head_dim
    bias = draw(st.booleans())
    layers = draw(st.integers(1, 2))
    cfg = ModelConfig(
        family=family,
        vocab_size=draw(st.integers(16, 48)),
        width=width,
        layers=layers,
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
        **_mixers(draw, ARCHS[family], width, layers),
    )
    if f.moe_layers:  # DeepSeek-style: shared experts, dense blocks of their own width (drawn last, as above)
        kinds = [draw(st.integers(0, 1)) for _ in range(cfg.layers)]
        shared = None if f.shared_plain else draw(st.integers(0, 2))  # Llama 4's shared expert: always, of ffn
        shared_ffn = dict(shared_ffn=None, base_shared_ffn=None)  # of the drawn count (ModelConfig fills them)
        cfg = cfg.replace(shared_experts=shared, moe_layers=kinds, dense_ffn=draw(st.integers(1, 40)), **shared_ffn)
    # copy adds ungated heads: refused as lossy under a q/k norm over all heads (OLMo 2), whose new rows must be 0
    recipes_ = ["srio"] + (["copy"] if f.qk_norm != "full" else []) + (["nrio"] if f.norm == "rmsnorm" else [])
    D = new_kv * per_kv * head_dim
    if f.embed_norm:  # BLOOM: whole factors only, MLP 4 x width, no copied heads (ALiBi slopes differ)
        D, recipes_ = (2 + (new_kv - kv) // 3) * width, ["srio"]
    recipe = draw(st.sampled_from(recipes_))
    return cfg, D, recipe, draw(st.integers(0, 2**16))
