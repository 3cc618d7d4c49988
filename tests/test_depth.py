"""Depth growth (growtool/grow/depth.py) for every architecture, against transformers' own forward.

Each architecture: a tiny model that transformers creates and saves (norm gains and biases
perturbed), 2 blocks at width 64. Depth 2 -> 4 by each method and 2 -> 3, alone and with width
64 -> 96 (BLOOM: 64 -> 128, its widths grow by whole factors), computes the source's function at
gate 0 (<= 1e-4 x logit scale, against transformers' logits); through the CLI, ``fold --alpha 0``
loads with ``AutoModelForCausalLM`` as the same class with the source's logits and ``fold --alpha 1``
equals growtool's own gate-1 forward. Windowed architectures keep each copied block's layer type,
checked on inputs longer than the window."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growtool.grow import depth, recipes  # noqa: E402
from growtool.grow import moments as grow_state  # noqa: E402
from growtool.grow.engine import grow_tensor  # noqa: E402
from growtool.grow.plan import build_plan  # noqa: E402
from growtool.io import checkpoint  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.nn.families import ARCHS  # noqa: E402
from growtool.nn.model import LM  # noqa: E402

from arch_cases import ARCH_CASES as CASES  # noqa: E402
from arch_cases import FAMILY_CASES, MIXER_CASES, QWEN2_MOE, V, _bloom, _llama_like, hf_logits, rel  # noqa: E402
from helpers import cli, make_text, perturbed, tiny_cfg, verify_json  # noqa: E402

X = torch.randint(V, (2, 24), generator=torch.Generator().manual_seed(1))  # longer than the windows (8)

# one transformers model per supported architecture (test_architectures' rows)
ARCH_CASES = {
    "gpt2": "gpt2",
    "llama": "llama-tied-biases",
    "mistral": "mistral-window",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3-partial-rotary",
    "gpt_neox": "gpt_neox",
    "starcoder2": "starcoder2-window",
    "gemma": "gemma",
    "gemma2": "gemma2-softcap-window",
    "gemma3_text": "gemma3",
    "olmo2": "olmo2-tied-bias",
    # the families of issue 31 (test_families' rows): MoE blocks take their router and experts along,
    # SmolLM3's RoPE / no-RoPE layers follow the copied block, OPT's learned positions stay global
    "opt": "opt",
    "olmo": "olmo-clip-bias",
    "gpt_bigcode": "gpt_bigcode-mqa",
    "granite": "granite-tied-biases",
    "phi": "phi-gqa-tied-quarter-rotary",
    "gptj": "gptj-rotary8",
    "cohere": "cohere-untied-bias",
    "falcon": "falcon-gqa",
    "mixtral": "mixtral-tied-top1-window",
    "qwen2_moe": "qwen2_moe-shared",
    "qwen3_moe": "qwen3_moe",
    "olmoe": "olmoe-tied-clip-bias-normtopk",
    "smollm3": "smollm3-tied",
    # BLOOM (tied, embedding LayerNorm before the blocks, ALiBi slopes the same on every layer)
    # grows its width only by whole factors: its width variants take 64 -> 128 (WIDER)
    "bloom": "bloom",
    # issue 44: aliases and close kin; windowed ones keep each copied block's layer type (and with it
    # Cohere 2's and EXAONE 4's RoPE-on-sliding-layers-only, OLMo 3's RoPE per layer type)
    "internlm3": "internlm3-tied-biases",
    "exaone": "exaone",
    "seed_oss": "seed_oss-biases",
    "ministral": "ministral-window",
    "helium": "helium",
    "ernie4_5": "ernie4_5-bias",
    "olmo3": "olmo3-window",
    "exaone4": "exaone4-window",
    "cohere2": "cohere2-window",
    "vaultgemma": "vaultgemma-window",
    "stablelm": "stablelm-qkv-bias",
    "arcee": "arcee-relu2-tied-biases",
    "nemotron": "nemotron-tied-biases-rotary-quarter",
    "hunyuan_v1_dense": "hunyuan_v1_dense-tied-bias",
    "glm": "glm-tied-nobias-rotary-quarter",
    "glm4": "glm4",
    "ministral3": "ministral3-yarn-query-scale",
    "apertus": "apertus-xielu-tied-bias",
    "phimoe": "phimoe-sparsemixer-tied-biases-jitter",
    "granitemoe": "granitemoe-tied-bias-top1",  # experts fused in 3-D tensors: a copied block copies them whole
    "granitemoeshared": "granitemoeshared",
    "dbrx": "dbrx-clip",
    "gpt_oss": "gpt_oss-window-yarn",  # sinks, expert biases and layer types follow the copied block
    "llama4_text": "llama4_text-dense-moe-chunked",  # a dense and an MoE block, RoPE and no RoPE: copies keep them
    # DeepSeek-style MoE: every block MoE here (any layout); dense first blocks: tests/test_deepseek_moe.py
    "glm4_moe": "glm4_moe-tied-bias-scaled-allmoe",
    "dots1": "dots1-tied-bias-window-normtopk-allmoe",
    "minimax_m2": "minimax_m2-partial-rotary",
    "ernie4_5_moe": "ernie4_5_moe-tied-biases-allmoe",
    "exaone_moe": "exaone_moe-dense1-window",  # mlp_layer_types says any layout: dense and MoE blocks copied
    "hunyuan_v1_moe": "hunyuan_v1_moe-top2",
    # MLA with every block MoE (any layout); all blocks dense: test_families_2025; dense first: test_deepseek_moe
    "deepseek_v2": "deepseek_v2-mla-moe-greedy-tied-allmoe",
    "deepseek_v3": "deepseek_v3-mla-moe-tied-bias-allmoe",
    # hybrids: each copied block keeps its kind (layers_block_type, layer_types)
    "nemotron_h": "nemotron_h-tied-biases-2",
    "mamba2": "mamba2-tied-biases",
    "granitemoehybrid": "granitemoehybrid-tied-biases",
    "mamba": "mamba-untied-biases-rank8",
    "falcon_h1": "falcon_h1-tied-biases-gated-norm",
    "lfm2": "lfm2-conv-attn",
    "qwen3_next": "qwen3_next-gdn-moe",
    "qwen3_5_text": "qwen3_5_text-gdn",
    "qwen3_5_moe_text": "qwen3_5_moe_text-tied",
}
ALL_CASES = {**CASES, **FAMILY_CASES, **MIXER_CASES, "bloom": (_bloom, {})}
WIDER = {"bloom": 128}  # model_type -> the width its "64 -> 96" variants grow to
QWEN2_WINDOW = _llama_like(
    "Qwen2", num_key_value_heads=2, use_sliding_window=True, sliding_window=8, max_window_layers=1
)
QWEN2_MOE_WINDOW = _llama_like(
    "Qwen2Moe", num_key_value_heads=2, use_sliding_window=True, sliding_window=8, max_window_layers=1, **QWEN2_MOE
)
# (method, layers, width, noise[, --insert-at])
VARIANTS = [
    ("stack", 4, None, 0.0, "0,2:0"),
    ("identity", 3, 96, 0.1, "1"),
    ("stack", 4, None, 0.0),
    ("interleave", 4, None, 0.1),
    ("middle", 4, None, 0.0),
    ("identity", 4, None, 0.1),
    ("stack", 3, None, 0.1),
    ("stack", 4, 96, 0.1),
    ("interleave", 4, 96, 0.0),
    ("middle", 4, 96, 0.1),
    ("identity", 4, 96, 0.0),
    ("interleave", 3, 96, 0.1),
]


def test_every_architecture_is_covered():
    assert set(ARCH_CASES) == depth.DEPTH_FAMILIES == set(ARCHS)


def test_a_family_without_depth_cases_is_refused(monkeypatch):
    """An architecture added later is refused for depth until its cases here exist."""
    from types import SimpleNamespace

    monkeypatch.setattr(depth, "DEPTH_FAMILIES", depth.DEPTH_FAMILIES - {"opt"})
    with pytest.raises(GrowError, match="depth growth of opt is not supported yet"):
        depth.build_depth_plan(SimpleNamespace(layers=2, family="opt"), 4, "stack")


@pytest.fixture(scope="module", params=sorted(ARCH_CASES))
def source(request, tmp_path_factory):
    make, kw = ALL_CASES[ARCH_CASES[request.param]]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval()
    path = tmp_path_factory.mktemp(request.param) / "src"
    model.save_pretrained(path)
    return path, model, hf_logits(model, X)


def target_width(model, width):
    """The variant's width for this source (BLOOM: a whole factor, ``WIDER``)."""
    return width and WIDER.get(model.config.model_type, width)


