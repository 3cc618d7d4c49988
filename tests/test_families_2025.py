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

pytestmark = pytest.mark.usefixtures("one_thread")

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
    ["gemma2-softcap-window", "vaultgemma-window", "olmo3-window", "cohere2-window", "exaone4-window", "gemma3"],
)
def test_without_layer_types_the_layers_follow_transformers_rule(name, tmp_path):
    """A config without ``layer_types`` (4.x): transformers makes every n-th layer full (Gemma 2 and
    VaultGemma n = 2, OLMo 3 / Cohere 2 / EXAONE 4 n = 4, Gemma 3 n = 6, or ``sliding_window_pattern``);
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
