"""The families of issue 44 beyond test_families' round trip (their width and depth cases live in the
tables of tests/test_families.py and tests/test_depth.py):

* each family's config.json in the transformers 4.x spelling (``rope_theta`` / ``partial_rotary_factor``
  at the top level, ``rope_scaling``, EXAONE 3.5's ``num_layers`` / ``layer_norm_epsilon`` /
  ``activation_function``, Cohere 2's and EXAONE 4's ``sliding_window_pattern`` instead of
  ``layer_types``) reads as transformers reads it, grows, and folds into a folder transformers loads
  with the source's logits;
* Cohere 2 and EXAONE 4 rotate q and k on their sliding layers only (the rule bites);
* a decoder family transformers has and growtool does not grow is refused with one line naming
  the mechanism it lacks.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402
from growtool.nn import families  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.nn.families import UNSUPPORTED  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import FAMILY_CASES as CASES  # noqa: E402
from arch_cases import FAMILY_X as X  # noqa: E402
from arch_cases import hf_logits, make_source, rel  # noqa: E402
from helpers import cli, perturbed, verify_json  # noqa: E402

EXAONE_4X = {
    "num_hidden_layers": "num_layers",
    "rms_norm_eps": "layer_norm_epsilon",
    "hidden_act": "activation_function",
}


def spelled_4x(hf: dict) -> dict:
    """A transformers 5.x config.json as transformers 4.x wrote it."""
    out = dict(hf)
    if out["model_type"] == "nemotron_h":  # no RoPE; the block kinds as one character each
        codes = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
        blocks = out.pop("layers_block_type")
        return {**out, "hybrid_override_pattern": "".join(codes[t] for t in blocks), "num_hidden_layers": len(blocks)}
    if out["model_type"] == "granitemoehybrid":  # 4.x: the layer types "mamba" / "attention"
        out["layer_types"] = [
            {"linear_attention": "mamba", "full_attention": "attention"}[t] for t in out["layer_types"]
        ]
    rp = dict(out.pop("rope_parameters"))
    out["rope_theta"] = rp.pop("rope_theta")
    if "partial_rotary_factor" in rp:
        out["partial_rotary_factor"] = rp.pop("partial_rotary_factor")
    if rp.get("rope_type", "default") != "default":
        out["rope_scaling"] = rp
    if out["model_type"] == "exaone":
        out.update({old: out.pop(new) for new, old in EXAONE_4X.items()})
    if out["model_type"] == "llama4_text":  # Hub configs (Llama 4 Scout): no layer_types, the MoE blocks by step
        del out["layer_types"], out["moe_layers"]
        out["interleave_moe_layer_step"] = 2 if hf["moe_layers"] == [1] else 1
    if out["model_type"] in ("deepseek_v2", "deepseek_v3"):  # the Hub's DeepSeek configs: no head_dim
        del out["head_dim"], out["qk_head_dim"]
    pattern = out.get("layer_types") == ["sliding_attention", "full_attention"]
    if out["model_type"] in ("cohere2", "exaone4") and pattern:
        del out["layer_types"]
        out["sliding_window_pattern"] = 2  # every 2nd layer full
    if out["model_type"] == "lfm2":  # LFM2's Hub spelling: attention layers by index, its own key names
        types = out.pop("layer_types")
        out["full_attn_idxs"] = [i for i, t in enumerate(types) if t == "full_attention"]
        out["block_ff_dim"], out["tie_embedding"] = out.pop("intermediate_size"), out.pop("tie_word_embeddings")
    return out


# one case per family of issue 44 whose Hub configs exist in the 4.x spelling (OLMo 3 and Gemma 3 have
# one RoPE per layer type: Gemma 3's legacy spelling is tests/test_loadable.py's)
LEGACY = [
    "internlm3",
    "exaone",
    "seed_oss-biases",
    "ministral-window",
    "helium",
    "ernie4_5-bias",
    "exaone4-window",
    "cohere2-window",
    "vaultgemma-window",
    "stablelm-qkv-bias",
    "arcee-relu2",
    "nemotron-tied-biases-rotary-quarter",
    "hunyuan_v1_dense",
    "glm",
    "glm4",
    "apertus-xielu",
    "phimoe-sparsemixer",
    "granitemoe",
    "granitemoeshared",
    "gpt_oss-window-yarn",
    "llama4_text-dense-moe-chunked",
    "llama4_text-tied-top2-bias-llama3",
    "glm4_moe-dense1-groups-qknorm",
    "dots1-dense1-groups",
    "minimax_m2-partial-rotary",
    "ernie4_5_moe-dense1-shared2",
    "exaone_moe-dense1-window",
    "hunyuan_v1_moe-top2",
    "deepseek_v2-mla",
    "deepseek_v3-mla-yarn",
    "deepseek_v2-mla-moe-groups-dense1",
    "deepseek_v3-mla-moe-dense1",
    "nemotron_h",
    "granitemoehybrid",
    "falcon_h1",
    "lfm2-conv-attn",
    "qwen3_next-gdn-moe",
]


@pytest.mark.parametrize("name", LEGACY)
def test_configs_in_the_4x_spelling_grow_and_fold_into_loadable_folders(name, tmp_path):
    src = tmp_path / "src"
    model = make_source(name, src)
    hf = json.loads((src / "config.json").read_text())
    old = spelled_4x(hf)
    assert "rope_parameters" not in old and "layers_block_type" not in old and old != hf
    (src / "config.json").write_text(json.dumps(old))
    legacy = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    assert rel(hf_logits(legacy), hf_logits(model)) <= 1e-6  # transformers reads the old spelling as the new
    with torch.no_grad():
        assert rel(checkpoint.load(src).model()(X), hf_logits(model)) <= 1e-5
    grown = tmp_path / "g.safetensors"
    r = cli("expand", src, "--width", 96, "-q", "-o", grown)
    assert r.exit_code == 0, r.stderr
    code, rep = verify_json(src, grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    assert cli("fold", grown, "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert type(back) is type(model) and back.config.hidden_size == 96
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


@pytest.mark.parametrize("name", ["cohere2-window", "exaone4-window", "exaone4-nowindow-tied"])
def test_rope_only_on_sliding_layers(name, tmp_path, monkeypatch):
    """Cohere 2 rotates q and k on layers with a window only; EXAONE 4 too, but on every layer when the
    config has no window. Read with the other rule (RoPE on every layer, or on none), the logits differ."""
    model = make_source(name, tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg = ck.config
    want = [t == "sliding_attention" for t in cfg.layer_types] if cfg.sliding_window else [True] * cfg.layers
    assert [cfg.has_rope(i) for i in range(cfg.layers)] == want and any(want)
    a = families.ARCHS[cfg.family]
    other = dataclasses.replace(a.features, rope_where="windowed" if all(want) else "")
    monkeypatch.setitem(families.ARCHS, cfg.family, dataclasses.replace(a, features=other))
    assert [cfg.has_rope(i) for i in range(cfg.layers)] != want
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) > 1e-3


def _known_unsupported() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return sorted(mt for mt in UNSUPPORTED if mt in CONFIG_MAPPING)


@pytest.mark.parametrize("mt", _known_unsupported())
def test_known_but_unsupported_families_name_what_is_missing(mt):
    hf = transformers.AutoConfig.for_model(mt).to_dict()
    with pytest.raises(GrowError, match=f"^{mt} is not supported yet: growtool does not implement "):
        ModelConfig.from_hf(hf)


def test_an_unsupported_family_is_one_line_exit_2_nothing_written(tmp_path):
    cfg = transformers.AutoConfig.for_model(
        "minimax", vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "minimax is not supported yet: growtool does not implement MiniMax's lightning-attention layers" in r.stderr
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    "name",
    [
        *("gemma2-softcap-window", "vaultgemma-window", "olmo3-window", "cohere2-window", "exaone4-window", "gemma3"),
        "gpt_oss-window-yarn",
    ],
)
def test_without_layer_types_the_layers_follow_transformers_rule(name, tmp_path):
    """A config without ``layer_types`` (4.x): transformers makes every n-th layer full (Gemma 2 and
    VaultGemma / GPT-OSS n = 2, OLMo 3 / Cohere 2 / EXAONE 4 n = 4, Gemma 3 n = 6, or ``sliding_window_pattern``);
    growtool reads the same layer types, and writes them out."""
    from arch_cases import ARCH_CASES

    make, kw = {**ARCH_CASES, **CASES}[name]
    torch.manual_seed(0)
    perturbed(make(**kw)).save_pretrained(tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    del hf["layer_types"]
    (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval()
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.layer_types == back.config.layer_types
    x = X % hf["vocab_size"]  # test_architectures' models have 128 tokens
    with torch.no_grad():
        assert rel(ck.model()(x), hf_logits(back, x)) <= 1e-5
    r = cli("expand", tmp_path / "src", "--width", 96, "--layers", 4, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "g" / "config.json").read_text())["layer_types"] == back.config.layer_types * 2


def test_hunyuan_norms_the_rotated_q_and_k(tmp_path, monkeypatch):
    """HunYuan applies its per-head q/k RMSNorms after RoPE: normed before it (as Qwen 3), the logits differ."""
    model = make_source("hunyuan_v1_dense", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert "model.layers.0.self_attn.query_layernorm.weight" in ck.names()
    a = families.ARCHS["hunyuan_v1_dense"]
    before = dataclasses.replace(a, features=dataclasses.replace(a.features, qk_norm_after_rope=False))
    monkeypatch.setitem(families.ARCHS, "hunyuan_v1_dense", before)
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) > 1e-3


def test_hunyuan_ntk_alpha_rope_is_refused_with_one_line():
    hf = {**transformers.HunYuanDenseV1Config(head_dim=16).to_dict()}
    hf["rope_parameters"] = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
    with pytest.raises(GrowError, match="HunYuan's NTK-alpha RoPE"):
        ModelConfig.from_hf(hf)


def test_ministral3_scales_queries_by_position(tmp_path):
    """Ministral 3 multiplies the rotated query at position p by 1 + beta log(1 + floor(p / original
    max positions)) (beta: the RoPE parameters' llama_4_scaling_beta, carried through growth): without
    it the logits differ at the positions past 8."""
    model = make_source("ministral3-yarn-query-scale", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.rope_scaling["llama_4_scaling_beta"] == 0.5
    plain = ck.config.replace(rope_scaling={**ck.config.rope_scaling, "llama_4_scaling_beta": 0.0})
    with torch.no_grad():
        got = LM.from_tensors(plain, {n: ck.get(n) for n in ck.names()})(X)
    want = hf_logits(model)
    assert rel(got[:, :8], want[:, :8]) <= 1e-5 and rel(got[:, 8:], want[:, 8:]) > 1e-3
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    rp = json.loads((tmp_path / "g" / "config.json").read_text())["rope_parameters"]
    assert rp["llama_4_scaling_beta"] == 0.5 and rp["original_max_position_embeddings"] == 8


def test_apertus_xielu_scalars_are_read_and_kept(tmp_path):
    """Apertus' xIELU has learned scalars per block (alpha_p, alpha_n of shape [1]; beta, eps 0-d):
    growtool reads them (with other values the logits differ), width growth keeps them bit for bit,
    and the grown folder stores them in their shapes."""
    model = make_source("apertus-xielu", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    names = [n for n in ck.names() if ".act_fn." in n]
    assert len(names) == 8 and ck.get("model.layers.0.mlp.act_fn.beta").shape == ()
    t = {n: ck.get(n) for n in ck.names()}
    t["model.layers.1.mlp.act_fn.alpha_p"] = t["model.layers.1.mlp.act_fn.alpha_p"] + 0.5
    with torch.no_grad():
        assert rel(LM.from_tensors(ck.config, t)(X), hf_logits(model)) > 1e-3
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    g = checkpoint.load(tmp_path / "g")
    assert all(torch.equal(g.get(n), ck.get(n)) and g.get(n).shape == ck.get(n).shape for n in names)


def test_phimoe_routes_by_sparsemixer_and_keeps_its_head_bias(tmp_path, monkeypatch):
    """PhiMoE picks the best expert, then the best of the rest, each weighted by a softmax over the
    experts near it (SparseMixer); read as a plain softmax top-2 the logits differ. Its lm_head has
    a bias where lm_head_bias says so, kept by growth."""
    model = make_source("phimoe-sparsemixer-tied-biases-jitter", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.router_jitter == 0.3 and "lm_head.bias" in ck.names()
    a = families.ARCHS["phimoe"]
    softmax = dataclasses.replace(a, features=dataclasses.replace(a.features, routing="softmax"))
    monkeypatch.setitem(families.ARCHS, "phimoe", softmax)
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) > 1e-3
    monkeypatch.setitem(families.ARCHS, "phimoe", a)
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    assert torch.equal(checkpoint.load(tmp_path / "g").get("lm_head.bias"), ck.get("lm_head.bias"))
    hf = {**model.config.to_dict(), "num_experts_per_tok": 1}
    with pytest.raises(GrowError, match="routes to exactly 2 experts"):
        ModelConfig.from_hf(hf)


def _with_features(monkeypatch, family: str, **kw) -> None:
    a = families.ARCHS[family]
    monkeypatch.setitem(families.ARCHS, family, dataclasses.replace(a, features=dataclasses.replace(a.features, **kw)))


def test_llama4_mechanisms_each_bite(tmp_path, monkeypatch):
    """Llama 4 (block 0: RoPE, chunks of 8, q/k L2 norms, dense MLP; block 1: no RoPE, query temperature
    from position 3, MoE): left out, each rule changes the logits where it acts, and only there."""
    model = make_source("llama4_text-dense-moe-chunked", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, {n: ck.get(n) for n in ck.names()}, hf_logits(model)
    assert (cfg.layer_types, cfg.rope_layers) == (["chunked_attention", "full_attention"], [1, 0])
    assert cfg.moe_layers == [0, 1]  # per block: block 1 MoE

    def logits(c=cfg):
        with torch.no_grad():
            return LM.from_tensors(c, t)(X)

    assert rel(logits(), want) <= 1e-5
    full = logits(cfg.replace(layer_types=["full_attention"] * 2))  # no chunks: positions 8.. see more keys
    assert rel(full[:, :8], want[:, :8]) <= 1e-5 and rel(full[:, 8:], want[:, 8:]) > 1e-3
    assert rel(logits(cfg.replace(extra={**cfg.extra, "use_qk_norm": False})), want) > 1e-3
    cool = logits(cfg.replace(extra={**cfg.extra, "attn_temperature_tuning": False}))
    assert rel(cool[:, :3], want[:, :3]) <= 1e-5 and rel(cool[:, 3:], want[:, 3:]) > 1e-3
    for kw in ({"rope_interleaved": False}, {"routing": "softmax"}):  # RoPE on halves; softmax weights after
        _with_features(monkeypatch, "llama4_text", **kw)
        assert rel(logits(), want) > 1e-3, kw
        monkeypatch.setitem(families.ARCHS, "llama4_text", families.LLAMA4_TEXT)


@pytest.mark.parametrize("method,layers", [("interleave", 3), ("stack", 4), ("middle", 4)])
def test_llama4_depth_copies_keep_their_kind(method, layers, tmp_path):
    """Each copied Llama 4 block keeps its kind: MoE or dense (``moe_layers``, block indices, rewritten
    for the new numbering), RoPE or not (``no_rope_layers``), chunked or full (``layer_types``);
    transformers reads the written lists, and the folded model computes growtool's gate-1 function."""
    model = make_source("llama4_text-dense-moe-chunked", tmp_path / "src")
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--layers", layers, "--depth-method", method, "-o", grown, "-q")
    assert r.exit_code == 0, r.stderr
    src = [s for s, _ in checkpoint.load(grown).lineage[-1]["depth_layout"]]
    assert sorted(set(src)) == [0, 1]
    assert cli("fold", grown, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    assert type(back) is type(model) and back.config.num_hidden_layers == layers
    assert back.config.moe_layers == [j for j, s in enumerate(src) if s == 1]
    assert list(back.config.no_rope_layers) == [[1, 0][s] for s in src]
    assert back.config.layer_types == [["chunked_attention", "full_attention"][s] for s in src]
    assert [type(b.feed_forward).__name__ for b in back.model.layers] == [
        ["Llama4TextMLP", "Llama4TextMoe"][s] for s in src
    ]
    with torch.no_grad():
        ours1 = checkpoint.load(grown).model()(X, alpha=1.0)
    assert rel(hf_logits(back), ours1) <= 1e-5


def test_llama4_multimodal_wrapper_is_refused_with_one_line(tmp_path):
    text = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28)
    vision.update(patch_size=14, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64)
    cfg = transformers.Llama4Config(text_config={**text, "intermediate_size_mlp": 80}, vision_config=vision)
    torch.manual_seed(0)
    transformers.Llama4ForConditionalGeneration(cfg).save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "llama4 is not supported yet" in r.stderr and "model_type llama4_text" in r.stderr
    assert not (tmp_path / "g").exists()


def test_llama4_width_growth_keeps_the_norm_eps_its_qk_norms_read(tmp_path, monkeypatch):
    """Llama 4's weightless q/k norms over head_dim read rms_norm_eps, the residual norms' eps: growth
    keeps it (the residual scaled by sqrt(D/d) instead). Grown as Llama (eps x d/D), the q/k norms see
    another eps and the function is lost (a large eps makes it plain)."""
    make, kw = CASES["llama4_text-dense-moe-chunked"]
    torch.manual_seed(0)
    model = perturbed(make(**kw, rms_norm_eps=0.1))
    with torch.no_grad():  # queries and keys of a trained size: peaked attention, which the eps moves
        for n, p in model.named_parameters():
            p.mul_(8.0 if n.endswith(("q_proj.weight", "k_proj.weight")) else 1.0)
    model.save_pretrained(tmp_path / "src")
    results = {}
    for keep in (True, False):
        _with_features(monkeypatch, "llama4_text", fixed_eps=keep)
        grown = tmp_path / f"g{keep}.safetensors"
        assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", grown).exit_code == 0
        results[keep] = (checkpoint.load(grown).config.norm_eps, verify_json(tmp_path / "src", grown)[1])
    assert results[True][0] == 0.1 and results[True][1]["results"][0]["rel"] <= 1e-4
    assert results[False][0] < 0.1 and results[False][1]["results"][0]["rel"] > 1e-3


@pytest.mark.parametrize(
    "over, match",
    [({"moe_layers": [0, 5]}, r"moe_layers \[0, 5\]: block indices below 2"), ({"no_rope_layers": [1]}, "entries")],
)
def test_llama4_bad_per_block_lists_are_one_line_exit_2(over, match, tmp_path):
    make_source("llama4_text-dense-moe-chunked", tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps({**hf, **over}))
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.search(match, r.stderr) and not (tmp_path / "g").exists(), r.stderr


def test_deepseek_mla_rope_pairs_and_yarn_scale_bite(tmp_path, monkeypatch):
    """MLA (nn/mla.py) computes transformers' function, and each of its rules bites: DeepSeek-V2 turns
    adjacent pairs of the RoPE dims, V3 halves where its rope_interleave is false (read the other way,
    the logits differ); YaRN's mscale_all_dim puts m^2 on the scores (left out, the logits differ)."""
    from growtool.nn import mla

    models = {}
    for n in ("deepseek_v2-mla", "deepseek_v3-mla-halves-tied-bias", "deepseek_v3-mla-yarn"):
        make, kw = CASES[n]
        torch.manual_seed(0)  # weights 10x transformers' init: scores that depend on the positions
        models[n] = perturbed(make(**kw, initializer_range=0.2)).eval()
        models[n].save_pretrained(tmp_path / n)
    models["yarn"] = models.pop("deepseek_v3-mla-yarn")
    (tmp_path / "deepseek_v3-mla-yarn").rename(tmp_path / "yarn")
    cks = {n: checkpoint.load(tmp_path / n) for n in models}
    assert not mla.interleaved(cks["deepseek_v3-mla-halves-tied-bias"].config)
    assert mla.softmax_gain(cks["yarn"].config, 0) > 1.0
    with torch.no_grad():
        for n, model in models.items():
            assert rel(cks[n].model()(X), hf_logits(model)) <= 1e-5
        for n in ("deepseek_v2-mla", "deepseek_v3-mla-halves-tied-bias"):
            with monkeypatch.context() as m:
                m.setattr(mla, "interleaved", lambda cfg, flip=mla.interleaved: not flip(cfg))
                assert rel(cks[n].model()(X), hf_logits(models[n])) > 1e-3, n
        monkeypatch.setattr(mla, "softmax_gain", lambda cfg, layer: 1.0)
        assert rel(cks["yarn"].model()(X), hf_logits(models["yarn"])) > 1e-3


def test_deepseek_width_keeps_the_latents_and_adds_heads_behind_the_gate(tmp_path):
    """Width 64 -> 96 with 8 heads: the readers of the residual (q_a_proj, kv_a_proj_with_mqa) take the
    new width, the latents keep their ranks, norms and biases, q_b_proj / kv_b_proj gain the new heads'
    rows (the old rows unchanged); depth 2 -> 4 keeps every layer dense. The folded folder says 8 key/value
    heads (transformers' eager attention groups heads by them) and loads with the source's logits."""
    model = make_source("deepseek_v3-mla-halves-tied-bias", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "--heads", 8, "--layers", 4, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    assert verify_json(tmp_path / "src", tmp_path / "g")[0] == 0
    g = checkpoint.load(tmp_path / "g")
    assert (g.config.heads, g.config.kv_heads, g.config.q_lora_rank, g.config.kv_lora_rank) == (8, 8, 24, 16)
    a = "model.layers.0.self_attn."
    for n in ("q_a_layernorm.weight", "kv_a_layernorm.weight", "q_a_proj.bias", "kv_a_proj_with_mqa.bias"):
        assert torch.equal(g.get(a + n), ck.get(a + n)), n
    assert g.get(a + "q_a_proj.weight").shape == (24, 96) and g.get(a + "kv_a_proj_with_mqa.weight").shape == (24, 96)
    for n, per_head in (("q_b_proj.weight", 24), ("kv_b_proj.weight", 28)):
        assert g.get(a + n).shape[0] == 8 * per_head and torch.equal(g.get(a + n)[: 4 * per_head], ck.get(a + n))
    assert g.get(a + "o_proj.weight").shape == (96, 8 * 12)
    from growtool.training.diagnostics import writer_modules  # the new heads' output share is tracked

    heads = [b["head"][1] for b in writer_modules(g.model(), g.config)]
    assert heads == [f"model.layers.{i}.self_attn.o_proj.weight" for i in range(4)]
    assert cli("fold", tmp_path / "g", "--alpha", 0, "-o", tmp_path / "f").exit_code == 0
    hf = json.loads((tmp_path / "f" / "config.json").read_text())
    assert (hf["num_attention_heads"], hf["num_key_value_heads"], hf["first_k_dense_replace"]) == (8, 8, 4)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f", attn_implementation="eager").eval()
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


def test_deepseek_v2_routing_bites_and_what_it_cannot_grow_is_refused(tmp_path, monkeypatch):
    """DeepSeek-V2 routes by softmax scores, within the best groups by their best score under
    group_limited_greedy, never renormalised, times routed_scaling_factor: read greedily, unscaled, or
    as a plain renormalised softmax top-k, the logits differ. Refused with one line: another topk_method,
    mlp_bias with MoE blocks (its shared experts would carry biases); transformers has no kimi_k2 model type
    (Kimi K2 is DeepSeek-V3's architecture, its text config read as deepseek_v3): refused, saying so."""
    model = make_source("deepseek_v2-mla-moe-groups-dense1", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, {n: ck.get(n) for n in ck.names()}, hf_logits(model)
    assert (cfg.moe_layers, cfg.n_group, cfg.topk_group, cfg.routed_scale, cfg.norm_topk) == ([0, 1], 2, 1, 2.0, False)
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, t)(X), want) <= 1e-5
        greedy = cfg.replace(extra={**cfg.extra, "topk_method": "greedy"})
        for other in (greedy, cfg.replace(routed_scale=1.0)):
            assert rel(LM.from_tensors(other, t)(X), want) > 1e-3
        a = families.ARCHS["deepseek_v2"]
        plain = dataclasses.replace(a, features=dataclasses.replace(a.features, routing="softmax"), fixed={})
        monkeypatch.setitem(families.ARCHS, "deepseek_v2", plain)  # a plain softmax top-k, renormalised
        assert rel(LM.from_tensors(cfg.replace(norm_topk=True), t)(X), want) > 1e-3
        monkeypatch.setitem(families.ARCHS, "deepseek_v2", a)
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    for over, match in (
        ({"topk_method": "noaux_tc"}, "deepseek_v2 routes by topk_method greedy or group_limited_greedy only"),
        ({"mlp_bias": True}, "deepseek_v2 with mlp_bias and MoE blocks .shared experts with biases. is not supported"),
        ({"model_type": "kimi_k2"}, "^kimi_k2 is not supported yet: .*DeepSeek-V3's architecture"),
    ):
        with pytest.raises(GrowError, match=match):
            ModelConfig.from_hf({**hf, **over})
    (tmp_path / "src" / "config.json").write_text(json.dumps({**hf, "topk_method": "noaux_tc"}))
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "g").exists()


