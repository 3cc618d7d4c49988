"""Mamba-2 mixers in hybrid blocks (issue 44; growtool/nn/mamba.py, ``Arch.kinds``). Nemotron-H's rows of the
architecture table (tests/arch_cases.py) go through test_architectures.py's forward, round trip and recipes
and test_depth.py's depth cases; here, what is particular to the mixer and to per-layer block kinds:

* the mechanisms bite: dt clamped to time_step_limit, the gated norm over groups of channels;
* width growth keeps the mixer's inner tensors bit for bit (in_proj reads, out_proj writes the residual);
* depth growth: each copied block keeps its kind (``layers_block_type``, and the 4.x pattern string);
* a block kind growtool does not run (Nemotron-H's MoE blocks) is refused with one line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402
from growtool.nn import families  # noqa: E402
from growtool.nn.mamba import GatedRMSNorm  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import FAMILY_CASES, MIXER_CASES, _nemotron_h, hf_logits, make_source, rel  # noqa: E402
from arch_cases import FAMILY_X as X  # noqa: E402
from helpers import cli, perturbed, verify_json  # noqa: E402

INNER = ("conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight")


def test_dt_is_clamped_at_time_step_limit(tmp_path):
    """Nemotron-H clamps dt = softplus(dt + dt_bias) to time_step_limit, as Mamba-2 does (transformers >=
    5.25; before, at time_step_min): with one head's dt_bias far below, growtool equals transformers, and
    without the clamp the logits differ."""
    torch.manual_seed(0)
    model = perturbed(_nemotron_h(time_step_limit=(0.01, float("inf")), time_step_min=0.001)).eval()
    with torch.no_grad():
        model.model.layers[0].mixer.dt_bias[0] = -12.0  # softplus ~ 6e-6, clamped to 0.01
    model.save_pretrained(tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    assert ck.config.ssm["dt_limit"] == [0.01, float("inf")]
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) <= 1e-5
    unclamped = ck.config.replace(ssm={**ck.config.ssm, "dt_limit": [0.0, float("inf")]})
    with torch.no_grad():
        assert rel(LM.from_tensors(unclamped, {n: ck.get(n) for n in ck.names()})(X), hf_logits(model)) > 1e-3


def test_the_gated_norm_is_over_groups(tmp_path):
    """The mixer's RMSNorm of y * silu(z) runs over n_groups groups of channels: over all channels at once
    (one group) the logits differ."""
    model = make_source("nemotron_h", tmp_path / "src")
    ours = checkpoint.load(tmp_path / "src").model()
    norms = [m for m in ours.modules() if isinstance(m, GatedRMSNorm)]
    assert len(norms) == 2 and all(n.groups == 2 for n in norms)
    with torch.no_grad():
        assert rel(ours(X), hf_logits(model)) <= 1e-5
        for n in norms:
            n.groups = 1
        assert rel(ours(X), hf_logits(model)) > 1e-3


def test_width_growth_keeps_the_mixer_inner_tensors(tmp_path):
    """in_proj reads the residual (its rows are the mixer's inner units, kept), out_proj writes it; the
    convolution, A_log, D, dt_bias and the gated norm's gain are kept bit for bit, and the eps too (the
    inner norm shares layer_norm_epsilon: the residual is scaled by sqrt(D/d) instead)."""
    make_source("nemotron_h", tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    src, g = checkpoint.load(tmp_path / "src"), checkpoint.load(tmp_path / "g")
    assert g.config.norm_eps == src.config.norm_eps and g.config.ssm == src.config.ssm
    for i in (0, 3):
        m = f"backbone.layers.{i}.mixer."
        assert all(torch.equal(g.get(m + n), src.get(m + n)) for n in INNER)
        assert g.get(m + "in_proj.weight").shape == (164, 96) and g.get(m + "out_proj.weight").shape == (96, 64)
    code, rep = verify_json(tmp_path / "src", tmp_path / "g")
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("method", ["interleave", "stack"])
def test_copied_blocks_keep_their_kind(method, legacy, tmp_path):
    """Depth growth 4 -> 8: each copied block keeps its kind in layers_block_type (and in the 4.x spelling's
    hybrid_override_pattern, rewritten); fold at gate 0 loads as NemotronHForCausalLM with the source's logits."""
    model = make_source("nemotron_h", tmp_path / "src")
    if legacy:
        hf = json.loads((tmp_path / "src" / "config.json").read_text())
        hf["hybrid_override_pattern"] = "M*-M"
        del hf["layers_block_type"]
        (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    r = cli("expand", tmp_path / "src", "--layers", 8, "--depth-method", method, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    kinds = ["linear_attention", "full_attention", "mlp", "linear_attention"]
    want = [k for k in kinds for _ in range(2)] if method == "interleave" else kinds * 2
    hf = json.loads((tmp_path / "g" / "config.json").read_text())
    assert hf["layers_block_type"] == want
    if legacy:
        assert hf["hybrid_override_pattern"] == "".join(
            {"linear_attention": "M", "full_attention": "*", "mlp": "-"}[k] for k in want
        )
    assert cli("fold", tmp_path / "g", "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert type(back) is type(model) and back.config.layers_block_type == want
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


def test_a_grown_gated_hybrid_folder_loads_as_remote_code(tmp_path):
    """A grown, unfolded Nemotron-H folder (gates, new blocks) carries growtool's model code, the Mamba mixer's
    module with it: transformers loads it with trust_remote_code and computes the source's function at gate 0."""
    model = make_source("nemotron_h", tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "--layers", 6, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0 and (tmp_path / "g" / "mamba.py").exists(), r.stderr
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g", trust_remote_code=True).eval()
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


def test_moe_blocks_are_refused_with_one_line(tmp_path):
    torch.manual_seed(0)
    over = dict(n_routed_experts=4, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32)
    _nemotron_h(blocks=("linear_attention", "moe"), **over).save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "nemotron_h block type 'moe' is not supported" in r.stderr
    assert not (tmp_path / "g").exists()


# ---- Mamba-2: the mixers' inner width is expand x hidden_size, so width growth widens each head ----------------


def _mamba2_source(name, path):
    make, kw = MIXER_CASES[name]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_mamba_grows_its_heads_channels_and_folds_into_its_class(name, tmp_path):
    """Mamba-2 and Mamba (1): our forward equals transformers'; 64 -> 96 grows each mixer head's channels
    (expand x width = heads x head_dim: Mamba-2's 16 -> 24, Mamba's one head of 128 -> 192), verify passes at
    gate 0, fold --alpha 0 loads as the source's class with its logits and fold --alpha 1 equals growtool's
    gate-1 forward (which is the source's too: nothing is gated)."""
    model = _mamba2_source(name, tmp_path / "src")
    with torch.no_grad():
        assert rel(checkpoint.load(tmp_path / "src").model()(X), hf_logits(model)) <= 1e-5
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", grown)
    ssm = checkpoint.load(tmp_path / "src").config.ssm
    P2 = ssm["expand"] * 96 // ssm["heads"]  # Mamba-2: 8 heads of 16 -> 24 channels; Mamba: one of 128 -> 192
    assert r.exit_code == 0 and f"head channels {ssm['head_dim']} -> {P2}" in r.stderr, r.stderr
    code, rep = verify_json(tmp_path / "src", grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    for alpha in (0, 1):
        assert cli("fold", grown, "--alpha", alpha, "-o", tmp_path / f"f{alpha}").exit_code == 0
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"f{alpha}").eval()
        assert type(back) is type(model) and back.config.hidden_size == 96
        assert checkpoint.load(tmp_path / f"f{alpha}").config.ssm["head_dim"] == P2
        with torch.no_grad():
            assert rel(hf_logits(back), checkpoint.load(grown).model()(X, alpha=float(alpha))) <= 1e-5
        assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


def test_mamba2_new_channels_start_with_zero_z_rows(tmp_path):
    """A new channel's z row is 0, so silu(z) = 0 hides it from the gated norm (whose groups grow by D/d, as
    the residual, sharing its eps); with the z rows copied like the x rows, the grown model is another function."""
    model = _mamba2_source("mamba2", tmp_path / "src")
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    g = checkpoint.load(tmp_path / "g")
    t = {n: g.get(n) for n in g.names()}
    w = t["backbone.layers.0.mixer.in_proj.weight"]
    z = w[:192].view(8, 24, 96)  # z rows: 8 heads x 24 channels
    assert z[:, 16:].abs().max() == 0 and z[:, :16].abs().max() > 0
    with torch.no_grad():
        assert rel(LM.from_tensors(g.config, t)(X), hf_logits(model)) <= 1e-4
        z[:, 16:] = z[:, :8]
        assert rel(LM.from_tensors(g.config, t)(X), hf_logits(model)) > 1e-3


def test_mamba_new_channels_are_read_by_nothing(tmp_path):
    """Mamba (1): dt, B and C come from x_proj of every channel, so the new channels' x_proj columns start at 0
    (and their z rows: y * silu(0) = 0); with the columns copied like the rest, the grown model is another
    function."""
    model = _mamba2_source("mamba", tmp_path / "src")
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    g = checkpoint.load(tmp_path / "g")
    t = {n: g.get(n) for n in g.names()}
    x_proj, z = t["backbone.layers.1.mixer.x_proj.weight"], t["backbone.layers.1.mixer.in_proj.weight"][192:]
    assert x_proj[:, 128:].abs().max() == 0 and z[128:].abs().max() == 0 and x_proj[:, :128].abs().max() > 0
    with torch.no_grad():
        assert rel(LM.from_tensors(g.config, t)(X), hf_logits(model)) <= 1e-4
        x_proj[:, 128:] = x_proj[:, :64]
        assert rel(LM.from_tensors(g.config, t)(X), hf_logits(model)) > 1e-3


def test_mamba2_width_whose_inner_width_the_heads_do_not_divide_is_refused(tmp_path):
    _mamba2_source("mamba2", tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 66, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "inner width expand x 66 = 132 is not a multiple of its 8 heads" in r.stderr
    assert not (tmp_path / "g").exists()


def test_mamba2_config_in_the_4x_spelling(tmp_path):
    """transformers 4.x wrote time_step_limit's infinity as a bare JSON Infinity (5.x: {"__float__": ...}):
    read as transformers reads it, grown, folded into a folder transformers loads."""
    model = _mamba2_source("mamba2", tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    assert hf["time_step_limit"][1] == {"__float__": "Infinity"}
    hf["time_step_limit"] = [0.0, float("inf")]
    (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    assert checkpoint.load(tmp_path / "src").config.ssm["dt_limit"] == [0.0, float("inf")]
    assert cli("expand", tmp_path / "src", "--width", 96, "-q", "-o", tmp_path / "g").exit_code == 0
    assert cli("fold", tmp_path / "g", "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert rel(hf_logits(back), hf_logits(model)) <= 1e-4


# ---- Granite 4 (dense hybrids) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over, match",
    [
        ({"num_local_experts": 4}, "granitemoehybrid with experts"),
        ({"position_embedding_type": "rope"}, "granitemoehybrid with RoPE is not supported"),
    ],
)
def test_granite_hybrid_refuses_what_it_cannot_grow_with_one_line(over, match, tmp_path):
    make, kw = FAMILY_CASES["granitemoehybrid"]
    torch.manual_seed(0)
    make(**kw, **over).save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and match in r.stderr, r.stderr
    assert not (tmp_path / "g").exists()


def test_granite_hybrid_mamba_blocks_run_the_mlp_too(tmp_path):
    """A Granite 4 block is its mixer (Mamba-2 or attention) then the shared MLP, each x residual_multiplier;
    run as Nemotron-H's single-sublayer mamba blocks (no MLP after the mixer), the logits differ."""
    model = make_source("granitemoehybrid", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) <= 1e-5
    a = families.ARCHS["granitemoehybrid"]
    kinds = {**a.kinds, "linear_attention": ("mamba",)}
    t = {n: ck.get(n) for n in ck.names() if not (n.startswith(("model.layers.0.", "model.layers.2.")) and "mlp" in n)}
    t = {
        n: v
        for n, v in t.items()
        if "post_attention_layernorm" not in n or n.startswith(("model.layers.1.", "model.layers.3."))
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(families.ARCHS, "granitemoehybrid", dataclasses.replace(a, kinds=kinds))
        with torch.no_grad():
            assert rel(LM.from_tensors(ck.config, t)(X), hf_logits(model)) > 1e-3


def test_mamba2_grown_moments_are_the_grown_gradient_on_old_channels():
    """AdamW moments through the channel growth (grow/moments.py): on the old channels and residual dims the
    first-moment rule is the grown model's own gradient at gate 0 (in_proj, conv1d, the gated norm's scaled
    gain, out_proj); every new channel's moments start at 0."""
    from growtool.grow import recipes
    from growtool.grow.engine import grow_tensor
    from growtool.grow.moments import grow_moment
    from growtool.grow.plan import build_plan
    from growtool.init import init_model
    from growtool.nn.config import ModelConfig

    ssm = dict(heads=4, head_dim=8, state=4, groups=2, conv=3, conv_bias=True, bias=False, expand=1)
    cfg = ModelConfig("mamba2", 64, 32, 2, 1, 1, 32, 128, context=16, tie=False, ssm=ssm | {"dt_limit": [0, 1e9]})
    src = init_model(cfg, seed=0)
    with torch.no_grad():
        for p in src.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    t = {n: v.detach().clone() for n, v in src.tensors().items()}
    plan = build_plan(cfg, recipes.load("srio"), 48)
    grown = LM.from_tensors(plan.cfg, {n: grow_tensor(n, plan, t.__getitem__) for n, _, _ in plan.outputs()})
    x = torch.randint(0, 64, (4, 13), generator=torch.Generator().manual_seed(3))
    g = {}
    for name, model in (("src", src.train()), ("grown", grown.train())):
        model.zero_grad()
        model(x[:, :-1], x[:, 1:])[1].backward()
        g[name] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    m = "backbone.layers.1.mixer."
    old = torch.arange(4 * 12) % 12 < 8  # heads of 8 -> 12 channels: the first 8 of each head are the old ones
    for name, axis, rows in (("in_proj.weight", 0, old.repeat(2)), ("conv1d.weight", 0, old), ("norm.weight", 0, old)):
        true, got = g["grown"][m + name], grow_moment(m + name, plan, t.__getitem__, g["src"][m + name], False)
        keep = true.narrow(axis, 0, rows.numel())[rows]
        if name == "in_proj.weight":
            keep, got_old = keep[:, :32], got.narrow(0, 0, rows.numel())[rows][:, :32]  # the old residual dims
        else:
            got_old = got.narrow(0, 0, rows.numel())[rows]
        assert (got_old - keep).abs().max() <= 1e-4 * keep.abs().max(), name
        assert got.narrow(axis, 0, rows.numel())[~rows].abs().max() == 0, name
    true, got = (
        g["grown"][m + "out_proj.weight"],
        grow_moment(m + "out_proj.weight", plan, t.__getitem__, g["src"][m + "out_proj.weight"], False),
    )
    assert (got[:32][:, old] - true[:32][:, old]).abs().max() <= 1e-4 * true.abs().max()


# ---- Falcon-H1 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ssm_in", "ssm_out", "attn_in", "attn_out", "key", "mlp", "mup"])
def test_falcon_h1_mup_scalars_bite(name, tmp_path):
    """Falcon-H1's muP scalars (on the mixer's input and in_proj's five segments, on attention's input, keys
    and output, on the MLP's gate and output): growtool equals transformers, and with any one of them at 1
    the logits differ. Width growth carries them unchanged (test_architectures' rows)."""
    model = make_source("falcon_h1", tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    t = {n: ck.get(n) for n in ck.names()}
    with torch.no_grad():
        assert rel(LM.from_tensors(ck.config, t)(X), hf_logits(model)) <= 1e-5
        one = {"mlp": [1.0, 1.0], "mup": [1.0] * 5}.get(name, 1.0)
        cfg = ck.config.replace(multipliers={**ck.config.multipliers, name: one})
        assert rel(LM.from_tensors(cfg, t)(X), hf_logits(model)) > 1e-3


@pytest.mark.parametrize("variant", ["falcon_h1", "falcon_h1-norm-before-gate", "falcon_h1-tied-biases-gated-norm"])
def test_falcon_h1_mixer_gating_variants(variant, tmp_path):
    """y silu(z) without a norm (mamba_rms_norm false), norm(y) silu(z) (norm before the gate) and
    norm(y silu(z)): each equals transformers, and read as another the logits differ."""
    model = make_source(variant, tmp_path / "src")
    ck = checkpoint.load(tmp_path / "src")
    want = {"falcon_h1": "none", "falcon_h1-norm-before-gate": "before_gate"}.get(variant, "gated")
    assert ck.config.ssm["norm"] == want
    with torch.no_grad():
        assert rel(ck.model()(X), hf_logits(model)) <= 1e-5
    if want != "none":  # the other normed variant reads the same tensors
        other = ck.config.replace(ssm={**ck.config.ssm, "norm": "gated" if want == "before_gate" else "before_gate"})
        with torch.no_grad():
            assert rel(LM.from_tensors(other, {n: ck.get(n) for n in ck.names()})(X), hf_logits(model)) > 1e-3


def test_falcon_h1_without_a_fixed_inner_width_is_refused(tmp_path):
    make, kw = FAMILY_CASES["falcon_h1"]
    torch.manual_seed(0)
    make(**kw, mamba_d_ssm=None).save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "falcon_h1 without mamba_d_ssm (inner width expand x hidden_size) is not supported" in r.stderr
    assert not (tmp_path / "g").exists()


def test_inspect_shows_the_mixer_and_the_block_kinds(tmp_path):
    make_source("nemotron_h", tmp_path / "src")
    r = cli("inspect", tmp_path / "src", "--json")
    assert r.exit_code == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["blocks"] == ["linear_attention", "full_attention", "mlp", "linear_attention"]
    assert facts["mixer"]["heads"] == 4 and facts["mixer"]["state"] == 8 and facts["mixer"]["groups"] == 2


@pytest.mark.parametrize("family", ["mamba2", "mamba", "nemotron_h", "granitemoehybrid", "falcon_h1"])
def test_a_mixer_config_made_here_round_trips_through_its_hf_spelling(family):
    """A config growtool makes itself (no source config.json to carry) writes every mixer field in the
    family's spelling and reads back the same."""
    from growtool.nn.config import ModelConfig

    a = families.ARCHS[family]
    ssm = dict(heads=2, head_dim=32, state=4, groups=2, conv=3, conv_bias=False, bias=True, dt_limit=[0.0, 9.0])
    ssm = ssm | {"expand": 2} if "expand" in a.ssm_keys else ssm
    if family == "mamba":
        ssm |= {"heads": 1, "head_dim": 64, "groups": 1, "dt_rank": 3, "dt_limit": [0.0, float("inf")]}  # no clamp
    if family == "falcon_h1":
        ssm |= {"norm": "before_gate", "out_bias": False}
    if family == "nemotron_h":
        ssm["dt_limit"] = [0.01, float("inf")]
    kinds = (sorted(a.kinds) * 2)[:2] if "block_types" in a.keys else None
    cfg = ModelConfig(family, 64, 32, 2, 2, 2, 16, 64, context=16, ssm=ssm, block_types=kinds)
    back = ModelConfig.from_hf(json.loads(json.dumps(cfg.to_hf())))
    assert back.ssm == cfg.ssm and back.block_types == cfg.block_types


def test_mamba2_trains_through_a_growth_in_the_run(tmp_path):
    """train --grow-at 0.5:width=48,layers=4 on a Mamba-2 model: its mixers' channels and AdamW moments grow
    inside the run (no loss bump at the growth), and the final model is the grown one."""
    from growtool.init import init_model
    from growtool.nn.config import ModelConfig
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    from helpers import make_text

    (tmp_path / "toy.txt").write_text(make_text(1500))
    ssm = dict(heads=4, head_dim=16, state=4, groups=2, conv=3, conv_bias=True, bias=False, expand=2)
    cfg = ModelConfig("mamba2", 256, 32, 2, 1, 1, 32, 128, context=64, tie=False, ssm=ssm | {"dt_limit": [0.0, 9.0]})
    base = checkpoint.save_tensors(str(tmp_path / "base.safetensors"), cfg, [], init_model(cfg, seed=0).tensors())
    kw = dict(batch=8, seq=32, eval_batches=1, device="cpu", progress=False, lr=1e-2, gate_warmup_tokens=512)
    out = train(base, [tmp_path / "toy.txt"], tmp_path / "run", steps=8, grow_at=("0.5:width=48,layers=4",), **kw)
    final = checkpoint.load(out["final"]).config
    assert (final.width, final.layers, final.ssm["head_dim"]) == (48, 4, 24)
    loss = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert loss[5] < loss[4] + 0.05
