"""Experts fused into tensors that hold all E of them (``families.ExpertLayout``, ``nn/experts.py``).

Granite-MoE stores them [E, 2f, d] (each expert's [gate | up] rows) and [E, d, f]; its rows of the
architecture table (tests/arch_cases.py) go through transformers' forward, width and depth like every
row. Here: the layout is read as transformers reads it (another reading differs); the other layouts
families store (GPT-OSS [E, d, 2f] with gate and up interleaved, Llama 4 [E, d, 2f] halves and
[E, f, d], DBRX's stacked 2-D [E * f, d]) compute the same function from the same weights and grow
into the same weights, tensor for tensor; a bf16 folder in shards grows through the streaming writer.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.check import compare, random_batches  # noqa: E402
from growtool.grow import recipes  # noqa: E402
from growtool.grow.engine import grow_tensor, producer_bytes  # noqa: E402
from growtool.grow.plan import Units, build_plan  # noqa: E402
from growtool.io import checkpoint  # noqa: E402
from growtool.nn import families  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.families import ExpertLayout  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import CASES, hf_logits, make_source, rel  # noqa: E402
from arch_cases import FAMILY_X as X  # noqa: E402
from helpers import cli, make_text, perturbed, random_tensors, tiny_cfg, verify_json  # noqa: E402

B = "model.layers.{i}.block_sparse_moe."
GU, DOWN = B + "input_linear.weight", B + "output_linear.weight"  # Granite-MoE's own layout
# name -> (layout, module paths of its expert slots): the layouts of the families that store experts fused
LAYOUTS = {
    "gpt_oss": (ExpertLayout(reader="in_out", writer="in_out", glu="interleaved"), {"e_gate_up": "gu", "e_down": "dn"}),
    "llama4": (ExpertLayout(reader="in_out", writer="in_out"), {"e_gate_up": "gu", "e_down": "dn"}),
    "dbrx": (
        ExpertLayout(writer="in_out", glu="separate", stacked=True),
        {"e_gate": "mlp.w1", "e_up": "mlp.v1", "e_down": "mlp.w2"},
    ),
}


def relaid(gu: torch.Tensor, down: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
    """Granite-MoE's expert tensors of one block, [E, 2f, d] and [E, d, f], in layout ``name``
    (slot -> tensor): the same experts, stored as that family stores them."""
    E, f2, d = gu.shape
    gate, up = gu[:, : f2 // 2], gu[:, f2 // 2 :]  # [E, f, d] each
    down_t = down.transpose(1, 2)  # [E, f, d]
    if name == "gpt_oss":  # neuron j's gate at 2j, its up at 2j + 1
        return {"e_gate_up": torch.stack([gate, up], 2).reshape(E, f2, d).transpose(1, 2), "e_down": down_t}
    if name == "llama4":
        return {"e_gate_up": gu.transpose(1, 2), "e_down": down_t}
    return {"e_gate": gate.reshape(-1, d), "e_up": up.reshape(-1, d), "e_down": down_t.reshape(-1, d)}


def variant(name: str):
    """Granite-MoE with its experts stored in layout ``name``."""
    a = families.ARCHS["granitemoe"]
    layout, paths = LAYOUTS[name]
    modules = {k: v for k, v in a.modules.items() if k not in ("e_gate_up", "e_down")}
    modules.update({slot: "block_sparse_moe." + p for slot, p in paths.items()})
    return dataclasses.replace(a, modules=modules, features=dataclasses.replace(a.features, experts=layout))


def in_layout(tensors: dict, cfg, name: str) -> dict:
    """A checkpoint's tensors with every block's experts relaid into layout ``name``."""
    out = {n: t for n, t in tensors.items() if not n.endswith(("input_linear.weight", "output_linear.weight"))}
    paths = LAYOUTS[name][1]
    for i in range(cfg.layers):
        for slot, t in relaid(tensors[GU.format(i=i)], tensors[DOWN.format(i=i)], name).items():
            out[B.format(i=i) + paths[slot]] = t
    return out


def test_the_fused_layout_is_read_as_transformers_reads_it(tmp_path, monkeypatch):
    """[gate | up] halves along each expert's rows: read as interleaved pairs, the logits differ."""
    model = make_source("granitemoe", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.get(GU.format(i=0)).shape == (4, 96, 64) and ck.get(DOWN.format(i=0)).shape == (4, 64, 48)
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) <= 1e-5
        a = families.ARCHS["granitemoe"]
        lay = dataclasses.replace(a.features.experts, glu="interleaved")
        monkeypatch.setitem(
            families.ARCHS, "granitemoe", dataclasses.replace(a, features=dataclasses.replace(a.features, experts=lay))
        )
        assert rel(ck.model()(X), hf_logits(model)) > 1e-3


