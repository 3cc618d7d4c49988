"""The architecture table: every model the tests build with transformers, one row each
(name -> (factory, kwargs)). ``CASES`` holds them all: the architectures of the first families
(vocabulary 128, ``V``) and those of issue 31 (vocabulary 256, ``FAMILY_V``). test_architectures.py
runs every row against transformers' own forward pass; test_families.py and test_depth.py take
rows and factories from here."""

from __future__ import annotations

import functools

import pytest
import torch

from helpers import perturbed

transformers = pytest.importorskip("transformers")

V, T = 128, 24
X = torch.randint(V, (2, T), generator=torch.Generator().manual_seed(1))
SMALL = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)


def _llama_like(cls_name, model_cls=None, vocab=V, **kw):
    def make(tie=False, **over):
        cfg = getattr(transformers, cls_name + "Config")(
            **{**SMALL, "vocab_size": vocab, "intermediate_size": 160, **kw, **over}, tie_word_embeddings=tie
        )
        return getattr(transformers, model_cls or cls_name + "ForCausalLM")(cfg)

    return make


def _gpt2(tie=True, **over):
    cfg = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=V, n_positions=64, n_inner=160, tie_word_embeddings=tie, **over
    )
    return transformers.GPT2LMHeadModel(cfg)


def _neox(tie=False, **over):
    cfg = transformers.GPTNeoXConfig(**{**SMALL, "intermediate_size": 160, **over}, tie_word_embeddings=tie)
    return transformers.GPTNeoXForCausalLM(cfg)


# name -> (factory, kwargs): each row a model transformers builds; the variants cover the features
ARCH_CASES = {
    "gpt2": (_gpt2, {}),
    "gpt2-untied-gelu": (_gpt2, {"tie": False, "activation_function": "gelu"}),
    "gpt2-relu": (_gpt2, {"activation_function": "relu"}),
    "gpt2-silu": (_gpt2, {"activation_function": "silu"}),
    "gpt2-gelu_pytorch_tanh": (_gpt2, {"activation_function": "gelu_pytorch_tanh"}),
    "llama": (_llama_like("Llama", num_key_value_heads=2), {}),
    "llama-tied-biases": (
        _llama_like("Llama", num_key_value_heads=2, attention_bias=True, mlp_bias=True),
        {"tie": True},
    ),
    "mistral-window": (_llama_like("Mistral", num_key_value_heads=2, sliding_window=8, head_dim=16), {}),
    "qwen2": (_llama_like("Qwen2", num_key_value_heads=2), {}),
    "qwen2-tied": (_llama_like("Qwen2", num_key_value_heads=2), {"tie": True}),
    "qwen3": (_llama_like("Qwen3", num_key_value_heads=2, head_dim=16), {"tie": True}),
    "qwen3-untied-hd24": (_llama_like("Qwen3", num_key_value_heads=2, head_dim=24), {}),
    "phi3-partial-rotary": (
        _llama_like(
            "Phi3",
            num_key_value_heads=2,
            pad_token_id=0,
            eos_token_id=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
        {},
    ),
    "gpt_neox": (_neox, {}),
    "gpt_neox-sequential-tied": (_neox, {"use_parallel_residual": False, "tie": True}),
    "starcoder2-window": (
        _llama_like("Starcoder2", num_key_value_heads=2, sliding_window=8, bos_token_id=0, eos_token_id=0),
        {"tie": True},
    ),
    "gemma": (
        _llama_like("Gemma", num_key_value_heads=2, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        {"tie": True},
    ),
    "gemma-untied-hd24": (
        _llama_like("Gemma", num_key_value_heads=1, head_dim=24, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        {},
    ),
    "gemma2-softcap-window": (
        _llama_like(
            "Gemma2",
            num_key_value_heads=2,
            head_dim=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
        {"tie": True},
    ),
    "gemma3": (
        _llama_like(
            "Gemma3Text",
            "Gemma3ForCausalLM",
            num_key_value_heads=2,
            head_dim=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 500.0},
            },
        ),
        {"tie": True},
    ),
    "olmo2": (_llama_like("Olmo2", num_key_value_heads=2, pad_token_id=0, eos_token_id=1), {}),
    "olmo2-tied-bias": (
        _llama_like("Olmo2", num_key_value_heads=2, pad_token_id=0, eos_token_id=1, attention_bias=True),
        {"tie": True},
    ),
}


FAMILY_V, FAMILY_T = 256, 20
FAMILY_X = torch.randint(FAMILY_V, (2, FAMILY_T), generator=torch.Generator().manual_seed(1))
_family_like = functools.partial(_llama_like, vocab=FAMILY_V)  # the issue-31 rows: vocabulary 256


def _opt(tie=True, **over):
    kw = dict(vocab_size=FAMILY_V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=160)
    kw.update(max_position_embeddings=64, pad_token_id=1, bos_token_id=2, eos_token_id=2, dropout=0.0)
    return transformers.OPTForCausalLM(transformers.OPTConfig(**{**kw, **over}, tie_word_embeddings=tie))


def _bigcode(tie=True, **over):
    kw = dict(vocab_size=FAMILY_V, n_embd=64, n_layer=2, n_head=4, n_inner=160, n_positions=64)
    kw.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(**{**kw, **over}, tie_word_embeddings=tie))


GRANITE_MULT = dict(embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.05, logits_scaling=4.0)


def _gptj(tie=False, **over):
    kw = dict(vocab_size=FAMILY_V, n_embd=64, n_layer=2, n_head=4, n_inner=160, n_positions=64, rotary_dim=8)
    kw.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPTJForCausalLM(transformers.GPTJConfig(**{**kw, **over}, tie_word_embeddings=tie))


def _falcon(tie=True, **over):
    kw = dict(vocab_size=FAMILY_V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_hidden_size=160)
    kw.update(max_position_embeddings=64, new_decoder_architecture=True, bos_token_id=0, eos_token_id=0)
    return transformers.FalconForCausalLM(transformers.FalconConfig(**{**kw, **over}, tie_word_embeddings=tie))


IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
NO_DROP = dict(attention_dropout=0.0, residual_dropout=0.0)
WINDOWS = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
LLAMA3 = dict(  # Apertus' default RoPE, at a scale these tiny models reach
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, intermediate_size=48)
QWEN2_MOE = dict(MOE, shared_expert_intermediate_size=80)
GRANITE_MOE = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)  # experts fused in 3-D tensors
LLAMA4 = dict(
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=48,  # each expert's and the shared expert's neurons
    intermediate_size_mlp=80,  # the dense blocks' neurons
    num_local_experts=3,
    interleave_moe_layer_step=2,  # block 1 MoE, block 0 dense
    attention_chunk_size=8,
    floor_scale=4,
    attn_scale=0.5,
)


