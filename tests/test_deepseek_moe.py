"""DeepSeek-style MoE routing (nn/moe.py ``biased``, ``grouped_choice``) and dense first blocks
(nn/moe_layers.py) beyond the architecture table's rows (tests/arch_cases.py, run by
test_architectures.py and test_depth.py), for GLM-4-MoE, dots1, MiniMax-M2, Ernie 4.5-MoE, EXAONE-MoE
(and HunYuan-MoE's ungated shared MLP):

* each piece of the routing bites: read without the correction bias, without the group limit, without
  the routed scaling factor, with softmax scores instead of sigmoid ones, or without the shared
  experts, growtool's logits differ from transformers';
* width growth keeps the correction bias bit for bit and every token's experts and weights at gate 0;
* a model whose first block is dense (its own FFN width) grows in width and depth: the dense block's
  neurons grow behind the gate, the copied blocks keep their kind, ``first_k_dense_replace`` is written
  for the new layout and transformers loads the folds; a layout that spelling cannot say is refused.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402
from growtool.nn import families, moe  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import FAMILY_X as X  # noqa: E402
from arch_cases import hf_logits, make_source, rel  # noqa: E402
from helpers import cli, verify_json  # noqa: E402

# model_type -> (a row whose block 0 is dense, a depth placement its config cannot say, that layout)
DENSE1 = {
    "glm4_moe": ("glm4_moe-dense1-groups-qknorm", ("--depth-method", "stack"), "DMDM"),
    "dots1": ("dots1-dense1-groups", ("--depth-method", "stack"), "DMDM"),
    "ernie4_5_moe": ("ernie4_5_moe-dense1-shared2", ("--insert-at", "0:1,1:0"), "MDDM"),
    "exaone_moe": ("exaone_moe-dense1-window", None, None),  # mlp_layer_types says any layout
    "deepseek_v3": ("deepseek_v3-mla-moe-dense1", ("--depth-method", "stack"), "DMDM"),
}
GROUPED = ["glm4_moe-dense1-groups-qknorm", "dots1-dense1-groups", "exaone_moe-dense1-window"]


def _tensors(ck):
    return {n: ck.get(n) for n in ck.names()}


def _routes(model: LM, x: torch.Tensor, alpha=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per MoE block: (each token's experts, sorted; their weights in that order), from moe.route."""
    out, real = [], moe.route

    def spy(cfg, router, h, bias=None):
        w, e = real(cfg, router, h, bias)
        order = e.argsort(-1)
        out.append((e.gather(-1, order), w.gather(-1, order)))
        return w, e

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr("growtool.nn.model.route", spy)  # model.py calls the route it imported
        model(x, alpha=alpha)
    return out


@pytest.mark.parametrize("name", GROUPED)
def test_each_piece_of_the_routing_bites(name, tmp_path, monkeypatch):
    model = make_source(name, tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, _tensors(ck), hf_logits(model)
    assert cfg.n_group == 2 and cfg.topk_group == 1 and cfg.shared_experts == 2 and cfg.moe_layers == [0, 1]
    assert "model.layers.0.self_attn.q_norm.weight" in t  # per-head q/k norms (GLM-4-MoE: use_qk_norm true)
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, t)(X), want) <= 1e-5
        bias = [n for n in t if n.endswith("e_score_correction_bias")]
        assert bias and all(float(t[n].abs().max()) > 0 for n in bias)
        unbiased = {**t, **{n: torch.zeros_like(t[n]) for n in bias}}
        assert rel(LM.from_tensors(cfg, unbiased)(X), want) > 1e-3
        assert rel(LM.from_tensors(cfg.replace(n_group=1, topk_group=1), t)(X), want) > 1e-3
        assert rel(LM.from_tensors(cfg.replace(routed_scale=2.0), t)(X), want) > 1e-3
        no_shared = {n: torch.zeros_like(v) if ".shared_experts.down_proj" in n else v for n, v in t.items()}
        assert rel(LM.from_tensors(cfg, no_shared)(X), want) > 1e-3
        a = families.ARCHS[cfg.family]
        other = dataclasses.replace(a, features=dataclasses.replace(a.features, routing="softmax_bias"))
        monkeypatch.setitem(families.ARCHS, cfg.family, other)
        assert rel(LM.from_tensors(cfg, t)(X), want) > 1e-3


