"""The families of issue 31, what is particular to each: its rows of the architecture table
(tests/arch_cases.py, vocabulary 256) go through test_architectures.py's forward, round trip and
recipes like every row; here, what each family carries, grows specially or refuses, with its one
line, and BLOOM (ALiBi, its embedding norm), which has its own cases.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.grow import recipes  # noqa: E402
from growtool.grow.engine import grow_tensor  # noqa: E402
from growtool.grow.plan import build_plan  # noqa: E402
from growtool.io import checkpoint  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.nn.families import arch_of  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import (  # noqa: E402
    CASES,
    GRANITE_MULT,
    QWEN2_MOE,
    _bigcode,
    _bloom,
    _falcon,
    _opt,
    hf_logits,
    make_source,
    rel,
)
from arch_cases import FAMILY_T as T  # noqa: E402
from arch_cases import FAMILY_V as V  # noqa: E402
from arch_cases import FAMILY_X as X  # noqa: E402
from arch_cases import _family_like as _llama_like  # noqa: E402
from helpers import cli, perturbed, verify_json  # noqa: E402


def _refused(hf: dict, match: str):
    with pytest.raises(GrowError, match=match):
        ModelConfig.from_hf(hf)


# ---- OPT ------------------------------------------------------------------------------------


def test_opt_positions_read_rows_offset_by_two_and_the_eps_stays(tmp_path):
    """OPT's position table has max_position_embeddings + 2 rows and position p reads row p + 2;
    its LayerNorm eps (1e-5) is no config key, so growth keeps it and scales the residual."""
    model = make_source("opt", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.get("model.decoder.embed_positions.weight").shape == (66, 64)
    with torch.no_grad():  # rows 0 and 1 matter to no position: changing them changes nothing
        model.model.decoder.embed_positions.weight[:2] += 1.0
    assert rel(ck.model()(X).detach(), hf_logits(model)) <= 1e-5
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g.safetensors")
    assert "sqrt(D/d) x R(0.8165)" in r.stderr, r.stderr
    assert checkpoint.load(tmp_path / "g.safetensors").config.norm_eps == 1e-5


@pytest.mark.parametrize(
    "over, match",
    [
        ({"do_layer_norm_before": False}, "do_layer_norm_before=false"),
        ({"word_embed_proj_dim": 32}, "word_embed_proj_dim 32 different from hidden_size 64"),
        ({"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine=false"),
        ({"_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
    ],
)
def test_opt_refuses_what_it_cannot_grow_with_one_line(over, match, tmp_path):
    cfg = _opt().config.to_dict()
    _refused({**cfg, **over}, match)
    if "_remove" not in match:  # the CLI: one line, exit 2, nothing written
        _opt(**over).save_pretrained(tmp_path / "src")
        r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g.safetensors")
        assert r.exit_code == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "g.safetensors").exists()


# ---- OLMo -----------------------------------------------------------------------------------


def test_olmo_layernorm_without_parameters_grows_by_scaling_readers(tmp_path):
    """OlmoLayerNorm has no gain, no bias and eps 1e-5 in code: the residual is carried as
    sqrt(D/d) R[h; 0] (so its variance and the eps stay the old ones) and every reader of a norm
    takes sqrt(d/D); the grown checkpoint has no norm tensors at all, as the source. clip_qkv
    bites in this model (the logits change without it), and is carried."""
    model = make_source("olmo-clip-bias", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert not [n for n in ck.names() if "norm" in n]
    unclipped = ck.config.replace(clip_qkv=None)
    with torch.no_grad():
        assert rel(LM.from_tensors(unclipped, {n: ck.get(n) for n in ck.names()})(X), hf_logits(model)) > 1e-2
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g.safetensors")
    assert r.exit_code == 0 and "sqrt(D/d) x R(0.8165)" in r.stderr, r.stderr
    ops = dict((pat, op) for pat, _, _, op in build_plan(ck.config, recipes.load("srio"), 96).rows())
    assert ops["model.layers.{i}.self_attn.q_proj.weight"].startswith("x 0.816497 (norm without gain)")
    assert ops["lm_head.weight"].startswith("x 0.816497 (norm without gain)")
    g = checkpoint.load(tmp_path / "g.safetensors")
    assert g.config.norm_eps == 1e-5 and g.config.clip_qkv == 0.05


def test_olmo_tied_is_refused_with_one_line(tmp_path):
    """Tied, no exact growth exists: the head (the embedding) reads the norm's output, which must be
    scaled sqrt(D/d) over the grown width, while the embedding written into the residual must not."""
    make_source_tied = CASES["olmo"][0]
    torch.manual_seed(0)
    make_source_tied(tie=True).save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g.safetensors")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "olmo with tied embeddings cannot grow exactly" in r.stderr and "pass --untie" in r.stderr
    assert not (tmp_path / "g.safetensors").exists()


def test_olmo_tied_grows_untied_with_untie(tmp_path):
    """--untie: the tied head becomes a tensor of its own (the untied map then applies): gate 0
    verifies, and fold --alpha 0 loads as an untied OlmoForCausalLM with the source's logits."""
    torch.manual_seed(0)
    model = perturbed(CASES["olmo"][0](tie=True)).eval()
    model.save_pretrained(tmp_path / "src")
    grown = tmp_path / "g.safetensors"
    assert cli("expand", tmp_path / "src", "--width", 96, "--untie", "-q", "-o", grown).exit_code == 0
    code, rep = verify_json(tmp_path / "src", grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    assert cli("fold", grown, "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert type(back) is type(model) and back.config.tie_word_embeddings is False
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


# ---- GPT-BigCode ----------------------------------------------------------------------------


def test_bigcode_multi_query_keeps_one_kv_head_and_grows_query_heads(tmp_path):
    """Multi-query attention: c_attn is [Q (heads x hd) | K (hd) | V (hd)]; growth 64 -> 96 adds
    two query heads that read the same key/value head, which stays one (the folded config too)."""
    make_source("gpt_bigcode-mqa", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.kv_heads == 1 and ck.get("transformer.h.0.attn.c_attn.weight").shape == (64 + 32, 64)
    for recipe in ("srio", "copy"):
        plan = build_plan(ck.config, recipes.load(recipe), 96)
        assert (plan.cfg.heads, plan.cfg.kv_heads) == (6, 1)
        assert plan.shapes["transformer.h.0.attn.c_attn.weight"] == (96 + 32, 96)
        assert plan.units[0]["q"].n_new == 6 and plan.units[0]["kv"].added == 0
    assert cli("expand", tmp_path / "src", "--width", 128, "--heads", 8, "-o", tmp_path / "g", "-q").exit_code == 0
    assert json.loads((tmp_path / "g" / "config.json").read_text())["multi_query"] is True
    assert verify_json(tmp_path / "src", tmp_path / "g")[0] == 0


@pytest.mark.parametrize(
    "over, match",
    [
        ({"multi_query": False}, "multi_query=false"),
        ({"scale_attn_weights": False}, "scale_attn_weights=false"),
        ({"add_cross_attention": True}, "add_cross_attention"),
    ],
)
def test_bigcode_refuses_what_it_cannot_grow_with_one_line(over, match):
    _refused({**_bigcode().config.to_dict(), **over}, match)


# ---- Granite --------------------------------------------------------------------------------


def test_granite_multipliers_are_read_and_carried(tmp_path):
    """Granite's four scalars (embeddings x m, sublayer outputs x m, attention scale, logits / s)
    each change the function, and are carried unchanged through growth and fold (they do not
    depend on the width)."""
    model = make_source("granite", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    tensors = {n: ck.get(n) for n in ck.names()}
    with torch.no_grad():
        for key, value in GRANITE_MULT.items():
            assert getattr(ck.config, key) == value
            plain = LM.from_tensors(ck.config.replace(**{key: None}), tensors)(X)
            assert rel(plain, hf_logits(model)) > 1e-3, key
    assert cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g", "-q").exit_code == 0
    assert cli("fold", tmp_path / "g", "--alpha", 0, "-o", tmp_path / "f").exit_code == 0
    cfg = json.loads((tmp_path / "f" / "config.json").read_text())
    assert {k: cfg[k] for k in GRANITE_MULT} == GRANITE_MULT and cfg["hidden_size"] == 96


# ---- Phi ------------------------------------------------------------------------------------


def test_phi_one_norm_feeds_attention_and_mlp_and_the_head_has_a_bias(tmp_path):
    """Phi-1/2: one input_layernorm read by the attention and the MLP in parallel, an lm_head bias
    (kept by growth, also when the head's weight is the tied embedding), partial rotary."""
    make_source("phi-gqa-tied-quarter-rotary", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert "model.layers.0.post_attention_layernorm.weight" not in ck.names()
    assert ck.config.rotary_dim == 4 and ck.config.tie and ck.config.parallel
    assert cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g.safetensors", "-q").exit_code == 0
    g = checkpoint.load(tmp_path / "g.safetensors")
    assert torch.equal(g.get("lm_head.bias"), ck.get("lm_head.bias")) and float(ck.get("lm_head.bias").abs().max()) > 0
    _refused({**_llama_like("Phi")().config.to_dict(), "qk_layernorm": True}, "qk_layernorm=true")


# ---- GPT-J ----------------------------------------------------------------------------------


def test_gptj_rotary_turns_adjacent_pairs(tmp_path):
    """GPT-J rotates pairs of adjacent dims (rotate_every_two) over the first rotary_dim dims of
    each head: read as growtool's usual half-split rotation the logits are wrong, so the parity
    test above would fail without ``rope_interleaved``; rotary_dim is carried (head_dim is kept)."""
    model = make_source("gptj-rotary8", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.rotary_dim == 8 and ck.config.head_dim == 16
    halves = dataclasses.replace(arch_of(ck.config).features, rope_interleaved=False)
    tensors = {n: ck.get(n) for n in ck.names()}
    m = LM.from_tensors(ck.config, tensors)
    for b in m.blocks:
        b.features = halves
    with torch.no_grad():
        assert rel(m(X), hf_logits(model)) > 1e-3
    assert cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g", "-q").exit_code == 0
    assert json.loads((tmp_path / "g" / "config.json").read_text())["rotary_dim"] == 8


# ---- Cohere ---------------------------------------------------------------------------------


def test_cohere_layernorm_without_bias_interleaved_rope_and_logit_scale(tmp_path):
    """Cohere: LayerNorm gains without biases (none stored, none grown), one norm for the parallel
    attention and MLP, RoPE on adjacent pairs, logits x logit_scale (carried)."""
    model = make_source("cohere", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert not [n for n in ck.names() if n.endswith("layernorm.bias") or n == "model.norm.bias"]
    assert ck.config.tie and ck.config.logit_scale == 0.5
    with torch.no_grad():
        unscaled = LM.from_tensors(ck.config.replace(logit_scale=None), {n: ck.get(n) for n in ck.names()})(X)
    assert rel(unscaled, 2 * hf_logits(model)) <= 1e-5
    assert cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g", "-q").exit_code == 0
    assert json.loads((tmp_path / "g" / "config.json").read_text())["logit_scale"] == 0.5
    _refused({**model.config.to_dict(), "use_qk_norm": True}, "use_qk_norm=true")


# ---- Falcon ---------------------------------------------------------------------------------


def test_falcon_fused_qkv_is_grown_by_whole_kv_groups(tmp_path):
    """Falcon's new decoder architecture fuses q, k and v per KV group: [q_1 .. q_r k v], r query
    heads per group. Growth adds whole groups (unit kind ``qkvg``); the old groups' rows are kept
    bit for bit, the new ones sit after them."""
    make_source("falcon-gqa", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    plan = build_plan(ck.config, recipes.load("srio"), 128)
    assert (plan.cfg.heads, plan.cfg.kv_heads) == (8, 4)
    name = "transformer.h.0.self_attention.query_key_value.weight"
    w_old, w_new = ck.get(name), grow_tensor(name, plan, ck.get)
    assert w_old.shape == (2 * 4 * 16, 64) and w_new.shape == (4 * 4 * 16, 128)
    assert torch.equal(w_new[: 2 * 4 * 16, :64], w_old)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"new_decoder_architecture": False}, "without new_decoder_architecture"),
        ({"parallel_attn": False}, "parallel_attn=false"),
        ({"num_ln_in_parallel_attn": 1}, "num_ln_in_parallel_attn=1"),
        ({"alibi": True}, "alibi"),
    ],
)
def test_falcon_refuses_what_it_cannot_grow_with_one_line(over, match):
    _refused({**_falcon().config.to_dict(), **over}, match)
    hf = _falcon().config.to_dict()
    del hf["new_decoder_architecture"]  # absent means the old layout (transformers' default)
    _refused(hf, "without new_decoder_architecture")


# ---- mixtures of experts --------------------------------------------------------------------


def routes(model: LM, x: torch.Tensor, alpha=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per block: (the experts each token is sent to, in order; their routing weights)."""
    cfg, out = model.cfg, []
    hooks = [
        b.slot["router"].register_forward_hook(
            lambda m, i, o: out.append(torch.topk(torch.softmax(o.float(), -1), cfg.top_k, -1)[::-1])
        )
        for b in model.blocks
    ]
    with torch.no_grad():
        model(x, alpha=alpha)
    for h in hooks:
        h.remove()
    return [(idx, w / w.sum(-1, keepdim=True) if cfg.norm_topk else w) for idx, w in out]


@pytest.mark.parametrize("name", ["mixtral-top2", "qwen2_moe-shared", "qwen3_moe", "olmoe"])
def test_moe_tokens_go_to_the_same_experts_after_growth(name, tmp_path):
    """Gate 0: every router reads the same normed residual, so every token is sent to the same
    experts with the same weights, in every block; every expert's FFN (and the router, and
    the shared expert with its gate) grew with the width, and --ffn grows the expert FFNs."""
    make_source(name, tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    src = ck.model()
    x = torch.randint(V, (4, T), generator=torch.Generator().manual_seed(7))
    before = routes(src, x)
    assert len({int(e) for idx, _ in before for e in idx.flatten()}) == ck.config.experts  # every expert used
    for ffn in (None, 2 * ck.config.ffn):
        out = tmp_path / f"g{ffn}.safetensors"
        args = ("--ffn", ffn) if ffn else ()
        assert cli("expand", tmp_path / "src", "--width", 96, *args, "-o", out, "-q").exit_code == 0
        g = checkpoint.load(out)
        f0 = ck.config.ffn
        assert (
            g.config.ffn == (ffn or f0 * 3 // 2) and g.config.base_ffn == f0 and g.config.experts == ck.config.experts
        )
        e0 = arch_of(g.config).block.format(i=0) + arch_of(g.config).modules["experts"] + ".3."
        assert g.get(e0 + arch_of(g.config).modules["e_down"] + ".weight").shape == (96, g.config.ffn)
        grown = g.model()
        after = routes(grown, x, alpha=0.0)
        for (i0, w0), (i1, w1) in zip(before, after, strict=True):
            assert torch.equal(i0, i1)
            assert float((w0 - w1).abs().max()) <= 1e-5
        with torch.no_grad():
            assert rel(grown(x, alpha=0.0), src(x)) <= 1e-4
    if ck.config.shared_ffn:  # the shared expert grew too, its new neurons behind the gate
        assert (g.config.shared_ffn, g.config.base_shared_ffn) == (120, 80)
        assert g.get("model.layers.0.mlp.shared_expert.up_proj.weight").shape == (120, 96)
        assert g.get("model.layers.0.mlp.shared_expert_gate.weight").shape == (1, 96)


def test_moe_bf16_sharded_folder_as_transformers_writes_it(tmp_path):
    """A bf16 Qwen2-MoE saved in shards by transformers: read, grown to float32, verified."""
    make, kw = CASES["qwen2_moe-shared"]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "src", max_shard_size="100KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").exists()
    ck = checkpoint.load(tmp_path / "src")
    assert ck.main_dtype() == torch.bfloat16
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.float32).eval()
    assert rel(ck.model()(X).detach(), hf_logits(ref)) <= 1e-5
    g = tmp_path / "g"
    assert cli("expand", tmp_path / "src", "--width", 96, "--dtype", "float32", "-o", g, "-q").exit_code == 0
    assert verify_json(tmp_path / "src", g)[0] == 0


@pytest.mark.parametrize(
    "over, match", [({"decoder_sparse_step": 2}, "decoder_sparse_step"), ({"mlp_only_layers": [0]}, "mlp_only_layers")]
)
def test_qwen_moe_with_dense_layers_is_refused_with_one_line(over, match):
    _refused({**_llama_like("Qwen2Moe", **QWEN2_MOE)().config.to_dict(), **over}, match)


# ---- SmolLM3 --------------------------------------------------------------------------------


def test_smollm3_layers_without_rope(tmp_path):
    """SmolLM3's no_rope_layers (1: RoPE, 0: none) is read per layer (with RoPE everywhere the
    logits differ), derived from no_rope_layer_interval when absent, and carried through growth."""
    model = make_source("smollm3-tied", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.rope_layers == [1, 0]
    with torch.no_grad():
        everywhere = LM.from_tensors(ck.config.replace(rope_layers=None), {n: ck.get(n) for n in ck.names()})(X)
    assert rel(everywhere, hf_logits(model)) > 1e-3
    hf = model.config.to_dict()
    del hf["no_rope_layers"], hf["layer_types"]
    assert ModelConfig.from_hf({**hf, "num_hidden_layers": 8}).rope_layers == [1, 0] * 4
    assert cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g", "-q").exit_code == 0
    assert json.loads((tmp_path / "g" / "config.json").read_text())["no_rope_layers"] == [1, 0]


# ---- BLOOM ----------------------------------------------------------------------------------


# BLOOM grows by copying at whole factors and by a refit of its embedding norm otherwise (untied, or
# tied with --untie), so it has its own cases rather than CASES' round trip
BLOOM_CASES = {
    "bloom": {},
    "bloom-untied": {"tie": False},
    "bloom-3heads-untied": {"tie": False, "hidden_size": 48, "n_head": 3},
}


def _bloom_source(name, path):
    torch.manual_seed(0)
    model = perturbed(_bloom(**BLOOM_CASES[name])).eval()  # the embedding norm's gain and bias too
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("name", sorted(BLOOM_CASES))
def test_bloom_forward_equals_transformers(name, tmp_path):
    """ALiBi (per-head slopes x key position added to the scores), the LayerNorm on the embeddings,
    BLOOM's own tanh GELU, the MLP of 4 x width; tied and untied."""
    model = _bloom_source(name, tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.ffn == 4 * ck.config.width and ck.config.tie == (name == "bloom")
    assert "transformer.word_embeddings_layernorm.weight" in ck.names()
    with torch.no_grad():
        ours = ck.model()(X)
        assert rel(ours, hf_logits(model)) <= 1e-5
        flat = LM.from_tensors(ck.config, {n: ck.get(n) for n in ck.names()})
        flat.get_submodule("transformer.word_embeddings_layernorm").reset_parameters()
        assert rel(flat(X), hf_logits(model)) > 1e-2  # the embedding norm's perturbed gain and bias matter


def test_alibi_slopes_are_transformers_and_every_old_slope_has_a_place():
    """The slopes of n heads are those of transformers for every n; for every growth n -> m (m >= n)
    each old slope is one of the new ones (``alibi_order`` says where), as its docstring proves."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    from growtool.nn.attention import alibi_order, alibi_slopes

    for n in range(1, 130):
        assert torch.equal(alibi_slopes(n), _get_alibi_slopes(n, "cpu")), n
    assert alibi_order(4, 8) == [1, 3, 5, 7, 0, 2, 4, 6]  # 2^-2, 2^-4, 2^-6, 2^-8 among 2^-1 .. 2^-8
    assert alibi_order(3, 6) == [1, 3, 0, 2, 4, 5]  # [2^-4, 2^-8, 2^-2] among [2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3]
    for n in range(1, 65):
        for m in range(n, 4 * n + 1):
            order = alibi_order(n, m)
            assert sorted(order) == list(range(m))
            old, new = alibi_slopes(n), alibi_slopes(m)[order[:n]]
            assert float(((new - old) / old).abs().max()) <= 2e-6, (n, m)  # float32 powers round


@pytest.mark.parametrize(
    "name, width, order",
    [("bloom", 128, [1, 3, 5, 7]), ("bloom", 192, [1, 3, 5, 7]), ("bloom-3heads-untied", 96, [1, 3, 0])],
)
def test_bloom_grows_by_copying_the_residual(name, width, order, tmp_path):
    """A whole factor k: the residual is copied, z = (h, .., h); the LayerNorm eps is kept; old heads
    go to the positions of their ALiBi slopes when folded. Gate 0 verifies; fold --alpha 0 loads as
    BloomForCausalLM with the source's logits; fold --alpha 1 is growtool's gate-1 forward."""
    model = _bloom_source(name, tmp_path / "src")
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--width", width, "-o", grown)
    k = width // model.config.hidden_size
    assert r.exit_code == 0 and f"copied x{k}, z = (h, .., h)" in r.stderr, r.stderr
    assert f"ALiBi slopes: old heads 0..{len(order) - 1} keep theirs at positions {order}" in r.stderr
    g = checkpoint.load(grown)
    assert g.config.norm_eps == 1e-5 and (g.config.heads, g.config.ffn) == (k * len(order), 4 * width)
    code, rep = verify_json(tmp_path / "src", grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    f0, f1 = tmp_path / "f0", tmp_path / "f1"
    assert cli("fold", grown, "--alpha", 0, "-o", f0).exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(f0).eval()
    assert type(back) is transformers.BloomForCausalLM and back.config.n_head == k * len(order)
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4
    assert cli("fold", grown, "--alpha", 1, "-o", f1).exit_code == 0
    back1 = transformers.AutoModelForCausalLM.from_pretrained(f1).eval()
    with torch.no_grad():
        ours1 = g.model()(X, alpha=1.0)
    assert rel(hf_logits(back1), ours1) <= 1e-5
    assert rel(ours1, hf_logits(model)) > 1e-3  # the open gate really is another function
    from growtool.nn.attention import alibi_order

    H, hd = back.config.n_head, back.config.hidden_size // back.config.n_head
    o = torch.tensor(alibi_order(len(order), H))
    with torch.no_grad():  # the heads put back in growth order: the old heads get other slopes
        for blk in back.transformer.h:
            a = blk.self_attention
            a.query_key_value.weight.copy_(a.query_key_value.weight.view(H, 3 * hd, -1)[o].reshape(3 * H * hd, -1))
            a.query_key_value.bias.copy_(a.query_key_value.bias.view(H, 3 * hd)[o].reshape(-1))
            a.dense.weight.copy_(a.dense.weight.view(-1, H, hd)[:, o].reshape(-1, H * hd))
    assert rel(hf_logits(back), hf_logits(model)) > 1e-3


def test_bloom_tied_non_integer_width_is_refused_with_one_line(tmp_path):
    """Tied, 64 -> 96 has no closed-form exact map (docs/architectures.md): refused, naming --untie."""
    _bloom_source("bloom", tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g.safetensors")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "a tied bloom grows exactly only by a whole factor (64 -> 128, 192, ...), not 64 -> 96" in r.stderr
    assert "pass --untie to grow it to 96 with a head of its own (+24,576 parameters)" in r.stderr
    assert not (tmp_path / "g.safetensors").exists()


@pytest.mark.parametrize(
    "name, width, untie, dtype",
    [
        ("bloom-untied", 96, False, "float32"),
        ("bloom", 96, True, "float32"),
        ("bloom", 80, True, "bfloat16"),
        ("bloom-3heads-untied", 80, False, "float32"),
    ],
)
def test_bloom_grows_any_width_untied_by_refitting_the_embedding_norm(name, width, untie, dtype, tmp_path):
    """Untied (or tied with --untie), any width: the residual takes the LayerNorm map R(sqrt(d/D)) and
    the embedding table is refit row by row under a new embedding norm (gain gamma on old dims, 0 on
    new, bias 0): every row has one norm B and the grown norm gives [C h0; 0] for each token. Gate 0
    verifies; fold --alpha 0 loads as an untied BloomForCausalLM with the source's logits; fold
    --alpha 1 is growtool's gate-1 forward."""
    model = _bloom_source(name, tmp_path / "src")
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--width", width, "--dtype", dtype, "-o", grown, *(["--untie"] * untie))
    assert r.exit_code == 0, r.stderr
    assert "the embeddings' LayerNorm is refit" in r.stderr and ("--untie" in r.stderr) == untie
    g = checkpoint.load(grown)
    d = model.config.hidden_size
    assert not g.config.tie and g.config.norm_eps == pytest.approx(1e-5 * d / width)
    assert g.lineage[-1].get("untie") is (True if untie else None)
    if dtype == "float32":  # the refit itself, on every row of the table
        rows = g.get("transformer.word_embeddings.weight").double()
        norms = rows.norm(dim=1)
        assert float((norms - norms[0]).abs().max() / norms[0]) <= 1e-6  # one norm B for every row
        assert float(rows.mean(1).abs().max() / norms[0]) <= 1e-7  # mean 0
        ln = model.transformer.word_embeddings_layernorm
        with torch.no_grad():
            h0 = ln(model.transformer.word_embeddings.weight).double()
            gain, bias = (g.get(f"transformer.word_embeddings_layernorm.{k}").double() for k in ("weight", "bias"))
            out = torch.nn.functional.layer_norm(rows, (width,), gain, bias, g.config.norm_eps)
        assert float((out[:, :d] - (h0 - h0.mean(1, keepdim=True))).abs().max()) <= 1e-5
        assert float(out[:, d:].abs().max()) == 0.0 and float(gain[d:].abs().max()) == 0.0
    code, rep = verify_json(tmp_path / "src", grown)
    assert code == 0 and rep["results"][0]["rel"] <= (1e-4 if dtype == "float32" else rep["limit"]), rep
    f0, f1 = tmp_path / "f0", tmp_path / "f1"
    assert cli("fold", grown, "--alpha", 0, "--dtype", "float32", "-o", f0).exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(f0).eval()
    assert type(back) is transformers.BloomForCausalLM and back.config.tie_word_embeddings is False
    if dtype == "float32":
        assert rel(hf_logits(back), hf_logits(model)) <= 1e-4
    assert cli("fold", grown, "--alpha", 1, "--dtype", "float32", "-o", f1).exit_code == 0
    back1 = transformers.AutoModelForCausalLM.from_pretrained(f1).eval()
    with torch.no_grad():
        ours1 = g.model()(X, alpha=1.0)
    assert rel(hf_logits(back1), ours1) <= 1e-5
    assert rel(ours1, hf_logits(model)) > 1e-3  # the open gate really is another function


def test_bloom_recipes_and_refusals(tmp_path):
    """copy is refused (a copied head has another ALiBi slope than its source); nrio (no rotation) is
    the copied residual itself, exact; an ungated growth with zero new heads puts the heads at their
    ALiBi positions when it grows (a plain BLOOM). Refused with one line: a BLOOM with gated heads
    growing again (fold first), --ffn other than 4 x width, a rotation, the post-LN residual variant."""
    model = _bloom_source("bloom", tmp_path / "src")
    src = tmp_path / "src"
    r = cli("expand", src, "--width", 128, "--recipe", "copy", "-o", tmp_path / "c.safetensors")
    assert r.exit_code == 2 and "refused: ALiBi gives every head its own slope" in r.stderr, r.stderr
    assert not (tmp_path / "c.safetensors").exists()
    assert cli("expand", src, "--width", 128, "--recipe", "nrio", "-q", "-o", tmp_path / "n").exit_code == 0
    assert verify_json(src, tmp_path / "n")[0] == 0
    r = cli(
        "expand", src, "--width", 128, "--recipe", "copy", "--set", "attention.new_heads=zero", "-o", tmp_path / "z"
    )
    assert r.exit_code == 0 and "positions [1, 3, 5, 7] of 8 (placed there)" in r.stderr, r.stderr
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "z").eval()
    assert not checkpoint.load(tmp_path / "z").config.gated and type(plain) is transformers.BloomForCausalLM
    assert rel(hf_logits(plain), hf_logits(model)) <= 1e-4
    assert cli("expand", src, "--width", 128, "-q", "-o", tmp_path / "g.safetensors").exit_code == 0
    for args, match in [
        ((tmp_path / "g.safetensors", "--width", 256), "must be folded before it grows again"),
        ((src, "--width", 128, "--ffn", 300), "bloom has an MLP of 4 x width (512) neurons, not 300"),
        ((src, "--width", 128, "--set", "rotation.eps=0.5"), "copied residual takes no rotation"),
    ]:
        r = cli("expand", *args, "-o", tmp_path / "x.safetensors")
        assert r.exit_code == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "x.safetensors").exists()
    post = {**model.config.to_dict(), "apply_residual_connection_post_layernorm": True}
    _refused(post, "apply_residual_connection_post_layernorm=true")
