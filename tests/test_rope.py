"""RoPE scaling: every rope type transformers defines for the supported families, against
transformers' own forward pass, through growth and fold.

Each case is a tiny model transformers creates and saves (gains and biases perturbed), its RoPE
scaled with ``original_max_position_embeddings`` 16 (``dynamic``: max_position_embeddings 16), and
checked on inputs of 24 tokens, longer than that (where ``dynamic``, ``longrope`` and ``yarn``
differ from plain RoPE), and of 12 tokens: growtool's forward equals transformers' logits; ``expand``
64 -> 96 verifies at gate 0 and computes the source's logits on the long inputs; ``fold --alpha 0``
loads with ``AutoModelForCausalLM`` as the same class, with the source's logits and RoPE settings.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.io import checkpoint  # noqa: E402
from growtool.nn import rope  # noqa: E402
from growtool.nn.config import ModelConfig  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from helpers import cli, perturbed, verify_json  # noqa: E402

V = 128
LONG = torch.randint(V, (2, 24), generator=torch.Generator().manual_seed(1))
SHORT = LONG[:, :12]
SMALL = dict(
    vocab_size=V,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=160,
    max_position_embeddings=64,
)
OMP = 16  # original_max_position_embeddings of the scaled cases
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
    "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
    "original_max_position_embeddings": OMP,
}


def _make(cls_name, rope_parameters, model_cls=None, **kw):
    def make():
        cfg = getattr(transformers, cls_name + "Config")(
            **{**SMALL, **kw}, rope_parameters=rope_parameters, tie_word_embeddings=False
        )
        return getattr(transformers, model_cls or cls_name + "ForCausalLM")(cfg)

    return make


CASES = {
    "linear": _make("Llama", {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "dynamic": _make("Llama", {"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=OMP),
    "yarn": _make("Llama", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": OMP}),
    "yarn-mscale-betas": _make(
        "Llama",
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": OMP,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
        },
    ),
    "qwen2-yarn": _make("Qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": OMP}),
    "longrope": _make("Llama", {**LONGROPE, "rope_theta": 10000.0}),
    "phi3-longrope-partial": _make(
        "Phi3",
        {
            **LONGROPE,
            "short_factor": LONGROPE["short_factor"][:4],
            "long_factor": LONGROPE["long_factor"][:4],
            "partial_rotary_factor": 0.5,
        },
        original_max_position_embeddings=OMP,
        pad_token_id=0,
        eos_token_id=1,
    ),
    # original 32: wavelengths 6.3 (kept), 19.9 (smoothed) and 63+ (divided by the factor)
    "llama3": _make(
        "Llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    # Gemma 3's own setting: linear scaling on the full-attention layers only
    "gemma3-linear-full": _make(
        "Gemma3Text",
        {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000.0},
        },
        "Gemma3ForCausalLM",
        head_dim=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),
}


def logits(model, x):
    with torch.no_grad():
        return model(x).logits.float()


def rel(a, b):
    return float((a - b).abs().max() / b.std())


@pytest.fixture(scope="module", params=sorted(CASES))
def source(request, tmp_path_factory):
    torch.manual_seed(0)
    model = perturbed(CASES[request.param]()).eval()
    path = tmp_path_factory.mktemp(request.param) / "src"
    model.save_pretrained(path)
    return path, model


def test_our_forward_equals_transformers_past_the_original_context(source):
    path, model = source
    ck = checkpoint.load(path)
    ours = ck.model()
    plain = LM.from_tensors(ck.config.replace(rope_scaling=None, context=64), ck.tensors())  # plain RoPE
    with torch.no_grad():
        for x in (LONG, SHORT):
            assert rel(ours(x), logits(model, x)) <= 1e-5
        assert rel(plain(LONG), logits(model, LONG)) > 1e-3  # the scaling matters on these inputs


def test_grow_verify_fold_keep_the_scaled_rope(source, tmp_path):
    path, model = source
    grown = tmp_path / "g.safetensors"
    r = cli("expand", path, "--width", 96, "-o", grown)
    assert r.exit_code == 0, r.stderr
    assert "carried unchanged" in r.stderr  # the plan says the RoPE settings pass through
    code, rep = verify_json(path, grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    with torch.no_grad():
        g = checkpoint.load(grown).model()
        assert rel(g(LONG, alpha=0.0), logits(model, LONG)) <= 1e-4
    f0 = tmp_path / "f0"
    assert cli("fold", grown, "--alpha", 0, "-o", f0).exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(f0).eval()
    assert type(back) is type(model)
    assert back.config.rope_parameters == model.config.rope_parameters
    for x in (LONG, SHORT):
        assert rel(logits(back, x), logits(model, x)) <= 1e-4


def test_the_plan_json_lists_what_is_carried(tmp_path):
    torch.manual_seed(0)
    CASES["yarn"]().save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 96, "--dry-run", "--plan-json", "-q")
    assert r.exit_code == 0, r.stderr
    carried = json.loads(r.stdout)["carried"]
    assert len(carried) == 1 and carried[0].startswith("RoPE yarn (factor 4, original_max_position_embeddings 16,")
    assert "attention factor 1.139" in carried[0]  # 0.1 ln 4 + 1


@pytest.mark.parametrize("name", ["linear", "dynamic", "yarn-mscale-betas", "longrope", "llama3"])
def test_frequencies_are_transformers_own(name):
    """The inverse frequencies and attention factor are bit for bit those of transformers'
    ROPE_INIT_FUNCTIONS, at the original length and past it."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = CASES[name]().config
    cfg = ModelConfig.from_hf(hf.to_dict())
    p = rope.layer_params(cfg, 0)
    for T in (hf.max_position_embeddings, 3 * hf.max_position_embeddings):
        seq = torch.tensor(T) if name == "dynamic" else T  # transformers' forward passes a tensor length
        want, want_att = ROPE_INIT_FUNCTIONS[p["rope_type"]](hf, None, seq_len=seq if name != "longrope" else T)
        got, att = rope.inv_freq(p, cfg.rotary_dim, cfg.rope_theta, cfg.context, T)
        if name == "dynamic" and T <= cfg.context:
            want, want_att = ROPE_INIT_FUNCTIONS["dynamic"](hf, None)  # what its forward uses up to max_pos
        assert torch.equal(got, want) and att == pytest.approx(want_att, rel=1e-12), (T, got, want)