def _dbrx(tie=False, attn=None, ffn=None, **over):
    """DBRX: its attention and FFN settings nested in ``attn_config`` / ``ffn_config`` (transformers 5.24's
    attention reads ``attn_config.rope_theta``, which its config class does not default;
    its attention also fails without ``clip_qkv``, so every row sets one)."""
    kw = dict(vocab_size=FAMILY_V, d_model=64, n_heads=4, n_layers=2, max_seq_len=64)
    attn = {"kv_n_heads": 2, "rope_theta": 10000.0, **(attn or {})}
    ffn = {"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2, **(ffn or {})}
    cfg = transformers.DbrxConfig(**{**kw, **over}, attn_config=attn, ffn_config=ffn, tie_word_embeddings=tie)
    return transformers.DbrxForCausalLM(cfg)


GPT_OSS = dict(  # windows on alternate layers, YaRN at a scale these tiny models reach, clamps that bite
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=48,
    sliding_window=8,
    swiglu_limit=1.0,
    initializer_range=0.1,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 16,
    },
    **IDS,
)


def _gpt_oss(tie=False, **over):
    """GPT-OSS with non-zero expert biases ([E, 2f] and [E, d]: 2-D, which ``perturbed`` leaves)."""
    model = _family_like("GptOss")(tie=tie, **{**GPT_OSS, **over})
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("_proj_bias"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


# DeepSeek-style MoE: 8 experts in 2 groups, 2 per token from the best group, 2 shared experts, block 0 dense
DS_MOE = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2, n_group=2, topk_group=1, **IDS)


