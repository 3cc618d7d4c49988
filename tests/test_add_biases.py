"""Recipe ``add_biases`` (issue 40): zero biases added at a width growth keep the function, in every family
whose config can state them, and are refused in one line where it cannot.

* every family and ratio (hypothesis): the grown tensors are the plain growth's bit for bit, plus zero
  tensors of bias roles; gate 0 exact (1e-4 x the logit scale); the exact layers named: Llama;
* models that transformers creates and saves here: grown, folded at gate 0, they load in transformers with
  the config's bias flags set, the source's logits and the biases read from the file (zero);
* a run folder grows them with zero AdamW moments, ``--grow-at`` grows them inside a run, both train them;
* refusals: a config that cannot say the biases, one key for attention and MLP biases, a depth growth.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from growtool.check import compare, random_batches
from growtool.grow import recipes
from growtool.grow.biases import FLAGS, SAID
from growtool.grow.engine import grow_tensor
from growtool.grow.moments import param_order
from growtool.grow.plan import build_plan
from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.nn.families import ARCHS, arch_of, tensor_specs
from growtool.nn.model import LM

from helpers import cli, random_tensors, stages_world, tiny_cfg
from strategies import growth_cases

OPTIONS = ("attention", "mlp", "all")


def _grow(cfg, src, recipe, D, seed):
    plan = build_plan(cfg, recipe, D, seed=seed)
    return plan, {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}


@pytest.mark.parametrize("family", sorted(ARCHS))
@settings(max_examples=3, deadline=None, derandomize=True)
@given(data=st.data())
def test_zero_biases_keep_gate_zero_exact_in_every_family_or_are_refused(family, data):
    cfg, D, recipe, seed = data.draw(growth_cases(family))
    option = data.draw(st.sampled_from(OPTIONS))
    src = random_tensors(cfg, seed=seed)
    try:
        plan0, plain = _grow(cfg, src, recipes.load(recipe), D, seed)
    except GrowError:  # refused without the option: refused with it too
        with pytest.raises(GrowError):
            build_plan(cfg, recipes.load(recipe, {"add_biases": option}), D, seed=seed)
        return
    flags = FLAGS[option]
    try:
        plan, grown = _grow(cfg, src, recipes.load(recipe, {"add_biases": option}), D, seed)
    except GrowError as e:
        assert "add_biases" in str(e)
        a = arch_of(cfg)
        unsayable = [f for f in flags if not a.fixed.get(f, f in a.keys)]  # fixed off, or no config key
        one_key = [f for f in flags for g in SAID if g not in flags and g in a.keys and a.keys[g] == a.keys.get(f)]
        assert unsayable or one_key or "not supported" in str(e), (cfg.family, option, str(e))
        return
    assert plan.exact and all(getattr(plan.cfg, f) for f in flags)
    added = set(grown) - set(plain)
    specs = tensor_specs(plan.cfg)
    biases = ("unit_bias", "writer_bias", "latent_bias")  # a latent_bias: MLA's kv_a_proj_with_mqa
    assert all(n.endswith(".bias") and specs[n].role in biases and not grown[n].any() for n in added), added
    assert all(torch.equal(grown[n], plain[n]) for n in plain)  # the rest: the plain growth's bytes
    assert plan.cfg.replace(qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias, mlp_bias=cfg.mlp_bias) == plan0.cfg
    m_src, m_grown = LM.from_tensors(cfg, src), LM.from_tensors(plan.cfg, grown)
    x = random_batches(cfg.vocab_size, cfg.context, 4, seed)
    with torch.no_grad():
        assume(m_src(x).isfinite().all())  # a random source can overflow (nothing to compare then)
    c0 = compare(m_src, m_grown, x, alpha=0.0)
    assert c0.logit_scale > 1e-3 and c0.rel <= 1e-4, (c0, cfg.family, option)


def test_the_option_names_exactly_the_layers_it_biases():
    cfg = tiny_cfg(attn_gate=False)
    src = random_tensors(cfg)
    kinds = {
        "attention": {"q_proj", "k_proj", "v_proj", "o_proj"},
        "mlp": {"gate_proj", "up_proj", "down_proj"},
        "all": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    }
    for option, want in kinds.items():
        plan, grown = _grow(cfg, src, recipes.load("srio", {"add_biases": option}), 64, 0)
        added = {n for n in grown if n not in src and "growth_gate" not in n}
        assert {n.split(".")[-2] for n in added} == want and all(n.endswith(".bias") for n in added)
        rows = {r[0].rsplit(".", 2)[-2]: r for r in plan.rows() if r[0].endswith(".bias")}
        assert all(rows[k][1] == "-" and "zeros (add_biases)" in rows[k][3] for k in want)


# transformers' own models: (case of tests/arch_cases.py, option) for several kinds of block
HF_CASES = [
    ("llama", "attention"),
    ("llama", "mlp"),
    ("gemma", "attention"),
    ("olmo2", "attention"),
    ("opt-untied-gelu-nobias", "all"),
    ("granite", "all"),
    ("deepseek_v3-mla-yarn", "attention"),
    ("qwen3_next-gdn-moe", "attention"),
]


@pytest.mark.parametrize("name,option", HF_CASES)
def test_transformers_models_grow_with_zero_biases_and_load_back_in_transformers(name, option, tmp_path):
    transformers = pytest.importorskip("transformers")
    from arch_cases import hf_logits, inputs_for, make_source, rel

    path = tmp_path / "src"
    model = make_source(name, path)
    x = inputs_for(model)
    grown = tmp_path / "g.safetensors"
    r = cli("expand", path, "--width", 96, "--set", f"add_biases={option}", "-o", grown, "-q")
    assert r.exit_code == 0, r.stderr
    assert cli("verify", path, grown, "-q").exit_code == 0
    f0 = tmp_path / "f0"
    assert cli("fold", grown, "--alpha", 0, "-o", f0, "-q").exit_code == 0
    said = json.loads((f0 / "config.json").read_text())
    keys = {arch_of(checkpoint.load(grown).config).keys.get(f) for f in FLAGS[option]} - {None}
    assert keys and all(said[k] is True for k in keys), (keys, said)
    back = transformers.AutoModelForCausalLM.from_pretrained(f0).eval()
    assert type(back) is type(model)
    assert rel(hf_logits(back, x), hf_logits(model, x)) <= 1e-4
    ours = checkpoint.load(f0)
    new = [n for n in ours.names() if n.endswith(".bias") and n not in checkpoint.load(path).names()]
    hf = dict(back.named_parameters())
    assert new and all(n in hf and not hf[n].any() for n in new)  # read from the file, not initialised


@pytest.mark.parametrize(
    "family,option,msg",
    [
        ("mistral", "attention", "cannot state q/k/v biases"),
        ("qwen2", "attention", "cannot state output-projection biases"),
        ("opt-untied-gelu-nobias", "mlp", "as one key (enable_bias): use add_biases=all"),
    ],
)
def test_a_config_that_cannot_say_the_biases_is_refused_in_one_line(family, option, msg, tmp_path):
    from helpers import write_ckpt

    if family.startswith("opt"):  # OPT's one enable_bias, as transformers saves it
        pytest.importorskip("transformers")
        from arch_cases import make_source

        make_source(family, src := tmp_path / "src")
    else:
        src = write_ckpt(tmp_path / "s.safetensors", tiny_cfg(family=family, attn_gate=False))
    out = tmp_path / "g.safetensors"
    r = cli("expand", src, "--width", 96, "--set", f"add_biases={option}", "-o", out)
    assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_depth_growth_and_bad_values_are_refused(tmp_path):
    from helpers import write_ckpt

    src = write_ckpt(tmp_path / "s.safetensors", tiny_cfg())
    r = cli("expand", src, "--width", 64, "--layers", 2, "--set", "add_biases=attention", "-o", tmp_path / "d")
    assert r.exit_code == 2 and "a width growth alone" in r.stderr
    r = cli("expand", src, "--width", 64, "--set", "add_biases=yes", "-o", tmp_path / "b.safetensors")
    assert r.exit_code == 2 and "none | attention | mlp | all" in r.stderr
    assert not list(tmp_path.glob("[db]*"))
    assert recipes.stored(recipes.load("srio")) == recipes.stored(recipes.load("srio", {"add_biases": "none"}))
    assert "add_biases" not in recipes.stored(recipes.load("srio"))  # lineages of plain growths unchanged


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return stages_world(tmp_path_factory.mktemp("biases"))


OPTS = ["--steps", 20, "--batch", 8, "--seq", 32, "--eval-batches", 2, "--lr", 0.01, "--device", "cpu", "-q"]


def _losses(folder):
    return {r["step"]: r["loss"] for r in map(json.loads, (folder / "metrics.jsonl").open()) if "loss" in r}


def test_a_run_folder_grows_zero_biases_with_zero_moments_and_trains_them(world):
    d, text, base = world["dir"], world["text"], world["base"]
    assert cli("train", base, "--data", text, "--out", d / "src", "--stop-at", 10, *OPTS).exit_code == 0
    for name, sets in (("plain", []), ("biased", ["--set", "add_biases=attention"])):
        r = cli("expand", d / "src", "--width", 64, *sets, "-o", d / name, "-q")
        assert r.exit_code == 0, r.stderr
    state = torch.load(d / "biased" / "last.pt", weights_only=True)
    model = checkpoint.load(d / "biased" / "last.safetensors").model()
    for n, p in model.named_parameters():
        p.requires_grad_(not n.endswith("growth_gate"))  # as train holds them: the gates are not trained
    order = param_order(model)
    moments = dict(zip(order, (state["optimizer"]["state"][i] for i in range(len(order)))))
    new = [n for n in order if n.endswith("_proj.bias")]
    assert len(new) == 5 and all(not moments[n]["exp_avg"].any() and not moments[n]["exp_avg_sq"].any() for n in new)
    assert all(float(moments[n]["step"]) == 10 for n in new)
    for name in ("plain", "biased"):
        assert cli("train", base, "--data", text, "--out", d / name, "--resume", *OPTS).exit_code == 0
    plain, biased = _losses(d / "plain"), _losses(d / "biased")
    assert abs(plain[10] - biased[10]) <= 1e-5 * plain[10]  # the first update after the growth: one function
    final = checkpoint.load(d / "biased" / "final.safetensors")
    assert final.config.qkv_bias and final.config.o_bias and all(final.get(n).any() for n in new)


def test_grow_at_grows_zero_biases_inside_a_run(world, tmp_path):
    d, text, base = world["dir"], world["text"], world["base"]
    recipe = tmp_path / "biased.yaml"
    recipe.write_text("add_biases: attention\n")
    for name, r in (("in_plain", []), ("in_biased", ["--grow-recipe", recipe])):
        res = cli("train", base, "--data", text, "--out", d / name, "--grow-at", "0.5:64", *r, *OPTS)
        assert res.exit_code == 0, res.stderr
    plain, biased = _losses(d / "in_plain"), _losses(d / "in_biased")
    assert abs(plain[10] - biased[10]) <= 1e-5 * plain[10] and plain[12] != biased[12]
    res = cli("train", base, "--data", text, "--out", d / "deep", "--grow-at", "0.5:width=64,layers=2",
              "--grow-recipe", recipe, *OPTS)  # fmt: skip
    assert res.exit_code == 2 and "width growths alone" in res.stderr and not (d / "deep").exists()
    final = checkpoint.load(d / "in_biased" / "final.safetensors")
    new = [n for n in final.names() if n.endswith("_proj.bias")]
    assert len(new) == 5 and all(final.get(n).any() for n in new)  # trained after the growth
    assert final.lineage[-2]["recipe_full"]["add_biases"] == "attention"


def test_the_new_biases_are_new_parameters_whole(world, tmp_path):
    """--new-lr-mult scales the step of every entry of a bias the growth added, the old units' entries
    too (the source had no such tensor); the lineage records the flags the growth turned on, so the
    source's config is rebuilt without them."""
    from growtool.training import diagnostics, newparams

    text, base = world["text"], world["base"]
    recipe = tmp_path / "biased.yaml"
    recipe.write_text("add_biases: attention\n")
    grown = {}
    for name, mult in (("full", []), ("slow", ["--new-lr-mult", 0.001])):
        res = cli("train", base, "--data", text, "--out", tmp_path / name, "--grow-at", "0.5:64",
                  "--grow-recipe", recipe, *mult, *OPTS)  # fmt: skip
        assert res.exit_code == 0, res.stderr
        grown[name] = checkpoint.load(tmp_path / name / "final.safetensors")
    ck = grown["slow"]
    entry = ck.lineage[-2]
    assert entry["op"] == "expand" and entry["biases_added"] == ["qkv_bias", "o_bias"]
    src = diagnostics.growth_source(ck.config, ck.lineage)[1]
    assert not src.qkv_bias and not src.o_bias and src.width == 32
    masks = newparams.masks(ck.config, ck.lineage)
    new = [n for n in ck.names() if n.endswith("_proj.bias")]
    assert len(new) == 5 and all(masks[n].all() for n in new)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert masks[q].any() and not masks[q].all()  # a grown tensor: its new slices alone
    for n in new:  # 10 updates of about 1e-2 at full LR, of 1e-5 at 0.001x: the old units' entries too
        assert grown["full"].get(n).abs().max() > 1e-2 and grown["slow"].get(n).abs().max() < 1e-3, n