@pytest.mark.parametrize("recipe", ["srio", "copy"])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_computes_and_grows_the_same_experts(name, recipe, tmp_path, monkeypatch):
    """The same experts stored in another family's layout: the same logits, and growth (width 64 -> 96,
    every expert's neurons 48 -> 96: tiled behind the gate, or Net2Net copies that split their writes)
    makes the same tensors relaid, so the engine takes each layout's unit and residual axes right."""
    make_source("granitemoe", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, src = ck.config, {n: ck.get(n) for n in ck.names()}
    r = recipes.load(recipe, recipes.parse_set(["noise=0.0"]))
    plan = build_plan(cfg, r, 96, Units(ffn=96), seed=3)
    grown = {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}
    with torch.no_grad():
        ref, ref_grown = LM.from_tensors(cfg, src)(X), LM.from_tensors(plan.cfg, grown)(X, alpha=0.0)
    assert rel(ref_grown, ref) <= 1e-5
    monkeypatch.setitem(families.ARCHS, "granitemoe", variant(name))
    mine = in_layout(src, cfg, name)
    assert set(mine) == set(families.expected_shapes(cfg))
    plan_v = build_plan(cfg, r, 96, Units(ffn=96), seed=3)
    grown_v = {n: grow_tensor(n, plan_v, mine.__getitem__) for n, _, _ in plan_v.outputs()}
    want = in_layout(grown, plan.cfg, name)
    assert set(grown_v) == set(want)
    for n, t in grown_v.items():
        assert t.shape == want[n].shape and torch.allclose(t, want[n], atol=1e-6), n
    with torch.no_grad():
        assert rel(LM.from_tensors(cfg, mine)(X), ref) <= 1e-6
        assert rel(LM.from_tensors(plan_v.cfg, grown_v)(X, alpha=0.0), ref) <= 1e-5
        assert rel(LM.from_tensors(plan_v.cfg, grown_v)(X, alpha=1.0), ref) > 1e-3 or recipe == "copy"


@pytest.mark.parametrize("recipe, over", [("srio", {"noise": 0.2}), ("copy", {"pair_noise": 0.3})])
def test_expert_biases_are_read_and_grow_exactly(recipe, over, tmp_path, monkeypatch):
    """GPT-OSS's layout with a bias per expert ([E, 2f] on the interleaved gate/up pairs, [E, d] on the
    output, ``ExpertLayout.bias``): read by the forward pass (zeroed, the logits differ), grown with
    their tensors (old unit biases kept bit for bit), the source's function at gate 0."""
    make_source("granitemoe", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    cfg, src = ck.config, {n: ck.get(n) for n in ck.names()}
    v = variant("gpt_oss")
    modules = {**v.modules, "e_gate_up_bias": "block_sparse_moe.gu_b", "e_down_bias": "block_sparse_moe.dn_b"}
    lay = dataclasses.replace(v.features.experts, bias=True)
    monkeypatch.setitem(
        families.ARCHS,
        "granitemoe",
        dataclasses.replace(v, modules=modules, features=dataclasses.replace(v.features, experts=lay)),
    )
    mine, gen = in_layout(src, cfg, "gpt_oss"), torch.Generator().manual_seed(5)
    for i in range(cfg.layers):
        mine[B.format(i=i) + "gu_b"] = 0.3 * torch.randn(4, 96, generator=gen)
        mine[B.format(i=i) + "dn_b"] = 0.3 * torch.randn(4, 64, generator=gen)
    assert set(mine) == set(families.expected_shapes(cfg))
    zeroed = {n: torch.zeros_like(t) if n.endswith("_b") else t for n, t in mine.items()}
    plan = build_plan(cfg, recipes.load(recipe, over), 96, seed=3)
    grown = {n: grow_tensor(n, plan, mine.__getitem__) for n, _, _ in plan.outputs()}
    assert grown[B.format(i=1) + "gu_b"].shape == (4, 144) and grown[B.format(i=1) + "dn_b"].shape == (4, 96)
    assert torch.equal(grown[B.format(i=1) + "gu_b"][:, :96], mine[B.format(i=1) + "gu_b"])
    with torch.no_grad():
        ref = LM.from_tensors(cfg, mine)(X)
        assert rel(LM.from_tensors(cfg, zeroed)(X), ref) > 1e-3
        assert rel(LM.from_tensors(plan.cfg, grown)(X, alpha=0.0), ref) <= 1e-5


def test_a_bf16_sharded_folder_grows_through_the_streaming_writer(tmp_path):
    """A bf16 GraniteMoeShared saved in shards by transformers: read lazily, grown by the streaming writer
    in bf16 (each tensor the float32 growth rounded once) and in float32 (verified); the producer memory
    estimate holds a whole 3-D expert tensor and its source."""
    make, kw = CASES["granitemoeshared"]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "src", max_shard_size="100KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").exists()
    ck = checkpoint.load(tmp_path / "src")
    assert ck.main_dtype() == torch.bfloat16
    for dtype in ("bfloat16", "float32"):
        r = cli("expand", tmp_path / "src", "--width", 96, "--dtype", dtype, "-o", tmp_path / dtype, "-q")
        assert r.exit_code == 0, r.stderr
    g16, g32 = checkpoint.load(tmp_path / "bfloat16"), checkpoint.load(tmp_path / "float32")
    assert g16.get(GU.format(i=1)).shape == (4, 144, 96) and g16.get(GU.format(i=1)).dtype == torch.bfloat16
    assert all(torch.equal(g16.get(n), g32.get(n).to(torch.bfloat16)) for n in g32.names())
    assert verify_json(tmp_path / "src", tmp_path / "float32")[0] == 0
    plan = build_plan(ck.config, recipes.load("srio"), 96, dtype=torch.bfloat16)
    assert producer_bytes(plan) >= 4 * 4 * 144 * 96 + 6 * 4 * 96 * 64  # the float32 tensor + its source


def test_a_grown_gated_folder_runs_as_remote_code(tmp_path):
    """A grown, unfolded Granite-MoE folder is a remote-code model (its gates): it carries nn/experts.py
    with the forward pass, and transformers runs it with the source's logits at gate 0."""
    model = make_source("granitemoe", tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "g" / "experts.py").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g", trust_remote_code=True).eval()
    assert back.config.growtool["model_type"] == "granitemoe"
    with torch.no_grad():
        assert rel(back(X).logits.float(), hf_logits(model)) <= 1e-4


def test_dbrx_reads_and_writes_its_nested_config_and_clamps_qkv(tmp_path):
    """DBRX keeps kv heads, clip_qkv, the experts and their width in ``attn_config`` / ``ffn_config``: read
    there, written back there grown (and ``ffn_config.hidden_size`` / ``num_key_value_heads`` with them),
    the source's config.json unchanged. Its fused Wqkv output is clamped to +-clip_qkv (without the clamp
    the logits differ); its experts are stacked [E * f, d]."""
    model = make_source("dbrx-clip", tmp_path / "src")
    before = (tmp_path / "src" / "config.json").read_bytes()
    ck = checkpoint.load(tmp_path / "src")
    c = ck.config
    assert (c.kv_heads, c.ffn, c.experts, c.top_k, c.clip_qkv, c.norm_topk) == (2, 48, 4, 2, 0.2, True)
    assert ck.get("transformer.blocks.0.ffn.experts.mlp.w2").shape == (4 * 48, 64)
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) <= 1e-5
        assert (
            rel(LM.from_tensors(c.replace(clip_qkv=None), {n: ck.get(n) for n in ck.names()})(X), hf_logits(model))
            > 1e-3
        )
    r = cli("expand", tmp_path / "src", "--width", 96, "--ffn", 64, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "src" / "config.json").read_bytes() == before
    assert cli("fold", tmp_path / "g", "--alpha", 0, "-q", "-o", tmp_path / "f0").exit_code == 0
    hf = json.loads((tmp_path / "f0" / "config.json").read_text())
    assert (hf["d_model"], hf["n_heads"], hf["num_key_value_heads"]) == (96, 6, 3)
    assert hf["attn_config"]["kv_n_heads"] == 3 and hf["attn_config"]["clip_qkv"] == 0.2
    assert (hf["ffn_config"]["ffn_hidden_size"], hf["ffn_config"]["hidden_size"], hf["ffn_config"]["moe_top_k"]) == (
        64,
        96,
        2,
    )
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert back.transformer.blocks[1].ffn.experts.mlp.w1.shape == (4 * 64, 96)
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