def _ds_moe(cls_name, model_cls=None, **kw):
    """A DeepSeek-style MoE row: the router weights x 5 (so scores spread) and a correction bias drawn
    0.1 N(0, 1) (a fresh model's is 0), so that the choice with the bias is not the choice by score."""
    make_plain = _llama_like(cls_name, model_cls, vocab=FAMILY_V, **kw)

    def make(tie=False, **over):
        model = make_plain(tie=tie, **over)
        with torch.no_grad():
            for name, mod in model.named_modules():
                if name.endswith(".gate"):  # the routers (the dense MLPs' are gate_proj)
                    mod.weight.mul_(5.0)
            for name, t in [*model.named_buffers(), *model.named_parameters()]:  # Ernie's is a parameter
                if name.endswith("e_score_correction_bias"):
                    t.copy_(0.1 * torch.randn(t.shape))
        return model

    return make


MLA = dict(  # DeepSeek's latent attention at a tiny size, all layers dense
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    first_k_dense_replace=2,
    num_key_value_heads=4,
)
MLA_MOE = {**MLA, **DS_MOE, "first_k_dense_replace": 1}  # block 0 dense, block 1 MoE
MLA_YARN = dict(  # YaRN with mscale_all_dim: RoPE tables x its attention factor, the scores x m^2
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 8,
        "mscale": 0.7,
        "mscale_all_dim": 1.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
)
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8)
GDN_ATTN = ["linear_attention", "full_attention"]