WIDTH_GROWN = {}  # (source, width, noise) -> (width plan, its tensors): made once, placed by each method


def grow(path, layers, method="stack", width=None, noise=0.0, insert_at=None, seed=0):
    """(depth plan object, grown LM) made by the library, as ``expand`` makes them."""
    key = (str(path), width, noise)
    if key not in WIDTH_GROWN:
        ck = checkpoint.load(path)
        r = recipes.load("srio", recipes.parse_set([f"noise={noise}"]))
        wplan = build_plan(ck.config, r, width, seed=seed) if width else None
        names = [n for n, _, _ in wplan.outputs()] if wplan else ck.names()
        t = {n: grow_tensor(n, wplan, ck.get) if wplan else ck.get(n) for n in names}
        WIDTH_GROWN[key] = (ck.config, r, wplan, t)
    src, r, wplan, t = WIDTH_GROWN[key]
    g = depth.build(src, wplan, (layers, method, insert_at), r, seed, torch.float32)
    return g, LM.from_tensors(g.cfg, {n: g.grow_tensor(n, lambda m, rows=None: t[m]) for n, _, _ in g.outputs()})


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_depth_growth_keeps_the_function_at_gate_0(source, variant):
    method, layers, width, noise, *at = variant
    path, model, ref = source
    width = target_width(model, width)
    g, grown = grow(path, layers, method, width, noise, insert_at=at[0] if at else None)
    assert grown.cfg.layers == layers and grown.cfg.width == (width or 64) and len(g.depth.new) == layers - 2
    with torch.no_grad():
        assert rel(grown(X, alpha=0.0), ref) <= 1e-4
        open_rel = rel(grown(X, alpha=1.0), ref)
    if width is None and not noise and method != "identity":  # a copy is its source block, all of it
        block, sd = ARCHS[g.cfg.family].block, grown.state_dict()  # (MoE: router, experts, shared expert)
        for j in g.depth.new:
            mine = {n[len(block.format(i=j)) :]: v for n, v in sd.items() if n.startswith(block.format(i=j))}
            src = block.format(i=g.depth.layout.index(depth.Layer(g.depth.layout[j].src, "old")))
            assert len(mine) > 5 and all(torch.equal(v, sd[src + n]) for n, v in mine.items() if n != "growth_gate")
    if method != "identity":
        assert open_rel > 1e-3  # the gate really hides something
    elif width is None:
        assert open_rel <= 1e-4  # identity blocks are exact with the gate open too