def test_dbrx_top_k_weights_over_another_p_norm_are_refused_with_one_line(tmp_path):
    model = CASES["dbrx-clip"][0](**CASES["dbrx-clip"][1])
    model.config.ffn_config.moe_normalize_expert_weights = 2.0
    model.save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and not (tmp_path / "g").exists()
    assert r.stderr.strip().count("\n") == 0 and "moe_normalize_expert_weights other than 1" in r.stderr


@pytest.mark.parametrize(
    "recipe, over",
    [
        ("srio", {"noise": 0.2}),
        ("srio", {"ffn": {"new_units": "convex"}, "noise": 0.2}),
        ("copy", {"pair_noise": 0.3}),
        ("copy", {"split_alpha": 0.3, "pair_noise": 0.1}),
        ("nrio", {}),
    ],
)
@pytest.mark.parametrize("family", ["granitemoe", "granitemoeshared", "dbrx"])
def test_recipes_and_breakers_keep_fused_experts_exact(family, recipe, over):
    """Every recipe and symmetry breaker on fused (and stacked) experts, at a ratio that is no whole
    factor (24 -> 40, 3 -> 5 heads): the grown model computes the source's function at gate 0."""
    if recipe == "nrio" and family == "dbrx":
        pytest.skip("nrio (no rotation) is exact on RMSNorm only: DBRX has LayerNorm")
    shared = {"shared_ffn": 12} if family == "granitemoeshared" else {}
    cfg = ModelConfig(
        family=family, vocab_size=40, width=24, layers=2, heads=3, kv_heads=3, head_dim=8, ffn=20, context=16,
        experts=3, top_k=2, clip_qkv=0.5 if family == "dbrx" else None, **shared,
    )  # fmt: skip
    src = random_tensors(cfg, seed=4)
    plan = build_plan(cfg, recipes.load(recipe, over), 40, seed=4)
    grown = {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}
    assert plan.cfg.heads == 5 and plan.cfg.ffn == 33 and plan.exact
    x = random_batches(cfg.vocab_size, cfg.context, 4, 4)
    c0 = compare(LM.from_tensors(cfg, src), LM.from_tensors(plan.cfg, grown), x, alpha=0.0)
    assert c0.logit_scale > 1e-3 and c0.rel <= 1e-4, c0