# name -> (factory, kwargs): each a model transformers builds; the variants cover the features
FAMILY_CASES = {
    "opt": (_opt, {}),
    "opt-untied-gelu-nobias": (_opt, {"tie": False, "activation_function": "gelu", "enable_bias": False}),
    "gpt_bigcode-mqa": (_bigcode, {}),
    "gpt_bigcode-mqa-untied-gelu": (_bigcode, {"tie": False, "activation_function": "gelu"}),
    "granite": (_family_like("Granite", num_key_value_heads=2, **GRANITE_MULT), {}),
    "granite-tied-biases": (
        _family_like("Granite", attention_bias=True, mlp_bias=True, **GRANITE_MULT),
        {"tie": True},
    ),
    "phi-partial-rotary": (_family_like("Phi", resid_pdrop=0.0, embd_pdrop=0.0), {}),
    "phi-gqa-tied-quarter-rotary": (
        _family_like(
            "Phi",
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        ),
        {"tie": True},
    ),
    "gptj-rotary8": (_gptj, {}),
    "gptj-rotary16-tied-relu": (_gptj, {"tie": True, "rotary_dim": 16, "activation_function": "relu"}),
    "cohere": (
        _family_like("Cohere", num_key_value_heads=2, logit_scale=0.5, pad_token_id=0, bos_token_id=1),
        {"tie": True},
    ),
    "cohere-untied-bias": (
        _family_like("Cohere", logit_scale=2.0, attention_bias=True, pad_token_id=0, bos_token_id=1),
        {},
    ),
    "falcon-gqa": (_falcon, {"num_kv_heads": 2}),
    "falcon-mha-untied-bias-relu": (_falcon, {"tie": False, "num_kv_heads": 4, "bias": True, "activation": "relu"}),
    "mixtral-top2": (
        _family_like(
            "Mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=48
        ),
        {},
    ),
    "mixtral-tied-top1-window": (
        _family_like("Mixtral", num_key_value_heads=4, num_local_experts=3, num_experts_per_tok=1, sliding_window=8),
        {"tie": True},
    ),
    "qwen2_moe-shared": (_family_like("Qwen2Moe", num_key_value_heads=2, **QWEN2_MOE), {}),
    "qwen2_moe-shared-normtopk-tied": (
        _family_like("Qwen2Moe", num_key_value_heads=4, norm_topk_prob=True, **QWEN2_MOE),
        {"tie": True},
    ),
    "qwen3_moe": (_family_like("Qwen3Moe", num_key_value_heads=2, head_dim=16, **MOE), {}),
    "qwen3_moe-normtopk-tied": (_family_like("Qwen3Moe", norm_topk_prob=True, head_dim=24, **MOE), {"tie": True}),
    "olmoe": (_family_like("Olmoe", num_key_value_heads=2, pad_token_id=0, eos_token_id=1, **MOE), {}),
    "olmoe-tied-clip-bias-normtopk": (
        _family_like(
            "Olmoe", clip_qkv=0.05, attention_bias=True, norm_topk_prob=True, pad_token_id=0, eos_token_id=1, **MOE
        ),
        {"tie": True},
    ),
    "smollm3-tied": (
        _family_like("SmolLM3", num_key_value_heads=2, no_rope_layer_interval=2, pad_token_id=0, bos_token_id=1),
        {"tie": True},
    ),
    "smollm3-untied-biases": (
        _family_like(
            "SmolLM3", no_rope_layers=[0, 1], attention_bias=True, mlp_bias=True, pad_token_id=0, bos_token_id=1
        ),
        {},
    ),
    "olmo": (_family_like("Olmo", num_key_value_heads=2, pad_token_id=0, eos_token_id=1), {}),
    "olmo-clip-bias": (
        _family_like("Olmo", pad_token_id=0, eos_token_id=1, clip_qkv=0.05, attention_bias=True),
        {},
    ),
    # the families of issue 44: aliases and close kin (windows on inputs longer than 8 tokens)
    "internlm3": (_family_like("InternLM3", "LlamaForCausalLM", num_key_value_heads=2, head_dim=16, **IDS), {}),
    "internlm3-tied-biases": (
        _family_like("InternLM3", "LlamaForCausalLM", attention_bias=True, mlp_bias=True, **IDS),
        {"tie": True},
    ),
    "exaone": (_family_like("Exaone", "LlamaForCausalLM", num_key_value_heads=2, **IDS), {}),
    "seed_oss-biases": (
        _family_like(
            "SeedOss", num_key_value_heads=2, head_dim=24, attention_out_bias=True, mlp_bias=True, **NO_DROP, **IDS
        ),
        {},
    ),
    "ministral-window": (
        _family_like("Ministral", num_key_value_heads=2, head_dim=16, **WINDOWS, **IDS),
        {"tie": True},
    ),
    "helium": (_family_like("Helium", num_key_value_heads=2, head_dim=16, attention_bias=True, **IDS), {}),
    "ernie4_5-bias": (_family_like("Ernie4_5", num_key_value_heads=2, head_dim=16, use_bias=True, **IDS), {}),
    "ernie4_5-tied": (_family_like("Ernie4_5", head_dim=24, **IDS), {"tie": True}),
    "olmo3-window": (
        _family_like(
            "Olmo3",
            num_key_value_heads=2,
            **WINDOWS,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 500.0},
            },
            **IDS,
        ),
        {},
    ),
    "exaone4-window": (_family_like("Exaone4", num_key_value_heads=2, head_dim=24, **WINDOWS, **IDS), {}),
    "exaone4-nowindow-tied": (
        _family_like("Exaone4", num_key_value_heads=4, sliding_window=None, layer_types=["full_attention"] * 2, **IDS),
        {"tie": True},
    ),
    "cohere2-window": (
        _family_like("Cohere2", num_key_value_heads=2, logit_scale=0.5, **WINDOWS, **IDS),
        {"tie": True},
    ),
    "vaultgemma-window": (
        _family_like(
            "VaultGemma",
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            **WINDOWS,
            **IDS,
        ),
        {"tie": True},
    ),
    "arcee-relu2": (_family_like("Arcee", num_key_value_heads=2, head_dim=16, **IDS), {}),
    "arcee-relu2-tied-biases": (_family_like("Arcee", attention_bias=True, mlp_bias=True, **IDS), {"tie": True}),
    "nemotron": (_family_like("Nemotron", num_key_value_heads=2, head_dim=16, **IDS), {}),
    "nemotron-tied-biases-rotary-quarter": (
        _family_like(
            "Nemotron",
            head_dim=16,
            num_key_value_heads=4,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
            **IDS,
        ),
        {"tie": True},
    ),
    "hunyuan_v1_dense": (_family_like("HunYuanDenseV1", num_key_value_heads=2, head_dim=16, **IDS), {}),
    "hunyuan_v1_dense-tied-bias": (
        _family_like("HunYuanDenseV1", num_key_value_heads=4, head_dim=24, attention_bias=True, **IDS),
        {"tie": True},
    ),
    "glm": (_family_like("Glm", num_key_value_heads=2, head_dim=16, pad_token_id=0), {}),
    "glm-tied-nobias-rotary-quarter": (
        _family_like(
            "Glm",
            head_dim=24,
            num_key_value_heads=4,
            attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
            pad_token_id=0,
        ),
        {"tie": True},
    ),
    "glm4": (_family_like("Glm4", num_key_value_heads=2, head_dim=16, pad_token_id=0), {}),
    "glm4-tied-nobias": (
        _family_like("Glm4", num_key_value_heads=4, head_dim=24, attention_bias=False, pad_token_id=0),
        {"tie": True},
    ),
    "ministral3-yarn-query-scale": (
        _family_like(
            "Ministral3",
            num_key_value_heads=2,
            head_dim=16,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 8,  # positions 8.. get a query scale > 1
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.5,
            },
            **IDS,
        ),
        {},
    ),
    "apertus-xielu": (_family_like("Apertus", num_key_value_heads=2, head_dim=16, **LLAMA3, **IDS), {}),
    "apertus-xielu-tied-bias": (_family_like("Apertus", attention_bias=True, **LLAMA3, **IDS), {"tie": True}),
    "phimoe-sparsemixer": (
        _family_like(
            "Phimoe", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=48, **IDS
        ),
        {},
    ),
    "phimoe-sparsemixer-tied-biases-jitter": (
        _family_like(
            "Phimoe",
            num_key_value_heads=4,
            num_local_experts=3,
            num_experts_per_tok=2,
            intermediate_size=48,
            attention_bias=True,
            lm_head_bias=True,
            router_jitter_noise=0.3,
            **IDS,
        ),
        {"tie": True},
    ),
    "stablelm-qkv-bias": (_family_like("StableLm", num_key_value_heads=2, use_qkv_bias=True, **IDS), {}),
    "granitemoe": (_family_like("GraniteMoe", num_key_value_heads=2, **GRANITE_MOE, **GRANITE_MULT, **IDS), {}),
    "granitemoe-tied-bias-top1": (
        _family_like("GraniteMoe", attention_bias=True, **{**GRANITE_MOE, "num_experts_per_tok": 1}, **IDS),
        {"tie": True},
    ),
    "granitemoeshared": (
        _family_like("GraniteMoeShared", num_key_value_heads=2, shared_intermediate_size=40, **GRANITE_MOE, **IDS),
        {},
    ),
    "granitemoeshared-tied-mult": (
        _family_like("GraniteMoeShared", shared_intermediate_size=24, **GRANITE_MOE, **GRANITE_MULT, **IDS),
        {"tie": True},
    ),
    "dbrx-clip": (_dbrx, {"attn": {"clip_qkv": 0.2}}),  # experts stacked [E * f, d]
    "dbrx-mha-top1-clip8": (
        _dbrx,
        {"attn": {"kv_n_heads": 4, "clip_qkv": 8.0}, "ffn": {"moe_num_experts": 3, "moe_top_k": 1}},
    ),
    "gpt_oss-window-yarn": (_gpt_oss, {}),
    "gpt_oss-tied-top1-nobias": (
        _gpt_oss,
        {"tie": True, "num_key_value_heads": 4, "head_dim": 24, "num_local_experts": 3, "num_experts_per_tok": 1}
        | {"attention_bias": False},
    ),
    # Llama 4: block 0 dense (intermediate_size_mlp), RoPE, chunks of 8, q/k L2 norms; block 1 MoE, no RoPE,
    # its queries scaled by position (floor_scale 4: from position 3 on)
    "llama4_text-dense-moe-chunked": (
        _family_like("Llama4Text", "Llama4ForCausalLM", **LLAMA4, no_rope_layers=[1, 0], **IDS),
        {},
    ),
    "llama4_text-tied-top2-bias-llama3": (
        _family_like(
            "Llama4Text",
            "Llama4ForCausalLM",
            **{**LLAMA4, "num_key_value_heads": 4, "head_dim": 24, "num_local_experts": 4, "num_experts_per_tok": 2},
            moe_layers=[0, 1],
            no_rope_layers=[0, 1],
            attention_bias=True,
            use_qk_norm=False,
            **LLAMA3,
            **IDS,
        ),
        {"tie": True},
    ),
    "glm4_moe-dense1-groups-qknorm": (
        _ds_moe("Glm4Moe", num_key_value_heads=2, n_routed_experts=8, n_shared_experts=2, use_qk_norm=True, **DS_MOE),
        {},
    ),
    "glm4_moe-tied-bias-scaled-allmoe": (
        _ds_moe(
            "Glm4Moe",
            num_key_value_heads=4,
            n_routed_experts=8,
            n_shared_experts=1,
            attention_bias=True,
            routed_scaling_factor=2.5,
            first_k_dense_replace=0,
            **DS_MOE,
        ),
        {"tie": True},
    ),
    "dots1-dense1-groups": (
        _ds_moe(
            "Dots1",
            num_key_value_heads=2,
            head_dim=16,
            n_routed_experts=8,
            n_shared_experts=2,
            first_k_dense_replace=1,
            **DS_MOE,
        ),
        {},
    ),
    "dots1-tied-bias-window-normtopk-allmoe": (
        _ds_moe(
            "Dots1",
            num_key_value_heads=4,
            n_routed_experts=8,
            n_shared_experts=1,
            first_k_dense_replace=0,
            attention_bias=True,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            **WINDOWS,
            **DS_MOE,
        ),
        {"tie": True},
    ),
    "minimax_m2-partial-rotary": (
        _ds_moe(
            "MiniMaxM2",
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=32,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            **IDS,
        ),
        {},
    ),
    "minimax_m2-tied-top3": (
        _ds_moe("MiniMaxM2", num_key_value_heads=4, head_dim=24, num_local_experts=6, num_experts_per_tok=3, **IDS),
        {"tie": True},
    ),
    "ernie4_5_moe-dense1-shared2": (
        _ds_moe(
            "Ernie4_5_Moe",
            num_key_value_heads=2,
            head_dim=16,
            moe_num_experts=8,
            moe_k=2,
            moe_num_shared_experts=2,
            intermediate_size=96,
            moe_intermediate_size=32,
            **IDS,
        ),
        {},
    ),
    "ernie4_5_moe-tied-biases-allmoe": (
        _ds_moe(
            "Ernie4_5_Moe",
            moe_num_experts=6,
            moe_k=3,
            moe_num_shared_experts=1,
            moe_layer_start_index=0,
            use_bias=True,
            moe_intermediate_size=32,
            **IDS,
        ),
        {"tie": True},
    ),
    "exaone_moe-dense1-window": (
        _ds_moe(
            "ExaoneMoe", num_key_value_heads=2, head_dim=16, num_experts=8, num_shared_experts=2, **WINDOWS, **DS_MOE
        ),
        {},
    ),
    "exaone_moe-tied-fullfirst-allmoe": (
        _ds_moe(
            "ExaoneMoe",
            num_key_value_heads=4,
            num_experts=6,
            sliding_window=8,
            layer_types=["full_attention", "sliding_attention"],
            mlp_layer_types=["sparse"] * 2,
            **DS_MOE,
        ),
        {"tie": True},
    ),
    "hunyuan_v1_moe-top2": (
        _family_like(
            "HunYuanMoEV1", num_key_value_heads=2, head_dim=16, num_experts=4, moe_topk=2, intermediate_size=48, **IDS
        ),
        {},
    ),
    "hunyuan_v1_moe-tied-bias-top1": (
        _family_like("HunYuanMoEV1", head_dim=24, num_experts=3, moe_topk=1, attention_bias=True, **IDS),
        {"tie": True},
    ),
    # multi-head latent attention (nn/mla.py), every layer dense (first_k_dense_replace = the layers)
    "deepseek_v2-mla": (_family_like("DeepseekV2", **MLA, **IDS), {}),
    "deepseek_v2-mla-noqlora-biases-tied": (
        _family_like("DeepseekV2", **{**MLA, "q_lora_rank": None}, attention_bias=True, mlp_bias=True, **IDS),
        {"tie": True},
    ),
    "deepseek_v3-mla-yarn": (_family_like("DeepseekV3", **MLA, **MLA_YARN, **IDS), {}),
    "deepseek_v3-mla-halves-tied-bias": (
        _family_like("DeepseekV3", **MLA, rope_interleave=False, attention_bias=True, **IDS),
        {"tie": True},
    ),
    # MLA with DeepSeek-style MoE: V3's sigmoid routing with its correction bias, V2's softmax routing
    "deepseek_v3-mla-moe-dense1": (_ds_moe("DeepseekV3", **MLA_MOE, n_routed_experts=8, n_shared_experts=2), {}),
    "deepseek_v3-mla-moe-tied-bias-allmoe": (
        _ds_moe("DeepseekV3", **{**MLA_MOE, "first_k_dense_replace": 0}, n_routed_experts=8, attention_bias=True),
        {"tie": True},
    ),
    "deepseek_v2-mla-moe-groups-dense1": (
        _ds_moe(
            "DeepseekV2", **MLA_MOE, n_routed_experts=8, topk_method="group_limited_greedy", routed_scaling_factor=2.0
        ),
        {},
    ),
    "deepseek_v2-mla-moe-greedy-tied-allmoe": (
        _ds_moe("DeepseekV2", **{**MLA_MOE, "first_k_dense_replace": 0, "q_lora_rank": None}, n_routed_experts=6),
        {"tie": True},
    ),
    # hybrids of issue 44: LFM2's short-convolution layers beside attention layers (MLP 2/3 x 160 rounded up to 16)
    "lfm2-conv-attn": (
        _family_like(
            "Lfm2", num_key_value_heads=2, layer_types=["conv", "full_attention"], block_multiple_of=16, **IDS
        ),
        {},
    ),
    "lfm2-tied-bias-kernel4": (
        _family_like(
            "Lfm2",
            num_key_value_heads=4,
            layer_types=["full_attention", "conv"],
            conv_bias=True,
            conv_L_cache=4,
            block_auto_adjust_ff_dim=False,
            **IDS,
        ),
        {"tie": True},
    ),
    # Qwen3-Next: Gated DeltaNet layers beside gated attention (partial RoPE, 1 + w norms), MoE with a shared expert
    "qwen3_next-gdn-moe": (
        _family_like("Qwen3Next", num_key_value_heads=2, head_dim=16, layer_types=GDN_ATTN, **GDN, **QWEN2_MOE),
        {},
    ),
    "qwen3_next-tied-bias-interval2": (
        _family_like(
            "Qwen3Next",
            head_dim=24,
            attention_bias=True,
            norm_topk_prob=False,
            full_attention_interval=2,
            **{**GDN, "linear_num_value_heads": 2, "linear_conv_kernel_dim": 3},
            **QWEN2_MOE,
        ),
        {"tie": True},
    ),
    # Qwen3.5's text decoder: as Qwen3-Next with a dense MLP and split mixer projections (MRoPE keys: text positions)
    "qwen3_5_text-gdn": (
        _family_like(
            "Qwen3_5Text",
            "Qwen3_5ForCausalLM",
            num_key_value_heads=2,
            head_dim=16,
            layer_types=GDN_ATTN,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0],
                "mrope_interleaved": True,
            },
            **GDN,
        ),
        {},
    ),
    "qwen3_5_text-tied-bias-interval2": (
        _family_like(
            "Qwen3_5Text",
            "Qwen3_5ForCausalLM",
            head_dim=24,
            attention_bias=True,
            full_attention_interval=2,
            **{**GDN, "linear_num_value_heads": 2, "linear_conv_kernel_dim": 3},
        ),
        {"tie": True},
    ),
    "qwen3_5_moe_text-tied": (  # Qwen3.5-MoE's text decoder: Qwen3-Next's MoE (top-k always renormalised)
        _family_like("Qwen3_5MoeText", "Qwen3_5MoeForCausalLM", head_dim=16, layer_types=GDN_ATTN, **GDN, **QWEN2_MOE),
        {"tie": True},
    ),
}