@pytest.mark.parametrize("name", sorted(row for row, _, _ in DENSE1.values()))
def test_width_growth_keeps_the_bias_and_every_tokens_experts(name, tmp_path):
    make_source(name, tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    grown = tmp_path / "g.safetensors"
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", grown).exit_code == 0
    g = checkpoint.load(grown)
    bias = [n for n in ck.names() if n.endswith("e_score_correction_bias")]
    assert bias and all(torch.equal(g.get(n), ck.get(n)) for n in bias)
    x = torch.randint(256, (4, 20), generator=torch.Generator().manual_seed(7))
    before, after = _routes(ck.model(), x), _routes(g.model(), x, alpha=0.0)
    assert len(before) == 1 and len({int(e) for e in before[0][0].flatten()}) > 4  # block 1 only; experts spread
    for (e0, w0), (e1, w1) in zip(before, after, strict=True):
        assert torch.equal(e0, e1) and float((w0 - w1).abs().max()) <= 1e-5


@pytest.mark.parametrize("mt", sorted(DENSE1))
@pytest.mark.parametrize("place", [("--depth-method", "interleave"), ("--insert-at", "0:0,2")])
def test_dense_first_blocks_grow_in_width_and_depth_and_load(mt, place, tmp_path):
    """64 -> 96 and 2 -> 4 blocks: the dense block's 96 neurons grow to 144 (behind the gate), its copy
    stays dense (written in the family's spelling); gate 0 verifies against the source, fold 0 loads in
    transformers as the same class, the same blocks dense, with the source's logits, fold 1 equals
    growtool's gate-1 forward."""
    model = make_source(DENSE1[mt][0], tmp_path / "src")
    grown = tmp_path / "g.safetensors"
    args = ("--width", 96, "--layers", 4, *place, "-q", "-o", grown)
    r = cli("expand", tmp_path / "src", *args)
    assert r.exit_code == 0, r.stderr
    code, rep = verify_json(tmp_path / "src", grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    ck = checkpoint.load(grown)
    c = ck.config
    assert (c.moe_layers, c.dense_ffn, c.base_dense_ffn, c.ffn, c.shared_ffn) == ([0, 0, 1, 1], 144, 96, 48, 96)
    assert ck.get("model.layers.1.mlp.down_proj.weight").shape == (96, 144)  # block 0 and its copy: dense
    auto = transformers.AutoModelForCausalLM.from_pretrained
    assert cli("fold", grown, "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    f0 = auto(tmp_path / "f0").eval()
    assert [hasattr(b.mlp, "experts") for b in f0.model.layers] == [False, False, True, True]
    assert type(f0) is type(model) and rel(hf_logits(f0), hf_logits(model)) <= 1e-4
    assert cli("fold", grown, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    with torch.no_grad():
        ours1 = ck.model()(X, alpha=1.0)
    assert rel(hf_logits(auto(tmp_path / "f1").eval()), ours1) <= 1e-5 and rel(ours1, hf_logits(model)) > 1e-3


@pytest.mark.parametrize("mt", sorted(mt for mt, (_, place, _) in DENSE1.items() if place))
def test_a_layout_the_config_cannot_say_is_refused_with_one_line(mt, tmp_path):
    """first_k_dense_replace says only "the first k blocks dense", Ernie's keys a start, an end and an
    interval of MoE blocks: a depth layout outside that is refused with one line, nothing written."""
    row, place, layout = DENSE1[mt]
    make_source(row, tmp_path / "src")
    out = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--layers", 4, *place, "-o", out)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"the layout {layout} (D dense, M MoE)" in r.stderr
    assert not out.exists()


def test_minimax_m2_sigmoid_routing_with_its_bias_and_the_hubs_rotary_dim(tmp_path, monkeypatch):
    """MiniMax-M2: every block MoE, sigmoid scores chosen with the correction bias (beside the router,
    ``block_sparse_moe.e_score_correction_bias``), renormalised; without the bias or with softmax scores
    the logits differ. Its Hub configs give partial RoPE as ``rotary_dim`` (dims per head): read as
    transformers reads it, carried through growth."""
    model = make_source("minimax_m2-partial-rotary", tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    del hf["rope_parameters"]["partial_rotary_factor"]
    (tmp_path / "src" / "config.json").write_text(json.dumps({**hf, "rotary_dim": 8}))
    assert rel(hf_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src")), hf_logits(model)) == 0
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, _tensors(ck), hf_logits(model)
    assert cfg.rotary_fraction == 0.5 and "model.layers.1.block_sparse_moe.e_score_correction_bias" in t
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, t)(X), want) <= 1e-5
        unbiased = {n: torch.zeros_like(v) if n.endswith("correction_bias") else v for n, v in t.items()}
        assert rel(LM.from_tensors(cfg, unbiased)(X), want) > 1e-3
        a = families.ARCHS[cfg.family]
        other = dataclasses.replace(a, features=dataclasses.replace(a.features, routing="softmax_bias"))
        monkeypatch.setitem(families.ARCHS, cfg.family, other)
        assert rel(LM.from_tensors(cfg, t)(X), want) > 1e-3
    monkeypatch.setitem(families.ARCHS, cfg.family, a)
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    assert cli("fold", tmp_path / "g", "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert back.config.rope_parameters["partial_rotary_factor"] == 0.5 and back.config.hidden_size == 96
    assert rel(hf_logits(back), want) <= 1e-4


def test_ernie_softmax_routing_with_its_bias_and_shared_experts_bite(tmp_path, monkeypatch):
    """Ernie 4.5-MoE: softmax scores chosen with the correction bias ([1, experts], ``mlp.moe_statics``),
    renormalised; its MoE blocks given by start / end / interval. Without the bias, with sigmoid scores,
    or without the shared experts the logits differ; a stacked copy (D M D M) is written as interval 2."""
    model = make_source("ernie4_5_moe-dense1-shared2", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, _tensors(ck), hf_logits(model)
    assert cfg.moe_layers == [0, 1] and t["model.layers.1.mlp.moe_statics.e_score_correction_bias"].shape == (1, 8)
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, t)(X), want) <= 1e-5
        unbiased = {n: torch.zeros_like(v) if n.endswith("correction_bias") else v for n, v in t.items()}
        assert rel(LM.from_tensors(cfg, unbiased)(X), want) > 1e-3
        no_shared = {n: torch.zeros_like(v) if ".shared_experts.down_proj" in n else v for n, v in t.items()}
        assert rel(LM.from_tensors(cfg, no_shared)(X), want) > 1e-3
        a = families.ARCHS[cfg.family]
        other = dataclasses.replace(a, features=dataclasses.replace(a.features, routing="sigmoid"))
        monkeypatch.setitem(families.ARCHS, cfg.family, other)
        assert rel(LM.from_tensors(cfg, t)(X), want) > 1e-3
    monkeypatch.setitem(families.ARCHS, cfg.family, a)
    g = tmp_path / "g.safetensors"
    assert cli("expand", tmp_path / "src", "--layers", 4, "--depth-method", "stack", "-q", "-o", g).exit_code == 0
    assert cli("fold", g, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    hf = json.loads((tmp_path / "f1" / "config.json").read_text())
    assert (hf["moe_layer_start_index"], hf["moe_layer_end_index"], hf["moe_layer_interval"]) == (1, 3, 2)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    assert [hasattr(b.mlp, "experts") for b in back.model.layers] == [False, True, False, True]
    with torch.no_grad():
        assert rel(hf_logits(back), checkpoint.load(g).model()(X, alpha=1.0)) <= 1e-5


def test_exaone_moe_writes_any_layout_as_mlp_layer_types(tmp_path):
    """EXAONE-MoE lists each block's kind (``mlp_layer_types``): a stacked copy (dense, MoE, dense, MoE)
    is written as such (with the copied blocks' layer types), and transformers builds those blocks."""
    make_source("exaone_moe-dense1-window", tmp_path / "src")
    g = tmp_path / "g.safetensors"
    assert cli("expand", tmp_path / "src", "--layers", 4, "--depth-method", "stack", "-q", "-o", g).exit_code == 0
    assert cli("fold", g, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    hf = json.loads((tmp_path / "f1" / "config.json").read_text())
    assert (
        hf["mlp_layer_types"] == ["dense", "sparse"] * 2
        and hf["layer_types"] == ["sliding_attention", "full_attention"] * 2
    )
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    assert [hasattr(b.mlp, "experts") for b in back.model.layers] == [False, True, False, True]
    with torch.no_grad():
        assert rel(hf_logits(back), checkpoint.load(g).model()(X, alpha=1.0)) <= 1e-5


def test_hunyuan_moe_shared_mlp_and_per_block_top_k(tmp_path):
    """HunYuan-MoE: softmax top-k renormalised, plus one shared MLP of the experts' width added without a
    gate (without it the logits differ). Its Hub configs list moe_topk per block: the same value in every
    block reads as that value (transformers computes the same model), differing values are refused."""
    model = make_source("hunyuan_v1_moe-top2", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, t, want = ck.config, _tensors(ck), hf_logits(model)
    assert (cfg.top_k, cfg.shared_experts, cfg.shared_ffn) == (2, 1, 48) and cfg.norm_topk
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, t)(X), want) <= 1e-5
        no_shared = {n: torch.zeros_like(v) if ".shared_mlp.down_proj" in n else v for n, v in t.items()}
        assert rel(LM.from_tensors(cfg, no_shared)(X), want) > 1e-3
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps({**hf, "moe_topk": [2, 2]}))
    assert rel(hf_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src")), want) == 0
    r = cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    assert verify_json(tmp_path / "src", tmp_path / "g")[0] == 0
    (tmp_path / "src" / "config.json").write_text(json.dumps({**hf, "moe_topk": [2, 1]}))
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "h")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "moe_topk differs between blocks" in r.stderr and not (tmp_path / "h").exists()


@pytest.mark.parametrize(
    "name", ["glm4_moe-dense1-groups-qknorm", "ernie4_5_moe-dense1-shared2", "hunyuan_v1_moe-top2"]
)
def test_bf16_folder_with_float32_routers_as_transformers_writes_it(name, tmp_path):
    """transformers keeps these families' routers (and correction biases) in float32 in a bf16 checkpoint:
    such a folder is read (the other tensors one dtype), grows to float32 and verifies, and grows in bf16
    into a folder transformers loads. Any other tensor in float32 still mixes dtypes and is refused."""
    make_source(name, tmp_path / "f32")
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f32", dtype=torch.bfloat16)
    bf16.save_pretrained(tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    dts = {n: ck.dtype(n) for n in ck.names()}
    assert ck.main_dtype() == torch.bfloat16 and torch.float32 in dts.values()
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.float32).eval()
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(ref)) <= 1e-5
    assert (
        cli("expand", tmp_path / "src", "--width", 96, "--dtype", "float32", "-q", "-o", tmp_path / "g").exit_code == 0
    )
    assert verify_json(tmp_path / "src", tmp_path / "g")[0] == 0
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "h").exit_code == 0
    assert cli("fold", tmp_path / "h", "--alpha", 0, "-o", tmp_path / "h0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "h0").eval()
    assert back.config.hidden_size == 96 and next(back.parameters()).dtype == torch.bfloat16
    from safetensors.torch import load_file, save_file

    sd = load_file(tmp_path / "src" / "model.safetensors")
    sd["model.norm.weight"] = sd["model.norm.weight"].float()
    save_file(sd, tmp_path / "src" / "model.safetensors", metadata={"format": "pt"})
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "x")
    assert r.exit_code == 2 and "tensors mix dtypes" in r.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("version", ["deepseek_v2", "deepseek_v3"])
def test_routing_equals_deepseeks_own_routers(version, monkeypatch):
    """The routing rules DeepSeek-V2/V3 need (their blocks' attention is another engineer's MLA): on random
    inputs, nn/moe.route picks the experts and weights of transformers' own router modules. V3 (as GLM-4-MoE):
    "sigmoid" with the correction bias and groups scored by their 2 best; V2 (group_limited_greedy):
    "softmax_group", groups scored by their best expert, x routed_scaling_factor, not renormalised."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as v2
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

    kw = dict(hidden_size=32, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2)
    kw.update(routed_scaling_factor=2.5, norm_topk_prob=True, topk_method="group_limited_greedy")
    hf_cfg = transformers.AutoConfig.for_model(version, **kw)
    torch.manual_seed(0)
    router = (v2.DeepseekV2TopkRouter if version == "deepseek_v2" else v3.DeepseekV3TopkRouter)(hf_cfg)
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        bias = getattr(router, "e_score_correction_bias", None)
        if bias is not None:
            bias.normal_(0, 0.1)
    a = families.ARCHS["glm4_moe"]
    routing = "softmax_group" if version == "deepseek_v2" else "sigmoid"
    monkeypatch.setitem(
        families.ARCHS, "glm4_moe", dataclasses.replace(a, features=dataclasses.replace(a.features, routing=routing))
    )
    cfg = ModelConfig("glm4_moe", 64, 32, 1, 4, 4, 8, 16, experts=16, top_k=3, norm_topk=True, n_group=4, topk_group=2)
    cfg = cfg.replace(routed_scale=2.5)
    x = torch.randn(200, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, w_hf, e_hf = router(x)
        w, e = moe.route(cfg, router, x, bias)
    o_hf, o = e_hf.argsort(-1), e.argsort(-1)
    assert torch.equal(e_hf.gather(-1, o_hf), e.gather(-1, o))
    assert float((w_hf.gather(-1, o_hf) - w.gather(-1, o)).abs().max()) <= 1e-6
    assert len(set(e.flatten().tolist())) == 16  # every expert chosen somewhere
    assert max(len(set((row // 4).tolist())) for row in e) == 2  # experts from at most topk_group 2 groups