@pytest.mark.parametrize("family, extra", [("granitemoeshared", {"shared_ffn": 16}), ("dbrx", {"clip_qkv": 1.0})])
def test_a_run_grows_fused_experts_with_their_optimizer_state_and_resumes_exactly(family, extra, tmp_path):
    """``train --grow-at 0.5:width=48,layers=3``: the AdamW moments of 3-D and stacked expert tensors grow
    with them (a run stopped and resumed around the growth ends bit for bit where the straight run does),
    and the loss does not jump at the growth."""
    from growtool.init import init_model
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    (tmp_path / "toy.txt").write_text(make_text(1500))
    cfg = tiny_cfg(layers=2, family=family, experts=3, top_k=2, ffn=24, **extra)
    base = checkpoint.save_tensors(str(tmp_path / "base.safetensors"), cfg, [], init_model(cfg, seed=0).tensors())
    kw = dict(batch=8, seq=32, eval_batches=1, device="cpu", progress=False, lr=1e-2, steps=8, save_every=2)
    kw.update(grow_at=("0.5:width=48,layers=3",), gate_warmup_tokens=512)
    a = train(base, [tmp_path / "toy.txt"], tmp_path / "a", **kw)
    train(base, [tmp_path / "toy.txt"], tmp_path / "b", stop_at=3, **kw)
    train(base, [tmp_path / "toy.txt"], tmp_path / "b", resume=True, stop_at=6, **kw)
    b = train(base, [tmp_path / "toy.txt"], tmp_path / "b", resume=True, **kw)
    ra, rb = (read_metrics(tmp_path / r / "metrics.jsonl") for r in "ab")
    assert [{k: v for k, v in r.items() if k != "tok_s"} for r in ra] == [
        {k: v for k, v in r.items() if k != "tok_s"} for r in rb
    ]
    assert checkpoint.load(a["final"]).sha256() == checkpoint.load(b["final"]).sha256()
    final = checkpoint.load(a["final"]).config
    assert (final.width, final.layers, final.experts, final.ffn) == (48, 3, 3, 36)
    assert ra[5]["loss"] < ra[4]["loss"] + 0.05