NEMOTRON_H = dict(  # Nemotron-H: each block one norm and one mixer (Mamba-2, attention, ReLU^2 MLP)
    vocab_size=FAMILY_V,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    mamba_num_heads=4,
    mamba_head_dim=16,
    ssm_state_size=8,
    n_groups=2,
    conv_kernel=4,
    chunk_size=8,  # transformers' chunked scan over several chunks of the 20 tokens
    max_position_embeddings=64,
)


def _nemotron_h(tie=False, blocks=("linear_attention", "full_attention", "mlp", "linear_attention"), **over):
    kw = {**NEMOTRON_H, **over, "layers_block_type": list(blocks)}
    return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**kw, tie_word_embeddings=tie))


def _bloom(tie=True, **over):
    kw = dict(vocab_size=FAMILY_V, hidden_size=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return transformers.BloomForCausalLM(transformers.BloomConfig(**{**kw, **over}, tie_word_embeddings=tie))


FAMILY_CASES["nemotron_h"] = (_nemotron_h, {})  # issue 44's hybrids (Mamba-2 mixers: nn/mamba.py)
FAMILY_CASES["nemotron_h-tied-biases-2"] = (
    _nemotron_h,
    {"tie": True, "blocks": ("full_attention", "linear_attention"), "n_groups": 1, "use_bias": True}
    | {"use_conv_bias": False, "mlp_bias": True},
)

GRANITE_HYBRID = dict(  # Granite 4 (dense): a Mamba-2 mixer or attention, then the shared MLP; Granite's scalars
    num_key_value_heads=2,
    shared_intermediate_size=80,
    num_local_experts=0,
    mamba_n_heads=8,
    mamba_d_state=8,
    mamba_n_groups=2,
    mamba_chunk_size=8,
    **GRANITE_MULT,
    **IDS,
)
FAMILY_CASES["granitemoehybrid"] = (
    _family_like("GraniteMoeHybrid", **GRANITE_HYBRID, layer_types=["linear_attention", "full_attention"] * 2),
    {"num_hidden_layers": 4},
)
FAMILY_CASES["granitemoehybrid-tied-biases"] = (
    _family_like("GraniteMoeHybrid", **GRANITE_HYBRID, layer_types=["full_attention", "linear_attention"]),
    {"tie": True, "attention_bias": True, "mamba_proj_bias": True, "mamba_n_groups": 1},
)
FALCON_H1 = dict(  # Falcon-H1: a Mamba-2 mixer and attention in parallel, then the MLP; muP scalars away from 1
    num_key_value_heads=2,
    intermediate_size=96,
    mamba_d_ssm=64,
    mamba_n_heads=4,
    mamba_d_state=8,
    mamba_n_groups=2,
    mamba_chunk_size=8,
    key_multiplier=0.7,
    attention_in_multiplier=1.3,
    attention_out_multiplier=0.8,
    ssm_in_multiplier=1.2,
    ssm_out_multiplier=0.9,
    mlp_multipliers=[1.5, 0.6],
    ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3],
    embedding_multiplier=2.0,
    lm_head_multiplier=0.5,
    **IDS,
)
FAMILY_CASES["falcon_h1"] = (_family_like("FalconH1", **FALCON_H1), {})
FAMILY_CASES["falcon_h1-tied-biases-gated-norm"] = (
    _family_like("FalconH1", **FALCON_H1),
    {"tie": True, "attention_bias": True, "mlp_bias": True, "mamba_proj_bias": True, "projectors_bias": True}
    | {"mamba_rms_norm": True, "mamba_norm_before_gate": False, "mamba_n_groups": 1},
)
FAMILY_CASES["falcon_h1-norm-before-gate"] = (
    _family_like("FalconH1", **FALCON_H1),
    {"mamba_rms_norm": True, "mamba_norm_before_gate": True, "mamba_conv_bias": False},
)