def test_plan_layouts():
    cfg = tiny_cfg(layers=2)

    def lay(L2, m, at=None):
        return [(x.src, x.kind) for x in depth.build_depth_plan(cfg, L2, m, at).layout]

    assert lay(4, "stack") == [(0, "old"), (1, "old"), (0, "copy"), (1, "copy")]
    assert lay(4, "interleave") == [(0, "old"), (0, "copy"), (1, "old"), (1, "copy")]
    assert lay(3, "interleave") == [(0, "old"), (1, "old"), (1, "copy")]
    assert lay(3, "middle") == [(0, "old"), (1, "old"), (1, "copy")]
    assert lay(4, "identity") == [(0, "old"), (0, "identity"), (1, "old"), (1, "identity")]
    assert lay(4, "stack", "0,2:0") == [(0, "copy"), (0, "old"), (1, "old"), (0, "copy")]
    c12 = tiny_cfg(layers=12)
    p = depth.build_depth_plan(c12, 18, "stack")
    assert [x.src for x in p.layout] == list(range(12)) + list(range(6))
    p = depth.build_depth_plan(c12, 18, "interleave")
    assert [x.src for x in p.layout if x.kind == "copy"] == [1, 3, 5, 7, 9, 11]
    p = depth.build_depth_plan(c12, 18, "middle")
    assert [x.src for x in p.layout] == [0, 1, 2, *range(3, 9), *range(3, 9), 9, 10, 11]