def test_the_memory_estimate_counts_a_stacked_writer_built_whole():
    """DBRX's w2 [E * f, d] is a writer, grown on the whole tensor (not by blocks of rows, as a large
    reader is): a bf16 growth builds all of it in float32, and the producer estimate counts it."""
    cfg = ModelConfig(
        family="dbrx", vocab_size=64, width=64, layers=1, heads=4, kv_heads=2, head_dim=16, ffn=1024, experts=16,
        top_k=2, clip_qkv=8.0,
    )  # fmt: skip
    plan = build_plan(cfg, recipes.load("srio"), 96, dtype=torch.bfloat16)
    w2 = plan.shapes["transformer.blocks.0.ffn.experts.mlp.w2"]
    assert w2 == (16 * 1536, 96)
    assert producer_bytes(plan) >= 4 * w2[0] * w2[1] + 6 * 16 * 1024 * 64  # the float32 tensor + its bf16 source


def test_a_dbrx_config_in_the_4x_spelling_grows_and_folds_into_a_loadable_folder(tmp_path):
    """The Hub's DBRX config.json (transformers 4.x): no ``rope_parameters`` (the base only in
    ``attn_config.rope_theta``), no ``num_key_value_heads`` or ``ffn_config.hidden_size``; read as
    transformers 5.x reads it, grown, folded into a folder it loads with the source's logits."""
    model = make_source("dbrx-clip", tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    for k in ("rope_parameters", "num_key_value_heads"):
        del hf[k]
    del hf["ffn_config"]["hidden_size"]
    (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    legacy = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval()
    assert rel(hf_logits(legacy), hf_logits(model)) <= 1e-6
    r = cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g.safetensors")
    assert r.exit_code == 0, r.stderr
    code, rep = verify_json(tmp_path / "src", tmp_path / "g.safetensors")
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    assert cli("fold", tmp_path / "g.safetensors", "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert type(back) is type(model) and back.config.attn_config.kv_n_heads == 3
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4