def _mamba2(tie=False, **over):
    kw = dict(vocab_size=FAMILY_V, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=8)
    kw.update(n_groups=2, chunk_size=8, expand=2, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**{**kw, **over}, tie_word_embeddings=tie))


# Mamba-2 (every block a Mamba-2 mixer, no attention, no MLP): its width growth gates nothing (the wider mixers
# are exact at every gate), so it is not a row of test_architectures' round trip (tests/test_mamba.py)
MIXER_CASES = {"mamba2": (_mamba2, {}), "mamba2-tied-biases": (_mamba2, {"tie": True, "use_bias": True, "n_groups": 1})}


def _mamba(tie=True, **over):
    kw = dict(vocab_size=FAMILY_V, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4)
    kw.update(bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.MambaForCausalLM(transformers.MambaConfig(**{**kw, **over}, tie_word_embeddings=tie))


MIXER_CASES["mamba"] = (_mamba, {})  # Mamba (1): tied by default
MIXER_CASES["mamba-untied-biases-rank8"] = (_mamba, {"tie": False, "use_bias": True, "time_step_rank": 8})
CASES = {**ARCH_CASES, **FAMILY_CASES}
assert len(CASES) == len(ARCH_CASES) + len(FAMILY_CASES), "a name in both tables"


def hf_logits(model, x=None):
    """transformers' logits on ``x`` (default the table's fixed batch for this model, ``inputs_for``)."""
    with torch.no_grad():
        return model(inputs_for(model) if x is None else x).logits.float()


def rel(a, b):
    return float((a - b).abs().max() / b.std())


def inputs_for(model) -> torch.Tensor:
    """The fixed token batch for a model of this table: ``X`` or ``FAMILY_X`` by its vocabulary."""
    return FAMILY_X if model.config.vocab_size == FAMILY_V else X


def make_source(name, path):
    """Row ``name`` built (seed 0), its norm gains and biases perturbed, saved to ``path``."""
    make, kw = CASES[name]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval()
    model.save_pretrained(path)
    return model