def _hf(**rope_keys):
    return {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "intermediate_size": 128,
        "vocab_size": 32,
        "max_position_embeddings": 64,
        **rope_keys,
    }


def test_legacy_rope_scaling_is_read_and_written_back():
    """transformers 4.x configs: ``rope_scaling`` with ``type``; kept in both keys on output."""
    cfg = ModelConfig.from_hf(_hf(rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=500.0))
    assert cfg.rope_scaling == {"factor": 2.0, "rope_type": "linear"} and cfg.rope_theta == 500.0
    out = cfg.replace(width=96, heads=6, kv_heads=6).to_hf()
    assert out["rope_parameters"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    assert out["rope_scaling"] == out["rope_parameters"]
    assert ModelConfig.from_hf(out).rope_scaling == cfg.rope_scaling


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "rope type 'mrope' is not supported"),
        ({"rope_scaling": {"type": "ntk-by-parts", "factor": 2.0}}, "rope type 'ntk-by-parts' is not supported"),
        ({"rope_parameters": {"rope_type": "linear"}}, "rope type 'linear' needs 'factor'"),
        (
            {"rope_parameters": {**LONGROPE, "long_factor": [1.0] * 3}},
            r"longrope long_factor must list 8 numbers \(rotary dim 16 / 2\), got 3",
        ),
    ],
)
def test_bad_rope_settings_are_named(keys, message):
    with pytest.raises(GrowError, match=message):
        ModelConfig.from_hf(_hf(**keys))


def test_remote_code_folder_runs_the_scaled_rope(tmp_path):
    """A grown, unfolded folder (growth gates: growtool's own class) carries rope.py and computes
    the source's logits past the original context when transformers loads it."""
    torch.manual_seed(0)
    model = perturbed(CASES["longrope"]()).eval()
    model.save_pretrained(tmp_path / "src")
    assert cli("expand", tmp_path / "src", "--width", 96, "-o", tmp_path / "g", "-q").exit_code == 0
    assert (tmp_path / "g" / "rope.py").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g", trust_remote_code=True).eval()
    assert type(back).__name__ == "GrowtoolForCausalLM"
    for x in (LONG, SHORT):
        assert rel(logits(back, x), logits(model, x)) <= 1e-4