@pytest.mark.parametrize("method,layers,width", [("interleave", 3, 96), ("identity", 4, None)])
def test_fold_loads_in_transformers_as_the_same_class(source, tmp_path, method, layers, width):
    path, model, ref = source
    grown = tmp_path / "g.safetensors"
    width = target_width(model, width)
    extra = ["--width", width] if width else []
    r = cli("expand", path, "--layers", layers, "--depth-method", method, *extra, "--set", "noise=0.1", "-o", grown)
    assert r.exit_code == 0, r.stderr
    assert "depth plan: 2 -> " in r.stderr
    ck = checkpoint.load(grown)
    assert [e["op"] for e in ck.lineage] == ["expand"] and ck.lineage[-1]["layers_to"] == layers
    with torch.no_grad():
        assert rel(ck.model()(X, alpha=0.0), ref) <= 1e-4  # gate 0: the source (``verify``: test_chained_...)
    auto = transformers.AutoModelForCausalLM.from_pretrained
    assert cli("fold", grown, "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    f0 = auto(tmp_path / "f0").eval()
    assert type(f0) is type(model) and f0.config.num_hidden_layers == layers
    assert rel(hf_logits(f0, X), ref) <= 1e-4
    assert cli("fold", grown, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    f1 = auto(tmp_path / "f1").eval()
    assert type(f1) is type(model) and f1.config.num_hidden_layers == layers
    with torch.no_grad():
        ours1 = ck.model()(X, alpha=1.0)
    assert rel(hf_logits(f1, X), ours1) <= 1e-5
    if method == "identity":  # zero writers: the plain deeper model is still the source
        assert rel(ours1, ref) <= 1e-4
    else:  # any gate value folds into writers (pre-norm) or post-norm gains
        assert cli("fold", grown, "--alpha", 0.5, "-o", tmp_path / "fh").exit_code == 0
        with torch.no_grad():
            half = ck.model()(X, alpha=0.5)
        assert rel(hf_logits(auto(tmp_path / "fh").eval(), X), half) <= 1e-5


WINDOWED = {
    "gemma2": CASES["gemma2-softcap-window"],
    "gemma3": CASES["gemma3"],
    "mistral": CASES["mistral-window"],
    "qwen2": (QWEN2_WINDOW, {}),
    "mixtral": FAMILY_CASES["mixtral-tied-top1-window"],
    "qwen2_moe": (QWEN2_MOE_WINDOW, {}),
    **{n: FAMILY_CASES[f"{n}-window"] for n in ("ministral", "olmo3", "exaone4", "cohere2", "vaultgemma")},
    "gpt_oss": FAMILY_CASES["gpt_oss-window-yarn"],
    "dots1": FAMILY_CASES["dots1-tied-bias-window-normtopk-allmoe"],
    "exaone_moe": FAMILY_CASES["exaone_moe-dense1-window"],
}


@pytest.mark.parametrize("name", sorted(WINDOWED))
@pytest.mark.parametrize("method,layers", [("interleave", 3), ("stack", 4), ("middle", 3)])
def test_windowed_layers_follow_the_copied_block(name, method, layers, tmp_path):
    make, kw = WINDOWED[name]
    torch.manual_seed(0)
    model = perturbed(make(**kw)).eval()
    model.save_pretrained(tmp_path / "src")
    src_types = getattr(model.config, "layer_types", None)
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--layers", layers, "--depth-method", method, "-o", grown, "-q")
    assert r.exit_code == 0, r.stderr
    layout = checkpoint.load(grown).lineage[-1]["depth_layout"]
    assert cli("fold", grown, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    hf = json.loads((tmp_path / "f1" / "config.json").read_text())
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    if src_types is not None and len(set(src_types)) > 1:
        want = [src_types[s] for s, _ in layout]
        assert hf["layer_types"] == want and back.config.layer_types == want
        assert want != [src_types[j % 2] for j in range(layers)] or method == "stack"  # not the index rule
    assert back.config.sliding_window == model.config.sliding_window == 8
    with torch.no_grad():
        ours1 = checkpoint.load(grown).model()(X, alpha=1.0)
    assert rel(hf_logits(back, X), ours1) <= 1e-5  # transformers reads the same per-layer windows
    # the window matters on these inputs: the same weights with windows wider than the input differ
    hf_full = {**hf, "sliding_window": 64}
    (tmp_path / "f1" / "config.json").write_text(json.dumps(hf_full))
    full = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    assert rel(hf_logits(full, X), ours1) > 1e-4


@pytest.mark.parametrize("method,layers", [("interleave", 3), ("stack", 4), ("middle", 4)])
def test_rope_layers_follow_the_copied_block(method, layers, tmp_path):
    """SmolLM3: each block's RoPE / no-RoPE entry (``no_rope_layers``) goes with the copied block,
    not by the interval rule; transformers reads the written list, and the entry matters."""
    model = perturbed(FAMILY_CASES["smollm3-tied"][0](tie=True)).eval()
    model.save_pretrained(tmp_path / "src")
    src = list(model.config.no_rope_layers)
    assert src == [1, 0]
    grown = tmp_path / "g.safetensors"
    r = cli("expand", tmp_path / "src", "--layers", layers, "--depth-method", method, "-o", grown, "-q")
    assert r.exit_code == 0, r.stderr
    layout = checkpoint.load(grown).lineage[-1]["depth_layout"]
    want = [src[s] for s, _ in layout]
    assert checkpoint.load(grown).config.rope_layers == want
    assert cli("fold", grown, "--alpha", 1, "-o", tmp_path / "f1").exit_code == 0
    hf = json.loads((tmp_path / "f1" / "config.json").read_text())
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    assert hf["no_rope_layers"] == want and list(back.config.no_rope_layers) == want
    with torch.no_grad():
        ours1 = checkpoint.load(grown).model()(X, alpha=1.0)
    assert rel(hf_logits(back, X), ours1) <= 1e-5
    j = layout.index(next(x for x in layout if x[1] != "old"))  # a new block: its entry flipped differs
    flipped = [1 - v if k == j else v for k, v in enumerate(want)]
    (tmp_path / "f1" / "config.json").write_text(json.dumps({**hf, "no_rope_layers": flipped}))
    other = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f1").eval()
    assert rel(hf_logits(other, X), ours1) > 1e-4


def test_bloom_grows_width_after_depth_and_depth_after_width(tmp_path):
    """BLOOM: new blocks leave every head at its ALiBi slope, so a depth-grown, unfolded BLOOM grows
    its width (gated heads go to their slopes' positions in the fold, in every block, old and new);
    a width-grown one grows in depth. A BLOOM with gated heads growing in width again stays refused."""
    torch.manual_seed(0)
    model = perturbed(_bloom()).eval()
    model.save_pretrained(tmp_path / "src")
    ref = hf_logits(model, X)
    a, b, c = (tmp_path / f"{n}.safetensors" for n in "abc")
    assert cli("expand", tmp_path / "src", "--layers", 3, "--set", "noise=0.1", "-o", a, "-q").exit_code == 0
    r = cli("expand", a, "--width", 128, "--set", "noise=0.1", "-o", b, "-q")
    assert r.exit_code == 0, r.stderr
    assert cli("expand", b, "--layers", 4, "--depth-method", "interleave", "-o", c, "-q").exit_code == 0
    ck = checkpoint.load(c)
    assert (ck.config.layers, ck.config.width, ck.config.base_heads, ck.config.heads) == (4, 128, 4, 8)
    with torch.no_grad():
        assert rel(ck.model()(X, alpha=0.0), ref) <= 1e-4
        ours1 = ck.model()(X, alpha=1.0)
    auto = transformers.AutoModelForCausalLM.from_pretrained
    for alpha, want, tol in ((0, ref, 1e-4), (1, ours1, 1e-5)):
        assert cli("fold", c, "--alpha", alpha, "-o", tmp_path / f"f{alpha}").exit_code == 0
        assert rel(hf_logits(auto(tmp_path / f"f{alpha}").eval(), X), want) <= tol
    assert rel(ours1, ref) > 1e-3
    r = cli("expand", b, "--width", 256, "-o", tmp_path / "x.safetensors")
    assert r.exit_code == 2 and "must be folded before it grows again" in r.stderr, r.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_bloom_grows_depth_with_a_non_whole_width_untied(tmp_path):
    """A tied BLOOM, --untie, 64 -> 96 (embedding table refit) and 2 -> 4 blocks in one plan, every
    depth method: gate 0 is the source; fold --alpha 0 / 1 load as untied BloomForCausalLM."""
    torch.manual_seed(0)
    model = perturbed(_bloom()).eval()
    model.save_pretrained(tmp_path / "src")
    ref = hf_logits(model, X)
    auto = transformers.AutoModelForCausalLM.from_pretrained
    for method in ("stack", "interleave", "middle", "identity"):
        g = tmp_path / f"{method}.safetensors"
        args = ("--width", 96, "--layers", 4, "--depth-method", method, "--untie", "-q", "-o", g)
        assert cli("expand", tmp_path / "src", *args).exit_code == 0
        ck = checkpoint.load(g)
        assert (ck.config.layers, ck.config.width, ck.config.tie) == (4, 96, False)
        with torch.no_grad():
            assert rel(ck.model()(X, alpha=0.0), ref) <= 1e-4, method
            ours1 = ck.model()(X, alpha=1.0)
        for alpha, want, tol in ((0, ref, 1e-4), (1, ours1, 1e-5)):
            f = tmp_path / f"{method}-f{alpha}"
            assert cli("fold", g, "--alpha", alpha, "-o", f).exit_code == 0
            back = auto(f).eval()
            assert back.config.tie_word_embeddings is False and rel(hf_logits(back, X), want) <= tol, method


# ---- bad input ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    torch.manual_seed(0)
    CASES["llama"][0]().save_pretrained(d / "src")
    return d / "src"


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--layers", 1], "target layers 1 is below the source's 2"),
        (["--layers", 10**12], "--layers 1000000000000: the grown model would need about"),
        (["--layers", 2], "target layers 2 is the source's own depth: nothing to grow"),
        (["--layers", 3, "--insert-at", 5], "--insert-at position 5 is out of range (0..2"),
        (["--layers", 3, "--insert-at", "1:7"], "source block 7 is out of range"),
        (["--layers", 4, "--insert-at", 1], "--insert-at places 1 blocks, but --layers 4 adds 2"),
        (["--insert-at", "x"], "expected P[:S]"),
        (["--layers", 3, "--depth-method", "sideways"], "sideways"),
        ([], "Missing option '--width' (or --layers"),
    ],
)
def test_bad_depth_input_is_one_line_exit_2_nothing_written(small, tmp_path, args, msg):
    out = tmp_path / "g.safetensors"
    r = cli("expand", small, *args, "-o", out)
    assert r.exit_code == 2 and msg in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 or "sideways" in msg, r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_index_rule_config_grows_with_its_layer_types_written_out(tmp_path):
    """A config that gives its sliding layers only by an index rule (no layer_types) is read as
    transformers reads it (every n-th layer full); a copied block keeps its source's type, written
    out as layer_types, and the grown folder computes the source's function and loads in transformers."""
    torch.manual_seed(0)
    CASES["gemma2-softcap-window"][0](tie=True).save_pretrained(tmp_path / "src")
    hf = json.loads((tmp_path / "src" / "config.json").read_text())
    del hf["layer_types"]
    hf["sliding_window_pattern"] = 2
    (tmp_path / "src" / "config.json").write_text(json.dumps(hf))
    r = cli("expand", tmp_path / "src", "--layers", 3, "-q", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.stderr
    types = checkpoint.load(str(tmp_path / "g")).config.layer_types
    assert types == ["sliding_attention", "full_attention", "sliding_attention"]  # block 2 is block 0's copy
    code, report = verify_json(tmp_path / "src", tmp_path / "g")
    assert code == 0 and report["results"][0]["rel"] <= 1e-4, report


def test_dry_run_and_plan_json_show_where_each_block_comes_from(small, tmp_path):
    r = cli("expand", small, "--layers", 3, "--width", 96, "--depth-method", "interleave", "--dry-run", "--plan-json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout.splitlines()[0])
    assert plan["target"]["layers"] == 3 and plan["target"]["width"] == 96 and plan["exact"]
    assert plan["depth"]["blocks"] == [
        {"block": 0, "from": 0, "kind": "old"},
        {"block": 1, "from": 1, "kind": "old"},
        {"block": 2, "from": 1, "kind": "copy"},
    ]
    assert "depth plan: 2 -> 3 blocks (interleave)" in r.stderr and "dry run: " in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_chained_depth_growth_and_noise(small, tmp_path):
    """A depth-grown, unfolded model grows again: the earlier new block stays gated; the noise moves
    the copies' readers (so the copies differ from their sources) and keeps gate 0 exact."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert cli("expand", small, "--layers", 3, "--set", "noise=0.1", "-o", a, "-q").exit_code == 0
    assert cli("expand", a, "--layers", 5, "--depth-method", "interleave", "-o", b, "-q").exit_code == 0
    cfg = checkpoint.load(b).config
    # a: blocks 0 1 0'; interleave to 5: 0 1 1' 0' 0'' (block 2 of a, new, is now 3; its copy 4)
    assert cfg.layers == 5 and cfg.new_layers == [2, 3, 4]
    info = json.loads(cli("inspect", b, "--json").stdout)
    assert info["new_layers"] == [2, 3, 4] and info["layers"] == 5 and info["gated"]
    ck = checkpoint.load(a)
    q = "model.layers.{}.self_attn.q_proj.weight"
    assert not torch.equal(ck.get(q.format(2)), ck.get(q.format(0)))  # noise on the copy of block 0
    ref = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(small).eval(), X)
    with torch.no_grad():
        assert rel(checkpoint.load(b).model()(X, alpha=0.0), ref) <= 1e-4
    r = cli("verify", small, b, "--json", "--samples", 2)
    assert r.exit_code == 0 and json.loads(r.stdout)["results"][0]["rel"] <= 1e-4, r.stdout


# ---- training: run folders, --grow-at ------------------------------------------------------------

KW = dict(batch=8, seq=32, eval_batches=2, device="cpu", progress=False, lr=1e-2)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from growtool.init import init_model

    d = tmp_path_factory.mktemp("depth_train")
    (d / "toy.txt").write_text(make_text(1500))
    cfg = tiny_cfg(layers=2)
    base = checkpoint.save_tensors(str(d / "base.safetensors"), cfg, [], init_model(cfg, seed=0).tensors())
    return {"dir": d, "text": d / "toy.txt", "base": base}


def strip(records):
    return [{k: v for k, v in r.items() if k != "tok_s"} for r in records]


@pytest.mark.parametrize("target", ["layers=3,method=interleave", "width=48,layers=4"])
def test_grow_at_depth_end_to_end_and_resume_exactly(world, target):
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    d, text, base = world["dir"], world["text"], world["base"]
    tag = target.replace("=", "").replace(",", "_")
    kw = dict(KW, steps=8, save_every=2, grow_at=(f"0.5:{target}",), gate_warmup_tokens=512, eval_batches=1)
    a = train(base, [text], d / f"a_{tag}", **kw)
    train(base, [text], d / f"b_{tag}", stop_at=3, **kw)  # stops before the growth
    train(base, [text], d / f"b_{tag}", resume=True, stop_at=6, **kw)  # redoes it at 4, stops after it
    b = train(base, [text], d / f"b_{tag}", resume=True, **kw)
    ra, rb = read_metrics(d / f"a_{tag}" / "metrics.jsonl"), read_metrics(d / f"b_{tag}" / "metrics.jsonl")
    assert strip(ra) == strip(rb)
    assert checkpoint.load(a["final"]).sha256() == checkpoint.load(b["final"]).sha256()
    final = checkpoint.load(a["final"]).config
    want_layers = 3 if "layers=3" in target else 4
    assert final.layers == want_layers and final.width == (48 if "width" in target else 32) and not final.gated
    assert [r["gate"] for r in ra if r["step"] in (4, 5, 6, 7)] == [None, 0.0, 0.5, 1.0]
    assert ra[5]["loss"] < ra[4]["loss"] + 0.05  # no bump at the growth: same function, carried optimizer
    ops = [(e["op"], e.get("layers_to")) for e in checkpoint.load(a["final"]).lineage]
    assert ops == [("train", None), ("expand", want_layers), ("train", None)]
    from growtool.training.run_folder import figure  # loss.png names the growth, depth included

    label = "2 → 3 layers" if "layers=3" in target else "d32 → d48, 2 → 4 layers"
    assert [t.get_text().strip() for t in figure(ra, "t").axes[0].texts] == [label]


def test_copied_blocks_take_their_sources_moments(world, tmp_path):
    """``expand RUN_DIR --layers``: the grown run's AdamW state at the first step after the growth
    has each copied block's moments equal to its source block's (grown with the width), identity
    blocks at zero; the run then resumes at the source's loss."""
    from growtool.training.loop import train
    from growtool.training.run_folder import STATE, read_metrics

    text, base = world["text"], world["base"]
    kw = dict(KW, steps=8, grow_schedule="continue")
    train(base, [text], tmp_path / "src", stop_at=4, **kw)
    shutil.copytree(tmp_path / "src", tmp_path / "on")
    for method, extra in (("stack", ["--width", 48]), ("identity", [])):
        out = tmp_path / method
        r = cli("expand", tmp_path / "src", "--layers", 4, "--depth-method", method, *extra, "-o", out, "-q")
        assert r.exit_code == 0, r.stderr
        ck = checkpoint.load(out / "last.safetensors")
        model = ck.model()
        for n, p in model.named_parameters():
            p.requires_grad_(not n.endswith("growth_gate"))  # gates are not trained
        names = grow_state.param_order(model)
        st = torch.load(out / STATE, weights_only=True)
        mom = {n: st["optimizer"]["state"][i] for i, n in enumerate(names)}
        assert st["growths"][-1]["layers"] == 4 and st["growths"][-1]["layers_from"] == 2
        for new, old in ((2, 0), (3, 1)) if method == "stack" else ((1, 0), (3, 2)):  # (new block, its source)
            for part in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
                a, b = mom[f"model.layers.{new}.{part}"], mom[f"model.layers.{old}.{part}"]
                for k in ("exp_avg", "exp_avg_sq"):
                    if method == "stack":
                        assert torch.equal(a[k], b[k]) and (a[k].abs().sum() > 0 or "norm" in part)
                    else:
                        assert a[k].abs().sum() == 0 and b[k].abs().sum() > 0
        train(base, [text], out, resume=True, stop_at=5, **kw)
    on = train(base, [text], tmp_path / "on", resume=True, stop_at=5, **kw)
    ref = read_metrics(tmp_path / "on" / "metrics.jsonl")[5]["loss"]
    for method in ("stack", "identity"):
        rec = read_metrics(tmp_path / method / "metrics.jsonl")[5]
        assert rec["gate"] == 0.0 and rec["loss"] == pytest.approx(ref, rel=1e-5), method
    assert on["steps"] == 5


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("0.5:layers=1", "layers 1 is below the model's 2"),
        ("0.5:layers=2", "layers 2 is not more than the model's 2"),
        ("0.5:layers=3,method=sideways", "depth method 'sideways'"),
        ("0.5:depth=3", "expected FRACTION:WIDTH or FRACTION:width=W,layers=L"),
        ("0.5:method=stack", "method= needs layers="),
    ],
)
def test_bad_grow_at_depth_targets(world, tmp_path, spec, msg):
    r = cli("train", world["base"], "--data", world["text"], "--steps", 8, "--out", tmp_path / "r", "--grow-at", spec)
    assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "r").exists()