def test_deepseek_v3_moe_blocks_route_as_transformers_and_each_piece_bites(tmp_path):
    """DeepSeek-V3's MoE blocks (after its dense first block) route by sigmoid scores chosen with the
    correction bias within the best groups, x routed_scaling_factor (moe.biased, as GLM-4-MoE): read
    without the bias, without the groups or unscaled, the logits differ from transformers'."""
    model = make_source("deepseek_v3-mla-moe-dense1", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, {n: ck.get(n) for n in ck.names()}, hf_logits(model)
    assert (cfg.moe_layers, cfg.n_group, cfg.topk_group, cfg.routed_scale) == ([0, 1], 2, 1, 2.5)
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert float(t[bias].abs().max()) > 0
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, t)(X), want) <= 1e-5
        unbiased = {**t, bias: torch.zeros_like(t[bias])}
        assert rel(LM.from_tensors(cfg, unbiased)(X), want) > 1e-3
        for other in (cfg.replace(n_group=1, topk_group=1), cfg.replace(routed_scale=1.0)):
            assert rel(LM.from_tensors(other, t)(X), want) > 1e-3


def test_deepseek_grown_gated_folder_runs_as_remote_code(tmp_path):
    """A grown, unfolded DeepSeek-V3 (MLA and MoE blocks, gates at 0) is written as a remote-code folder
    (nn/mla.py among the files beside it): transformers runs it with the source's logits, and at gate 1
    with growtool's own gate-1 forward."""
    model = make_source("deepseek_v3-mla-moe-dense1", tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "--layers", 4, "--depth-method", "interleave", "-q")
    assert r.exit_code == 0, r.stderr
    grown = r.stdout.strip()
    assert json.loads(open(f"{grown}/config.json").read())["model_type"] == "growtool"
    back = transformers.AutoModelForCausalLM.from_pretrained(grown, trust_remote_code=True).eval()
    with torch.no_grad():
        assert rel(back(X).logits, hf_logits(model)) <= 1e-4
        ours1 = checkpoint.load(grown).model()(X, alpha=1.0)
        assert rel(back(X, alpha=1.0).logits, ours1) <= 1e-5 and rel(ours1, hf_logits(model)) > 1e-3
